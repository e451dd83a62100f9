-- Version 5: accounting of LLM mutation calls, their prompts stored once per shared part.
ALTER TABLE llm_calls ADD COLUMN island INTEGER;
ALTER TABLE llm_calls ADD COLUMN parent_id VARCHAR;
ALTER TABLE llm_calls ADD COLUMN kind VARCHAR;             -- 'edit' or 'diagnosis'
ALTER TABLE llm_calls ADD COLUMN status VARCHAR;           -- ok, timeout, http_error, unparseable,
                                                           -- did_not_apply, invalid_program, duplicate
ALTER TABLE llm_calls ADD COLUMN error VARCHAR;
ALTER TABLE llm_calls ADD COLUMN cost DOUBLE;              -- money at the model's configured prices
ALTER TABLE llm_calls ADD COLUMN gpu_s DOUBLE;             -- latency times the model's GPUs
ALTER TABLE llm_calls ADD COLUMN attempts INTEGER;         -- 1 + retries
ALTER TABLE llm_calls ADD COLUMN prompt_parts VARCHAR[];   -- llm_prompt_parts ids, in order
ALTER TABLE llm_calls ADD COLUMN completion_truncated BOOLEAN;
ALTER TABLE llm_calls ADD COLUMN tokens_estimated BOOLEAN; -- the server sent no usage: characters / 4

CREATE TABLE llm_prompt_parts (
    part_id VARCHAR PRIMARY KEY,
    text    VARCHAR NOT NULL
);

-- Each call's whole prompt, reassembled from its parts.
CREATE OR REPLACE VIEW llm_prompts AS
WITH parts AS (
    SELECT call_id, unnest(prompt_parts) AS part_id, generate_subscripts(prompt_parts, 1) AS i FROM llm_calls
)
SELECT parts.call_id, string_agg(p.text, '' ORDER BY parts.i) AS prompt
FROM parts JOIN llm_prompt_parts p USING (part_id) GROUP BY parts.call_id;

-- Per run and model: calls by outcome, tokens, cost, and what its children did
-- (evaluated OK, improvements over their parent: the mutator_success figures of 'llm:MODEL').
CREATE OR REPLACE VIEW llm_usage AS
SELECT c.run_id, c.model, count(*) AS calls,
       count(*) FILTER (WHERE c.status = 'ok') AS ok,
       count(*) FILTER (WHERE c.status = 'timeout') AS timeout,
       count(*) FILTER (WHERE c.status = 'http_error') AS http_error,
       count(*) FILTER (WHERE c.status = 'unparseable') AS unparseable,
       count(*) FILTER (WHERE c.status = 'did_not_apply') AS did_not_apply,
       count(*) FILTER (WHERE c.status = 'invalid_program') AS invalid_program,
       count(*) FILTER (WHERE c.status = 'duplicate') AS duplicate,
       coalesce(sum(c.tokens_in), 0) AS tokens_in, coalesce(sum(c.tokens_out), 0) AS tokens_out,
       round(coalesce(sum(c.cost), 0), 6) AS cost, round(sum(c.latency_s), 1) AS latency_s,
       coalesce(max(m.ok), 0) AS children_ok, coalesce(max(m.improvements), 0) AS improvements
FROM llm_calls c
LEFT JOIN mutator_success m ON m.run_id = c.run_id AND m.mutator = 'llm:' || c.model
GROUP BY c.run_id, c.model;
