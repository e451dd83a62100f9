"""What a candidate can see, keep and do: an allow-list root, its own namespaces, no way to change them.

Each candidate program reports what it found as its action values (or raises with
the finding), so every assertion is about what the candidate really observed.
"""
import ctypes
import os
import site

import numpy as np
import pytest

from evaluators._base import CandidateError
from evaluators.sandbox.allowlist import root_entries
from evaluators.sandbox.config import SandboxConfig
from evaluators.sandbox.process import PolicyProcess

LIMITS = SandboxConfig(wall_s=20, memory_mb=1024, startup_s=10)
BATCH = [({"x": np.zeros(1)}, {})]
ALL = ["no-network", "own-ipc", "own-pids", "private-filesystem", "rlimits", "no-capabilities", "seccomp"]
PRIVATE = ("/tmp", "/run", "/dev/shm", "/proc")


def found(code: str, limits: SandboxConfig = LIMITS, **kw) -> str:
    """The text a program raises (its finding), through the real sandbox."""
    with pytest.raises(CandidateError) as caught, PolicyProcess(code, "policy", limits, **kw) as proc:
        proc(BATCH)
    assert "RuntimeError: " in caught.value.reason, caught.value.reason
    return caught.value.reason.rsplit("RuntimeError: ", 1)[1].strip()


def test_every_protection_is_reported_in_force():
    with PolicyProcess("def policy(s, p):\n    return s['x']", "policy", LIMITS) as proc:
        proc(BATCH)
    expected = ALL + (["unprivileged-uid"] if os.geteuid() == 0 else [])
    assert sorted(proc.protections) == sorted(expected), proc.missing
    assert set(proc.missing) == ({"unprivileged-uid"} if os.geteuid() else set())


def test_the_root_holds_only_the_allow_list():
    allowed = [dst for _, _, dst in root_entries()] + list(PRIVATE)
    code = f'''import os
ALLOWED = {allowed!r}
def policy(s, p):
    extra = []
    for top, dirs, files in os.walk("/"):
        if top.startswith("/proc"):
            dirs[:] = []
            continue
        for name in files + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            path = os.path.join(top, name)
            if not any(path == a or path.startswith(a.rstrip("/") + "/") for a in ALLOWED):
                extra.append(path)
    raise RuntimeError(repr(extra[:20]))
'''
    assert found(code) == "[]"


def test_other_packages_atoll_and_wheels_are_absent():
    sites = site.getsitepackages()
    code = f'''import os
def policy(s, p):
    seen = [sorted(os.listdir(d)) for d in {sites!r} if os.path.isdir(d)]
    imports = []
    for name in ("evaluators", "controller", "pyscipopt", "gymnasium", "skfolio", "duckdb", "ray", "pip"):
        try:
            __import__(name)
            imports.append(name)
        except ImportError:
            pass
    raise RuntimeError(repr((seen, imports, os.listdir("/root") if os.path.isdir("/root") else None)))
'''
    listing, imports, home = eval(found(code))  # noqa: S307  (our own program's repr)
    assert all(sorted(d) in ([], ["numpy", "numpy.libs"]) for d in listing) and ["numpy", "numpy.libs"] in listing
    assert imports == []
    assert home in (None, [".pyenv"])


def test_a_hidden_folder_inside_an_allowed_package_is_empty():
    tests = os.path.join(os.path.dirname(np.__file__), "tests")
    code = f"import os\ndef policy(s, p):\n    raise RuntimeError(repr((os.listdir({tests!r}), len(os.listdir({os.path.dirname(tests)!r})))))"
    listing, neighbours = eval(found(code, hide=(tests,)))  # noqa: S307
    assert listing == [] and neighbours > 5 and len(os.listdir(tests)) > 5


def test_a_hidden_file_inside_an_allowed_package_cannot_be_read():
    """`sandbox_hide` names files too (a user's data file): one inside a bound folder is not readable."""
    hidden = os.path.join(os.path.dirname(np.__file__), "version.py")
    code = f"""def policy(s, p):
    try:
        seen = open({hidden!r}, "rb").read()
    except OSError as exc:
        seen = exc.strerror
    raise RuntimeError(repr(seen))
"""
    assert found(code, hide=(hidden,)) == "'Permission denied'" and os.path.getsize(hidden) > 0


def test_a_program_module_installed_under_tmp_is_there_whole_and_read_only(tmp_path, monkeypatch):
    """A virtual environment in /tmp (a CI's, a container's): its packages are bound into the root
    under /tmp, which each candidate gets a fresh tmpfs of; they are bound again inside it."""
    assert str(tmp_path).startswith("/tmp/"), "this test needs its files under /tmp"
    site_dir = tmp_path / "venv" / "site-packages"
    package = site_dir / "atoll_tmp_package"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 40\n")
    (package / "later.py").write_text("VALUE = 2\n")  # imported only by the candidate, after its /tmp is new
    monkeypatch.syspath_prepend(str(site_dir))
    code = f"""import os, sys
sys.path.insert(0, {str(site_dir)!r})
def policy(s, p):
    import atoll_tmp_package.later
    try:
        open({str(package / "mine.py")!r}, "w")
        wrote = "wrote"
    except OSError as exc:
        wrote = exc.strerror
    with open("/tmp/scratch", "w") as f:  # the rest of /tmp is the candidate's own
        f.write("x")
    raise RuntimeError(repr((atoll_tmp_package.VALUE + atoll_tmp_package.later.VALUE, wrote,
                             sorted(os.listdir({str(package)!r})), sorted(os.listdir("/tmp")))))
"""
    total, wrote, listing, scratch = eval(found(code, modules=("numpy", "atoll_tmp_package")))  # noqa: S307
    assert (total, wrote) == (42, "Read-only file system")
    assert listing == ["__init__.py", "later.py"] or listing == ["__init__.py", "__pycache__", "later.py"]
    bound = {dst.split("/")[2] for _, _, dst in root_entries(("numpy", "atoll_tmp_package")) if dst.startswith("/tmp/")}
    assert str(tmp_path).split("/")[2] in bound and scratch == sorted(bound | {"scratch"})  # nothing else of /tmp
    assert not (package / "mine.py").exists()


def test_own_namespaces_and_no_way_out():
    code = '''import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)

def errno_of(result):
    return errno.errorcode.get(ctypes.get_errno(), "?") if result == -1 else "allowed"

def policy(s, p):
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
    facts = {
        "pid": os.getpid(), "processes": sorted(d for d in os.listdir("/proc") if d.isdigit()),
        "interfaces": sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]),
        "hostname": socket.gethostname(), "socket": errno_of(libc.socket(1, 1, 0)),
        "inet socket": errno_of(libc.socket(2, 2, 0)), "socketpair": errno_of(libc.socketpair(1, 1, 0, (ctypes.c_int * 2)())),
        "capabilities": status["CapEff"].strip(),
        "every capability set": {status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")},
        "no_new_privs": status["NoNewPrivs"].strip(),
        "seccomp": status["Seccomp"].strip(),
        "unshare": errno_of(libc.unshare(0x10000000)), "mount": errno_of(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
        "ptrace": errno_of(libc.ptrace(0, 0, None, None)), "personality": errno_of(libc.personality(0x0040000)),
        "keyctl": errno_of(libc.syscall(250, 0, 0, 0, 0)), "bpf": errno_of(libc.syscall(321, 0, 0, 0)),
        "user namespaces": open("/proc/sys/user/max_user_namespaces").read().strip(),
    }
    raise RuntimeError(repr(facts))
'''
    facts = eval(found(code))  # noqa: S307
    assert facts["pid"] == 1 and facts["processes"] == ["1"]
    assert facts["interfaces"] == ["lo"] and facts["hostname"] == "sandbox"
    assert (facts["socket"], facts["inet socket"], facts["socketpair"]) == ("EPERM", "EPERM", "EPERM")
    assert facts["capabilities"] == "0000000000000000" and facts["no_new_privs"] == "1" and facts["seccomp"] == "2"
    assert facts["every capability set"] == {"0000000000000000"}  # the bounding and ambient sets too
    assert {k: facts[k] for k in ("unshare", "mount", "ptrace", "personality", "keyctl", "bpf")} == \
        dict.fromkeys(("unshare", "mount", "ptrace", "personality", "keyctl", "bpf"), "EPERM")
    assert facts["user namespaces"] == "0"


NOTE = '''import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
KEY = 0x41544F4C
SPOTS = ["/tmp/note", "/run/lock/note", "/run/note", "/dev/shm/note"]

def policy(s, p):
    seen = [p for p in SPOTS if os.path.exists(p)]
    seen += ["sysv shm"] if libc.shmget(KEY, 0, 0) != -1 else []
    seen += ["sysv queue"] if libc.msgget(KEY, 0) != -1 else []
    seen += ["posix queue"] if libc.mq_open(b"/atoll_note", os.O_RDONLY) != -1 else []
    for spot in SPOTS:
        open(spot, "w").write("kept?")
    # a POSIX queue has no bytes to hold (RLIMIT_MSGQUEUE 0), System V's are refused by seccomp
    made = libc.mq_open(b"/atoll_note", os.O_CREAT | os.O_RDWR, 0o666, None) != -1
    refused = [libc.shmget(KEY, 4096, 0o1000 | 0o666), libc.msgget(KEY, 0o1000 | 0o666)] == [-1, -1]
    raise RuntimeError(repr((seen, not made and refused)))
'''


def test_notes_left_by_one_evaluation_are_gone_for_the_next():
    assert found(NOTE) == "([], True)"
    assert found(NOTE) == "([], True)"
    assert f" {0x41544F4C} " not in open("/proc/sysvipc/shm").read()  # not left in the host's IPC either


# Ways to hold memory that RLIMIT_AS does not count: each holds what it made until the process ends.
KERNEL_MEMORY = '''import ctypes, mmap, os, socket
import numpy as np
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
MIB, WANT = 1 << 20, 320  # more than the 256 MiB address-space limit, in each way
KEPT = []

def memfds():  # written, never mapped
    for _ in range(WANT // 4):
        fd = os.memfd_create("x")
        os.write(fd, b"x" * (4 * MIB))
        KEPT.append(fd)
        yield 4

def secret_memfds():  # mapped, filled and unmapped, one at a time
    for _ in range(WANT // 4):
        fd = libc.syscall(447, 0)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "memfd_secret")
        os.ftruncate(fd, 4 * MIB)
        with mmap.mmap(fd, 4 * MIB) as m:
            m.write(b"x" * (4 * MIB))
        KEPT.append(fd)
        yield 4

def shared_memory():  # System V segments: attached, filled, detached
    for _ in range(WANT // 32):
        addr = libc.shmat(libc.shmget(0, 32 * MIB, 0o1600), None, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "shmget")
        ctypes.memset(addr, 1, 32 * MIB)
        libc.shmdt(ctypes.c_void_p(addr))
        yield 32

def semaphores():  # arrays of 16000 semaphores, 64 bytes each in the kernel
    for _ in range(WANT):
        if libc.semget(0, 16000, 0o1600) == -1:
            raise OSError(ctypes.get_errno(), "semget")
        yield 16000 * 64 / MIB

def message_queues():  # 16 KiB of messages a queue
    message = ctypes.create_string_buffer(b"\\x01" + bytes(8192 + 7))
    for _ in range(WANT * 64):
        queue = libc.msgget(0, 0o1600)
        for _ in range(2):
            if libc.msgsnd(queue, message, 8192, 0o4000) == -1:
                raise OSError(ctypes.get_errno(), "msgsnd")
            yield 8192 / MIB

def socket_buffers():  # each end of a socketpair filled
    while True:
        pair = socket.socketpair()
        KEPT.append(pair)
        for end in pair:
            end.setblocking(False)
            try:
                while True:
                    yield end.send(b"x" * 65536) / MIB
            except BlockingIOError:
                pass

def pipes():
    while True:
        r, w = os.pipe()
        KEPT.append((r, w))
        os.set_blocking(w, False)
        try:
            while True:
                yield os.write(w, b"x" * 65536) / MIB
        except BlockingIOError:
            pass

def held(way):
    total = 0
    try:
        for mib in way():
            total += mib
            if total >= WANT:
                break
    except OSError:
        pass
    return round(total)

def scratch_entries():  # empty folders: a tmpfs's size counts no inode
    made = 0
    for top in ("/tmp", "/dev/shm"):
        try:
            for i in range(100_000):
                os.mkdir("%s/%s%06d" % (top, "x" * 200, i))
                made += 1
        except OSError:
            pass
    return made

def policy(s, p):
    ways = (memfds, secret_memfds, shared_memory, semaphores, message_queues, socket_buffers, pipes)
    raise RuntimeError(repr(({way.__name__: held(way) for way in ways}, scratch_entries())))
'''


def test_no_memory_is_held_outside_the_address_space_limit():
    """Kernel memory a candidate could fill past RLIMIT_AS, in one process and without end: memfds,
    System V objects (their limits in its own IPC namespace are the kernel's defaults), socket
    buffers, descriptors by the thousand, inodes of its scratch tmpfs. Each way holds a few MiB at most."""
    held, entries = eval(found(KERNEL_MEMORY, limits=SandboxConfig(wall_s=60, memory_mb=256, startup_s=10)))
    assert all(mib <= 8 for mib in held.values()), held  # pipes: 128 of 64 KiB
    assert entries <= 2 * (LIMITS.scratch_mb << 8), entries  # an inode per 4 KiB of /tmp and /dev/shm


MEET_HOST = '''import ctypes, socket
import numpy as np
try:  # an abstract name in the network namespace its fork server's candidates share, open to any sender
    EAR, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    EAR.bind(b"\\0atoll-meet")
    ctypes.CDLL(None).connect(EAR.fileno(), ctypes.byref(ctypes.c_ushort(0)), 2)  # AF_UNSPEC: no peer
    EAR.setblocking(False)
except OSError:
    EAR = None

def policy(s, p):
    try:
        return np.array([float(EAR.recv(64))])
    except (OSError, AttributeError):
        return np.array([0.0])
'''
MEET_GUEST = '''import socket
import numpy as np
def policy(s, p):
    try:
        mouth, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        mouth.sendto(b"42", b"\\0atoll-meet")
    except OSError:
        pass
    return np.array([1.0])
'''


def test_two_candidates_of_one_fork_server_cannot_reach_each_other():
    with PolicyProcess(MEET_HOST, "policy", LIMITS) as host:  # loaded: its name is taken, if it could be
        with PolicyProcess(MEET_GUEST, "policy", LIMITS) as guest:
            assert guest._server is host._server
            guest(BATCH)
        assert host(BATCH)[0].tolist() == [0.0]


AIO = '''import ctypes
import numpy as np
libc = ctypes.CDLL(None, use_errno=True)

def policy(s, p):
    taken = 0
    for _ in range(1024):  # contexts of 8192 events, until the machine's fs.aio-max-nr is spent
        if libc.syscall(206, 8192, ctypes.byref(ctypes.c_ulong(0))) != 0:
            break
        taken += 8192
    return np.array([float(taken)])
'''


def test_a_candidate_cannot_take_the_machines_aio_contexts():
    """io_setup(2) counts against one machine-wide limit: a candidate holding it all would refuse
    every other process of the node (the evaluator's included) its asynchronous I/O while it lives."""
    libc = ctypes.CDLL(None, use_errno=True)
    with PolicyProcess(AIO, "policy", LIMITS) as proc:
        taken = proc(BATCH)[0].tolist()
        context = ctypes.c_ulong(0)
        ours = libc.syscall(206, 128, ctypes.byref(context))  # while the candidate still lives
        if ours == 0:
            libc.syscall(207, context)  # io_destroy
    assert (taken, ours) == ([0.0], 0), (taken, ours, ctypes.get_errno())


FALLOCATE = '''import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)

def policy(s, p):
    libc.fallocate(1, 1, ctypes.c_long(0), ctypes.c_long(1 << 30))  # FALLOC_FL_KEEP_SIZE, on its log
    taken = os.fstat(1).st_blocks * 512
    with open("/tmp/made", "wb") as f:  # what posix_fallocate asks for is still written
        os.posix_fallocate(f.fileno(), 0, 1 << 20)
        made = os.fstat(f.fileno()).st_size
    raise RuntimeError(repr((taken, made)))
'''


def test_a_candidate_cannot_take_disk_past_its_file_size_limit():
    """fallocate(2) keeping a file's size allocates blocks that RLIMIT_FSIZE never counts: on the
    candidate's log, which lies on the evaluator's disk, a GiB a call until the disk is full."""
    taken, made = eval(found(FALLOCATE))
    assert taken <= LIMITS.file_mb << 20 and made == 1 << 20, (taken, made)


def test_a_candidate_can_raise_no_priority_and_lock_or_queue_no_memory():
    """Limits a candidate inherited from its evaluator: a user's real-time priority allowance (an audio
    group's rtprio) let it starve the machine at a real-time priority, and locked pages (RLIMIT_MEMLOCK,
    8 MiB here) and POSIX message queues' bytes are memory RLIMIT_AS does not count."""
    code = '''import resource
def policy(s, p):
    raise RuntimeError(repr([resource.getrlimit(getattr(resource, n)) for n in
                             ("RLIMIT_RTPRIO", "RLIMIT_NICE", "RLIMIT_MEMLOCK", "RLIMIT_MSGQUEUE")]))
'''
    assert found(code) == repr([(0, 0)] * 4)
