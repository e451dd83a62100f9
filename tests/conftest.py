"""One real Ray for the whole test session, on 2 CPUs, stopped at the end.

Run the suite inside a network namespace (see README) so Ray's traffic stays on
loopback; only the instance started here is shut down.
"""
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session", autouse=True)
def session_library(tmp_path_factory):
    """The library of what outlives one test: a module's Ray head (whose jobs' drivers inherit its
    environment) and a run a module fixture starts. Set before any of them, never the user's."""
    path = tmp_path_factory.mktemp("session-library") / "library.duckdb"
    with pytest.MonkeyPatch.context() as session:
        session.setenv("ATOLL_LIBRARY", str(path))
        yield path


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory):
    """The cache (DP optima, generated MILP instances) of every run a test starts: what one run computed
    the next reads, as a user's runs do, where each test's cold cache had recomputed the inventory's
    DP optima (3 s a report). Tests of the cache itself set their own."""
    path = tmp_path_factory.mktemp("session-cache")
    with pytest.MonkeyPatch.context() as session:
        session.setenv("ATOLL_CACHE_DIR", str(path))
        yield path


@pytest.fixture(autouse=True)
def temporary_library(tmp_path, monkeypatch):
    """Every test (and every CLI it starts) uses its own library, never the user's real one."""
    path = tmp_path / "library" / "library.duckdb"
    monkeypatch.setenv("ATOLL_LIBRARY", str(path))
    return path


@pytest.fixture(autouse=True)
def wide_output(monkeypatch):
    """The CLIs a test starts print as they do to a file or a pipe, whatever terminal size the
    caller's environment names (pytest-xdist sets COLUMNS=80): a wrapped table cell would split
    the words the tests look for."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    from controller.actors import start_local

    start_local(2, str(ROOT))
    yield ray
    ray.shutdown()


@pytest.fixture()
def atoll_cli(tmp_path):
    """Run the real entry point as a subprocess: returns a function(args, **popen_kw)."""
    import subprocess

    def run(*args, timeout=300, check=True):
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.run([sys.executable, "-m", "controller", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"atoll {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc
    return run
