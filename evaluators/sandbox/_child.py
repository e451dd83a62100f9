"""The sandboxed side of the policy channel: run as `python -I _child.py --zygote FD`.

That process is the fork server (`zygote`); each candidate's process is forked
from it. Everything up to `serve()` is trusted set-up that runs before any
candidate code is read (see `_isolate` for what each step holds). Only then is
the candidate's code executed, in a fresh module, and its policy answers
batched requests. The process holds no scoring code and no data but what each
request carries, so whatever the candidate patches here only changes its own
answers. This file imports nothing from Atoll but its two neighbours, by file.
"""
import json
import linecache
import os
import random
import resource
import select
import signal
import socket
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _isolate as iso  # noqa: E402  (the sandbox's only Atoll imports, by file)
import wire  # noqa: E402

sys.path.pop(0)
for _name in ("math", "random", "itertools", "functools", "collections", "statistics",
              "heapq", "bisect", "operator", "typing", "dataclasses", "numpy"):
    __import__(_name)

CANDIDATE = "<candidate>"  # the file name its code is compiled under
ROOT = "/tmp"  # where the fork server builds the candidates' root (in its own mount namespace), then moves in
NAMESPACED = ("no-network", "own-ipc", "own-pids", "private-filesystem")


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
        return wire.unpack(self._read(wire.frame_length(self._read(4), 1 << 31)))

    def send(self, obj):
        data = wire.pack_reply(obj)
        while data:
            data = data[os.write(self.wfd, data):]


def _error(exc):
    """The candidate's exception as a traceback from its own first frame: this file's frames
    (serve, answer, load) say nothing to the one who reads it, a person or an LLM's prompt."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return {"error": text[-2000:]}


def load(code, entry):
    module = {"__name__": "candidate", "__builtins__": __builtins__}
    # the traceback of a failure shows the candidate's own lines, as it would a file's
    linecache.cache[CANDIDATE] = (len(code), None, code.splitlines(True), CANDIDATE)
    exec(compile(code, CANDIDATE, "exec"), module)
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
    return wire.flat_actions(actions)


def serve(channel, held, missing, require, area=None):
    request = channel.recv()
    unsafe = {name: missing[name] for name in require if name in missing}
    if unsafe:  # never run a candidate without what the run requires
        channel.send({"unsafe": unsafe})
        return
    try:
        fn = load(request["code"], request["entry"])
        channel.send({"ready": held, "missing": missing} if missing else {"ready": held})
    except BaseException as exc:  # noqa: BLE001  the candidate's failure is data
        channel.send(_error(exc))
        return
    while True:
        request = channel.recv()
        batches = wire.unflatten(request["flat"], area) if "flat" in request else request["batches"]
        try:
            reply = answer(fn, batches)
        except BaseException as exc:  # noqa: BLE001
            reply = _error(exc)
        channel.send(reply)


# --- one candidate's processes -------------------------------------------------
def _why(exc):
    return f"{exc.strerror or exc}" if isinstance(exc, OSError) else str(exc)


def candidate(spec, world, why):
    """In the candidate's own process, forked by the server into new namespaces (`why` says why
    not, if it could not be): map its ids, then finish confinement. It is pid 1 of its own pid
    namespace, so when it dies the kernel kills every process it left."""
    iso.prctl(iso.PR_SET_PDEATHSIG, signal.SIGKILL)
    random.seed()  # as Python's own fork would: no two candidates share the server's random state
    missing = dict(world["missing"])
    if not why:
        try:
            iso.map_own_ids(world["ids"][0], world["ids"][1])
        except OSError as exc:
            why = f"{_why(exc)} (errno {exc.errno})"
    if why:
        missing.update({name: f"no namespaces: {why}" for name in NAMESPACED})
    confine(spec, world, missing)


def _cpu_seconds(pid):
    """The process's CPU time as RLIMIT_CPU counts it (the kernel's CPUCLOCK_PROF clock)."""
    try:
        return time.clock_gettime((~pid) << 3)
    except OSError:
        return 0.0


def confine(spec, world, missing):
    """The candidate's own process: finish its confinement, then serve its policy until EOF."""
    iso.prctl(iso.PR_SET_PDEATHSIG, signal.SIGKILL)
    held = []
    if "no-network" not in missing:
        held += ["no-network", "own-ipc"] + (["own-pids"] if os.getpid() == 1 else [])
        _try(held, missing, "private-filesystem", lambda: _enter(world, spec["scratch_mb"]))
    _close_other_fds((0, 1, 2) + _channel_fds(spec))
    area = _map_area(spec.get("afd"))
    _try(held, missing, "rlimits", lambda: iso.set_limits(spec["limits"]))
    _try(held, missing, "no-capabilities", iso.drop_capabilities)
    if world["uid"] is not None:
        held.append("unprivileged-uid")
    elif "unprivileged-uid" not in missing:
        missing["unprivileged-uid"] = (f"the evaluator runs as uid {os.geteuid()}, not root: its candidates run "
                                       "as that uid, kept apart by their own namespaces")
    if world["seccomp"] is None:
        missing["seccomp"] = world["seccomp_why"]
    else:
        _try(held, missing, "seccomp", lambda: iso.load_seccomp(world["seccomp"]))
    if "seccomp" in missing and "no-network" in held and not world["flags"] & iso.CLONE_NEWNET:
        held.remove("no-network")  # another candidate of this server could be reached over a socket
        missing["no-network"] = "the fork server's network namespace is shared, and seccomp did not load"
    serve(Channel(spec["rfd"], spec["wfd"]), held, missing, spec["require"], area)


def _channel_fds(spec):
    return (spec["rfd"], spec["wfd"]) + ((spec["afd"],) if spec.get("afd") is not None else ())


def _map_area(fd):
    """The evaluator's shared memory of states, mapped read-only; its descriptor closed (nothing to reopen).

    Its seals (see `area` on the evaluator's side) refuse any write, writable mapping or
    resize, whatever the candidate tries; the evaluator never reads it back.
    """
    return iso.map_read_only(fd) if fd is not None else None


def _enter(world, scratch_mb):
    if not world["root"]:
        raise RuntimeError(world["missing"].get("private-filesystem", "no root was prepared"))
    iso.private_mounts(scratch_mb, world["scratch_binds"])
    _sethostname()


def _sethostname():
    name = b"sandbox"
    iso._check(iso._libc.sethostname(name, len(name)), "sethostname")


def _try(held, missing, name, step):
    try:
        step()
    except Exception as exc:  # noqa: BLE001  a protection that cannot hold is reported, not fatal here
        missing[name] = _why(exc)[:300]
    else:
        held.append(name)


def _close_other_fds(keep):
    edges = sorted(set(keep))
    low = 0
    for fd in edges:
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


# --- the fork server --------------------------------------------------------------
def prepare(setup):
    """The fork server's own set-up: the candidates' root, the claimed uid, the seccomp filter."""
    world = {"root": False, "uid": None, "missing": {}, "scratch_binds": []}
    world["seccomp"], world["seccomp_why"] = iso.seccomp_program()  # while the binding is still readable
    try:
        iso.own_mount_namespace()
        iso.build_root(ROOT, setup["entries"])
        iso.move_into(ROOT)
        world["root"] = True
        world["scratch_binds"] = iso.scratch_binds(setup["entries"])
    except OSError as exc:
        world["missing"]["private-filesystem"] = f"the candidates' root could not be built: {_why(exc)}"
    world["flags"] = iso.NAMESPACES
    if world["seccomp"] is not None:  # sockets refused: one empty network for all candidates
        try:
            iso.own_network_namespace()
            world["flags"] &= ~iso.CLONE_NEWNET
        except OSError:
            pass  # each candidate makes its own, as before
    if setup["uid"] is not None:
        try:
            iso.become(setup["uid"])
            world["uid"] = setup["uid"]
        except OSError as exc:  # e.g. a container whose user namespace does not map that uid
            world["missing"]["unprivileged-uid"] = f"uid {setup['uid']} could not be taken: {_why(exc)}"
    iso.prctl(iso.PR_SET_PDEATHSIG, signal.SIGKILL)  # a change of uid clears it
    world["ids"] = (os.geteuid(), os.getegid())  # what each candidate maps in its own user namespace
    return world


def zygote(sock_fd):
    """A warm, trusted parent that forks one isolated child per candidate.

    It has imported numpy and the wire format once, so a candidate's process
    starts in milliseconds instead of a fresh interpreter's 200. It never reads
    or runs candidate code; every child forks from its pristine state, closes the
    zygote's socket, isolates itself and only then loads the candidate. Requests
    (one JSON datagram each): setup (first, once: the root's entries and the
    claimed uid) -> what could not be prepared; spawn (with the child's pipe ends
    and log file as passed descriptors) -> pid; wait (pid, timeout) -> exit code
    as `Popen` reports it; kill (pid) -> at once, the group killed and reaped
    later. It exits, killing its children, when its parent goes away.
    """
    iso.prctl(iso.PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the evaluator decides when to stop
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sock = socket.socket(fileno=sock_fd)
    world = prepare(json.loads(sock.recv(1 << 20)))
    sock.send(json.dumps({"missing": world["missing"]}).encode())
    children, dying = {}, set()  # pid -> its CPU limit (s); killed, not reaped yet
    while True:
        dying = {pid for pid in dying if not os.waitpid(pid, os.WNOHANG)[0]}  # reap what was killed before
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 4)
        except OSError:
            data, fds = b"", []
        if not data:
            for pid in children:
                _kill(pid)
            os._exit(0)
        request = json.loads(data)
        if request["op"] == "spawn":
            spec = dict(request["spec"], rfd=fds[0], wfd=fds[1], afd=fds[3] if len(fds) > 3 else None)
            if spec["afd"] is not None:
                iso.area_type(os.fstat(spec["afd"]).st_size)  # made here once, found made by every child
            reply = {"pid": _spawn(sock, spec, fds, world)}
            children[reply["pid"]] = request["spec"]["limits"]["cpu_s"]
        elif request["op"] == "wait":
            code, lingered = _wait(request["pid"], request["timeout"], children.pop(request["pid"], None))
            reply = {"code": code, "lingered": lingered}
        elif request["op"] == "kill":  # reaped later, off the caller's clock
            reply = {"killed": request["pid"] in children}
            if reply["killed"]:
                _kill(request["pid"])
                children.pop(request["pid"])
                dying.add(request["pid"])
        else:
            reply = {"error": f"unknown op {request['op']!r}"}
        sock.send(json.dumps(reply).encode())


def _spawn(sock, spec, fds, world):
    pid, why = iso.fork_isolated(world["flags"])
    if pid == 0:  # the candidate's process: nothing of the zygote survives but its imports
        try:
            sock.close()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.setsid()
            os.dup2(fds[2], 1)
            os.dup2(fds[2], 2)
            os.close(fds[2])
            candidate(spec, world, why)
        except BaseException:  # noqa: BLE001  set-up failed: say why in the log, exit non-zero
            traceback.print_exc()
            os._exit(1)
        finally:
            os._exit(0)
    for fd in fds:
        os.close(fd)
    return pid


def _kill(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _wait(pid, timeout, cpu_s):
    """(exit code of child `pid`, whether it was still running at `timeout` s and so killed with its group).

    A candidate is pid 1 of its namespace, and pid 1 ignores SIGXCPU, so the CPU limit kills it
    with SIGKILL: a SIGKILL at or past `cpu_s` of CPU is reported as SIGXCPU, to say which limit fired.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:  # already gone (and reaped by an earlier wait): nothing to report
        return -signal.SIGKILL, False
    try:
        lingered = not select.select([pidfd], [], [], timeout)[0]
        if lingered:
            os.killpg(pid, signal.SIGKILL)
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        cpu = _cpu_seconds(pid)  # read before the zombie is reaped
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:  # not ours, or reaped already
        return -signal.SIGKILL, False
    finally:
        os.close(pidfd)
    code = os.waitstatus_to_exitcode(status)
    if code == -signal.SIGKILL and cpu_s is not None and cpu >= cpu_s:
        return -signal.SIGXCPU, False
    return code, lingered


def main():
    if sys.argv[1:2] != ["--zygote"] or len(sys.argv) != 3:
        sys.exit("usage: python -I _child.py --zygote FD")
    zygote(int(sys.argv[2]))


if __name__ == "__main__":
    main()
