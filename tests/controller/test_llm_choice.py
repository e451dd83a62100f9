"""Source choice per island, the model bandit and the budget, without Ray."""
from collections import Counter

import numpy as np
import pytest
from pydantic import ValidationError

from controller.llm_choice import Arm, Budget, ModelBandit, pick_source
from workers.llm.config import BanditConfig, BudgetConfig, LLMConfig

MODELS = [{"backend": "openai", "name": "a", "base_url": "http://127.0.0.1:1/v1", "model": "a"},
          {"backend": "openai", "name": "b", "base_url": "http://127.0.0.1:1/v1", "model": "b"}]


def test_island_weights_make_llm_only_and_embedded_only_islands():
    cfg = LLMConfig(models=MODELS, island_weights={0: {"embedded": 0}, 1: {"a": 0, "b": 0}})
    rng = np.random.default_rng(0)
    everything = {"embedded", "a", "b"}
    zero = Counter(pick_source({k: w for k, w in cfg.island_mix(0).items() if w > 0}, everything, rng) for _ in range(200))
    one = Counter(pick_source({k: w for k, w in cfg.island_mix(1).items() if w > 0}, everything, rng) for _ in range(200))
    assert zero == {"llm": 200} and one == {"embedded": 200}
    assert pick_source({"embedded": 1.0}, {"a"}, rng) is None  # the island's only source has no room


def test_bandit_shifts_toward_improvements_per_unit_cost():
    rng = np.random.default_rng(1)
    # a improves 20% of calls at 1000 tokens each; b improves 20% at 4000 tokens: a is 4x better per token
    bandit = ModelBandit(BanditConfig(policy="thompson"), rng,
                         {"a": Arm(50, 10, 50_000.0), "b": Arm(50, 10, 200_000.0)})
    picks = Counter(bandit.choose({"a": 1.0, "b": 1.0}) for _ in range(300))
    assert picks["a"] > 0.85 * 300
    ucb = ModelBandit(BanditConfig(policy="ucb"), rng, {"a": Arm(50, 2, 50_000.0), "b": Arm(50, 20, 50_000.0)})
    assert ucb.choose({"a": 1.0, "b": 1.0}) == "b"


def test_prior_weights_lead_before_evidence_and_a_new_model_starts_from_its_prior():
    rng = np.random.default_rng(2)
    bandit = ModelBandit(BanditConfig(prior_strength=20), rng)
    picks = Counter(bandit.choose({"a": 9.0, "b": 1.0}) for _ in range(300))
    assert picks["a"] > picks["b"] * 3
    off = ModelBandit(BanditConfig(policy="off"), rng)
    assert set(Counter(off.choose({"a": 1.0, "b": 1.0}) for _ in range(100))) == {"a", "b"}


def test_budget_counts_requests_in_flight():
    budget = Budget(BudgetConfig(calls=3, tokens=1000))
    budget.spend(1, 100, 0.0)
    assert budget.allows(1, 400, 0.0)
    budget.reserve(1, 400, 0.0)
    assert budget.allows(1, 400, 0.0) and not budget.allows(1, 600, 0.0)
    budget.reserve(1, 400, 0.0)
    assert not budget.allows(1, 10, 0.0)  # 1 spent + 2 in flight = 3 calls
    budget.reserve(1, 400, 0.0, sign=-1)
    assert budget.allows(1, 10, 0.0)
    assert Budget(BudgetConfig(cost=1.0), cost=0.999).allows(1, 0, 0.002) is False


def test_config_names_unknown_sources_and_missing_prices():
    with pytest.raises(ValidationError, match="unknown sources"):
        LLMConfig(models=MODELS, weights={"c": 1.0})
    with pytest.raises(ValidationError, match="needs a price"):
        LLMConfig(models=MODELS, bandit={"cost_unit": "money"})
    with pytest.raises(ValidationError, match="unique"):
        LLMConfig(models=MODELS + MODELS[:1])
