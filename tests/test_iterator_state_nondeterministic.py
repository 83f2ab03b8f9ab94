"""Saving and resuming read-ahead nodes over inputs that do not read again alike: a parallel map or
interleave with deterministic=False upstream gives other elements, in another order, when read again from
a recorded state, so a prefetch or an interleave there cannot restore by replaying (``checkpoint.Marks``).
Instead a prefetch saves its input's position and the elements it read ahead, an interleave the element
that opened each slot, and a parallel interleave's slot over such a dataset its position and what its
pump read ahead. Each must resume exactly once, as a multiset. The harness is tests/checkpoints.py.
"""

import collections
import json
import random
import threading
import time

import numpy as np
import pytest

from dataservice.data import Dataset, TextLineDataset
from dataservice.data.checkpoint import decode_elements
from dataservice.errors import NotCheckpointableError
from tests.checkpoints import assert_resumes, resumed, state_after, typed

pytestmark = pytest.mark.no_grpc

#: Enough cuts that a design which rewinds a nondeterministic input is caught (it loses and repeats
#: elements at most of them: see test_a_rewinding_prefetch_would_be_caught).
CUTS = [0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 40, 100, 333, 1000, 1500, 1999, 2000]


def _jittery(x):
    """Some elements take longer, by a random amount: a deterministic=False map yields them in an order
    that changes from run to run."""
    if x % 5 == 0:
        time.sleep(random.random() * 0.0005)
    return x


def _nondeterministic(n=2000):
    return Dataset.range(n).map(_jittery, num_parallel_calls=4, deterministic=False)


def _values(elements):
    """The int values in typed elements (scalars or arrays), flattened."""
    out = []
    for x in elements:
        if x[0] == "array":
            out.extend(x[3])
        elif x[0] == "scalar":
            out.append(x[2])
        else:
            out.extend(_values(x[1:]))
    return out


def _state_with_full_buffer(make, k, settle=0.05):
    """The first k elements and the state then, taken once the read-ahead had time to fill its buffers."""
    it = iter(make())
    head = [typed(next(it)) for _ in range(k)]
    time.sleep(settle)
    state = json.loads(json.dumps(it.state_dict()))
    it.close()
    return head, state


# --- prefetch ------------------------------------------------------------------------------------------

def test_prefetch_over_a_nondeterministic_map_resumes_exactly_once():
    full = assert_resumes(lambda: _nondeterministic().prefetch(8), cuts=CUTS, ordered=False)
    assert sorted(_values(full)) == list(range(2000))


def test_prefetch_over_a_nondeterministic_map_saves_what_it_read_ahead():
    make = lambda: _nondeterministic().prefetch(8)  # noqa: E731
    for k in (0, 5, 1000):  # before the first element the pump has not started: nothing buffered yet
        head, state = _state_with_full_buffer(make, k)
        position = state["position"]
        assert sorted(position) == ["buffer", "input"]
        buffered = decode_elements(position["buffer"], "test")
        assert len(buffered) == (8 if k else 0)  # mid-buffer: a full buffer of elements read, not taken
        rest = resumed(make, state)
        assert collections.Counter(_values(head + rest)) == collections.Counter(range(2000)), f"cut {k}"


def test_prefetch_over_a_replaying_input_still_rewinds():
    it = iter(Dataset.range(2000).map(_jittery, num_parallel_calls=4).prefetch(8))
    next(it)
    assert sorted(it.state_dict()["position"]) == ["input", "skip"]
    it.close()


def test_prefetch_of_batches_of_a_nondeterministic_map_resumes_exactly_once():
    make = lambda: _nondeterministic().batch(5).prefetch(8)  # noqa: E731
    for k in (0, 1, 2, 7, 8, 9, 50, 200, 399, 400):
        head, state = (_state_with_full_buffer(make, k, settle=0.01) if k % 2 else state_after(make, k))
        rest = resumed(make, state)
        assert len(head) + len(rest) == 400 and all(x[2] == (5,) for x in head + rest)
        got = collections.Counter(_values(head + rest))
        assert got == collections.Counter(range(2000)), (
            f"cut {k}: repeated {sorted((got - collections.Counter(range(2000))).elements())[:5]}, "
            f"lost {sorted((collections.Counter(range(2000)) - got).elements())[:5]}")


def test_prefetch_restored_and_saved_before_its_first_element_gives_the_same_state():
    make = lambda: _nondeterministic().prefetch(8)  # noqa: E731
    _, state = _state_with_full_buffer(make, 10)
    it = iter(make())
    it.load_state_dict(state)
    assert json.loads(json.dumps(it.state_dict())) == state
    it.close()


def test_prefetch_of_prefetch_over_a_nondeterministic_map_resumes_exactly_once():
    assert_resumes(lambda: _nondeterministic(500).prefetch(4).map(lambda x: x + 1).prefetch(3),
                   cuts=[0, 1, 2, 3, 4, 5, 9, 250, 499, 500], ordered=False)


def test_a_saved_prefetch_stops_its_thread_when_closed():
    def prefetch_threads():
        return sum(t.name == "dataservice-prefetch" and t.is_alive() for t in threading.enumerate())

    before = prefetch_threads()
    it = iter(_nondeterministic(5000).prefetch(4))
    next(it)
    it.state_dict()  # the pump waits for the next element: closing must end it all the same
    it.close()
    deadline = time.monotonic() + 5
    while prefetch_threads() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert prefetch_threads() <= before


def test_a_rewinding_prefetch_would_be_caught(monkeypatch):
    """The tests above can fail: a prefetch that rewinds its nondeterministic input (the design for one
    that replays) loses and repeats elements at some of these cuts."""
    from dataservice.data.transformations import reordering

    monkeypatch.setattr(reordering, "replays", lambda dataset, ctx: True)
    with pytest.raises(AssertionError, match="not exactly once"):
        assert_resumes(lambda: _nondeterministic().prefetch(8), cuts=[c for c in CUTS if 8 < c < 2000] * 3,
                       ordered=False)


# --- interleave and flat_map ----------------------------------------------------------------------------

def _slot(x):
    return Dataset.range(x * 100, x * 100 + 3 + x % 5)


INTERLEAVES = {
    "sequential": dict(cycle_length=3),
    "sequential, blocks": dict(cycle_length=3, block_length=2),
    "parallel": dict(cycle_length=3, num_parallel_calls=3),
    "parallel, not deterministic": dict(cycle_length=3, num_parallel_calls=3, deterministic=False),
}
INTERLEAVE_CUTS = [0, 1, 2, 3, 5, 8, 13, 40, 77, 100, 150, 200, 250, 299, 300]


@pytest.mark.parametrize("kind", sorted(INTERLEAVES))
def test_interleave_over_a_nondeterministic_map_resumes_exactly_once(kind):
    make = lambda: _nondeterministic(60).interleave(_slot, **INTERLEAVES[kind])  # noqa: E731
    full = assert_resumes(make, cuts=INTERLEAVE_CUTS, ordered=False)
    assert sorted(_values(full)) == sorted(v for x in range(60) for v in range(x * 100, x * 100 + 3 + x % 5))
    _, state = state_after(make, 5)
    openings = [slot["at"] for slot in state["position"]["slots"] if slot is not None]
    assert openings and all(sorted(at) == ["element"] for at in openings)  # the element, not a position


def test_flat_map_over_a_nondeterministic_map_resumes_exactly_once():
    make = lambda: _nondeterministic(60).flat_map(_slot)  # noqa: E731
    assert_resumes(make, cuts=INTERLEAVE_CUTS, ordered=False)


@pytest.mark.parametrize("parallel", [False, True])
def test_interleave_of_listed_files_through_a_nondeterministic_map_resumes_exactly_once(tmp_path, parallel):
    for i in range(12):
        (tmp_path / f"part-{i:02d}.txt").write_text("".join(f"{i}:{j}\n" for j in range(5 + i % 4)))

    def named(path):
        if path.endswith(("3.txt", "7.txt")):
            time.sleep(random.random() * 0.002)
        return path

    def make():
        files = Dataset.list_files(str(tmp_path / "*.txt"), shuffle=False)
        files = files.map(named, num_parallel_calls=4, deterministic=False)
        return files.interleave(TextLineDataset, cycle_length=3, num_parallel_calls=3 if parallel else None)

    full = assert_resumes(make, cuts=[0, 1, 2, 3, 4, 10, 20, 30, 40, 50, 60, 66, 67, 68], ordered=False)
    assert len(full) == sum(5 + i % 4 for i in range(12))


def test_interleave_openings_are_the_elements_when_restored_and_saved_before_the_first():
    make = lambda: _nondeterministic(60).interleave(_slot, cycle_length=3, num_parallel_calls=3)  # noqa: E731
    _, state = state_after(make, 7)
    it = iter(make())
    it.load_state_dict(state)
    assert json.loads(json.dumps(it.state_dict())) == state
    it.close()


def test_a_rewinding_interleave_would_be_caught(monkeypatch):
    from dataservice.data.transformations import combining

    monkeypatch.setattr(combining, "replays", lambda dataset, ctx: True)
    with pytest.raises(AssertionError, match="not exactly once"):
        assert_resumes(lambda: _nondeterministic(60).interleave(_slot, cycle_length=3),
                       cuts=[c for c in INTERLEAVE_CUTS if 0 < c < 290] * 2, ordered=False)


# --- datasets made by the interleave function that do not read again alike ------------------------------

def _nondeterministic_slot(x):
    return Dataset.range(x * 100, x * 100 + 20 + x % 5).map(_jittery, num_parallel_calls=3, deterministic=False)


def _nondeterministic_prefetched_slot(x):
    return _nondeterministic_slot(x).prefetch(4)


@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("function", [_nondeterministic_slot, _nondeterministic_prefetched_slot])
def test_parallel_interleave_of_nondeterministic_datasets_resumes_exactly_once(deterministic, function):
    make = lambda: Dataset.range(12).interleave(function, cycle_length=3, num_parallel_calls=3,  # noqa: E731
                                                deterministic=deterministic)
    full = assert_resumes(make, cuts=[0, 1, 2, 3, 5, 8, 13, 40, 77, 100, 150, 200, 250, 260, 261], ordered=False)
    assert sorted(_values(full)) == sorted(v for x in range(12) for v in range(x * 100, x * 100 + 20 + x % 5))


def test_parallel_interleave_keeps_what_a_nondeterministic_slot_read_ahead():
    make = lambda: Dataset.range(12).interleave(_nondeterministic_slot, cycle_length=3,  # noqa: E731
                                                num_parallel_calls=3)
    want = collections.Counter(v for x in range(12) for v in range(x * 100, x * 100 + 20 + x % 5))
    for k in (1, 4, 30, 100):
        head, state = _state_with_full_buffer(make, k)
        slots = [slot["slot"] for slot in state["position"]["slots"] if slot is not None]
        assert slots and all(sorted(s) == ["buffer", "input"] for s in slots)
        assert any(decode_elements(s["buffer"], "test") for s in slots)  # read ahead, not yet taken
        got = collections.Counter(_values(head + resumed(make, state)))
        assert got == want, f"cut {k}"
        it = iter(make())
        it.load_state_dict(state)
        assert json.loads(json.dumps(it.state_dict())) == state
        it.close()


def test_parallel_interleave_of_replaying_datasets_still_rewinds_its_slots():
    it = iter(Dataset.range(12).interleave(_slot, cycle_length=3, num_parallel_calls=3))
    next(it)
    slots = [slot["slot"] for slot in it.state_dict()["position"]["slots"] if slot is not None]
    assert slots and all(s is None or sorted(s) == ["input", "skip"] for s in slots)
    it.close()


def test_a_parallel_interleave_rewinding_nondeterministic_slots_would_be_caught(monkeypatch):
    from dataservice.data.transformations import combining

    # The main input (a range) replays either way; the slots' datasets are said to.
    monkeypatch.setattr(combining, "replays", lambda dataset, ctx: True)
    with pytest.raises(AssertionError, match="not exactly once"):
        assert_resumes(lambda: Dataset.range(12).interleave(_nondeterministic_slot, cycle_length=3,
                                                            num_parallel_calls=3),
                       cuts=[5, 8, 13, 40, 77, 100, 150, 200] * 2, ordered=False)


def test_arrays_and_structures_in_buffers_resume_with_their_dtypes():
    def pair(x):
        return {"x": np.full((2,), x, np.int32), "name": str(x).encode()}

    make = lambda: (Dataset.range(300).map(pair, num_parallel_calls=4, deterministic=False)  # noqa: E731
                    .prefetch(6))
    assert_resumes(make, cuts=[0, 1, 5, 6, 7, 150, 299, 300], ordered=False)


# --- where reading again would not give the same elements: a clear refusal, never a wrong resume ------------

def _shuffled_order(x):
    return x


def _no_fixed_order(n=300):
    return Dataset.range(n).map(_shuffled_order, num_parallel_calls=4, deterministic=False)


@pytest.mark.parametrize("make, taken, names", [
    (lambda: Dataset.range(12).interleave(
        lambda i: Dataset.range(30).map(lambda x: x + 100 * i, num_parallel_calls=3, deterministic=False),
        cycle_length=3).prefetch(8), 1, r"Dataset\.prefetch.*no fixed order"),
    (lambda: _no_fixed_order().window(5, 2).flat_map(lambda w: w.take(1)), 40, r"Dataset\.window.*deterministic=True"),
    (lambda: _no_fixed_order().cache().repeat(2), 350, r"Dataset\.cache.*after its first pass"),
], ids=["prefetch-after-interleave-of-unordered-datasets", "overlapping-windows", "memory-cache-second-pass"])
def test_a_rewinding_node_over_an_input_without_a_fixed_order_refuses_to_save(make, taken, names):
    it = iter(make())
    try:
        for _ in range(taken):
            next(it)
        with pytest.raises(NotCheckpointableError, match=names):
            it.state_dict()
    finally:
        it.close()


def test_a_read_ahead_branch_shares_the_pipelines_thread_pool():
    # A prefetch reads its input through a copy of the pipeline's context (``rewound``): a parallel map
    # there must use the pipeline's one pool (private_threadpool_size bounds them all), not a second.
    it = iter(Dataset.zip(Dataset.range(50).map(_shuffled_order, num_parallel_calls=2).prefetch(2),
                          Dataset.range(50).map(_shuffled_order, num_parallel_calls=2)))
    try:
        assert len(list(it)) == 50
        assert len(it._ctx._children) == 1
    finally:
        it.close()
