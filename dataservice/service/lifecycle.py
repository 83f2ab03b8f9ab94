"""Stops in-process servers and readers when the interpreter exits, before Python tears down.

A script that starts a ``DispatchServer`` and ``WorkerServer``s and never stops
them (the README's first example) used to end with a traceback about once in
two runs: at exit, Python shuts down thread pools, including the one each gRPC
server runs its RPCs on, while the servers' threads still talk to each other —
``RuntimeError: cannot schedule new futures after shutdown``. Whatever is still
running at exit is stopped here first, in dependency order: readers release
their iterations (the dispatcher is still up to hear it), then workers stop,
then dispatchers.

The hook runs with ``threading``'s exit callbacks, which run before thread
pools shut down (``concurrent.futures`` registers its own there, earlier, and
they run last-registered first) and before ``atexit``.

Example::

    >>> stop_at_exit(dispatcher.stop, Stage.DISPATCHERS)   # DispatchServer.start() does this
"""

from __future__ import annotations

import enum
import logging
import threading
import weakref
from typing import Callable

__all__ = ["Stage", "stop_at_exit", "stop_all"]

log = logging.getLogger("dataservice")


class Stage(enum.IntEnum):
    """The order of stopping: lower first."""

    READERS = 0
    WORKERS = 1
    DISPATCHERS = 2


_lock = threading.Lock()
# Weak: a server or reader that was dropped (and so stopped) must not be kept alive for this.
_live: dict[Stage, "dict[int, weakref.WeakMethod]"] = {stage: {} for stage in Stage}
_hooked = False


def stop_at_exit(method: Callable[[], None], stage: Stage) -> None:
    """Calls the bound ``method`` (``server.stop``, ``reader.close``) at interpreter exit, unless its
    object is gone by then."""
    global _hooked
    with _lock:
        live = _live[stage]
        for key in [k for k, ref in live.items() if ref() is None]:
            del live[key]
        live[id(method.__self__)] = weakref.WeakMethod(method)
        if not _hooked:
            try:
                threading._register_atexit(stop_all)  # type: ignore[attr-defined]
            except (AttributeError, RuntimeError):  # another Python, or exit has begun: atexit is the best left
                import atexit
                atexit.register(stop_all)
            _hooked = True


def stop_all() -> None:
    """Stops every live reader, then worker, then dispatcher of this process."""
    for stage in Stage:
        with _lock:
            methods = [ref() for ref in _live[stage].values()]
        for method in methods:
            if method is None:
                continue
            try:
                method()
            except Exception as exc:  # exiting anyway: one failure must not keep the rest running
                log.debug("stopping %r at exit failed: %s", method.__self__, exc)
