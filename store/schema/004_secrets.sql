-- Atoll archive, version 4: each run's secret randomness (see evaluators/secrets.py).
-- Three 128-bit secrets (decimal strings), one per split, from which every random stream a
-- score depends on derives. The archive lives in the run directory, which no candidate's
-- sandbox can see; the run's own queries (atoll query) may read this table.
-- replayable: the secrets were derived from a number the user chose (run.replay_seed).
CREATE TABLE run_secrets (
    run_id      VARCHAR PRIMARY KEY,
    search      VARCHAR NOT NULL,
    validation  VARCHAR NOT NULL,
    heldout     VARCHAR NOT NULL,
    replayable  BOOLEAN NOT NULL,
    created_at  TIMESTAMP NOT NULL
);
