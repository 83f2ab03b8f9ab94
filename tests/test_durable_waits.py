"""Calls waiting on the event loop for the journal's group commit (``dispatcher/durable_waits.py``): one
wake-up of the loop per fsync, however many calls it covers; a failed write still fails each call (after a
rollback) through the blocking wait; a call cancelled while it waits leaves nothing behind."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from dataservice import Dataset, DispatcherConfig, DispatchServer, register_dataset
from dataservice.dispatcher.durable_waits import DurableWaits
from dataservice.dispatcher.journal import DurableWait, Journal, JournalError
from dataservice.proto import dispatcher_pb2, dispatcher_pb2_grpc, state_pb2
from dataservice.service.rpc import make_channel
from tests.journals import fail_writes


def _update(dataset_id: int) -> state_pb2.Update:
    return state_pb2.Update(register_dataset=state_pb2.RegisterDatasetUpdate(
        dataset_id=dataset_id, dataset_def=b"pipeline", num_splits=1))


@pytest.fixture
def journal(tmp_path):
    journal = Journal(str(tmp_path))
    journal.open()
    try:
        yield journal
    finally:
        journal.close()


class _Pool:
    """``run_blocking`` for the waits: counts what falls back to the blocking wait, and runs it on a thread."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, wait):
        self.calls += 1
        return asyncio.get_running_loop().run_in_executor(None, wait)


def _pending(journal: Journal, seq: int) -> DurableWait:
    return DurableWait(journal, seq, lambda: journal.wait_durable(seq, timeout_s=10))


def test_many_waiting_calls_are_woken_by_the_fsyncs_not_by_a_thread_each(journal):
    pool = _Pool()
    waits = DurableWaits(pool)

    async def main() -> None:
        # The calls wait first, for records appended after: each is released by a wake-up, none finds its
        # record durable already.
        calls = [asyncio.ensure_future(waits.wait(_pending(journal, seq))) for seq in range(1, 201)]
        await asyncio.sleep(0)
        for i in range(1, 201):
            journal.append(_update(i))
        await asyncio.wait_for(asyncio.gather(*calls), 10)

    asyncio.run(main())
    assert all(journal.is_durable(seq) for seq in range(1, 201))
    assert pool.calls == 0  # nothing went through the pool
    assert waits.released == 200
    assert 1 <= waits.wakeups <= journal.fsyncs  # one wake-up of the loop per fsync at most


def test_a_call_already_durable_does_not_wait(journal):
    seq = journal.append(_update(1))
    journal.wait_durable(seq)
    pool = _Pool()
    waits = DurableWaits(pool)
    asyncio.run(asyncio.wait_for(waits.wait(_pending(journal, seq)), 5))
    assert pool.calls == 0 and waits.released == 0


def test_a_failed_write_fails_every_waiting_call_through_the_blocking_wait(journal):
    journal.wait_durable(journal.append(_update(1)))
    fail_writes(journal)
    pool = _Pool()
    waits = DurableWaits(pool)

    async def main() -> list:
        pending = [_pending(journal, journal.append(_update(i))) for i in range(2, 6)]
        return await asyncio.wait_for(asyncio.gather(*(waits.wait(p) for p in pending), return_exceptions=True), 10)

    outcomes = asyncio.run(main())
    assert all(isinstance(o, JournalError) and "No space left on device" in str(o) for o in outcomes), outcomes
    assert pool.calls == 4  # each fell back to the wait that raises (and, in the store, rolls back)


def test_a_call_cancelled_while_it_waits_leaves_the_others_to_be_woken(journal):
    waits = DurableWaits(_Pool())

    async def main() -> None:
        first = asyncio.ensure_future(waits.wait(_pending(journal, journal.append(_update(1)))))
        second = asyncio.ensure_future(waits.wait(_pending(journal, journal.append(_update(2)))))
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.wait_for(second, 10)
        with pytest.raises(asyncio.CancelledError):
            await first

    asyncio.run(main())
    assert journal.is_durable(2)


def test_a_failed_write_fails_a_call_answered_on_the_loop_and_the_next_goes_through(tmp_path):
    # GetOrCreateJob runs on the event loop (grpc_service._ON_LOOP), so it waits for its fsync there.
    server = DispatchServer(DispatcherConfig(fault_tolerant_mode=True, work_dir=str(tmp_path)))
    channel = make_channel(f"localhost:{server.port}")
    try:
        dataset_id = register_dataset(server.target, Dataset.range(3))
        stub = dispatcher_pb2_grpc.DispatcherStub(channel)
        request = dispatcher_pb2.GetOrCreateJobRequest(dataset_id=dataset_id,
                                                       processing_mode=state_pb2.PARALLEL_EPOCHS, job_name="named")
        fail_writes(server.core.store.journal)
        with pytest.raises(grpc.RpcError) as info:
            stub.GetOrCreateJob(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # the caller may retry
        assert "journal write failed" in info.value.details() and "No space left" in info.value.details()
        with server.core._cond:
            assert not server.core.state.jobs  # rolled back: the job was not made
        job_id = stub.GetOrCreateJob(request, timeout=10).job_id  # reopened on a fresh descriptor
        with server.core._cond:
            assert list(server.core.state.jobs) == [job_id]
    finally:
        channel.close()
        server.stop()


def test_under_a_steady_load_the_flusher_waits_for_more_records_and_when_idle_it_does_not(journal, monkeypatch):
    # GROUP_COMMIT_LINGER_S made large, so that what joins a batch does not depend on this machine's speed.
    import time

    from dataservice.dispatcher import journal as journal_module

    monkeypatch.setattr(journal_module, "GROUP_COMMIT_LINGER_S", 0.5)
    journal.wait_durable(journal.append(_update(1)))  # an fsync just ended: the load looks steady
    second = journal.append(_update(2))
    time.sleep(0.01)
    third = journal.append(_update(3))  # while the flusher lingers
    journal.wait_durable(third)
    assert journal.is_durable(second) and journal.fsyncs == 2  # the two shared one fsync
    time.sleep(journal_module.GROUP_COMMIT_BUSY_S * 4)  # idle now
    journal.wait_durable(journal.append(_update(4)), timeout_s=0.4)  # written at once, not after 0.5 s
    assert journal.fsyncs == 3
