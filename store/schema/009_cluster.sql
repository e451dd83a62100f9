-- Version 9: where each evaluation ran. On a cluster every evaluator actor reports the Ray
-- node it lives on (its hex id and IP address), so the archive shows how the work spread over
-- the nodes and which node a failure happened on. NULL for rows written before this version
-- and for evaluations that never reached an evaluator (INVALID LLM replies, given-up jobs).
ALTER TABLE evaluations ADD COLUMN node_id VARCHAR;
ALTER TABLE evaluations ADD COLUMN node_ip VARCHAR;
