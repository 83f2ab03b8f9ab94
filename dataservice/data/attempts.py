"""Private attempt directories, committed by an atomic rename, and swept when their writer died.

A writer (a snapshot's, a catalogue preparation's) writes into a directory of its own beside the
place the result goes, holding an ``flock`` on a lock file next to it for as long as it lives. The
first to finish renames its directory into place; a later one finds the place taken and discards
its own. The kernel drops a process's locks when it dies (SIGKILL included), so an attempt whose
lock is free belongs to a dead writer and the next writer sweeps it; a live writer's is left alone.

Example::

    >>> sweep_stale_attempts("/data/x/attempts")
    >>> attempt = Attempt("/data/x/attempts")
    >>> ...  # write into attempt.directory
    >>> fsync_tree_dirs(attempt.directory)
    >>> attempt.commit("/data/x/committed")   # False when another writer committed first
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import shutil
import socket
from typing import Optional

__all__ = ["Attempt", "sweep_stale_attempts", "fsync_tree_dirs"]


def _save_format():
    # Imported when used: save_format imports the pipeline library, which imports this module.
    from dataservice.data import save_format

    return save_format


class Attempt:
    """A writer's directory under ``attempts`` (named ``<prefix><host>-<pid>-<random><suffix>``), with its
    lock file (the same name + ``.lock``) flock'ed for as long as it lives.

    The lock file is made before the directory, and a sweeper removes the directory before the lock
    file, so a directory without its lock file is never left behind.
    """

    def __init__(self, attempts: str, prefix: str = "", suffix: str = ""):
        host = socket.gethostname().replace(os.sep, "_") or "host"
        while True:
            name = f"{prefix}{host}-{os.getpid()}-{secrets.token_hex(4)}{suffix}"
            lock_path = os.path.join(attempts, name + ".lock")
            fd = os.open(lock_path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as exc:
                if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    os.close(fd)
                    raise
                # A filesystem without locks: the attempt is never swept as stale while its file exists.
            # A sweeper may have taken the unlocked file between open and flock, and unlinked it.
            if os.fstat(fd).st_nlink > 0:
                break
            os.close(fd)
        self._fd: Optional[int] = fd
        self._lock_path = lock_path
        self.directory = os.path.join(attempts, name)
        os.mkdir(self.directory)

    def commit(self, committed: str) -> bool:
        """Renames the attempt to ``committed``; False when another writer committed first."""
        try:
            os.rename(self.directory, committed)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            # Another writer finished first; its snapshot holds the same pipeline's output.
            self.discard()
            return False
        _save_format().fsync_directory(os.path.dirname(committed))
        self._release()
        return True

    def discard(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
        self._release()

    def _release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self._lock_path)
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None


def sweep_stale_attempts(attempts: str, prefix: str = "") -> list[str]:
    """Removes the attempts (under ``attempts``, named with ``prefix``) whose writer is gone (its flock is
    free: the kernel drops a process's locks when it dies, SIGKILL included); returns their names. A live
    writer's attempt is left alone."""
    swept = []
    try:
        names = os.listdir(attempts)
    except FileNotFoundError:
        return swept
    for name in names:
        if not name.endswith(".lock") or not name.startswith(prefix):
            continue
        lock_path = os.path.join(attempts, name)
        try:
            fd = os.open(lock_path, os.O_RDWR)
        except FileNotFoundError:
            continue  # its writer finished, or another sweeper took it
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # held: a live writer (or no locks here: never assume a writer dead)
            if os.fstat(fd).st_nlink == 0:
                continue  # removed between listdir and open
            shutil.rmtree(os.path.join(attempts, name[:-len(".lock")]), ignore_errors=True)
            os.unlink(lock_path)
            swept.append(name[:-len(".lock")])
        finally:
            os.close(fd)
    return swept


def fsync_tree_dirs(root: str) -> None:
    """fsyncs the directories under ``root`` and ``root``: the shard directories' entries are durable
    before the rename that commits them."""
    for directory, _, _ in os.walk(root, topdown=False):
        _save_format().fsync_directory(directory)
