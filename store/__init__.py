"""The archive: every program, evaluation, event and lineage edge of every run."""
