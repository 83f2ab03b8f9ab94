"""The files of a ``distributed_save``, as the dispatcher writes them.

The dispatcher and the workers share the save's directory (as in tf.data service)::

    path/
      save.json              what the save is: written when it starts (num_groups, compression, spec)
      uncommitted/           workers write <group>-<attempt> here (ChunkWriter: a temporary name, then a rename)
      chunks/chunk_<group>   a group's chunk, once committed: the dispatcher renames the FIRST attempt reported
      metadata.json          written when every group is committed (the format of Dataset.save: load reads it)
      DONE                   written after metadata.json: the save is complete
      ERROR                  instead of DONE: the save failed; the file holds the reason

The core decides (and journals) what happens; this module only touches files. Each function is
idempotent, so a dispatcher restarted between a file operation and its journal record redoes it safely.

Example::

    >>> prepare_directory("/shared/saves/train")
    >>> commit_chunk("/shared/saves/train", group=3, attempt=1700000000000123)
    True
"""

from __future__ import annotations

import json
import os
from typing import Optional

from dataservice import errors
from dataservice.data import save_format

__all__ = ["SAVE_FILE", "DONE_FILE", "ERROR_FILE", "CHUNKS_DIR", "UNCOMMITTED_DIR", "prepare_directory",
           "write_save_file", "uncommitted_path", "chunk_name", "commit_chunk", "discard_chunk", "write_done",
           "write_error", "read_save_file"]

SAVE_FILE = "save.json"
DONE_FILE = "DONE"
ERROR_FILE = "ERROR"
CHUNKS_DIR = "chunks"
UNCOMMITTED_DIR = "uncommitted"


def uncommitted_path(path: str, group: int, attempt: int) -> str:
    """Where a worker writes attempt ``attempt`` at group ``group``."""
    return os.path.join(path, UNCOMMITTED_DIR, f"{group}-{attempt}")


def chunk_name(group: int) -> str:
    """A committed chunk, relative to the save's directory (as metadata.json lists it)."""
    return f"{CHUNKS_DIR}/chunk_{group}"


def prepare_directory(path: str) -> None:
    """Creates ``path`` with its chunks/ and uncommitted/ directories; InvalidRequestError naming the path
    when the dispatcher cannot write there, AlreadyExistsError when it holds another save or other files."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise errors.InvalidRequestError(f"distributed_save: {path} exists and is not a directory")
    if os.path.isdir(path):
        leftovers = sorted(set(os.listdir(path)) - {CHUNKS_DIR, UNCOMMITTED_DIR})
        if SAVE_FILE in leftovers:
            # A save this dispatcher does not know of (it restarted without fault tolerance, or another wrote it).
            ended = "completed" if DONE_FILE in leftovers else "failed" if ERROR_FILE in leftovers else "not completed"
            raise errors.AlreadyExistsError(
                f"distributed_save: {path} already holds a distributed save, already started or completed "
                f"({ended}; its {SAVE_FILE} is there); save into another directory, or remove this one first")
        if leftovers or any(os.listdir(os.path.join(path, d)) for d in (CHUNKS_DIR, UNCOMMITTED_DIR)
                            if os.path.isdir(os.path.join(path, d))):
            raise errors.AlreadyExistsError(
                f"distributed_save: {path} is not empty (it holds {', '.join(leftovers[:5]) or 'chunks'}); "
                f"save into a new directory, or remove it first")
    try:
        for sub in (CHUNKS_DIR, UNCOMMITTED_DIR):
            os.makedirs(os.path.join(path, sub), exist_ok=True)
        probe = os.path.join(path, UNCOMMITTED_DIR, save_format.temporary_name(".probe"))
        with open(probe, "wb"):
            pass
        os.unlink(probe)
    except OSError as exc:
        raise errors.InvalidRequestError(
            f"distributed_save: the dispatcher cannot write to {path} ({exc.strerror or exc}): the directory must "
            f"be writable by the dispatcher and every worker, on a file system they share") from None


def write_save_file(path: str, record: dict) -> None:
    """``path/save.json``, atomically: what load(wait=True) and save-status read before the save is done."""
    target = os.path.join(path, SAVE_FILE)
    save_format.write_file_atomically(target, (json.dumps(record, indent=1) + "\n").encode())


def read_save_file(path: str) -> Optional[dict]:
    """``path/save.json``, or None when there is none (not a distributed save, or not started yet)."""
    try:
        with open(os.path.join(path, SAVE_FILE), "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return None


def commit_chunk(path: str, group: int, attempt: int) -> bool:
    """Renames attempt ``attempt`` of ``group`` to chunks/chunk_<group>; False if its file is missing."""
    source = uncommitted_path(path, group, attempt)
    try:
        os.replace(source, os.path.join(path, chunk_name(group)))
    except FileNotFoundError:
        return False
    save_format.fsync_directory(os.path.join(path, CHUNKS_DIR))
    return True


def discard_chunk(path: str, group: int, attempt: int) -> None:
    """Deletes an attempt that lost to another (its group is committed already)."""
    try:
        os.unlink(uncommitted_path(path, group, attempt))
    except FileNotFoundError:
        pass


def write_done(path: str, metadata: dict) -> None:
    """metadata.json (so ``load`` reads the save like a ``Dataset.save``), then DONE; uncommitted/ emptied."""
    save_format.write_metadata(path, metadata)
    save_format.write_file_atomically(os.path.join(path, DONE_FILE), b"")
    _clear_uncommitted(path)


def write_error(path: str, reason: str) -> None:
    """ERROR holding ``reason``: the save failed and will not complete."""
    save_format.write_file_atomically(os.path.join(path, ERROR_FILE), reason.encode("utf-8", "replace"))
    _clear_uncommitted(path)


def _clear_uncommitted(path: str) -> None:
    directory = os.path.join(path, UNCOMMITTED_DIR)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        try:
            os.unlink(os.path.join(directory, name))
        except OSError:
            pass  # a late worker's temporary file: harmless, and the worker removes its own
