"""The dispatcher's journal and JournaledStore on real files (no gRPC): framing,
torn tails, corruption, checkpoints, group commit, and rolling back a failed write.
The refusals of damaged work_dirs and ``recover=True`` are in test_journal_integrity.py."""

from __future__ import annotations

import logging
import os
import random
import threading

import pytest

from dataservice import errors
from dataservice.dispatcher import journal as journal_mod
from dataservice.dispatcher.core import INFINITE, DispatcherCore
from dataservice.dispatcher.journal import Journal, JournalCorruptionError, JournalError, read_records
from dataservice.dispatcher.journaled_store import JournaledStore
from dataservice.dispatcher.state import DispatcherState
from dataservice.proto import dispatcher_pb2 as pb
from dataservice.proto import state_pb2
from dataservice.service.config import DispatcherConfig
from tests.journals import comparable, fail_writes, replay

HEADER = journal_mod._HEADER.size
#: The journal's first record: the header naming the checkpoint it continues from.
JOURNAL_HEADER = HEADER + journal_mod.MARKER_SIZE


def dataset_update(i: int) -> state_pb2.Update:
    return state_pb2.Update(register_dataset=state_pb2.RegisterDatasetUpdate(
        dataset_id=1000 + i, fingerprint=f"fp{i}", dataset_def=bytes([i % 251]) * (10 + i), num_splits=i))


def write_journal(work_dir, n: int) -> list[state_pb2.Update]:
    journal = Journal(str(work_dir))
    assert journal.open() == []
    updates = [dataset_update(i) for i in range(n)]
    for update in updates:
        seq = journal.append(update)
    journal.wait_durable(seq)
    journal.close()
    return updates


def journal_path(work_dir) -> str:
    return os.path.join(str(work_dir), journal_mod.JOURNAL_FILE)


def record_offsets(work_dir) -> list[int]:
    """Where each update record of the journal starts (after its header)."""
    records, _ = read_records(journal_path(work_dir), tolerate_torn_tail=False)
    offsets, offset = [], 0
    for _, payload in records:
        offsets.append(offset)
        offset += HEADER + len(payload)
    assert offsets[0] == 0 and journal_mod._JOURNAL_MAGIC in records[0][1]
    return offsets[1:]


def state_from(updates) -> DispatcherState:
    state = DispatcherState()
    for update in updates:
        state.apply(update)
    return state


def state_of(updates) -> list[bytes]:
    """A comparable form of the state ``updates`` build."""
    return comparable(state_from(updates))


# --- framing ---------------------------------------------------------------------------------

def test_records_round_trip_with_sequence_numbers(tmp_path):
    updates = write_journal(tmp_path, 20)
    records, end = read_records(journal_path(tmp_path), tolerate_torn_tail=False)
    header, *records = records
    assert header[0] == 0 and journal_mod._JOURNAL_MAGIC in header[1]  # continues from the empty state
    assert [seq for seq, _ in records] == list(range(1, 21))
    assert end == os.path.getsize(journal_path(tmp_path))
    assert replay(tmp_path) == updates

    # Appends after a reopen continue the sequence.
    journal = Journal(str(tmp_path))
    journal.open()
    seq = journal.append(dataset_update(99))
    journal.wait_durable(seq)
    journal.close()
    assert seq == 21
    assert replay(tmp_path) == updates + [dataset_update(99)]


def test_append_after_close_is_a_journal_error(tmp_path):
    journal = Journal(str(tmp_path))
    journal.open()
    journal.close()
    with pytest.raises(JournalError, match="not open"):
        journal.append(dataset_update(1))


# --- torn tails --------------------------------------------------------------------------------
# A torn write is one the crash interrupted: never acknowledged, so past what the MANIFEST says
# is durable. (The end of the acknowledged records removed is refused: test_journal_integrity.py.)

def _truncated_header(frame: bytes) -> bytes:
    return frame[:5]


def _truncated_body(frame: bytes) -> bytes:
    return frame[:-3]


def _bad_crc(frame: bytes) -> bytes:
    flipped = bytearray(frame)
    flipped[-1] ^= 0x40
    return bytes(flipped)


@pytest.mark.parametrize("tear", [_truncated_header, _truncated_body, _bad_crc],
                         ids=["truncated-header", "truncated-body", "bad-crc"])
def test_torn_last_write_is_dropped_with_a_warning(tmp_path, caplog, tear):
    updates = write_journal(tmp_path, 5)
    valid_end = os.path.getsize(journal_path(tmp_path))
    unacknowledged = journal_mod._frame(6, dataset_update(6).SerializeToString())
    with open(journal_path(tmp_path), "ab") as f:
        f.write(tear(unacknowledged))

    journal = Journal(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="dataservice.dispatcher.journal"):
        assert journal.open() == updates
    assert f"torn tail at offset {valid_end}" in caplog.text
    # The torn bytes are cut off: the next record lands where the last good one ended.
    assert os.path.getsize(journal_path(tmp_path)) == valid_end
    seq = journal.append(dataset_update(50))
    journal.wait_durable(seq)
    journal.close()
    assert seq == 6  # the torn record's number is reused: it was never acknowledged
    assert record_offsets(tmp_path)[-1] == valid_end
    assert replay(tmp_path) == updates + [dataset_update(50)]


def _small_length_then_junk() -> bytes:
    # A header whose length fits in the file and whose CRC is wrong, with bytes after it:
    # still nothing valid follows, so it is a torn tail, not corruption.
    return journal_mod._HEADER.pack(4, 12345, 7) + b"abcd" + b"\x00" * 40


@pytest.mark.parametrize("garbage", [b"\x00" * 100, b"\xff" * 37, _small_length_then_junk(),
                                     random.Random(7).randbytes(300)],
                         ids=["zeros", "ones", "small-length-then-junk", "random"])
def test_garbage_after_the_last_record_is_dropped(tmp_path, caplog, garbage):
    updates = write_journal(tmp_path, 3)
    valid_end = os.path.getsize(journal_path(tmp_path))
    with open(journal_path(tmp_path), "ab") as f:
        f.write(garbage)
    with caplog.at_level(logging.WARNING, logger="dataservice.dispatcher.journal"):
        assert replay(tmp_path) == updates
    assert f"torn tail at offset {valid_end}" in caplog.text
    assert os.path.getsize(journal_path(tmp_path)) == valid_end


# --- corruption before the tail ---------------------------------------------------------------

def _flip_payload_byte(data: bytearray, offset: int) -> None:
    data[offset + HEADER + 2] ^= 0x01


def _huge_length(data: bytearray, offset: int) -> None:
    # A length running past the end of the file looks like a torn tail, but valid
    # records follow: dropping them would lose acknowledged updates.
    data[offset:offset + 4] = (1 << 30).to_bytes(4, "little")


@pytest.mark.parametrize("corrupt", [_flip_payload_byte, _huge_length], ids=["flipped-bit", "bad-length"])
@pytest.mark.parametrize("victim", [0, 2])
def test_corruption_before_the_tail_stops_the_open(tmp_path, corrupt, victim):
    write_journal(tmp_path, 5)
    offset = record_offsets(tmp_path)[victim]
    with open(journal_path(tmp_path), "rb") as f:
        data = bytearray(f.read())
    corrupt(data, offset)
    with open(journal_path(tmp_path), "wb") as f:
        f.write(data)
    size = len(data)

    with pytest.raises(JournalCorruptionError, match=f"offset {offset} in .*journal.log") as info:
        replay(tmp_path)
    assert (info.value.filename, info.value.offset) == (journal_path(tmp_path), offset)
    assert isinstance(info.value, errors.DataServiceError)
    assert os.path.getsize(journal_path(tmp_path)) == size  # nothing was cut


def test_corrupted_checkpoint_stops_the_open(tmp_path):
    store = JournaledStore(str(tmp_path), checkpoint_records=3)
    store.open()
    for i in range(4):
        store.commit(dataset_update(i))
    store.wait_durable()
    store.close()
    checkpoint = os.path.join(str(tmp_path), journal_mod.CHECKPOINT_FILE)
    inside_first_update = HEADER + journal_mod.MARKER_SIZE + HEADER + 5  # after the marker record
    with open(checkpoint, "r+b") as f:
        f.seek(inside_first_update)
        byte = f.read(1)
        f.seek(inside_first_update)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(JournalCorruptionError, match=f"offset {HEADER + journal_mod.MARKER_SIZE} in .*checkpoint.bin"):
        replay(tmp_path)


# --- checkpoints ------------------------------------------------------------------------------

def make_core(work_dir, checkpoint_records: int):
    store = JournaledStore(str(work_dir), checkpoint_records=checkpoint_records)
    store.open()
    core = DispatcherCore(DispatcherConfig(), store=store)
    return core, store


def test_checkpoints_bound_the_journal_and_replay_to_the_same_state(tmp_path):
    core, store = make_core(tmp_path, checkpoint_records=500)
    dataset_id = core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"pipeline", num_splits=INFINITE)
                                       ).dataset_id
    core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address="w:1", worker_uid="u1"))
    job_id = core.get_or_create_job(pb.GetOrCreateJobRequest(
        dataset_id=dataset_id, processing_mode=state_pb2.DISTRIBUTED_EPOCH, job_name="train")).job_id
    iteration_id = core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id)).iteration_id
    task_id = core.state.iterations[iteration_id].tasks[0]
    largest_journal = 0
    for _ in range(5000):
        core.get_split(pb.GetSplitRequest(iteration_id=iteration_id, task_id=task_id))
        # A forked child writes each checkpoint; the journal is cut once it is in place.
        assert store.journal.wait_checkpoint()
        largest_journal = max(largest_journal, os.path.getsize(store.journal.journal_path))
    store.wait_durable()
    assert core.state.iterations[iteration_id].next_split == 5000

    # One LeaseSplits record is ~30 bytes: 5,000 without checkpoints would be ~150 kB.
    record = HEADER + len(state_pb2.Update(lease_splits=state_pb2.LeaseSplitsUpdate(
        iteration_id=iteration_id, task_id=task_id, split_indices=[4999])).SerializeToString())
    assert largest_journal <= 510 * record
    expected = comparable(core.state)
    next_id = core.state.next_id()
    store.close()

    restarted = JournaledStore(str(tmp_path), checkpoint_records=500)
    restarted.open()
    try:
        assert restarted.replayed_updates < 600  # the checkpoint plus what followed it, not 5,000
        assert comparable(restarted.state) == expected
        assert restarted.state.next_id() >= next_id
    finally:
        restarted.close()


def test_crash_between_checkpoint_and_truncate_skips_covered_records(tmp_path):
    """The checkpoint is renamed into place, then the process dies before the new journal
    replaces the old one: the stale records carry sequence numbers the checkpoint covers."""
    updates = write_journal(tmp_path, 10)
    with open(journal_path(tmp_path), "rb") as f:
        before_truncate = f.read()

    journal = Journal(str(tmp_path))
    replayed = journal.open()
    journal.checkpoint(state_from(replayed).to_updates(), journal.last_seq)
    journal.close()
    assert os.path.getsize(journal_path(tmp_path)) == JOURNAL_HEADER  # a new journal: just its header
    with open(journal_path(tmp_path), "wb") as f:
        f.write(before_truncate)  # as if the new journal never replaced the old one

    journal = Journal(str(tmp_path))
    assert state_of(journal.open()) == state_of(updates)
    seq = journal.append(dataset_update(77))  # lands after the stale records
    journal.wait_durable(seq)
    journal.close()
    assert seq == 11
    assert state_of(replay(tmp_path)) == state_of(updates + [dataset_update(77)])


def test_checkpoint_of_an_empty_state_still_covers_its_records(tmp_path):
    """A checkpoint with no updates carries its sequence number in a marker record."""
    write_journal(tmp_path, 3)
    with open(journal_path(tmp_path), "rb") as f:
        before_truncate = f.read()
    journal = Journal(str(tmp_path))
    journal.open()
    journal.checkpoint([], journal.last_seq)
    journal.close()
    with open(journal_path(tmp_path), "wb") as f:
        f.write(before_truncate)
    assert replay(tmp_path) == []


# --- group commit ----------------------------------------------------------------------------

def test_concurrent_commits_share_fsyncs(tmp_path):
    store = JournaledStore(str(tmp_path))
    store.open()
    lock = threading.Condition()
    store.bind_lock(lock)
    threads, per_thread = 8, 40
    start = threading.Barrier(threads)
    failures = []

    def committer(t: int) -> None:
        try:
            start.wait()
            for i in range(per_thread):
                with lock:  # what the core does around every commit
                    store.commit(dataset_update(t * per_thread + i))
                store.wait_durable()  # what the gRPC adapter does after every RPC, outside the lock
        except BaseException as exc:  # surfaced below
            failures.append(exc)

    workers = [threading.Thread(target=committer, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert failures == []
    journal = store.journal
    assert journal.records_written == threads * per_thread
    assert journal.fsyncs < journal.records_written
    store.close()
    assert len(replay(tmp_path)) == threads * per_thread


def test_a_burst_of_appends_takes_few_fsyncs(tmp_path):
    journal = Journal(str(tmp_path))
    journal.open()
    for i in range(200):
        seq = journal.append(dataset_update(i))
    journal.wait_durable(seq)
    assert journal.records_written == 200
    assert journal.fsyncs <= 10
    journal.close()


# --- a failing write -------------------------------------------------------------------------

def register(core, blob: bytes) -> int:
    return core.register_dataset(pb.RegisterDatasetRequest(dataset_def=blob, num_splits=4)).dataset_id


def test_failed_write_rolls_the_state_back_and_reopens(tmp_path):
    core, store = make_core(tmp_path, checkpoint_records=1000)
    first = register(core, b"first")
    core.wait_durable()
    fail_writes(store.journal)

    second = register(core, b"second")  # applied and queued; the write fails
    with pytest.raises(JournalError, match="journal write failed .*No space left on device"):
        core.wait_durable()
    with core._cond:
        assert list(core.state.datasets) == [first]
    assert not store.journal.failed  # reopened on a fresh descriptor

    third = register(core, b"second")
    core.wait_durable()
    assert third > second  # ids only grow, even across a rollback
    store.close()
    assert sorted(u.register_dataset.dataset_id for u in replay(tmp_path)) == [first, third]


def test_rollback_cuts_records_written_but_never_fsynced(tmp_path):
    """A write that reached the file but whose fsync failed must not come back on replay."""
    core, store = make_core(tmp_path, checkpoint_records=1000)
    first = register(core, b"first")
    core.wait_durable()
    journal = store.journal
    fail_writes(journal)
    register(core, b"lost")
    with journal._cond:
        journal._cond.wait_for(lambda: journal._failed is not None, 5)
    # The bytes land in the file after all (as with a failed fsync after a good write).
    lost = journal_mod._frame(journal.last_seq, dataset_update(5).SerializeToString())
    with open(journal_path(tmp_path), "ab") as f:
        f.write(lost)

    with pytest.raises(JournalError):
        core.wait_durable()
    assert list(core.state.datasets) == [first]
    store.close()
    assert [u.register_dataset.dataset_id for u in replay(tmp_path)] == [first]


def test_a_commit_after_an_unnoticed_failure_rolls_back_and_fails(tmp_path):
    """No wait_durable ran after the failed write (e.g. a garbage collection): the next
    commit finds the journal failed, rolls back and fails itself."""
    core, store = make_core(tmp_path, checkpoint_records=1000)
    first = register(core, b"first")
    core.wait_durable()
    journal = store.journal
    fail_writes(journal)
    register(core, b"unnoticed")
    with journal._cond:
        journal._cond.wait_for(lambda: journal._failed is not None, 5)
    with pytest.raises(JournalError, match="journal write failed"):
        register(core, b"next")
    assert list(core.state.datasets) == [first]
    core.wait_durable()  # nothing pending for this thread any more
    store.close()


def test_long_poll_waiting_across_a_rollback_is_unavailable(tmp_path):
    """A heartbeat registers its worker (a write that will fail) and long-polls; another RPC
    finds the write failed and rolls back, so the worker is gone from the state the poll
    wakes to: the poll answers UNAVAILABLE (the worker retries), not INTERNAL."""
    core, store = make_core(tmp_path, checkpoint_records=1000)
    fail_writes(store.journal)
    outcome = {}

    def poll() -> None:
        try:
            outcome["response"] = core.worker_heartbeat(pb.WorkerHeartbeatRequest(
                worker_address="w:1", worker_uid="u1", wait_ms=5_000))
        except BaseException as exc:  # asserted below
            outcome["error"] = exc

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    for _ in range(500):
        with core._cond:  # the poll holds the lock until it waits
            if "w:1" in core.state.workers:
                break
        threading.Event().wait(0.01)
    else:
        pytest.fail("the heartbeat did not register its worker")
    with pytest.raises(JournalError, match="journal write failed"):
        core.wait_durable()  # finds the failed write and rolls back
    thread.join(5)
    assert not thread.is_alive()
    assert "w:1" not in core.state.workers
    error = outcome.get("error")
    assert type(error) is errors.ServiceUnavailableError, outcome
    assert "rolled back after a failed journal write" in str(error)

    # The worker's retry registers it again in the reopened journal.
    core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address="w:1", worker_uid="u1"))
    core.wait_durable()
    assert "w:1" in core.state.workers
    store.close()


def test_unreopenable_journal_refuses_changes_until_it_recovers(tmp_path):
    core, store = make_core(tmp_path, checkpoint_records=1000)
    first = register(core, b"first")
    core.wait_durable()
    fail_writes(store.journal)
    probe = os.path.join(str(tmp_path), journal_mod.PROBE_FILE)
    os.mkdir(probe)  # the work_dir stops taking writes: reopening fails

    register(core, b"second")
    with pytest.raises(JournalError, match="journal write failed .*cannot be written after a failed write"):
        core.wait_durable()
    assert list(core.state.datasets) == [first]  # rolled back all the same
    core.wait_durable()  # reads of the rolled-back state may be answered
    with pytest.raises(JournalError, match="no change can be made"):
        register(core, b"second")
    assert list(core.state.datasets) == [first]

    os.rmdir(probe)  # the disk recovers
    second = register(core, b"second")
    core.wait_durable()
    store.close()
    assert [u.register_dataset.dataset_id for u in replay(tmp_path)] == [first, second]


# --- the work_dir ----------------------------------------------------------------------------

def test_unwritable_work_dir_is_named(tmp_path):
    regular_file = tmp_path / "not-a-dir"
    regular_file.write_text("")
    work_dir = str(regular_file / "journal")
    with pytest.raises(JournalError, match=f"work_dir '{work_dir}' is not writable"):
        Journal(work_dir).open()
