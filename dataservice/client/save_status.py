"""A ``distributed_save``'s progress, for ``dataservice save-status``: from the dispatcher (chunks
committed and leased, elements) or from the directory alone (chunks committed; elements once done).

Example::

    >>> progress = save_progress("/shared/saves/train")
    >>> progress["groups_committed"], progress["num_groups"], progress["state"]
    (12, 59, 'running')
"""

from __future__ import annotations

import os
import re
from typing import Optional, TextIO

from dataservice.data import save_format
from dataservice.dispatcher import saves
from dataservice.service.dispatcher_client import DispatcherClient

__all__ = ["save_progress", "format_progress", "progress_bar"]

_CHUNK = re.compile(r"^chunk_\d+$")


def save_progress(path: str, client: Optional[DispatcherClient] = None, timeout_s: Optional[float] = None) -> dict:
    """The save's state ("running", "done" or "error"), num_groups, groups_committed, groups_leased (None
    without a dispatcher), num_elements (committed; None from the directory until done) and error.
    FileNotFoundError when ``path`` holds no distributed save (and the dispatcher knows none)."""
    path = os.path.abspath(path)
    error = _read_text(os.path.join(path, saves.ERROR_FILE))
    if client is not None:
        status = client.get_save_status(path, timeout_s=timeout_s)
        state = "error" if status.error else "done" if status.done else "running"
        return {"path": path, "save_id": status.save_id, "state": state, "num_groups": status.num_groups,
                "groups_committed": status.groups_committed, "groups_leased": status.groups_leased,
                "num_elements": status.num_elements, "bytes": status.bytes, "error": status.error or None}
    record = saves.read_save_file(path)
    if record is None:
        raise FileNotFoundError(2, "no distributed save here (no save.json)", path)
    try:
        committed = sum(1 for name in os.listdir(os.path.join(path, saves.CHUNKS_DIR)) if _CHUNK.match(name))
    except FileNotFoundError:
        committed = 0
    done = os.path.exists(os.path.join(path, saves.DONE_FILE))
    elements = save_format.read_metadata(path)["num_elements"] if done else None
    return {"path": path, "save_id": record.get("save_id"), "state": "error" if error is not None else
            "done" if done else "running", "num_groups": record.get("num_groups"), "groups_committed": committed,
            "groups_leased": None, "num_elements": elements, "bytes": None, "error": error}


def progress_bar(progress: dict, width: int = 30) -> str:
    """``[##########....................] 20/59 chunks, 10,240 elements``."""
    total = max(1, progress["num_groups"] or 1)
    filled = width * progress["groups_committed"] // total
    elements = "" if progress["num_elements"] is None else f", {progress['num_elements']:,} elements"
    return f"[{'#' * filled}{'.' * (width - filled)}] {progress['groups_committed']}/{progress['num_groups']} " \
           f"chunks{elements}"


def format_progress(progress: dict, out: TextIO) -> None:
    """Plain lines for people: the save, its state, chunks and elements, and the error if any."""
    out.write(f"save {progress['save_id']} into {progress['path']}: {progress['state']}\n")
    leased = "" if progress["groups_leased"] is None else f", {progress['groups_leased']} being written"
    out.write(f"chunks: {progress['groups_committed']} of {progress['num_groups']} committed{leased}\n")
    if progress["num_elements"] is not None:
        out.write(f"elements: {progress['num_elements']:,}\n")
    if progress["error"]:
        out.write(f"error: {progress['error']}\n")


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return None
