"""The control domain's held-out table: the evolved best beside every baseline."""
from __future__ import annotations

from store.records import EvalResult, Status

COLUMNS = ["policy", "mean return ± SE", "min", "solved", "crashes", "timeouts", "mean length"]


def heldout_table(config, results: dict[str, EvalResult], reference: dict):
    rows = [_row(label, results[label]) for label in _ordered(results)]
    return list(COLUMNS), rows, _notes(config, results, reference)


def _ordered(results: dict) -> list[str]:
    return sorted(results, key=lambda label: (label != "evolved best", label))


def _row(label: str, result: EvalResult) -> tuple[str, ...]:
    if result.status != Status.OK:
        return (label, f"{result.status.value}: {result.reason()[:70]}",
                "", "", "", "", "")
    m = result.metrics
    se = m.get("se")
    mean = f"{m['mean_return']:.1f}" + ("" if se is None else f" ± {se:.1f}" if se >= 0.1 else f" ± {se:.2f}")
    crashes = str(m["crashes"]) if m.get("env") == "LunarLander-v3" else "n/a"
    timeouts = "n/a" if m.get("env") == "Pendulum-v1" else str(m["timeouts"])  # it never terminates
    solved = "n/a" if m.get("solved_share") is None else f"{100 * m['solved_share']:.0f}%"
    return (label, mean, f"{m['min_return']:.1f}", solved, crashes,
            timeouts, f"{m['mean_length']:.0f}")


def _notes(config, results: dict, reference: dict) -> list[str]:
    threshold = reference.get("solved_threshold")
    notes = [
        f"{config.env}: {reference.get('episodes', config.heldout_seeds)} held-out episodes (reset seeds drawn "
        f"from the run's held-out secret), step limit {reference.get('max_steps', 'default')}. Every program's "
        f"PARAMS were first re-tuned on the {config.search_seeds} search episodes (seeds of the search secret): "
        f"{config.tune_trials} optuna trials "
        "(defaults, Sobol, then elite local search), then measured once on the held-out seeds.",
        f"linear (CMA-ES): {config.linear_trials} CMA-ES trials on the search seeds (the run's evaluation "
        "budget when linear_trials = run.max_evals), weights in "
        f"[-{reference.get('linear_bound', '?')}, {reference.get('linear_bound', '?')}].",
        "mean return ± standard error over episodes; min: the worst episode; solved: share of episodes "
        + (f"with return >= {threshold:g}" if threshold is not None else "n/a (the environment registers no "
           "reward threshold)") + ("; crashes: episodes ended by the -100 game-over" if config.env ==
                                          "LunarLander-v3" else "") + "; timeouts: episodes cut by the step limit.",
    ]
    if config.env == "LunarLander-v3":
        notes.append("gymnasium heuristic: gymnasium.envs.box2d.lunar_lander.heuristic, vectorized "
                     "(known figure about 233 on the public seeds 1000-1099).")
    trials = reference.get("trials")
    if trials and "evolved best" in results:
        count = trials.get("count")
        notes.append(f"evolved best: the best of {count if count is not None else '?'} programs by search score "
                     "(selection on the search seeds only)."
                     + (f" Their budgets differ: the search evaluated {count} programs, the linear baseline had "
                        f"{config.linear_trials} CMA-ES trials (domain.options.linear_trials is meant to equal "
                        "run.max_evals)." if count and abs(count - config.linear_trials) > 0.1 * config.linear_trials
                        else ""))
    return notes
