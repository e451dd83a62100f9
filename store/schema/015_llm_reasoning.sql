-- Version 15: the reasoning a server sends apart from a reply's answer (vLLM's and SGLang's
-- reasoning parsers: `reasoning_content`; some servers: `reasoning`), cut to the same length as
-- the completion; NULL where the server sent none (the thinking written inside the reply, in
-- <think>, stays in `completion`). Why a reasoning model's reply gave no child is read there.
ALTER TABLE llm_calls ADD COLUMN reasoning VARCHAR;
