"""The archive keeps a run's secrets (migration 004) exactly, and says when a run has none."""
from evaluators.secrets import RunSecrets
from store.duckdb_archive import DuckDBArchive


def test_secrets_round_trip_exactly_and_a_run_without_them_has_none(tmp_path):
    drawn, replayed = RunSecrets.draw(), RunSecrets.fixed(7)
    with DuckDBArchive(tmp_path / "archive.duckdb") as archive:
        for run_id, secrets in (("a", drawn), ("b", replayed)):
            archive.create_run(run_id, {"run": {"name": run_id}}, "")
            archive.save_secrets(run_id, secrets.to_record())
        archive.create_run("old", {"run": {"name": "old"}}, "")
    with DuckDBArchive(tmp_path / "archive.duckdb", read_only=True) as archive:
        assert RunSecrets.from_record(archive.load_secrets("a")) == drawn  # all 128 bits of each
        assert RunSecrets.from_record(archive.load_secrets("b")) == replayed and replayed.replayable
        assert archive.load_secrets("old") is None
