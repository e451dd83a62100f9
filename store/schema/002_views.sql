-- Analytics views, version 2.

-- Best-so-far search score per island, in the order programs were committed.
CREATE VIEW best_per_island AS
SELECT p.run_id, p.island, p.seq, p.program_id, p.created_at, e.score,
       max(e.score) OVER (PARTITION BY p.run_id, p.island ORDER BY p.seq
                          ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS best_so_far
FROM programs p JOIN evaluations e ON e.program_id = p.program_id AND e.split = 'search'
WHERE e.status = 'OK' AND p.island >= 0;

-- Per mutation operator: attempts, successes and improvements over the best parent.
CREATE VIEW mutator_success AS
WITH scored AS (
    SELECT p.run_id, p.mutator, e.status, e.score,
           (SELECT max(pe.score) FROM evaluations pe
            WHERE pe.program_id IN (SELECT unnest(p.parent_ids)) AND pe.split = 'search') AS parent_score
    FROM programs p JOIN evaluations e ON e.program_id = p.program_id AND e.split = 'search'
    WHERE p.mutator <> 'seed' AND p.mutator NOT LIKE 'baseline:%'
)
SELECT run_id, mutator, count(*) AS attempts,
       count(*) FILTER (WHERE status = 'OK') AS ok,
       count(*) FILTER (WHERE status = 'OK' AND score > parent_score) AS improvements,
       round(count(*) FILTER (WHERE status = 'OK' AND score > parent_score) / count(*), 4) AS success_rate
FROM scored GROUP BY run_id, mutator;

-- Every program with its search and held-out score side by side.
CREATE VIEW program_scores AS
SELECT p.run_id, p.program_id, p.island, p.generation, p.mutator, p.seq,
       s.status AS search_status, s.score AS search_score,
       h.status AS heldout_status, h.score AS heldout_score
FROM programs p
LEFT JOIN evaluations s ON s.program_id = p.program_id AND s.split = 'search'
LEFT JOIN evaluations h ON h.program_id = p.program_id AND h.split = 'heldout';

-- lineage_of('<program_id>'): the program and all its ancestors back to the seed.
CREATE MACRO lineage_of(pid) AS TABLE
WITH RECURSIVE up(program_id, depth) AS (
    SELECT pid, 0
    UNION
    SELECT l.parent_id, up.depth + 1 FROM lineage l JOIN up ON l.child_id = up.program_id
)
SELECT up.depth, p.program_id, p.island, p.generation, p.mutator, e.score
FROM up JOIN programs p ON p.program_id = up.program_id
LEFT JOIN evaluations e ON e.program_id = p.program_id AND e.split = 'search'
ORDER BY up.depth;
