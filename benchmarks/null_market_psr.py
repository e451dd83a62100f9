"""Does the null market stay null? The evolved best's held-out PSR over many market secrets.

    unshare -n sh -c 'ip link set lo up && python3 benchmarks/null_market_psr.py'
    ... --markets 40 --max-evals 300      (the shipped budget; hours on 2 cores)
    ... --set domain.options.max_folds=4  (the 4 latest folds only: about 3x faster per evaluation)

For each market it runs the real search (`controller.loop.Search`: Ray actors, the
sandbox, a DuckDB archive in a temporary run directory) on `configs/trading_null.toml`
(zero edge, zero drift) with the market drawn from that run's secrets, then scores
the evolved best (the best search score) on the held-out split, as `atoll report`
does, and the buy & hold and SMA 50/200 baselines beside it. Under the null no
program has a positive true Sharpe, so the held-out PSR (the probability that the
true Sharpe is above 0, as the held-out table prints it) of a program chosen on the
search period is about uniform on [0, 1] (below it, for programs that pay costs).
It prints every market's figures, then the distribution and a Kolmogorov-Smirnov
test against uniform.

Markets come from replay seeds `--first-seed` + k (so the markets repeat; the
searches' paths also depend on the order in which results arrive), or from the OS
with `--drawn`. Small budgets by default, sized for a shared 2-core
machine; the held-out Sharpe of one program has a standard error of about 0.5.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import ray  # noqa: E402
from scipy import stats  # noqa: E402

from controller.actors import connect  # noqa: E402
from controller.config import load_config  # noqa: E402
from controller.loop import Search  # noqa: E402
from evaluators.domains.trading import stats as ts  # noqa: E402
from evaluators.secrets import RunSecrets  # noqa: E402
from store.duckdb_archive import DuckDBArchive  # noqa: E402

BASELINES = ("buy & hold", "SMA 50/200")


def psr(metrics: dict) -> float:
    """The held-out table's PSR: P(true Sharpe > 0) from the held-out book's returns (Mertens SE)."""
    return ts.probabilistic_sharpe(metrics["sharpe_per_bar"], 0.0, metrics["n_returns"], metrics["skewness"],
                                   metrics["kurtosis"])


def one_market(args, k: int, root: Path) -> dict:
    """Search one market, then score the evolved best and the baselines on its holdout."""
    overrides = [f"run.max_evals={args.max_evals}", f"run.max_wall_s={args.max_wall_s}", f"run.seed={k}",
                 "controller.heldout_on_new_best=false", f"evaluator.actors={args.actors}",
                 f"evaluator.sandbox.wall_s={args.wall_s}", *args.set]
    config, text = load_config(args.config, overrides)
    secrets = RunSecrets.draw() if args.drawn else RunSecrets.fixed(args.first_seed + k)
    run_dir = root / f"market-{k}"
    run_dir.mkdir()
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:
        run_id = f"null-{k}"
        archive.create_run(run_id, config.model_dump(mode="json"), text)
        archive.save_secrets(run_id, secrets.to_record())
        search = Search(config, archive, run_id, run_dir, hide=(str(run_dir),), secrets=secrets)
        search.run()
        best = archive.best_program(run_id)
        evaluated = archive.count_evaluations(run_id)
    programs = {"evolved best": (best["program_id"], best["code"])}
    codes = search.domain.baselines()
    programs.update({name: (f"baseline-{name}", codes[name]) for name in BASELINES})
    refs = {label: search.evaluators[i % len(search.evaluators)].evaluate.remote(pid, code, "heldout")
            for i, (label, (pid, code)) in enumerate(programs.items())}
    held = {label: ray.get(ref) for label, ref in refs.items()}
    for actor in search.evaluators + search.mutators:
        ray.kill(actor)
    out = {"evals": evaluated, "search": best["score"]}
    for label, result in held.items():
        ok = result.status.value == "OK"
        out[label] = (result.metrics["sharpe"], psr(result.metrics)) if ok else (float("nan"), float("nan"))
        if not ok:  # counted out of the distribution, and said so
            print(f"  market {k}: {label} {result.status.value}: {(result.error or '').strip()[-200:]}", flush=True)
    return out


def summary(name: str, values: np.ndarray) -> str:
    values = values[np.isfinite(values)]  # a failed held-out evaluation (printed above) is left out
    ks = stats.kstest(values, "uniform")
    return (f"{name:14s} n={len(values):3d}  mean {values.mean():.3f}  median {np.median(values):.3f}  "
            f"share > 0.95: {np.mean(values > 0.95):.3f}  share < 0.05: {np.mean(values < 0.05):.3f}  "
            f"KS vs uniform D={ks.statistic:.3f} p={ks.pvalue:.3f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/trading_null.toml", help="a trading config with a null market")
    parser.add_argument("--markets", type=int, default=12, help="markets (runs), each from its own secrets")
    parser.add_argument("--max-evals", type=int, default=40, help="search evaluations per market")
    parser.add_argument("--max-wall-s", type=float, default=900, help="search wall-clock limit per market")
    parser.add_argument("--actors", type=int, default=2, help="evaluator actors")
    parser.add_argument("--wall-s", type=float, default=600, help="sandbox wall-clock limit per evaluation (a "
                        "held-out evaluation on a loaded machine can outlast the config's 120 s)")
    parser.add_argument("--first-seed", type=int, default=1000, help="replay seed of the first market")
    parser.add_argument("--drawn", action="store_true", help="draw every market's secrets from the OS instead")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override the config, e.g. domain.options.max_folds=4 (fewer folds: faster)")
    args = parser.parse_args(argv)
    connect(None, num_cpus=args.actors)
    rows, start = [], time.monotonic()
    print(f"{'market':>6s} {'evals':>5s} {'WF SR':>6s} {'best SR':>8s} {'best PSR':>8s} "
          + " ".join(f"{b + ' PSR':>15s}" for b in BASELINES), flush=True)
    with tempfile.TemporaryDirectory(prefix="null-market-") as tmp:
        for k in range(args.markets):
            row = one_market(args, k, Path(tmp))
            rows.append(row)
            seed = "drawn" if args.drawn else args.first_seed + k
            print(f"{seed!s:>6s} {row['evals']:5d} {row['search']:6.2f} {row['evolved best'][0]:8.2f} "
                  f"{row['evolved best'][1]:8.3f} " + " ".join(f"{row[b][1]:15.3f}" for b in BASELINES), flush=True)
    sharpes = np.array([r["evolved best"][0] for r in rows])
    print(f"\n{args.markets} null markets ({args.config}{''.join(' --set ' + s for s in args.set)}, "
          f"{args.max_evals} evaluations each), {time.monotonic() - start:.0f} s")
    print(f"evolved best's held-out Sharpe: mean {np.nanmean(sharpes):+.3f} ± {np.nanstd(sharpes, ddof=1) / np.sqrt(len(sharpes)):.3f} "
          f"(sd {np.nanstd(sharpes, ddof=1):.3f}; one program's SE is about 0.5)")
    for label in ("evolved best",) + BASELINES:
        print(summary(label, np.array([r[label][1] for r in rows])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
