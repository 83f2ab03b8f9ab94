"""distributed_epoch runs a worker's pipeline over a *group* of consecutive splits, so that interleave
and shuffle span splits (files), and recovers a lost worker's groups exactly once.

The grouping itself (``Dataset.split_groups``), what the service measurably does with it (one worker
reading 16 files interleaved 4 at a time; a shuffle buffer spanning splits), and exactly-once under a
worker lost mid-epoch: in-process (TestCluster) and with real processes killed -9 (marked slow).
"""

from __future__ import annotations

import collections
import re

import pytest

from dataservice import Dataset, Options, TFRecordDataset, distribute
from dataservice.data import dataset as dataset_module
from dataservice.data import sources
from dataservice.data.options import DistributeOptions
from dataservice.service.dispatcher_client import DispatcherClient
from tests.cluster import TestCluster, run_with_deadline
from tests.elements import values
from tests.processes import (RECORD_FILE_STRIDE, BackgroundReader, Processes, decode_record,
                             interleaved_shuffled_records, wait_for_workers, write_record_files)

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

NUM_FILES = 16
RECORDS_PER_FILE = 1_000
#: The longest a service read here may take.
READ_TIMEOUT_S = 60.0


@pytest.fixture
def record_files(tmp_path) -> str:
    return write_record_files(tmp_path, NUM_FILES, RECORDS_PER_FILE)


def every_record(num_files: int = NUM_FILES, per_file: int = RECORDS_PER_FILE) -> list[int]:
    return [f * RECORD_FILE_STRIDE + k for f in range(num_files) for k in range(per_file)]


def assert_exactly_once(items: list[int], expected: list[int]) -> None:
    counts, wanted = collections.Counter(items), set(expected)
    missing = sorted(wanted - set(counts))
    extra = sorted((k, v) for k, v in counts.items() if v > 1 or k not in wanted)
    assert not missing and not extra, (f"{len(items)} elements, {len(expected)} expected: {len(missing)} missing "
                                       f"(first {missing[:10]}), {len(extra)} extra (first {extra[:10]})")


def with_group_size(ds: Dataset, size: int) -> Dataset:
    opts = Options()
    opts.experimental_distribute.split_group_size = size
    return ds.with_options(opts)


# --- the grouping ------------------------------------------------------------------------------

def test_interleave_groups_as_many_files_as_its_cycle(record_files):
    ds = Dataset.list_files(record_files).interleave(TFRecordDataset, cycle_length=4)
    groups = ds.split_groups()
    assert ds.num_splits() == NUM_FILES  # splits are still files
    assert (groups.num_groups, groups.group_size) == (4, 4)
    assert [groups.splits(g) for g in range(4)] == [range(0, 4), range(4, 8), range(8, 12), range(12, 16)]
    # The group is what a worker reads: its four files interleaved, one record of each in turn.
    first = [decode_record(r) for r in values(ds.iterate_split_group(1))][:8]
    assert [x // RECORD_FILE_STRIDE for x in first] == [4, 5, 6, 7, 4, 5, 6, 7]


def test_group_size_comes_from_the_pipeline(tmp_path):
    split = sources.split_size_for(20_000)  # 512: 40 splits
    plain = Dataset.range(20_000).map(lambda x: x)
    assert plain.split_groups().group_size == 1  # nothing spans splits: one split per group, as before
    # A shuffle buffer wants enough splits to fill it, capped to leave MIN_SPLIT_GROUPS groups.
    assert Dataset.range(20_000).shuffle(2_000, seed=1).split_groups().group_size == -(-2_000 // split)
    capped = Dataset.range(20_000).shuffle(50_000, seed=1).split_groups()
    assert capped.num_groups == dataset_module.MIN_SPLIT_GROUPS and capped.group_size == 10
    # After a batch a split holds fewer elements, so the same buffer wants more splits.
    assert Dataset.range(20_000).batch(64).shuffle(20, seed=1).split_groups().group_size == 3
    # interleave's AUTOTUNE cycle counts as a fixed number of splits, whatever this host's cores.
    for i in range(64):
        (tmp_path / f"{i:02d}.txt").write_text("line\n")
    autotune = Dataset.list_files(str(tmp_path / "*.txt")).interleave(TFRecordDataset)
    assert autotune.split_groups().group_size == dataset_module.AUTOTUNE_CYCLE_SPLITS
    # A split of 256 names already fills a cycle of 4: nothing to span.
    names = Dataset.from_tensor_slices([f"f{i}" for i in range(2_000)])
    assert names.interleave(TFRecordDataset, cycle_length=4).split_groups().group_size == 1


def test_groups_cover_every_split_once_and_never_span_a_repeat():
    ds = Dataset.range(20_000).shuffle(5_000, seed=1).repeat(3)
    groups = ds.split_groups()
    n, per_pass = ds.num_splits(), groups.pass_splits
    assert (n, per_pass) == (120, 40)
    covered = [i for g in range(groups.num_groups) for i in groups.splits(g)]
    assert covered == list(range(n))
    for g in range(groups.num_groups):
        splits = groups.splits(g)
        assert len(splits) >= groups.group_size
        assert splits[0] // per_pass == splits[-1] // per_pass, f"group {g} spans two passes: {splits}"
    # Without end under repeat(): group g is in pass g // groups_per_pass.
    endless = Dataset.range(20_000).shuffle(5_000, seed=1).repeat().split_groups()
    assert endless.num_groups == -1
    assert endless.splits(4 * endless.groups_per_pass) == range(4 * 40, 4 * 40 + endless.group_size)


def test_groups_are_as_even_as_can_be():
    ds = with_group_size(Dataset.range(49 * 4096).map(lambda x: x), 12)
    groups = ds.split_groups()
    assert ds.num_splits() == 49 and groups.num_groups == 4
    assert [len(groups.splits(g)) for g in range(4)] == [12, 12, 12, 13]  # no short last group


def test_the_groups_in_order_are_the_pipeline():
    ds = Dataset.range(20_000).map(lambda x: x * 2).batch(8).shuffle(200, seed=3)
    groups = ds.split_groups()
    assert groups.num_groups > 1 and groups.group_size > 1
    parts = [values(ds.iterate_split_group(g)) for g in range(groups.num_groups)]
    flat = [int(x) for part in parts for batch in part for x in batch]
    assert sorted(flat) == list(range(0, 40_000, 2))
    # Batches and shuffles span the splits of a group, not two groups.
    size = groups.group_size * sources.split_size_for(20_000)
    for g, part in enumerate(parts):
        lo, hi = 2 * size * g, 2 * size * (g + 1)
        assert all(lo <= int(x) < hi for batch in part for x in batch)


def test_a_group_comes_out_the_same_every_time(record_files):
    ds = interleaved_shuffled_records(record_files, slow=False)
    groups = ds.split_groups()
    assert groups.num_groups == 4
    runs = [values(ds.iterate_split_group(2)) for _ in range(2)]
    assert runs[0] == runs[1]
    assert sorted(runs[0]) == [f * RECORD_FILE_STRIDE + k for f in range(8, 12) for k in range(RECORDS_PER_FILE)]
    assert runs[0] != sorted(runs[0])  # shuffled, reproducibly


def test_zip_and_concatenate_run_over_groups_like_any_pipeline():
    # A group is a run of the pipeline's own split indices: across concatenate's boundary it reads the
    # end of the first input and the start of the second; zip reads the same splits of each input.
    first = Dataset.range(7_680)
    concat = with_group_size(first.concatenate(Dataset.range(10**6, 10**6 + 10_240)), 4)
    groups = concat.split_groups()
    boundary = first.num_splits()
    assert any(groups.splits(g).start < boundary < groups.splits(g).stop for g in range(groups.num_groups))
    flat = [int(x) for g in range(groups.num_groups) for x in concat.iterate_split_group(g)]
    assert flat == values(concat)
    zipped = with_group_size(Dataset.zip((Dataset.range(10_000), Dataset.range(10_000).map(lambda x: -x))), 4)
    groups = zipped.split_groups()
    pairs = [(int(a), int(b)) for g in range(groups.num_groups) for a, b in zipped.iterate_split_group(g)]
    assert pairs == [(i, -i) for i in range(10_000)]


def test_the_registered_count_decides():
    ds = Dataset.range(20_000).shuffle(5_000, seed=1)
    n = ds.num_splits()
    # One split per group: how a dataset registered before groups existed is read.
    assert ds.split_groups(n).group_size == 1 and ds.split_groups(n).splits(7) == range(7, 8)
    assert ds.split_groups(3).splits(2) == range(26, 40)
    with pytest.raises(ValueError, match=r"registered with 41 split groups, which do not divide its 40 splits"):
        ds.split_groups(41)
    with pytest.raises(ValueError, match=r"registered with 0 split groups"):
        ds.split_groups(0)
    with pytest.raises(ValueError, match=r"registered with -1 split groups"):
        ds.split_groups(-1)
    with pytest.raises(ValueError, match=r"num_groups must be an int >= -1"):
        ds.split_groups("4")
    with pytest.raises(ValueError, match=r"group must be >= 0 and below 4, got 4"):
        ds.split_groups().splits(4)


def test_split_group_size_option_is_checked():
    opts = Options()
    for bad in (0, -1):
        with pytest.raises(ValueError, match="split_group_size must be >= 1 or None"):
            opts.experimental_distribute.split_group_size = bad
    for bad in (2.5, True, "4"):  # a wrong type is a TypeError, as in tf.data.Options
        with pytest.raises(TypeError, match="split_group_size must be an int or None"):
            opts.experimental_distribute.split_group_size = bad
    with pytest.raises(AttributeError, match="DistributeOptions has no option 'auto_shard'"):
        opts.experimental_distribute.auto_shard = 1
    with pytest.raises(TypeError, match="experimental_distribute must be a DistributeOptions"):
        opts.experimental_distribute = 4
    opts.experimental_distribute = DistributeOptions(split_group_size=2)
    later = Options()
    assert opts.merge(later).experimental_distribute.split_group_size == 2  # unset later: kept
    later.experimental_distribute.split_group_size = 5
    assert opts.merge(later).experimental_distribute.split_group_size == 5
    assert with_group_size(Dataset.range(20_000), 100).split_groups().num_groups == 1  # at most a pass


# --- what the service does with them ----------------------------------------------------------

@pytest.fixture
def one_worker():
    cluster = TestCluster(num_workers=1)
    try:
        yield cluster
    finally:
        cluster.stop()


def registered_num_splits(cluster: TestCluster) -> list[int]:
    return [d.num_splits for d in cluster.dispatcher.core.state.datasets.values()]


def registered_splits(dispatcher_port: int) -> list[int]:
    """The registered datasets' split counts, from a dispatcher process (GetStatus in this process)."""
    client = DispatcherClient(f"localhost:{dispatcher_port}", timeout_ms=10_000)
    try:
        return [d.num_splits for d in client.get_status(timeout_s=10).datasets]
    finally:
        client.close()


def test_one_worker_interleaves_four_files_in_its_first_hundred_elements(one_worker, record_files):
    ds = Dataset.list_files(record_files).interleave(TFRecordDataset, cycle_length=4).map(decode_record)
    iterator = iter(ds.apply(distribute("distributed_epoch", one_worker.target)))

    def read() -> list[int]:
        return [int(x) for x in iterator]

    items = run_with_deadline(read, READ_TIMEOUT_S)
    files = {x // RECORD_FILE_STRIDE for x in items[:100]}
    assert len(files) >= 4, f"the first 100 elements come from files {sorted(files)}"
    assert_exactly_once(items, every_record())
    assert registered_num_splits(one_worker) == [4]  # 16 files in 4 groups


def first_splits(ds: Dataset, cluster: TestCluster, k: int = 100) -> tuple[set[int], list[int]]:
    """The splits (of range(20,000)) among the first ``k`` elements a distributed_epoch read delivers, and
    every element it delivers."""
    iterator = iter(ds.apply(distribute("distributed_epoch", cluster.target)))
    items = run_with_deadline(lambda: [int(x) for x in iterator], READ_TIMEOUT_S)
    return {x // sources.split_size_for(20_000) for x in items[:k]}, items


def test_a_shuffle_before_distribute_mixes_several_splits(one_worker):
    mixed, items = first_splits(Dataset.range(20_000).shuffle(5_000, seed=1), one_worker)
    assert len(mixed) >= 4, f"the first 100 elements come from splits {sorted(mixed)}"
    assert sorted(items) == list(range(20_000))
    # One split per group, as before groups: a shuffle never leaves its split.
    alone, items = first_splits(with_group_size(Dataset.range(20_000).shuffle(5_000, seed=1), 1), one_worker)
    assert len(alone) == 1
    assert sorted(items) == list(range(20_000))


def test_groups_without_end_under_repeat(one_worker):
    ds = Dataset.range(2_000).shuffle(1_000, seed=2).repeat()
    assert ds.split_groups().group_size > 1
    iterator = iter(ds.apply(distribute("distributed_epoch", one_worker.target)).take(6_000))
    items = run_with_deadline(lambda: [int(x) for x in iterator], READ_TIMEOUT_S)
    # One worker takes the groups in order, and no group spans two passes: three whole passes.
    for p in range(3):
        assert sorted(items[2_000 * p:2_000 * (p + 1)]) == list(range(2_000))
    assert items[:2_000] != items[2_000:4_000]  # each pass's groups have their own seeds


# --- exactly once when a worker goes away mid-epoch ---------------------------------------------

@pytest.mark.parametrize("how", ["stop", "restart"])
def test_interleaved_shuffled_files_exactly_once_when_a_worker_goes_away(record_files, how):
    cluster = TestCluster(num_workers=2, worker_timeout_ms=1_000)
    try:
        ds = interleaved_shuffled_records(record_files)
        iterator = iter(ds.apply(distribute("distributed_epoch", cluster.target, max_outstanding_requests=16)))
        total = NUM_FILES * RECORDS_PER_FILE
        seen = run_with_deadline(lambda: [int(next(iterator)) for _ in range(total // 4)], READ_TIMEOUT_S)
        # Worker 0 goes away holding a leased group part-read, and elements it buffered.
        if how == "stop":
            cluster.stop_worker(0)
        else:
            cluster.restart_worker(0)
        seen += run_with_deadline(lambda: [int(x) for x in iterator], READ_TIMEOUT_S)
        assert_exactly_once(seen, every_record())
        assert registered_num_splits(cluster) == [4]
        events = [kind for kind, _ in cluster.dispatcher.core.events]
        assert "revoke_task" in events
        assert "reassign_split" in events, "no group was redone: the loss did not land mid-group"
    finally:
        cluster.stop()


@pytest.mark.slow
def test_interleaved_shuffled_files_exactly_once_when_a_worker_is_killed(procs: Processes, tmp_path):
    """kill -9 of a worker process mid-epoch: its group is redone on the other worker, which skips
    what the client holds; the pipeline (tests/processes.py) is seeded, so the group comes out the same."""
    files, per_file = NUM_FILES, 2_000
    pattern = write_record_files(tmp_path, files, per_file)
    dispatcher = procs.dispatcher()
    workers = procs.workers(dispatcher.port, 2)
    wait_for_workers(dispatcher.port, [w.address for w in workers])
    reader = BackgroundReader(interleaved_shuffled_records(pattern).apply(
        distribute("distributed_epoch", dispatcher.target, max_outstanding_requests=16, timeout_ms=30_000)))
    total = files * per_file
    reader.wait_for(total // 4, READ_TIMEOUT_S)
    workers[0].proc.kill9()
    assert reader.count < total, "the read ended before the kill: make the pipeline slower"
    items = reader.join(READ_TIMEOUT_S)
    assert_exactly_once(items, every_record(files, per_file))
    assert registered_splits(dispatcher.port) == [4]  # 16 files in 4 groups
    revoked = re.findall(rf"revoked task \d+ on worker {re.escape(workers[0].address)}", dispatcher.proc.stderr)
    assert revoked, "the dispatcher never revoked the dead worker's task"
