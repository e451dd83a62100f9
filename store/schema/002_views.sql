-- Analytics views, version 2.

-- Best-so-far search score per island, in the order programs were committed.
CREATE OR REPLACE VIEW best_per_island AS
SELECT p.run_id, p.island, p.seq, p.program_id, p.created_at, e.score,
       max(e.score) OVER (PARTITION BY p.run_id, p.island ORDER BY p.seq
                          ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS best_so_far
FROM programs p JOIN evaluations e ON e.program_id = p.program_id AND e.split = 'search'
WHERE e.status = 'OK' AND p.island >= 0;

-- Per mutation operator: attempts (search evaluations of its children; the seed and
-- baselines are no attempts), how many evaluated OK, and improvements: OK children
-- scoring above their best parent's OK search score (a child without an OK parent
-- improves on nothing, so its OK score counts, as in the run loop's own tally).
CREATE OR REPLACE VIEW mutator_success AS
WITH parent_best AS (
    SELECT l.child_id, max(pe.score) AS score
    FROM lineage l
    JOIN evaluations pe ON pe.program_id = l.parent_id AND pe.split = 'search' AND pe.status = 'OK'
    GROUP BY l.child_id
), scored AS (
    SELECT p.run_id, p.mutator, e.status, e.score, pb.score AS parent_score
    FROM programs p
    JOIN evaluations e ON e.program_id = p.program_id AND e.split = 'search'
    LEFT JOIN parent_best pb ON pb.child_id = p.program_id
    WHERE p.mutator <> 'seed' AND p.mutator NOT LIKE 'baseline:%'
)
SELECT run_id, mutator, count(*) AS attempts,
       count(*) FILTER (WHERE status = 'OK') AS ok,
       count(*) FILTER (WHERE status = 'OK' AND (parent_score IS NULL OR score > parent_score)) AS improvements,
       round(improvements / attempts, 4) AS success_rate
FROM scored GROUP BY run_id, mutator;

-- Every program with its search and held-out score side by side.
CREATE OR REPLACE VIEW program_scores AS
SELECT p.run_id, p.program_id, p.island, p.generation, p.mutator, p.seq,
       s.status AS search_status, s.score AS search_score,
       h.status AS heldout_status, h.score AS heldout_score
FROM programs p
LEFT JOIN evaluations s ON s.program_id = p.program_id AND s.split = 'search'
LEFT JOIN evaluations h ON h.program_id = p.program_id AND h.split = 'heldout';

-- lineage_of('<program_id>'): the program (depth 0) and all its ancestors back to the
-- seed, each once, at its shortest distance (a parent is at depth 1).
CREATE OR REPLACE MACRO lineage_of(pid) AS TABLE
WITH RECURSIVE up(program_id, depth) AS (
    SELECT pid, 0
    UNION
    SELECT l.parent_id, up.depth + 1 FROM lineage l JOIN up ON l.child_id = up.program_id
), nearest AS (
    SELECT program_id, min(depth) AS depth FROM up GROUP BY program_id
)
SELECT n.depth, p.program_id, p.island, p.generation, p.mutator, e.score
FROM nearest n JOIN programs p ON p.program_id = n.program_id
LEFT JOIN evaluations e ON e.program_id = p.program_id AND e.split = 'search'
ORDER BY n.depth, p.seq;
