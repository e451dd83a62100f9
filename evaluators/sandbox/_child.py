"""The sandboxed side of the policy channel: run as `python -I _child.py --zygote FD`.

That process is the fork server (`zygote`); each candidate's process is forked
from it.

Everything up to `serve()` is trusted set-up that runs before any candidate
code is read: cut the network, hide the project and run files behind private
tmpfs mounts, set resource limits and drop to an unprivileged uid. Only then is
the candidate's code executed, in a fresh module, and its policy answers
batched requests. The process holds no scoring code and no data but what each
request carries, so whatever the candidate patches here only changes its own
answers. This file must import nothing from Atoll except the wire module.
"""
import ctypes
import json
import os
import resource
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wire  # noqa: E402  (the sandbox's only Atoll import)

sys.path.pop(0)
for _name in ("math", "random", "itertools", "functools", "collections", "statistics",
              "heapq", "bisect", "operator", "typing", "dataclasses", "numpy"):
    __import__(_name)

CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source, target, fstype, flags, data=None):
    if _libc.mount(source, target.encode(), fstype, flags, data) != 0:
        raise OSError(ctypes.get_errno(), f"mount {target}")


def _tmpfs(target, size_mb, mode="755"):
    _mount(b"tmpfs", target, b"tmpfs", 0, f"size={size_mb}m,mode={mode}".encode())


def _bind(source, target, readonly=True):
    _mount(source.encode(), target, None, MS_BIND | MS_REC)
    if readonly:
        _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)


def _under(path, top):
    return path == top or path.startswith(top.rstrip("/") + "/")


def hide_paths(hide, keep, scratch_mb):
    """Give the process private, empty views of the world-writable dirs and of `hide`, keeping `keep` readable.

    Covers go on in order. A kept path under a cover (the interpreter of a virtualenv
    in /tmp, or under the home directory) is held open before that cover goes on and
    bound back read-only through the handle, so a later entry of `hide` inside it (a
    domain's data in site-packages) is still covered.
    """
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    for top in ("/tmp", "/var/tmp", "/dev/shm"):
        _cover(top, keep, lambda t: _tmpfs(t, scratch_mb, "1777"))
    for top in hide:
        _cover(top, keep, lambda t: _tmpfs(t, 1))


def _cover(top, keep, mount):
    if not os.path.isdir(top):  # absent, or under an earlier cover already
        return
    held = [(os.open(k, os.O_PATH | os.O_DIRECTORY), k) for k in keep if _under(k, top) and os.path.isdir(k)]
    mount(top)
    for fd, k in held:
        os.makedirs(k, exist_ok=True)
        _bind(f"/proc/self/fd/{fd}", k)
        os.close(fd)


def isolate(spec):
    """Trusted set-up; returns the list of protections that are in force."""
    held = []
    if os.geteuid() == 0 and _libc.unshare(CLONE_NEWNS | CLONE_NEWNET) == 0:
        held.append("no-network")
        hide_paths(spec["hide"], spec["keep"], spec["scratch_mb"])
        held.append("private-filesystem")
    os.chdir("/tmp")
    limits = spec["limits"]
    for name, value in (("RLIMIT_AS", limits["memory_mb"] << 20), ("RLIMIT_CPU", limits["cpu_s"]),
                        ("RLIMIT_FSIZE", limits["file_mb"] << 20), ("RLIMIT_CORE", 0),
                        ("RLIMIT_NPROC", limits["processes"])):
        resource.setrlimit(getattr(resource, name), (value, value))
    held.append("rlimits")
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(spec["uid"])
        os.setuid(spec["uid"])
        held.append("unprivileged-uid")
    return held


class Channel:
    def __init__(self, rfd, wfd):
        self.rfd, self.wfd = rfd, wfd

    def _read(self, n):
        chunks = []
        while n:
            chunk = os.read(self.rfd, n)
            if not chunk:
                os._exit(0)
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def recv(self):
        return wire.unpack(self._read(wire.frame_length(self._read(4))))

    def send(self, obj):
        data = wire.pack(obj)
        while data:
            data = data[os.write(self.wfd, data):]


def _error(exc):
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {"error": text[-2000:]}


def load(code, entry):
    module = {"__name__": "candidate", "__builtins__": __builtins__}
    exec(compile(code, "<candidate>", "exec"), module)
    fn = module.get(entry)
    if not callable(fn):
        raise TypeError(f"the program defines no function named {entry!r}")
    return fn


def answer(fn, batches):
    import numpy as np

    actions = []
    for state, params in batches:
        out = np.asarray(fn(state, params))
        if out.dtype.kind not in "fiub":
            raise TypeError(f"policy returned {out.dtype} values, not numbers")
        actions.append(out)
    return {"actions": actions}


def serve(channel, held):
    request = channel.recv()
    try:
        fn = load(request["code"], request["entry"])
        channel.send({"ready": held})
    except BaseException as exc:  # noqa: BLE001  the candidate's failure is data
        channel.send(_error(exc))
        return
    while True:
        batches = channel.recv()["batches"]
        try:
            reply = answer(fn, batches)
        except BaseException as exc:  # noqa: BLE001
            reply = _error(exc)
        channel.send(reply)


def run_candidate(spec):
    """In a fresh process: isolate, then serve the candidate's policy until EOF."""
    channel = Channel(spec["rfd"], spec["wfd"])
    held = isolate(spec)
    serve(channel, held)


def zygote(sock_fd):
    """A warm, trusted parent that forks one isolated child per candidate.

    It has imported numpy and the wire format once, so a candidate's process
    starts in milliseconds instead of a fresh interpreter's 200. It never reads
    or runs candidate code; every child forks from its pristine state, closes the
    zygote's socket, isolates itself and only then loads the candidate. Requests
    (one JSON datagram each): spawn (with the child's pipe ends and log file as
    passed descriptors) -> pid; wait (pid, timeout) -> exit code as `Popen`
    reports it. It exits, killing its children, when its parent goes away.
    """
    import signal
    import socket
    import time

    PR_SET_PDEATHSIG = 1
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the evaluator decides when to stop
    sock = socket.socket(fileno=sock_fd)
    children = set()
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 3)
        except OSError:
            data, fds = b"", []
        if not data:
            for pid in children:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
            os._exit(0)
        request = json.loads(data)
        if request["op"] == "spawn":
            spec = dict(request["spec"], rfd=fds[0], wfd=fds[1])
            pid = os.fork()
            if pid == 0:  # the candidate's process: nothing of the zygote survives but its imports
                try:
                    sock.close()
                    signal.signal(signal.SIGINT, signal.SIG_DFL)
                    os.setsid()
                    os.dup2(fds[2], 1)
                    os.dup2(fds[2], 2)
                    os.close(fds[2])
                    run_candidate(spec)
                except BaseException:  # noqa: BLE001  set-up failed: say why in the log, exit non-zero
                    traceback.print_exc()
                    os._exit(1)
                finally:
                    os._exit(0)
            for fd in fds:
                os.close(fd)
            children.add(pid)
            reply = {"pid": pid}
        elif request["op"] == "wait":
            pid, deadline = request["pid"], time.monotonic() + request["timeout"]
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done or time.monotonic() > deadline:
                    break
                time.sleep(0.002)
            if not done:
                os.killpg(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
            children.discard(pid)
            reply = {"code": os.waitstatus_to_exitcode(status)}
        else:
            reply = {"error": f"unknown op {request['op']!r}"}
        sock.send(json.dumps(reply).encode())


def main():
    if sys.argv[1:2] != ["--zygote"] or len(sys.argv) != 3:
        sys.exit("usage: python -I _child.py --zygote FD")
    zygote(int(sys.argv[2]))


if __name__ == "__main__":
    main()
