"""Saving and resuming the iterators of the reordering and combining transformations: shuffle (seeded,
reshuffled across repeats, unseeded, whole-input), prefetch, interleave and flat_map (sequential and
parallel, deterministic or not), zip and concatenate. The harness is tests/checkpoints.py.
"""

import json
import threading
import time

import numpy as np
import pytest

from dataservice.data import Dataset, TextLineDataset, shuffle_and_repeat
from dataservice.errors import NotCheckpointableError
from tests.checkpoints import assert_resumes, resumed, state_after, typed

pytestmark = pytest.mark.no_grpc


# --- shuffle --------------------------------------------------------------------------------------------

def test_seeded_shuffle_resumes_at_cuts_inside_the_first_buffer_fill():
    # A buffer of 100: every cut below 100 falls while the first buffer's elements are still coming out.
    full = assert_resumes(lambda: Dataset.range(1_000).shuffle(100, seed=3), cuts=[0, 1, 2, 37, 99, 100, 500, 950,
                                                                                    999, 1_000])
    assert sorted(x[2] for x in full) == list(range(1_000)) and [x[2] for x in full] != list(range(1_000))


def test_reshuffled_repetitions_resume_with_each_epochs_order():
    make = lambda: Dataset.range(50).shuffle(10, seed=1, reshuffle_each_iteration=True).repeat(3)  # noqa: E731
    full = assert_resumes(make, cuts=[0, 1, 25, 49, 50, 51, 75, 99, 100, 101, 140, 149, 150])
    epochs = [[x[2] for x in full[k * 50:(k + 1) * 50]] for k in range(3)]
    assert all(sorted(e) == list(range(50)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2]  # reshuffled: the restored runs above continued each one's order


def test_shuffle_and_repeat_resumes():
    assert_resumes(lambda: Dataset.range(30).apply(shuffle_and_repeat(8, count=3, seed=5)), cuts=[0, 7, 30, 45, 89])


def test_a_restored_reshuffle_sets_the_epoch_of_the_next_iterator():
    # Without repeat: the next iter() of the same dataset object takes the next epoch, restored or not.
    ds = Dataset.range(20).shuffle(20, seed=4)
    first, second = [int(x) for x in ds], [int(x) for x in ds]
    restored_ds = Dataset.range(20).shuffle(20, seed=4)
    _, state = state_after(lambda: Dataset.range(20).shuffle(20, seed=4), 5)
    it = iter(restored_ds)
    it.load_state_dict(state)
    assert [int(x) for x in it] == first[5:]
    assert [int(x) for x in restored_ds] == second


@pytest.mark.parametrize("make", [
    lambda: Dataset.range(200).shuffle(16),
    lambda: Dataset.range(60).shuffle(16).repeat(2),
    lambda: Dataset.range(100).shuffle(10, reshuffle_each_iteration=False),
], ids=["unseeded", "unseeded-repeat", "unseeded-fixed-order"])
def test_an_unseeded_shuffle_resumes_exactly_once(make):
    assert_resumes(make, ordered=False)


def test_an_unseeded_shuffle_resumes_in_its_own_order():
    # Its seed was drawn and saved: the rest comes in the order the saved iterator would have given.
    it = iter(Dataset.range(100).shuffle(30))
    head = [int(next(it)) for _ in range(10)]
    state = it.state_dict()
    rest = [int(x) for x in it]
    again = iter(Dataset.range(100).shuffle(30))
    again.load_state_dict(state)
    assert [int(x) for x in again] == rest and sorted(head + rest) == list(range(100))


def test_shuffle_of_the_whole_input_and_of_structured_elements_resumes():
    assert_resumes(lambda: Dataset.range(300).shuffle(-2, seed=9))
    assert_resumes(lambda: Dataset.from_tensor_slices({"x": np.arange(40.0).reshape(20, 2), "s": [str(i) for i in
                                                      range(20)]}).shuffle(8, seed=2))


def test_shuffle_split_hint_keyed_order_resumes():
    from dataservice.data.dataset import IteratorContext
    from dataservice.data.options import Options

    ds = Dataset.range(40).shuffle(8, seed=6)
    ctx = IteratorContext(options=Options(), split_hint=3)
    it = ds._iterator(ctx)
    head = [int(next(it)) for _ in range(11)]
    state = json.loads(json.dumps(it.save()))
    rest = [int(x) for x in it]
    again = Dataset.range(40).shuffle(8, seed=6)._iterator(IteratorContext(options=Options(), split_hint=3))
    again.restore(state)
    assert [int(x) for x in again] == rest and sorted(head + rest) == list(range(40))


def test_a_long_shuffle_saves_its_generator_state_not_a_draw_count(monkeypatch):
    from dataservice.data.transformations import reordering

    monkeypatch.setattr(reordering, "_MAX_REPLAYED_DRAWS", 10)
    _, state = state_after(lambda: Dataset.range(100).shuffle(5, seed=1), 30)
    assert len(state["position"]["rng"]) == 625
    assert_resumes(lambda: Dataset.range(100).shuffle(5, seed=1), cuts=[30, 98])


def test_a_shuffle_state_holds_its_buffer_and_bad_ones_are_value_errors():
    _, state = state_after(lambda: Dataset.range(100).shuffle(10, seed=1), 3)
    position = state["position"]
    assert position["phase"] == 1 and position["draws"] == 3 and isinstance(position["buffer"], str)
    for key, value, message in [("phase", 7, "'phase'"), ("buffer", "not base64!", "cannot be decoded"),
                                ("draws", -1, "'draws' must be >= 0"), ("rng", [1, 2], "'rng' must be 625")]:
        broken = json.loads(json.dumps(state))
        broken["position"][key] = value
        with pytest.raises(ValueError, match=message):
            iter(Dataset.range(100).shuffle(10, seed=1)).load_state_dict(broken)


# --- prefetch -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: Dataset.range(500).map(lambda x: x * 3).prefetch(3),
    lambda: Dataset.range(500).prefetch(-1),  # AUTOTUNE
    lambda: Dataset.range(500).prefetch(0),
    lambda: Dataset.range(300).map(lambda x: (x, -x), num_parallel_calls=3).prefetch(4),
    lambda: Dataset.range(300).prefetch(2).prefetch(5),
], ids=["map-prefetch", "autotune", "zero", "parallel-map", "prefetch-prefetch"])
def test_prefetch_resumes(make):
    assert_resumes(make, cuts=[0, 1, 63, 64, 65, 130, 299, 300])


#: Calls of a pipeline's function, counted by it (a global: a closure's values are part of the pipeline's
#: identity, so a list the function closes over would make each build another pipeline).
calls: list = []


def test_prefetch_state_is_small_and_restore_reads_ahead_a_bounded_amount():
    make = lambda: Dataset.range(10**9).map(lambda x: calls.append(1) or x).prefetch(8)  # noqa: E731
    it = iter(make())
    for _ in range(10_000):
        next(it)
    state = it.state_dict()
    it.close()
    assert len(json.dumps(state)) < 4096
    calls.clear()
    again = iter(make())
    again.load_state_dict(state)
    assert int(next(again)) == 10_000
    again.close()
    assert len(calls) <= 64 + 8 + 2  # the marks' interval, the buffer and the element: not 10,000


# --- interleave and flat_map ----------------------------------------------------------------------------

def _files(tmp_path, count=4, lines=7):
    paths = []
    for k in range(count):
        path = tmp_path / f"part-{k}.txt"
        path.write_text("".join(f"file{k} line{j}\n" for j in range(lines + k)))
        paths.append(str(path))
    return paths


def test_interleave_of_text_files_resumes(tmp_path):
    _files(tmp_path)
    pattern = str(tmp_path / "*.txt")
    make = lambda: Dataset.list_files(pattern, shuffle=False).interleave(  # noqa: E731
        lambda f: TextLineDataset(f), cycle_length=2, block_length=3)
    full = assert_resumes(make, cuts=range(0, 35))
    assert len(full) == 7 + 8 + 9 + 10
    assert full[:4] == [("bytes", b"file0 line0"), ("bytes", b"file0 line1"), ("bytes", b"file0 line2"),
                        ("bytes", b"file1 line0")]


def test_parallel_interleave_of_shuffled_text_files_resumes(tmp_path):
    _files(tmp_path, count=5)
    pattern = str(tmp_path / "*.txt")
    make = lambda: Dataset.list_files(pattern, shuffle=True, seed=8).interleave(  # noqa: E731
        lambda f: TextLineDataset(f).map(lambda line: line + b"!"), cycle_length=3, block_length=2,
        num_parallel_calls=3)
    full = assert_resumes(make, cuts=[*range(0, 45, 4), 44, 45])
    assert len(full) == 7 + 8 + 9 + 10 + 11


@pytest.mark.parametrize("make", [
    lambda: Dataset.range(10).interleave(lambda x: Dataset.range(x).map(lambda y: y * 10 + x), cycle_length=3,
                                         block_length=2),
    lambda: Dataset.range(8).interleave(lambda x: Dataset.range(x % 3), cycle_length=4),  # empty datasets too
    lambda: Dataset.range(12).flat_map(lambda x: Dataset.range(x).map(lambda y: (x, y))),
    lambda: Dataset.range(6).flat_map(lambda x: Dataset.from_tensor_slices(np.arange(x * 2).reshape(x, 2))),
    lambda: Dataset.range(7).interleave(lambda x: Dataset.range(3).shuffle(3, seed=int(x)), cycle_length=2),
    lambda: Dataset.range(9).shuffle(9, seed=1).repeat(2).interleave(lambda x: Dataset.range(x), cycle_length=3,
                                                                     block_length=2),
    lambda: Dataset.range(5).interleave(lambda x: Dataset.range(4).prefetch(2), cycle_length=2),
], ids=["range-map", "empty-slots", "flat_map", "flat_map-slices", "inner-shuffle", "shuffled-repeated-input",
        "inner-prefetch"])
def test_sequential_interleave_resumes_at_every_cut(make):
    n = len(list(make()))
    assert_resumes(make, cuts=range(n + 1))


@pytest.mark.parametrize("block", [1, 3])
def test_parallel_interleave_resumes_in_order(block):
    make = lambda: Dataset.range(10).interleave(  # noqa: E731
        lambda x: Dataset.range(int(x) * 3).map(lambda y: y * 100 + x), cycle_length=3, block_length=block,
        num_parallel_calls=3, deterministic=True)
    n = len(list(make()))
    assert_resumes(make, cuts=range(0, n + 1, 3))
    assert [typed(x) for x in make()] == [typed(x) for x in Dataset.range(10).interleave(
        lambda x: Dataset.range(int(x) * 3).map(lambda y: y * 100 + x), cycle_length=3, block_length=block)]


def test_parallel_interleave_without_order_resumes_exactly_once():
    make = lambda: Dataset.range(12).interleave(  # noqa: E731
        lambda x: Dataset.range(int(x) * 4).map(lambda y: y * 100 + x), cycle_length=4, block_length=2,
        num_parallel_calls=4, deterministic=False)
    n = len(list(make()))
    assert_resumes(make, cuts=[0, 1, 5, n // 3, n // 2, n - 1, n], ordered=False)


def test_parallel_interleave_of_a_long_slot_restores_with_a_bounded_replay():
    make = lambda: Dataset.range(2).interleave(  # noqa: E731
        lambda x: Dataset.range(10**6).map(lambda y: calls.append(1) or y), cycle_length=2, num_parallel_calls=2)
    it = iter(make())
    for _ in range(2_000):
        next(it)
    state = it.state_dict()
    it.close()
    assert len(json.dumps(state)) < 4096
    calls.clear()
    again = iter(make())
    again.load_state_dict(state)
    assert int(next(again)) == 1_000
    again.close()
    assert len(calls) < 2 * (64 + 4 + 2) + 200  # per slot: the interval, the read-ahead; not 2,000


def test_an_interleave_state_of_another_cycle_or_slot_count_is_a_value_error():
    make = lambda: Dataset.range(10).interleave(lambda x: Dataset.range(x), cycle_length=3)  # noqa: E731
    _, state = state_after(make, 4)
    broken = json.loads(json.dumps(state))
    broken["position"]["slots"] = broken["position"]["slots"][:2]
    with pytest.raises(ValueError, match="2 slots for a cycle of 3"):
        iter(make()).load_state_dict(broken)
    broken["position"]["slots"] += [None, None]
    broken["position"]["cycle"] = 4
    with pytest.raises(ValueError, match="its cycle_length is 4, this pipeline's 3"):
        iter(make()).load_state_dict(broken)


def test_an_interleave_over_a_generator_reads_on_and_says_why_it_cannot_save():
    def gen():
        yield from range(4)

    ds = Dataset.from_generator(gen, output_signature=None).interleave(lambda x: Dataset.range(x), cycle_length=2)
    assert len(list(ds)) == 6
    it = iter(ds)
    next(it)
    with pytest.raises(NotCheckpointableError, match="from_generator"):
        it.state_dict()
    pit = iter(Dataset.from_generator(gen, output_signature=None).prefetch(2))
    next(pit)
    with pytest.raises(NotCheckpointableError, match="from_generator"):
        pit.state_dict()
    pit.close()


# --- zip and concatenate --------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: Dataset.zip(Dataset.range(100), Dataset.range(100).map(lambda x: x * 2)),
    lambda: Dataset.zip({"a": Dataset.range(60), "b": {"c": Dataset.range(5, 90).map(lambda x: (x, -x)),
                                                        "d": (Dataset.range(70),)}}),
    lambda: Dataset.zip(Dataset.range(50)),
    lambda: Dataset.zip(Dataset.range(80).shuffle(10, seed=2), Dataset.range(80).prefetch(3)),
], ids=["pair", "nested-dict", "single", "shuffle-prefetch"])
def test_zip_resumes(make):
    assert_resumes(make)


@pytest.mark.parametrize("make", [
    lambda: Dataset.range(40).concatenate(Dataset.range(100, 130)),
    lambda: Dataset.range(0).concatenate(Dataset.range(5)),
    lambda: Dataset.range(20).map(lambda x: x * 2).concatenate(Dataset.range(10).map(lambda x: x + 1)),
    lambda: Dataset.range(15).shuffle(5, seed=1).concatenate(Dataset.range(7).shuffle(4, seed=2)).repeat(2),
], ids=["ranges", "empty-first", "lazy-specs", "shuffles-repeated"])
def test_concatenate_resumes_with_cuts_in_each_part(make):
    n = len(list(make()))
    assert_resumes(make, cuts=range(n + 1))


def test_a_restored_concatenate_still_checks_the_second_inputs_first_element():
    make = lambda: Dataset.range(3).map(lambda x: x).concatenate(Dataset.range(3).map(lambda x: str(x)))  # noqa
    with pytest.raises(TypeError, match="Incompatible"):
        list(make())
    for cut in (1, 2, 3):  # the first input's spec learnt before the cut; the check comes after it
        _, state = state_after(make, cut)
        it = iter(make())
        it.load_state_dict(state)
        assert [int(next(it)) for _ in range(3 - cut)] == list(range(cut, 3))
        with pytest.raises(TypeError, match="Incompatible"):
            next(it)


# --- combinations and threads ---------------------------------------------------------------------------

def test_combined_pipeline_resumes():
    make = lambda: Dataset.zip(  # noqa: E731
        Dataset.range(30).interleave(lambda x: Dataset.range(x % 4), cycle_length=2, num_parallel_calls=2),
        Dataset.range(1000).shuffle(7, seed=3)).prefetch(2).concatenate(Dataset.range(5).map(lambda x: (x, x)))
    assert_resumes(make, cuts=range(0, 50, 3))


def _pipeline_threads():
    return [t for t in threading.enumerate() if t.name.startswith(("dataservice-prefetch", "dataservice-interleave"))]


def _wait_no_threads(deadline_s=10.0):
    deadline = time.monotonic() + deadline_s
    while _pipeline_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    return _pipeline_threads()


@pytest.mark.parametrize("make", [
    lambda: Dataset.range(10**6).map(lambda x: x + 1).prefetch(4),
    lambda: Dataset.range(100).interleave(lambda x: Dataset.range(10**5), cycle_length=3, num_parallel_calls=3),
    lambda: Dataset.range(100).interleave(lambda x: Dataset.range(10**5).prefetch(2), cycle_length=2,
                                          num_parallel_calls=2, deterministic=False),
], ids=["prefetch", "parallel-interleave", "nondeterministic-nested"])
def test_a_restored_iterator_leaves_no_threads_after_close_or_when_dropped(make):
    assert _wait_no_threads() == []
    _, state = state_after(make, 500)
    assert _wait_no_threads() == []
    it = iter(make())
    it.load_state_dict(state)
    assert [typed(next(it)) for _ in range(3)]
    assert _pipeline_threads()
    it.close()
    assert _wait_no_threads() == []
    dropped = iter(make())
    dropped.load_state_dict(state)
    next(dropped)
    del dropped  # collected unclosed: its finalizer stops the pumps
    assert _wait_no_threads() == []


def test_resumed_helper_closes_what_it_restored():
    _, state = state_after(lambda: Dataset.range(100).prefetch(3), 10)
    assert [x[2] for x in resumed(lambda: Dataset.range(100).prefetch(3), state, limit=5)] == [10, 11, 12, 13, 14]
    assert _wait_no_threads() == []


# --- errors and host differences -------------------------------------------------------------------------

def _until_error(it):
    out = []
    try:
        for x in it:
            out.append(typed(x))
    except ZeroDivisionError:
        return out, True
    return out, False


@pytest.mark.parametrize("parallel", [None, 2], ids=["sequential", "parallel"])
def test_an_input_error_after_the_cut_is_raised_again_at_its_place(parallel):
    make = lambda: Dataset.range(8).map(lambda x: int(x) // (int(x) - 5)).interleave(  # noqa: E731
        lambda x: Dataset.range(3).map(lambda y: y + 10 * x), cycle_length=2, num_parallel_calls=parallel)
    full, raised = _until_error(iter(make()))
    assert raised and full
    for k in range(len(full) + 1):
        head, state = state_after(make, k)
        it = iter(make())
        it.load_state_dict(state)
        rest, raised_again = _until_error(it)
        it.close()
        assert head + rest == full and raised_again, f"cut {k}"


def test_an_autotuned_cycle_restores_on_a_host_of_another_core_count(monkeypatch):
    from dataservice.data.transformations import combining

    make = lambda: Dataset.range(12).interleave(lambda x: Dataset.range(x % 5), block_length=2)  # noqa: E731
    monkeypatch.setattr(combining, "default_parallelism", lambda: 3)
    full = [typed(x) for x in make()]
    head, state = state_after(make, 7)
    assert len(state["position"]["slots"]) == 3
    monkeypatch.setattr(combining, "default_parallelism", lambda: 5)
    assert head + resumed(make, state) == full


@pytest.mark.parametrize("make, key, value, message", [
    (lambda: Dataset.zip(Dataset.range(5), Dataset.range(5)), None, [{"chunk": 0, "offset": 1}],
     "a list of 2 input positions"),
    (lambda: Dataset.range(5).concatenate(Dataset.range(5)), "index", 3, "'index' must be 0, 1 or 2"),
    (lambda: Dataset.range(5).concatenate(Dataset.range(5)), "seen", [1], "'seen' must be two booleans"),
    (lambda: Dataset.range(9).interleave(lambda x: Dataset.range(x), cycle_length=2, block_length=2), "in_block", 2,
     "2 elements into its block of 2"),
    (lambda: Dataset.range(9).prefetch(2), "skip", "x", "'skip' must be int"),
], ids=["zip", "concatenate-index", "concatenate-seen", "interleave-block", "prefetch"])
def test_malformed_positions_are_value_errors_naming_the_field(make, key, value, message):
    _, state = state_after(make, 1)
    if key is None:
        state["position"] = value
    else:
        state["position"][key] = value
    with pytest.raises(ValueError, match=message):
        iter(make()).load_state_dict(state)


def test_read_ahead_records_of_a_costly_input_state_are_paced():
    # A shuffle's state holds its buffer (encoded): recorded every 64 reads by the prefetch's marks, it
    # would cost more than the reading; paced, its records are few, and the resumption is still exact.
    from dataservice.data.transformations import reordering

    saves = []
    original = reordering._ShuffleIterator.save

    def counted(self):
        saves.append(1)
        return original(self)

    make = lambda: Dataset.range(40_000).shuffle(5_000, seed=1).prefetch(4)  # noqa: E731
    reordering._ShuffleIterator.save = counted
    try:
        it = iter(make())
        for _ in range(30_000):
            next(it)
        it.close()
    finally:
        reordering._ShuffleIterator.save = original
    assert len(saves) < 30_000 // 64 // 2
    assert_resumes(make, cuts=[12_345])


def test_read_ahead_records_do_not_pile_up_when_no_state_is_asked_for():
    # The marks behind what the consumer took are dropped as it goes, not only by save().
    it = iter(Dataset.range(10**6).prefetch(8))
    for _ in range(200_000):
        next(it)
    assert len(it._it._rewind._marks) < 4096 // 64 + 4
    it.close()
    pit = iter(Dataset.range(2).interleave(lambda x: Dataset.range(10**6), cycle_length=2, num_parallel_calls=2))
    for _ in range(200_000):
        next(pit)
    assert all(len(slot.rewind._marks) < 4096 // 64 + 4 for slot in pit._it._slots)
    pit.close()
