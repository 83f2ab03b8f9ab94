"""Helpers for the tests of the dispatcher's state and journal (test_journal.py,
test_journal_integrity.py, test_dispatcher_fault_tolerance.py, test_dispatcher_state.py,
test_job_names.py): replaying a journal, comparing states, driving a ``DispatcherCore`` without
a network (a fake clock and a recorder of the updates it commits), building a work_dir with a
history through a real ``JournaledStore``, and writing one as dataservice did before the
journal had a header and a MANIFEST (format 1)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Optional

from dataservice.dispatcher import journal as journal_mod
from dataservice.dispatcher.core import INFINITE, DispatcherCore
from dataservice.dispatcher.journal import Journal, read_records
from dataservice.dispatcher.journaled_store import JournaledStore
from dataservice.dispatcher.state import DispatcherState
from dataservice.proto import dispatcher_pb2 as pb
from dataservice.proto import state_pb2
from dataservice.service.config import DispatcherConfig


def replay(work_dir) -> list[state_pb2.Update]:
    """The updates a dispatcher starting on ``work_dir`` would replay from its journal."""
    journal = Journal(str(work_dir))
    try:
        return journal.open()
    finally:
        journal.close()


def comparable(state: DispatcherState) -> list[bytes]:
    """The state's tables as bytes. Without the id floor: a restarted dispatcher's next id
    is at least the old one (checked apart), and usually more (ids are time-based)."""
    return [u.SerializeToString() for u in state.to_updates() if u.WhichOneof("kind") != "id_floor"]


def fail_writes(journal: Journal) -> None:
    """Points the journal's file descriptor at /dev/full: every write fails with ENOSPC."""
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        os.dup2(full, journal._fd)
    finally:
        os.close(full)


class FakeClock:
    """Time for a ``DispatcherCore(clock=...)`` that moves only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Recorder:
    """Keeps every update the core commits, in order: a journal without the files."""

    def __init__(self, core: DispatcherCore):
        self.updates: list[state_pb2.Update] = []
        commit = core._commit

        def recording_commit(update):
            self.updates.append(state_pb2.Update.FromString(update.SerializeToString()))
            commit(update)

        core._commit = recording_commit

    def kinds(self) -> set[str]:
        return {u.WhichOneof("kind") for u in self.updates}


# --- work_dirs with a history ----------------------------------------------------------------

@dataclasses.dataclass
class History:
    """A work_dir written by a real JournaledStore + DispatcherCore: ``updates[i]`` carries
    sequence number i + 1."""

    work_dir: Path
    updates: list
    checkpoint_seq: int

    def state_at(self, seq: int) -> list[bytes]:
        """The state after the first ``seq`` updates, comparable with ``comparable(...)``."""
        state = DispatcherState()
        for update in self.updates[:seq]:
            state.apply(update)
        return comparable(state)

    @property
    def final(self) -> list[bytes]:
        return self.state_at(len(self.updates))

    def journal_records(self) -> list[tuple[int, int, int]]:
        """``(offset, end, seq)`` of each update record in journal.log (after its header)."""
        records, _ = read_records(str(self.work_dir / journal_mod.JOURNAL_FILE), tolerate_torn_tail=False)
        out, offset = [], 0
        for seq, payload in records:
            end = offset + journal_mod._HEADER.size + len(payload)
            out.append((offset, end, seq))
            offset = end
        return out[1:]


def build_history(work_dir: Path, checkpoint_records: int = 40, datasets_after: int = 12,
                  def_bytes: int = 600) -> History:
    """A dispatcher's life on ``work_dir``: datasets, a worker, a job and an iteration handing
    out splits (a checkpoint falls among them), then ``datasets_after`` more datasets of
    ``def_bytes`` each, so that the journal after the checkpoint holds several KiB. Closed as a
    crash leaves it (closing adds only fsyncs): every update was acknowledged."""
    store = JournaledStore(str(work_dir), checkpoint_records=checkpoint_records)
    store.open()
    core = DispatcherCore(DispatcherConfig(), store=store)
    recorder = Recorder(core)
    try:
        for i in range(3):
            core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"early-%d" % i, num_splits=INFINITE))
        core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address="w:1", worker_uid="u1"))
        dataset_id = next(iter(core.state.datasets))
        job_id = core.get_or_create_job(pb.GetOrCreateJobRequest(
            dataset_id=dataset_id, processing_mode=state_pb2.DISTRIBUTED_EPOCH, job_name="train")).job_id
        iteration_id = core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id)).iteration_id
        task_id = core.state.iterations[iteration_id].tasks[0]
        for _ in range(checkpoint_records + 5):
            core.get_split(pb.GetSplitRequest(iteration_id=iteration_id, task_id=task_id))
        for i in range(datasets_after):
            core.register_dataset(pb.RegisterDatasetRequest(dataset_def=bytes([i]) * def_bytes, num_splits=4))
        core.wait_durable()
    finally:
        store.close()
    (checkpoint_seq, _), *_ = read_records(str(work_dir / journal_mod.CHECKPOINT_FILE), tolerate_torn_tail=False)[0]
    assert 0 < checkpoint_seq < len(recorder.updates)
    return History(work_dir, recorder.updates, checkpoint_seq)


def files_of(work_dir: Path) -> dict[str, Optional[bytes]]:
    """Every file under ``work_dir`` and its bytes: what a refused start must leave alone."""
    return {str(p.relative_to(work_dir)): p.read_bytes() for p in sorted(Path(work_dir).rglob("*")) if p.is_file()}


def write_legacy_work_dir(work_dir: Path, updates: list, checkpoint_at: int = 0) -> None:
    """journal.log (and checkpoint.bin if ``checkpoint_at``) as dataservice wrote them before
    format 2: records with no header, a checkpoint whose marker is an empty record, no MANIFEST.
    The checkpoint holds the state after ``updates[:checkpoint_at]``; the journal the rest."""
    os.makedirs(work_dir, exist_ok=True)
    frame = journal_mod._frame
    if checkpoint_at:
        state = DispatcherState()
        for update in updates[:checkpoint_at]:
            state.apply(update)
        with open(work_dir / journal_mod.CHECKPOINT_FILE, "wb") as f:
            f.write(frame(checkpoint_at, b""))
            for update in state.to_updates():
                f.write(frame(checkpoint_at, update.SerializeToString()))
    with open(work_dir / journal_mod.JOURNAL_FILE, "wb") as f:
        for seq, update in enumerate(updates[checkpoint_at:], checkpoint_at + 1):
            f.write(frame(seq, update.SerializeToString()))


def named_job(state: DispatcherState, job_name: str) -> int:
    """The id of the one job that answers to ``job_name`` (jobs_by_key: a name is scoped by the dataset id
    its readers named, so it may key several jobs; AssertionError unless it keys exactly one)."""
    (job_id,) = [job_id for key, job_id in state.jobs_by_key.items() if key.job_name == job_name]
    return job_id
