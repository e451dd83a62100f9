"""The trading domain: data, the synthetic market, next-bar execution, costs, gates, DSR."""
import gzip
import math

import numpy as np
import pytest

from evaluators._base import CandidateError
from evaluators.check import Checker
from evaluators.sandbox.config import SandboxConfig
from evaluators.evaluator import Evaluator
from evaluators.params import read_params
from evaluators.registry import DomainConfig, get_domain
from evaluators.domains.trading.data import (SyntheticMarket, edge_feature, load_sp500, read_price_csv,
                                     skfolio_data_dir, synthetic_market)
from evaluators.domains.trading import stats as ts
from evaluators.secrets import RunSecrets
from store.records import Status

FIXED = RunSecrets.fixed(2024)  # where a test needs the same data every time

TINY = {"assets": ["SP500", "KO"], "tune_bars": 60, "test_bars": 40, "holdout_bars": 60, "max_folds": 2,
        "tune_trials": 3}
ONE_ASSET = dict(TINY, assets=["KO"])
BUY_AND_HOLD = "def policy(state, params):\n    return 1.0\n"
UP_CLOSE = ("import numpy as np\n\ndef policy(state, params):\n"
            "    c = state['close']\n    return (c[:, -1] > c[:, -2]).astype(float)\n")
CASH = "import numpy as np\n\ndef policy(state, params):\n    return np.zeros(len(state['close']))\n"
NAN = "import numpy as np\n\ndef policy(state, params):\n    return np.full(len(state['close']), np.nan)\n"


def in_process(code):
    """Run a trusted test program directly (the domain only ever sees a PolicyFn)."""
    namespace = {}
    exec(code, namespace)
    fn = namespace["policy"]
    return lambda batches: [fn(state, params) for state, params in batches]


def test_sp500_data_loads_from_the_package_and_is_deterministic():
    market = load_sp500(("SP500", "KO", "MSFT"))
    assert market.close.shape == (3, 8313) and np.all(market.close > 0)
    assert str(market.dates[0]) == "1990-01-02" and str(market.dates[-1]) == "2022-12-28"
    assert np.all(np.diff(market.dates.astype(np.int64)) > 0)
    assert market.close[0, 0] == 359.69 and market.close[1, 0] == 2.235  # the files' first rows
    names, dates, values = read_price_csv(skfolio_data_dir() / "sp500_dataset.csv.gz")
    again = read_price_csv(skfolio_data_dir() / "sp500_dataset.csv.gz")
    assert names == again[0] and np.array_equal(values, again[2]) and len(names) == 20
    assert np.array_equal(values[:, names.index("KO")], market.close[1])


def test_unknown_asset_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown assets"):
        load_sp500(("NOPE",))


def test_synthetic_market_is_deterministic_by_its_seeds_and_the_holdout_has_its_own():
    spec = SyntheticMarket(assets=3, bars=2000, edge=0.05)
    a = synthetic_market(spec, 5, 7, 300)
    b = synthetic_market(spec.model_copy(), 5, 7, 300)
    c = synthetic_market(spec, 6, 7, 300)
    other_tail = synthetic_market(spec, 5, 8, 300)
    assert np.array_equal(a.close, b.close) and not np.allclose(a.close, c.close)
    # the tail (the holdout) comes from its own seed: the bars before it do not change with it
    assert np.array_equal(a.close[:, :1700], other_tail.close[:, :1700])
    assert not np.allclose(a.close[:, 1700:], other_tail.close[:, 1700:])
    r = a.returns()[:, 1:]
    assert np.all(np.isfinite(a.close)) and np.all(a.close > 0)
    vol = np.abs(r[:, 1:]) > 0
    assert vol.all()
    # volatility clustering: absolute returns are autocorrelated
    absr = np.abs(r[0])
    assert np.corrcoef(absr[:-1], absr[1:])[0, 1] > 0.05


def _edge_t_stat(edge):
    """t-statistic of the planted feature at bar t against the return of bar t + 2 (next-bar fills)."""
    market = synthetic_market(SyntheticMarket(assets=4, bars=20000, edge=edge), 11, 12, 0)
    feature, r = edge_feature(market.close)[:, 30:-2], market.returns()[:, 32:]
    x, y = np.sign(feature).ravel(), (r / r.std(axis=1, keepdims=True)).ravel()
    return float(np.mean(x * y) / np.std(x * y) * math.sqrt(len(y)))


def test_planted_edge_is_detectable_and_the_null_market_has_none():
    assert _edge_t_stat(0.08) > 6
    assert abs(_edge_t_stat(0.0)) < 3


def test_through_the_protocol_momentum_earns_on_the_edge_market_only():
    mom = "import numpy as np\n\ndef policy(state, params):\n    c = state['close']\n    return np.sign(c[:, -1] - c[:, -21])\n"
    scores = {}
    for edge, drift in ((0.08, 0.05), (0.0, 0.0)):
        domain = get_domain("trading", market="synthetic", synthetic={"assets": 3, "edge": edge, "drift": drift},
                            secrets=FIXED)
        scores[edge] = domain.evaluate(in_process(mom), {}, "search").score
    assert scores[0.08] > 0.7 and abs(scores[0.0]) < 0.5


def test_each_split_of_the_synthetic_market_trades_its_own_draw_whichever_comes_first():
    """The validation draw has the search market's asset names; neither split may trade the other's prices."""
    options = dict(TINY, market="synthetic", synthetic={"assets": 2, "bars": 1000})
    scores = {}
    for order in (("search", "validation", "heldout"), ("validation", "heldout", "search")):
        domain = get_domain("trading", secrets=FIXED, **options)
        for split in order:
            scores[order[0], split] = domain.evaluate(in_process(BUY_AND_HOLD), {}, split).metrics["total_return"]
        held = domain.market.returns()[:, -60:] - np.eye(60)[0] * 5e-4  # the holdout's bars, one entry cost
        assert scores[order[0], "heldout"] == pytest.approx(np.prod(1 + held.mean(axis=0)) - 1, rel=1e-10)
    for split in ("search", "validation", "heldout"):
        assert scores["search", split] == scores["validation", split], split
    assert scores["search", "search"] != scores["search", "validation"]

ONE_MARKET = """from evaluators.domains.trading.domain import Trading


class OneMarket(Trading):
    \"\"\"Trading whose validation split trades the search market's prices.\"\"\"

    name = "one-market"

    def market_of(self, split):
        return super().market_of("search")
"""


def test_atoll_check_finds_splits_that_trade_one_market_though_the_tuner_is_seeded_per_split():
    """The seed tuned on each split's own sampler seed chose other PARAMS, so the splits' scores differed
    on the very same prices and the check passed; at its PARAMS' defaults the seed scores alike."""
    options = dict(TINY, market="synthetic", synthetic={"assets": 2, "bars": 1000})
    check = Checker(DomainConfig(source=ONE_MARKET, options=options), SandboxConfig(wall_s=60)).splits_differ()
    assert not check.passed and "scores the same on search and validation" in check.detail, check.detail

def test_every_row_of_a_call_sees_only_closes_up_to_one_common_bar():
    """Lockstep in calendar order: no row of a batch shows any other row's future."""
    domain = get_domain("trading", **TINY)
    market, lookback, seen = domain.market, domain.config.lookback, []
    code = domain.seed_program
    fn = in_process(code)

    def recorder(batches):
        state = batches[0][0]
        seen.append(state["close"].copy())
        return fn(batches)

    domain.evaluate(recorder, read_params(code), "search")
    first = domain.folds[0].tune.start - 2
    last_search_bar = len(market.dates) - domain.config.holdout_bars - 1
    assert first + len(seen) - 1 <= last_search_bar - 2  # the search never reaches the holdout
    for i, close in enumerate(seen):
        d = first + i
        expected = (market.close[:, d - lookback + 1:d + 1] / market.close[:, d:d + 1]).astype(np.float32)
        for row in close:
            assert any(np.array_equal(row, e) for e in expected), f"a row of call {i} is not at bar {d}"


def test_buy_and_hold_earns_the_price_ratio_minus_one_entry_cost():
    domain = get_domain("trading", **ONE_ASSET, cost_bps=10.0)
    out = domain.evaluate(in_process(BUY_AND_HOLD), {}, "heldout")
    p = load_sp500(("KO",)).close[0]
    a = len(p) - 60
    expected = (p[a] / p[a - 1] - 10e-4) * p[-1] / p[a] - 1.0
    assert out.metrics["total_return"] == pytest.approx(expected, rel=1e-10)
    assert out.metrics["trades"] == 1 and out.metrics["turnover_per_year"] == pytest.approx(252 / 60)


def test_next_bar_execution_long_only_after_up_closes():
    """Decided on the close of d, filled on the close of d + 1, so it earns the return of d + 2."""
    domain = get_domain("trading", **ONE_ASSET, cost_bps=5.0)
    out = domain.evaluate(in_process(UP_CLOSE), {}, "heldout")
    p = load_sp500(("KO",)).close[0]
    a, b = len(p) - 60, len(p)
    held = np.array([1.0 if p[t - 2] > p[t - 3] else 0.0 for t in range(a, b)])
    r = p[a:b] / p[a - 1:b - 1] - 1.0
    net = held * r - 5e-4 * np.abs(np.diff(held, prepend=0.0))
    assert out.metrics["total_return"] == pytest.approx(np.prod(1 + net) - 1, rel=1e-10)
    assert out.metrics["sharpe"] == pytest.approx(ts.sharpe(net), rel=1e-10)
    same_bar = np.array([1.0 if p[t - 1] > p[t - 2] else 0.0 for t in range(a, b)]) * r
    assert not np.isclose(np.prod(1 + same_bar) - 1, out.metrics["total_return"])


def test_zero_trades_get_zero_fitness_with_a_reason():
    domain = get_domain("trading", **TINY)
    out = domain.evaluate(in_process(CASH), {}, "search")
    assert out.score == 0.0 and "zero trades" in out.metrics["gate"]
    assert out.instance_scores == (0.0, 0.0)


def test_nan_and_out_of_range_positions_are_invalid_with_a_reason():
    domain = get_domain("trading", **TINY)
    with pytest.raises(CandidateError, match="not finite") as nan:
        domain.evaluate(in_process(NAN), {}, "search")
    assert nan.value.status == Status.INVALID and "bar " in nan.value.reason
    with pytest.raises(CandidateError, match=r"in \[-1, 1\]"):
        domain.evaluate(in_process("def policy(state, params):\n    return 1.5\n"), {}, "search")
    with pytest.raises(CandidateError, match="shape"):
        domain.evaluate(in_process("import numpy as np\ndef policy(s, p):\n    return np.ones(3)\n"), {}, "search")


def test_a_tuning_trial_out_of_range_fails_alone_and_a_program_none_of_whose_trials_is_in_range_is_invalid():
    # a position of `size`: the trials over 1 fail, the others are scored, each window's pick is in range
    sized = 'PARAMS = {"size": (0.5, 0.0, 3.0)}\n\ndef policy(state, params):\n    return params["size"]\n'
    domain = get_domain("trading", **dict(TINY, tune_trials=6), secrets=FIXED)
    out = domain.evaluate(in_process(sized), read_params(sized), "search")
    picks = [w["params"]["size"] for w in out.metrics["windows"]]
    assert picks and all(0.0 <= size <= 1.0 for size in picks), picks
    failed = [w["tune_out_of_range"] for w in out.metrics["windows"]]
    assert all(0 < n < 6 for n in failed) and out.metrics["tune_out_of_range"] == sum(failed)
    too_big = 'PARAMS = {"size": (2.0, 1.5, 3.0)}\n\ndef policy(state, params):\n    return params["size"]\n'
    with pytest.raises(CandidateError) as caught:
        domain.evaluate(in_process(too_big), read_params(too_big), "search")
    assert caught.value.status == Status.INVALID and "positions must be in [-1, 1], got " in caught.value.reason
    assert caught.value.reason.endswith("; every one of the 6 tuning trials of its PARAMS acted out of range")


def test_same_program_twice_gives_the_same_result_and_tuning_uses_the_trials():
    domain = get_domain("trading", **TINY, secrets=FIXED)
    code = domain.seed_program
    first = domain.evaluate(in_process(code), read_params(code), "search")
    second = domain.evaluate(in_process(code), read_params(code), "search")
    assert first.metrics == second.metrics and first.score == second.score
    chosen = {w["params"]["lookback"] for w in first.metrics["windows"]}
    assert chosen - {10.0}, "tuning never moved off the defaults"


def test_deflated_sharpe_reproduces_bailey_and_lopez_de_prado_2014():
    """Their numerical example: SR 2.5 a year over 5 years of 250 days, skew -3, kurtosis 10,
    N = 100 trials with annualized Sharpe variance 0.5: SR0 = 0.1132 per day, DSR = 0.9004."""
    dsr_sr, sr0 = 2.5 / math.sqrt(250), ts.expected_max_sharpe(0.5 / 250, 100)
    assert sr0 == pytest.approx(0.1132, abs=5e-5)
    assert ts.probabilistic_sharpe(dsr_sr, sr0, 1250, -3.0, 10.0) == pytest.approx(0.9004, abs=5e-5)
    trials = np.random.default_rng(0).normal(0, 1, 400)
    trials = (trials - trials.mean()) / trials.std(ddof=1) * math.sqrt(0.5 / 250)
    dsr, sr0_again = ts.deflated_sharpe(dsr_sr, 1250, -3.0, 10.0, trials, 100)
    assert sr0_again == pytest.approx(sr0) and dsr == pytest.approx(0.9004, abs=5e-5)


def test_heldout_table_reports_dsr_with_n_or_says_it_is_missing():
    evaluator = Evaluator("trading", TINY, SandboxConfig(wall_s=60))
    domain = evaluator.domain
    best = evaluator.evaluate("best", domain.seed_program, "heldout")
    bh = evaluator.evaluate("bh", BUY_AND_HOLD, "heldout")
    assert best.status == Status.OK and {"sharpe_per_bar", "n_returns", "skewness", "kurtosis"} <= set(best.metrics["search"])
    results = {"evolved best": best, "baseline: buy & hold": bh}
    scores = list(np.random.default_rng(1).normal(0.0, 0.3, 50))
    reference = dict(domain.reference("heldout"), trials={"count": 80, "search_scores": scores})
    columns, rows, notes = domain.heldout_table(results, reference)
    cell = rows[0][columns.index("DSR")]
    assert rows[0][0] == "evolved best" and "N=80" in cell
    assert any("DSR" in n and "80" in n for n in notes)
    _, rows, notes = domain.heldout_table(results, domain.reference("heldout"))
    assert "n/a" in rows[0][columns.index("DSR")] and any("not available" in n for n in notes)


def test_the_data_directory_is_hidden_from_the_sandbox():
    domain = get_domain("trading", **TINY)
    data = domain.sandbox_hide()[0]
    with gzip.open(f"{data}/sp500_index.csv.gz", "rt") as f:  # readable here, on the trusted side
        assert f.readline().startswith("Date")
    reader = ("import numpy as np\n\ndef policy(state, params):\n"
              f"    open({data!r} + '/sp500_index.csv.gz', 'rb').read()\n    return 1.0\n")
    result = Evaluator("trading", TINY, SandboxConfig(wall_s=60)).evaluate("peek", reader, "search")
    assert result.status == Status.FAILED and "No such file" in result.error, result.error
