"""The flat request and reply layout: the same batches and actions as the list form, or the list form itself."""
import numpy as np
import pytest

from evaluators.sandbox import replies, wire
from evaluators.sandbox.process import reply_bounds


def _batches():
    return [({"on_hand": np.arange(4, dtype=np.int64), "pipeline": np.ones((4, lead), np.int64), "period": 3,
              "penalty": np.float64(9.0)}, {"level": np.full(4, 15.0)}) for lead in (1, 3, 2)]


def _through_the_child(message):
    return wire.unpack(wire.pack(message)[4:])


def test_flat_batches_arrive_as_the_same_states_and_params():
    batches = _batches()
    message = wire.flat_batches(batches)
    assert set(message) == {"flat"}
    got = wire.unflatten(_through_the_child(message)["flat"])
    assert len(got) == len(batches)
    for (state, params), (want_state, want_params) in zip(got, batches):
        assert list(state) == list(want_state) and list(params) == list(want_params)
        for key, value in want_state.items():
            assert np.array_equal(state[key], value) and np.shape(state[key]) == np.shape(value)
        assert state["penalty"] == 9.0 and type(state["penalty"]) is float and state["period"] == 3
        assert np.array_equal(params["level"], want_params["level"])


@pytest.mark.parametrize("change", ["other keys", "a list value", "mixed dtypes", "an object array", "not a dict"])
def test_batches_without_one_layout_go_as_they_are(change):
    batches = _batches()
    state = batches[1][0]
    if change == "other keys":
        state["extra"] = 1.0
    elif change == "a list value":
        state["period"] = [1, 2]
    elif change == "mixed dtypes":
        state["on_hand"] = state["on_hand"].astype(np.float64)
    elif change == "an object array":
        state["on_hand"] = np.array([None] * 4)
    else:
        batches[1] = (np.zeros(3), batches[1][1])
    assert wire.flat_batches(batches) is None


def test_flat_actions_are_read_back_as_one_array_per_batch_within_their_bounds():
    batches = _batches()
    items, _ = reply_bounds(batches)
    actions = [np.arange(4.0), np.float64(2.5) * np.ones(()), np.zeros((2, 2))]
    reply = replies.read_reply(wire.pack(wire.flat_actions(actions))[4:], items)
    assert [a.shape for a in reply["actions"]] == [(4,), (), (2, 2)]
    assert all(np.array_equal(a, b) for a, b in zip(reply["actions"], actions))


def test_actions_of_other_dtypes_keep_the_list_form_and_its_checks():
    assert set(wire.flat_actions([np.zeros(2), np.zeros(2, np.int64)])) == {"actions"}
    reply = wire.pack(wire.flat_actions([np.zeros(2, np.uint64)]))[4:]
    with pytest.raises(wire.WireError, match="dtype '<u8'"):
        replies.read_reply(reply, [1024])


@pytest.mark.parametrize("actions", [[np.arange(4.0), np.ones(4)], [np.zeros((2, 2), np.int64), np.ones(3, np.int64)],
                                     [np.ones((), np.float32)]])
def test_a_reply_packed_from_its_kept_head_is_the_frame_pack_makes(actions):
    first = wire.pack_reply(wire.flat_actions(actions))
    moved = [a + 1 for a in actions]
    assert first == wire.pack(wire.flat_actions(actions))
    assert wire.pack_reply(wire.flat_actions(moved)) == wire.pack(wire.flat_actions(moved))
    assert wire.pack_reply({"error": "x"}) == wire.pack({"error": "x"})
