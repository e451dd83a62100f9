-- Memory across runs, version 7: what this run took from the library and gave back.
-- The library is its own file (store/library_schema/); here the run's own record of it,
-- read from its events, so it is committed with the run's results.

-- Never written: skills live in the library now (table skills there).
DROP TABLE IF EXISTS skills;

-- Elites of earlier runs this run evaluated first (memory.warm_start).
CREATE OR REPLACE VIEW warm_starts AS
SELECT run_id, data->>'program_id' AS program_id, data->>'source_run' AS source_run,
       data->>'source_program_id' AS source_program_id,
       CAST(data->>'source_search_score' AS DOUBLE) AS source_search_score,
       data->>'status' AS status, CAST(data->>'search_score' AS DOUBLE) AS search_score
FROM events WHERE kind = 'warm-start';

-- Children made by replaying a library skill; success: OK and above the parent's search score.
CREATE OR REPLACE VIEW skill_uses AS
SELECT run_id, data->>'program_id' AS program_id, data->>'skill_id' AS skill_id,
       data->>'parent_id' AS parent_id, data->>'status' AS status,
       CAST(data->>'success' AS BOOLEAN) AS success, CAST(data->>'gain' AS DOUBLE) AS gain
FROM events WHERE kind = 'skill-use';

-- Skills this run learned: a child ahead of its parent on the search split and on the
-- validation split; the edit and both gains.
CREATE OR REPLACE VIEW skills_learned AS
SELECT run_id, data->>'skill_id' AS skill_id, data->>'title' AS title,
       data->>'parent_id' AS parent_id, data->>'child_id' AS child_id, data->>'operator' AS operator,
       CAST(data->>'search_gain' AS DOUBLE) AS search_gain,
       CAST(data->>'validation_gain' AS DOUBLE) AS validation_gain, data->'edit' AS edit
FROM events WHERE kind = 'skill-learned';
