"""Atoll's cache of what it can compute again (DP optima, MILP instances): a home that cannot be
written moves it to a folder of the user's own, never to one someone else could fill."""
import os
import stat
import tempfile

import pytest

from evaluators.cache import cache_dir
from evaluators.domains.inventory.dp import cached_solve


@pytest.fixture()
def no_home(tmp_path, monkeypatch):
    """HOME is a file (no folder can be made in it, even by root); the temp dir is the test's own."""
    (tmp_path / "home").write_text("")
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ATOLL_CACHE_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return tmp_path


def test_the_environment_then_the_home_decide(tmp_path, monkeypatch):
    monkeypatch.setenv("ATOLL_CACHE_DIR", str(tmp_path / "chosen"))
    assert cache_dir() == tmp_path / "chosen"
    monkeypatch.delenv("ATOLL_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "atoll" and cache_dir().is_dir()


def test_a_home_that_cannot_be_written_moves_the_cache_to_a_folder_of_the_users_own(no_home):
    folder = cache_dir()
    assert folder == no_home / "tmp" / f"atoll-cache-{os.getuid()}"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    result = cached_solve("poisson", 3.0, 1, 9.0)  # the DP optimum is computed and remembered there
    assert [p.parent.name for p in folder.rglob("*.json")] == ["inventory_dp"]
    assert cached_solve("poisson", 3.0, 1, 9.0) == result


def test_a_fallback_folder_that_others_can_write_is_refused_in_one_line(no_home):
    squatted = no_home / "tmp" / f"atoll-cache-{os.getuid()}"
    squatted.mkdir()
    squatted.chmod(0o777)  # as if another user had made it first, for everyone
    with pytest.raises(PermissionError, match="set ATOLL_CACHE_DIR to a folder of your own"):
        cache_dir()
