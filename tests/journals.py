"""Helpers for the tests of the dispatcher's state and journal (test_journal.py,
test_dispatcher_fault_tolerance.py, test_dispatcher_state.py, test_job_names.py): replaying a
journal, comparing states, and driving a ``DispatcherCore`` without a network — a fake clock
and a recorder of the updates it commits."""

from __future__ import annotations

import os

from dataservice.dispatcher.core import DispatcherCore
from dataservice.dispatcher.journal import Journal
from dataservice.dispatcher.state import DispatcherState
from dataservice.proto import state_pb2


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
