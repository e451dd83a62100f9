"""The sandbox protections stored with a run (migration 3)."""
from store.duckdb_archive import DuckDBArchive


def test_a_resumed_run_keeps_the_protections_that_held_in_every_segment(tmp_path):
    with DuckDBArchive(tmp_path / "archive.duckdb") as archive:
        archive.create_run("r1", {"run": {"name": "x"}})
        archive.record_protections("r1", ["no-network", "private-filesystem", "seccomp"])
        archive.record_protections("r1", ["no-network", "seccomp", "own-pids"])  # resumed elsewhere
        stored = archive.con.execute("SELECT protections FROM runs WHERE run_id = 'r1'").fetchone()[0]
    assert stored == ["no-network", "seccomp"]
