"""Cross Memory Attach: copying another process's memory straight into ours (Linux).

When a reader and a worker share a host, the reader can copy a large array
out of the worker's memory with one ``process_vm_readv`` call — one copy
instead of TCP's two (into the kernel, out of it) — which is how MPI
implementations move large messages between processes of one node. The worker
sends only the array's address; a probe at connection time (reading a random
token the worker publishes) checks that the reader may read the worker's
memory and that the pid it was given is that worker, not another process of
the same number in another pid namespace. Where the probe fails (another host,
another container, Yama's ``ptrace_scope`` forbidding it, not Linux), readers
use TCP. So does a reader whose worker is in another network namespace
(``same_network_namespace``): it reached the worker over a network, and that is
how it gets the data — a host's containers (or a test's simulated hosts) that
share the pid space but not the network stay apart, as separate hosts would be.

Example::

    >>> dest = np.empty(1 << 20, np.uint8)
    >>> read_into(worker_pid, [dest], [address], [1 << 20])
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys
from typing import Optional, Sequence, Union

import numpy as np

__all__ = ["available", "read_into", "address_of", "same_network_namespace"]

#: The kernel's limit on iovecs per call (IOV_MAX).
_MAX_IOV = 1024


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _load() -> Optional[object]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        function = libc.process_vm_readv
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_ssize_t
    function.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.POINTER(_IoVec),
                         ctypes.c_ulong, ctypes.c_ulong]
    return function


_process_vm_readv = _load()


def available() -> bool:
    """Whether this platform has ``process_vm_readv`` (whether a given worker allows it, only a probe tells)."""
    return _process_vm_readv is not None


def _network_namespace(pid: Union[int, str]) -> tuple[int, int]:
    # A namespace is named by the (device, inode) of its nsfs file.
    info = os.stat(f"/proc/{pid}/ns/net")
    return info.st_dev, info.st_ino


def same_network_namespace(pid: int) -> bool:
    """Whether process ``pid`` is in this process's network namespace (Linux); False when that cannot be
    told (no /proc, or not allowed to look: then memory reads would not be allowed either).

    Example::

        >>> same_network_namespace(os.getpid())
        True
    """
    try:
        return _network_namespace(pid) == _network_namespace("self")
    except OSError:
        return False


def address_of(buffer) -> int:
    """The address of a buffer's first byte (numpy arrays, memoryviews, bytes, bytearrays)."""
    if isinstance(buffer, np.ndarray):
        return buffer.ctypes.data
    return np.frombuffer(buffer, np.uint8).ctypes.data


def read_into(pid: int, dests: Sequence[np.ndarray], addresses: Sequence[int], lengths: Sequence[int]) -> None:
    """Copies ``lengths[i]`` bytes at ``addresses[i]`` in process ``pid`` into ``dests[i]``.

    Raises ``OSError`` (ESRCH: no such process, EPERM: not allowed, EFAULT: a bad address) or
    ``EOFError`` when the process had fewer bytes mapped there than asked for.
    """
    if _process_vm_readv is None:
        raise OSError(errno.ENOSYS, "process_vm_readv is not available on this platform")
    for start in range(0, len(dests), _MAX_IOV):
        batch = range(start, min(start + _MAX_IOV, len(dests)))
        local = (_IoVec * len(batch))()
        remote = (_IoVec * len(batch))()
        total = 0
        for k, i in enumerate(batch):
            n = lengths[i]
            if n > dests[i].nbytes:
                raise ValueError(f"buffer {i}: {n} bytes to read into {dests[i].nbytes}")
            local[k].iov_base, local[k].iov_len = dests[i].ctypes.data, n
            remote[k].iov_base, remote[k].iov_len = addresses[i], n
            total += n
        # ctypes releases the GIL for the call: the copy runs in parallel with Python threads.
        got = _process_vm_readv(pid, local, len(batch), remote, len(batch), 0)
        if got < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"process_vm_readv from pid {pid}: {os.strerror(code)}")
        if got != total:
            raise EOFError(f"process_vm_readv from pid {pid}: read {got} of {total} bytes")
