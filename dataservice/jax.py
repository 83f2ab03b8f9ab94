"""JAX: put elements on the device(s) ahead of the training step.

``prefetch_to_device(iterable, size=2)`` pulls elements from ``iterable`` (a ``Dataset`` read through
the service, a local one, any iterator of numpy structures) and calls ``jax.device_put`` on each ahead
of the consumer, so that while the step works on one element the next ``size`` are already on their
way to the device (``device_put`` returns at once; the copy runs asynchronously). It is flax's
``jax_utils.prefetch_to_device`` with ``jax.sharding`` in place of ``pmap``'s leading device axis:
``sharding=batch_sharding()`` splits each array's first axis over the local devices.

The element's structure is kept (tuples, lists, dicts, namedtuples: JAX pytrees); numeric numpy arrays
and scalars become ``jax.Array``s; strings, bytes and other leaves pass through unchanged.

Example::

    >>> import dataservice as ds
    >>> from dataservice.jax import prefetch_to_device
    >>> pipeline = ds.Dataset.range(6).map(lambda i: {"x": np.full(2, i, np.float32), "id": i}).batch(3)
    >>> for batch in prefetch_to_device(pipeline, size=2):
    ...     print(type(batch["x"]).__name__, batch["id"])
    ArrayImpl [0 1 2]
    ArrayImpl [3 4 5]
"""

from __future__ import annotations

import collections
from typing import Any, Iterable, Iterator, Optional, Sequence

import numpy as np

try:
    import jax  # the real JAX: absolute imports never find this module under that name
    import jax.sharding
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"dataservice.jax needs JAX ({exc}): pip install 'dataservice[jax]'") from exc

__all__ = ["prefetch_to_device", "DevicePrefetchIterator", "batch_sharding"]

#: numpy dtype kinds JAX has dtypes for: bool, signed and unsigned ints, floats, complex.
_NUMERIC_KINDS = frozenset("biufc")


def batch_sharding(devices: Optional[Sequence[Any]] = None, axis_name: str = "batch") -> jax.sharding.NamedSharding:
    """A sharding that splits an array's first axis over ``devices`` (default: this process's local devices).

    Example::

        >>> sharding = batch_sharding()                  # e.g. 8 local accelerators: 8 slices of each batch
        >>> it = prefetch_to_device(dataset, size=2, sharding=sharding)
    """
    devices = list(jax.local_devices() if devices is None else devices)
    if not devices:
        raise ValueError("batch_sharding needs at least one device")
    mesh = jax.sharding.Mesh(np.array(devices), (axis_name,))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(axis_name))


def _replicated(sharding: jax.sharding.Sharding) -> jax.sharding.Sharding:
    """Where a scalar goes under ``sharding``: the same devices, not split (a 0-d array has no axis to split)."""
    if isinstance(sharding, jax.sharding.NamedSharding):
        return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
    return sharding


class DevicePrefetchIterator:
    """What ``prefetch_to_device`` returns; see the module docstring.

    ``stats()`` is the source iterator's own (for a dataset read from the service: elements, bytes and
    the time the consumer waited for data); ``close()`` ends the source (releasing a job on the service).
    """

    def __init__(self, iterator: Iterator, size: int, device: Any, sharding: Optional[jax.sharding.Sharding]):
        self._iterator = iterator
        self._size = size
        self._device = device
        self._sharding = sharding
        self._scalar_sharding = None if sharding is None else _replicated(sharding)
        #: (the source's state before the element was read, or None; the element on its way to the device)
        self._queue: collections.deque = collections.deque()
        self._exhausted = False
        # The source's position is saved before each element it reads ahead, so that state_dict() can give the
        # position of the consumer; a source that cannot save (a read from the service) is not asked again.
        self._saves = hasattr(iterator, "state_dict")
        self._unsaveable: Optional[Exception] = None

    def __iter__(self) -> "DevicePrefetchIterator":
        return self

    def _put_leaf(self, leaf: Any, where: str) -> Any:
        if isinstance(leaf, jax.Array):
            array = leaf
        elif isinstance(leaf, (np.ndarray, np.generic)) and leaf.dtype.kind in _NUMERIC_KINDS:
            array = np.asarray(leaf)
        else:
            return leaf  # str, bytes, Python objects, arrays of strings: not for the device
        if self._sharding is None:
            return jax.device_put(array, self._device)
        target = self._sharding if array.ndim else self._scalar_sharding
        try:
            return jax.device_put(array, target)
        except ValueError as exc:
            raise ValueError(f"element{where}: an array of shape {array.shape} does not fit sharding {target} "
                             f"({exc}); with batch_sharding(), batch by a multiple of the device count "
                             f"(len(jax.local_devices()) = {len(jax.local_devices())}) with drop_remainder=True"
                             ) from exc

    def _put(self, value: Any, where: str = "") -> Any:
        # Walked by hand rather than with jax.tree_util: strings are leaves here, and a namedtuple keeps its type.
        if isinstance(value, tuple):
            if hasattr(type(value), "_fields"):
                return type(value)(*(self._put(v, f"{where}.{name}") for name, v in zip(value._fields, value)))
            return tuple(self._put(v, f"{where}[{i}]") for i, v in enumerate(value))
        if isinstance(value, list):
            return [self._put(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, dict):
            items = [(k, self._put(v, f"{where}[{k!r}]")) for k, v in value.items()]
            return collections.OrderedDict(items) if isinstance(value, collections.OrderedDict) else dict(items)
        return self._put_leaf(value, where)

    def _fill(self) -> None:
        """Pulls from the source until ``size`` elements wait beyond the one being handed out."""
        while not self._exhausted and len(self._queue) <= self._size:
            state = self._source_state() if self._saves else None
            try:
                element = next(self._iterator)
            except StopIteration:
                self._exhausted = True
                return
            self._queue.append((state, self._put(element)))

    def _source_state(self) -> Optional[dict]:
        from dataservice.errors import NotCheckpointableError

        try:
            return self._iterator.state_dict()
        except NotCheckpointableError as exc:
            self._saves, self._unsaveable = False, exc
            return None

    def __next__(self) -> Any:
        self._fill()
        if not self._queue:
            raise StopIteration
        return self._queue.popleft()[1]  # the next `size` are already on their way to the device

    def state_dict(self) -> dict:
        """The position of the consumer, not of the read-ahead: the source's state before the first element
        still on its way to the device (a ``Dataset`` iterator's ``state_dict``: a JSON-able dict). Save it
        beside the model (orbax ``JsonSave``, or ``json.dump``).

        Example::

            >>> it = prefetch_to_device(pipeline, size=2)
            >>> params = train(params, next(it))
            >>> json.dumps(it.state_dict())
        """
        if self._unsaveable is not None:
            raise self._unsaveable
        if not hasattr(self._iterator, "state_dict"):
            raise AttributeError(f"{type(self._iterator).__name__} has no state_dict(): only a Dataset's iterator "
                                 f"saves its position")
        if self._queue:
            return self._queue[0][0]
        return self._iterator.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Seeks the source (before the first element) to ``state``, as a ``Dataset`` iterator's
        ``load_state_dict``."""
        if self._queue or self._exhausted:
            raise ValueError("load_state_dict() must come before the iterator's first element")
        self._iterator.load_state_dict(state)

    def stats(self) -> Any:
        """The source iterator's ``stats()`` (zeros for a local pipeline); AttributeError for an iterator that has none
        (a plain Python iterator)."""
        stats = getattr(self._iterator, "stats", None)
        if stats is None:
            raise AttributeError(f"{type(self._iterator).__name__} has no stats(): only a Dataset's iterator "
                                 f"reports them")
        return stats()

    def close(self) -> None:
        self._queue.clear()
        self._exhausted = True
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()


def prefetch_to_device(iterable: Iterable, size: int = 2, device: Any = None,
                       sharding: Optional[jax.sharding.Sharding] = None) -> DevicePrefetchIterator:
    """Iterates ``iterable`` with its elements put on the device ``size`` elements ahead of the consumer.

    Args:
      iterable: a ``dataservice.Dataset`` (each call iterates it afresh: for a dataset read from the
        service, a new iteration of its job) or any iterable of numpy structures.
      size: how many elements are on their way to the device beyond the one the consumer holds (a
        positive int). Device memory holds ``size + 1`` elements, plus what the consumer keeps.
      device: where to put them (a ``jax.Device``); default: JAX's default device. Not with ``sharding``.
      sharding: a ``jax.sharding.Sharding`` for every array with at least one axis (scalars go to the
        same devices, replicated); ``batch_sharding()`` splits the first axis over the local devices.

    Example::

        >>> for images, labels in prefetch_to_device(dataset, size=2, sharding=batch_sharding()):
        ...     params = train_step(params, images, labels)
    """
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"size must be a positive int (elements put on the device ahead of the consumer), "
                         f"got {size!r}")
    if device is not None and sharding is not None:
        raise ValueError("pass device= or sharding=, not both: a sharding names its devices")
    if sharding is not None and not isinstance(sharding, jax.sharding.Sharding):
        raise ValueError(f"sharding must be a jax.sharding.Sharding (e.g. batch_sharding()), got {sharding!r}")
    if device is not None and not isinstance(device, jax.Device):
        raise ValueError(f"device must be a jax.Device (e.g. jax.devices()[0]), got {device!r}")
    return DevicePrefetchIterator(iter(iterable), size, device, sharding)
