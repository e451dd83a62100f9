-- Version 8: the archive at a million programs.
--
-- No primary keys on programs and evaluations: keeping an ART index on every id cost
-- more than the rows themselves at ingest. The writer (store/duckdb_archive.py)
-- keeps a program stored once and an evaluation once per (program, split) itself.
-- What the views and a resume need is kept on the program row, so none of them joins
-- a million rows: the program's search evaluation (status, score), the best OK search
-- score of its parents when it was recorded, and its island's running best. Lineage
-- edges carry the programs' commit numbers, so ancestry walks integers in commit
-- order. Tables are rebuilt with `SELECT *`, so columns added by other migrations stay.

CREATE TABLE programs_v8 AS
WITH search AS (
    SELECT program_id, status, score, json_extract_string(metrics, '$.proposed_hash') AS proposed_hash
    FROM evaluations WHERE split = 'search'
), parent_best AS (
    SELECT l.child_id, max(e.score) AS score
    FROM lineage l JOIN evaluations e ON e.program_id = l.parent_id AND e.split = 'search' AND e.status = 'OK'
    GROUP BY l.child_id
)
SELECT p.*,
       ('0x' || md5(p.program_id)[1:16])::UBIGINT AS id_hash,
       s.proposed_hash,
       s.status AS search_status,
       s.score AS search_score,
       pb.score AS parent_score,
       CASE WHEN s.status = 'OK' AND p.island >= 0 AND s.score IS NOT NULL THEN
           max(s.score) FILTER (WHERE s.status = 'OK' AND p.island >= 0)
               OVER (PARTITION BY p.run_id, p.island ORDER BY p.seq ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
       END AS best_so_far
FROM programs p
LEFT JOIN search s ON s.program_id = p.program_id
LEFT JOIN parent_best pb ON pb.child_id = p.program_id
ORDER BY p.seq;

CREATE TABLE lineage_v8 AS
SELECT l.*, c.seq AS child_seq, p.seq AS parent_seq
FROM lineage l
LEFT JOIN programs c ON c.program_id = l.child_id
LEFT JOIN programs p ON p.program_id = l.parent_id
ORDER BY c.seq, p.seq;

CREATE TABLE evaluations_v8 AS SELECT * FROM evaluations;

DROP TABLE programs;
DROP TABLE lineage;
DROP TABLE evaluations;
ALTER TABLE programs_v8 RENAME TO programs;
ALTER TABLE lineage_v8 RENAME TO lineage;
ALTER TABLE evaluations_v8 RENAME TO evaluations;

ALTER TABLE programs ALTER COLUMN program_id SET NOT NULL;
ALTER TABLE programs ALTER COLUMN run_id SET NOT NULL;
ALTER TABLE programs ALTER COLUMN island SET NOT NULL;
ALTER TABLE programs ALTER COLUMN generation SET NOT NULL;
ALTER TABLE programs ALTER COLUMN parent_ids SET NOT NULL;
ALTER TABLE programs ALTER COLUMN code SET NOT NULL;
ALTER TABLE programs ALTER COLUMN code_hash SET NOT NULL;
ALTER TABLE programs ALTER COLUMN mutator SET NOT NULL;
ALTER TABLE programs ALTER COLUMN created_at SET NOT NULL;
ALTER TABLE programs ALTER COLUMN seq SET NOT NULL;
ALTER TABLE programs ALTER COLUMN id_hash SET NOT NULL;
ALTER TABLE lineage ALTER COLUMN child_id SET NOT NULL;
ALTER TABLE lineage ALTER COLUMN parent_id SET NOT NULL;
ALTER TABLE lineage ALTER COLUMN run_id SET NOT NULL;
ALTER TABLE evaluations ALTER COLUMN program_id SET NOT NULL;
ALTER TABLE evaluations ALTER COLUMN run_id SET NOT NULL;
ALTER TABLE evaluations ALTER COLUMN split SET NOT NULL;
ALTER TABLE evaluations ALTER COLUMN status SET NOT NULL;
ALTER TABLE evaluations ALTER COLUMN created_at SET NOT NULL;

-- mutator_success = these totals (every program up to mutator_counts_seq) plus the
-- programs committed since; the writer folds the tail in every few thousand programs.
CREATE TABLE mutator_counts (
    run_id       VARCHAR NOT NULL,
    mutator      VARCHAR NOT NULL,
    attempts     BIGINT NOT NULL,
    ok           BIGINT NOT NULL,
    improvements BIGINT NOT NULL
);
CREATE TABLE mutator_counts_seq (seq BIGINT NOT NULL);
INSERT INTO mutator_counts_seq VALUES (0);

-- Per mutation operator: attempts (search evaluations of its children; the seed and
-- baselines are no attempts), how many evaluated OK, and improvements: OK children
-- scoring above the best OK search score their parents had when the child was
-- recorded (a child without an OK parent improves on nothing, so its OK score counts,
-- as in the run loop's own tally).
CREATE OR REPLACE VIEW mutator_success AS
WITH tail AS (
    SELECT run_id, mutator, count(*) AS attempts,
           count(*) FILTER (WHERE search_status = 'OK') AS ok,
           count(*) FILTER (WHERE search_status = 'OK' AND (parent_score IS NULL OR search_score > parent_score))
               AS improvements
    FROM programs
    WHERE seq > (SELECT coalesce(max(seq), 0) FROM mutator_counts_seq)
      AND search_status IS NOT NULL AND mutator <> 'seed' AND mutator NOT LIKE 'baseline:%'
    GROUP BY run_id, mutator
), total AS (
    SELECT run_id, mutator, attempts, ok, improvements FROM mutator_counts
    UNION ALL
    SELECT run_id, mutator, attempts, ok, improvements FROM tail
)
SELECT run_id, mutator, sum(attempts)::BIGINT AS attempts, sum(ok)::BIGINT AS ok,
       sum(improvements)::BIGINT AS improvements, round(sum(improvements) / sum(attempts), 4) AS success_rate
FROM total GROUP BY run_id, mutator;

-- The programs that held their island's best search score when they were committed
-- (each new best, ties with it included), in commit order: the best-so-far curve of
-- every island as steps. Every program's running best is programs.best_so_far.
CREATE OR REPLACE VIEW best_per_island AS
SELECT run_id, island, seq, program_id, created_at, search_score AS score, best_so_far
FROM programs
WHERE search_status = 'OK' AND island >= 0 AND search_score = best_so_far;

-- Every program with its search and held-out score side by side.
CREATE OR REPLACE VIEW program_scores AS
SELECT p.run_id, p.program_id, p.island, p.generation, p.mutator, p.seq,
       p.search_status, p.search_score,
       h.status AS heldout_status, h.score AS heldout_score
FROM programs p
LEFT JOIN evaluations h ON h.program_id = p.program_id AND h.split = 'heldout';

-- lineage_of('<program_id>'): the program (depth 0) and all its ancestors back to the
-- seed, each once, at its shortest distance (a parent is at depth 1). The walk follows
-- commit numbers, which lie in commit order, so each step reads one stretch of lineage.
CREATE OR REPLACE MACRO lineage_of(pid) AS TABLE
WITH RECURSIVE up(seq, depth) AS (
    SELECT seq, 0 FROM programs WHERE id_hash = ('0x' || md5(pid)[1:16])::UBIGINT AND program_id = pid
    UNION
    SELECT l.parent_seq, up.depth + 1 FROM lineage l JOIN up ON l.child_seq = up.seq WHERE l.parent_seq IS NOT NULL
), nearest AS (
    SELECT seq, min(depth) AS depth FROM up GROUP BY seq
)
SELECT n.depth, p.program_id, p.island, p.generation, p.mutator, p.search_score AS score
FROM nearest n JOIN programs p ON p.seq = n.seq
ORDER BY n.depth, p.seq;
