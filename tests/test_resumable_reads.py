"""Issue 27 on an in-process cluster: the deterministic order of a distributed_epoch read, and saving and
restoring a read from the service (``state_dict``/``load_state_dict`` of an iterator over ``distribute``).

- ``deterministic=True`` gives the split groups' elements in group index order whatever the number of workers
  and their speed (a map sleeping a random 0-1 ms per element): for map and filter that is the local order.
- A state taken at any cut, through JSON, restored in a fresh iterator continues the same sequence
  (deterministic) or delivers the rest of the epoch exactly once (dynamic), with transformations after
  ``distribute`` too; after a fault-tolerant dispatcher restart, and on a cluster with more or fewer workers.
- The state is positions, not elements: a few hundred bytes whatever the dataset's size.
- What cannot resume says so (NotCheckpointableError naming distributed_epoch); a state of another pipeline
  is refused.
- A restore at 80% of an epoch does not run the map over the first 80% again (the map's calls are counted:
  the workers run in this process).

Real gRPC servers on 127.0.0.1 (tests/cluster.py); every read is bounded by ``run_with_deadline``. The same
with real processes killed -9: tests/test_resumable_reads_processes.py.
"""

from __future__ import annotations

import collections
import json
import random
import threading
import time
from typing import Any, Callable, Iterator

import pytest

from dataservice import Dataset, distribute, errors, from_dataset_id, register_dataset
from dataservice.client.read_options import CrossTrainerCache
from tests.checkpoints import hashable, typed
from tests.cluster import TestCluster, run_with_deadline, wait_until
from tests.resumable_trainer import CALLS_FILE_ENV, count_call

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

#: The longest one read (or one restore and the read of its tail) may take here.
READ_TIMEOUT_S = 30.0
#: Elements of ``Dataset.range``: 6 splits of 256, so 6 split groups.
N = 1536
GROUP_ELEMENTS = 256


# --- pipeline functions (module level: the in-process workers run them in this process) ------------------

def jitter(x):
    """``x``, after a random 0-1 ms on a worker: workers finish elements, and groups, in an order of their own.
    No delay on the test's main thread, where the local runs the reads are compared with iterate."""
    if threading.current_thread() is not threading.main_thread():
        time.sleep(random.random() * 0.001)
    return x


def double(x):
    return x * 2


def not_multiple_of_3(x) -> bool:
    return x % 3 != 0


def counted(x):
    """``x``, its call counted in the file $DATASERVICE_TEST_MAP_CALLS_FILE (``resumable_trainer.count_call``)."""
    count_call()
    return x


# --- helpers ---------------------------------------------------------------------------------------------

def read_all(dataset: Any, timeout_s: float = READ_TIMEOUT_S) -> list:
    """Every element of one iteration, as comparable plain data; AssertionError if it hangs."""
    return run_with_deadline(lambda: [typed(x) for x in dataset], timeout_s)


def take(it: Iterator, k: int, timeout_s: float = READ_TIMEOUT_S) -> list:
    return run_with_deadline(lambda: [typed(next(it)) for _ in range(k)], timeout_s)


def state_at(make: Callable[[], Any], k: int, exhaust: bool = False) -> tuple[list, dict]:
    """The first ``k`` elements of a fresh iterator and its state then, through JSON (``exhaust``: read to
    the StopIteration first, and take the state after it)."""
    it = iter(make())
    try:
        if exhaust:
            head = run_with_deadline(lambda: [typed(x) for x in it], READ_TIMEOUT_S)
        else:
            head = take(it, k)
        state = it.state_dict()
        # Taking the state twice gives the same state: taking it changes nothing.
        assert it.state_dict() == state
        return head, json.loads(json.dumps(state))
    finally:
        it.close()


def resumed(make: Callable[[], Any], state: dict) -> list:
    """What a fresh iterator restored at ``state`` yields to its end."""
    it = iter(make())
    try:
        it.load_state_dict(state)
        return run_with_deadline(lambda: [typed(x) for x in it], READ_TIMEOUT_S)
    finally:
        it.close()


def first_difference(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"index {i}: {x!r} != {y!r}"
    return f"lengths {len(a)} != {len(b)}"


def assert_same_sequence(got: list, want: list, what: str) -> None:
    assert got == want, f"{what}: {len(got)} elements vs {len(want)}; first difference at {first_difference(got, want)}"


def assert_exactly_once(got: list, want: list, what: str) -> None:
    have, need = collections.Counter(hashable(x) for x in got), collections.Counter(hashable(x) for x in want)
    assert have == need, (f"{what}: not exactly once: {len(got)} elements vs {len(want)}; repeated "
                          f"{sorted((have - need).elements())[:5]}, lost {sorted((need - have).elements())[:5]}")


def group_order(pipeline: Dataset) -> list:
    """The order issue 27 specifies for a deterministic read: the split groups' elements, group after group."""
    groups = pipeline.split_groups()
    return [typed(x) for g in range(groups.num_groups) for x in pipeline.iterate_split_group(g)]


def service_reader(it: Any) -> Any:
    """The IterationReader behind an iterator whose pipeline is a bare ``distribute`` (None before the first
    ``next()``)."""
    return it._it._reader


def untaken(reader: Any) -> int:
    """Elements the reader received that its consumer has not taken (the current answer's rest and the
    answers queued)."""
    with reader._out.mutex:  # the fetchers put answers meanwhile
        queued = sum(len(item[0]) for item in reader._out.queue if isinstance(item, tuple))
    return len(reader._current) - reader._pos + queued


@pytest.fixture(scope="module")
def one_worker():
    with TestCluster(num_workers=1) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def three_workers():
    with TestCluster(num_workers=3) as cluster:
        yield cluster


# --- 1. the deterministic order --------------------------------------------------------------------------

def _map() -> Dataset:
    return Dataset.range(N).map(jitter).map(double)


def _filter() -> Dataset:
    return Dataset.range(N).map(jitter).filter(not_multiple_of_3)


def _batch() -> Dataset:
    # 10 does not divide a group's 256 elements: every group ends in a partial batch, so the order is the
    # groups' batches, not the local run's.
    return Dataset.range(N).map(jitter).batch(10)


def _shuffle() -> Dataset:
    # A buffer of 600 spans 3 splits of 256: the groups hold 3 splits each (4 groups).
    return Dataset.range(3_000).shuffle(600, seed=1).map(jitter)


@pytest.mark.parametrize("make", [_map, _filter], ids=["map", "filter"])
def test_deterministic_order_of_a_per_element_pipeline_is_the_local_order(make, one_worker, three_workers):
    pipeline = make()
    local = [typed(x) for x in pipeline]
    assert pipeline.split_groups().num_groups > 1
    for cluster in (one_worker, three_workers):
        got = read_all(pipeline.apply(distribute("distributed_epoch", cluster.target, deterministic=True)))
        assert_same_sequence(got, local, f"{len(cluster.workers)} worker(s)")


@pytest.mark.parametrize("make", [_batch, _shuffle], ids=["batch", "shuffle"])
def test_deterministic_order_is_the_same_with_one_and_three_workers(make, one_worker, three_workers):
    pipeline = make()
    assert pipeline.split_groups().num_groups > 1, "the test needs several split groups"
    expected = group_order(pipeline)
    runs = {
        "1 worker": read_all(pipeline.apply(distribute("distributed_epoch", one_worker.target, deterministic=True))),
        "3 workers": read_all(pipeline.apply(distribute("distributed_epoch", three_workers.target,
                                                        deterministic=True))),
        # A second run, with a small window: groups held back for their turn must not starve the head's.
        "3 workers, max_outstanding_requests=8": read_all(pipeline.apply(distribute(
            "distributed_epoch", three_workers.target, deterministic=True, max_outstanding_requests=8))),
    }
    for what, got in runs.items():
        assert_same_sequence(got, expected, what)
    if make is _shuffle:  # the seed shuffles: the order is not just the input's
        assert [x[-1] for x in expected] != sorted(x[-1] for x in expected)


def test_dynamic_read_still_delivers_the_epoch_once(three_workers):
    """The default (dynamic) order: each element as soon as any worker has it, exactly once."""
    pipeline = _map()
    got = read_all(pipeline.apply(distribute("distributed_epoch", three_workers.target)))
    assert_exactly_once(got, [typed(x) for x in Dataset.range(N).map(double)], "dynamic read")


# --- 2. deterministic save and restore at every kind of cut ----------------------------------------------

AFTER = {
    "bare": lambda ds: ds,
    "map": lambda ds: ds.map(double),
    "batch4": lambda ds: ds.batch(4),
    "prefetch2": lambda ds: ds.prefetch(2),
}


@pytest.mark.parametrize("after", list(AFTER))
def test_deterministic_restore_continues_the_same_sequence(after, three_workers):
    def make() -> Dataset:
        read = Dataset.range(N).map(double).apply(distribute("distributed_epoch", three_workers.target,
                                                             deterministic=True))
        return AFTER[after](read)

    full = read_all(make())
    n = len(full)
    assert n > 4
    for k in sorted({0, 1, n // 2, n - 1, n}):
        head, state = state_at(make, k)
        assert_same_sequence(head, full[:k], f"head of cut {k}")
        assert_same_sequence(head + resumed(make, state), full, f"cut {k} of {n}")
    head, state = state_at(make, 0, exhaust=True)
    assert_same_sequence(head, full, "the uninterrupted run")
    assert resumed(make, state) == [], "a state taken after StopIteration restores an ended read"


def test_a_restored_read_saves_again_and_restores_again(three_workers):
    """A state taken from a restored iterator (the second trainer restart) continues the sequence too."""
    def make() -> Dataset:
        return Dataset.range(N).map(double).apply(distribute("distributed_epoch", three_workers.target,
                                                             deterministic=True))

    full = read_all(make())
    head, state = state_at(make, 300)
    it = iter(make())
    try:
        it.load_state_dict(state)
        assert json.loads(json.dumps(it.state_dict())) == state, "a restored, unread iterator saves what it loaded"
        middle = take(it, 700)
        second = json.loads(json.dumps(it.state_dict()))
    finally:
        it.close()
    assert_same_sequence(head + middle + resumed(make, second), full, "two restores")


# --- 3. dynamic mode: exactly once ------------------------------------------------------------------------

def test_dynamic_restore_is_exactly_once_with_received_but_untaken_elements(three_workers):
    def make() -> Dataset:
        return Dataset.range(N).map(jitter).apply(distribute("distributed_epoch", three_workers.target))

    epoch = [typed(x) for x in Dataset.range(N)]
    for k in (0, N // 3, N - 1):
        head, state = state_at(make, k)
        assert_exactly_once(head + resumed(make, state), epoch, f"cut {k}")

    # A cut while the reader holds what its consumer has not taken: those must come again after the restore.
    it = iter(make())
    try:
        head = take(it, 500)
        reader = service_reader(it)
        wait_until(lambda: untaken(reader) > 0, 10, "the reader to hold elements not taken yet")
        held = untaken(reader)
        state = json.loads(json.dumps(it.state_dict()))
    finally:
        it.close()
    tail = resumed(make, state)
    assert len(tail) == N - 500, f"{held} received but untaken elements: the tail has {len(tail)}, not {N - 500}"
    assert_exactly_once(head + tail, epoch, f"cut 500, {held} elements held")


def test_dynamic_restore_is_exactly_once_with_a_prefetch_after_distribute(three_workers):
    def make() -> Dataset:
        return Dataset.range(N).map(jitter).apply(distribute("distributed_epoch", three_workers.target)).prefetch(4)

    epoch = [typed(x) for x in Dataset.range(N)]
    for k in (1, 700, N - 1):
        it = iter(make())
        try:
            head = take(it, k)
            # A state taken with the prefetch's buffer full: what it holds is not lost with it.
            pump = it._it._pump
            wait_until(lambda: len(pump.buffered()) >= min(4, N - k), 10, "the prefetch to fill its buffer")
            state = json.loads(json.dumps(it.state_dict()))
        finally:
            it.close()
        assert_exactly_once(head + resumed(make, state), epoch, f"prefetch(4), cut {k}")


# --- 4. the state is small ---------------------------------------------------------------------------------

def test_deterministic_state_is_at_most_4_kib_whatever_the_dataset(three_workers):
    pipeline = Dataset.range(8_000_000).filter(not_multiple_of_3)
    groups = pipeline.split_groups().num_groups
    assert groups >= 1_000, groups

    def make() -> Dataset:
        return pipeline.apply(distribute("distributed_epoch", three_workers.target, deterministic=True))

    sizes = {}
    for k in (0, 1, 2_730, 2_731, 20_000):
        _, state = state_at(make, k)
        sizes[k] = len(json.dumps(state))
    # Restored far into the epoch, read on and saved again: still one range of done groups and one offset.
    _, state = state_at(make, 5_000)
    it = iter(make())
    try:
        it.load_state_dict(state)
        take(it, 12_345)
        sizes["restored + 12345"] = len(json.dumps(it.state_dict()))
    finally:
        it.close()
    assert all(size <= 4096 for size in sizes.values()), sizes
    assert max(sizes.values()) < 512, sizes  # positions, not elements: a few hundred bytes at most


# --- 5. refusals --------------------------------------------------------------------------------------------

def _assert_refuses_state(dataset: Dataset) -> None:
    it = iter(dataset)
    try:
        take(it, 3)
        with pytest.raises(errors.NotCheckpointableError, match="distributed_epoch"):
            it.state_dict()
        fresh = iter(dataset)
        try:  # not a state either before the first element
            with pytest.raises(errors.NotCheckpointableError, match="distributed_epoch"):
                fresh.state_dict()
        finally:
            fresh.close()
    finally:
        it.close()


def test_parallel_epochs_refuses_to_save(one_worker):
    _assert_refuses_state(Dataset.range(100).apply(distribute("parallel_epochs", one_worker.target)))


def test_coordinated_reads_refuse_to_save(one_worker):
    _assert_refuses_state(Dataset.range(1_000).repeat().apply(distribute(
        "parallel_epochs", one_worker.target, job_name="coordinated", consumer_index=0, num_consumers=1)))


def test_cross_trainer_cache_refuses_to_save(one_worker):
    _assert_refuses_state(Dataset.range(1_000).repeat().apply(distribute(
        "distributed_epoch", one_worker.target, job_name="cached", cross_trainer_cache=CrossTrainerCache("t1"))))


def test_not_checkpointable_error_is_a_value_error():
    assert issubclass(errors.NotCheckpointableError, ValueError)


@pytest.mark.parametrize("mode", ["parallel_epochs", "shard_data"])
def test_deterministic_needs_distributed_epoch(mode, one_worker):
    with pytest.raises(ValueError, match="distributed_epoch"):
        Dataset.range(10).apply(distribute(mode, one_worker.target, deterministic=True))
    dataset_id = register_dataset(one_worker.target, Dataset.range(10))
    with pytest.raises(ValueError, match="distributed_epoch"):
        from_dataset_id(mode, one_worker.target, dataset_id, deterministic=True)


def test_state_of_another_pipeline_is_refused(one_worker):
    def read(pipeline: Dataset, deterministic: bool = True) -> Dataset:
        return pipeline.apply(distribute("distributed_epoch", one_worker.target, deterministic=deterministic))

    _, state = state_at(lambda: read(Dataset.range(N).map(double)), 10)
    for other, what in [(read(Dataset.range(N).map(jitter)), "another map function"),
                        (read(Dataset.range(N + 1).map(double)), "another source"),
                        (read(Dataset.range(N).map(double), deterministic=False), "the dynamic order")]:
        it = iter(other)
        try:
            with pytest.raises(ValueError):
                it.load_state_dict(state)
        finally:
            it.close()
    # ... and the same pipeline, built again, takes it.
    it = iter(read(Dataset.range(N).map(double)))
    try:
        it.load_state_dict(state)
        assert int(run_with_deadline(lambda: next(it), READ_TIMEOUT_S)) == 20
    finally:
        it.close()


def test_malformed_positions_are_refused(one_worker):
    def make() -> Dataset:
        return Dataset.range(N).apply(distribute("distributed_epoch", one_worker.target, deterministic=True))

    _, state = state_at(make, 300)
    for bad in ({"done": [3, 1]}, {"done": [0]}, {"partial": [["x", [0, 3]]]}, {"partial": {"0": [0, 3]}},
                {"position": -1}, {"seeks": [[0, 1, "{}"]]}):
        broken = json.loads(json.dumps(state))
        broken["position"].update(bad)
        it = iter(make())
        try:
            with pytest.raises(ValueError, match="malformed"):
                it.load_state_dict(broken)
        finally:
            it.close()


def test_a_position_over_other_split_groups_is_refused(one_worker):
    """A position names split groups by index: a state counting other groups than the pipeline's is refused,
    by the client when it has the pipeline and by the dispatcher when it has not (from_dataset_id)."""
    pipeline = Dataset.range(200).batch(32)  # 7 groups of one batch each

    def make() -> Dataset:
        return pipeline.apply(distribute("distributed_epoch", one_worker.target, deterministic=True))

    head, state = state_at(make, 2)
    assert state["position"]["groups"] == pipeline.split_groups().num_groups == 7
    other = json.loads(json.dumps(state))
    other["position"]["groups"] = 5
    it = iter(make())
    try:
        with pytest.raises(ValueError, match=r"counts 5 split group\(s\), and the pipeline read now has 7"):
            it.load_state_dict(other)
    finally:
        it.close()
    # Saved before the count was saved, when this batched pipeline was one group of 256-element splits.
    legacy = json.loads(json.dumps(state))
    del legacy["position"]["groups"]
    it = iter(make())
    try:
        with pytest.raises(ValueError, match=r"saved by an older dataservice, which cut this pipeline into 1 split "
                                             r"group\(s\); this version cuts it into 7"):
            it.load_state_dict(legacy)
    finally:
        it.close()
    # The dispatcher refuses a count other than the registered dataset's (from_dataset_id has no pipeline to
    # check, and saves -1: not known).
    dataset_id = register_dataset(one_worker.target, pipeline)

    def make_from_id() -> Dataset:
        return from_dataset_id("distributed_epoch", one_worker.target, dataset_id, deterministic=True,
                               element_spec=pipeline.element_spec)

    _, by_id = state_at(make_from_id, 2)
    assert by_id["position"]["groups"] == -1
    by_id["position"]["groups"] = 5
    it = iter(make_from_id())
    try:
        it.load_state_dict(by_id)
        with pytest.raises(errors.InvalidRequestError, match="position counts 5 split groups, and dataset"):
            run_with_deadline(lambda: next(it), READ_TIMEOUT_S)
    finally:
        it.close()
    # The true count goes through both ways and continues the sequence.
    assert_same_sequence(head + resumed(make, state), read_all(make()), "restored with its groups")


def test_a_position_saved_before_the_count_restores_where_the_groups_did_not_change(one_worker):
    def make() -> Dataset:
        return Dataset.range(N).map(double).apply(distribute("distributed_epoch", one_worker.target,
                                                             deterministic=True))

    head, state = state_at(make, 300)
    del state["position"]["groups"]  # as an older dataservice saved it: unbatched splits are sized as then
    assert_same_sequence(head + resumed(make, state), read_all(make()), "restored from an older state")


# --- 6. the cluster changed between save and restore ---------------------------------------------------

def test_restore_after_a_fault_tolerant_dispatcher_restart(tmp_path):
    with TestCluster(num_workers=2, fault_tolerant_mode=True, work_dir=str(tmp_path / "journal")) as cluster:
        def make() -> Dataset:
            return Dataset.range(N).map(jitter).apply(distribute("distributed_epoch", cluster.target,
                                                                 deterministic=True))

        full = [typed(x) for x in Dataset.range(N)]
        head, state = state_at(make, 400)
        cluster.restart_dispatcher()
        cluster.wait_for_workers(2)
        it = iter(make())
        try:
            it.load_state_dict(state)
            middle = take(it, 500)
            # The restored job's start is journaled: a restart in the middle of the restored read keeps it.
            cluster.restart_dispatcher()
            rest = run_with_deadline(lambda: [typed(x) for x in it], READ_TIMEOUT_S)
        finally:
            it.close()
        assert_same_sequence(head + middle + rest, full, "restored across two dispatcher restarts")


def test_restore_on_a_cluster_with_a_worker_added_or_removed():
    with TestCluster(num_workers=1) as cluster:
        def make() -> Dataset:
            return Dataset.range(N).map(jitter).apply(distribute("distributed_epoch", cluster.target,
                                                                 deterministic=True))

        full = [typed(x) for x in Dataset.range(N)]
        head, state = state_at(make, 600)
        cluster.add_worker()
        cluster.wait_for_workers(2)
        assert_same_sequence(head + resumed(make, state), full, "restored with a worker added")

        head, state = state_at(make, 1_000)
        lost = cluster.workers[0].address
        cluster.stop_worker(0)
        # Restored once the dispatcher counts the worker out (a task on a worker stopped but not yet declared
        # lost is another matter: see the report of issue 27's tests).
        core = cluster.dispatcher.core
        wait_until(lambda: core._worker_lost(lost), 10, "the dispatcher to declare the stopped worker lost")
        assert_same_sequence(head + resumed(make, state), full, "restored with a worker gone")


def test_restore_on_another_cluster():
    """The state names no address: a trainer restarted elsewhere restores it on the cluster it finds."""
    pipeline = Dataset.range(N).map(double)
    with TestCluster(num_workers=2) as first:
        full = read_all(pipeline.apply(distribute("distributed_epoch", first.target, deterministic=True)))
        head, state = state_at(lambda: pipeline.apply(distribute("distributed_epoch", first.target,
                                                                 deterministic=True)), 777)
    with TestCluster(num_workers=3) as second:
        tail = resumed(lambda: pipeline.apply(distribute("distributed_epoch", second.target, deterministic=True)),
                       state)
    assert_same_sequence(head + tail, full, "restored on another cluster")


# --- 7. no replay ----------------------------------------------------------------------------------------

NO_REPLAY_GROUPS = 10


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "dynamic"])
def test_a_restore_at_80_percent_does_not_recompute_the_epoch(deterministic, tmp_path, monkeypatch):
    n = NO_REPLAY_GROUPS * GROUP_ELEMENTS
    pipeline = Dataset.range(n).map(counted)
    assert pipeline.split_groups().num_groups == NO_REPLAY_GROUPS
    cut = n * 8 // 10 + 37  # inside a group: its prefix is the most a worker may run again
    with TestCluster(num_workers=3) as cluster:
        head, state = state_at(lambda: pipeline.apply(distribute("distributed_epoch", cluster.target,
                                                                 deterministic=deterministic)), cut)
    # A cluster of its own for the restore: no task of the saved read is left to call the map.
    calls_file = tmp_path / "calls"
    with TestCluster(num_workers=3) as cluster:
        monkeypatch.setenv(CALLS_FILE_ENV, str(calls_file))
        tail = resumed(lambda: pipeline.apply(distribute("distributed_epoch", cluster.target,
                                                         deterministic=deterministic)), state)
    calls = calls_file.stat().st_size if calls_file.exists() else 0
    epoch = [typed(x) for x in Dataset.range(n)]
    if deterministic:
        assert_same_sequence(head + tail, epoch, f"cut {cut}")
    else:
        assert_exactly_once(head + tail, epoch, f"cut {cut}")
    remaining = n - cut
    partial_groups = len(state["position"]["partial"])
    assert partial_groups >= 1
    # Each group taken in part may be run again up to its taken offsets; nothing of the done groups is.
    bound = remaining + partial_groups * GROUP_ELEMENTS + 16
    assert calls <= bound, (f"the restore called the map {calls} times for {remaining} remaining elements "
                            f"({partial_groups} groups in part): the epoch ({n}) was recomputed")
    assert calls >= remaining
