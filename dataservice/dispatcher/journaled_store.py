"""``JournaledStore``: the fault-tolerant dispatcher's state store.

Every update the core commits is appended to the journal (``journal.py``), then
applied; the RPC that caused it answers only once ``wait_durable`` has seen it
fsynced. ``open`` rebuilds the state by replaying checkpoint + journal through
the same ``DispatcherState.apply``, which checks every update against the state
before it: one that names something that does not exist (the journal lost the
records it depends on) refuses the start, naming the file, offset and sequence
number, like any other damage (see journal.py). With ``recover=True``
(``--recover-journal``) the start goes on from the valid prefix instead, loudly.

If a journal write fails, the in-memory state is ahead of the disk. The store
rolls back: under the core's lock it rebuilds the state from the durable
records, cuts the failed bytes off the journal, reopens it with a fresh file
descriptor, and raises JournalError so the RPC fails (UNAVAILABLE: the caller
retries). If the journal cannot be reopened, the rolled-back state still serves
reads, and every change fails until a later attempt to reopen succeeds.

Example::

    >>> store = JournaledStore("/var/lib/dataservice")   # recover=True: start from the valid prefix
    >>> store.open()                                   # replay (JournalCorruptionError if damaged)
    >>> core = DispatcherCore(config, store=store)     # binds the store to the core's lock
    >>> store.close()                                  # on stop
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Optional

from dataservice.dispatcher.core import first_id_now
from dataservice.dispatcher.journal import DEFAULT_CHECKPOINT_RECORDS, DurableWait, Journal, JournalError, Replay
from dataservice.dispatcher.state import DispatcherState
from dataservice.proto import state_pb2

__all__ = ["JournaledStore"]

log = logging.getLogger("dataservice.dispatcher.journal")


class JournaledStore:
    """The StateStore of fault-tolerant mode; see the module docstring."""

    def __init__(self, work_dir: str, checkpoint_records: int = DEFAULT_CHECKPOINT_RECORDS, recover: bool = False):
        self.work_dir = work_dir
        self.checkpoint_records = checkpoint_records
        #: Start from the valid prefix of a damaged journal instead of refusing (an operator's decision).
        self.recover = recover
        self.state = DispatcherState(first_id=first_id_now())
        self.journal: Optional[Journal] = None
        #: Updates replayed by ``open`` and how long it took (for the start-up log and tests).
        self.replayed_updates = 0
        self.replay_seconds = 0.0
        # The core's lock (``bind_lock``): commits arrive holding it; a rollback from wait_durable takes it.
        self._lock: threading.Condition = threading.Condition(threading.RLock())
        # Why the journal is not open after a failed rollback; commits retry reopening it.
        self._broken: Optional[BaseException] = None
        # The state could not even be rolled back (the journal was unreadable): it is
        # ahead of the disk, so no RPC may answer until a reopen rebuilds it.
        self._state_ahead = False
        self._durable_end: Optional[int] = None
        # The journal and sequence number of this thread's commits since its last
        # wait_durable: a thread must wait for its own records in the journal it wrote
        # them to, not in a reopened one whose sequence numbers restart below them.
        self._pending = threading.local()

    def bind_lock(self, lock: threading.Condition) -> None:
        """Uses the core's lock for rollbacks; DispatcherCore.__init__ calls it."""
        self._lock = lock

    # --- start and stop -------------------------------------------------------------------
    def open(self) -> None:
        """Replays checkpoint + journal into a fresh state; JournalError naming ``work_dir``
        if it cannot be written, JournalCorruptionError naming file and offset if damaged
        (unless ``recover``: then the valid prefix is kept and the rest logged and set aside)."""
        started = time.monotonic()
        journal = Journal(self.work_dir, self.checkpoint_records)
        journal.check_work_dir()  # before reading: an unwritable work_dir is named as such
        replay = journal.read()
        state = _rebuild(replay, first_id_now(), self.recover)
        journal.open(recover=self.recover, replay=replay, snapshot=state.to_updates)
        self.state = state
        self.journal = journal
        self.replayed_updates = len(replay.records)
        self.replay_seconds = time.monotonic() - started
        if journal.needs_checkpoint():
            # A long journal (the previous run crashed before checkpointing): make the next start fast.
            with self._lock:
                self._checkpoint()

    def close(self) -> None:
        """Writes what is queued and closes the journal; idempotent."""
        with self._lock:
            journal, self.journal = self.journal, None
        if journal is not None:
            journal.close()

    # --- the StateStore protocol ------------------------------------------------------------
    def commit(self, update: state_pb2.Update) -> None:
        """Applies ``update``, then journals it (queued: see ``wait_durable``).

        Applied first: an update that does not fit the state (``StateUpdateError``, a bug in the
        core) changes nothing and is never journaled, so a restart does not replay the failure.
        The caller holds the core's lock, so records are appended in apply order.
        JournalError if the journal failed; the state is then rolled back to what is durable.
        """
        journal = self.journal
        if journal is None or self._broken is not None:
            journal = self._reopen()
        self.state.apply(update)
        try:
            seq = journal.append(update)
        except JournalError as exc:  # an earlier write failed: nothing since it is durable
            self._pending.__dict__.clear()
            raise self._roll_back(journal, exc) from exc  # also undoes the apply above
        self._pending.journal, self._pending.seq = journal, seq
        if journal.needs_checkpoint():
            self._checkpoint()

    def wait_durable(self) -> None:
        """Returns once this thread's commits (and everything it could have read) are fsynced.

        Called outside the core's lock, so concurrent RPCs share one fsync.
        JournalError if the write failed; the state is then rolled back.
        """
        wait = self.durability()
        if wait is not None:
            wait()

    def durability(self) -> Optional[DurableWait]:
        """``wait_durable`` cut in two: takes what this thread committed (or could have read) now,
        and returns None if that is durable already, else the wait, to be called on any thread (the
        asyncio server waits on its loop, ``durable_waits.DurableWaits``, one wake-up per fsync)."""
        journal = getattr(self._pending, "journal", None)
        seq = getattr(self._pending, "seq", None)
        self._pending.__dict__.clear()
        if journal is None:
            # Nothing committed by this thread: wait for what it may have read.
            journal = self.journal
            if journal is None:
                if self._broken is not None and not self._state_ahead:
                    return None  # rolled back to the durable state, which reads may see
                raise JournalError(f"the dispatcher's journal in {self.work_dir!r} is not open: "
                                   f"{self._broken or 'closed'}")
            seq = journal.last_seq
        if journal.is_durable(seq):
            return None

        def wait() -> None:
            try:
                journal.wait_durable(seq)
            except JournalError as exc:
                if not journal.failed:
                    raise  # slow, not failed: the update may still become durable
                with self._lock:
                    raise self._roll_back(journal, exc) from exc

        return DurableWait(journal, seq, wait)

    # --- failures ------------------------------------------------------------------------------
    def _roll_back(self, failed: Journal, cause: BaseException) -> JournalError:
        """Rebuilds the state from the durable records; the caller holds the lock. Returns
        the error to raise. Several threads may see the same failure: the first rolls back."""
        message = (f"the dispatcher's journal write failed ({_reason(cause)}); the change was not made. "
                   f"Journal: {failed.journal_path}")
        if self.journal is not failed:
            return JournalError(message)  # another thread rolled back already
        log.error("journal in %s failed: rolling the state back to the last durable update", self.work_dir)
        failed.close()
        self.journal = None
        try:
            self._restore(failed.durable_offset)
        except JournalError as exc:
            message += f"; {exc}"
        finally:
            self._lock.notify_all()  # long polls re-read the rolled-back state
        return JournalError(message)

    def _reopen(self) -> Journal:
        """After a failed rollback: tries the journal again (the disk may have recovered)."""
        if self._broken is None:
            raise JournalError(f"the journal in {self.work_dir!r} is not open")
        self._restore(self._durable_end)
        log.warning("journal in %s reopened: changes are accepted again", self.work_dir)
        return self.journal

    def _restore(self, durable_end: Optional[int]) -> None:
        """Reopens the journal, cutting off what follows ``durable_end``, and rebuilds the
        state from it. If it cannot be written, the state is still rebuilt (reads go on)
        and JournalError says why changes cannot be made."""
        # Ids only grow, even across a rollback: nobody may see an id reused.
        first_id = max(first_id_now(), self.state.next_id())
        fresh = Journal(self.work_dir, self.checkpoint_records)
        try:
            replay = fresh.read(durable_end)
            state = _rebuild(replay, first_id, recover=False)
            fresh.open(durable_end=durable_end, replay=replay)
        except Exception as exc:
            fresh.close()
            first_failure = self._broken is None
            if first_failure:  # log the transition, not every retry of every caller
                log.error("cannot reopen the journal in %s (%s): changes fail until it can be written",
                          self.work_dir, exc)
            self._broken, self._durable_end = exc, durable_end  # the next reopen must still cut there
            if first_failure or self._state_ahead:  # otherwise the state is rolled back already
                try:
                    replay = Journal(self.work_dir).read(durable_end)
                    state = _rebuild(replay, first_id, recover=False)
                    if replay.damages:
                        raise replay.error()
                    self.state = state
                    self._state_ahead = False
                except Exception as read_exc:
                    self._state_ahead = True
                    log.critical("cannot read the journal in %s back either (%s): the state is ahead of the disk "
                                 "and nothing is answered until the journal can be reopened", self.work_dir,
                                 read_exc)
            raise JournalError(f"the dispatcher's journal cannot be written after a failed write, so no change "
                               f"can be made until it can ({exc})") from exc
        self.state, self.journal = state, fresh
        self._broken, self._durable_end, self._state_ahead = None, None, False

    def _checkpoint(self) -> None:
        """Snapshot + truncate; the caller holds the lock, so the state matches ``last_seq``.
        A forked child writes it where the platform can fork (the lock is held for the fork only)."""
        journal = self.journal
        if journal.checkpoint_in_background(self.state.to_updates):
            return
        try:
            journal.checkpoint(self.state.to_updates(), journal.last_seq)
        except JournalError as exc:
            if journal.failed:
                self._pending.__dict__.clear()
                raise self._roll_back(journal, exc) from exc
            # The journal is intact, just longer than planned; the next attempt comes later.
            log.warning("checkpoint failed, keeping the journal: %s", exc)


def _reason(exc: BaseException) -> str:
    cause = exc
    while isinstance(cause, JournalError) and cause.__cause__ is not None:
        cause = cause.__cause__
    return str(cause)


def _rebuild(replay: Replay, first_id: int, recover: bool) -> DispatcherState:
    """The state ``replay``'s records rebuild. An update that does not fit the state before it
    (``StateUpdateError``; any exception, to be safe) is rejected: ``replay`` records the damage,
    naming the record's file, offset and seq. Without ``recover`` that ends it (``open`` then
    refuses); with it, the state is rebuilt from the shorter prefix."""
    while True:
        state = DispatcherState(first_id=first_id)
        for index, record in enumerate(replay.records):
            try:
                state.apply(record.update)
            except Exception as exc:
                replay.reject(index, exc)
                break
        else:
            return state
        if not recover:
            return state
