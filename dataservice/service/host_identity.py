"""Which host a process runs on, as readers choosing workers see it (``target_workers``).

Two processes are on the same host when they share the kernel and the network namespace: the same
notion as ``cross_memory`` (a reader copies a worker's memory only then), so containers of one
machine with networks of their own — or a test's simulated hosts (``tests/netns.py``) — are hosts of
their own, as separate machines would be. The id is a digest of the kernel's boot id and the network
namespace, the same in every process of the host and nowhere else.

Deployments where a trainer and its worker run in separate network namespaces of one machine (two
pods of a Kubernetes node) can name the host themselves: set ``DATASERVICE_HOST_ID`` (say, to the
node's name) in both, or ``WorkerConfig(host_id=...)`` for a worker.

Example::

    >>> host_id()
    'c1f0d5a93b7e2a44'
    >>> os.environ["DATASERVICE_HOST_ID"] = "node-7"; host_id()
    'node-7'
"""

from __future__ import annotations

import functools
import hashlib
import os
import socket

__all__ = ["host_id", "HOST_ID_ENV", "check_host_id"]

#: Names this process's host, in place of the kernel's boot id and network namespace.
HOST_ID_ENV = "DATASERVICE_HOST_ID"
#: The longest host id accepted (it travels in every task definition a reader gets).
MAX_HOST_ID_CHARS = 128


def check_host_id(value: str, what: str) -> str:
    """``value`` if it is a usable host id (non-empty, printable, no whitespace, short); else ValueError."""
    if not isinstance(value, str) or not value or len(value) > MAX_HOST_ID_CHARS \
            or any(c.isspace() for c in value) or not value.isprintable():
        raise ValueError(f"{what} must be a non-empty string of at most {MAX_HOST_ID_CHARS} printable characters "
                         f"without whitespace (say, the machine's or the Kubernetes node's name), got "
                         f"{shown_value(value)}")
    return value


def shown_value(value) -> str:
    """``value`` quoted for an error message, cut short when long (a refused one may be megabytes)."""
    return repr(value) if not isinstance(value, str) or len(value) <= 80 else f"{value[:60]!r}..."


@functools.lru_cache(maxsize=1)
def _derived() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            kernel = f.read().strip()
    except OSError:
        kernel = socket.gethostname()  # not Linux: the host's name is the best there is
    # Imported here: cross_memory needs numpy, which the configs (and the CLI's health check) do not.
    from dataservice.service.cross_memory import _network_namespace

    try:
        device, inode = _network_namespace("self")  # cross_memory's notion of "here" too
        network = f"{device}:{inode}"
    except OSError:
        network = ""
    return hashlib.sha256(f"{kernel}/{network}".encode()).hexdigest()[:16]


def host_id() -> str:
    """This process's host: ``$DATASERVICE_HOST_ID`` if set, else the digest the module docstring
    describes (computed once per process)."""
    named = os.environ.get(HOST_ID_ENV)
    if named:
        return check_host_id(named, f"${HOST_ID_ENV}")
    return _derived()
