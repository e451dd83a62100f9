"""The confinement of a candidate's process, set up before any candidate code runs.

Imported by file from `_child.py` (never as part of Atoll): the standard library
and, if installed, pyseccomp (libseccomp's binding) only.

Two stages. The fork server, once: a mount namespace of its own (as root
directly, as a user inside a user namespace of its own) in which it builds the
candidates' root, a tmpfs that holds nothing but read-only binds of the
allow-list, and pivots into it, detaching the host's file system; an empty
network namespace its candidates share (where seccomp can refuse them sockets);
then (as root) it takes the evaluator's claimed unprivileged uid for good. Each
candidate's process: a user namespace mapping its own uid (so the same code
path holds for root and for a user), new mount, IPC, UTS, cgroup and PID
namespaces (and network, where not shared), a fresh /proc, private /tmp, /run
and /dev/shm over the shared root's empty ones, resource limits, no
capabilities, no new privileges and a seccomp filter, in that order.
"""
import ctypes
import errno
import mmap
import os
import resource
import time

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x2000000, 0x4000000, 0x8000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
NAMESPACES = CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME, _ST_RELATIME = 1024, 2048, 1 << 21, 4096
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
SYS_PIVOT_ROOT, SYS_CAPGET, SYS_CAPSET = 155, 125, 126  # x86_64; seccomp's filter is built for the native arch alone
SAFE = MS_NOSUID | MS_NODEV
_CAP_VERSION_3 = 0x20080522
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source, target: str, fstype=None, flags: int = 0, data: str | None = None) -> None:
    _check(_libc.mount(source.encode() if source else None, target.encode(),
                       fstype.encode() if fstype else None, flags, data.encode() if data else None),
           f"mount {target}")


def tmpfs(target: str, size_kb: int, mode: str, flags: int = SAFE, inodes: int | None = None) -> None:
    mount("tmpfs", target, "tmpfs", flags, f"size={size_kb}k,mode={mode}" + (f",nr_inodes={inodes}" if inodes else ""))


def scratch(target: str, size_kb: int, mode: str) -> None:
    """A candidate's writable tmpfs, with an inode per 4 KiB of its size: the size counts no inode, and
    the kernel's default number (half the machine's pages) would let empty files take gigabytes."""
    tmpfs(target, size_kb, mode, inodes=max(size_kb >> 2, 64))


def read_only(target: str, extra: int = 0) -> None:
    """Remount a bind read-only, keeping the flags it has (a user namespace may not clear them)."""
    have = os.statvfs(target).f_flag
    kept = have & (MS_NOSUID | MS_NODEV | MS_NOEXEC | _MS_NOATIME | _MS_NODIRATIME)
    kept |= _MS_RELATIME if have & _ST_RELATIME else 0
    mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | SAFE | kept | extra)


def prctl(option: int, arg: int = 0) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl {option}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def map_own_ids(uid: int, gid: int) -> None:
    """Inside a new user namespace: map our own uid and gid (all an unprivileged process may map)."""
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")


# --- the fork server, once ---------------------------------------------------
def own_mount_namespace() -> None:
    """A mount namespace for the fork server: as root directly, as a user in a user namespace."""
    if os.geteuid() == 0:
        unshare(CLONE_NEWNS)
    else:
        uid, gid = os.geteuid(), os.getegid()
        unshare(CLONE_NEWUSER | CLONE_NEWNS)
        map_own_ids(uid, gid)
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def own_network_namespace() -> None:
    """An empty network namespace for the fork server, which its candidates then share.

    Making and tearing down a network namespace costs the most of any namespace, much of
    it the kernel's after the process is gone (`benchmarks/namespace_cost.py`); shared, a
    candidate still sees only a loopback device that is down, and the seccomp filter
    refuses socket(2), so candidates of one server cannot reach each other either.
    Called after `own_mount_namespace`, whose user namespace it needs when not root.
    """
    unshare(CLONE_NEWNET)


def build_root(root: str, entries: list[dict]) -> None:
    """A tmpfs at `root` holding only `entries` (binds read-only, covers empty or unopenable), then read-only itself.

    Every source is opened before anything is mounted, so a source under `root`
    itself is still reached. (Entries under /tmp, /run or /dev/shm, an interpreter or
    a virtual environment in /tmp, are bound again in each candidate's private ones:
    `private_mounts`.) Entries come sorted by
    target, so a cover (an empty tmpfs over site-packages) goes on after the
    bind it sits in and before the binds that go back into it.
    """
    held = {e["dst"]: os.open(e["src"], os.O_PATH | os.O_CLOEXEC) for e in entries if e["src"]}
    try:
        tmpfs(root, 4096, "755")
        covers = [root + e["dst"] for e in entries if e["kind"] == "cover"]
        for entry in entries:
            _place(root + entry["dst"], entry, held.get(entry["dst"]))
        for name in ("proc", "tmp", "run", "dev/shm"):
            os.makedirs(f"{root}/{name}", exist_ok=True)
        for target in reversed(covers):
            read_only(target, MS_NOEXEC)
        read_only(root, MS_NOEXEC)
    finally:
        for fd in held.values():
            os.close(fd)


def _place(target: str, entry: dict, fd: int | None) -> None:
    if entry["kind"] == "cover":  # a hidden folder gets an empty tmpfs, a hidden file its source (/dev/null)
        if fd is None:
            tmpfs(target, 64, "755")
        else:
            mount(f"/proc/self/fd/{fd}", target, None, MS_BIND)
        return
    if entry["kind"] == "dir":
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    if entry["kind"] != "device":  # a device keeps its flags: /dev/null takes writes
        read_only(target)


def become(uid: int) -> None:
    """As root: the claimed unprivileged uid for good (and stay dumpable, so children may map their ids)."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    prctl(PR_SET_DUMPABLE, 1)


# --- one candidate --------------------------------------------------------------
SYS_CLONE, SIGCHLD = 56, 17  # x86_64


def fork_isolated(flags: int = NAMESPACES) -> tuple[int, str]:
    """Fork straight into new namespaces (`flags`; by default user, mount, network, IPC, UTS,
    cgroup and PID), so the child is pid 1 of its own from birth: (pid as `os.fork` gives it,
    0 in the child; why not).

    One raw clone(2) where unshare(2) would need a second fork to enter the PID namespace: a
    fork and an exit fewer per candidate. The caller is single-threaded (the fork server), so
    the child's interpreter is whole without Python's after-fork hooks. Where the kernel refuses
    the namespaces, a plain fork, and the second item says why. `flags` leaves out
    CLONE_NEWNET where the fork server made a network namespace for its candidates.
    """
    for attempt in range(4):  # a refusal for a passing reason (EAGAIN, ENOSPC: the last namespaces
        if attempt:  # are still being torn down) is tried again before a fork without namespaces
            time.sleep(0.01 * attempt)
        pid = _libc.syscall(SYS_CLONE, ctypes.c_ulong(flags | SIGCHLD), None, None, None, None)
        if pid >= 0:
            return pid, ""
        err = ctypes.get_errno()
        if err not in (errno.EAGAIN, errno.ENOSPC):
            break
    return os.fork(), f"{os.strerror(err)} (errno {err})"


def move_into(root: str) -> None:
    """The fork server moves into the root it built, with the host's /proc bound in for its children.

    Its children's mount namespaces are then copies of that root alone: nothing
    of the host's file system is left in them to detach.
    """
    mount("/proc", f"{root}/proc", None, MS_BIND | MS_REC)
    os.chdir(root)
    _check(_libc.syscall(SYS_PIVOT_ROOT, b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "detach the old root")
    os.chdir("/")


SCRATCH = ("/tmp", "/run", "/dev/shm")  # private to each candidate: a fresh tmpfs over the shared root's


def scratch_binds(entries: list[dict]) -> list[tuple[str, str]]:
    """The root's binds that a candidate's private scratch folders would hide, as (path, kind):
    the outermost ones under /tmp, /run or /dev/shm (a virtual environment in /tmp); what lies
    inside them, covers included, comes back with them."""
    under = [(e["dst"], e["kind"]) for e in entries if e["kind"] != "cover"
             and any(e["dst"].startswith(top + "/") for top in SCRATCH)]
    return [(path, kind) for path, kind in under
            if not any(path.startswith(other + "/") for other, _ in under if other != path)]


def private_mounts(scratch_mb: int, keep: list[tuple[str, str]] = ()) -> None:
    """A fresh /proc (this pid namespace's), and private /tmp, /run and /dev/shm, over the shared root's;
    the binds of `keep` (`scratch_binds`) are bound again at their place in them, read-only as they were."""
    held = [(path, kind, os.open(path, os.O_PATH | os.O_CLOEXEC)) for path, kind in keep]
    try:
        mount("proc", "/proc", "proc", SAFE | MS_NOEXEC)
        scratch("/tmp", scratch_mb << 10, "1777")
        scratch("/run", 1024, "755")
        scratch("/dev/shm", scratch_mb << 10, "1777")
        for path, kind, fd in held:
            _place(path, {"kind": kind}, fd)
    finally:
        for _, _, fd in held:
            os.close(fd)
    os.mkdir("/run/lock", 0o1777)
    os.chmod("/run/lock", 0o1777)
    try:  # no user namespaces below this one, whatever else fails later
        _write("/proc/sys/user/max_user_namespaces", "0")
    except OSError:
        pass
    os.chdir("/tmp")


_mmap = _libc.mmap  # its prototype set once, in the fork server, for every candidate
_mmap.restype, _mmap.argtypes = ctypes.c_void_p, (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                                  ctypes.c_int, ctypes.c_long)


def area_type(size: int):
    """The ctypes array a mapping of `size` bytes is seen as; made in the fork server, a child finds it made.

    (ctypes keeps each array type it builds, so a child need not build its own.)
    """
    return ctypes.c_char * size


def map_read_only(fd: int):
    """The whole file of `fd` mapped shared and read-only, as a ctypes char array; `fd` is closed.

    Mapped with the C library, not `mmap.mmap`, which keeps a duplicate of the descriptor open.
    """
    try:
        size = os.fstat(fd).st_size
        addr = _mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            err = ctypes.get_errno()
            raise OSError(err, f"mmap: {os.strerror(err)}")
        return area_type(size).from_address(addr)
    finally:
        os.close(fd)


FILES = 256  # open descriptors a candidate's process may hold: each pipe's buffers are memory no other limit counts


def set_limits(limits: dict) -> None:
    """The candidate's resource limits, soft and hard alike. Besides memory, CPU, file size, processes
    and files: no core dumps, no real-time or raised priority (a user's rtprio allowance, an audio
    group's, would let it starve the machine), and no locked pages or POSIX message-queue bytes
    (memory that RLIMIT_AS does not count)."""
    for name, value in (("RLIMIT_AS", limits["memory_mb"] << 20), ("RLIMIT_CPU", limits["cpu_s"]),
                        ("RLIMIT_FSIZE", limits["file_mb"] << 20), ("RLIMIT_CORE", 0),
                        ("RLIMIT_NPROC", limits["processes"]), ("RLIMIT_NOFILE", FILES),
                        ("RLIMIT_RTPRIO", 0), ("RLIMIT_NICE", 0), ("RLIMIT_MEMLOCK", 0), ("RLIMIT_MSGQUEUE", 0)):
        resource.setrlimit(getattr(resource, name), (value, value))


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """No capability left in any set (bounding and ambient included), and no way to gain one.

    Which capabilities are held comes from capget(2), not /proc/self/status, whose text is
    costly to make and read; the bounding set is emptied up to the first number
    the kernel calls invalid (its last capability, without reading /proc/sys/kernel/cap_last_cap).
    """
    header, held = _CapHeader(_CAP_VERSION_3, 0), (_CapData * 2)()
    _check(_libc.syscall(SYS_CAPGET, ctypes.byref(header), held), "capget")
    if held[0].effective or held[1].effective:  # none held: none to drop (and no right to touch the bounding set)
        for cap in range(64):
            if _libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0:
                if ctypes.get_errno() == errno.EINVAL and cap:
                    break  # past the last capability
                _check(-1, f"drop capability {cap} from the bounding set")
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    _check(_libc.syscall(SYS_CAPSET, ctypes.byref(_CapHeader(_CAP_VERSION_3, 0)), (_CapData * 2)()), "capset")
    prctl(PR_SET_NO_NEW_PRIVS, 1)


# --- seccomp ------------------------------------------------------------------
# What a policy never needs: new namespaces, mounts, tracing other processes,
# kernel keys, BPF, personality changes, module and kexec loading, io_uring (which
# would bypass this filter), clock and host changes, sockets (the candidates of one
# fork server share its empty network namespace, whose abstract socket names a
# socketpair's end can take), and memory that no address-space limit counts: a
# memfd's pages, System V shared memory, semaphores and message queues (whose limits
# in a candidate's own IPC namespace are the kernel's, unbounded), socket buffers;
# and the machine's Linux AIO contexts (`fs.aio-max-nr`, one count for every process);
# and disk that no file-size limit counts (`fallocate`, refused as unsupported).
BLOCKED = ("socket", "socketpair", "memfd_create", "memfd_secret", "shmget", "semget", "msgget", "io_setup",
           "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount",
           "fspick", "move_mount", "open_tree", "mount_setattr", "ptrace", "process_vm_readv",
           "process_vm_writev", "kcmp", "pidfd_getfd", "bpf", "perf_event_open", "userfaultfd", "keyctl",
           "add_key", "request_key", "personality", "kexec_load", "kexec_file_load", "init_module",
           "finit_module", "delete_module", "open_by_handle_at", "name_to_handle_at", "io_uring_setup",
           "io_uring_enter", "io_uring_register", "swapon", "swapoff", "reboot", "acct", "quotactl", "syslog",
           "iopl", "ioperm", "sethostname", "setdomainname", "settimeofday", "clock_settime", "clock_adjtime",
           "adjtimex", "lookup_dcookie", "vhangup", "uselib", "fanotify_init")
_CLONE_FLAGS = (CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET)


def seccomp_program():
    """The filter as a BPF program, built once in the fork server with libseccomp; None (and why) if unavailable."""
    try:
        import pyseccomp as sc
    except (ImportError, RuntimeError, OSError) as exc:
        return None, f"libseccomp's binding is not available ({exc}); install pyseccomp and libseccomp2"
    with os.fdopen(os.memfd_create("seccomp"), "w+b") as out:
        _filter(sc).export_bpf(out)
        out.seek(0)
        return out.read(), None


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load_seccomp(program: bytes) -> None:
    """Install the prepared filter (no-new-privileges must already be set): one call, no rebuilding."""
    code = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(code, ctypes.c_void_p))
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def _filter(sc):
    """What `BLOCKED` and the clone rules say, as a libseccomp filter that allows everything else."""
    flt = sc.SyscallFilter(sc.ALLOW)
    for name in BLOCKED:
        try:
            flt.add_rule(sc.ERRNO(errno.EPERM), name)
        except (ValueError, RuntimeError, OSError):
            pass  # a call this kernel or libseccomp does not know cannot be made either
    for flag in _CLONE_FLAGS:  # clone with any namespace flag; clone3's flags are out of a filter's reach
        flt.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")  # so the C library falls back to clone
    # fallocate(2) with FALLOC_FL_KEEP_SIZE takes disk (or a tmpfs' memory) that RLIMIT_FSIZE never
    # counts, on its log file too, which lies on the evaluator's disk; refused as unsupported, so
    # posix_fallocate(3) falls back to writing, which the limit counts.
    flt.add_rule(sc.ERRNO(errno.EOPNOTSUPP), "fallocate")
    return flt
