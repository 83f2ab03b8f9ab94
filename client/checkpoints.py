"""Training checkpoints in a directory: a model's arrays and a JSON state (the data iterator's position, the
step) saved together, atomically, and the latest found again after a restart.

Each checkpoint is a directory ``DIR/step-00000040/`` holding ``model.npz`` (the arrays, ``np.savez``) and
``state.json``. It is written under a temporary name in ``DIR`` and renamed into place with
``os.replace``, so a trainer killed at any moment leaves each checkpoint complete or absent, never half
written. The newest ``keep`` are kept. One trainer writes a directory at a time.

Example::

    >>> from client import checkpoints
    >>> checkpoints.save("/tmp/run", 40, {"weights": weights}, {"step": 40, "data": it.state_dict()})
    '/tmp/run/step-00000040'
    >>> latest = checkpoints.latest("/tmp/run")
    >>> latest.step, latest.arrays["weights"].shape, latest.state["data"]["format"]
    (40, (3072, 10), 'dataservice.iterator')
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
from typing import Any, Mapping, Optional

import numpy as np

from dataservice.data.save_format import fsync_directory

__all__ = ["Checkpoint", "save", "latest", "steps"]

MODEL_FILE = "model.npz"
STATE_FILE = "state.json"
_NAME = re.compile(r"^step-(\d{8,})$")
_TEMPORARY_PREFIX = ".tmp-"


@dataclasses.dataclass
class Checkpoint:
    """A checkpoint read back: where it is, its step, the model's arrays and the JSON state."""

    path: str
    step: int
    arrays: dict[str, np.ndarray]
    state: dict[str, Any]


def _name(step: int) -> str:
    return f"step-{step:08d}"


def steps(directory: str) -> list[int]:
    """The steps of the complete checkpoints in ``directory``, oldest first ([] if it does not exist)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        match = _NAME.match(name)
        if match and os.path.isdir(os.path.join(directory, name)):
            found.append(int(match.group(1)))
    return sorted(found)


def save(directory: str, step: int, arrays: Mapping[str, np.ndarray], state: Mapping[str, Any],
         keep: int = 2) -> str:
    """Writes checkpoint ``step`` (the model's ``arrays`` and the JSON-able ``state``) into ``directory``,
    atomically; keeps the newest ``keep`` checkpoints. Returns the checkpoint's path.

    Example::

        >>> save(ckpt_dir, step, {"weights": weights}, {"step": step, "data": it.state_dict()})
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    os.makedirs(directory, exist_ok=True)
    text = json.dumps(dict(state))  # fails on a state that is not JSON before anything is written
    for name in os.listdir(directory):  # what a killed writer left: never a checkpoint
        if name.startswith(_TEMPORARY_PREFIX):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
    temporary = tempfile.mkdtemp(prefix=_TEMPORARY_PREFIX, dir=directory)
    try:
        with open(os.path.join(temporary, MODEL_FILE), "wb") as f:
            np.savez(f, **{name: np.asarray(array) for name, array in arrays.items()})
            f.flush()
            os.fsync(f.fileno())
        with open(os.path.join(temporary, STATE_FILE), "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        fsync_directory(temporary)
        final = os.path.join(directory, _name(step))
        if os.path.exists(final):  # the same step again (a run that resumed before it): swap, then delete
            old = tempfile.mkdtemp(prefix=_TEMPORARY_PREFIX, dir=directory)
            os.replace(final, os.path.join(old, "checkpoint"))
            os.replace(temporary, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(temporary, final)
        fsync_directory(directory)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    for old_step in steps(directory)[:-keep]:
        shutil.rmtree(os.path.join(directory, _name(old_step)), ignore_errors=True)
    return final


def latest(directory: str) -> Optional[Checkpoint]:
    """The newest checkpoint in ``directory``, read back; None if there is none.

    Example::

        >>> checkpoint = latest(ckpt_dir)
        >>> if checkpoint is not None:
        ...     weights = checkpoint.arrays["weights"]
        ...     it.load_state_dict(checkpoint.state["data"])
    """
    found = steps(directory)
    if not found:
        return None
    path = os.path.join(directory, _name(found[-1]))
    with np.load(os.path.join(path, MODEL_FILE), allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    with open(os.path.join(path, STATE_FILE)) as f:
        state = json.load(f)
    return Checkpoint(path=path, step=found[-1], arrays=arrays, state=state)
