"""Saving and resuming an iterator: the API (state_dict / load_state_dict), its errors, and the core sources.

Each transformation family's resumption is tested beside it (tests/test_iterator_state_*.py); the
harness is tests/checkpoints.py.
"""

import functools
import json

import numpy as np
import pytest

from dataservice.data import Dataset
from dataservice.data.checkpoint import pipeline_fingerprint
from dataservice.errors import NotCheckpointableError
from tests.checkpoints import assert_resumes, state_after

pytestmark = pytest.mark.no_grpc


@pytest.mark.parametrize("make", [
    lambda: Dataset.range(10_000),
    lambda: Dataset.range(5, 9_001, 7, output_type=np.float32),
    lambda: Dataset.range(100, -5, -3, output_type=np.int8),
    lambda: Dataset.range(0),
    lambda: Dataset.from_tensor_slices(np.arange(9_000).reshape(4_500, 2)),
    lambda: Dataset.from_tensor_slices({"a": np.arange(5_000), "b": [str(i) for i in range(5_000)]}),
    lambda: Dataset.from_tensors((np.ones((2, 3), np.float32), b"x")),
    lambda: Dataset.range(9_000).map(lambda x: (x, x * 2)).map(lambda a, b: {"s": a + b}),
], ids=["range", "range-float32-step", "range-int8-negative-step", "range-empty", "slices", "slices-dict",
        "tensors", "map-map"])
def test_sources_resume_exactly(make):
    assert_resumes(make)


def test_state_is_json_small_and_taking_it_changes_nothing():
    it = iter(Dataset.range(10**12).map(lambda x: x + 1))
    firsts = [int(next(it)) for _ in range(3)]
    state = it.state_dict()
    assert int(next(it)) == 4 and firsts == [1, 2, 3]
    assert len(json.dumps(state)) < 4096


def test_load_after_next_is_refused():
    it = iter(Dataset.range(10))
    state = it.state_dict()
    next(it)
    with pytest.raises(ValueError, match="before the iterator's first element"):
        it.load_state_dict(state)


def test_state_of_another_pipeline_names_both_fingerprints():
    _, state = state_after(lambda: Dataset.range(10).map(lambda x: x + 1), 3)
    it = iter(Dataset.range(10).map(lambda x: x + 2))
    with pytest.raises(ValueError, match="another pipeline") as info:
        it.load_state_dict(state)
    assert state["pipeline"] in str(info.value) and it._pipeline() in str(info.value)


def test_the_identity_is_the_code_not_where_it_sits_in_the_file():
    def first():
        return Dataset.range(10).map(lambda x: x * 3)

    def second():  # the same pipeline, written lines below: same identity
        return Dataset.range(10).map(lambda x: x * 3)

    _, state = state_after(first, 4)
    it = iter(second())
    it.load_state_dict(state)
    assert [int(x) for x in it] == [12, 15, 18, 21, 24, 27]


def test_closure_values_and_arguments_are_part_of_the_identity():
    def make(scale, n=10):
        return Dataset.range(n).map(lambda x: x * scale)

    _, state = state_after(lambda: make(2), 1)
    for other in (make(3), make(2, n=11)):
        with pytest.raises(ValueError, match="another pipeline"):
            iter(other).load_state_dict(state)


#: Changed by ``_counted_add`` as the pipeline runs; a global counts by its name in the identity, not its value.
_CALLS = 0
_TABLE = None


def _counted_add(x, k):
    global _CALLS, _TABLE
    _CALLS += 1
    _TABLE = _TABLE or {"loaded": True}  # a table loaded on first use: its type changes too
    return x + k


def test_partials_count_by_function_and_arguments_and_globals_by_name_only():
    def make(k):
        return Dataset.range(10).map(functools.partial(_counted_add, k=k))

    _, state = state_after(lambda: make(1), 4)  # the globals changed while it ran
    it = iter(make(1))
    it.load_state_dict(state)
    assert [int(x) for x in it] == [5, 6, 7, 8, 9, 10]
    with pytest.raises(ValueError, match="another pipeline"):
        iter(make(2)).load_state_dict(state)
    for a, b in ((np.sqrt, np.exp), (abs, round)):  # builtins and ufuncs by their names
        assert pipeline_fingerprint(Dataset.range(3).map(a)) != pipeline_fingerprint(Dataset.range(3).map(b))


@pytest.mark.parametrize("broken, message", [
    ("not a dict", "expects the dict"),
    ({"format": "other"}, "not an iterator state"),
    ({"format": "dataservice.iterator", "version": 99}, "version 99 is not known"),
])
def test_malformed_and_unknown_states_are_refused(broken, message):
    with pytest.raises(ValueError, match=message):
        iter(Dataset.range(10)).load_state_dict(broken)


@pytest.mark.parametrize("position, message", [
    ({"chunk": "x", "offset": 0}, "'chunk' must be int"),
    ({"chunk": 0}, "'offset' is missing"),
    ({"chunk": -1, "offset": 0}, "'chunk' must be >= 0"),
    ({"chunk": 7, "offset": 0}, "does not fit"),
    ([1, 2], "expected an object"),
])
def test_a_malformed_position_is_a_value_error_naming_the_field(position, message):
    _, state = state_after(lambda: Dataset.range(10), 2)
    state["position"] = position
    with pytest.raises(ValueError, match=message):
        iter(Dataset.range(10)).load_state_dict(state)


def test_from_generator_cannot_be_checkpointed_and_says_why():
    def gen():
        yield from range(3)

    it = iter(Dataset.from_generator(gen, output_signature=None).map(lambda x: x))
    next(it)
    with pytest.raises(NotCheckpointableError, match=r"from_generator.*generator"):
        it.state_dict()


def test_objects_a_function_mutates_do_not_change_the_identity():
    # A counter (or a tokenizer's cache) that the function updates is not a setting of the pipeline: the
    # pipeline rebuilt after a restart, with a fresh one, is the same pipeline.
    def make(seen):
        return Dataset.range(20).map(lambda x: seen.append(int(x)) or x * 2)

    first = []
    _, state = state_after(lambda: make(first), 5)
    assert first  # it did run
    it = iter(make([]))
    it.load_state_dict(state)
    assert [int(x) for x in it] == [2 * x for x in range(5, 20)]

