"""Coordinated reads: ``distribute(..., job_name=..., consumer_index=i, num_consumers=n)``.

The consumers of a job read in strict round-robin: at each step all of them read from the same
worker, and get n consecutive elements of its stream, consumer c the c-th. Real servers (an
in-process TestCluster), consumers on threads; every wait is bounded.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import threading

import pytest

from dataservice import Dataset, distribute, errors
from dataservice.service.dispatcher_client import DispatcherClient
from dataservice.worker import round_robin
from tests.cluster import TestCluster, run_with_deadline, wait_until


def _tag(x):
    # The producer thread is named after its task: each element says which task (worker) made it.
    import threading as _threading
    return (_threading.current_thread().name, x)


def _tagged():
    return Dataset.range(1_000_000).map(_tag).repeat()


def _read(cluster, n, steps, job_name="coordinated", protocol=None, dataset=None):
    """Each of n consumers, on its thread, reads ``steps`` elements: their lists, by consumer."""
    dataset = dataset or _tagged()
    out: dict[int, list] = {}

    def consume(i):
        ds = dataset.apply(distribute("parallel_epochs", cluster.target, job_name=job_name, consumer_index=i,
                                      num_consumers=n, data_transfer_protocol=protocol, timeout_ms=20_000))
        it = iter(ds)
        out[i] = [next(it) for _ in range(steps)]
        it.close()

    def run():
        threads = [threading.Thread(target=consume, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    run_with_deadline(run, 30)
    assert sorted(out) == list(range(n)), "a consumer failed"
    return out


def _assert_aligned(out, n, steps):
    """At each step every consumer read from the same task, consumer c the c-th of n consecutive elements."""
    for step in range(steps):
        tasks = {out[c][step][0] for c in range(n)}
        assert len(tasks) == 1, f"step {step}: consumers read from different tasks {tasks}"
        values = [int(out[c][step][1]) for c in range(n)]
        assert values == list(range(values[0], values[0] + n)), f"step {step}: not consecutive: {values}"


@pytest.mark.parametrize("protocol", [None, "tcp", "grpc"])
def test_one_worker_serves_consecutive_elements_in_rounds(protocol):
    with TestCluster(num_workers=1) as cluster:
        out = _read(cluster, 3, 30, protocol=protocol)
    _assert_aligned(out, 3, 30)
    # One worker: round r is elements 3r, 3r+1, 3r+2 of its stream, in order.
    assert [int(x) for _, x in out[0]] == list(range(0, 90, 3))


def test_two_workers_alternate_per_round():
    with TestCluster(num_workers=2) as cluster:
        out = _read(cluster, 2, 40, protocol="tcp")
    _assert_aligned(out, 2, 40)
    sources = [out[0][step][0] for step in range(40)]
    assert len(set(sources)) == 2
    assert all(sources[s] != sources[s + 1] for s in range(39)), "the worker must change at every round"
    # Each worker's stream is handed out in rounds of two consecutive elements, in order.
    first = [int(out[0][s][1]) for s in range(0, 40, 2)]
    assert first == list(range(0, 40, 2))


def test_a_lagging_consumer_makes_the_others_wait():
    with TestCluster(num_workers=1) as cluster:
        dataset = _tagged()
        got: list = []
        ds0 = dataset.apply(distribute("parallel_epochs", cluster.target, job_name="lag", consumer_index=0,
                                       num_consumers=2, timeout_ms=20_000))
        it0 = iter(ds0)
        it1 = None
        stop = threading.Event()

        def fast():
            while len(got) < 100 and not stop.is_set():
                got.append(next(it0))

        thread = threading.Thread(target=fast, daemon=True)
        thread.start()
        try:
            # Consumer 1 has not read anything: consumer 0 gets the rounds the worker keeps, then waits.
            wait_until(lambda: len(got) >= round_robin.MAX_ROUNDS, 10, "consumer 0 reads the first rounds")
            thread.join(0.5)  # the non-event: it must not get further while consumer 1 reads nothing
            assert len(got) == round_robin.MAX_ROUNDS and thread.is_alive()
            ds1 = dataset.apply(distribute("parallel_epochs", cluster.target, job_name="lag", consumer_index=1,
                                           num_consumers=2, timeout_ms=20_000))
            it1 = iter(ds1)
            other = run_with_deadline(lambda: [next(it1) for _ in range(100)], 20)
            thread.join(20)
            assert not thread.is_alive() and len(got) == 100
        finally:
            stop.set()
            for it in (it0, it1):  # infinite reads: stopped here, while the dispatcher still answers
                if it is not None:
                    it.close()
    assert [int(x) for _, x in got] == list(range(0, 200, 2))
    assert [int(x) for _, x in other] == list(range(1, 200, 2))


def test_readers_of_a_job_must_agree_on_num_consumers():
    with TestCluster(num_workers=1) as cluster:
        dataset = Dataset.range(10).repeat()
        it = iter(dataset.apply(distribute("parallel_epochs", cluster.target, job_name="agree", consumer_index=0,
                                           num_consumers=2)))
        run_with_deadline(lambda: next(it), 10)  # alone, a consumer still reads the rounds the worker keeps
        wrong = dataset.apply(distribute("parallel_epochs", cluster.target, job_name="agree", consumer_index=0,
                                         num_consumers=3))
        with pytest.raises(errors.InvalidRequestError, match="num_consumers=2.*num_consumers=3"):
            run_with_deadline(lambda: next(iter(wrong)), 10)
        uncoordinated = dataset.apply(distribute("parallel_epochs", cluster.target, job_name="agree"))
        with pytest.raises(errors.InvalidRequestError, match="num_consumers"):
            run_with_deadline(lambda: next(iter(uncoordinated)), 10)
        it.close()


def test_two_live_readers_cannot_claim_one_consumer_index():
    with TestCluster(num_workers=1) as cluster:
        dataset = Dataset.range(10).repeat()
        first = iter(dataset.apply(distribute("parallel_epochs", cluster.target, job_name="twice", consumer_index=1,
                                              num_consumers=2)))
        run_with_deadline(lambda: next(first), 10)
        second = dataset.apply(distribute("parallel_epochs", cluster.target, job_name="twice", consumer_index=1,
                                          num_consumers=2))
        with pytest.raises(errors.AlreadyExistsError, match="consumer_index=1 .*own consumer_index"):
            run_with_deadline(lambda: next(iter(second)), 10)
        first.close()


def test_consumer_index_out_of_range_is_refused():
    with pytest.raises(ValueError, match=r"consumer_index must be an int in \[0, num_consumers=2\)"):
        distribute("parallel_epochs", "localhost:1", job_name="j", consumer_index=2, num_consumers=2)
    with pytest.raises(ValueError, match="consumer_index and num_consumers go together"):
        distribute("parallel_epochs", "localhost:1", job_name="j", num_consumers=2)
    # At the dispatcher too (a client that does not check): named, with the range.
    with TestCluster(num_workers=1) as cluster:
        dataset = Dataset.range(10).repeat()
        ds = dataset.apply(distribute("parallel_epochs", cluster.target, job_name="range", consumer_index=0,
                                      num_consumers=2))
        client = DispatcherClient(cluster.dispatcher_address, timeout_ms=5_000)
        try:
            dataset_id = ds._registered_id(client)
            job_id = client.get_or_create_job(dataset_id, 1, "range", num_consumers=2)
            with pytest.raises(errors.InvalidRequestError, match=r"consumer_index in \[0, 2\) to distribute, got 5"):
                client.get_or_create_iteration(job_id, 0, consumer_index=5)
            with pytest.raises(errors.InvalidRequestError, match=r"consumer_index in \[0, 2\) to distribute, got None"):
                client.get_or_create_iteration(job_id, 0)
        finally:
            client.close()


def test_coordinated_reads_need_a_job_name_and_an_infinite_dataset():
    with pytest.raises(ValueError, match="need a job_name"):
        distribute("parallel_epochs", "localhost:1", consumer_index=0, num_consumers=2)
    with pytest.raises(ValueError, match=r"infinite dataset.*\.repeat\(\)"):
        Dataset.range(10).apply(distribute("parallel_epochs", "localhost:1", job_name="j", consumer_index=0,
                                           num_consumers=2))


def test_a_worker_joining_enters_every_consumers_rotation_at_the_same_round():
    with TestCluster(num_workers=1, client_timeout_ms=2_000) as cluster:
        n = 2
        out: dict[int, list] = {i: [] for i in range(n)}
        target = [10 ** 9]

        def consume(i):
            ds = _tagged().apply(distribute("parallel_epochs", cluster.target, job_name="join", consumer_index=i,
                                            num_consumers=n, timeout_ms=20_000))
            it = iter(ds)
            while len(out[i]) < target[0]:
                out[i].append(next(it))
            it.close()

        threads = [threading.Thread(target=consume, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        wait_until(lambda: all(len(out[i]) >= 20 for i in range(n)), 10, "the consumers read from one worker")
        first_task = out[0][0][0]
        cluster.add_worker()

        def both_read_the_new_worker():
            return all(sum(1 for e in list(out[i]) if e[0] != first_task) >= 5 for i in range(n))

        try:
            wait_until(both_read_the_new_worker, 20, "both consumers read from the new worker")
        finally:
            # Every consumer reads up to the same step: none waits for one that stopped.
            target[0] = max(len(out[i]) for i in range(n)) + 2 * round_robin.MAX_ROUNDS
        for t in threads:
            t.join(20)
        assert not any(t.is_alive() for t in threads)
        joins = [fields for kind, fields in cluster.dispatcher.core.events if kind == "join_rotation"]
        assert len(joins) == 1 and joins[0]["starting_round"] > 0, joins
    steps = min(len(out[i]) for i in range(n))
    _assert_aligned(out, n, steps)
    sources = [out[0][s][0] for s in range(steps)]
    joined = next(s for s in range(steps) if sources[s] != first_task)
    assert set(sources[:joined]) == {first_task}
    assert all(sources[s] != sources[s + 1] for s in range(joined - 1, steps - 1)), \
        "from the join on, the two workers alternate"


def _reader_of(it):
    """The CoordinatedReader behind a distributed dataset's iterator (to see what it fetched)."""
    return it._ctx.read_stats()._live[0]


def test_a_lost_worker_does_not_hang_the_consumers_and_they_stay_aligned():
    with TestCluster(num_workers=2, worker_timeout_ms=1_000, client_timeout_ms=2_000) as cluster:
        n = 2
        out: dict[int, list] = {i: [] for i in range(n)}
        goal = [20] * n          # each consumer reads up to goal[i] elements, then waits for more
        readers: dict = {}
        cond = threading.Condition()

        def consume(i):
            ds = _tagged().apply(distribute("parallel_epochs", cluster.target, job_name="loss", consumer_index=i,
                                            num_consumers=n, timeout_ms=20_000))
            it = iter(ds)
            out[i].append(next(it))
            readers[i] = _reader_of(it)
            while True:
                with cond:
                    cond.wait_for(lambda: len(out[i]) < goal[i] or goal[i] < 0, 30)
                    if goal[i] < 0 or len(out[i]) >= goal[i]:
                        break
                out[i].append(next(it))
            it.close()

        def set_goal(i, value):
            with cond:
                goal[i] = value
                cond.notify_all()

        threads = [threading.Thread(target=consume, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: all(len(out[i]) == 20 for i in range(n)), 10, "the consumers read from both workers")
            assert len({e[0] for e in out[0]}) == 2
            # Both paused at round 20 with their readers' windows fetched: rounds 20..27, half of them from
            # the worker about to be lost.
            window = set(range(20, 28))
            wait_until(lambda: all(set(readers[i]._results) == window for i in range(n)), 10, "the windows fetched")
            cluster.stop_worker(1)
            # Consumer 0 takes some of the lost worker's fetched rounds before anyone hears of the loss.
            set_goal(0, 26)
            wait_until(lambda: len(out[0]) == 26, 10, "consumer 0 reads on within its window")
            wait_until(lambda: all(readers[i]._revoked for i in range(n)), 20, "both readers hear of the loss")
            # Consumer 1 hears of it with its fetched rounds of the lost worker not taken yet: it must still
            # deliver them (consumer 0 took its element of them), and skip only what neither fetched.
            for i in range(n):
                set_goal(i, 70)
            wait_until(lambda: all(len(out[i]) == 70 for i in range(n)), 20, "the consumers read on")
        finally:
            for i in range(n):
                set_goal(i, -1)
        for t in threads:
            t.join(20)
        assert not any(t.is_alive() for t in threads)
    # Aligned throughout: at each step both read the same task, consecutive elements of it.
    _assert_aligned(out, n, 70)
    # After the loss, one task serves every round (the lost one's later rounds are skipped by all).
    for i in range(n):
        assert len({e[0] for e in out[i][-20:]}) == 1


def test_a_consumer_that_comes_back_goes_on_from_the_round_the_others_are_at():
    with TestCluster(num_workers=1) as cluster:
        dataset = _tagged()

        def reader(i):
            return iter(dataset.apply(distribute("parallel_epochs", cluster.target, job_name="again", consumer_index=i,
                                                 num_consumers=2, timeout_ms=20_000)))

        first0, first1 = reader(0), reader(1)
        run_with_deadline(lambda: [(next(first0), next(first1)) for _ in range(10)], 20)
        first1.close()  # consumer 1 leaves (released at once) and a new reader takes its place
        got0: list = []
        thread = threading.Thread(target=lambda: got0.extend(next(first0) for _ in range(40)), daemon=True)
        thread.start()
        again1 = reader(1)
        got1 = run_with_deadline(lambda: [next(again1) for _ in range(40)], 20)
        thread.join(20)
        assert not thread.is_alive() and len(got0) == 40
        again1.close()
        first0.close()
    values0 = [int(x) for _, x in got0]
    values1 = [int(x) for _, x in got1]
    # The new consumer 1 skipped what its predecessor took (or had fetched ahead), and is never served
    # out of order: its elements are odd (slot 1 of each round), increasing, after the predecessor's.
    assert all(v % 2 == 1 for v in values1) and values1 == sorted(set(values1)) and values1[0] > 19
    assert values0 == list(range(20, 100, 2))


@pytest.mark.slow
def test_the_benchmark_runs_and_coordinated_reads_keep_replicas_alike():
    repo = pathlib.Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH")) if p))
    result = subprocess.run([sys.executable, "-m", "benchmarks.coordinated_reads", "--consumers", "2", "--steps", "8",
                             "--warmup", "2", "--repeats", "1", "--us-per-token", "2"],
                            capture_output=True, text=True, cwd=repo, env=env, timeout=60)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    rows = [line for line in result.stdout.splitlines() if line.startswith("| 2 |")]
    assert [row.split("|")[2].strip() for row in rows] == ["first come first served", "coordinated"], result.stdout
    # Coordinated: the replicas of a step get batches of one length bucket (64 wide).
    assert float(rows[1].split("|")[3]) < 64, result.stdout


def test_a_worker_round_gives_back_an_undelivered_element_and_refuses_old_rounds():
    from dataservice.proto import dispatcher_pb2, state_pb2, worker_pb2
    from dataservice.worker.task_runner import TaskRunner

    task_def = dispatcher_pb2.TaskDef(task_id=1, iteration_id=2, job_id=3, processing_mode=state_pb2.PARALLEL_EPOCHS,
                                      num_consumers=2)
    runner = TaskRunner(task_def, Dataset.range(1000).repeat(), None, "localhost:0")
    runner.rounds = round_robin.Rounds(runner, 2)
    try:
        def ask(consumer, round_index):
            request = worker_pb2.GetElementsRequest(task_id=1, max_elements=1, consumer_index=consumer,
                                                    round_index=round_index)
            return request, runner.rounds.take(request, 5.0)[0]

        _, first = ask(0, 0)
        request, second = ask(1, 0)
        assert [int(first[0]), int(second[0])] == [0, 1]
        # Its answer did not reach consumer 1 (the round was freed meanwhile): the retry gets it again.
        runner.rounds.returns_to(request).untake(second, [])
        assert int(ask(1, 0)[1][0]) == 1
        with pytest.raises(round_robin.RoundOver) as over:
            ask(1, 0)  # taken: never served twice
        assert over.value.skip_to == 1
        assert [int(ask(c, 5)[1][0]) for c in (0, 1)] == [2, 3]  # the next round here is the stream's next two
        with pytest.raises(round_robin.RoundOver):
            ask(0, 3)  # an earlier round than one it took: never out of order
        with pytest.raises(ValueError, match=r"consumer_index 2 is not in \[0, num_consumers=2\)"):
            ask(2, 6)
    finally:
        runner.stop()


def test_rounds_count_against_the_worker_budget_and_go_with_their_task():
    import gc
    import weakref

    import numpy as np

    from dataservice.proto import dispatcher_pb2, state_pb2, worker_pb2
    from dataservice.worker.memory_budget import MemoryBudget
    from dataservice.worker.task_runner import TaskRunner, approximate_size

    budget = MemoryBudget(1 << 30)
    task_def = dispatcher_pb2.TaskDef(task_id=1, iteration_id=2, job_id=3, processing_mode=state_pb2.PARALLEL_EPOCHS,
                                      num_consumers=2)
    runner = TaskRunner(task_def, Dataset.range(1000).map(lambda i: np.full(1000, i)).repeat(), None, "localhost:0",
                        budget=budget, start=False)
    rounds = runner.rounds = round_robin.Rounds(runner, 2, budget)
    size = approximate_size(np.full(1000, 0))

    def ask(consumer, round_index):
        request = worker_pb2.GetElementsRequest(task_id=1, max_elements=1, consumer_index=consumer,
                                                round_index=round_index)
        return rounds.take(request, 5.0)[0]

    assert int(ask(0, 0)[0][0]) == 0
    assert rounds.held_bytes == size  # consumer 1's element of round 0, waiting for it
    assert int(ask(1, 0)[0][0]) == 1 and rounds.held_bytes == 0
    for r in range(1, 4):
        ask(0, r)
    assert rounds.held_bytes == 3 * size and budget.used_bytes >= 3 * size
    runner.stop()  # the task is deleted: its rounds go with it, and their bytes back to the budget
    assert rounds.held_bytes == 0 and budget.used_bytes == 0 and budget.open_accounts == 0
    assert ask(1, 1) == []
    runner.thread.join(5)
    gone = weakref.ref(runner)
    runner = rounds = None
    gc.collect()
    assert gone() is None, "a stopped coordinated task must not be kept alive by its rounds"


def test_coordinated_reads_refuse_static_sharding():
    from dataservice import ShardingPolicy
    from dataservice.data.serialization import serialize_dataset
    from dataservice.dispatcher.core import DispatcherCore
    from dataservice.proto import dispatcher_pb2
    from dataservice.service.config import DispatcherConfig
    from dataservice.service.processing_modes import MODES_BY_NAME

    for policy in (ShardingPolicy.FILE, ShardingPolicy.DATA, ShardingPolicy.FILE_OR_DATA, ShardingPolicy.HINT):
        with pytest.raises(ValueError, match="coordinated reads .* do not go with static sharding"):
            Dataset.range(10).repeat().apply(distribute(policy, "localhost:1", job_name="j", consumer_index=0,
                                                        num_consumers=2))
    # At the dispatcher too (from_dataset_id, or a client that does not check).
    core = DispatcherCore(DispatcherConfig(worker_addresses=["w1:1", "w2:1"]))
    dataset_id = core.register_dataset(dispatcher_pb2.RegisterDatasetRequest(
        dataset_def=serialize_dataset(Dataset.range(10).repeat()), num_splits=1)).dataset_id
    with pytest.raises(errors.InvalidRequestError, match=r"do not go with static sharding \(shard_data\)"):
        core.get_or_create_job(dispatcher_pb2.GetOrCreateJobRequest(
            dataset_id=dataset_id, processing_mode=MODES_BY_NAME["shard_data"], job_name="j", num_consumers=2))
    core.get_or_create_job(dispatcher_pb2.GetOrCreateJobRequest(  # without num_consumers: fine
        dataset_id=dataset_id, processing_mode=MODES_BY_NAME["shard_data"], job_name="j"))


def test_the_join_margin_ignores_the_acknowledging_heartbeat_that_follows_another_at_once():
    from types import SimpleNamespace

    from dataservice.dispatcher.coordinated_rounds import MIN_JOIN_MARGIN, RoundCoordinator

    now = [0.0]
    rounds = RoundCoordinator(lambda: now[0])
    heartbeat_s = 1.0
    for t, r in ((0.0, 0), (1.0, 10), (2.0, 20)):  # 10 rounds a second
        now[0] = t
        rounds.reported(7, r, 0, heartbeat_s)
    now[0] = 2.003
    rounds.reported(7, 21, 0, heartbeat_s)  # an acknowledgement 3 ms later, one round on
    iteration = SimpleNamespace(iteration_id=1, tasks=[5], clients=[7])
    rounds.published(1)
    assert rounds.starting_round(iteration, "w2:1", heartbeat_s) is None  # pending
    target = rounds.block_round(1)
    # Furthest round 21 plus twice what 10 rounds/s cover in a heartbeat: not hundreds of rounds/s.
    assert 21 + MIN_JOIN_MARGIN <= target <= 21 + 2 * 10 + 2, target


def test_a_rotation_is_sorted_once_and_maps_rounds_as_task_of_round():
    import random

    from dataservice.dispatcher.coordinated_rounds import Rotation

    rng = random.Random(3)
    pairs = [(rng.randrange(1, 100), rng.choice([0, 0, 5, 40, 41, 300])) for _ in range(12)]
    pairs = list({task: (task, start) for task, start in pairs}.values())
    rotation = Rotation(pairs)
    for r in range(400):
        started = sorted(task for task, start in pairs if start <= r)
        assert rotation.task_of(r) == (started[r % len(started)] if started else None), r
    assert Rotation().task_of(0) is None


# --- a pipeline of unknown cardinality that ends ---------------------------------------------------------------

def _ending(count):
    """``count`` elements, of unknown cardinality (``distribute`` refuses only a known end)."""
    return Dataset.range(count).flat_map(lambda x: Dataset.from_tensors(x))


def _consumer(cluster, dataset, job_name, i, n):
    return iter(dataset.apply(distribute("parallel_epochs", cluster.target, job_name=job_name, consumer_index=i,
                                         num_consumers=n, timeout_ms=20_000)))


def _read_to_end(cluster, dataset, job_name, indices, n):
    """Consumers ``indices`` of n, each on its thread, read to the end at the same time: their values."""
    out: dict[int, list] = {}

    def consume(i):
        out[i] = [int(x) for x in _consumer(cluster, dataset, job_name, i, n)]

    def run():
        threads = [threading.Thread(target=consume, args=(i,), daemon=True) for i in indices]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    run_with_deadline(run, 30)
    assert sorted(out) == sorted(indices), "a consumer failed"
    return out


def _job_finished(cluster, job_name) -> bool:
    core = cluster.dispatcher.core
    with core._cond:
        jobs = [j for j in core.state.jobs.values() if j.name == job_name]
        return bool(jobs) and all(core.state.iterations[i].finished for j in jobs for i in j.iterations.values())


def _heartbeats_of(worker):
    """Counts the heartbeats ``worker`` sends from now on (the second one is sent once the dispatcher has
    answered the first)."""
    count = [0]
    build = worker._heartbeat_request

    def counted(wait_ms):
        count[0] += 1
        return build(wait_ms)

    worker._heartbeat_request = counted
    return lambda: count[0]


@pytest.mark.parametrize("workers, n, count", [(1, 2, 6), (1, 2, 7), (1, 3, 8), (2, 2, 6)])
def test_a_consumer_that_starts_after_the_others_read_to_the_end_still_gets_its_elements(workers, n, count):
    # The last consumer starts only once the others have read to the end and the workers have heartbeaten
    # since: its elements wait for it in the workers' rounds, and the job does not finish before it took them
    # (it used to: that consumer then got end of input at once). A round a stream cannot fill (7 elements: 3
    # rounds of 2 and 1 left; 8: 2 rounds of 3 and 2 left) goes to nobody, so the consumers stay aligned.
    job_name = f"late-{workers}-{n}-{count}"
    with TestCluster(num_workers=workers) as cluster:
        dataset = _ending(count)
        out = _read_to_end(cluster, dataset, job_name, range(n - 1), n)
        heartbeats = [_heartbeats_of(worker) for worker in cluster.workers]
        wait_until(lambda: all(h() >= 2 for h in heartbeats), 10, "the workers to report their tasks")
        out.update(_read_to_end(cluster, dataset, job_name, [n - 1], n))
        # Every consumer took its elements: the tasks finish, the job with them, and the rounds' bytes go back.
        wait_until(lambda: _job_finished(cluster, job_name), 10, "the job to finish")
        wait_until(lambda: all(w.memory_budget.used_bytes == 0 for w in cluster.workers), 10,
                   "the workers to free the tasks")
    # Each worker's stream is the whole dataset (parallel_epochs); the workers serve alternate rounds.
    assert out == {i: [r * n + i for r in range(count // n) for _ in range(workers)] for i in range(n)}


def test_a_consumer_gets_the_rounds_it_fetched_ahead_after_the_job_finished():
    # Consumer 1 takes one element; its reader fetches its next rounds ahead (and learns where the stream ends).
    # Consumer 0 then reads to the end, which finishes the job: every round was taken at the worker. Hearing
    # so from the dispatcher, consumer 1's reader used to end its read at the consumer's next round, dropping
    # the rounds it held; it delivers them, then end of input.
    with TestCluster(num_workers=1, client_timeout_ms=1_000) as cluster:  # readers heartbeat every 250 ms
        dataset = _ending(7)
        late = _consumer(cluster, dataset, "ahead", 1, 2)
        first = run_with_deadline(lambda: int(next(late)), 20)
        out = _read_to_end(cluster, dataset, "ahead", [0], 2)
        wait_until(lambda: _job_finished(cluster, "ahead"), 10, "the job to finish")
        reader = _reader_of(late)
        wait_until(lambda: getattr(reader, "_iteration_finished", False) or not reader._heartbeat.is_alive(), 10,
                   "consumer 1's reader to hear that the job finished")
        rest = run_with_deadline(lambda: [int(x) for x in late], 20)
    assert out[0] == [0, 2, 4] and [first] + rest == [1, 3, 5]


def test_a_task_whose_stream_ends_finishes_once_every_consumer_took_its_whole_rounds():
    import numpy as np

    from dataservice.proto import dispatcher_pb2, state_pb2, worker_pb2
    from dataservice.worker.memory_budget import MemoryBudget
    from dataservice.worker.task_runner import TaskRunner, approximate_size

    budget = MemoryBudget(1 << 30)
    task_def = dispatcher_pb2.TaskDef(task_id=1, iteration_id=2, job_id=3, processing_mode=state_pb2.PARALLEL_EPOCHS,
                                      num_consumers=2)
    runner = TaskRunner(task_def, Dataset.range(7).map(lambda i: np.full(1000, i)), None, "localhost:0", budget=budget)
    rounds = runner.rounds = round_robin.Rounds(runner, 2, budget)
    size = approximate_size(np.full(1000, 0))

    def ask(consumer, round_index):
        request = worker_pb2.GetElementsRequest(task_id=1, max_elements=1, consumer_index=consumer,
                                                round_index=round_index)
        return rounds.take(request, 5.0)

    try:
        assert [int(ask(0, r)[0][0][0]) for r in range(3)] == [0, 2, 4]
        elements, _, ended, error = ask(0, 3)  # one element left: too few for a round
        assert elements == [] and ended and error is None
        # Consumer 1's three elements wait for it; the last one (6) was dropped for both.
        assert rounds.held_bytes == 3 * size and budget.used_bytes == 3 * size
        assert not runner.finished and not rounds.drained  # the dispatcher must not finish the iteration yet
        assert [int(ask(1, r)[0][0][0]) for r in range(3)] == [1, 3, 5]
        assert rounds.held_bytes == 0 and rounds.drained and runner.finished
        assert ask(1, 3)[2]  # the end, at the same round as consumer 0
    finally:
        runner.stop()
