"""tf.data service's own tests, ported as written (issue 25): dataset ids given as strings, job names
scoped by the dataset id read, element_spec checked against the registered one, coordinated reads and
the cross-trainer cache over pipelines of unknown cardinality, and distributed_save refusing a path
that already holds a save. Each test names the tf test it ports (tensorflow/python/data/experimental/
kernel_tests/service/) and keeps its element counts. Real in-process clusters (tests/cluster.py), and
for the journal, real JournaledStores and fault-tolerant dispatcher restarts."""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import threading
from typing import Optional

import numpy as np
import pytest

import dataservice as ds
from dataservice import Dataset, TensorSpec, errors
from dataservice.cli import format_status, status_as_dict
from dataservice.data.serialization import serialize_dataset
from dataservice.dispatcher import saves
from dataservice.dispatcher.core import DispatcherCore
from dataservice.dispatcher.journaled_store import JournaledStore
from dataservice.dispatcher.state import JobKey
from dataservice.proto import dispatcher_pb2 as pb
from dataservice.proto import state_pb2
from dataservice.service.config import DispatcherConfig
from dataservice.service.dispatcher_client import DispatcherClient
from tests.cluster import TestCluster, run_with_deadline, wait_until
from tests.journals import comparable
from tests.processes import wait_for_client_threads

DEADLINE_S = 60


def head(dataset: Dataset, n: Optional[int] = None) -> list:
    """The first ``n`` elements (all of them: None), read within the deadline. The iterator is closed then,
    even when reading raised, so that its readers stop now, not when the garbage collector finds them."""
    def take() -> list:
        it = iter(dataset)
        try:
            return list(itertools.islice(it, n))
        finally:
            it.close()

    return run_with_deadline(take, DEADLINE_S)


def values(dataset: Dataset) -> list[int]:
    """Every element of ``dataset`` as ints, read within the deadline."""
    return [int(x) for x in head(dataset)]


def jobs_named(cluster: TestCluster, job_name: str) -> dict:
    core = cluster.dispatcher.core
    with core._cond:
        return {key: job_id for key, job_id in core.state.jobs_by_key.items() if key.job_name == job_name}


# --- dataset ids as strings ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def one_worker():
    with TestCluster(num_workers=1) as cluster:
        yield cluster


def test_a_numeric_id_passed_as_a_str_reads_its_dataset(one_worker):
    # testPyStringDatasetId / testStringDatasetId: the id register_dataset returned, as a string.
    dataset = Dataset.range(10)
    dataset_id = ds.register_dataset(one_worker.target, dataset)
    reader = ds.from_dataset_id("parallel_epochs", one_worker.target, str(dataset_id), job_name="py_string_id")
    assert values(reader) == list(range(10))
    reader = ds.from_dataset_id(ds.ShardingPolicy.OFF, one_worker.target, str(dataset_id),
                                element_spec=dataset.element_spec)
    assert values(reader) == list(range(10))
    assert values(ds.from_dataset_id("parallel_epochs", one_worker.target, np.int64(dataset_id))) == list(range(10))


def test_an_all_digit_str_is_the_numeric_id_so_it_shares_the_int_readers_job(one_worker):
    # The str and the int name the same id: under one job_name they are one job, read first come first served.
    dataset_id = ds.register_dataset(one_worker.target, Dataset.range(10))
    by_int = ds.from_dataset_id("parallel_epochs", one_worker.target, dataset_id, job_name="digits")
    by_str = ds.from_dataset_id("parallel_epochs", one_worker.target, str(dataset_id), job_name="digits")
    assert values(by_int) == list(range(10))
    assert values(by_str) == []  # the job's iteration was read to its end by the other reader
    assert list(jobs_named(one_worker, "digits")) == [JobKey("digits", dataset_id, "")]


@pytest.mark.parametrize("bad, why", [
    ("0", "no numeric id is written so"),
    ("0042", "without leading zeros"),
    ("9" * 20, "no numeric id is written so"),
    (str(2 ** 63), "positive int64s"),
])
def test_digits_that_are_no_numeric_id_are_refused_when_called(bad, why):
    with pytest.raises(ValueError, match=why) as info:
        ds.from_dataset_id("parallel_epochs", "localhost:1", bad)
    assert repr(bad[:60]) in str(info.value)


def test_registering_under_an_all_digit_id_is_refused_since_it_names_a_numeric_id():
    # All digits is how numeric ids are written: a name of that form would make "123" mean two things.
    with pytest.raises(ValueError) as info:
        ds.register_dataset("localhost:1", Dataset.range(3), dataset_id="123")
    message = str(info.value)
    assert "dataset_id '123' is all digits, the form of the dispatcher's numeric ids" in message
    assert "from_dataset_id(..., dataset_id='123') reads the dataset whose numeric id that is" in message
    assert "'ds-123'" in message


# --- job names scoped by the dataset id read -----------------------------------------------------------

def test_from_dataset_id_shared_jobs(cluster):
    # testFromDatasetIdSharedJobs: two datasets under one job name, two readers of each, read at once
    # through one interleave: two jobs, every element once.
    dataset_ids = ["dataset_1", "dataset_2"]
    datasets = [Dataset.range(20).map(lambda x: np.int32(x), output_signature=TensorSpec((), np.int32)),
                Dataset.from_tensor_slices(list(range(20, 40)))]
    for dataset, dataset_id in zip(datasets, dataset_ids):
        assert ds.register_dataset(cluster.target, dataset, dataset_id=dataset_id) == dataset_id
    readers = [ds.from_dataset_id("distributed_epoch", cluster.target, dataset_id, dataset.element_spec,
                                  job_name="shared_job")
               for _ in range(2) for dataset, dataset_id in zip(datasets, dataset_ids)]
    together = Dataset.from_tensor_slices(readers).interleave(lambda x: x, cycle_length=len(readers))
    assert sorted(values(together)) == list(range(40))
    assert len(jobs_named(cluster, "shared_job")) == 2


@pytest.mark.parametrize("different_dataset_id", [None, "another_dataset_id"])
def test_different_dataset_ids_for_the_same_job_name_are_different_jobs(different_dataset_id):
    # testRegisterDifferentDatasetIds (testDifferentDatasetIdsForSameJob): one pipeline registered under two
    # ids (a name and the numeric id, or two names) is read under one job name as two jobs.
    with TestCluster(num_workers=1) as cluster:
        dataset_id1 = ds.register_dataset(cluster.target, Dataset.range(10), dataset_id="dataset_id")
        dataset_id2 = ds.register_dataset(cluster.target, Dataset.range(10), dataset_id=different_dataset_id)
        dataset1 = ds.from_dataset_id(ds.ShardingPolicy.OFF, cluster.target, dataset_id1, job_name="job_name")
        dataset2 = ds.from_dataset_id(ds.ShardingPolicy.OFF, cluster.target, dataset_id2, job_name="job_name")
        assert values(dataset1) == list(range(10))
        assert values(dataset2) == list(range(10))
        (numeric,) = {key.dataset_id for key in jobs_named(cluster, "job_name")}
        assert set(jobs_named(cluster, "job_name")) == {JobKey("job_name", numeric, "dataset_id"),
                                                        JobKey("job_name", numeric, different_dataset_id or "")}


def test_the_same_dataset_id_for_the_same_job_name_is_one_job():
    # testRegisterSameDatasetIds: the second reader finds the job read to its end.
    with TestCluster(num_workers=1) as cluster:
        dataset_id1 = ds.register_dataset(cluster.target, Dataset.range(10), dataset_id="dataset_id")
        dataset_id2 = ds.register_dataset(cluster.target, Dataset.range(10), dataset_id="dataset_id")
        dataset1 = ds.from_dataset_id(ds.ShardingPolicy.OFF, cluster.target, dataset_id1, job_name="job_name")
        dataset2 = ds.from_dataset_id(ds.ShardingPolicy.OFF, cluster.target, dataset_id2, job_name="job_name")
        assert values(dataset1) == list(range(10))
        assert values(dataset2) == []


def test_concurrent_readers_of_two_aliases_each_read_the_whole_dataset(cluster):
    # Before, the two aliases shared one distributed_epoch job and each reader silently got about half.
    for name in ("alias-a", "alias-b"):
        ds.register_dataset(cluster.target, Dataset.range(1000), dataset_id=name)
    got = {}

    def read(name):
        got[name] = sorted(int(x) for x in ds.from_dataset_id("distributed_epoch", cluster.target, name,
                                                               job_name="train"))

    threads = [threading.Thread(target=read, args=(name,)) for name in ("alias-a", "alias-b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S)
    assert got == {"alias-a": list(range(1000)), "alias-b": list(range(1000))}
    # `dataservice status` tells the two jobs of one name apart by the id their readers named.
    response = cluster.dispatcher.core.get_status(pb.GetStatusRequest())
    status = status_as_dict(response, cluster.target)
    shown = sorted(j["dataset_name"] for j in status["jobs"] if j["job_name"] == "train")
    assert shown == ["alias-a", "alias-b"]
    table = io.StringIO()
    format_status(status, table)
    rows = [line for line in table.getvalue().splitlines() if " train " in f" {line} "]
    assert sorted(row.split()[3] for row in rows) == ["(alias-a)", "(alias-b)"], table.getvalue()


def test_a_job_name_reused_with_another_mode_is_our_error_even_inside_a_zip():
    # testZipDifferentProcessingModesDatasetsSharedJobName: same pipeline, same job name, two modes.
    with TestCluster(num_workers=1) as cluster:
        ds1 = Dataset.range(100).apply(ds.distribute("distributed_epoch", cluster.target, job_name="job_name"))
        ds2 = Dataset.range(100).apply(ds.distribute("parallel_epochs", cluster.target, job_name="job_name"))
        with pytest.raises(errors.AlreadyExistsError) as info:
            values(Dataset.zip((ds1, ds2)).map(lambda a, b: a))
        message = str(info.value)
        assert "job name 'job_name' is already used by a job reading dataset" in message
        assert "in distributed_epoch; this request reads it in parallel_epochs" in message
        # Closing the iterator stopped the zip's other reader, though the traceback holds its generator.
        assert wait_for_client_threads() == []


def test_the_scoped_jobs_survive_a_fault_tolerant_restart(tmp_path):
    with TestCluster(num_workers=1, fault_tolerant_mode=True, work_dir=str(tmp_path)) as cluster:
        numeric = ds.register_dataset(cluster.target, Dataset.range(30))
        for name in ("a", "b"):
            assert ds.register_dataset(cluster.target, Dataset.range(30), dataset_id=name) == name
        for dataset_id in ("a", "b", numeric):
            reader = ds.from_dataset_id("distributed_epoch", cluster.target, dataset_id, job_name="shared")
            assert sorted(values(reader)) == list(range(30))
        before = jobs_named(cluster, "shared")
        assert set(before) == {JobKey("shared", numeric, "a"), JobKey("shared", numeric, "b"),
                               JobKey("shared", numeric, "")}
        with cluster.dispatcher.core._cond:
            expected = comparable(cluster.dispatcher.core.state)

        restarted = cluster.restart_dispatcher()
        with restarted.core._cond:
            assert comparable(restarted.core.state) == expected
        assert jobs_named(cluster, "shared") == before
        # The same jobs answer: each was read to its end, so a reader joining one gets end of input.
        for dataset_id in ("a", "b", str(numeric)):
            assert values(ds.from_dataset_id("distributed_epoch", cluster.target, dataset_id, job_name="shared")) == []
        client = DispatcherClient(cluster.dispatcher_address, timeout_ms=5_000)
        try:
            for key, job_id in before.items():
                assert client.get_or_create_job(numeric, state_pb2.DISTRIBUTED_EPOCH, "shared",
                                                dataset_name=key.dataset_name) == job_id
        finally:
            client.close()


def test_a_journal_written_before_job_names_were_scoped_replays(tmp_path):
    """A CreateJobUpdate of an older dispatcher has no dataset_name: the job answers to its name with the
    numeric id, as readers of that id found it, and a reader naming a chosen id gets a job of its own."""
    pipeline = Dataset.range(12)
    blob = serialize_dataset(pipeline)
    old = [state_pb2.Update(register_dataset=state_pb2.RegisterDatasetUpdate(
               dataset_id=1000, fingerprint=hashlib.sha256(blob).hexdigest(), dataset_def=blob,
               num_splits=pipeline.split_groups().num_groups, dataset_name="twelve")),
           state_pb2.Update(create_job=state_pb2.CreateJobUpdate(
               job_id=1001, job_name="train", dataset_id=1000, processing_mode=state_pb2.DISTRIBUTED_EPOCH,
               target_workers="AUTO"))]
    # What an older dispatcher wrote: the fields it knew, nothing else.
    assert [field.name for field, _ in old[1].create_job.ListFields()] == [
        "job_id", "job_name", "dataset_id", "processing_mode", "target_workers"]
    store = JournaledStore(str(tmp_path))
    store.open()
    try:
        for update in old:
            store.commit(update)
        store.wait_durable()
    finally:
        store.close()

    with TestCluster(num_workers=1, fault_tolerant_mode=True, work_dir=str(tmp_path)) as cluster:
        assert jobs_named(cluster, "train") == {JobKey("train", 1000, ""): 1001}
        # A reader of the numeric id (an int, or its str) reads the journaled job ...
        assert sorted(values(ds.from_dataset_id("distributed_epoch", cluster.target, "1000", job_name="train"))) \
            == list(range(12))
        assert jobs_named(cluster, "train") == {JobKey("train", 1000, ""): 1001}
        # ... and one of the chosen id, under the same job name, a new job of its own.
        assert sorted(values(ds.from_dataset_id("distributed_epoch", cluster.target, "twelve", job_name="train"))) \
            == list(range(12))
        jobs = jobs_named(cluster, "train")
        assert jobs[JobKey("train", 1000, "")] == 1001 and jobs[JobKey("train", 1000, "twelve")] > 1001


def test_the_dispatcher_refuses_a_dataset_name_that_does_not_name_the_dataset():
    core = DispatcherCore(DispatcherConfig())
    a = core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"a", num_splits=1, dataset_name="a")).dataset_id
    b = core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"b", num_splits=1)).dataset_id
    with pytest.raises(errors.InvalidRequestError, match=f"dataset id 'a' does not name dataset {b} .it names {a}."):
        core.get_or_create_job(pb.GetOrCreateJobRequest(dataset_id=b, processing_mode=state_pb2.PARALLEL_EPOCHS,
                                                        job_name="j", dataset_name="a"))


# --- element_spec given to from_dataset_id ---------------------------------------------------------------

def test_a_wrong_element_spec_is_refused_at_the_first_read_naming_both(one_worker):
    # testFromDatasetIdWrongElementSpec: building the dataset is fine; reading it raises.
    dataset_id = ds.register_dataset(one_worker.target, Dataset.range(10))
    wrong = TensorSpec((), np.int32)
    reader = ds.from_dataset_id("parallel_epochs", one_worker.target, dataset_id, element_spec=wrong)
    assert reader.element_spec == wrong  # as given: asking for it sends nothing
    with pytest.raises(errors.InvalidArgumentError) as info:
        values(reader)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert f"the element_spec given, {wrong}, does not match the one dataset {dataset_id} was registered with, " \
           f"{TensorSpec((), np.int64)}" in message
    assert "element_spec=None" in message
    with pytest.raises(errors.InvalidArgumentError, match="does not match"):
        values(reader)  # every read, until the spec is right


def test_a_wrong_structure_is_refused_and_names_the_chosen_id(one_worker):
    ds.register_dataset(one_worker.target, Dataset.range(4).map(lambda x: (x, x), output_signature=(
        TensorSpec((), np.int64), TensorSpec((), np.int64))), dataset_id="pairs-v1")
    reader = ds.from_dataset_id("parallel_epochs", one_worker.target, "pairs-v1",
                                element_spec={"a": TensorSpec((), np.int64), "b": TensorSpec((), np.int64)})
    with pytest.raises(errors.InvalidArgumentError, match=r"dataset 'pairs-v1' \(\d+\) was registered with, \(Tensor"):
        values(reader)


def test_compatible_element_specs_read_by_tfs_rule(one_worker):
    # is_compatible_with: the same structure and dtypes; shapes agree wherever both are known.
    signature = {"x": TensorSpec((8,), np.float32)}
    dataset_id = ds.register_dataset(one_worker.target, Dataset.range(6).map(
        lambda i: {"x": np.full(8, i, np.float32)}, output_signature=signature).batch(2))  # {"x": (None, 8)}
    for given in ({"x": TensorSpec((None, 8), np.float32)}, {"x": TensorSpec((2, 8), np.float32)},
                  {"x": TensorSpec(None, np.float32)}, {"x": TensorSpec((None, None), np.float32, name="named")}):
        reader = ds.from_dataset_id("parallel_epochs", one_worker.target, dataset_id, element_spec=given)
        assert [batch["x"].shape for batch in head(reader, 3)] == [(2, 8)] * 3, given
    for wrong in ({"x": TensorSpec((None, 9), np.float32)}, {"x": TensorSpec((None,), np.float32)},
                  {"x": TensorSpec((None, 8), np.float64)}, {"y": TensorSpec((None, 8), np.float32)}):
        with pytest.raises(errors.InvalidArgumentError, match="does not match"):
            head(ds.from_dataset_id("parallel_epochs", one_worker.target, dataset_id, element_spec=wrong), 1)


def test_a_spec_not_recorded_at_registration_cannot_be_compared_and_is_taken_as_given(one_worker):
    # map without output_signature: its spec needs an element, so registration records none.
    dataset_id = ds.register_dataset(one_worker.target, Dataset.range(3).map(lambda x: x * 2))
    given = TensorSpec((), np.int64)
    assert values(ds.from_dataset_id("parallel_epochs", one_worker.target, dataset_id, element_spec=given)) == \
        [0, 2, 4]


# --- coordinated reads and the cross-trainer cache: only a known end is refused ----------------------------

def coordinated_read_dataset(cluster: TestCluster, num_consumers: int) -> Dataset:
    """tf's make_coordinated_read_dataset: each worker produces groups of ``num_consumers`` consecutive
    numbers, from a flat_map (unknown cardinality); ``num_consumers`` readers read it through a parallel
    interleave, so the n-th element comes from consumer n % num_consumers."""
    rng = np.random.default_rng()
    starts = Dataset.from_tensors(np.int64(0)).concatenate(
        Dataset.range(1).repeat().map(lambda _: np.int64(rng.integers(0, 2 ** 62))))

    def make_group(x):
        x = x % (2 ** 32)
        return Dataset.range(x * num_consumers, (x + 1) * num_consumers)

    pipeline = starts.flat_map(make_group)
    assert pipeline.cardinality() == ds.UNKNOWN_CARDINALITY
    consumers = [pipeline.apply(ds.distribute("parallel_epochs", cluster.target, job_name="test",
                                              consumer_index=i, num_consumers=num_consumers))
                 for i in range(num_consumers)]
    return Dataset.from_tensor_slices(consumers).interleave(lambda x: x, cycle_length=num_consumers,
                                                            num_parallel_calls=num_consumers)


@pytest.mark.parametrize("num_workers, num_consumers", [(1, 2), (2, 5)])
def test_coordinated_reads_of_a_flat_map_pipeline(num_workers, num_consumers):
    # coordinated_read_test.testBasic: 100 results in groups of num_consumers consecutive numbers.
    with TestCluster(num_workers=num_workers) as cluster:
        results = [int(x) for x in head(coordinated_read_dataset(cluster, num_consumers), 100)]
    groups = [results[i:i + num_consumers] for i in range(0, len(results), num_consumers)]
    assert [g for g in groups if g != list(range(g[0], g[0] + num_consumers))] == [], groups


def test_unknown_cardinalities_are_accepted_and_a_known_end_is_refused(one_worker):
    infinite = Dataset.range(10).repeat()
    flat_map = infinite.flat_map(lambda x: Dataset.from_tensors(x).repeat(2))
    unknown = {"flat_map": flat_map,
               "group_by_window": flat_map.group_by_window(lambda x: x % 2, lambda _, w: w.batch(2), window_size=2),
               "filter": infinite.filter(lambda x: x % 3 == 0)}
    for name, pipeline in unknown.items():
        assert pipeline.cardinality() == ds.UNKNOWN_CARDINALITY, name
        for options in (dict(consumer_index=0, num_consumers=1), dict(cross_trainer_cache=ds.CrossTrainerCache("t"))):
            job = f"{name}-{'cache' if 'cross_trainer_cache' in options else 'coordinated'}"
            assert len(head(pipeline.apply(ds.distribute("parallel_epochs", one_worker.target, job_name=job,
                                                         **options)), 4)) == 4, job
            registered = ds.register_dataset(one_worker.target, pipeline)  # the dispatcher's check
            assert len(head(ds.from_dataset_id("parallel_epochs", one_worker.target, registered,
                                               job_name=job + "-by-id", **options), 4)) == 4, job
    for finite in (Dataset.range(10), Dataset.range(0), Dataset.range(10).repeat(3)):
        with pytest.raises(ValueError, match=rf"has {finite.cardinality()} elements: end it with \.repeat\(\)"):
            finite.apply(ds.distribute("parallel_epochs", one_worker.target, job_name="finite", consumer_index=0,
                                       num_consumers=2))
        registered = ds.register_dataset(one_worker.target, finite)
        with pytest.raises(errors.InvalidRequestError, match=rf"has {finite.cardinality()} elements"):
            head(ds.from_dataset_id("parallel_epochs", one_worker.target, registered, job_name="finite",
                                    cross_trainer_cache=ds.CrossTrainerCache("t")), 1)


def test_coordinated_consumers_of_an_unknown_cardinality_that_ends_all_reach_the_end(one_worker):
    # Unknown, but in fact 6 elements: the consumers end at the same round, none waits for ever.
    pipeline = Dataset.range(6).flat_map(lambda x: Dataset.from_tensors(x))
    consumers = [pipeline.apply(ds.distribute("parallel_epochs", one_worker.target, job_name="ends",
                                              consumer_index=i, num_consumers=2)) for i in range(2)]
    together = Dataset.from_tensor_slices(consumers).interleave(lambda x: x, cycle_length=2, num_parallel_calls=2)
    assert values(together) == list(range(6))


# --- distributed_save into a path that holds a save --------------------------------------------------------

def test_duplicate_snapshot(tmp_path):
    # distributed_save_test.testDuplicateSnapshot: a second save into the path, at once or once done.
    with TestCluster(num_workers=1) as cluster:
        path = str(tmp_path / "snapshot")
        ds.distributed_save(Dataset.range(10), path, cluster.target)
        with pytest.raises(errors.AlreadyExistsError, match="already started or completed"):
            ds.distributed_save(Dataset.range(10), path, cluster.target)
        wait_until(lambda: os.path.exists(os.path.join(path, saves.DONE_FILE)), DEADLINE_S, "the save to finish")
        for again in (Dataset.range(10), Dataset.range(20)):
            with pytest.raises(errors.AlreadyExistsError,
                               match=r"already holds a distributed save, already started or completed \(save \d+ of "
                                     r"dataset \d+: completed\)"):
                ds.distributed_save(again, path, cluster.target)
        assert sorted(int(x) for x in ds.load(path)) == list(range(10))

        # A dispatcher that does not know the save (restarted without fault tolerance) finds its files.
        cluster.restart_dispatcher()
        cluster.wait_for_workers(1)
        with pytest.raises(errors.AlreadyExistsError, match=r"already started or completed \(completed; its save"):
            ds.distributed_save(Dataset.range(10), path, cluster.target)


def test_a_retried_save_request_gets_its_save_back_across_a_restart(tmp_path):
    """What keeps a retry (its first attempt's answer lost) from being refused as a duplicate: the call's
    request token, journaled with the save."""
    with TestCluster(num_workers=1, fault_tolerant_mode=True, work_dir=str(tmp_path / "work")) as cluster:
        dataset_id = ds.register_dataset(cluster.target, Dataset.range(10))
        path = str(tmp_path / "save")
        request = pb.DistributedSaveRequest(dataset_id=dataset_id, path=path, request_token=b"t" * 16)
        save_id = cluster.dispatcher.core.distributed_save(request).save_id
        assert cluster.dispatcher.core.distributed_save(request).save_id == save_id
        restarted = cluster.restart_dispatcher()
        assert restarted.core.distributed_save(request).save_id == save_id
        for other in (b"u" * 16, b""):
            with pytest.raises(errors.AlreadyExistsError, match="already started or completed"):
                restarted.core.distributed_save(pb.DistributedSaveRequest(dataset_id=dataset_id, path=path,
                                                                          request_token=other))
