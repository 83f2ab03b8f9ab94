"""Long polls cannot starve other RPCs: with 64 heartbeat long polls all waiting at once (each a
coroutine of the dispatcher's asyncio server, none holding a thread), the calls a read makes and a
real worker's heartbeats are answered at once."""

from __future__ import annotations

import threading
import time

from dataservice import Dataset, register_dataset
from dataservice.proto import dispatcher_pb2 as pb
from dataservice.proto import state_pb2
from dataservice.service.dispatcher_client import DispatcherClient
from tests.cluster import TestCluster, wait_until

POLLS = 64


def test_64_long_polls_do_not_delay_a_read_or_a_workers_heartbeat():
    # worker_timeout_ms of 60 s lets each long poll wait up to 30 s: on a thread-per-call server
    # every RPC thread would be held that long.
    with TestCluster(num_workers=1, worker_timeout_ms=60_000) as cluster:
        core = cluster.dispatcher.core
        pollers = [DispatcherClient(cluster.dispatcher_address, timeout_ms=40_000) for _ in range(4)]
        stop = threading.Event()

        def poll(i: int) -> None:
            request = pb.WorkerHeartbeatRequest(worker_address=f"127.0.0.1:{20_000 + i}", worker_uid=f"fake-{i}",
                                                wait_ms=30_000)
            while not stop.is_set():
                try:
                    pollers[i % 4].worker_heartbeat(request)
                except Exception:
                    return
                stop.wait(0.05)  # as a real worker does when answered early without news

        threads = [threading.Thread(target=poll, args=(i,), daemon=True) for i in range(POLLS)]
        for t in threads:
            t.start()
        client = DispatcherClient(cluster.dispatcher_address, timeout_ms=10_000)
        try:
            wait_until(lambda: core.wakeups.waiting() >= POLLS, 20, "every long poll to wait")
            # Every poller has registered (on a loaded machine its thread's first call may come late).
            wait_until(lambda: cluster.num_registered_workers() == POLLS + 1, 20, "every poller to register")
            started = time.monotonic()
            dataset_id = register_dataset(cluster.target, Dataset.range(10))
            job_id = client.get_or_create_job(dataset_id, state_pb2.DISTRIBUTED_EPOCH, "")
            client.get_or_create_iteration(job_id, 0)
            status = client.get_status()
            elapsed = time.monotonic() - started
            # Starved, these calls would wait for a long poll to end: 30 s.
            assert elapsed < 5, f"the calls a read makes took {elapsed:.1f} s behind {POLLS} long polls"
            assert status.counts.workers == POLLS + 1
            # The real worker's heartbeats keep coming: its last one is recent.
            real = cluster.workers[0].address
            wait_until(lambda: time.time() - {w.address: w.last_heartbeat_unix
                                              for w in client.get_status().workers}.get(real, 0) < 1.0, 5,
                       "a fresh heartbeat from the real worker")
        finally:
            stop.set()
            client.close()
            for p in pollers:
                p.close()
            for t in threads:
                t.join(timeout=5)


def test_a_change_wakes_only_the_polls_it_concerns_and_none_is_lost():
    import asyncio

    from dataservice.dispatcher.long_polls import ALL, Wakeups

    async def scenario():
        wakeups = Wakeups()
        w1, w2 = ("worker", "w1:1"), ("worker", "w2:1")
        polls = {key: asyncio.ensure_future(wakeups.wait(key, wakeups.generation(key), 30)) for key in (w1, w2)}
        await asyncio.sleep(0)  # both parked
        assert wakeups.waiting() == 2
        wakeups.notify([w1])
        assert await asyncio.wait_for(polls[w1], 5) is True  # woken, long before its 30 s
        assert not polls[w2].done() and wakeups.waiting() == 1
        # A change between reading the generation and waiting is not lost: the wait returns at once.
        seen = wakeups.generation(w2)
        wakeups.notify([w2])
        assert await asyncio.wait_for(wakeups.wait(w2, seen, 30), 5) is True
        wakeups.notify([ALL])  # every poll
        assert await asyncio.wait_for(polls[w2], 5) is True
        # Nothing changed: the wait times out, and leaves no waiter behind.
        assert await wakeups.wait(w1, wakeups.generation(w1), 0.05) is False
        assert wakeups.waiting() == 0
        wakeups.forget(w1)
        assert wakeups.generation(w1) == (0, 1)

    asyncio.run(scenario())


def test_a_wait_says_whether_it_was_woken_or_timed_out_and_raises_neither():
    import asyncio

    import pytest

    from dataservice.dispatcher.long_polls import wait_or_timeout

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert await wait_or_timeout(loop.create_future(), 0.01) is False  # timed out: no TimeoutError
        woken = loop.create_future()
        loop.call_soon(woken.set_result, None)
        assert await wait_or_timeout(woken, 10) is True
        # A call cancelled while it waits (its client went away) is cancelled, not told it timed out.
        waiting = asyncio.ensure_future(wait_or_timeout(loop.create_future(), 10))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(main())


def test_thousands_of_waiters_woken_at_once_are_woken_a_batch_at_a_time_spaced_apart():
    # A new job is news to every worker: their polls wake FAN_OUT_BATCH at a time, WAKE_SPACING_S apart, and
    # what the loop has to do meanwhile (a new call, a due timer) runs between two batches, not after all.
    import asyncio

    from dataservice.dispatcher.long_polls import FAN_OUT_BATCH, WAKE_SPACING_S, Wakeups

    wakeups = Wakeups()
    order: list = []
    woken_at: dict = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def poll(i: int) -> None:
            since = wakeups.generation(("worker", i))
            assert await wakeups.wait(("worker", i), since, 10.0) is True
            order.append(i)
            woken_at[i] = loop.time()

        polls = [asyncio.ensure_future(poll(i)) for i in range(10 * FAN_OUT_BATCH)]
        await asyncio.sleep(0)  # every poll waits
        wakeups.notify([("worker", i) for i in range(10 * FAN_OUT_BATCH)])
        loop.call_soon(order.append, "other")  # another call's work, ready after the notify
        await asyncio.wait_for(asyncio.gather(*polls), 10)

    asyncio.run(main())
    assert sorted(i for i in order if i != "other") == list(range(10 * FAN_OUT_BATCH))
    assert order.index("other") < FAN_OUT_BATCH + 1  # not behind the 80 polls woken
    assert wakeups.wake_turns == 10 and wakeups.fan_outs == 1
    # The loop's clock: a batch is woken no sooner than WAKE_SPACING_S after the one before.
    firsts = [woken_at[b * FAN_OUT_BATCH] for b in range(10)]
    assert all(later - earlier >= WAKE_SPACING_S * 0.99 for earlier, later in zip(firsts, firsts[1:])), firsts


def test_a_targeted_wake_is_not_queued_behind_a_fan_out_being_paced():
    # One worker's news (or an iteration's freed split) while thousands are being woken a batch at a time:
    # its poll wakes at once, not WAKE_SPACING_S per batch later.
    import asyncio

    from dataservice.dispatcher.long_polls import FAN_OUT_BATCH, Wakeups

    wakeups = Wakeups()
    woken: list = []

    async def main() -> None:
        async def poll(key) -> None:
            since = wakeups.generation(key)
            assert await wakeups.wait(key, since, 10.0) is True
            woken.append(key)

        fleet = [asyncio.ensure_future(poll(("worker", i))) for i in range(20 * FAN_OUT_BATCH)]
        split = asyncio.ensure_future(poll(("iteration", 7)))
        await asyncio.sleep(0)
        wakeups.notify([("worker", i) for i in range(20 * FAN_OUT_BATCH)])  # paced: about a second in all
        await asyncio.sleep(0)
        wakeups.notify([("iteration", 7)])
        await asyncio.wait_for(split, 10)
        assert len(woken) <= 2 * FAN_OUT_BATCH + 1, "the iteration's poll waited behind the fan-out"
        await asyncio.wait_for(asyncio.gather(*fleet), 10)

    asyncio.run(main())
    assert len(woken) == 20 * FAN_OUT_BATCH + 1


def _core_with_workers(count: int, mode: int):
    """A core with ``count`` workers registered (full task lists, as an old worker sends) and a job in ``mode``."""
    from dataservice.data.serialization import serialize_dataset
    from dataservice.dispatcher.core import DispatcherCore
    from dataservice.service.config import DispatcherConfig

    core = DispatcherCore(DispatcherConfig())
    workers = [f"10.0.0.{i}:5051" for i in range(count)]
    for i, address in enumerate(workers):
        core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address=address, worker_uid=f"w{i}"))
    dataset_id = core.register_dataset(pb.RegisterDatasetRequest(
        dataset_def=serialize_dataset(Dataset.range(1000)), num_splits=4)).dataset_id
    job_id = core.get_or_create_job(pb.GetOrCreateJobRequest(dataset_id=dataset_id, processing_mode=mode)).job_id
    return core, workers, job_id


def _tasks_by_worker(core) -> dict:
    return {t.worker_address: t.task_id for t in core.state.tasks.values()}


def test_a_new_iterations_tasks_for_many_workers_are_news_woken_as_one_paced_fan_out():
    # A new iteration is news to every worker (a task committed, or to be made, for each): notified one at a
    # time, each notify would wake its one worker at once, and 2,000 workers would all be answered in one burst.
    import asyncio

    from dataservice.dispatcher.core import EAGER_TASK_WORKERS
    from dataservice.dispatcher.long_polls import WAKE_BATCH

    core, workers, job_id = _core_with_workers(2 * WAKE_BATCH + 3, state_pb2.DISTRIBUTED_EPOCH)

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def poll(address: str) -> bool:
            key = ("worker", address)
            return await core.wakeups.wait(key, core.wakeups.generation(key), 10.0)

        polls = [asyncio.ensure_future(poll(a)) for a in workers]
        await asyncio.sleep(0)  # every poll waits
        assert core.wakeups.waiting() == len(workers)
        # As the server runs it: on a pool thread, the core notifying from there.
        await loop.run_in_executor(None, core.get_or_create_iteration,
                                   pb.GetOrCreateIterationRequest(job_id=job_id, repetition=0))
        assert await asyncio.wait_for(asyncio.gather(*polls), 10) == [True] * len(workers)  # all had news

    asyncio.run(main())
    assert core.wakeups.fan_outs == 1 and core.wakeups.wake_turns == 9  # 67 waiters: 8 a turn, then 3
    # distributed_epoch: the first workers' tasks are made at once, the others' by the pass that answers
    # each woken poll (any task serves the one split stream).
    assert sorted(_tasks_by_worker(core)) == sorted(workers[:EAGER_TASK_WORKERS])
    for i, address in enumerate(workers):
        response = core.worker_heartbeat_again(pb.WorkerHeartbeatRequest(worker_address=address, worker_uid=f"w{i}"))
        assert [t.worker_address for t in response.new_tasks] == [address]
    assert sorted(_tasks_by_worker(core)) == sorted(workers)
    assert {t.iteration_id for t in core.state.tasks.values()} == {next(iter(core.state.iterations))}


def test_a_fleets_deferred_tasks_are_made_by_each_workers_next_heartbeat_and_not_once_the_reader_left():
    # A worker whose poll was not waiting (between two polls) gets its task from its next heartbeat, full
    # list or delta; one first heard from after the iteration lost its reader gets none, and has none to drop.
    from dataservice.dispatcher.core import EAGER_TASK_WORKERS

    core, workers, job_id = _core_with_workers(EAGER_TASK_WORKERS + 3, state_pb2.DISTRIBUTED_EPOCH)
    late = workers[EAGER_TASK_WORKERS:]
    # One of the late workers speaks deltas (and had a view built, settled, before the read began).
    delta_worker = late[0]
    uid = f"w{EAGER_TASK_WORKERS}"
    core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address=delta_worker, worker_uid=uid, heartbeat_seq=1),
                          may_wait=False)
    core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address=delta_worker, worker_uid=uid, heartbeat_seq=2,
                                                    tasks_delta=True, base_seq=1), may_wait=False)
    assert core._task_views.is_settled(delta_worker)  # its deltas skip the walk over its tasks, until owed one
    it = core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id, repetition=0))
    assert not set(late) & set(_tasks_by_worker(core))
    response = core.worker_heartbeat(pb.WorkerHeartbeatRequest(
        worker_address=delta_worker, worker_uid=uid, heartbeat_seq=3, tasks_delta=True, base_seq=2), may_wait=False)
    assert [t.iteration_id for t in response.new_tasks] == [it.iteration_id]
    response = core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address=late[1],
                                                               worker_uid=f"w{EAGER_TASK_WORKERS + 1}"), may_wait=False)
    assert [t.iteration_id for t in response.new_tasks] == [it.iteration_id]
    # The reader leaves: the iteration is unread, and the last late worker hears of no task in it.
    core.release_iteration_client(pb.ReleaseIterationClientRequest(client_id=it.client_id, read_key=it.read_key))
    response = core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address=late[2],
                                                               worker_uid=f"w{EAGER_TASK_WORKERS + 2}"), may_wait=False)
    assert not response.new_tasks and late[2] not in _tasks_by_worker(core)


def test_a_new_parallel_epochs_iteration_has_every_workers_task_made_at_once():
    # Each worker's task is a stream of its own there: how many exist as the read starts decides its elements.
    from dataservice.dispatcher.core import EAGER_TASK_WORKERS

    core, workers, job_id = _core_with_workers(EAGER_TASK_WORKERS + 5, state_pb2.PARALLEL_EPOCHS)
    core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id, repetition=0))
    assert sorted(_tasks_by_worker(core)) == sorted(workers)
