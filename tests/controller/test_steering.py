"""The bridge between the control plane's threads and the run loop, and budget-change validation."""
import threading

import pytest

from controller import steering
from controller.config import validate
from controller.helm import budget_change
from controller.steering import Command, Ended, Refused, Steering

CONFIG = validate({"domain": {"name": "inventory"}, "run": {"max_evals": 100}})


def test_a_command_is_answered_by_the_loop_thread_and_the_end_refuses_what_is_queued():
    bridge = Steering()
    answers = {}

    def caller(name):
        try:
            answers[name] = bridge.ask(Command(name), timeout_s=10)
        except Ended as exc:
            answers[name] = f"ended: {exc}"

    first = threading.Thread(target=caller, args=("pause",))
    first.start()
    while not (taken := bridge.take()):
        pass
    (command, future), = taken
    future.set_result(f"{command.kind} done")
    first.join()
    second = threading.Thread(target=caller, args=("stop",))
    second.start()
    while bridge._commands.empty():
        pass
    bridge.end("completed")
    second.join()
    assert answers == {"pause": "pause done", "stop": "ended: the search has ended (completed)"}
    with pytest.raises(Ended):
        bridge.ask(Command("status"))


def test_a_command_the_loop_did_not_take_in_time_is_never_carried_out():
    """The caller was told the loop did not answer (DEADLINE_EXCEEDED); a stop still queued stopped the
    run at the loop's next tick, after its caller had given up."""
    bridge = Steering()
    with pytest.raises(TimeoutError):
        bridge.ask(Command("stop"), timeout_s=0.1)
    assert bridge.take() == []


def test_each_subscriber_gets_the_events_then_ended_and_a_slow_one_loses_its_oldest(monkeypatch):
    monkeypatch.setattr(steering, "EVENTS_KEPT", 3)
    bridge = Steering()
    events = bridge.subscribe()
    for i in range(5):
        bridge.publish("new-best", {"score": i})
    bridge.end("interrupted")
    seen = [events.get_nowait() for _ in range(3)]
    assert [(e.kind, e.detail) for e in seen[:2]] == [("new-best", {"score": 4}), ("ended", {"status": "interrupted"})]
    assert seen[2] is None and events.empty()
    late = bridge.subscribe()
    assert late.get_nowait().kind == "ended" and late.get_nowait() is None


@pytest.mark.parametrize("key, value, message", [
    ("run.seed", "3", "run.seed: not a budget that can change during a run; one of run.max_evals, "),
    ("run.max_evals", "0", "run.max_evals: Input should be greater than or equal to 1"),
    ("run.max_wall_s", "soon", "run.max_wall_s: Input should be a valid number"),
    ("run.max_evals", "9", "run.max_evals: 9 is below the 10 evaluations finished or under way; give at least 10"),
    ("mutator.llm.budget.calls", "5", "mutator.llm.budget.calls: this run has no LLM models"),
    ("run.max_wall_s", "true", "run.max_wall_s: true given where a number is expected"),
    ("run.max_evals", "true", "run.max_evals: true given where a number is expected"),
])
def test_a_bad_budget_change_is_one_line_naming_the_key(key, value, message):
    with pytest.raises(Refused) as refused:
        budget_change(CONFIG, key, value, floor_evals=10)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_a_budget_change_changes_only_that_budget():
    new = budget_change(CONFIG, "run.max_wall_s", "7200", floor_evals=10)
    assert new.run.max_wall_s == 7200 and new.model_dump() == {**CONFIG.model_dump(), "run": new.run.model_dump()}
    assert budget_change(CONFIG, "run.max_evals", "10", floor_evals=10).run.max_evals == 10
