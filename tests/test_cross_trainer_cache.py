"""The cross-trainer cache (``distribute(..., cross_trainer_cache=CrossTrainerCache(trainer_id))``):
trainers of one job share its elements through a sliding window on each worker; each sees every
cached element at most once, in order; the pipeline runs once for all of them; a trainer behind the
window skips ahead; readers of one trainer_id share its position. Real dispatcher and workers."""

from __future__ import annotations

import itertools
import threading

import pytest

from dataservice import Dataset, WorkerConfig, errors
from dataservice.cli import build_parser
from dataservice.client.distribute import distribute, from_dataset_id, register_dataset
from dataservice.client.read_options import CrossTrainerCache
from dataservice.proto import dispatcher_pb2, state_pb2, worker_pb2
from dataservice.worker import responses
from dataservice.worker.memory_budget import MemoryBudget
from dataservice.worker.metrics import WorkerMetrics
from dataservice.worker.task_runner import TaskRunner
from dataservice.worker.trainer_cache import TrainerCache
from tests.cluster import TestCluster, run_with_deadline, wait_until


def _cached(ds: Dataset, cluster: TestCluster, trainer: str, job: str = "shared", mode: str = "parallel_epochs",
            **kwargs) -> Dataset:
    return ds.apply(distribute(mode, cluster.target, job_name=job,
                               cross_trainer_cache=CrossTrainerCache(trainer_id=trainer), **kwargs))


def _read(dataset: Dataset, n: int) -> list[int]:
    return [int(x) for x in itertools.islice(iter(dataset), n)]


def _caches(cluster: TestCluster) -> list[TrainerCache]:
    return [r.trainer_cache for w in cluster.workers for r in w.task_runners() if r.trainer_cache is not None]


def _logging_pipeline(path: str) -> Dataset:
    """An infinite pipeline that writes each element it produces to ``path`` (one line each): what
    the workers computed, whoever read it."""

    def record(x):
        with open(path, "a") as f:
            f.write(f"{int(x)}\n")
        return x

    return Dataset.range(1_000_000).repeat().map(record)


def test_two_trainers_see_the_same_elements_and_the_pipeline_runs_once(tmp_path):
    path = str(tmp_path / "produced.txt")
    with TestCluster(num_workers=1) as cluster:
        ds = _logging_pipeline(path)
        a, b = _cached(ds, cluster, "a"), _cached(ds, cluster, "b")
        seen: dict = {}
        threads = [threading.Thread(target=lambda name=name, d=d: seen.__setitem__(name, _read(d, 2000)))
                   for name, d in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert seen["a"] == seen["b"] == list(range(2000))  # each element once per trainer, in order
        [cache] = _caches(cluster)
        stats = cache.stats()
        assert stats["trainers"] == 2
        # Taken from the task once for both: no more than the faster trainer was served (each reader
        # reads ahead past the 2,000 it consumes, so the faster one may have been served more).
        assert stats["produced_elements"] <= max(stats["served_by_trainer"].values()) + 64
        # ... and the worker's /status.json shows it, per task.
        [task] = [t for t in WorkerMetrics(cluster.workers[0]).status()["tasks"] if "trainer_cache" in t]
        assert task["trainer_cache"]["trainers"] == 2 and task["trainer_cache"]["produced_elements"] > 0
        with open(path) as f:
            produced = [int(line) for line in f]
        assert len(produced) == len(set(produced)) >= 2000  # the pipeline computed each element once


def test_a_trainer_behind_the_window_skips_ahead_and_never_sees_an_element_twice():
    # 16 bytes per cached int64 scalar (approximate_size): a window of about 250 elements.
    with TestCluster(num_workers=0) as cluster:
        cluster.add_worker(cross_trainer_cache_size_bytes=4000)
        cluster.wait_for_workers(1)
        ds = Dataset.range(10_000_000).repeat()
        fast = iter(_cached(ds, cluster, "fast", max_outstanding_requests=16))
        slow = iter(_cached(ds, cluster, "slow", max_outstanding_requests=16))
        first_fast = [int(next(fast)) for _ in range(1000)]
        assert first_fast == list(range(1000))
        got = [int(next(slow)) for _ in range(50)]
        assert got[0] > 0, "the slow trainer starts at the oldest element still cached, not at 0"
        for _ in range(3):  # the fast trainer runs ahead again; the slow one falls out of the window again
            first_fast += [int(next(fast)) for _ in range(1000)]
            got += [int(next(slow)) for _ in range(50)]
        assert all(b > a for a, b in zip(got, got[1:])), "a trainer sees elements in order, each once"
        assert first_fast == list(range(4000))
        [cache] = _caches(cluster)
        stats = cache.stats()
        assert stats["skipped_elements"] > 0 and stats["evicted_elements"] > 0
        assert stats["cached_bytes"] <= 4000


def test_readers_with_one_trainer_id_share_its_position():
    with TestCluster(num_workers=1) as cluster:
        ds = Dataset.range(10_000_000).repeat()
        first = _read(_cached(ds, cluster, "same", max_outstanding_requests=4), 10)
        second = _read(_cached(ds, cluster, "same", max_outstanding_requests=4), 10)
        assert first == list(range(10))
        assert second[0] >= 10 and not set(first) & set(second)  # as tf.data: no reuse within a trainer
        other = _read(_cached(ds, cluster, "other"), 10)
        assert other == list(range(10))  # another trainer still reads from the oldest cached element


def test_concurrent_readers_of_one_trainer_split_its_elements_while_another_trainer_gets_all():
    with TestCluster(num_workers=1) as cluster:
        ds = Dataset.range(10_000_000).repeat()
        datasets = {"x1": _cached(ds, cluster, "x", max_outstanding_requests=8),
                    "x2": _cached(ds, cluster, "x", max_outstanding_requests=8),
                    "y": _cached(ds, cluster, "y", max_outstanding_requests=8)}
        seen: dict = {}
        threads = [threading.Thread(target=lambda k=k, d=d: seen.__setitem__(k, _read(d, 500)), daemon=True)
                   for k, d in datasets.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(seen) == 3, "a reader hung"
        x = seen["x1"] + seen["x2"]
        assert len(set(x)) == len(x) == 1000  # trainer x got each element once, across its two readers
        assert seen["y"] == sorted(set(seen["y"])) and len(seen["y"]) == 500
        assert all(b > a for k in ("x1", "x2") for a, b in zip(seen[k], seen[k][1:]))


def test_a_restarted_worker_resumes_after_the_fastest_trainer():
    """Both trainers report the same offsets; the replacement task skips what any of them holds, so each
    trainer goes on without seeing an element twice (the slower one skips ahead, as out of the window)."""
    with TestCluster(num_workers=1) as cluster:
        ds = Dataset.range(10_000_000).repeat()
        fast = iter(_cached(ds, cluster, "fast", max_outstanding_requests=8))
        slow = iter(_cached(ds, cluster, "slow", max_outstanding_requests=8))
        seen_fast = [int(next(fast)) for _ in range(300)]
        seen_slow = [int(next(slow)) for _ in range(100)]
        cluster.restart_worker(0)
        seen_fast += run_with_deadline(lambda: [int(next(fast)) for _ in range(200)], 60)
        seen_slow += run_with_deadline(lambda: [int(next(slow)) for _ in range(200)], 60)
        for seen in (seen_fast, seen_slow):
            assert all(b > a for a, b in zip(seen, seen[1:])), "each trainer sees each element once, in order"
        assert seen_fast[:300] == list(range(300)) and seen_slow[:100] == list(range(100))
        assert "resume_stream" in [kind for kind, _ in cluster.dispatcher.core.events]


def _increasing_runs(seen: list[int]) -> int:
    """The fewest increasing subsequences ``seen`` splits into (patience sorting): a merge of what k
    workers each produced in increasing order needs at most k."""
    tops: list[int] = []
    for x in seen:
        i = next((i for i, top in enumerate(tops) if top < x), None)
        if i is None:
            tops.append(x)
        else:
            tops[i] = x
    return len(tops)


def test_the_windows_of_two_cached_jobs_together_stay_within_the_memory_budget():
    """Each window may be most of the budget (6000 of 8000 bytes) and its bytes never wait for the
    budget; still the worker stays within it (give or take an element per task, as for any task):
    elements move from a task's buffer into its window without changing the budget's total, and a
    window does not grow while the worker is over its budget."""
    with TestCluster(num_workers=0) as cluster:
        worker = cluster.add_worker(memory_budget_bytes=8000, cross_trainer_cache_size_bytes=6000)
        cluster.wait_for_workers(1)
        ds = Dataset.range(10_000_000).repeat()
        readers = [iter(_cached(ds, cluster, "a", job=job, max_outstanding_requests=16)) for job in ("one", "two")]
        seen: list[list[int]] = [[], []]
        for _ in range(10):  # both jobs read at once, 16 bytes per cached scalar: far past their windows
            for i, reader in enumerate(readers):
                seen[i] += [int(next(reader)) for _ in range(200)]
        assert seen[0] == seen[1] == list(range(2000))
        caches = _caches(cluster)
        assert len(caches) == 2
        assert all(c.stats()["evicted_elements"] > 0 for c in caches), "each window filled"
        assert sum(c.stats()["cached_bytes"] for c in caches) <= 8000
        assert worker.memory_budget.peak_bytes <= 8000 + 256, worker.memory_budget


def test_distributed_epoch_trainers_share_too():
    # tf.data service allows the cache with dynamic sharding (its testDynamicSharding): each worker's
    # tasks cache what they produce from their splits. Values are unique in the first pass, and each
    # worker leases groups in increasing order, so a value names its (split, offset) and each worker
    # produces increasing values.
    with TestCluster(num_workers=2) as cluster:
        ds = Dataset.range(1_000_000).repeat()
        a = _read(_cached(ds, cluster, "a", mode="distributed_epoch"), 300)
        b = _read(_cached(ds, cluster, "b", mode="distributed_epoch"), 300)
        for seen in (a, b):
            assert len(set(seen)) == len(seen) == 300, "an element twice for one trainer"
            assert _increasing_runs(seen) <= 2, "a trainer sees each worker's elements in production order"
        caches = _caches(cluster)
        assert caches and all(c.stats()["trainers"] == 2 for c in caches)
        for cache in caches:  # the pipeline ran once for both trainers: nothing was taken twice
            stats = cache.stats()
            assert stats["produced_elements"] <= max(stats["served_by_trainer"].values())
        assert sum(c.stats()["served_elements"] for c in caches) > sum(c.stats()["produced_elements"] for c in caches)


def test_an_undelivered_answer_goes_back_to_its_trainer_only():
    """TrainerCache on a real TaskRunner: what one trainer did not receive it reads again; another
    trainer is not affected; the window's bytes count against the worker's budget until the task stops."""
    budget = MemoryBudget(1 << 20)
    task_def = dispatcher_pb2.TaskDef(task_id=1, iteration_id=1, job_id=1, dataset_id=1,
                                      processing_mode=state_pb2.PARALLEL_EPOCHS, cross_trainer_cache=True)
    runner = TaskRunner(task_def, Dataset.range(1_000_000).repeat(), None, "worker:1", budget=budget, start=False)
    cache = runner.trainer_cache = TrainerCache(runner, 1 << 16, budget)
    try:
        elements, runs, ended, error = cache.take("a", 1, 5, 1 << 20, 5.0)
        assert [int(x) for x in elements] == [0, 1, 2, 3, 4] and runs == [[0, 0, 0, 5, -1]] and not ended
        cache.view("a", 1).untake(elements, runs)
        again, runs_again, _, _ = cache.take("a", 1, 8, 1 << 20, 5.0)
        assert [int(x) for x in again][:5] == [0, 1, 2, 3, 4]
        b, _, _, _ = cache.take("b", 2, 5, 1 << 20, 5.0)
        assert [int(x) for x in b] == [0, 1, 2, 3, 4]
        assert budget.used_bytes >= cache.stats()["cached_bytes"] > 0
    finally:
        runner.stop()
    wait_until(lambda: runner.thread is None or not runner.thread.is_alive(), 10, "the producer to end")
    assert budget.used_bytes == 0 and budget.open_accounts == 0


def test_what_is_given_back_after_its_eviction_is_skipped():
    budget = MemoryBudget(1 << 20)
    task_def = dispatcher_pb2.TaskDef(task_id=1, iteration_id=1, job_id=1, dataset_id=1,
                                      processing_mode=state_pb2.PARALLEL_EPOCHS, cross_trainer_cache=True)
    runner = TaskRunner(task_def, Dataset.range(1_000_000).repeat(), None, "worker:1", budget=budget, start=False)
    cache = runner.trainer_cache = TrainerCache(runner, 100, budget)  # 16 bytes per scalar: 6 elements
    try:
        elements, runs, _, _ = cache.take("a", 1, 3, 1 << 20, 5.0)
        assert [int(x) for x in elements] == [0, 1, 2]
        cache.view("a", 1).untake(elements, runs)
        while cache.stats()["evicted_elements"] < 3:  # "b" runs ahead: 0, 1, 2 leave the window
            cache.take("b", 2, 4, 1 << 20, 5.0)
        later, _, _, _ = cache.take("a", 1, 4, 1 << 20, 5.0)
        assert int(later[0]) > 2 and cache.stats()["cached_bytes"] <= 100
    finally:
        runner.stop()


class _OneTask:
    """A worker as ``responses.prepare`` sees it (``responses.TaskSource``), serving one real task."""

    address = "worker:1"

    def __init__(self, runner: TaskRunner):
        self.runner = runner

    def find_task(self, task_id: int, wait_s: float):
        return self.runner if task_id == self.runner.task_id else None


def test_an_answer_given_back_goes_to_the_same_reader_not_to_a_replica_of_its_trainer():
    """Two readers (client ids 1 and 2) of trainer "x". An answer to reader 1 fails after reader 2
    received later elements: reader 2 counts everything before what it receives as held (a cached
    reader's bookkeeping), so it would drop them; reader 1 gets them back, first."""
    budget = MemoryBudget(1 << 20)
    task_def = dispatcher_pb2.TaskDef(task_id=1, iteration_id=1, job_id=1, dataset_id=1,
                                      processing_mode=state_pb2.PARALLEL_EPOCHS, cross_trainer_cache=True)
    runner = TaskRunner(task_def, Dataset.range(1_000_000).repeat(), None, "worker:1", budget=budget, start=False)
    runner.trainer_cache = TrainerCache(runner, 1 << 16, budget)
    worker = _OneTask(runner)

    def request(client_id: int) -> worker_pb2.GetElementsRequest:
        return worker_pb2.GetElementsRequest(task_id=1, client_id=client_id, trainer_id="x", max_elements=5,
                                             max_bytes=1 << 20, wait_ms=5000)

    def offsets(prepared) -> list[int]:
        return [o for run in prepared.header.runs for o in range(run.first_offset, run.first_offset + run.count)]

    try:
        failed = responses.prepare(worker, request(1))
        assert offsets(failed) == [0, 1, 2, 3, 4]
        assert offsets(responses.prepare(worker, request(2))) == [5, 6, 7, 8, 9]
        failed.give_back()  # reader 1's answer did not reach it
        assert offsets(responses.prepare(worker, request(2))) == [10, 11, 12, 13, 14]
        assert offsets(responses.prepare(worker, request(1))) == [0, 1, 2, 3, 4]
        assert offsets(responses.prepare(worker, request(1))) == [15, 16, 17, 18, 19]
    finally:
        runner.stop()


# --- errors -------------------------------------------------------------------------------------

def test_the_cache_needs_a_job_name_and_an_infinite_dataset_and_no_coordinated_reads():
    with pytest.raises(ValueError, match="target_workers='LOCAL' does not go with cross_trainer_cache"):
        distribute("parallel_epochs", "localhost:1", job_name="j", target_workers="local",
                   cross_trainer_cache=CrossTrainerCache("a"))
    with pytest.raises(ValueError, match="needs a job_name"):
        distribute("parallel_epochs", "localhost:1", cross_trainer_cache=CrossTrainerCache("a"))
    with pytest.raises(ValueError, match="do not go together"):
        distribute("parallel_epochs", "localhost:1", job_name="j", consumer_index=0, num_consumers=2,
                   cross_trainer_cache=CrossTrainerCache("a"))
    with pytest.raises(ValueError, match="non-empty str"):
        CrossTrainerCache("")
    with pytest.raises(ValueError, match="257 characters long; a trainer id has at most 256"):
        CrossTrainerCache("t" * 257)
    with pytest.raises(ValueError, match="must be a CrossTrainerCache"):
        distribute("parallel_epochs", "localhost:1", job_name="j", cross_trainer_cache="a")
    with pytest.raises(ValueError, match=r"infinite dataset.*repeat\(\)"):
        Dataset.range(10).apply(distribute("parallel_epochs", "localhost:1", job_name="j",
                                           cross_trainer_cache=CrossTrainerCache("a")))


def test_the_dispatcher_refuses_a_finite_dataset_and_mixed_readers():
    with TestCluster(num_workers=1) as cluster:
        finite = register_dataset(cluster.target, Dataset.range(10))
        ds = from_dataset_id("parallel_epochs", cluster.target, finite, job_name="finite",
                             cross_trainer_cache=CrossTrainerCache("a"))
        with pytest.raises(errors.InvalidRequestError, match="infinite"):
            run_with_deadline(lambda: _read(ds, 1), 30)
        infinite = Dataset.range(100).repeat()
        assert _read(_cached(infinite, cluster, "a", job="mixed"), 3) == [0, 1, 2]
        plain = infinite.apply(distribute("parallel_epochs", cluster.target, job_name="mixed"))
        with pytest.raises(errors.InvalidRequestError, match="cross_trainer_cache=on.*cross_trainer_cache=off"):
            run_with_deadline(lambda: _read(plain, 1), 30)


def test_a_trainer_reads_a_cached_job_with_one_iterator():
    with TestCluster(num_workers=1) as cluster:
        ds = _cached(Dataset.range(100).repeat(), cluster, "a", job="once")
        assert _read(ds, 3) == [0, 1, 2]
        with pytest.raises(ValueError, match="iterated a second time"):
            _read(ds, 3)


@pytest.mark.parametrize("size", [0, -1, True, 1.5, "1"])
def test_a_bad_cache_size_is_refused(size):
    with pytest.raises(ValueError, match="cross_trainer_cache_size_bytes"):
        WorkerConfig(dispatcher_address="localhost:5050", cross_trainer_cache_size_bytes=size)


def test_the_cache_size_fits_the_memory_budget():
    with pytest.raises(ValueError, match=r"must not exceed memory_budget_bytes.*--memory-budget-bytes"):
        WorkerConfig(dispatcher_address="localhost:5050", memory_budget_bytes=1 << 20,
                     cross_trainer_cache_size_bytes=2 << 20)
    # By default: 256 MiB, or half the budget if that is less.
    assert WorkerConfig(dispatcher_address="localhost:5050", memory_budget_bytes=1 << 20
                        ).cross_trainer_cache_size_bytes == 1 << 19
    assert WorkerConfig(dispatcher_address="localhost:5050", memory_budget_bytes=4 << 30
                        ).cross_trainer_cache_size_bytes == 256 << 20


def test_the_worker_flag():
    args = build_parser().parse_args(["worker", "--dispatcher", "localhost:5050",
                                      "--cross-trainer-cache-size-bytes", "1048576"])
    from dataservice.cli import worker_config
    assert worker_config(args).cross_trainer_cache_size_bytes == 1 << 20
    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "--dispatcher", "localhost:5050", "--cross-trainer-cache-size-bytes",
                                   "0"])
