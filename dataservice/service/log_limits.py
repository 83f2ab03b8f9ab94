"""Log lines that cannot flood a log: at most one per key per interval.

A misbehaving or hostile peer can send thousands of bad requests a second. Each kind of
refusal is worth one line to the operator, not one line per call: ``RateLimitedLog`` writes
the first occurrence of a key at once, then holds back that key's lines for ``interval_s``;
the next line it lets through says how many it held back.

Example::

    >>> limited = RateLimitedLog(logging.getLogger("dataservice.dispatcher"), interval_s=60)
    >>> limited.warning(("GetSplit", "parse"), "GetSplit: a request of %d bytes is not a GetSplitRequest", 7)
    True
    >>> limited.warning(("GetSplit", "parse"), "GetSplit: a request of %d bytes is not a GetSplitRequest", 9)
    False
    >>> # a minute later the next one is logged, ending "(1 more like it in the last 60 s not logged)"
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Hashable, Optional

__all__ = ["RateLimitedLog", "DEFAULT_INTERVAL_S"]

#: How often a line of one key may be logged, by default.
DEFAULT_INTERVAL_S = 60.0
#: Keys remembered at most: past it, keys whose interval has run out are forgotten.
_MAX_KEYS = 10_000


class RateLimitedLog:
    """Thread-safe; see the module docstring. ``clock`` (monotonic seconds) is for tests."""

    def __init__(self, logger: logging.Logger, interval_s: float = DEFAULT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic):
        if interval_s < 0:
            raise ValueError(f"interval_s must be non-negative, got {interval_s!r}")
        self.logger = logger
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        # key -> [when its last line was written, lines held back since]
        self._keys: dict[Hashable, list] = {}

    def log(self, level: int, key: Hashable, msg: str, *args: object,
            exc_info: Optional[BaseException] = None) -> bool:
        """Logs ``msg % args`` unless a line of ``key`` was logged less than ``interval_s`` ago;
        True if it was logged. ``exc_info`` adds the exception's traceback to the line."""
        now = self._clock()
        with self._lock:
            entry = self._keys.get(key)
            if entry is not None and now - entry[0] < self.interval_s:
                entry[1] += 1
                return False
            held_back = entry[1] if entry is not None else 0
            since = now - entry[0] if entry is not None else 0.0
            if entry is None and len(self._keys) >= _MAX_KEYS:
                self._forget_expired(now)
            self._keys[key] = [now, 0]
        if held_back:
            msg += " (%d more like it in the last %.0f s not logged)"
            args = (*args, held_back, since)
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True

    def warning(self, key: Hashable, msg: str, *args: object) -> bool:
        return self.log(logging.WARNING, key, msg, *args)

    def error(self, key: Hashable, msg: str, *args: object, exc_info: Optional[BaseException] = None) -> bool:
        return self.log(logging.ERROR, key, msg, *args, exc_info=exc_info)

    def held_back(self, key: Hashable) -> int:
        """Lines of ``key`` not logged since its last logged one."""
        with self._lock:
            entry = self._keys.get(key)
            return entry[1] if entry is not None else 0

    def _forget_expired(self, now: float) -> None:
        # Their held-back counts are lost: a bound on memory matters more than a count.
        for key in [k for k, (when, _) in self._keys.items() if now - when >= self.interval_s]:
            del self._keys[key]
