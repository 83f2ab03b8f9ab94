"""Split sizing (issue 28): a small, batched dataset gives every worker splits; a large cheap one keeps
big splits; a group of whole splits never ends in a partial batch; the sizing reads the pipeline only, so
a registered dataset's grouping does not depend on the cluster, and an older registration keeps its own.

Example::

    >>> Dataset.from_tensor_slices(np.arange(200)).map(f).batch(32).num_splits()   # 7 splits of 32
    7
"""

from __future__ import annotations

import math
import os
import threading
import time

import cloudpickle
import numpy as np
import pytest

from dataservice import Dataset, distribute
from dataservice.data import sources
from dataservice.data.sources import MAX_SPLIT_ELEMENTS, split_size_for
from tests.cluster import TestCluster, run_with_deadline

#: How long a task of the gated pipeline waits for the other worker's task before going on alone.
GATE_S = 20.0
READ_TIMEOUT_S = 60.0


def plus_one(x):
    return x + 1


def gated_on_two_tasks(marker_dir: str):
    """A map function that records the task thread it runs in (a file per thread in ``marker_dir``) and holds
    its element until two task threads have been seen, or ``GATE_S`` passed. With a single split group, one
    task runs the whole epoch and the gate only delays it; with several, the second worker's task arrives."""

    def gate(x):
        name = threading.current_thread().name
        marker = os.path.join(marker_dir, name)
        if not os.path.exists(marker):
            with open(marker, "w"):
                pass
        deadline = time.monotonic() + GATE_S
        while len(os.listdir(marker_dir)) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)  # a poll with a deadline: the other task is on another worker
        return x + 1

    return gate


def flat(batches) -> list:
    return [int(v) for batch in batches for v in np.asarray(batch).ravel()]


# --- the sizes ------------------------------------------------------------------------------------------------

def test_split_size_is_a_whole_number_of_units_within_bounds():
    assert split_size_for(200) == 256                      # unbatched: as before
    assert split_size_for(200, unit=32) == 32              # one batch per split
    assert split_size_for(2_000, unit=32) == 32            # 63 splits
    assert split_size_for(10_000, unit=32) == 256          # about TARGET_SPLITS splits
    assert split_size_for(10**6, unit=32) == MAX_SPLIT_ELEMENTS
    assert split_size_for(10**6, unit=100) == 3_200        # 100 * 2^k, at most MAX_SPLIT_ELEMENTS
    assert split_size_for(300, unit=5_000) == 5_000        # one batch larger than the cap: one batch
    assert split_size_for(200, unit=2) == sources.MIN_BATCHED_SPLIT_ELEMENTS
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="unit"):
            split_size_for(100, unit=bad)


def test_a_small_batched_dataset_has_a_split_per_batch():
    ds = Dataset.from_tensor_slices(np.arange(200)).map(plus_one).batch(32)
    assert ds.num_splits() == 7
    groups = ds.split_groups()
    assert groups.num_groups == 7 and groups.splits(0) == range(0, 1)


def test_a_large_cheap_range_keeps_big_splits():
    n = 10**6
    for ds in (Dataset.range(n).map(plus_one), Dataset.range(n).map(plus_one).batch(32)):
        assert ds.num_splits() == math.ceil(n / MAX_SPLIT_ELEMENTS)
    assert len(list(Dataset.range(n).batch(32).iterate_splits([0]))) == MAX_SPLIT_ELEMENTS // 32


@pytest.mark.parametrize("n", [200, 400, 2_000, 100_000])
@pytest.mark.parametrize("batch", [32, 100])
def test_no_group_ends_in_a_partial_batch(n, batch):
    ds = Dataset.from_tensor_slices(np.arange(n)).map(plus_one).batch(batch)
    groups = ds.split_groups()
    assert groups.num_groups >= min(4, n // batch)
    produced = []
    for g in range(groups.num_groups):
        sizes = [len(b) for b in ds.iterate_split_group(g)]
        last_group = g == groups.num_groups - 1
        assert all(size == batch for size in (sizes if not last_group else sizes[:-1])), (g, sizes)
        produced.extend(sizes)
    assert sum(produced) == n
    assert len(produced) == math.ceil(n / batch)  # the one partial batch is the dataset's last


def test_nested_batches_size_splits_by_their_product():
    ds = Dataset.range(1_000).batch(4).map(lambda b: b).batch(8)
    assert ds.num_splits() == math.ceil(1_000 / 32)
    assert [np.asarray(b).shape for b in ds.iterate_splits([0])] == [(8, 4)]


def test_a_batch_above_an_interleave_does_not_size_the_file_names():
    names = Dataset.from_tensor_slices(np.array([f"f{i}" for i in range(40)]))
    ds = names.interleave(lambda name: Dataset.from_tensors(name).repeat(3), cycle_length=2).batch(32)
    assert ds.num_splits() == 1  # 40 names under the 256 floor: the batch counts lines, not names


def test_a_source_shared_by_two_pipelines_is_sized_for_each_and_left_as_it_was():
    source = Dataset.range(200)
    by_32 = source.map(plus_one).batch(32)
    by_100 = source.batch(100)
    assert (by_32.num_splits(), by_100.num_splits(), source.num_splits()) == (7, 2, 1)
    assert source._split_size == 256
    # The order they are asked in changes nothing.
    assert (Dataset.range(200).batch(100).num_splits(), by_32.num_splits()) == (2, 7)


def test_determinism_over_groups_equals_the_pipeline():
    ds = Dataset.from_tensor_slices(np.arange(2_000)).map(plus_one).filter(lambda x: x % 7 != 0).batch(32)
    groups = ds.split_groups()
    over_groups = [b for g in range(groups.num_groups) for b in ds.iterate_split_group(g)]
    assert flat(over_groups) == flat(ds)


def test_a_registration_from_before_keeps_its_grouping():
    # A source pickled by a dataservice without pipeline sizing has no _split_by_pipeline: its size is
    # the one it was registered with, and the registered count of groups reads as it was meant.
    ds = Dataset.from_tensor_slices(np.arange(200)).map(plus_one).batch(32)
    old = cloudpickle.loads(cloudpickle.dumps(ds))
    source = old._input._input
    assert isinstance(source, sources.TensorSlicesDataset)
    del source._split_by_pipeline
    assert old.split_groups(1).num_groups == 1 and old.num_splits() == 1
    assert [len(b) for b in old.iterate_split_group(0, 1)] == [32] * 6 + [8]
    # The new registration, read back by a worker (a fresh unpickle), derives its own 7 groups.
    new = cloudpickle.loads(cloudpickle.dumps(ds))
    assert new.split_groups(7).num_groups == 7
    assert [len(b) for b in new.iterate_split_group(6, 7)] == [8]


# --- on a cluster -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "dynamic"])
def test_a_200_element_batched_dataset_gives_both_workers_splits(deterministic, tmp_path):
    pipeline = Dataset.from_tensor_slices(np.arange(200)).map(gated_on_two_tasks(str(tmp_path))).batch(32)
    with TestCluster(num_workers=2) as cluster:
        cluster.wait_for_workers(2)
        ds = pipeline.apply(distribute("distributed_epoch", cluster.target, deterministic=deterministic))
        started = time.monotonic()

        def read() -> tuple:
            it = iter(ds)
            first = np.asarray(next(it))
            # The first batch passed the gate: both tasks hold a split now (not after the epoch, when the
            # finished iteration's tasks may be gone).
            core = cluster.dispatcher.core
            with core._cond:
                leased = {task.worker_address for task in core.state.tasks.values() if task.last_splits}
            return [first] + [np.asarray(b) for b in it], leased

        batches, assigned = run_with_deadline(read, READ_TIMEOUT_S)
        elapsed = time.monotonic() - started
        core = cluster.dispatcher.core
        with core._cond:
            events = list(core.events)
    got = flat(batches)
    assert sorted(got) == list(range(1, 201))  # every element exactly once
    if deterministic:
        assert got == flat(pipeline)
    assert sorted(len(b) for b in batches) == [8] + [32] * 6  # no partial batch but the dataset's last
    # The dispatcher assigned splits to a task on each worker.
    workers = {fields["worker"] for kind, fields in events if kind == "create_task"}
    assert len(workers) == 2 and assigned == workers, (assigned, workers)
    tasks_seen = [name for name in os.listdir(tmp_path) if name.startswith("dataservice-task-")]
    assert len(tasks_seen) == 2, os.listdir(tmp_path)  # both tasks ran the pipeline
    assert elapsed < GATE_S  # neither task waited out the gate alone
