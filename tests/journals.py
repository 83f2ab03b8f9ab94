"""Helpers for the tests of the fault-tolerant dispatcher's journal (test_journal.py,
test_dispatcher_fault_tolerance.py)."""

from __future__ import annotations

import os

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
