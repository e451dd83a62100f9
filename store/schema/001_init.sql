-- Atoll archive, version 1: every run, program, lineage edge, evaluation and event.
CREATE TABLE runs (
    run_id      VARCHAR PRIMARY KEY,
    name        VARCHAR,
    status      VARCHAR NOT NULL,
    started_at  TIMESTAMP NOT NULL,
    ended_at    TIMESTAMP,
    config      JSON NOT NULL,
    toml        VARCHAR
);

CREATE TABLE programs (
    program_id  VARCHAR PRIMARY KEY,
    run_id      VARCHAR NOT NULL,
    island      INTEGER NOT NULL,
    generation  INTEGER NOT NULL,
    parent_ids  VARCHAR[] NOT NULL,
    code        VARCHAR NOT NULL,
    code_hash   VARCHAR NOT NULL,
    mutator     VARCHAR NOT NULL,
    created_at  DOUBLE NOT NULL,
    seq         BIGINT NOT NULL
);

CREATE TABLE lineage (
    child_id    VARCHAR NOT NULL,
    parent_id   VARCHAR NOT NULL,
    run_id      VARCHAR NOT NULL
);

CREATE TABLE evaluations (
    program_id      VARCHAR NOT NULL,
    run_id          VARCHAR NOT NULL,
    split           VARCHAR NOT NULL,
    status          VARCHAR NOT NULL,
    score           DOUBLE,
    metrics         JSON,
    instance_scores DOUBLE[],
    descriptors     DOUBLE[],
    error           VARCHAR,
    duration_s      DOUBLE,
    created_at      DOUBLE NOT NULL,
    PRIMARY KEY (program_id, split)
);

CREATE TABLE events (
    run_id  VARCHAR NOT NULL,
    ts      DOUBLE NOT NULL,
    kind    VARCHAR NOT NULL,
    data    JSON
);

CREATE TABLE snapshots (
    run_id      VARCHAR NOT NULL,
    saved_at    DOUBLE NOT NULL,
    data        BLOB NOT NULL
);

-- For the LLM mutators and the skill library (later issues): tables only for now.
CREATE TABLE llm_calls (
    call_id     VARCHAR PRIMARY KEY,
    run_id      VARCHAR,
    program_id  VARCHAR,
    model       VARCHAR,
    prompt      VARCHAR,
    completion  VARCHAR,
    tokens_in   INTEGER,
    tokens_out  INTEGER,
    latency_s   DOUBLE,
    created_at  DOUBLE
);

CREATE TABLE skills (
    skill_id            VARCHAR PRIMARY KEY,
    name                VARCHAR,
    code                VARCHAR,
    description         VARCHAR,
    source_program_id   VARCHAR,
    created_at          DOUBLE,
    uses                INTEGER DEFAULT 0
);
