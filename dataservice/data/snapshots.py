"""``dataservice.snapshot``: persist a pipeline's output once, read it on every later pass.

``ds.apply(snapshot(path))`` puts a snapshot node after ``ds``. The upstream pipeline's fingerprint
(a digest of its serialized form) picks a run directory under ``path``. The first pass runs the
upstream pipeline and writes each element to a shard while handing it on; when the pass completes,
the written attempt is committed by renaming its directory, atomically. Every later pass — in this
process or in another run — finds the committed snapshot and reads it instead of running the upstream
pipeline. A changed upstream pipeline has another fingerprint, so another snapshot.

A pass that stops early, raises, or whose process dies leaves no committed snapshot: its attempt
directory is removed (or, after a crash, swept by the next writer), and the next pass writes again.
Writers never share files: each writes its own attempt directory, holding an ``flock`` on the
attempt's lock file while it lives, and the first to finish wins the rename; a later finisher
discards its copy.

Layout (``<fp>``: the upstream fingerprint, 64 hex digits)::

    <path>/<fp>/snapshot/                      the committed snapshot (a renamed attempt)
    <path>/<fp>/snapshot/<metadata>            save_format.write_metadata: shards, chunks, counts, compression
    <path>/<fp>/snapshot/shard_00000003/chunk_00000000   elements of shard 3, in order
    <path>/<fp>/attempts/<host>-<pid>-<rand>/  an attempt being written
    <path>/<fp>/attempts/<host>-<pid>-<rand>.lock   flock'ed by its live writer

Example::

    >>> ds = Dataset.range(1000).map(expensive).apply(snapshot("/data/snap"))
    >>> list(ds)  # runs expensive() and writes /data/snap/<fp>/snapshot
    >>> list(ds)  # reads the snapshot; so does a later run building the same pipeline
"""

from __future__ import annotations

import collections
import hashlib
import os
import pickletools
from typing import Any, Callable, Iterator, Optional

import numpy as np

from dataservice import errors
from dataservice.data.attempts import Attempt, fsync_tree_dirs, sweep_stale_attempts
from dataservice.data.background import Pump
from dataservice.data.dataset import UNKNOWN_CARDINALITY, Dataset, IteratorContext
from dataservice.data.options import default_parallelism
from dataservice.data.transformations import _UnaryDataset, raise_user_error

__all__ = ["snapshot", "SnapshotDataset", "snapshot_fingerprint", "canonical_pickle_digest", "sweep_stale_attempts"]

#: The committed snapshot's directory name under the run directory.
COMMITTED_DIR = "snapshot"
#: Where attempts are written, under the run directory.
ATTEMPTS_DIR = "attempts"
#: Chunk files a writer keeps open at once. A ``shard_func`` with more distinct shards than this
#: commits the least recently written chunk and opens another for that shard when it comes back.
MAX_OPEN_CHUNKS = 128
#: Elements a shard's reading thread hands over at once, and batches it reads ahead (default reader).
READ_AHEAD_BATCH = 256
READ_AHEAD_BATCHES = 4
#: A batch ends at this many bytes of array data, even with fewer elements.
READ_AHEAD_BYTES = 1 << 20
#: What ``metadata["kind"]`` says, so that a directory of another format is refused by name.
METADATA_KIND = "dataservice.snapshot"


def _save_format():
    # Imported when used: the chunk format lives in its own module (shared with save/load).
    from dataservice.data import save_format

    return save_format


def snapshot(path: Any, compression: Optional[str] = "AUTO", reader_func: Optional[Callable[[Dataset], Dataset]] = None,
             shard_func: Optional[Callable[..., Any]] = None) -> Callable[[Dataset], Dataset]:
    """A transformation for ``Dataset.apply`` that persists the pipeline's output under ``path``
    on the first pass and reads it on every later one, as ``tf.data.experimental.snapshot``.

    ``compression``: ``"AUTO"`` (a fast codec), ``"GZIP"``, ``"ZLIB"`` or None; a snapshot is read
    with the compression recorded when it was written. ``shard_func`` maps an element (a tuple is
    unpacked into arguments) to a non-negative int, the shard it is written to; by default elements
    go round-robin to one shard per core. ``reader_func`` receives a Dataset of per-shard Datasets
    and returns the Dataset of elements; by default the shards are read in parallel, without
    shuffling (in the written order, for the default sharding).

    Example::

        >>> ds = Dataset.range(100).enumerate().apply(
        ...     snapshot("/tmp/snap", shard_func=lambda i, x: i % 4,
        ...              reader_func=lambda datasets: datasets.shuffle(4).interleave(
        ...                  lambda x: x, num_parallel_calls=AUTOTUNE)))
        >>> ds = ds.map(lambda i, x: x)
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"snapshot: path must be a str or os.PathLike directory, got {path!r}")
    path = os.fspath(path)
    if not path:
        raise ValueError("snapshot: path must not be empty")
    _save_format().resolve_compression(compression)  # ValueError naming the bad value, now rather than later
    if reader_func is not None and not callable(reader_func):
        raise TypeError(f"snapshot: reader_func must be callable or None, got {reader_func!r}")
    if shard_func is not None and not callable(shard_func):
        raise TypeError(f"snapshot: shard_func must be callable or None, got {shard_func!r}")

    def apply(dataset: Dataset) -> Dataset:
        return SnapshotDataset(dataset, path, compression, reader_func, shard_func)

    return apply


def snapshot_fingerprint(dataset: Dataset) -> str:
    """The fingerprint that names ``dataset``'s run directory: a sha256 of its serialized pipeline
    (``serialize_dataset``), less what describes the process rather than the pipeline (the
    versions of Python and libraries, the names of the modules loaded in the process). The same
    pipeline built again — in another run, with other modules loaded — has the same fingerprint.

    Example::

        >>> snapshot_fingerprint(Dataset.range(3)) == snapshot_fingerprint(Dataset.range(3))
        True
    """
    from dataservice.data.serialization import dataset_fingerprint, serialize_dataset
    from dataservice.proto import pipeline_pb2

    definition = pipeline_pb2.PipelineDef.FromString(serialize_dataset(dataset))
    # Kept: the pickled pipeline (in canonical form), its element_spec and cardinality. Left out:
    # shipped_modules lists every user module imported in the process (a notebook that imported one more
    # module would miss its snapshot), versions would drop every snapshot at each library upgrade, and
    # sources (whole files' text, for tracebacks) would change with a comment beside the code.
    definition.ClearField("versions")
    definition.ClearField("shipped_modules")
    definition.ClearField("sources")
    definition.pipeline = canonical_pickle_digest(definition.pipeline).encode()
    return dataset_fingerprint(definition.SerializeToString(deterministic=True))


#: Opcodes that push a str or bytes literal.
_LITERAL_OPS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINBYTES", "BINBYTES",
                          "BINBYTES8", "BYTEARRAY8", "STRING", "BINSTRING", "SHORT_BINSTRING"})
_PUT_OPS = frozenset({"MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"})
_GET_OPS = frozenset({"GET", "BINGET", "LONG_BINGET"})


def canonical_pickle_digest(data: bytes) -> str:
    """A sha256 of a pickle that does not depend on which equal strings were one object.

    Pickle writes a string once and refers back to it (a memo ``GET``) when the same *object* comes
    again, so equal values give other bytes when their identity differs: a module's ``__file__`` and
    its functions' ``co_filename`` are one object after a plain import and two under pytest's
    assertion rewriting, say. Here every reference to a memoized str or bytes is replaced by its value,
    the other memo references are renumbered, and frame boundaries are left out.

    Example::

        >>> a, b = "x" * 3, "".join(["x", "xx"])   # equal, two objects
        >>> canonical_pickle_digest(pickle.dumps([a, a])) == canonical_pickle_digest(pickle.dumps([a, b]))
        True
    """
    digest = hashlib.sha256()
    memo: dict = {}  # memo index -> (True, literal) or (False, renumbered index)
    objects = 0
    literal = None  # the literal the last opcode pushed, if it pushed one

    def emit(name: str, arg: Any) -> None:
        digest.update(name.encode())
        if isinstance(arg, (bytes, bytearray)):
            digest.update(b"b%d:" % len(arg) + bytes(arg))
        elif isinstance(arg, str):
            encoded = arg.encode("utf-8", "surrogatepass")
            digest.update(b"s%d:" % len(encoded) + encoded)
        elif arg is not None:
            digest.update(repr(arg).encode())
        digest.update(b"\n")

    for op, arg, _ in pickletools.genops(data):
        name = op.name
        if name in _PUT_OPS:
            index = len(memo) if name == "MEMOIZE" else arg
            if literal is not None:
                memo[index] = (True, literal)
            else:
                memo[index] = (False, objects)
                objects += 1
            continue
        if name in _GET_OPS:
            is_literal, value = memo[arg]
            if is_literal:
                emit("SHORT_BINUNICODE" if isinstance(value, str) else "SHORT_BINBYTES", value)
                literal = value
            else:
                emit("GET", value)
                literal = None
            continue
        if name == "FRAME":
            continue
        if name in _LITERAL_OPS:
            # One name per kind: the opcode chosen for a literal depends on its length only.
            emit("SHORT_BINUNICODE" if isinstance(arg, str) else "SHORT_BINBYTES", arg)
            literal = arg
            continue
        emit(name, arg)
        literal = None
    return digest.hexdigest()


def _identity(x: Any) -> Any:
    return x


class SnapshotDataset(_UnaryDataset):
    """The node ``snapshot()`` adds: writes its input's elements on the first pass, reads them after."""

    _op_name = "snapshot"

    def __init__(self, input_dataset: Dataset, path: str, compression: Optional[str],
                 reader_func: Optional[Callable], shard_func: Optional[Callable]):
        super().__init__(input_dataset)
        self._path = path
        self._compression = compression
        self._reader_func = reader_func
        self._shard_func = shard_func
        self._fingerprint: Optional[str] = None

    def __getstate__(self) -> dict:
        # The fingerprint is a cache of this process: the pipeline's bytes must not depend on whether
        # it was iterated.
        state = self.__dict__.copy()
        state["_fingerprint"] = None
        return state

    def _describe(self) -> str:
        return f"snapshot({self._path!r})"

    def cardinality(self) -> int:
        # A reader_func may return any number of elements; the default returns them all.
        return self._input.cardinality() if self._reader_func is None else UNKNOWN_CARDINALITY

    @property
    def run_directory(self) -> str:
        """``<path>/<fingerprint>``: where this pipeline's snapshot and attempts live."""
        if self._fingerprint is None:
            try:
                self._fingerprint = snapshot_fingerprint(self._input)
            except errors.PipelineSerializationError as exc:
                raise errors.PipelineSerializationError(
                    f"{self._describe()}: the snapshot is named by a fingerprint of the serialized upstream "
                    f"pipeline, which cannot be serialized: {exc}") from exc
        return os.path.join(self._path, self._fingerprint)

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        if ctx.split_provider is not None:
            # distributed_epoch runs the pipeline over a subset of its splits: what passes here is not the
            # whole output, so neither write it as a snapshot nor read a snapshot in its place.
            return self._input._iterator(ctx)
        return self._run(ctx)

    def _run(self, ctx: IteratorContext) -> Iterator:
        run_dir = self.run_directory
        committed = os.path.join(run_dir, COMMITTED_DIR)
        if os.path.isdir(committed):
            yield from self._read(committed, ctx)
        else:
            yield from self._write(run_dir, ctx)

    # --- reading ---------------------------------------------------------------------------
    def _read(self, committed: str, ctx: IteratorContext) -> Iterator:
        metadata = read_snapshot_metadata(committed)
        compression = metadata["compression"]
        shards = tuple(_ShardDataset(committed, shard["index"],
                                     [(c["file"], c["num_elements"]) for c in shard["chunks"]], compression)
                       for shard in metadata["shards"])
        datasets = _ShardsDataset(shards, committed)
        if self._reader_func is None:
            # Each shard is read ahead on a thread of its own, in batches (a parallel interleave hands over
            # one element at a time: ~70k elements/s for scalars, against millions this way); a
            # sequential interleave then takes them in turn. Round-robin shards (the default shard_func)
            # read round-robin come out in the written order.
            cycle = len(shards) if metadata["round_robin"] else default_parallelism()
            dataset = _ShardsDataset(tuple(_ReadAheadDataset(shard) for shard in shards), committed)
            dataset = dataset.interleave(_identity, cycle_length=max(1, cycle))
        else:
            try:
                dataset = self._reader_func(datasets)
            except Exception as exc:
                raise_user_error(exc, f"{self._describe()} reader_func")
            if not isinstance(dataset, Dataset):
                raise TypeError(f"{self._describe()}: reader_func must return a Dataset, got "
                                f"{type(dataset).__name__}")
        yield from dataset._iterator(ctx)

    # --- writing ---------------------------------------------------------------------------
    def _write(self, run_dir: str, ctx: IteratorContext) -> Iterator:
        save_format = _save_format()
        compression = save_format.resolve_compression(self._compression)
        attempts = os.path.join(run_dir, ATTEMPTS_DIR)
        os.makedirs(attempts, exist_ok=True)
        sweep_stale_attempts(attempts)
        attempt = Attempt(attempts)
        shard_func = self._shard_func
        num_shards = default_parallelism()
        where = f"{self._describe()} shard_func"
        open_chunks: collections.OrderedDict = collections.OrderedDict()  # shard -> ChunkWriter, LRU first
        chunks: dict[int, list] = {}  # shard -> [(file, num_elements)], in order
        count = 0
        try:
            for element in self._input._iterator(ctx):
                if shard_func is None:
                    shard = count % num_shards
                else:
                    try:
                        returned = shard_func(*element) if type(element) is tuple else shard_func(element)
                    except Exception as exc:
                        raise_user_error(exc, where)
                    shard = _save_format().shard_index(returned, where)
                writer = open_chunks.get(shard)
                if writer is None:
                    if len(open_chunks) >= MAX_OPEN_CHUNKS:
                        _, oldest = open_chunks.popitem(last=False)
                        oldest.commit()
                    files = chunks.setdefault(shard, [])
                    name = os.path.join(f"shard_{shard:08d}", f"chunk_{len(files):08d}")
                    os.makedirs(os.path.join(attempt.directory, os.path.dirname(name)), exist_ok=True)
                    writer = save_format.ChunkWriter(os.path.join(attempt.directory, name), compression)
                    files.append([name, writer])
                    open_chunks[shard] = writer
                else:
                    open_chunks.move_to_end(shard)
                writer.write(element)
                count += 1
                yield element
            while open_chunks:
                open_chunks.popitem(last=False)[1].commit()
            metadata = {
                "kind": METADATA_KIND,
                "format_version": save_format.FORMAT_VERSION,
                "fingerprint": os.path.basename(run_dir),
                "compression": compression,
                "num_elements": count,
                "round_robin": shard_func is None,
                "shards": [{"index": shard, "chunks": [{"file": name, "num_elements": w.num_elements}
                                                       for name, w in chunks[shard]]}
                           for shard in sorted(chunks)],
            }
            fsync_tree_dirs(attempt.directory)
            save_format.write_metadata(attempt.directory, metadata)
            attempt.commit(os.path.join(run_dir, COMMITTED_DIR))
        except BaseException:
            # Stopped early (GeneratorExit), an error upstream or in shard_func: nothing of this pass is kept.
            for writer in open_chunks.values():
                writer.abort()
            attempt.discard()
            raise


class _ShardDataset(Dataset):
    """One shard of a committed snapshot: its chunk files read in order."""

    _op_name = "snapshot shard"

    def __init__(self, directory: str, index: int, chunks: list, compression: Optional[str]):
        self._directory = directory
        self._index = index
        self._chunks = chunks
        self._compression = compression

    def _describe(self) -> str:
        return f"snapshot shard {self._index} of {self._directory!r}"

    def cardinality(self) -> int:
        return sum(n for _, n in self._chunks)

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        read_chunk = _save_format().read_chunk
        for name, _ in self._chunks:
            yield from read_chunk(os.path.join(self._directory, name), self._compression)


class _ReadAheadDataset(Dataset):
    """A shard read on a thread of its own, ``READ_AHEAD_BATCHES`` batches ahead, handed over in batches."""

    _op_name = "snapshot read-ahead"

    def __init__(self, shard: _ShardDataset):
        self._shard = shard

    def _inputs(self) -> tuple[Dataset, ...]:
        return (self._shard,)

    def _describe(self) -> str:
        return self._shard._describe()

    def cardinality(self) -> int:
        return self._shard.cardinality()

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        pump = Pump(_batched(self._shard._iterator(ctx), READ_AHEAD_BATCH), capacity=READ_AHEAD_BATCHES,
                    name="dataservice-snapshot-read")
        try:
            while True:
                batch = pump.get()
                if batch is Pump.END:
                    return
                yield from batch
        finally:
            pump.close()


def _batched(it: Iterator, size: int) -> Iterator[list]:
    """Lists of up to ``size`` elements or about ``READ_AHEAD_BYTES``: batches of large arrays stay small."""
    batch: list = []
    nbytes = 0
    for element in it:
        batch.append(element)
        nbytes += _nbytes(element)
        if len(batch) >= size or nbytes >= READ_AHEAD_BYTES:
            yield batch
            batch, nbytes = [], 0
    if batch:
        yield batch


def _nbytes(element: Any) -> int:
    if isinstance(element, (np.ndarray, np.generic)):
        return element.nbytes
    if isinstance(element, (bytes, str)):
        return len(element)
    if isinstance(element, (tuple, list)):
        return sum(_nbytes(x) for x in element)
    if isinstance(element, dict):
        return sum(_nbytes(x) for x in element.values())
    return 8


class _ShardsDataset(Dataset):
    """What ``reader_func`` receives: a Dataset whose elements are the per-shard Datasets."""

    _op_name = "snapshot shards"

    def __init__(self, shards: tuple, directory: str):
        self._shards = shards
        self._directory = directory

    def _describe(self) -> str:
        return f"snapshot shards of {self._directory!r}"

    def cardinality(self) -> int:
        return len(self._shards)

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        return iter(self._shards)


def read_snapshot_metadata(committed: str) -> dict:
    """The metadata of a committed snapshot directory; DataLossError naming it when unreadable or not ours."""
    save_format = _save_format()
    try:
        metadata = save_format.read_metadata(committed)
    except errors.DataLossError:
        raise
    except (OSError, ValueError) as exc:
        raise errors.DataLossError(f"snapshot {committed!r}: its metadata cannot be read ({type(exc).__name__}: "
                                   f"{exc}); delete the directory to write the snapshot again") from exc
    if not isinstance(metadata, dict) or metadata.get("kind") != METADATA_KIND:
        raise errors.DataLossError(f"snapshot {committed!r}: not a dataservice snapshot (metadata kind "
                                   f"{metadata.get('kind') if isinstance(metadata, dict) else metadata!r})")
    version = metadata.get("format_version")
    if not isinstance(version, int) or version > save_format.FORMAT_VERSION:
        raise errors.DataLossError(f"snapshot {committed!r} has format version {version!r}; this dataservice reads "
                                   f"versions up to {save_format.FORMAT_VERSION}: upgrade dataservice to read it")
    return metadata


