"""What the LLM models did in a run: calls by outcome, tokens, cost, and what their children
contributed beside the embedded mutator's; with the duplicates dropped and the most common
reasons children failed. Printed at the end of a run and by `atoll status`."""
from __future__ import annotations

from rich.table import Table

CALLS_SQL = ("SELECT model, calls, ok, timeout, http_error, unparseable, did_not_apply, invalid_program, duplicate, "
             "tokens_in, tokens_out, cost, round(latency_s / calls, 2) AS s_per_call FROM llm_usage "
             "WHERE run_id = '{run}' ORDER BY model")

SOURCES_SQL = """
WITH m AS (
    SELECT CASE WHEN mutator LIKE 'llm:%' THEN mutator ELSE split_part(mutator, ':', 1) END AS source,
           attempts, ok, improvements
    FROM mutator_success WHERE run_id = '{run}'
), best AS (
    SELECT CASE WHEN p.mutator LIKE 'llm:%' THEN p.mutator ELSE split_part(p.mutator, ':', 1) END AS source,
           max(e.score) AS best_score
    FROM programs p JOIN evaluations e ON e.program_id = p.program_id AND e.split = 'search' AND e.status = 'OK'
    WHERE p.run_id = '{run}' AND p.mutator <> 'seed' AND p.mutator NOT LIKE 'baseline:%' GROUP BY 1
)
SELECT m.source, sum(attempts) AS candidates, sum(ok) AS evaluated_ok, sum(improvements) AS improvements,
       round(sum(improvements) / sum(attempts), 4) AS improvement_rate, max(best.best_score) AS best_score
FROM m LEFT JOIN best USING (source) GROUP BY m.source ORDER BY m.source
"""

DEDUP_SQL = ("SELECT coalesce(json_extract_string(data, '$.by'), 'exact') AS rule, count(*) AS dropped "
             "FROM events WHERE run_id = '{run}' AND kind = 'duplicate' GROUP BY 1 ORDER BY 1")

# The last line of a failure says what went wrong (a traceback's exception, a limit, a bad action):
# the most common ones, so a run whose children mostly fail says why without a query. Lines that
# differ only in their numbers ("orders must be >= 0, got -46.9") count as one, shown by one of them.
FAILURES_SQL = """
WITH f AS (
    SELECT status, left(string_split(rtrim(coalesce(error, ''), chr(10) || ' '), chr(10))[-1], 160) AS line
    FROM evaluations WHERE run_id = '{run}' AND split = 'search' AND status IN ('FAILED', 'TIMEOUT', 'INVALID')
)
SELECT status, count(*) AS evaluations, min(line) AS reason FROM f
GROUP BY status, regexp_replace(line, '[-+]?[0-9]+([.][0-9]+)?([eE][-+]?[0-9]+)?', '#', 'g')
ORDER BY evaluations DESC, status, reason LIMIT 6
"""


def queries(run_id: str) -> list[tuple[str, str]]:
    """(title, SQL) of the summary's tables for `run_id` (run ids are Atoll's own, never user text)."""
    run = run_id.replace("'", "''")
    return [("LLM calls by model", CALLS_SQL.format(run=run)),
            ("children by source (search split)", SOURCES_SQL.format(run=run)),
            ("duplicates dropped before evaluation", DEDUP_SQL.format(run=run)),
            ("failed search evaluations, the most common reasons",
             FAILURES_SQL.format(run=run))]


def print_summary(console, fetch, run_id: str) -> None:
    """Print the tables that have rows; `fetch(sql)` returns (columns, rows)."""
    for title, sql in queries(run_id):
        cols, rows = fetch(sql)
        if not rows:
            continue
        table = Table(*cols, title=title)
        for row in rows:
            table.add_row(*("" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v) for v in row))
        console.print(table)


def archive_fetch(archive):
    """A `fetch` over the driver's own archive connection."""
    def fetch(sql: str):
        cursor = archive.con.execute(sql)
        return [d[0] for d in cursor.description], cursor.fetchall()
    return fetch
