"""``distribute``, ``register_dataset`` and ``from_dataset_id``, as in tf.data service.

Example::

    >>> ds = Dataset.range(5).map(lambda x: x * x)
    >>> ds = ds.apply(distribute("parallel_epochs", dispatcher.target))
    >>> ds = ds.map(lambda x: x + 1)          # runs in this process
    >>> sorted(int(x) for x in ds)            # with two workers
    [1, 1, 2, 2, 5, 5, 10, 10, 17, 17]
"""

from __future__ import annotations

import enum
import itertools
import threading
import time
import weakref
from typing import Any, Callable, Iterator, Optional, Union

import numpy as np

from dataservice import errors
from dataservice.errors import NotCheckpointableError
from dataservice.client.coordinated_reader import CoordinatedReader
from dataservice.client.read_options import CrossTrainerCache, ReadOptions
from dataservice.client.read_position import ReadPosition
from dataservice.client.reader import DEFAULT_MAX_OUTSTANDING_REQUESTS, IterationReader, ReaderStats, \
    ReaderStatsRecorder
from dataservice.client.transports import DATA_TRANSFER_PROTOCOLS
from dataservice.data import specs
from dataservice.data.checkpoint import NodeIterator, field
from dataservice.data.dataset import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset, IteratorContext, \
    _ClosingIterator, unsized_num_groups
from dataservice.data.serialization import registered_cardinality, registered_element_spec, serialize_dataset
from dataservice.dispatcher.request_checks import DATASET_NAME_RULE, MAX_DATASET_NAME_CHARS, dataset_name_problem, \
    shown_name
from dataservice.proto import state_pb2
from dataservice.service.addresses import channel_address
from dataservice.service.auth import ClusterAuth
from dataservice.service.dispatcher_client import DispatcherClient
from dataservice.service.processing_modes import MODES_BY_NAME, is_static, mode_name
from dataservice.service.tls import TlsSettings

__all__ = ["distribute", "register_dataset", "from_dataset_id", "ShardingPolicy", "DEFAULT_TIMEOUT_MS",
           "CrossTrainerCache",
           "DistributedIterator", "ReaderStats", "reader_stats"]

#: How long a client keeps trying to reach the dispatcher before raising ServiceUnavailableError.
DEFAULT_TIMEOUT_MS = 60_000


class ShardingPolicy(enum.Enum):
    """tf.data's names for the processing modes: OFF is parallel_epochs, DYNAMIC is distributed_epoch.

    The static policies need the dispatcher's fixed worker list (``DispatcherConfig.worker_addresses``);
    each listed worker produces its own shard (``dataservice/data/static_sharding.py``): FILE a fixed set
    of the pipeline's files (an error with fewer files than workers), DATA every n-th element, FILE_OR_DATA
    FILE when the pipeline reads files and DATA otherwise, HINT replaces ``shard(SHARD_HINT, SHARD_HINT)``
    by ``shard(num_workers, worker_index)``. A restarted worker starts its shard over.
    """

    OFF = "parallel_epochs"
    DYNAMIC = "distributed_epoch"
    FILE = "shard_file"
    DATA = "shard_data"
    FILE_OR_DATA = "shard_file_or_data"
    HINT = "shard_hint"


def reader_stats(ctx: IteratorContext) -> ReaderStats:
    """What the consumer of the pipeline iterated with ``ctx`` saw of the service so far, over all the
    distributed datasets read in it (zeros if none was read yet).

    Example::

        >>> it = iter(dataset.apply(distribute("parallel_epochs", target)))
        >>> reader_stats(it._ctx) == it.stats()
        True
    """
    return ctx.read_stats().stats()


def _recorder(ctx: IteratorContext) -> ReaderStatsRecorder:
    """The stats recorder of the iterator ``ctx`` belongs to, made on first use. Every node of a pipeline
    iterates with its root's context, so all the readers of one iterator (each epoch of a ``repeat()``,
    both sides of a ``zip``) add up in one place."""
    return ctx.read_stats()


class DistributedIterator(_ClosingIterator):
    """The iterator of a dataset read from the service (``distribute``, ``from_dataset_id``): a pipeline
    iterator with ``stats()``.

    Example::

        >>> it = iter(Dataset.range(10).apply(distribute("parallel_epochs", target)))
        >>> sum(1 for _ in it), it.stats().elements
        (20, 20)
    """

    __slots__ = ()  # stats(): the pipeline iterator's own (``_ClosingIterator.stats``)


_MODES = MODES_BY_NAME  # "parallel_epochs", "distributed_epoch" and the static policies' "shard_file", ...

ProcessingMode = Union[str, ShardingPolicy]


def _parse_mode(processing_mode: ProcessingMode) -> int:
    if isinstance(processing_mode, ShardingPolicy):
        processing_mode = processing_mode.value
    if processing_mode not in _MODES:
        raise ValueError(f"processing_mode must be 'parallel_epochs', 'distributed_epoch' or a ShardingPolicy "
                         f"(OFF, DYNAMIC, FILE, DATA, FILE_OR_DATA, HINT), got {processing_mode!r}")
    return _MODES[processing_mode]


def _parse_service(service: str) -> str:
    return channel_address(service, "service")


def _parse_outstanding(max_outstanding_requests: Optional[int]) -> int:
    if max_outstanding_requests is None:
        return DEFAULT_MAX_OUTSTANDING_REQUESTS
    if not isinstance(max_outstanding_requests, int) or isinstance(max_outstanding_requests, bool) \
            or max_outstanding_requests <= 0:
        raise ValueError(f"max_outstanding_requests must be a positive int, got {max_outstanding_requests!r}")
    return max_outstanding_requests


def _parse_timeout(timeout_ms: int) -> int:
    # Checked at call time: a bad value would otherwise surface only when iterating, as a TypeError deep inside.
    if not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or timeout_ms <= 0:
        raise ValueError(f"timeout_ms must be a positive number of milliseconds, got {timeout_ms!r}")
    return timeout_ms


def _parse_job_name(job_name: Optional[str]) -> str:
    if job_name is None:
        return ""
    if not isinstance(job_name, str) or not job_name:
        raise ValueError(f"job_name must be a non-empty string or None, got {job_name!r}")
    return job_name


def _parse_protocol(data_transfer_protocol: Optional[str]) -> Optional[str]:
    if data_transfer_protocol not in DATA_TRANSFER_PROTOCOLS:
        raise ValueError(f"data_transfer_protocol must be None (the fastest the worker offers), 'tcp' or 'grpc', "
                         f"got {data_transfer_protocol!r}")
    return data_transfer_protocol


def _num_splits(dataset: Dataset) -> int:
    """What the dispatcher hands out in distributed_epoch: the pipeline's split groups, each a run of
    consecutive splits a worker runs the pipeline over together (``Dataset.split_groups``; workers read
    the grouping back from this count). -1: without end; -2: not splittable."""
    try:
        return dataset.split_groups().num_groups
    except errors.NotSplittableError:
        return -2


#: The largest numeric id: the dispatcher's ids are int64.
MAX_NUMERIC_ID = 2 ** 63 - 1


def _check_dataset_name(dataset_id: str) -> str:
    """A dataset id chosen by the user, or ValueError naming what is wrong and the rule."""
    problem = dataset_name_problem(dataset_id)
    if problem is not None:
        numeric = dataset_id.isascii() and dataset_id.isdigit() and len(dataset_id) <= MAX_DATASET_NAME_CHARS
        hint = f" (from_dataset_id(..., dataset_id={dataset_id!r}) reads the dataset whose numeric id that is; " \
               f"choose a name with a letter in it, say {'ds-' + dataset_id[:40]!r})" if numeric else ""
        raise ValueError(f"dataset_id {shown_name(dataset_id)} {problem}{hint}: a dataset id you choose is "
                         f"{DATASET_NAME_RULE}")
    return dataset_id


def _numeric_id(dataset_id: str) -> Optional[int]:
    """The numeric id an all-digit str names (``str(register_dataset(...))``: tf.data service's ids are
    strings, and code ported from it passes them so), or None if ``dataset_id`` is not all digits.
    ValueError for digits that are not how a numeric id is written (0, a leading zero, beyond int64)."""
    if not (dataset_id.isascii() and dataset_id.isdigit()):
        return None
    if dataset_id.startswith("0") or len(dataset_id) > 19 or int(dataset_id) > MAX_NUMERIC_ID:
        raise ValueError(f"dataset_id {shown_name(dataset_id)} is all digits, so it names a numeric id, but no numeric "
                         f"id is written so: they are the positive int64s register_dataset returns, without "
                         f"leading zeros (str(dataset_id) of one is fine)")
    return int(dataset_id)


def _parse_dataset_id(dataset_id: Union[int, str]) -> Union[int, str]:
    """``from_dataset_id``'s ``dataset_id``: a numeric id from ``register_dataset`` (an int, a numpy integer,
    or the same number as a str), or an id chosen with ``register_dataset(..., dataset_id=...)``."""
    if isinstance(dataset_id, str):
        numeric = _numeric_id(dataset_id)
        return _check_dataset_name(dataset_id) if numeric is None else numeric
    if isinstance(dataset_id, np.integer):
        dataset_id = int(dataset_id)
    if not isinstance(dataset_id, int) or isinstance(dataset_id, bool) or not 0 < dataset_id <= MAX_NUMERIC_ID:
        raise ValueError(f"dataset_id must be a positive int returned by register_dataset, or a str: that number "
                         f"written out, or an id chosen with register_dataset(..., dataset_id=...), got {dataset_id!r}")
    return dataset_id


def register_dataset(service: str, dataset: Dataset, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                     auth_token: Optional[str] = None, tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
                     tls_key: Optional[str] = None, dataset_id: Optional[str] = None) -> Union[int, str]:
    """Registers ``dataset`` with the dispatcher at ``service``; returns its id.

    The same pipeline registered twice gets the same id. ``dataset_id`` chooses the id (a str: see
    ``request_checks.DATASET_NAME_RULE``), returned as given: it names this pipeline for the dispatcher's
    lifetime, so registering the same pipeline under it again is a no-op, and another pipeline under it
    raises ``errors.AlreadyExistsError``. Without it the dispatcher picks a numeric id (an int).
    ``auth_token`` is the cluster's token (None: DATASERVICE_AUTH_TOKEN, then the file named by
    DATASERVICE_AUTH_TOKEN_FILE); ``tls_ca``, ``tls_cert``, ``tls_key`` are ``distribute``'s.

    Example::

        >>> register_dataset(dispatcher.target, Dataset.range(10))
        1733400000000000
        >>> register_dataset(dispatcher.target, Dataset.range(10), dataset_id="range-10")
        'range-10'
    """
    address = _parse_service(service)
    _parse_timeout(timeout_ms)
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be a Dataset, got {type(dataset).__name__}")
    if dataset_id is not None:
        if not isinstance(dataset_id, str):
            raise ValueError(f"dataset_id must be a str (or None: the dispatcher picks a numeric id), got "
                             f"{dataset_id!r}")
        _check_dataset_name(dataset_id)
    auth = ClusterAuth.resolve(auth_token)
    tls = TlsSettings.resolve(tls_ca, tls_cert, tls_key)
    blob = serialize_dataset(dataset)
    client = DispatcherClient(address, timeout_ms=timeout_ms, auth=auth, tls=tls)
    try:
        numeric_id = client.register_dataset(blob, _num_splits(dataset), dataset_name=dataset_id or "")
        return numeric_id if dataset_id is None else dataset_id
    finally:
        client.close()


def _not_resumable(mode: int, options: ReadOptions) -> Optional[str]:
    """Why a read in ``mode`` with ``options`` cannot save its position (None: it can)."""
    if options.coordinated:
        return ("coordinated reads (num_consumers) hand out rounds that depend on which workers are in the rotation, "
                "so a restored read could not continue them; only processing_mode='distributed_epoch' reads resume "
                "exactly")
    if options.cross_trainer_cache is not None:
        return ("a read through the cross-trainer cache takes whatever the workers' windows hold, and a restored "
                "trainer could not find its place in them again; only processing_mode='distributed_epoch' reads "
                "resume exactly")
    if mode != state_pb2.DISTRIBUTED_EPOCH:
        return (f"a {mode_name(mode)} read cannot save its position: "
                + ("every worker produces the whole dataset in an order of its own, so a restored read could not "
                   "say which copies it had" if mode == state_pb2.PARALLEL_EPOCHS else
                   "a worker's shard is read from its start again by a restarted worker")
                + "; only processing_mode='distributed_epoch' reads resume exactly (deterministic=True for the same "
                  "order after the restore)")
    return None


class _Resume:
    """A restored read's start: the saved position, the repetition the saved read was in (-1 unknown), whether
    it had ended, (deterministic) its index in the sequence, and the split groups its position counts in
    (-1 unknown)."""

    __slots__ = ("position", "repetition", "ended", "index", "groups")

    def __init__(self, position: ReadPosition, repetition: int, ended: bool, index: Optional[int], groups: int = -1):
        self.position, self.repetition, self.ended, self.index = position, repetition, ended, index
        self.groups = groups

    def point(self) -> state_pb2.ResumePoint:
        point = self.position.to_resume()
        point.position = self.index or 0
        point.num_groups = max(0, self.groups)  # the dispatcher checks it against the registered dataset's
        return point

    def to_state(self) -> dict:
        return {"repetition": self.repetition, "ended": self.ended, **self.position.to_state(),
                "position": self.index if self.index is not None else -1, "groups": self.groups}


class _ServiceReadIterator(NodeIterator):
    """The iterator of a read from the service: one iteration of the job, started at the first ``next()``.
    ``save()`` is the consumer's position (``read_position.ReadPosition``: groups taken, offsets taken of
    the others), never elements: what the reader received and the consumer did not take is produced again
    after a restore. ``restore()`` makes the read a new job that starts there."""

    __slots__ = ("__next__", "_gen", "_node", "_reader", "_resume", "_repetition", "_ended", "__weakref__")

    def __init__(self, node: "_DataServiceDataset", ctx: IteratorContext):
        self._node = node
        self._reader = None
        self._resume: Optional[_Resume] = None
        self._repetition = -1
        self._ended = False
        self._gen = node._read(ctx, weakref.ref(self))  # runs nothing until the first next()
        self.__next__ = self._gen.__next__

    def _check(self) -> None:
        node = self._node
        reason = _not_resumable(node._mode, node._options())
        if reason is not None:
            raise NotCheckpointableError(f"{node._describe()} cannot be checkpointed: {reason}")

    def _groups(self) -> int:
        """The split groups of the pipeline read, when this process has it (``distribute``); else -1."""
        return max(-1, self._node._num_groups())

    def save(self) -> dict:
        self._check()
        reader = self._reader
        if reader is None:  # not started: where a restore put it, or the start
            resume = self._resume
            if resume is None:
                resume = _Resume(ReadPosition(), -1, False, 0 if self._node._options().deterministic else None,
                                 self._groups())
            return resume.to_state()
        return {"repetition": self._repetition, "ended": self._ended, **reader.position_state(),
                "groups": self._groups()}

    def restore(self, state: Any) -> None:
        self._check()
        where = "a read from the service (distribute, from_dataset_id)"
        repetition = field(state, "repetition", int, where, minimum=-1)
        ended = field(state, "ended", bool, where)
        index = field(state, "position", int, where, minimum=-1)
        if self._node._options().deterministic and index < 0:
            raise ValueError(f"malformed iterator state for {where}: 'position' (the index in the deterministic "
                             f"sequence) must be >= 0, got {index}")
        index = index if index >= 0 else None
        position = ReadPosition.from_state(state)
        saved = field(state, "groups", int, where, default=None, minimum=-1)
        self._resume = _Resume(position, repetition, ended, index, self._check_groups(saved))

    def _check_groups(self, saved: Optional[int]) -> int:
        """The groups a restored position counts in, checked against the pipeline's: a position names groups
        by index, so over other groups it would skip or repeat elements. ``saved`` None: a state from before
        the count was saved, whose groups were the sources' own split sizes (``unsized_num_groups``)."""
        groups = self._groups()
        describe = self._node._describe()
        if saved is None:
            if groups < 0:
                return -1  # from_dataset_id: the pipeline is not here; the position is taken as it is
            before = unsized_num_groups(self._node._dataset)
            if before != groups:
                raise ValueError(
                    f"cannot restore {describe}: its state was saved by an older dataservice, which cut this "
                    f"pipeline into {before} split group(s); this version cuts it into {groups} (splits are now "
                    f"sized from the pipeline's batches), so the saved position cannot be mapped onto them. "
                    f"Start this epoch of the read from its beginning (restore no state for it), or finish the "
                    f"epoch with the dataservice that saved it")
            return groups
        if saved >= 0 and groups >= 0 and saved != groups:
            raise ValueError(
                f"cannot restore {describe}: its state counts {saved} split group(s), and the pipeline read now "
                f"has {groups}: the state was saved from a read of another pipeline (or another dataset size or "
                f"batch size), and a position over other groups would skip or repeat elements")
        return saved if saved >= 0 else groups

    def close(self) -> None:
        self._gen.close()


class _DataServiceDataset(Dataset):
    """Reads a registered dataset from the service; each iteration is a new iteration of the job."""

    _op_name = "from_dataset_id"

    def __init__(self, processing_mode: ProcessingMode, service: str, dataset_id: Optional[int],
                 job_name: Optional[str], max_outstanding_requests: Optional[int], timeout_ms: int,
                 dataset: Optional[Dataset] = None, data_transfer_protocol: Optional[str] = None,
                 auth_token: Optional[str] = None, tls_files: tuple = (None, None, None),
                 element_spec: Any = None, read_options: Optional[ReadOptions] = None):
        #: from_dataset_id's element_spec, checked as a structure of TensorSpecs; None: learnt when asked.
        self._given_spec = None if element_spec is None else specs.as_structure(element_spec)
        self._auth = ClusterAuth.resolve(auth_token)
        #: (tls_ca, tls_cert, tls_key) as given: paths, not secrets, so a pickled copy keeps them.
        self._tls_files = tuple(tls_files)
        self._tls = TlsSettings.resolve(*self._tls_files)
        self._mode = _parse_mode(processing_mode)
        self._protocol = _parse_protocol(data_transfer_protocol)
        self._address = _parse_service(service)
        self._job_name = _parse_job_name(job_name)
        #: coordinated reads, cross-trainer cache, target_workers, compression (checked when made)
        self._read_options = read_options if read_options is not None else ReadOptions(job_name=self._job_name)
        self._max_outstanding = _parse_outstanding(max_outstanding_requests)
        self._timeout_ms = _parse_timeout(timeout_ms)
        self._dataset_id = dataset_id
        self._dataset = dataset
        if self._read_options.coordinated and is_static(self._mode):
            # A static worker's shard is fixed: a worker joining (or back) could not enter the rotation.
            raise ValueError(f"coordinated reads (consumer_index, num_consumers) do not go with static sharding "
                             f"({mode_name(self._mode)}): a worker joining or coming back could not enter the "
                             f"consumers' rotation at a common round. Use processing_mode='parallel_epochs' "
                             f"(ShardingPolicy.OFF) with coordinated reads")
        if self._read_options.deterministic and self._mode != state_pb2.DISTRIBUTED_EPOCH:
            raise ValueError(f"deterministic=True needs processing_mode='distributed_epoch' (ShardingPolicy.DYNAMIC), "
                             f"got {mode_name(self._mode)!r}: only there does the service hand out each element "
                             f"once, numbered by split group, which is the order a deterministic read gives")
        if dataset is not None and self._mode == state_pb2.DISTRIBUTED_EPOCH:
            dataset.num_splits()  # NotSplittableError now, naming the culprit, rather than at the dispatcher
        if dataset is not None and (self._read_options.coordinated or self._read_options.cross_trainer_cache) \
                and dataset.cardinality() >= 0:
            # Now, naming the fix; from_dataset_id learns it from the dispatcher, which checks it too. Only a
            # known end is refused, as in tf.data service: an unknown cardinality (flat_map, group_by_window,
            # filter over an infinite input) may well never end.
            what = "coordinated reads (num_consumers)" if self._read_options.coordinated else "cross_trainer_cache"
            raise ValueError(f"{what} need an infinite dataset (or one whose cardinality is unknown), and the "
                             f"pipeline has {dataset.cardinality()} elements: end it with .repeat() before distribute, "
                             f"so that no reader runs out of data while others still read")
        self._repetitions = itertools.count()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        # No secret travels in a pickle: a copy resolves the token again where it is loaded.
        del state["_lock"], state["_repetitions"], state["_auth"], state["_tls"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._repetitions = itertools.count()
        self._auth = ClusterAuth.resolve(None)
        self._tls_files = state.get("_tls_files", (None, None, None))
        self._tls = TlsSettings.resolve(*self._tls_files)  # the files as found where the copy is loaded

    def _describe(self) -> str:
        return f"distribute({mode_name(self._mode)}, {self._address})"

    def _inputs(self) -> tuple:
        return ()

    def _reads_from_service(self) -> bool:
        return True

    def _not_checkpointable_reason(self) -> str:
        return _not_resumable(self._mode, self._options()) or "it cannot save its position"

    def _options(self) -> ReadOptions:
        return getattr(self, "_read_options", None) or ReadOptions(job_name=self._job_name)

    def _checkpoint_identity(self) -> dict:
        """What a saved position is bound to (``checkpoint.pipeline_fingerprint``): the mode, the order and the
        pipeline read (the distributed pipeline itself, or the id given to from_dataset_id). Not the
        dispatcher's address, the job name, timeouts or credentials: a restored read may run on a cluster
        that moved, under a job name of its own."""
        given = self._dataset_id if self._dataset is None else None
        return {"mode": self._mode, "deterministic": self._options().deterministic, "dataset": self._dataset,
                "dataset_id": given}

    def _replays(self, ctx: IteratorContext) -> bool:
        """Read again from a saved position, a deterministic read gives the same elements in the same order;
        a dynamic one gives the rest of the epoch in another order (a read-ahead node after it saves what it
        holds instead of reading it again)."""
        return self._options().deterministic

    def _element_spec(self) -> Any:
        """The spec given to from_dataset_id; else the distributed pipeline's (distribute); else the one
        the dispatcher recorded at registration, read from the pipeline's proto without unpickling it."""
        given = getattr(self, "_given_spec", None)
        if given is not None:
            return given
        if self._dataset is not None:
            return self._dataset.element_spec
        specs.needs_element(f"{self._describe()} learns its element_spec from the dispatcher")
        return registered_element_spec(self._registered_definition(), f"dataset {self._dataset_id!r}")

    def _registered_definition(self) -> bytes:
        """The registered pipeline's serialized definition, from the dispatcher (not unpickled here)."""
        client = DispatcherClient(self._address, timeout_ms=self._timeout_ms, auth=self._auth, tls=self._tls)
        try:
            return client.get_dataset_def(self._registered_id(client))
        finally:
            client.close()

    def _check_given_spec(self, client: DispatcherClient, dataset_id: int) -> None:
        """from_dataset_id's ``element_spec`` against the spec recorded at registration, at the first read of
        each dataset the id resolves to: errors.InvalidArgumentError naming both when they are not compatible
        (``specs.is_compatible``, tf.data's ``is_compatible_with``). Nothing to compare with when the spec was
        not known at registration."""
        given = getattr(self, "_given_spec", None)
        if given is None or self.__dict__.get("_spec_checked_for") == dataset_id:
            return
        try:
            registered = registered_element_spec(client.get_dataset_def(dataset_id), f"dataset {dataset_id}")
        except ValueError:  # not recorded at registration: only the elements themselves will tell
            registered = None
        if registered is not None and not specs.is_compatible(given, registered):
            named = f"{self._dataset_id!r} ({dataset_id})" if isinstance(self._dataset_id, str) else f"{dataset_id}"
            raise errors.InvalidArgumentError(
                f"from_dataset_id(..., element_spec=...): the element_spec given, {given}, does not match the one "
                f"dataset {named} was registered with, {registered}. They must have the same structure and dtypes, "
                f"and shapes that agree wherever both are known (tf.data's is_compatible_with). Pass the "
                f"registered pipeline's element_spec, or element_spec=None to learn it from the dispatcher")
        self._spec_checked_for = dataset_id

    def cardinality(self) -> int:
        """As tf.data service: 0 when the registered pipeline is empty, infinite when it is infinite,
        otherwise unknown (how many elements a reader gets depends on the workers and other readers).
        ``from_dataset_id`` learns the registered pipeline's from the dispatcher, once."""
        if self._dataset is not None:
            n = self._dataset.cardinality()
        else:
            n = self.__dict__.get("_registered_cardinality")
            if n is None:
                n = self._registered_cardinality = registered_cardinality(self._registered_definition())
        return n if n in (0, INFINITE_CARDINALITY) else UNKNOWN_CARDINALITY

    def _split_source(self):
        raise errors.NotSplittableError(f"{self._describe()} is not splittable: it already reads from the service")

    def _num_groups(self) -> int:
        """The split groups of the pipeline ``distribute`` reads (``_num_splits``: registered with it, and
        recorded in a saved position), derived once; -1 for ``from_dataset_id``, which has no pipeline here."""
        if self._dataset is None:
            return -1
        n = self.__dict__.get("_split_group_count")
        if n is None:
            n = self._split_group_count = _num_splits(self._dataset)
        return n

    def _registered_id(self, client: DispatcherClient) -> int:
        """The dataset's numeric id, which every RPC takes (registering the pipeline first, for ``distribute``).
        ``_dataset_id`` may be a chosen id (a str): it is resolved on every call, not kept, so that a
        dispatcher restarted without fault tolerance, where the name was registered again, is read right."""
        with self._lock:
            if self._dataset_id is None:
                self._dataset_id = client.register_dataset(serialize_dataset(self._dataset), self._num_groups())
            if isinstance(self._dataset_id, str):
                return client.get_dataset_id(self._dataset_id)
            return self._dataset_id

    def _root_iterator(self, split_provider, split_hint=None) -> Iterator:
        it = super()._root_iterator(split_provider, split_hint)
        # The same object with stats() added: a second wrapper would be a second owner of the context,
        # and its __del__ would close the pipeline's pools under the first. (Same slots, no state added.)
        it.__class__ = DistributedIterator
        _recorder(it._ctx)
        return it

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        return _ServiceReadIterator(self, ctx)

    def _read(self, ctx: IteratorContext, holder: "weakref.ref[_ServiceReadIterator]") -> Iterator:
        """The elements of one iteration of the job, as the generator ``_ServiceReadIterator`` runs; it is
        told where to start (a restored position) and given the reader, through ``holder``."""
        started = time.monotonic()  # the consumer's next() that runs this waits from here (stats' stall)
        owner = holder()
        resume = owner._resume if owner is not None else None
        if resume is not None and resume.ended:
            return
        recorder = _recorder(ctx)
        client = DispatcherClient(self._address, timeout_ms=self._timeout_ms, auth=self._auth, tls=self._tls)
        reader = None
        try:
            dataset_id = self._registered_id(client)
            self._check_given_spec(client, dataset_id)
            options = self._options()
            # The job name is scoped by the id this reader names (as in tf.data service): a chosen id is sent
            # along, so that readers of two names of one pipeline under one job_name read two jobs.
            named = self._dataset_id if isinstance(self._dataset_id, str) else ""
            position = None
            if self._mode == state_pb2.DISTRIBUTED_EPOCH and not _not_resumable(self._mode, options):
                position = resume.position if resume is not None else ReadPosition()
            # A restored read is a job of its own, which starts where the saved position says; readers restoring
            # one position under one job_name share it (the dispatcher keys it by the position). Its later
            # iterations (a repeat() after distribute) are whole epochs of that job: the readers, restored as N'
            # of them, read on together.
            point = resume.point() if resume is not None else (
                self.__dict__.get("_resumed_point") if self._job_name else None)
            job_id = client.get_or_create_job(dataset_id, self._mode, self._job_name, dataset_name=named,
                                              resume=point, **options.job_fields())
            # A named job is shared: the k-th iteration of every reader is the same iteration. A restored read is
            # the first iteration of its job (the one the dispatcher starts at the saved position).
            if resume is not None:
                repetition = 0
                if self._job_name:
                    with self._lock:
                        self._resumed_point = point
                        self._repetitions = itertools.count(1)
            else:
                repetition = next(self._repetitions) if self._job_name else 0
            if repetition and options.cross_trainer_cache is not None:
                # As tf.data service: each trainer reads a cached job once; a second iteration would be a
                # new iteration of the job, with a cache of its own that other trainers do not share.
                raise ValueError(f"cross_trainer_cache: this distributed dataset is iterated a second time "
                                 f"(repetition {repetition}), but a trainer reads a cached job with one iterator: "
                                 f"the dataset is infinite, so keep reading the first one (take the steps of every "
                                 f"epoch from it), or read another job_name")
            # Coordinated reads: consumers read in rounds (coordinated_reader); else first come first served.
            reader_class = CoordinatedReader if options.coordinated else IterationReader
            extra = {} if options.coordinated else {"position": position,
                                                     "start_index": (resume.index or 0) if resume is not None else 0}
            reader = reader_class(client, job_id, repetition, self._max_outstanding, self._protocol,
                                  timeout_ms=self._timeout_ms, job_name=self._job_name, auth=self._auth,
                                  tls=self._tls, started_at=started, read_options=options, **extra)
            if owner is not None:
                owner._reader, owner._repetition = reader, (resume.repetition if resume is not None else repetition)
            owner = None  # the generator keeps no reference to its iterator: no cycle
            recorder.add(reader)
            forget = ctx.on_close(reader.close)
            try:
                yield from reader
                owner = holder()
                if owner is not None:  # read to its end (not closed early): a restore yields nothing
                    owner._ended = True
                owner = None
            finally:
                forget()
        finally:
            if reader is not None:
                reader.close()
                recorder.finished(reader)
            client.close()


def distribute(processing_mode: ProcessingMode, service: str, job_name: Optional[str] = None,
               max_outstanding_requests: Optional[int] = None,
               timeout_ms: int = DEFAULT_TIMEOUT_MS,
               data_transfer_protocol: Optional[str] = None,
               auth_token: Optional[str] = None, tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
               tls_key: Optional[str] = None, consumer_index: Optional[int] = None,
               num_consumers: Optional[int] = None, cross_trainer_cache: Optional[CrossTrainerCache] = None,
               target_workers: str = "AUTO", compression: Optional[str] = "AUTO",
               deterministic: bool = False, num_readers: Optional[int] = None,
               reader_index: Optional[int] = None) -> Callable[[Dataset], Dataset]:
    """A transformation for ``Dataset.apply`` that runs the pipeline so far on the service.

    Args:
      processing_mode: "parallel_epochs" (each worker produces the whole dataset) or
        "distributed_epoch" (the dispatcher splits the source; every element once),
        or ShardingPolicy.OFF / ShardingPolicy.DYNAMIC; or a static ShardingPolicy (FILE, DATA,
        FILE_OR_DATA, HINT: each worker of the dispatcher's ``worker_addresses`` produces its shard,
        and a reader with target_workers "ANY", or "AUTO" with no COLOCATED worker on its host, reads
        every shard).
      service: the dispatcher, "grpc://host:port" or "host:port".
      job_name: readers with the same name (and dataset id: a name is scoped by the id read, as in tf.data
        service) share one job, first come first served.
      max_outstanding_requests: the most elements requested or buffered at once
        (memory is about this many times the element size); default 1024.
      timeout_ms: how long to keep trying an unreachable dispatcher.
      data_transfer_protocol: None (default) for the fastest a worker offers: on this host, large
        arrays copied straight from its memory; else its TCP data-transfer server; else gRPC.
        "tcp" never reads a worker's memory; "grpc" always uses gRPC.
      auth_token: the cluster's token; None reads DATASERVICE_AUTH_TOKEN, then the file named by
        DATASERVICE_AUTH_TOKEN_FILE (so a training script needs no argument).
      tls_ca: PEM file of the CA that signed the cluster's certificates, for a cluster that speaks TLS
        (``dataservice.service.tls``); None reads DATASERVICE_TLS_CA; neither: plaintext.
      tls_cert: this client's certificate, for a cluster that requires one (mutual TLS); None reads
        DATASERVICE_TLS_CERT.
      tls_key: the key of ``tls_cert``; None reads DATASERVICE_TLS_KEY.
      consumer_index: coordinated reads: this reader's index among ``num_consumers``.
      num_consumers: coordinated reads: the ``num_consumers`` readers of the job ``job_name`` read in
        strict round-robin, all from the same worker at each step. Needs ``job_name`` and a dataset not
        known to end (``repeat()``; an unknown cardinality, as of a ``flat_map``, is accepted, as in
        tf.data service).
      cross_trainer_cache: ``CrossTrainerCache(trainer_id)``: trainers of the job ``job_name`` share
        its elements through a sliding-window cache on each worker; each trainer sees every element
        once. Needs a dataset not known to end, iterated once per trainer (a slow trainer skips ahead
        past what the window, ``WorkerConfig.cross_trainer_cache_size_bytes``, no longer holds).
      target_workers: "AUTO" (default), "ANY", or "LOCAL" (only workers running in this process, read
        without RPC or copy). Every reader of a job must pass the same.
      compression: "AUTO" (default: LZ4 from workers on other hosts when it makes answers arrive sooner
        on that connection, as measured: slow links and compressible elements; none on this host), None, or a codec ("LZ4", "ZSTD", "ZLIB", "GZIP"; any case) for every frame
        (``dataservice.service.frame_compression``).
      deterministic: distributed_epoch only. True: the elements come in one fixed order, the split groups'
        elements in group index order (for a source with map and filter, the order of the pipeline run
        locally), whatever the number of workers, their speed, a worker lost or the dispatcher restarted;
        workers still take groups dynamically and the reader puts them in order (a slow worker delays its
        own group's turn). False (default): each element as soon as any worker has it. Either way the
        iterator's ``state_dict()`` saves the read's position and ``load_state_dict()`` resumes it: the same
        sequence (deterministic) or every element not taken before exactly once (dynamic).
      reader_index: elastic readers: this reader's index among ``num_readers``.
      num_readers: elastic readers (data-parallel training, one reader per rank): with
        ``deterministic=True`` and a ``job_name``, reader ``reader_index`` of the job's ``num_readers`` gets the
        elements ``S[i], S[i+N], S[i+2N], ...`` of the deterministic sequence ``S``; a final partial round is
        dropped, so that every reader gets the same count (``DistributedSampler(drop_last=True)``). The
        workers compute each element once and send it to every reader, which keeps its own. States saved at
        one step by all readers name the same position; restoring one into ``N'`` readers (any ``N'``)
        continues with ``S[p + i'], S[p + i' + N'], ...``: every element once across the two runs.
    """
    mode = _parse_mode(processing_mode)
    options = ReadOptions(job_name=_parse_job_name(job_name) if job_name is not None else "",
                          consumer_index=consumer_index, num_consumers=num_consumers,
                          cross_trainer_cache=cross_trainer_cache, target_workers=target_workers,
                          compression=compression, deterministic=deterministic, num_readers=num_readers,
                          reader_index=reader_index)
    ClusterAuth.resolve(auth_token)  # a bad token (too short, unreadable file) fails here, not mid-read
    TlsSettings.resolve(tls_ca, tls_cert, tls_key)  # likewise an unreadable TLS file
    _parse_protocol(data_transfer_protocol)
    _parse_service(service)
    _parse_job_name(job_name)
    _parse_outstanding(max_outstanding_requests)
    _parse_timeout(timeout_ms)

    def apply(dataset: Dataset) -> Dataset:
        if not isinstance(dataset, Dataset):
            raise TypeError(f"distribute applies to a Dataset, got {type(dataset).__name__}")
        return _DataServiceDataset(mode_name(mode), service, None, job_name, max_outstanding_requests, timeout_ms,
                                   dataset=dataset, data_transfer_protocol=data_transfer_protocol,
                                   auth_token=auth_token, tls_files=(tls_ca, tls_cert, tls_key),
                                   read_options=options)

    return apply


def from_dataset_id(processing_mode: ProcessingMode, service: str, dataset_id: Union[int, str],
                    element_spec: Any = None,
                    job_name: Optional[str] = None, max_outstanding_requests: Optional[int] = None,
                    timeout_ms: int = DEFAULT_TIMEOUT_MS, data_transfer_protocol: Optional[str] = None,
                    auth_token: Optional[str] = None, tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
                    tls_key: Optional[str] = None, consumer_index: Optional[int] = None,
                    num_consumers: Optional[int] = None, cross_trainer_cache: Optional[CrossTrainerCache] = None,
                    target_workers: str = "AUTO", compression: Optional[str] = "AUTO",
                    deterministic: bool = False, num_readers: Optional[int] = None,
                    reader_index: Optional[int] = None) -> Dataset:
    """A Dataset reading the registered dataset ``dataset_id`` from the service: the int ``register_dataset``
    returned (or that number as a str, as tf.data service code passes ids: an all-digit str always names a
    numeric id), or the str chosen with ``register_dataset(..., dataset_id=...)`` (NotFoundError when reading if
    nothing is registered under it). ``job_name`` is scoped by the id named here: readers of two ids (even two
    names of one pipeline) under one job name read two jobs, as in tf.data service.

    ``element_spec`` (a structure of ``TensorSpec``, e.g. ``dataset.element_spec``) is what the
    dataset's ``element_spec`` returns, checked at the first read against the spec recorded at registration
    (``errors.InvalidArgumentError`` naming both when they are not compatible, by tf.data's
    ``is_compatible_with``); None learns it from the dispatcher when first asked (ValueError saying why when the
    pipeline's spec was not known without running it). Elements describe themselves on the wire either way.
    The other arguments are ``distribute``'s.

    Example::

        >>> ds = from_dataset_id("distributed_epoch", "grpc://localhost:5050", dataset_id, job_name="train")
        >>> ds = from_dataset_id("distributed_epoch", "grpc://localhost:5050", str(dataset_id), job_name="train")
    """
    dataset_id = _parse_dataset_id(dataset_id)
    options = ReadOptions(job_name=_parse_job_name(job_name), consumer_index=consumer_index,
                          num_consumers=num_consumers, cross_trainer_cache=cross_trainer_cache,
                          target_workers=target_workers, compression=compression, deterministic=deterministic,
                          num_readers=num_readers, reader_index=reader_index)
    return _DataServiceDataset(processing_mode, service, dataset_id, job_name, max_outstanding_requests, timeout_ms,
                               data_transfer_protocol=data_transfer_protocol, auth_token=auth_token,
                               tls_files=(tls_ca, tls_cert, tls_key), element_spec=element_spec,
                               read_options=options)
