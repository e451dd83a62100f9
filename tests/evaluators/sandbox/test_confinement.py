"""What a candidate can see, keep and do: an allow-list root, its own namespaces, no way to change them.

Each candidate program reports what it found as its action values (or raises with
the finding), so every assertion is about what the candidate really observed.
"""
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


def found(code: str, **kw) -> str:
    """The text a program raises (its finding), through the real sandbox."""
    with pytest.raises(CandidateError) as caught, PolicyProcess(code, "policy", LIMITS, **kw) as proc:
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
    assert (facts["socket"], facts["inet socket"], facts["socketpair"]) == ("EPERM", "EPERM", "allowed")
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
    made = [libc.shmget(KEY, 4096, 0o1000 | 0o666), libc.msgget(KEY, 0o1000 | 0o666),
            libc.mq_open(b"/atoll_note", os.O_CREAT | os.O_RDWR, 0o666, None)]
    raise RuntimeError(repr((seen, all(m != -1 for m in made))))
'''


def test_notes_left_by_one_evaluation_are_gone_for_the_next():
    assert found(NOTE) == "([], True)"
    assert found(NOTE) == "([], True)"
    assert f" {0x41544F4C} " not in open("/proc/sysvipc/shm").read()  # not left in the host's IPC either
