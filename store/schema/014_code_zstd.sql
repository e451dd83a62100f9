-- Version 14: programs' code compressed with zstd when the archive folds its write-ahead log
-- into the file. DuckDB's default for strings (dictionary + FSST) cost more at those folds than
-- the whole insert of a program did (1-2 KB of code each, benchmarks/archive_scale.py), and zstd
-- makes the file several times smaller on code that differs from its parent by a few tokens.
-- A column's compression is fixed when its table is created, so the table is rebuilt with the
-- same columns, constraints and rows, in commit order.

CREATE TABLE programs_v14 (
    program_id    VARCHAR NOT NULL,
    run_id        VARCHAR NOT NULL,
    island        INTEGER NOT NULL,
    generation    INTEGER NOT NULL,
    parent_ids    VARCHAR[] NOT NULL,
    code          VARCHAR USING COMPRESSION zstd NOT NULL,
    code_hash     VARCHAR NOT NULL,
    mutator       VARCHAR NOT NULL,
    created_at    DOUBLE NOT NULL,
    seq           BIGINT NOT NULL,
    id_hash       UBIGINT NOT NULL,
    proposed_hash VARCHAR,
    search_status VARCHAR,
    search_score  DOUBLE,
    parent_score  DOUBLE,
    best_so_far   DOUBLE
);
INSERT INTO programs_v14 BY NAME SELECT * FROM programs ORDER BY seq;
DROP TABLE programs;
ALTER TABLE programs_v14 RENAME TO programs;
