"""A thread that drains an iterator into a bounded queue (prefetch, parallel interleave).

The thread holds no reference to the consumer, so an abandoned consumer is
garbage collected, its ``close()`` stops the thread, and nothing leaks.
``InputPosition`` is the position a read-ahead consumer saves of its input (see
``checkpoint.Marks``): one that cannot be saved must not stop the reading;
``Marks`` records it as often as that is cheap. An input that does not read
again alike (``transformations.common.replays``) is read under a lock instead
(``lock=``, or ``Pump.Locked`` as its first item): a consumer that takes it
holds the thread between two elements, to save the input's position and the
elements buffered (``buffered()``) at one cut.

Example::

    >>> pump = Pump(iter(range(3)), capacity=2)
    >>> [pump.get() for _ in range(3)], pump.get() is Pump.END
    ([0, 1, 2], True)
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator, Optional

from dataservice.data.checkpoint import Marks, Pace, save_input
from dataservice.errors import NotCheckpointableError

__all__ = ["Pump", "InputPosition", "UNSAVED", "direct_iterator", "Pace"]


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc


class _Locked:
    __slots__ = ("lock",)

    def __init__(self, lock: Any):
        self.lock = lock


class Pump:
    """Runs ``iterator`` on a daemon thread, buffering up to ``capacity`` elements. ``rewind``, when given
    (``checkpoint.Marks`` over ``iterator``'s position), is told of the thread's reads: it records the input's
    state on that thread when its pace says so. Its first record (before the first read) is the consumer's
    to make, before starting the pump: a ``save()`` may come before the thread has read anything.

    ``lock``, when given, is held by the thread around each element's read and enqueueing (never while it
    waits for room): a consumer holding it sees the iterator between two elements, every element it read
    either in the queue (``buffered()``) or taken. An iterator that learns only once it runs whether it
    needs that (an interleave's slot: its dataset comes from the function) yields ``Pump.Locked(lock)``
    first instead; the other items are read as without a lock, at no extra cost.

    Example::

        >>> lock = threading.Lock()
        >>> pump = Pump(it, capacity=8, lock=lock)
        >>> with lock:
        ...     state, ahead = it.save(), pump.buffered()   # one cut: ``it``'s position and what follows it
    """

    END = object()
    EMPTY = object()
    Locked = _Locked

    def __init__(self, iterator: Iterator, capacity: int, on_ready: Optional[Callable[[], None]] = None,
                 name: str = "dataservice-prefetch", rewind: Optional[Marks] = None,
                 lock: Any = None):
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, capacity))
        self._stop = threading.Event()
        self._on_ready = on_ready
        self._done = False
        self._held = False  # see hold()
        self._resumed = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(iterator, rewind, lock), name=name, daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
            except queue.Full:
                continue
            if self._on_ready is not None:
                self._on_ready()
            return True
        return False

    def _run(self, iterator: Iterator, rewind: Optional[Marks], lock: Any) -> None:
        try:
            if lock is not None:
                if not self._run_locked(iterator, lock):
                    return
            elif rewind is None:
                iterator = iter(iterator)
                for item in iterator:  # the first item only is looked at (a Locked), not the others
                    if type(item) is _Locked:
                        if not self._run_locked(iterator, item.lock):
                            return
                        break
                    if not self._put(item):
                        return
                    for item in iterator:
                        if not self._put(item):
                            return
                    break
            else:
                # Reads counted here, the rewind called only at its records: no call per element.
                step = iterator.__next__
                n, record = 1, rewind.next
                while True:
                    try:
                        item = step()
                    except StopIteration:
                        break
                    if not self._put(item):
                        return
                    if n >= record:
                        rewind.mark(n)
                        record = rewind.next
                    n += 1
            self._put(Pump.END)
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(_Failure(exc))
        finally:
            close = getattr(iterator, "close", None)
            if close is not None and self._stop.is_set():
                try:
                    close()
                except Exception:
                    pass

    def _run_locked(self, iterator: Iterator, lock: Any) -> bool:
        """Reads and enqueues each element under ``lock``; False if stopped."""
        q, stop, on_ready, resumed = self._queue, self._stop, self._on_ready, self._resumed
        room, items, capacity = q.not_full, q.queue, q.maxsize
        step = iterator.__next__
        while True:
            # Room first, without the lock (a consumer may hold it to save): only this thread puts, so the
            # room stays until the put below.
            with room:
                while len(items) >= capacity:
                    if stop.is_set():
                        return False
                    room.wait(0.1)
            lock.acquire()
            try:
                while self._held:  # a state was taken: nothing more is read before the consumer's next
                    lock.release()
                    try:
                        resumed.wait(0.1)
                    finally:
                        lock.acquire()
                    if stop.is_set():
                        return False
                if stop.is_set():
                    return False
                try:
                    item = step()
                except StopIteration:
                    return True
                q.put_nowait(item)
            finally:
                lock.release()
            if on_ready is not None:
                on_ready()

    def hold(self) -> None:
        """Called under the pump's lock, by a consumer that saved: the thread reads nothing more until
        ``resume()``, so that a state taken again before the next element is the same."""
        self._resumed.clear()
        self._held = True

    def resume(self) -> None:
        """Ends a ``hold()``."""
        self._held = False
        self._resumed.set()

    def buffered(self) -> list:
        """The elements read and not yet taken, oldest first (not the end or an error). Exact under the
        ``lock`` the pump reads under: a snapshot otherwise."""
        q = self._queue
        with q.mutex:
            return [x for x in q.queue if x is not Pump.END and type(x) is not _Failure]

    def _unwrap(self, item: Any) -> Any:
        if item is Pump.END:
            self._done = True
        elif type(item) is _Failure:
            self._done = True
            raise item.exc
        return item

    def get(self) -> Any:
        """The next element, ``Pump.END`` at the end; re-raises the iterator's exception."""
        if self._done:
            return Pump.END
        item = self._queue.get()
        if item is Pump.END or type(item) is _Failure:
            return self._unwrap(item)
        return item

    def poll(self) -> Any:
        """Like ``get`` but returns ``Pump.EMPTY`` at once when nothing is buffered."""
        if self._done:
            return Pump.END
        try:
            item = self._queue.get_nowait()
        except queue.Empty:
            return Pump.EMPTY
        return self._unwrap(item)

    def has_buffered(self) -> bool:
        """Whether ``get`` would return without waiting."""
        return self._done or not self._queue.empty()

    def close(self) -> None:
        self._stop.set()
        self._resumed.set()


#: What ``InputPosition.save`` returns for an input that cannot save its position.
UNSAVED = object()


class InputPosition:
    """An input iterator's position, as a read-ahead consumer records it while it reads (give it to a
    ``Marks`` as its input, or call ``save()`` before reading the element that opens an interleave's
    slot): ``save()`` returns ``save_input``'s state, or ``UNSAVED`` for an input that cannot save its own
    (``from_generator``; or whose ``save`` failed), so that a pipeline nobody checkpoints reads on;
    ``check(state)`` raises that input's error for a state that holds ``UNSAVED``, when the consumer is
    asked for its position.

    Example::

        >>> position = InputPosition(it, node)
        >>> marks = Marks(position, node)            # its records hold UNSAVED for such an input
        >>> position.check(marks.save()["input"])    # NotCheckpointableError naming it, if so
    """

    __slots__ = ("_input", "_node", "error")

    def __init__(self, input_iterator: Iterator, node: Any):
        self._input = input_iterator
        self._node = node
        self.error: Optional[Exception] = None

    def save(self) -> Any:
        if self.error is None:
            try:
                return save_input(self._input, self._node)
            except Exception as exc:  # raised by check(), if a state is asked for: the reading goes on
                self.error = exc  # once: it will not save later either
        return UNSAVED

    def check(self, state: Any) -> Any:
        """``state``, or the input's error when it is ``UNSAVED``."""
        if state is UNSAVED:
            if isinstance(self.error, NotCheckpointableError):
                raise NotCheckpointableError(str(self.error))
            raise self.error
        return state


def direct_iterator(it: Iterator) -> Iterator:
    """The iterator that ``it.__next__`` advances: ``it`` itself, or, for a node's iterator that binds a
    generator's ``__next__`` (``checkpoint.Follows``, ``ChunkIterator``), that generator. A C loop over it
    (``zip``, ``enumerate``, ``yield from``) then skips the look-up of ``__next__`` on the node iterator's
    class, some 5-10 ns an element. Take it after ``restore()``.

    Example::

        >>> source = iter(Dataset.range(3))._it
        >>> list(direct_iterator(source))
        [0, 1, 2]
    """
    step = getattr(it, "__next__", None)
    owner = getattr(step, "__self__", None)
    if owner is not None and owner is not it and getattr(owner, "__next__", None) == step and iter(owner) is owner:
        return owner
    return it
