"""The journal never silently loses acknowledged state: the corruption matrix.

Each work_dir is written by a real JournaledStore + DispatcherCore (tests/journals.py:
``build_history``), then damaged as an operator, a disk or a bad restore would damage it.
Every case either refuses to start - JournalCorruptionError naming the file and the
offset, with every file left as it was - or starts with nothing acknowledged lost; and
with ``recover=True`` it starts loudly from the valid prefix, sets the damaged files aside,
and the next start needs no flag. Then the same through a real DispatchServer, and (slow)
through ``dataservice dispatcher`` processes.

Example::

    $ python -m pytest tests/test_journal_integrity.py -m "not slow"
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import pytest

from dataservice import Dataset, DispatcherConfig, DispatchServer, errors, register_dataset
from dataservice.dispatcher import journal as journal_mod
from dataservice.dispatcher.core import DispatcherCore
from dataservice.dispatcher.journal import JournalCorruptionError, read_records
from dataservice.dispatcher.journaled_store import JournaledStore
from dataservice.dispatcher.manifest import SLOT_SPACING, read_manifest
from dataservice.dispatcher.state import DispatcherState, StateUpdateError
from dataservice.proto import dispatcher_pb2 as pb
from dataservice.proto import state_pb2
from dataservice.service.dispatcher_client import DispatcherClient
from tests.cluster import free_port, wait_until
from tests.journals import History, Recorder, build_history, comparable, files_of, write_legacy_work_dir

LOGGER = "dataservice.dispatcher.journal"
JOURNAL, CHECKPOINT, MANIFEST = journal_mod.JOURNAL_FILE, journal_mod.CHECKPOINT_FILE, journal_mod.MANIFEST_FILE


def start(work_dir: Path, recover: bool = False) -> list[bytes]:
    """Opens a JournaledStore on ``work_dir`` and returns its state (comparable), closed again."""
    store = JournaledStore(str(work_dir), recover=recover)
    store.open()
    try:
        return comparable(store.state)
    finally:
        store.close()


def prefix_without_checkpoint(history: History) -> list[bytes]:
    """What a recovery keeps when the checkpoint is unusable: the journal's records, applied to
    the empty state, up to the first that names something the lost checkpoint held."""
    state = DispatcherState()
    for update in history.updates[history.checkpoint_seq:]:
        try:
            state.apply(update)
        except StateUpdateError:
            break
    return comparable(state)


# --- the damage -------------------------------------------------------------------------------

@dataclasses.dataclass
class Damage:
    """Where the refusal must point (``file``, ``offset``, a phrase of the message) and the
    state a recovery keeps (the first ``prefix_seq`` updates; None: see ``prefix``)."""

    file: str
    offset: int
    phrase: str
    prefix_seq: Optional[int]

    def prefix(self, history: History) -> list[bytes]:
        if self.prefix_seq is None:
            return prefix_without_checkpoint(history)
        return history.state_at(self.prefix_seq)


def _middle(history: History) -> tuple[int, int, int]:
    records = history.journal_records()
    return records[len(records) // 2]


def truncated_mid_file(history: History) -> Damage:
    offset, end, seq = _middle(history)
    os.truncate(history.work_dir / JOURNAL, offset + 20)  # inside the record's payload
    return Damage(JOURNAL, offset, "journal ends early", seq - 1)


def truncated_on_a_record_boundary(history: History) -> Damage:
    offset, end, seq = _middle(history)
    os.truncate(history.work_dir / JOURNAL, offset)
    return Damage(JOURNAL, offset, "journal ends early", seq - 1)


def last_4k_zero_filled(history: History) -> Damage:
    path = history.work_dir / JOURNAL
    size = path.stat().st_size
    assert size > 2 * 4096, "the history's journal must be longer than the zeroed page"
    offset, _, seq = next(r for r in history.journal_records() if r[1] > size - 4096)
    with open(path, "r+b") as f:
        f.seek(size - 4096)
        f.write(bytes(4096))
    return Damage(JOURNAL, offset, r"journal ends early.*(all zero|the last 4096 of them zero)", seq - 1)


def journal_emptied(history: History) -> Damage:
    os.truncate(history.work_dir / JOURNAL, 0)
    return Damage(JOURNAL, 0, "empty journal", history.checkpoint_seq)


def journal_deleted(history: History) -> Damage:
    os.unlink(history.work_dir / JOURNAL)
    return Damage(JOURNAL, 0, "missing journal", history.checkpoint_seq)


def checkpoint_deleted(history: History) -> Damage:
    os.unlink(history.work_dir / CHECKPOINT)
    return Damage(CHECKPOINT, 0, "missing checkpoint", None)


def checkpoint_corrupted(history: History) -> Damage:
    path = history.work_dir / CHECKPOINT
    offsets, offset = [], 0
    for _, payload in read_records(str(path), tolerate_torn_tail=False)[0]:
        offsets.append(offset)
        offset += journal_mod._HEADER.size + len(payload)
    data = bytearray(path.read_bytes())
    data[offsets[3] + journal_mod._HEADER.size + 1] ^= 0x10
    path.write_bytes(bytes(data))
    return Damage(CHECKPOINT, offsets[3], "corrupted record", None)


def manifest_deleted(history: History) -> Damage:
    os.unlink(history.work_dir / MANIFEST)
    return Damage(MANIFEST, 0, "missing manifest", len(history.updates))  # nothing was lost after all


def record_in_the_middle_corrupted(history: History) -> Damage:
    offset, end, seq = _middle(history)
    path = history.work_dir / JOURNAL
    data = bytearray(path.read_bytes())
    data[end - 2] ^= 0x01
    path.write_bytes(bytes(data))
    return Damage(JOURNAL, offset, "corrupted record .*with a valid record at offset", seq - 1)


def sequence_gap(history: History) -> Damage:
    offset, end, seq = _middle(history)
    path = history.work_dir / JOURNAL
    data = path.read_bytes()
    path.write_bytes(data[:offset] + data[end:])  # every record still has a valid CRC
    return Damage(JOURNAL, offset, f"sequence gap.*record seq {seq} is missing", seq - 1)


DAMAGES: list[Callable[[History], Damage]] = [
    truncated_mid_file, truncated_on_a_record_boundary, last_4k_zero_filled, journal_emptied, journal_deleted,
    checkpoint_deleted, checkpoint_corrupted, manifest_deleted, record_in_the_middle_corrupted, sequence_gap]


@pytest.fixture(params=DAMAGES, ids=lambda f: f.__name__.replace("_", "-"))
def damaged(request, tmp_path) -> tuple[History, Damage, dict]:
    history = build_history(tmp_path / "work")
    damage = request.param(history)
    return history, damage, files_of(history.work_dir)


def test_damage_refuses_the_start_naming_file_and_offset_and_changes_nothing(damaged):
    history, damage, before = damaged
    path = str(history.work_dir / damage.file)
    with pytest.raises(JournalCorruptionError) as info:
        start(history.work_dir)
    error = info.value
    assert isinstance(error, errors.DataLossError)
    assert (error.filename, error.offset) == (path, damage.offset), str(error)
    message = str(error)
    assert f"at offset {damage.offset} in {path}" in message
    assert re.search(damage.phrase, message), message
    assert "--recover-journal" in message and "\n" not in message
    assert files_of(history.work_dir) == before  # nothing was cut, rewritten or moved


def test_damage_with_recover_starts_loudly_from_the_valid_prefix_and_the_next_start_is_clean(damaged, caplog):
    history, damage, before = damaged
    path = str(history.work_dir / damage.file)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        recovered = start(history.work_dir, recover=True)
    assert recovered == damage.prefix(history)
    critical = [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL]
    assert any(f"at offset {damage.offset} in {path}" in line for line in critical), critical
    assert any("dropping" in line for line in critical) or damage.file == MANIFEST, critical

    # The damaged files are kept, byte for byte, for forensics.
    (aside,) = [p for p in history.work_dir.iterdir() if p.name.startswith(journal_mod.DAMAGED_DIR_PREFIX)]
    assert re.fullmatch(r"damaged-\d{8}T\d{6}Z", aside.name)
    assert {name: data for name, data in files_of(aside).items()} == before
    assert any(str(aside) in line for line in critical)

    # The next start needs no flag, and says nothing.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert start(history.work_dir) == recovered
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_an_update_that_does_not_fit_the_state_refuses_the_start(tmp_path, caplog):
    """Records lost from a journal that stays well-formed (here, one written by an earlier
    dataservice without the dataset a job names, renumbered): replay refuses the orphan."""
    history = build_history(tmp_path / "source")
    kinds = [u.WhichOneof("kind") for u in history.updates]
    create_job = history.updates[kinds.index("create_job")].create_job
    updates = [u for u in history.updates
               if not (u.HasField("register_dataset") and u.register_dataset.dataset_id == create_job.dataset_id)]
    work_dir = tmp_path / "work"
    write_legacy_work_dir(work_dir, updates)
    orphan_seq = kinds.index("create_job")  # one earlier than in the history: a record is missing before it
    offset = sum(journal_mod._HEADER.size + u.ByteSize() for u in updates[:orphan_seq - 1])
    before = files_of(work_dir)

    with pytest.raises(JournalCorruptionError) as info:
        start(work_dir)
    message = str(info.value)
    assert (info.value.filename, info.value.offset) == (str(work_dir / JOURNAL), offset)
    assert f"record seq {orphan_seq} (create_job)" in message
    assert f"names dataset {create_job.dataset_id}, which does not exist" in message
    assert files_of(work_dir) == before

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        recovered = JournaledStore(str(work_dir), recover=True)
        recovered.open()
    try:
        assert create_job.job_id not in recovered.state.jobs  # no orphan job let through
        assert len(recovered.state.datasets) == sum(u.HasField("register_dataset") for u in updates[:orphan_seq - 1])
    finally:
        recovered.close()
    assert f"at offset {offset} in {work_dir / JOURNAL}" in caplog.text


def test_a_journal_written_by_a_newer_dataservice_refuses_the_start_saying_to_upgrade(tmp_path):
    """An update of a kind added later (a later dataservice's ``lease_splits`` read by this one's
    predecessor, say) is not skipped: skipping it would replay a state without what it recorded."""
    journal = journal_mod.Journal(str(tmp_path))
    journal.open()
    journal.append(state_pb2.Update(register_dataset=state_pb2.RegisterDatasetUpdate(dataset_id=7, fingerprint=b"f")))
    journal.wait_durable(journal.append(state_pb2.Update.FromString(b"\x98\x06\x01")))  # field 99: unknown here
    journal.close()
    before = files_of(tmp_path)
    with pytest.raises(JournalCorruptionError, match="written by a newer dataservice; upgrade"):
        start(tmp_path)
    assert files_of(tmp_path) == before
    recovered = JournaledStore(str(tmp_path), recover=True)  # --recover-journal: the prefix before it
    recovered.open()
    try:
        assert list(recovered.state.datasets) == [7]
    finally:
        recovered.close()


# --- what must still start, with nothing lost -------------------------------------------------

def test_a_torn_last_write_after_a_crash_is_dropped_and_nothing_acknowledged_is_lost(tmp_path, caplog):
    history = build_history(tmp_path)
    path = tmp_path / JOURNAL
    valid_end = path.stat().st_size
    # The write the crash interrupted: the next record, half on disk, never acknowledged.
    unacknowledged = journal_mod._frame(len(history.updates) + 1, state_pb2.Update(
        register_worker=state_pb2.RegisterWorkerUpdate(worker_address="w:9", worker_uid="u9")).SerializeToString())
    with open(path, "ab") as f:
        f.write(unacknowledged[:len(unacknowledged) // 2])

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert start(tmp_path) == history.final
    assert f"dropping a torn tail at offset {valid_end} in {path}" in caplog.text
    assert path.stat().st_size == valid_end
    assert not any(p.name.startswith(journal_mod.DAMAGED_DIR_PREFIX) for p in tmp_path.iterdir())


@pytest.mark.parametrize("checkpoint_at", [0, 40, -1], ids=["journal-only", "with-checkpoint", "emptied-journal"])
def test_a_work_dir_written_before_the_markers_starts_and_is_upgraded(tmp_path, caplog, checkpoint_at):
    history = build_history(tmp_path / "source")
    work_dir = tmp_path / "legacy"
    # -1: a checkpoint of everything, and the empty journal that version left after one.
    write_legacy_work_dir(work_dir, history.updates, len(history.updates) if checkpoint_at < 0 else checkpoint_at)
    assert not (work_dir / MANIFEST).exists()

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert start(work_dir) == history.final
    assert "written by an earlier dataservice" in caplog.text and "upgrading it to format 2" in caplog.text
    manifest = read_manifest(str(work_dir / MANIFEST))
    assert manifest.durable_seq == len(history.updates)
    (header_seq, header), *_ = read_records(str(work_dir / JOURNAL), tolerate_torn_tail=False)[0]
    assert journal_mod._JOURNAL_MAGIC in header and header_seq == len(history.updates)

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert start(work_dir) == history.final
    assert not caplog.records, caplog.text


def work_dir_of(work_dir: Path, files: tuple[bytes, bytes, bytes]) -> Path:
    """A work_dir holding these checkpoint, journal and MANIFEST bytes (what a crash left)."""
    work_dir.mkdir()
    for file, data in zip((CHECKPOINT, JOURNAL, MANIFEST), files):
        (work_dir / file).write_bytes(data)
    return work_dir


def assert_each_opens_to(tmp_path: Path, crash_points: dict[str, tuple[bytes, bytes, bytes]],
                         expected: list[bytes]) -> None:
    """Each crash point's files open to ``expected``, and so does the work_dir that start rewrote."""
    for name, files in crash_points.items():
        work_dir = work_dir_of(tmp_path / name, files)
        assert start(work_dir) == expected, name
        assert start(work_dir) == expected, name


def test_every_crash_point_of_a_checkpoint_starts_with_nothing_lost(tmp_path):
    """A checkpoint renames checkpoint.bin, then journal.log, then rewrites the MANIFEST: a crash
    between two steps leaves new files next to old ones, which must open to the same state."""
    live = tmp_path / "live"
    store = JournaledStore(str(live), checkpoint_records=20)
    store.open()
    core = DispatcherCore(DispatcherConfig(), store=store)
    recorder = Recorder(core)
    try:
        def register(i: int) -> None:
            core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"d%d" % i, num_splits=1))
            core.wait_durable()
        for i in range(19):
            register(i)
        old = files_of(live)  # just before the 20th update, whose commit takes the checkpoint
        register(19)
        assert store.journal.wait_checkpoint()  # written by a forked child
        new = files_of(live)
        expected = comparable(core.state)
    finally:
        store.close()
    assert CHECKPOINT not in old and old[JOURNAL] != new[JOURNAL] and old[MANIFEST] != new[MANIFEST]
    # The 20th record reached the old journal (and was fsynced) before the checkpoint began.
    old_journal = old[JOURNAL] + journal_mod._frame(20, recorder.updates[-1].SerializeToString())
    crash_points = {"checkpoint-renamed": (new[CHECKPOINT], old_journal, old[MANIFEST]),
                    "journal-renamed": (new[CHECKPOINT], new[JOURNAL], old[MANIFEST])}
    assert_each_opens_to(tmp_path, crash_points, expected)


def held_snapshot(store: JournaledStore, gate: Path) -> tuple[Callable, Callable[[], None]]:
    """A snapshot for ``checkpoint_in_background`` that, in the forked child, waits until ``release()``
    creates ``gate`` (the child keeps no file descriptor of the parent's; a poll with a 30 s deadline)."""
    def snapshot():
        deadline = time.monotonic() + 30
        while not gate.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{gate} was never created")
            time.sleep(0.002)
        return store.state.to_updates()

    def release() -> None:
        gate.touch()
    return snapshot, release


def test_a_background_checkpoint_lets_commits_go_on_and_carries_them_into_the_next_journal(tmp_path):
    """A forked child writes the state at seq S while the dispatcher commits more: those records
    are carried over into the new journal, after a header naming the checkpoint, and every crash
    point between the steps opens to the same state."""
    live = tmp_path / "live"
    store = JournaledStore(str(live), checkpoint_records=1_000_000)  # only the checkpoint taken below
    store.open()
    core = DispatcherCore(DispatcherConfig(), store=store)

    def register(i: int) -> None:
        core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"bg%d" % i, num_splits=1))
        core.wait_durable()
    try:
        for i in range(5):
            register(i)
        snapshot, release = held_snapshot(store, tmp_path / "gate")
        try:
            with core._cond:  # as a commit calls it: under the core's lock
                assert store.journal.checkpoint_in_background(snapshot)
                seq = store.journal.last_seq
            for i in range(5, 9):  # while the child waits: the lock is free
                register(i)
            during = files_of(live)
            expected = comparable(core.state)
        finally:
            release()
        assert store.journal.wait_checkpoint()
        after = files_of(live)
        register(9)  # appended to the new journal
        final = comparable(core.state)
    finally:
        store.close()
    assert CHECKPOINT not in during
    assert read_records(str(live / CHECKPOINT), tolerate_torn_tail=False)[0][0][0] == seq
    journal_seqs = [s for s, _ in read_records(str(live / JOURNAL), tolerate_torn_tail=False)[0]]
    assert journal_seqs == list(range(seq, seq + 6))  # the header (seq S), 4 carried over, 1 new
    assert start(live) == final
    crash_points = {"checkpoint-renamed": (after[CHECKPOINT], during[JOURNAL], during[MANIFEST]),
                    "journal-renamed": (after[CHECKPOINT], after[JOURNAL], during[MANIFEST]),
                    "done": (after[CHECKPOINT], after[JOURNAL], after[MANIFEST])}
    assert_each_opens_to(tmp_path, crash_points, expected)
    # A carried-over journal that lost records is still refused.
    short = after[JOURNAL][:len(after[JOURNAL]) - 10]
    work_dir = work_dir_of(tmp_path / "carried-over-truncated", (after[CHECKPOINT], short, during[MANIFEST]))
    with pytest.raises(JournalCorruptionError, match=f"journal ends early at offset .* in .*{JOURNAL}"):
        start(work_dir)


def test_a_failed_background_checkpoint_leaves_the_journal_whole_and_is_retried(tmp_path, caplog):
    live = tmp_path / "live"
    store = JournaledStore(str(live), checkpoint_records=5)
    store.open()
    core = DispatcherCore(DispatcherConfig(), store=store)
    try:
        def broken_snapshot():
            raise OSError(28, "No space left on device")
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            with core._cond:  # as a commit calls it: under the core's lock
                assert store.journal.checkpoint_in_background(broken_snapshot)
            assert store.journal.wait_checkpoint()
        assert "the checkpoint at sequence 0 was not written (OSError: [Errno 28] No space left on device)" \
            in caplog.text
        assert not (live / CHECKPOINT).exists() and not (live / (CHECKPOINT + ".tmp")).exists()
        for i in range(5):  # the next interval's checkpoint is taken as usual
            core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"r%d" % i, num_splits=1))
            core.wait_durable()
        assert store.journal.wait_checkpoint()
        assert read_records(str(live / CHECKPOINT), tolerate_torn_tail=False)[0][0][0] == 5
        expected = comparable(core.state)
    finally:
        store.close()
    assert start(live) == expected


def test_a_crash_during_a_recovery_is_refused_again_and_recovering_again_gives_the_same_state(tmp_path):
    history = build_history(tmp_path / "work")
    truncated_on_a_record_boundary(history)
    damaged = files_of(history.work_dir)
    recovered = start(history.work_dir, recover=True)
    # A crash after the new checkpoint was renamed into place, before the new journal was.
    (history.work_dir / JOURNAL).write_bytes(damaged[JOURNAL])
    (history.work_dir / MANIFEST).write_bytes(damaged[MANIFEST])
    with pytest.raises(JournalCorruptionError, match=f"checkpoint mismatch at offset 0 in .*{CHECKPOINT}"):
        start(history.work_dir)
    assert start(history.work_dir, recover=True) == recovered
    assert start(history.work_dir) == recovered


# --- the MANIFEST -------------------------------------------------------------------------------

def test_the_manifest_covers_every_acknowledged_update(tmp_path):
    store = JournaledStore(str(tmp_path), checkpoint_records=7)
    store.open()
    core = DispatcherCore(DispatcherConfig(), store=store)
    try:
        for i in range(30):  # through several checkpoints
            core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"m%d" % i, num_splits=1))
            core.wait_durable()
            manifest = read_manifest(str(tmp_path / MANIFEST))
            assert manifest.durable_seq == store.journal.last_seq == i + 1
            assert manifest.journal_id == store.journal._journal_id
    finally:
        store.close()


def test_the_write_path_keeps_one_fsync_per_batch(tmp_path, monkeypatch):
    """The MANIFEST is rewritten after every batch without an fsync of its own."""
    store = JournaledStore(str(tmp_path))
    store.open()
    core = DispatcherCore(DispatcherConfig(), store=store)
    fsyncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    try:
        for i in range(20):
            core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"f%d" % i, num_splits=1))
            core.wait_durable()  # one batch per update
        assert store.journal.fsyncs == len(fsyncs) == 20
        assert read_manifest(str(tmp_path / MANIFEST)).durable_seq == 20
    finally:
        monkeypatch.undo()
        store.close()


@pytest.mark.parametrize("left", [[MANIFEST], [JOURNAL], [MANIFEST, JOURNAL]],
                         ids=["manifest-only", "empty-journal-only", "manifest-and-empty-journal"])
def test_a_crash_during_the_first_start_starts_again(tmp_path, left):
    """The first start writes the MANIFEST, then a journal holding just its header: what a crash
    between the steps leaves starts (empty: nothing was acknowledged yet)."""
    empty = comparable(DispatcherState())
    first = tmp_path / "first"
    assert start(first) == empty
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    for name in left:
        (crashed / name).write_bytes((first / MANIFEST).read_bytes() if name == MANIFEST else b"")
    assert start(crashed) == empty
    assert sorted(os.listdir(crashed)) == sorted([JOURNAL, MANIFEST])
    assert start(crashed) == empty


def test_a_torn_manifest_slot_falls_back_to_the_other(tmp_path):
    history = build_history(tmp_path)
    path = tmp_path / MANIFEST
    newest = read_manifest(str(path))
    data = bytearray(path.read_bytes())
    data[(newest.counter % 2) * SLOT_SPACING + 20] ^= 0xFF  # the last write, torn
    path.write_bytes(bytes(data))
    older = read_manifest(str(path))
    assert older.counter == newest.counter - 1 and older.durable_seq <= newest.durable_seq
    assert start(tmp_path) == history.final  # a stale figure never refuses a good journal


def test_an_unreadable_manifest_refuses_the_start(tmp_path):
    build_history(tmp_path)
    (tmp_path / MANIFEST).write_bytes(bytes(2 * SLOT_SPACING))
    with pytest.raises(JournalCorruptionError, match=f"unreadable manifest at offset 0 in {tmp_path / MANIFEST}: "
                                                     f"neither of its two slots"):
        start(tmp_path)


# --- a DispatchServer --------------------------------------------------------------------------

def ft_config(work_dir, **overrides) -> DispatcherConfig:
    return DispatcherConfig(fault_tolerant_mode=True, work_dir=str(work_dir), **overrides)


def dataset_ids(server: DispatchServer) -> list[int]:
    with server.core._cond:
        return sorted(server.core.state.datasets)


def register_dataset_offsets(work_dir: Path) -> dict[int, int]:
    """Dataset id -> offset of its register_dataset record in journal.log."""
    out, offset = {}, 0
    for _, payload in read_records(str(work_dir / JOURNAL), tolerate_torn_tail=False)[0]:
        if journal_mod._JOURNAL_MAGIC not in payload:
            update = state_pb2.Update.FromString(payload)
            if update.HasField("register_dataset"):
                out[update.register_dataset.dataset_id] = offset
        offset += journal_mod._HEADER.size + len(payload)
    return out


def test_dispatch_server_refuses_a_truncated_journal_and_recovers_with_the_flag(tmp_path, caplog):
    server = DispatchServer(ft_config(tmp_path))
    try:
        ids = [register_dataset(server.target, Dataset.range(n + 1)) for n in range(4)]
    finally:
        server.stop()
    cut = register_dataset_offsets(tmp_path)[ids[2]]
    os.truncate(tmp_path / JOURNAL, cut)
    before = files_of(tmp_path)

    port = free_port()
    with pytest.raises(JournalCorruptionError, match=f"journal ends early at offset {cut} in "
                                                     f"{re.escape(str(tmp_path / JOURNAL))}"):
        DispatchServer(ft_config(tmp_path, port=port))
    assert files_of(tmp_path) == before
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        s.bind(("::", port))  # nothing was bound

    with caplog.at_level(logging.CRITICAL, logger=LOGGER):
        server = DispatchServer(ft_config(tmp_path, recover_journal=True))
    try:
        assert dataset_ids(server) == ids[:2]
        assert f"at offset {cut} in {tmp_path / JOURNAL}" in caplog.text
        again = register_dataset(server.target, Dataset.range(7))
    finally:
        server.stop()
    server = DispatchServer(ft_config(tmp_path))  # clean: no flag needed
    try:
        assert dataset_ids(server) == sorted(ids[:2] + [again])
    finally:
        server.stop()


# --- real processes ------------------------------------------------------------------------------

def status_dataset_ids(port: int) -> list[int]:
    client = DispatcherClient(f"localhost:{port}", timeout_ms=10_000)
    try:
        return sorted(d.dataset_id for d in client.get_status().datasets)
    finally:
        client.close()


@pytest.mark.slow
def test_dispatcher_process_refuses_a_damaged_journal_in_one_line_and_starts_with_recover_journal(procs, tmp_path):
    work_dir = tmp_path / "journal"
    dispatcher = procs.dispatcher(work_dir=work_dir)
    ids = [register_dataset(dispatcher.target, Dataset.range(n + 1)) for n in range(30)]
    assert dispatcher.proc.stop(15) == 0

    # The last 4 KiB zero-filled (a page lost): the datasets registered last are gone.
    size = (work_dir / JOURNAL).stat().st_size
    assert size > 2 * 4096, size
    with open(work_dir / JOURNAL, "r+b") as f:
        f.seek(size - 4096)
        f.write(bytes(4096))
    before = files_of(work_dir)
    refused = procs.dispatcher(work_dir=work_dir, wait=False)
    code = refused.proc.popen.wait(timeout=30)
    stderr = refused.proc.stderr
    assert code != 0, stderr
    assert "Traceback" not in stderr, stderr
    errors_printed = [line for line in stderr.splitlines() if "error:" in line]
    assert len(errors_printed) == 1, stderr
    assert re.search(rf"cannot start: .*at offset \d+ in {re.escape(str(work_dir / JOURNAL))}: .*--recover-journal",
                     errors_printed[0]), errors_printed[0]
    assert files_of(work_dir) == before

    recovered = procs.dispatcher("--recover-journal", work_dir=work_dir)
    assert "CRITICAL" in recovered.proc.stderr and "--recover-journal: dropping" in recovered.proc.stderr
    kept = status_dataset_ids(recovered.port)
    assert 0 < len(kept) < len(ids) and kept == ids[:len(kept)]  # a prefix: the first ones registered
    assert recovered.proc.stop(15) == 0
    clean = procs.dispatcher(work_dir=work_dir)
    assert status_dataset_ids(clean.port) == kept
    assert " WARNING " not in clean.proc.stderr and "CRITICAL" not in clean.proc.stderr, clean.proc.stderr


@pytest.mark.slow
def test_dispatcher_process_killed_mid_write_restarts_with_everything_acknowledged(procs, tmp_path):
    work_dir = tmp_path / "journal"
    dispatcher = procs.dispatcher(work_dir=work_dir)
    ids = [register_dataset(dispatcher.target, Dataset.range(n + 1)) for n in range(5)]
    dispatcher.proc.kill9()
    # What a kill in the middle of the next write leaves: part of a record nobody was told about.
    valid_end = (work_dir / JOURNAL).stat().st_size
    with open(work_dir / JOURNAL, "ab") as f:
        f.write(journal_mod._frame(10_000, b"\x0a\x05never")[:11])
    restarted = procs.dispatcher(port=dispatcher.port, work_dir=work_dir)
    assert status_dataset_ids(restarted.port) == sorted(ids)
    assert f"dropping a torn tail at offset {valid_end}" in restarted.proc.stderr


def test_an_update_that_does_not_fit_is_refused_at_commit_and_never_journaled(tmp_path):
    # A bug in the core must fail its RPC, not poison the journal so that every restart fails too.
    store = JournaledStore(str(tmp_path))
    store.open()
    try:
        core = DispatcherCore(DispatcherConfig(), store=store)
        with core._cond, pytest.raises(StateUpdateError, match="names iteration 42, which does not exist"):
            core._commit(state_pb2.Update(finish_iteration=state_pb2.FinishIterationUpdate(iteration_id=42)))
        store.wait_durable()
    finally:
        store.close()
    restarted = JournaledStore(str(tmp_path))
    restarted.open()  # starts: nothing of the refused update was written
    restarted.close()
    assert not any(u.HasField("finish_iteration") for _, p in read_records(str(tmp_path / "journal.log"), True)[0]
                   for u in [state_pb2.Update.FromString(p)])


@pytest.mark.slow
def test_dispatcher_process_checkpoints_in_a_child_and_a_kill_9_loses_nothing(procs, tmp_path):
    """`dataservice dispatcher` turns gRPC's fork handlers off by itself (the environment here has no
    GRPC_ENABLE_FORK_SUPPORT) and checkpoints every 10 records from a forked child; a kill -9 (maybe
    mid-checkpoint) loses nothing acknowledged, and a graceful stop after them exits cleanly."""
    procs.env = {k: v for k, v in procs.env.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    work_dir = tmp_path / "journal"
    dispatcher = procs.dispatcher("--journal-checkpoint-records", "10", work_dir=work_dir)
    ids = [register_dataset(dispatcher.target, Dataset.range(n + 1)) for n in range(40)]
    written = re.compile(r"checkpoint at sequence \d+ written to .*checkpoint\.bin in \d+ ms \(in a child process")
    wait_until(lambda: written.search(dispatcher.proc.stderr), 30, "a checkpoint written by a child")
    dispatcher.proc.kill9()
    restarted = procs.dispatcher("--journal-checkpoint-records", "10", port=dispatcher.port, work_dir=work_dir)
    assert status_dataset_ids(restarted.port) == sorted(ids)
    more = [register_dataset(restarted.target, Dataset.range(n + 100)) for n in range(25)]
    assert restarted.proc.stop(15) == 0
    stderr = restarted.proc.stderr
    assert "Traceback" not in stderr and " WARNING " not in stderr and "not written" not in stderr, stderr
    assert len(written.findall(stderr)) >= 2, stderr
    clean = procs.dispatcher(work_dir=work_dir)
    assert status_dataset_ids(clean.port) == sorted(ids + more)


def test_with_grpc_fork_handlers_on_checkpoints_are_written_in_process(tmp_path):
    """A process that imported grpc with its fork handlers on (grpcio's default, outside `dataservice
    dispatcher`) must not fork: the checkpoint is written under the lock, at once."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    script = f"""
import os
from dataservice.dispatcher import forked_writes
from dataservice.dispatcher.core import DispatcherCore
from dataservice.dispatcher.journaled_store import JournaledStore
from dataservice import DispatcherConfig
from dataservice.proto import dispatcher_pb2 as pb
assert not forked_writes.fork_available()
store = JournaledStore({str(tmp_path)!r}, checkpoint_records=3)
store.open()
core = DispatcherCore(DispatcherConfig(), store=store)
for i in range(3):
    core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"x%d" % i, num_splits=1))
assert os.path.exists(os.path.join({str(tmp_path)!r}, "checkpoint.bin"))  # no wait: written by the commit
store.close()
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
