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
    <path>/<fp>/checkpoints/<host>-<pid>-<rand>/    hard links to the chunks an iterator state of that
                                                   writer refers to; removed when the snapshot is committed

An iterator's state (``it.state_dict()``) is its place in the reading pipeline, or, while writing, the
input's position and the chunks written so far (see ``_SnapshotIterator``): a writing pass restored in
another process writes on, and commits a snapshot holding every element.

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
import shutil
from typing import Any, Callable, Iterator, Optional

import numpy as np

from dataservice import errors
from dataservice.data.attempts import Attempt, fsync_tree_dirs, sweep_stale_attempts
from dataservice.data.background import Pump
from dataservice.data.checkpoint import ChunkIterator, NodeIterator, close_input, field, restore_input, save_input, \
    skip_elements
from dataservice.data.dataset import UNKNOWN_CARDINALITY, Dataset, IteratorContext
from dataservice.data.options import default_parallelism
from dataservice.data.transformations import _UnaryDataset, raise_user_error
from dataservice.data.transformations.common import STATE, elements_of

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
        return _SnapshotIterator(self, ctx)

    def _pass(self, cursor: "_SnapshotPass") -> Iterator:
        """One pass: reads the committed snapshot, or writes it while handing the input's elements on (or,
        restored, what ``restore`` set up). Which one is decided at the first element, as the snapshot may
        be committed by then."""
        committed = os.path.join(self.run_directory, COMMITTED_DIR)
        if cursor.mode is None:
            if os.path.isdir(committed):
                cursor.read(self, committed)
            else:
                cursor.mode = "write"
                cursor.input = self._input._iterator(cursor.ctx)
        elif cursor.mode == "write" and cursor.resume is not None and os.path.isdir(committed):
            cursor.mode = "input"  # committed since the restore (which kept the input's position): as below
        if cursor.mode == "read":
            yield from elements_of(cursor.reader)
        elif cursor.mode == "write":
            yield from self._write(self.run_directory, cursor)
        else:  # restored writing a snapshot that was committed meanwhile: the input's elements, unwritten
            yield from elements_of(cursor.input)
        cursor.done = True

    # --- reading ---------------------------------------------------------------------------
    def _read_dataset(self, committed: str) -> Dataset:
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
            return dataset.interleave(_identity, cycle_length=max(1, cycle))
        try:
            dataset = self._reader_func(datasets)
        except Exception as exc:
            raise_user_error(exc, f"{self._describe()} reader_func")
        if not isinstance(dataset, Dataset):
            raise TypeError(f"{self._describe()}: reader_func must return a Dataset, got {type(dataset).__name__}")
        return dataset

    # --- writing ---------------------------------------------------------------------------
    def _write(self, run_dir: str, cursor: "_SnapshotPass") -> Iterator:
        save_format = _save_format()
        attempts = os.path.join(run_dir, ATTEMPTS_DIR)
        os.makedirs(attempts, exist_ok=True)
        sweep_stale_attempts(attempts)
        attempt = cursor.attempt = Attempt(attempts)
        resume = cursor.resume
        if resume is None:
            compression = cursor.compression = save_format.resolve_compression(self._compression)
            num_shards = cursor.num_shards = default_parallelism()
        else:  # restored: the chunks written before the cut, from the state's checkpoint directory
            compression, num_shards = cursor.compression, cursor.num_shards
            try:
                _link_chunks(resume, attempt.directory, cursor.chunks)
            except BaseException:
                attempt.discard()
                raise
            cursor.resume = None
        shard_func = self._shard_func
        where = f"{self._describe()} shard_func"
        open_chunks = cursor.open_chunks  # shard -> ChunkWriter, LRU first
        chunks = cursor.chunks  # shard -> [[file, ChunkWriter or _Written]], in order
        count = cursor.count
        try:
            for element in elements_of(cursor.input):
                if shard_func is None:
                    shard = count % num_shards
                else:
                    try:
                        returned = shard_func(*element) if type(element) is tuple else shard_func(element)
                    except Exception as exc:
                        raise_user_error(exc, where)
                    shard = save_format.shard_index(returned, where)
                writer = open_chunks.get(shard)
                if writer is None:
                    if len(open_chunks) >= MAX_OPEN_CHUNKS:
                        _, oldest = open_chunks.popitem(last=False)
                        oldest.commit()
                    files = chunks.setdefault(shard, [])
                    name = _chunk_name(shard, len(files))
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
            # Committed: every state of a writing pass now restores to reading its input on (the snapshot is
            # there), so the chunks kept for them are of no use.
            shutil.rmtree(os.path.join(run_dir, CHECKPOINTS_DIR), ignore_errors=True)
        except BaseException:
            # Stopped early (GeneratorExit), an error upstream or in shard_func: nothing of this pass is kept
            # (but the chunks a state refers to, under CHECKPOINTS_DIR).
            for writer in open_chunks.values():
                writer.abort()
            attempt.discard()
            raise


#: Where a writing pass's state keeps the chunks written before it was taken (hard links), under the run
#: directory: attempts are swept when their writer dies, these stay until the snapshot is committed.
CHECKPOINTS_DIR = "checkpoints"


class _Written:
    """A chunk written before a restored writing pass's state: its element count."""

    __slots__ = ("num_elements",)

    def __init__(self, num_elements: int):
        self.num_elements = num_elements


def _chunk_name(shard: int, index: int) -> str:
    return os.path.join(f"shard_{shard:08d}", f"chunk_{index:08d}")


def _link(source: str, target: str) -> None:
    """``target`` as a hard link to ``source`` (a copy where the filesystem has no hard links)."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    try:
        os.link(source, target)
    except FileExistsError:
        pass
    except OSError:
        shutil.copyfile(source, target)


def _link_chunks(source: str, directory: str, chunks: dict) -> None:
    """Links the chunks ``chunks`` lists (shard -> [[name, _Written]]) from ``source`` into ``directory``."""
    for shard in chunks:
        for name, _ in chunks[shard]:
            _link(os.path.join(source, name), os.path.join(directory, name))


class _SnapshotPass:
    """One pass of a snapshot node: ``mode`` None (not decided yet), "read" (``reader``, the iterator of
    ``reader_dataset`` over the committed snapshot), "write" (the ``input``'s elements written into
    ``attempt``: ``chunks`` per shard, ``open_chunks``, ``count`` elements before it (restored), ``num_shards``
    for round-robin,
    ``compression``; ``resume``, a restored state's checkpoint directory to start from) or "input" (a
    restored writing pass whose snapshot was committed meanwhile: the input's elements, unwritten)."""

    __slots__ = ("ctx", "mode", "reader", "reader_dataset", "input", "attempt", "chunks", "open_chunks", "count",
                 "num_shards", "compression", "resume", "linked", "done")

    def __init__(self, ctx: IteratorContext):
        self.ctx = ctx
        self.mode: Optional[str] = None
        self.reader: Optional[Iterator] = None
        self.reader_dataset: Optional[Dataset] = None
        self.input: Optional[Iterator] = None
        self.attempt: Optional[Attempt] = None
        self.chunks: dict = {}
        self.open_chunks: collections.OrderedDict = collections.OrderedDict()
        self.count = 0
        self.num_shards = 0
        self.compression: Optional[str] = None
        self.resume: Optional[str] = None
        self.linked: set = set()  # chunks already linked into this writer's checkpoint directory
        self.done = False

    def read(self, node: "SnapshotDataset", committed: str) -> None:
        self.mode = "read"
        self.reader_dataset = node._read_dataset(committed)
        self.reader = self.reader_dataset._iterator(self.ctx)


class _SnapshotIterator(NodeIterator):
    """The iterator of a snapshot node. Its state:

    - reading the committed snapshot: ``{"mode": "read", "reader": <state of the reading pipeline>}``,
      the default reader's (an interleave of the shards, each read ahead on a thread) or ``reader_func``'s
      dataset's, built again on restore. A shard's position is its chunk, the byte offset of the record
      being read and the elements of it taken: a restore seeks to the record and decodes it alone again.
    - writing it (the first pass): the input's position, the elements written so far, how they are
      sharded, and the chunks that hold them. Taking the state commits the chunks being written (a later
      element goes to a new chunk of its shard) and hard-links them under ``<run>/checkpoints/<attempt>``
      (attempts are swept when their writer dies; these stay until the snapshot is committed): a restore,
      in a new process, links them into an attempt of its own and writes on, so the snapshot it commits
      holds every element, each in its shard, in order. If the snapshot was committed meanwhile, the
      restored pass hands the input's elements on without writing (as the first writer's pass would).
      The state grows with the number of chunks (shards, and one more per shard at each state taken).

    Example::

        >>> it = iter(Dataset.range(10).apply(snapshot("/tmp/s")))   # first pass: writes
        >>> _ = next(it); it.state_dict()["position"]["mode"]
        'write'
    """

    __slots__ = ("__next__", "_node", "_pass", "_elements", "_restored")

    def __init__(self, node: SnapshotDataset, ctx: IteratorContext):
        self._node = node
        self._pass = _SnapshotPass(ctx)
        self._restored: Optional[dict] = None
        # The generator refers to the cursor, not to this object: no cycle.
        self._elements = node._pass(self._pass)
        self.__next__ = self._elements.__next__

    def save(self) -> dict:
        node, cursor = self._node, self._pass
        if cursor.mode is None:
            return {"mode": "start"}
        if cursor.mode == "read":
            return {"mode": "read", "reader": save_input(cursor.reader, cursor.reader_dataset)}
        position = save_input(cursor.input, node._input)
        if cursor.mode == "input" or cursor.done:
            return {"mode": "input", "input": position}
        if cursor.attempt is None:  # restored, or nothing read: where it starts
            if self._restored is not None:
                return self._restored
            return {"mode": "write", "input": position, "count": 0, "num_shards": 0, "compression": None,
                    "checkpoint": None, "shards": []}
        return self._save_written(position)

    def _save_written(self, position: Any) -> dict:
        """Commits the chunks being written and links every chunk into this writer's checkpoint directory."""
        cursor = self._pass
        while cursor.open_chunks:
            cursor.open_chunks.popitem(last=False)[1].commit()
        name = os.path.basename(cursor.attempt.directory)
        keep = os.path.join(self._node.run_directory, CHECKPOINTS_DIR, name)
        for shard in cursor.chunks:
            for chunk, _ in cursor.chunks[shard]:
                if chunk not in cursor.linked:
                    _link(os.path.join(cursor.attempt.directory, chunk), os.path.join(keep, chunk))
                    cursor.linked.add(chunk)
        fsync_tree_dirs(keep)
        count = sum(w.num_elements for files in cursor.chunks.values() for _, w in files)
        return {"mode": "write", "input": position, "count": count, "num_shards": cursor.num_shards,
                "compression": cursor.compression, "checkpoint": name,
                "shards": [[shard, [w.num_elements for _, w in cursor.chunks[shard]]]
                           for shard in sorted(cursor.chunks)]}

    def restore(self, state: Any) -> None:
        node, cursor = self._node, self._pass
        where = node._describe()
        mode = field(state, "mode", str, where)
        if mode == "start":
            return
        committed = os.path.join(node.run_directory, COMMITTED_DIR)
        if mode == "read":
            reader = field(state, "reader", STATE, where)
            if not os.path.isdir(committed):
                raise ValueError(f"the iterator state does not fit {where}: it was taken reading the committed "
                                 f"snapshot {committed!r}, which is gone")
            cursor.read(node, committed)
            restore_input(cursor.reader, cursor.reader_dataset, reader)
            return
        if mode not in ("write", "input"):
            raise ValueError(f"malformed iterator state for {where}: 'mode' must be 'start', 'read', 'write' or "
                             f"'input', got {mode!r}")
        position = field(state, "input", STATE, where)
        cursor.input = node._input._iterator(cursor.ctx)
        restore_input(cursor.input, node._input, position)
        if mode == "input" or os.path.isdir(committed):
            cursor.mode = "input"
            return
        count = field(state, "count", int, where)
        num_shards = field(state, "num_shards", int, where)
        compression = field(state, "compression", (str, type(None)), where)
        checkpoint = field(state, "checkpoint", (str, type(None)), where)
        shards = field(state, "shards", list, where)
        chunks: dict = {}
        for entry in shards:
            if (not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[0], int)
                    or not isinstance(entry[1], list) or not all(isinstance(n, int) for n in entry[1])):
                raise ValueError(f"malformed iterator state for {where}: each of 'shards' must be [shard, [chunk "
                                 f"sizes]], got {entry!r}")
            chunks[entry[0]] = [[_chunk_name(entry[0], i), _Written(n)] for i, n in enumerate(entry[1])]
        if sum(w.num_elements for files in chunks.values() for _, w in files) != count:
            raise ValueError(f"malformed iterator state for {where}: its chunks do not hold its {count} elements")
        cursor.mode = "write"
        self._restored = state
        if checkpoint is None:  # nothing was written: the pass starts over (from the input's position)
            if count:
                raise ValueError(f"malformed iterator state for {where}: {count} elements written, but no "
                                 "checkpoint directory")
            return
        if os.sep in checkpoint or checkpoint in ("", ".", ".."):
            raise ValueError(f"malformed iterator state for {where}: checkpoint {checkpoint!r} is not a name")
        if num_shards < 1:
            raise ValueError(f"malformed iterator state for {where}: 'num_shards' must be >= 1, got {num_shards}")
        source = os.path.join(node.run_directory, CHECKPOINTS_DIR, checkpoint)
        missing = [name for files in chunks.values() for name, _ in files
                   if not os.path.isfile(os.path.join(source, name))]
        if missing:
            raise ValueError(f"the iterator state does not fit {where}: the snapshot was being written, and the "
                             f"chunks written before the state was taken are gone from {source!r} (e.g. "
                             f"{missing[0]!r}); a pass from the start writes the snapshot again")
        if compression is not None:
            _save_format().resolve_compression(compression)
        cursor.chunks, cursor.count, cursor.num_shards, cursor.compression = chunks, count, num_shards, compression
        cursor.resume = source

    def close(self) -> None:
        close_input(self._elements)
        close_input(self._pass.reader)
        close_input(self._pass.input)


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
        # A saved dataset's shard reader (the same chunk format): its position is the chunk, the byte offset
        # of the record being read and the elements of it taken; a restore seeks to the record.
        from dataservice.data.saved import _ShardReader

        return _ShardReader([os.path.join(self._directory, name) for name, _ in self._chunks], self._compression,
                            self._describe())


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
        return _ReadAheadIterator(self, self._shard._iterator(ctx))

    def _elements(self, shard_iterator: Iterator, cursor: "_ReadAheadCursor") -> Iterator:
        pump = Pump(_batched(shard_iterator, READ_AHEAD_BATCH), capacity=READ_AHEAD_BATCHES,
                    name="dataservice-snapshot-read")
        cursor.started = True
        try:
            while True:
                batch = pump.get()
                if batch is Pump.END:
                    return
                position, elements = batch
                items = iter(elements)
                cursor.position, cursor.count, cursor.items = position, len(elements), items
                yield from items
        finally:
            pump.close()


class _ReadAheadCursor:
    __slots__ = ("position", "count", "items", "started")

    def __init__(self) -> None:
        self.position: Any = None  # the shard's position before the batch being handed over
        self.count = 0             # that batch's elements
        self.items: Optional[Iterator] = None
        self.started = False       # the reading thread was started


class _ReadAheadIterator(NodeIterator):
    """A shard read ahead: its position is the shard's before the batch being handed over (recorded by the
    reading thread, once a batch) and how many of the batch were taken: ``{"at": ..., "skip": n}``; a
    restore reads again at most a batch (``READ_AHEAD_BATCH`` elements)."""

    __slots__ = ("__next__", "_dataset", "_shard", "_cursor", "_elements")

    def __init__(self, dataset: _ReadAheadDataset, shard_iterator: Iterator):
        self._dataset = dataset
        self._shard = shard_iterator
        self._cursor = _ReadAheadCursor()
        self._elements = dataset._elements(shard_iterator, self._cursor)
        self.__next__ = self._elements.__next__

    def save(self) -> dict:
        cursor = self._cursor
        if cursor.items is None:
            # Nothing handed over: the thread has not started, or it has ended (then the shard is read).
            return {"at": self._shard.save(), "skip": 0}
        reduced = cursor.items.__reduce__()
        return {"at": cursor.position, "skip": reduced[2] if len(reduced) > 2 else cursor.count}

    def restore(self, state: Any) -> None:
        where = self._dataset._describe()
        at = field(state, "at", STATE, where)
        skip = field(state, "skip", int, where)
        self._shard.restore(at)
        skip_elements(self._shard, skip, where)

    def close(self) -> None:
        close_input(self._elements)  # stops the reading thread, which closes the shard's iterator
        if not self._cursor.started:
            close_input(self._shard)


def _batched(it: Iterator, size: int) -> Iterator[tuple[Any, list]]:
    """Lists of up to ``size`` elements or about ``READ_AHEAD_BYTES`` (batches of large arrays stay small),
    each with the shard's position before it (on the reading thread, which alone reads the shard)."""
    batch: list = []
    nbytes = 0
    try:
        position = it.save()
        for element in elements_of(it):
            batch.append(element)
            nbytes += _nbytes(element)
            if len(batch) >= size or nbytes >= READ_AHEAD_BYTES:
                yield position, batch
                position = it.save()
                batch, nbytes = [], 0
        if batch:
            yield position, batch
    finally:
        close_input(it)


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
        shards = list(self._shards)
        return ChunkIterator(lambda k: shards, 1, self._describe())


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


