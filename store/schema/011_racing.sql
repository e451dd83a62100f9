-- Version 11: racing (evaluator.racing). A search evaluation stopped early as clearly
-- worse than its parent is stored with status 'RACED': no score, the reason in `error`,
-- and in `metrics` the instances it saw, the test's p-value and the mean of what it saw.
-- Every view and query that ranks programs reads status = 'OK' only, so a raced row is
-- never a best, an elite or a held-out candidate; these two views show them.

-- Each raced evaluation with what its race saw.
CREATE OR REPLACE VIEW raced AS
SELECT p.run_id, p.program_id, p.island, p.generation, p.mutator, p.parent_ids[1] AS parent_id,
       CAST(json_extract(e.metrics, '$.instances_seen') AS INTEGER) AS instances_seen,
       CAST(json_extract(e.metrics, '$.instances') AS INTEGER) AS instances,
       CAST(json_extract(e.metrics, '$.p_value') AS DOUBLE) AS p_value,
       CAST(json_extract(e.metrics, '$.partial_mean') AS DOUBLE) AS partial_mean,
       e.error AS reason, e.duration_s
FROM programs p JOIN evaluations e ON e.program_id = p.program_id AND e.split = 'search'
WHERE e.status = 'RACED';

-- Per run: search evaluations run in full against those stopped early, and the time each took.
CREATE OR REPLACE VIEW racing_summary AS
SELECT run_id,
       count(*) FILTER (WHERE status = 'OK') AS full_ok,
       count(*) FILTER (WHERE status = 'RACED') AS raced,
       count(*) FILTER (WHERE status NOT IN ('OK', 'RACED')) AS failed,
       round(sum(duration_s) FILTER (WHERE status = 'OK'), 1) AS full_ok_s,
       round(sum(duration_s) FILTER (WHERE status = 'RACED'), 1) AS raced_s
FROM evaluations WHERE split = 'search' GROUP BY run_id;
