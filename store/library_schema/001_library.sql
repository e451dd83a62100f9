-- Atoll library, version 1: what runs of a domain keep across runs (one file, many runs).
-- Runs write here in short transactions; each run's archive stays its own file.

-- Every run the library knows: where its archive is, what it searched, how it ended.
CREATE TABLE runs (
    run_id            VARCHAR PRIMARY KEY,
    run_dir           VARCHAR NOT NULL,     -- absolute path of the run directory
    domain            VARCHAR NOT NULL,
    fingerprint       VARCHAR NOT NULL,     -- hash of the domain and its validated options
    config            JSON NOT NULL,
    status            VARCHAR NOT NULL,
    evaluations       INTEGER NOT NULL,     -- search evaluations committed
    best_search_score DOUBLE,
    warm_start        JSON,                 -- what the run started from (runs, elites, skills)
    started_at        TIMESTAMP NOT NULL,
    updated_at        TIMESTAMP NOT NULL
);

-- The best programs of each run, by search score only (the held-out split never chooses).
CREATE TABLE elites (
    run_id       VARCHAR NOT NULL,
    program_id   VARCHAR NOT NULL,
    domain       VARCHAR NOT NULL,
    fingerprint  VARCHAR NOT NULL,
    rank         INTEGER NOT NULL,          -- 1 = the run's best
    search_score DOUBLE NOT NULL,
    code         VARCHAR NOT NULL,
    code_hash    VARCHAR NOT NULL,
    PRIMARY KEY (run_id, program_id)
);

-- Edits that beat their parent on the search split and held on the validation split.
-- skill_id is a hash of the domain and the edit: the same edit learned twice is one skill.
CREATE TABLE skills (
    skill_id        VARCHAR PRIMARY KEY,
    domain          VARCHAR NOT NULL,
    fingerprint     VARCHAR NOT NULL,       -- of the run that learned it first
    title           VARCHAR NOT NULL,
    applies_when    VARCHAR NOT NULL,
    edit            JSON NOT NULL,          -- workers.skill_edits.SkillEdit, replayable
    search_gain     DOUBLE NOT NULL,        -- child minus parent, first time learned
    validation_gain DOUBLE NOT NULL,
    parent_code     VARCHAR NOT NULL,
    child_code      VARCHAR NOT NULL,
    abstraction     VARCHAR,                -- an LLM's analysis, strategy and abstraction, if any
    run_id          VARCHAR NOT NULL,
    created_at      TIMESTAMP NOT NULL,
    retired_at      TIMESTAMP               -- set by `atoll skills --retire ID`; never retrieved again
);

-- Every time a run learned a skill (the first time included).
CREATE TABLE skill_sightings (
    skill_id        VARCHAR NOT NULL,
    run_id          VARCHAR NOT NULL,
    parent_id       VARCHAR NOT NULL,
    child_id        VARCHAR NOT NULL,
    search_gain     DOUBLE NOT NULL,
    validation_gain DOUBLE NOT NULL,
    created_at      TIMESTAMP NOT NULL,
    PRIMARY KEY (run_id, child_id)
);

-- Every child made by replaying a skill; success: it evaluated OK above its parent's search score.
CREATE TABLE skill_uses (
    run_id      VARCHAR NOT NULL,
    program_id  VARCHAR NOT NULL,
    skill_id    VARCHAR NOT NULL,
    parent_id   VARCHAR NOT NULL,
    status      VARCHAR NOT NULL,
    success     BOOLEAN NOT NULL,
    gain        DOUBLE,                     -- child minus parent search score, when both scored
    created_at  TIMESTAMP NOT NULL,
    PRIMARY KEY (run_id, program_id)
);

-- The instruction part of LLM prompts: a small population per domain, carried across runs.
CREATE TABLE prompt_variants (
    variant_id  VARCHAR PRIMARY KEY,
    domain      VARCHAR NOT NULL,
    text        VARCHAR NOT NULL,
    parent_id   VARCHAR,                    -- the variant it was rewritten from
    origin      VARCHAR NOT NULL,           -- 'default', 'rewrite:<model>', 'user'
    created_at  TIMESTAMP NOT NULL,
    retired_at  TIMESTAMP
);

CREATE TABLE prompt_variant_uses (
    run_id      VARCHAR NOT NULL,
    program_id  VARCHAR NOT NULL,
    variant_id  VARCHAR NOT NULL,
    success     BOOLEAN NOT NULL,
    created_at  TIMESTAMP NOT NULL,
    PRIMARY KEY (run_id, program_id)
);

-- Efficacy: uses and successes over every run, and the posterior mean under a Beta(1, 1)
-- prior (workers.skills.efficacy), so an untried skill starts at 0.5.
CREATE VIEW skill_efficacy AS
SELECT s.skill_id, s.domain, s.title, s.applies_when, s.search_gain, s.validation_gain,
       count(u.program_id) AS uses, count(u.program_id) FILTER (WHERE u.success) AS successes,
       round((successes + 1.0) / (uses + 2.0), 4) AS efficacy,
       (SELECT count(*) FROM skill_sightings k WHERE k.skill_id = s.skill_id) AS times_learned,
       s.run_id AS learned_in, s.created_at, s.retired_at
FROM skills s LEFT JOIN skill_uses u ON u.skill_id = s.skill_id
GROUP BY ALL;

CREATE VIEW prompt_variant_success AS
SELECT v.variant_id, v.domain, v.origin, v.parent_id, v.text,
       count(u.program_id) AS uses, count(u.program_id) FILTER (WHERE u.success) AS successes,
       round((successes + 1.0) / (uses + 2.0), 4) AS success_rate, v.created_at, v.retired_at
FROM prompt_variants v LEFT JOIN prompt_variant_uses u ON u.variant_id = v.variant_id
GROUP BY ALL;
