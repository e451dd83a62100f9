"""The shared PARAMS tuner (evaluators/tuning.py): its refinement rounds follow the study's direction."""
import pytest

from evaluators.params import ParamSpec
from evaluators.tuning import EliteSampler, distributions, new_study, sobol_sampler

PARAMS = {"x": ParamSpec("x", 0.5, 0.0, 1.0)}


@pytest.mark.parametrize("direction, sign", [("minimize", 1.0), ("maximize", -1.0)])
def test_elite_rounds_refine_around_the_best_trials_whichever_way_the_study_goes(direction, sign):
    """The objective's best is x = 0.9 both ways: a maximizing study's refinement rounds search near it
    too, not near its worst trials."""
    study, dists = new_study(PARAMS, sobol_sampler(3), direction=direction), distributions(PARAMS)

    def run(trials: int) -> list[float]:
        xs = [study.ask(dists).params["x"] for _ in range(trials)]  # a whole round asked before any is told
        for trial, x in zip(study.trials[-trials:], xs):
            study.tell(trial.number, sign * (x - 0.9) ** 2)
        return xs

    run(16)
    study.sampler = EliteSampler(3)
    refined = run(16)
    assert sum(abs(x - 0.9) < 0.1 for x in refined) >= 12, sorted(refined)
