"""PyTorch: a ``Dataset`` — read through the service or local — as a ``torch.utils.data.IterableDataset``.

``TorchDataset(dataset)`` yields each element with its numpy arrays turned into tensors by
``torch.from_numpy``: a tensor *is* the buffer the element arrived in (no copy), and keeps that buffer
out of the client's receive pool for as long as the tensor lives. The element's structure is kept
(tuples, lists, dicts, namedtuples); strings, bytes and arrays torch has no dtype for (strings,
objects, datetimes) pass through unchanged; numpy scalars become 0-d tensors.

Use it on its own or under ``torch.utils.data.DataLoader(ds, batch_size=None)`` (the pipeline already
batches; ``batch_size=None`` keeps the loader from batching again; the loader turns tuples into lists
unless given ``collate_fn=keep_structure``). Each ``iter()`` — each epoch of a loader — is a new
iteration of the pipeline: for a distributed dataset, a new iteration of its job.

Example::

    >>> import dataservice as ds
    >>> from dataservice.torch import TorchDataset
    >>> pipeline = ds.Dataset.range(8).map(lambda i: (np.full(3, i, np.float32), i)).batch(4)
    >>> for features, labels in torch.utils.data.DataLoader(TorchDataset(pipeline), batch_size=None):
    ...     print(features.shape, labels)
    torch.Size([4, 3]) tensor([0, 1, 2, 3])
    torch.Size([4, 3]) tensor([4, 5, 6, 7])

Saving and resuming (torch's ``Stateful`` protocol, as torchdata's ``StatefulDataLoader`` and
``torch.distributed.checkpoint`` call it): ``TorchDataset.state_dict()`` is the position of its most recent
iterator, and ``load_state_dict(state)`` makes the next ``iter()`` start there; the iterator has both too.
The state is a plain dict (JSON, and ``torch.load(weights_only=True)`` reads it back); for a read from the
service it needs ``distribute("distributed_epoch", ..., deterministic=True)`` to continue the same sequence
(dynamic order: every element not yet taken, once)::

    >>> tds = TorchDataset(pipeline.apply(distribute("distributed_epoch", service, deterministic=True)))
    >>> loader = torchdata.stateful_dataloader.StatefulDataLoader(tds, batch_size=None)
    >>> ...  # train some steps
    >>> torch.save({"model": model.state_dict(), "loader": loader.state_dict()}, "ckpt.pt")
    >>> # In the restarted process, with the same pipeline:
    >>> loader.load_state_dict(torch.load("ckpt.pt", weights_only=True)["loader"])
    >>> for batch in loader: ...  # continues with the batch after the saved one

or without a loader: ``torch.save({"model": ..., "data": tds.state_dict()})``, then
``tds.load_state_dict(checkpoint["data"])`` before ``iter(tds)``.

``DataLoader(num_workers=N)``: the service's workers already run the pipeline and the reader fetches on
threads of its own, so a dataset read from the service is refused in loader worker processes (each
would be a reader of its own, and every element would be pickled through the loader's queues). A local
dataset is sharded over the loader's workers (``dataset.shard(N, worker_id)``), so every element comes
once, in order.
"""

from __future__ import annotations

import collections
import copy
import warnings
from typing import Any, Iterator, Optional, Union

import numpy as np

try:
    import torch  # the real PyTorch: absolute imports never find this module under that name
    import torch.utils.data
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"dataservice.torch needs PyTorch ({exc}): pip install 'dataservice[torch]'") from exc

from dataservice.data.dataset import Dataset

__all__ = ["TorchDataset", "TensorIterator", "to_torch", "keep_structure"]

#: numpy dtype kinds torch has dtypes for: bool, signed and unsigned ints, floats, complex.
_NUMERIC_KINDS = frozenset("biufc")

Device = Union[str, "torch.device", int, None]


def _accelerator_available() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return bool(accelerator.is_available())
    return torch.cuda.is_available()  # pragma: no cover - torch < 2.6


def _array_to_tensor(array: np.ndarray, where: str) -> torch.Tensor:
    """``torch.from_numpy`` where it can share the buffer; a copy only where torch cannot."""
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))  # torch has no byte-swapped dtypes
    if not array.flags.writeable:
        # A tensor is always writable; sharing a read-only buffer (bytes, a read-only mmap) would let
        # a write through the tensor crash or corrupt it, and torch warns. Elements from the service
        # arrive in writable buffers of the client's own, so only local read-only arrays are copied.
        array = array.copy()
    if any(stride < 0 for stride in array.strides):
        array = np.ascontiguousarray(array)  # from_numpy refuses negative strides (a reversed view)
    try:
        return torch.from_numpy(array)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"element{where}: a numpy array of dtype {array.dtype} and shape {array.shape} has no "
                        f"torch tensor form ({exc}); convert it in the pipeline (e.g. .map(...astype(...)))") from exc


def _convert(value: Any, where: str) -> Any:
    if isinstance(value, np.ndarray):
        return _array_to_tensor(value, where) if value.dtype.kind in _NUMERIC_KINDS else value
    if isinstance(value, np.generic):
        # np.str_ / np.bytes_ are str / bytes: passed through like them.
        return _array_to_tensor(np.asarray(value), where) if value.dtype.kind in _NUMERIC_KINDS else value
    if isinstance(value, tuple):
        if hasattr(type(value), "_fields"):  # a namedtuple: rebuilt with its own type
            return type(value)(*(_convert(v, f"{where}.{name}") for name, v in zip(value._fields, value)))
        return tuple(_convert(v, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(value, list):
        return [_convert(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        items = [(k, _convert(v, f"{where}[{k!r}]")) for k, v in value.items()]
        return collections.OrderedDict(items) if isinstance(value, collections.OrderedDict) else dict(items)
    return value  # str, bytes, Python numbers, None: as they are


def _move(value: Any, pin_memory: bool, device: Optional[torch.device], non_blocking: bool) -> Any:
    if isinstance(value, torch.Tensor):
        if pin_memory:
            value = value.pin_memory()
        if device is not None:
            value = value.to(device, non_blocking=non_blocking)  # a no-op (same tensor) when already there
        return value
    if isinstance(value, tuple):
        moved = [_move(v, pin_memory, device, non_blocking) for v in value]
        return type(value)(*moved) if hasattr(type(value), "_fields") else tuple(moved)
    if isinstance(value, list):
        return [_move(v, pin_memory, device, non_blocking) for v in value]
    if isinstance(value, dict):
        items = [(k, _move(v, pin_memory, device, non_blocking)) for k, v in value.items()]
        return collections.OrderedDict(items) if isinstance(value, collections.OrderedDict) else dict(items)
    return value


def _parse_device(device: Device) -> Optional[torch.device]:
    if device is None:
        return None
    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ValueError(f"device must be None or a torch device (e.g. 'cpu', 'cuda:0', torch.device('cuda')), "
                         f"got {device!r}: {exc}") from exc


def to_torch(element: Any, pin_memory: bool = False, device: Device = None, non_blocking: bool = False) -> Any:
    """One element with its numpy arrays as tensors sharing their memory; see the module docstring.

    ``pin_memory`` copies each tensor into page-locked memory (needs an accelerator); ``device`` moves
    it there (``non_blocking`` as ``Tensor.to``'s). Both copy, except ``device="cpu"``.

    Example::

        >>> a = np.arange(4.0)
        >>> t = to_torch({"x": a, "name": "first"})
        >>> t["x"].data_ptr() == a.ctypes.data, t["name"]
        (True, 'first')
    """
    converted = _convert(element, "")
    if pin_memory or device is not None:
        converted = _move(converted, pin_memory, _parse_device(device), non_blocking)
    return converted


def keep_structure(element: Any) -> Any:
    """A ``collate_fn`` for ``DataLoader(batch_size=None)`` that hands elements over as they are.

    The loader's default (``torch.utils.data.default_convert``) turns every plain tuple into a list, for
    backwards compatibility; dicts, namedtuples and tensors it keeps. With this, tuples stay tuples.

    Example::

        >>> loader = DataLoader(TorchDataset(dataset), batch_size=None, collate_fn=keep_structure)
    """
    return element


class TensorIterator:
    """What ``iter(TorchDataset(...))`` returns: the pipeline's iterator, its elements as tensors.

    ``stats()`` is the pipeline iterator's own (for a dataset read from the service: elements, bytes and
    the time the consumer waited for data); ``close()`` ends the read (releasing a job on the service).
    """

    def __init__(self, iterator: Iterator, pin_memory: bool, device: Optional[torch.device], non_blocking: bool,
                 dataset: Optional[Dataset] = None):
        self._iterator = iterator
        self._pin_memory = pin_memory
        self._device = device
        self._non_blocking = non_blocking
        self._dataset = dataset  # what ``iterator`` iterates: a second restore starts a fresh one
        self._restored: Optional[dict] = None
        self._started = False

    def __iter__(self) -> "TensorIterator":
        return self

    def __next__(self) -> Any:
        self._started = True
        element = _convert(next(self._iterator), "")
        if self._pin_memory or self._device is not None:
            element = _move(element, self._pin_memory, self._device, self._non_blocking)
        return element

    def stats(self) -> Any:
        """The pipeline iterator's ``stats()`` (zeros for a local pipeline); AttributeError for an iterator that has none."""
        stats = getattr(self._iterator, "stats", None)
        if stats is None:
            raise AttributeError(f"{type(self._iterator).__name__} has no stats(): only a Dataset's iterator "
                                 f"reports them")
        return stats()

    # torch's Stateful protocol: torch.save / torch.distributed.checkpoint take these, and torchdata's
    # StatefulDataLoader calls them on a dataset's iterator.
    def state_dict(self) -> dict:
        """The pipeline iterator's position (``Dataset`` iterators' ``state_dict``: a JSON-able dict).

        Example::

            >>> it = iter(TorchDataset(pipeline))
            >>> torch.save({"model": model.state_dict(), "data": it.state_dict()}, "ckpt.pt")
        """
        return _stateful(self._iterator).state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Seeks the pipeline iterator (before its first element) to ``state``.

        Loading the state this iterator was already restored to does nothing (``StatefulDataLoader``
        restores the dataset, which restores its new iterator, then restores that iterator with the same
        state); another state, before the first element, replaces it.
        """
        if self._restored is not None and not self._started:
            if state == self._restored:
                return
            if self._dataset is not None:  # a Dataset iterator is restored once: start a fresh one
                self.close()
                self._iterator = iter(self._dataset)
        _stateful(self._iterator).load_state_dict(state)
        self._restored = copy.deepcopy(state)

    def close(self) -> None:
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()


def _stateful(iterator: Iterator) -> Any:
    if not hasattr(iterator, "state_dict"):
        raise AttributeError(f"{type(iterator).__name__} has no state_dict(): only a Dataset's iterator saves "
                             f"its position")
    return iterator


class TorchDataset(torch.utils.data.IterableDataset):
    """A ``Dataset`` (read through the service, or local) as a torch ``IterableDataset``.

    Args:
      dataset: a ``dataservice.Dataset``, typically ``pipeline.apply(distribute(...))`` or
        ``from_dataset_id(...)``.
      pin_memory: copy every tensor into page-locked memory, for fast asynchronous copies to an
        accelerator. Without an accelerator, warns once (as ``DataLoader(pin_memory=True)`` does) and
        does not pin. Under a ``DataLoader`` its own ``pin_memory=True`` does the same.
      device: move every tensor there (``"cuda"``, ``"cuda:1"``, ``"cpu"``...); ``"cpu"`` keeps the
        received buffers (no copy).
      non_blocking: ``Tensor.to(..., non_blocking=)``; default: ``pin_memory`` (asynchronous copies
        need pinned memory).

    Example::

        >>> dataset = pipeline.apply(distribute("distributed_epoch", "grpc://localhost:5050", job_name="train"))
        >>> loader = torch.utils.data.DataLoader(TorchDataset(dataset), batch_size=None)
        >>> for images, labels in loader:
        ...     loss = step(model, images, labels)
    """

    def __init__(self, dataset: Dataset, pin_memory: bool = False, device: Device = None,
                 non_blocking: Optional[bool] = None):
        if not isinstance(dataset, Dataset):
            raise TypeError(f"TorchDataset wraps a dataservice Dataset (e.g. pipeline.apply(distribute(...))), "
                            f"got {type(dataset).__name__}")
        if not isinstance(pin_memory, bool):
            raise ValueError(f"pin_memory must be True or False, got {pin_memory!r}")
        self.dataset = dataset
        self.device = _parse_device(device)
        self.pin_memory = pin_memory
        if pin_memory and not _accelerator_available():
            warnings.warn("TorchDataset(pin_memory=True): no accelerator is available, so memory is not pinned",
                          stacklevel=2)
            self.pin_memory = False
        self.non_blocking = self.pin_memory if non_blocking is None else bool(non_blocking)
        self._current: Optional[TensorIterator] = None  # the most recent iterator: its position is the state
        self._pending: Optional[dict] = None  # from load_state_dict, for the next iter()

    # torch's Stateful protocol on the dataset object, which torchdata's StatefulDataLoader saves (as
    # "dataset_state") and restores before it calls iter() on the dataset.
    def state_dict(self) -> dict:
        """The position of this dataset's most recent iterator (``TensorIterator.state_dict``): a plain dict
        that ``json.dumps`` and ``torch.save``/``torch.load(weights_only=True)`` take. After
        ``load_state_dict`` and before the next ``iter()``: that state. Before any ``iter()``: the start.
        For this, the dataset holds its most recent iterator until the next ``iter()``: a loop left early
        keeps its read open until then, or until the iterator's ``close()``.

        Example::

            >>> tds = TorchDataset(pipeline)
            >>> it = iter(tds); _ = next(it)
            >>> torch.save({"model": model.state_dict(), "data": tds.state_dict()}, "ckpt.pt")
        """
        if self._pending is not None:
            return copy.deepcopy(self._pending)
        if self._current is not None:
            return self._current.state_dict()
        fresh = iter(self.dataset)  # a read from the service starts nothing before its first next()
        try:
            return _stateful(fresh).state_dict()
        finally:
            close = getattr(fresh, "close", None)
            if close is not None:
                close()

    def load_state_dict(self, state: dict) -> None:
        """Makes the next ``iter(self)`` start where ``state`` (from ``state_dict()``, of the same pipeline,
        in this process or another) was taken; the iterations after it start from the beginning again.
        A malformed state or one of another pipeline raises ValueError at that ``iter()``.

        Example::

            >>> tds = TorchDataset(pipeline)
            >>> tds.load_state_dict(torch.load("ckpt.pt", weights_only=True)["data"])
            >>> for batch in tds: ...  # the batch after the saved one, first
        """
        if not isinstance(state, dict):
            raise ValueError(f"load_state_dict() expects the dict state_dict() returned, got {type(state).__name__}")
        self._pending = copy.deepcopy(state)

    def __getstate__(self) -> dict:
        # A DataLoader worker process gets a copy of the dataset: not the live iterator of this process.
        state = dict(self.__dict__)
        state["_current"] = None
        return state

    def __iter__(self) -> TensorIterator:
        dataset = self.dataset
        info = torch.utils.data.get_worker_info()
        if info is not None:  # in a DataLoader worker process
            if dataset._reads_from_service():
                raise RuntimeError(
                    f"TorchDataset over a dataset read from the service, in DataLoader worker {info.id} of "
                    f"{info.num_workers}: use DataLoader(num_workers=0). The service's workers already run the "
                    f"pipeline and the reader fetches on its own threads; each loader worker would be a separate "
                    f"reader (a job of its own, or a share of a named job restarted each epoch) and every element "
                    f"would be pickled through the loader's queues instead of arriving in place. For several "
                    f"reader processes, give each its TorchDataset with one shared job_name (see the README's "
                    f"DistributedDataParallel pattern)")
            if self.pin_memory or (self.device is not None and self.device.type != "cpu"):
                raise RuntimeError("TorchDataset(pin_memory=True or device=...) in a DataLoader worker process: "
                                   "accelerators are not usable there; use DataLoader(pin_memory=True) and move "
                                   "batches to the device in the training loop")
            # Each loader worker iterates its own copy: keep every num_workers-th element, so that the
            # loader, taking one from each worker in turn, gives every element once, in order.
            dataset = dataset.shard(info.num_workers, info.id)
        iterator = TensorIterator(iter(dataset), self.pin_memory, self.device, self.non_blocking, dataset)
        if self._pending is not None:
            iterator.load_state_dict(self._pending)  # a bad state raises here and stays pending
            self._pending = None
        self._current = iterator
        return iterator

    def __repr__(self) -> str:
        return f"TorchDataset({self.dataset!r}, pin_memory={self.pin_memory}, device={self.device})"
