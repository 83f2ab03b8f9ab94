"""``Dataset.save`` and ``Dataset.load``: a dataset's elements written to a directory, read back
without the pipeline that made them (tf.data's ``save`` / ``load``).

``save`` runs the pipeline once and writes its elements into chunk files (the format is in
``dataservice.data.save_format``), each shard's chunks written by a thread of its own; the
metadata file, written last and atomically, makes the save complete. Chunk files carry a run id
in their names, so saving again into the same directory never touches the chunks the previous
metadata lists: until the new save commits, ``load`` reads the previous one, whole, and a save
that fails or is killed midway leaves no metadata naming its chunks. After its commit a save
removes the files earlier saves left in the directory.

``load`` reads the metadata (element structure, cardinality, compression) and returns a
splittable source, one split per chunk, so a loaded dataset runs in ``distributed_epoch``; the
workers need the directory at the same path (a shared file system).

A loaded dataset's iterator saves its position (``state_dict``) as each shard's chunk file, the byte
offset of a record in it and the elements of that record already taken: restoring seeks to the record
and decodes it alone again.

Example::

    >>> Dataset.range(5).map(lambda x: x * 2).save("/tmp/saved", compression="GZIP")
    >>> ds = Dataset.load("/tmp/saved")
    >>> ds.cardinality(), ds.element_spec, [int(x) for x in ds]
    (5, TensorSpec(shape=(), dtype=int64, name=None), [0, 2, 4, 6, 8])
"""

from __future__ import annotations

import itertools
import os
import queue
import re
import threading
import time
import uuid
from typing import Any, Callable, Iterator, Optional

import numpy as np

from dataservice import errors
from dataservice.data import save_format, structure
from dataservice.data.checkpoint import NodeIterator, field
from dataservice.data.dataset import INFINITE_CARDINALITY, Dataset, _function_name
from dataservice.data.options import default_parallelism
from dataservice.data.sources import SplittableSource
from dataservice.service.wire import unencodable_error

__all__ = ["save", "load", "SavedDataset", "ShardDatasets", "GrowingSave", "CHUNK_BYTES", "DEFAULT_MAX_SHARDS"]

#: A shard starts a new chunk file once its current one holds this many bytes: chunks are the
#: splits of ``distributed_epoch``, so not too large, and each costs an fsync, so not too small.
CHUNK_BYTES = 64 << 20
#: Without ``shard_func``, elements go round robin to this many shards (fewer on fewer cores).
DEFAULT_MAX_SHARDS = 4
#: Elements handed to a shard's writer thread at a time (fewer when they are large) ...
_BATCH_ELEMENTS = 1024
#: ... or this many bytes of arrays.
_BATCH_BYTES = 4 << 20
#: Batches waiting per writer thread: bounds the memory a slow disk makes the pipeline hold.
_QUEUE_BATCHES = 2
_CHUNK_NAME = re.compile(r"^chunk-([0-9a-f]{12})-(\d+)-(\d+)\.tfrecord(\.tmp-.*)?$")


def _chunk_name(run: str, shard: int, seq: int) -> str:
    return f"chunk-{run}-{shard:05d}-{seq:05d}.tfrecord"


def _nbytes(element: Any) -> int:
    if isinstance(element, np.ndarray):
        return element.nbytes
    if isinstance(element, tuple):
        return sum(_nbytes(e) for e in element)
    if isinstance(element, dict):
        return sum(_nbytes(e) for e in element.values())
    return 0


class _ShardWriters:
    """One writer thread's shards: each a sequence of chunk files, rolled over at CHUNK_BYTES."""

    def __init__(self, directory: str, run: str, codec: Optional[str]):
        self.directory = directory
        self.run = run
        self.codec = codec
        self.open: dict[int, save_format.ChunkWriter] = {}
        self.next_seq: dict[int, int] = {}
        self.committed: list[dict] = []
        self.queue: queue.Queue = queue.Queue(maxsize=_QUEUE_BATCHES)
        self.error: Optional[BaseException] = None

    def write(self, shard: int, elements: list) -> None:
        writer = self.open.get(shard)
        for element in elements:
            if writer is None:
                seq = self.next_seq.get(shard, 0)
                self.next_seq[shard] = seq + 1
                path = os.path.join(self.directory, _chunk_name(self.run, shard, seq))
                writer = self.open[shard] = save_format.ChunkWriter(path, self.codec)
            writer.write(element)
            if writer.bytes_written >= CHUNK_BYTES:
                self._commit(shard)
                writer = None

    def _commit(self, shard: int) -> None:
        writer = self.open.pop(shard)
        writer.commit()
        self.committed.append({"file": os.path.basename(writer.path), "shard": shard,
                               "num_elements": writer.num_elements, "bytes": writer.bytes_written})

    def commit_all(self) -> None:
        for shard in list(self.open):
            self._commit(shard)

    def abort_all(self) -> None:
        for writer in self.open.values():
            writer.abort()
        self.open.clear()

    def run_thread(self) -> None:
        try:
            while True:
                item = self.queue.get()
                if item is None:
                    if self.error is None:
                        self.commit_all()
                    else:  # the saving thread stopped: nothing of this run is committed any more
                        self.abort_all()
                    return
                if self.error is None:
                    self.write(*item)
        except BaseException as exc:  # handed to the saving thread, which raises it
            self.error = exc
            self.abort_all()
            # Keep draining, so the saving thread never blocks on a full queue.
            while self.queue.get() is not None:
                pass


def _shard_of(shard_func: Callable, element: Any) -> int:
    from dataservice.data.transformations import raise_user_error

    where = f"save(shard_func={_function_name(shard_func)})"
    try:
        shard = shard_func(*element) if type(element) is tuple else shard_func(element)
    except Exception as exc:
        raise_user_error(exc, where)
    return save_format.shard_index(shard, where)


def save(dataset: Dataset, path: Any, compression: Optional[str] = None,
         shard_func: Optional[Callable[..., int]] = None) -> None:
    """Runs ``dataset`` once and writes its elements under the directory ``path`` (created if need
    be), as tf.data's ``Dataset.save``.

    ``compression``: None, "AUTO" (LZ4), "GZIP", "ZLIB", "LZ4" or "ZSTD". ``shard_func(element)``
    (a tuple element is unpacked into its arguments) returns the shard index, an int >= 0, of each
    element; each shard is a sequence of chunk files. Without it, elements go round robin to a few
    shards (up to ``DEFAULT_MAX_SHARDS``, one per core), written in parallel, and ``load`` gives them
    back in their order. The save is atomic: complete when this returns, absent if it raises.

    Example::

        >>> Dataset.range(100).enumerate().save("/tmp/s", shard_func=lambda i, x: i % 2)
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"save expects a Dataset, got {type(dataset).__name__}")
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"path must be a str path, got {path!r}")
    if shard_func is not None and not callable(shard_func):
        raise TypeError(f"shard_func must be callable, got {shard_func!r}")
    directory = os.path.abspath(os.fsdecode(path))
    codec = save_format.resolve_compression(compression)
    if dataset.cardinality() == INFINITE_CARDINALITY:
        raise ValueError(f"save: {dataset._describe()} is infinite; take() a finite part to save it")
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise NotADirectoryError(20, "save: path exists and is not a directory", directory)
    os.makedirs(directory, exist_ok=True)

    from dataservice.data import specs

    spec, _ = specs.static_element_spec(dataset)
    run = uuid.uuid4().hex[:12]
    num_threads = max(1, min(DEFAULT_MAX_SHARDS, default_parallelism()))
    round_robin = shard_func is None
    threads_shards = [_ShardWriters(directory, run, codec) for _ in range(num_threads)]
    threads = [threading.Thread(target=w.run_thread, name=f"dataservice-save-{i}", daemon=True)
               for i, w in enumerate(threads_shards)]
    for t in threads:
        t.start()
    pending: dict[int, list] = {}
    pending_bytes: dict[int, int] = {}
    total_bytes = 0  # of all pending batches: many shards must not hold many batches' arrays
    num_elements = 0
    first = None
    ok = False

    def hand_over(shard: int) -> int:
        owner = threads_shards[shard % num_threads]
        if owner.error is not None:
            raise owner.error
        owner.queue.put((shard, pending.pop(shard)))
        return pending_bytes.pop(shard, 0)

    try:
        for element in dataset:
            if num_elements == 0:
                first = element
            shard = num_elements % num_threads if round_robin else _shard_of(shard_func, element)
            num_elements += 1
            batch = pending.get(shard)
            if batch is None:
                batch = pending[shard] = []
            batch.append(element)
            size = _nbytes(element)
            if size:
                pending_bytes[shard] = pending_bytes.get(shard, 0) + size
                total_bytes += size
            if len(batch) >= _BATCH_ELEMENTS or pending_bytes.get(shard, 0) >= _BATCH_BYTES:
                total_bytes -= hand_over(shard)
            elif total_bytes >= _BATCH_BYTES * num_threads:
                for other in list(pending):
                    hand_over(other)
                total_bytes = 0
        for shard in list(pending):
            hand_over(shard)
        ok = True
    finally:
        for w in threads_shards:
            if not ok and w.error is None:
                w.error = RuntimeError("save stopped")  # the writers abort instead of committing
            w.queue.put(None)
        for t in threads:
            t.join()
    failures = [w.error for w in threads_shards if w.error is not None]
    if failures:
        if isinstance(failures[0], errors.ElementSerializationError) and not failures[0].where:
            failure = failures[0]  # a writer thread knows the element, the pipeline knows who made it
            raise unencodable_error(failure.path, failure.component_type, failure.reason,
                                    where=dataset._producer()._describe()) from failure
        raise failures[0]

    if spec is None:
        # Not known without an element: the first one tells, as element_spec would have (relaxed).
        spec = specs.relaxed(specs.spec_from_value(first)) if num_elements else None
    chunks = sorted((c for w in threads_shards for c in w.committed),
                    key=lambda c: (c["shard"], int(_CHUNK_NAME.match(c["file"]).group(3))))
    shards = sorted({c["shard"] for c in chunks})
    save_format.write_metadata(directory, {
        "element_spec": spec,
        "compression": codec,
        "cardinality": num_elements,
        "num_elements": num_elements,
        "num_shards": len(shards),
        "shards": shards,
        "sharding": "round_robin" if round_robin else "shard_func",
        "run": run,
        "chunks": chunks,
        "pipeline": dataset._describe(),
    })
    _remove_stale_files(directory, run)


def _remove_stale_files(directory: str, run: str) -> None:
    """Removes the chunk files (committed or not) of earlier saves into ``directory``."""
    for name in os.listdir(directory):
        match = _CHUNK_NAME.match(name)
        if match and match.group(1) != run:
            try:
                os.unlink(os.path.join(directory, name))
            except FileNotFoundError:
                pass


# --- load ------------------------------------------------------------------------------------------

def _complete_metadata(directory: str) -> dict:
    """The metadata of the complete save in ``directory``; a clear error when there is none.

    Where ``load(path, wait=True)`` (reading a ``distributed_save`` while it is written) hooks in: it
    will wait here for the save's DONE marker, and read committed chunks as they appear, instead of
    refusing a directory whose metadata is missing.
    """
    error = _save_error(directory)
    if error is not None:
        raise errors.PipelineError(f"load: the distributed_save into {directory} failed: {error}")
    if not os.path.exists(os.path.join(directory, save_format.METADATA_FILE)) and \
            os.path.exists(os.path.join(directory, _SAVE_FILE)):
        raise FileNotFoundError(2, "load: the distributed_save into this directory is not done yet: pass wait=True "
                                   "to read its chunks as they are written", directory)
    metadata = save_format.read_metadata(directory)
    for key in ("chunks", "num_elements", "compression"):
        if key not in metadata:
            raise ValueError(f"{os.path.join(directory, save_format.METADATA_FILE)} has no {key!r}: "
                             "it is not the metadata of a Dataset.save")
    for chunk in metadata["chunks"]:
        if not os.path.exists(os.path.join(directory, chunk["file"])):
            raise FileNotFoundError(2, "load: a chunk file the metadata lists is missing (was the save "
                                       "directory changed after the save?)", os.path.join(directory, chunk["file"]))
    return metadata


def _check_compression(directory: str, saved: Optional[str], asked: Optional[str]) -> None:
    if asked is None:
        return  # read as written: the metadata says how
    codec = save_format.resolve_compression(asked)
    if codec != saved:
        raise ValueError(f"load: {directory} was saved with compression {saved!r}, but compression={asked!r} "
                         f"was asked for; pass compression={saved!r}, or None to read it as it was written")


def _check_spec(directory: str, saved: Any, given: Any) -> Any:
    from dataservice.data import specs

    given = specs.as_structure(given, "element_spec")
    if saved is None:
        return given
    try:
        structure.assert_same_structure(saved, given, "the saved and the given element_spec")
        compatible = all(s.is_compatible_with(g) for s, g in zip(structure.flatten(saved), structure.flatten(given)))
    except TypeError:
        compatible = False
    if not compatible:
        raise ValueError(f"load: element_spec={given!r} does not match the saved elements of {directory}, "
                         f"which are {saved!r}")
    return given


# --- reading chunk files at a position: what an iterator's state restores -------------------------------

def _record_elements(path: str, codec: Optional[str], start: int) -> Iterator[tuple[list, int, int]]:
    """The elements of each record of a chunk file from byte ``start`` on, with the record's offsets; a
    ``start`` beyond the file is a malformed state (a ValueError), not corruption."""
    size = os.path.getsize(path)
    if start > size:
        raise ValueError(f"the iterator state does not fit {path}: its saved 'record' offset {start} is beyond "
                         f"the end of the file ({size} bytes)")
    return save_format.record_elements(path, codec, start)


class _RecordCursor:
    """Where a reader of chunk files stands: the chunk (its place in the reader's list), the offset of the
    record it is in (or opens first) and how many of that record's elements were taken; the open record's
    list iterator counts those, so reading costs nothing more."""

    __slots__ = ("chunk", "record", "skip", "items", "count", "end")

    def __init__(self, chunk: int = 0, record: int = 0, skip: int = 0):
        self.chunk = chunk
        self.record = record
        self.skip = skip
        self.items: Any = None  # the open record's elements
        self.count = 0          # how many it holds
        self.end = 0            # the offset after it

    def position(self) -> list:
        items = self.items
        if items is None:
            return [self.chunk, self.record, self.skip]
        reduced = items.__reduce__()
        taken = reduced[2] if len(reduced) > 2 else self.count
        if taken >= self.count:
            return [self.chunk, self.end, 0]
        return [self.chunk, self.record, taken]

    def enter(self, elements: list, record: int, end: int) -> Any:
        self.record, self.count, self.end = record, len(elements), end
        self.items = items = iter(elements)
        return items

    def restored(self, state: Any, chunks: int, where: str) -> None:
        if not (isinstance(state, list) and len(state) == 3 and all(type(v) is int and v >= 0 for v in state)):
            raise ValueError(f"malformed iterator state for {where}: a shard's position must be [chunk, record "
                             f"offset, elements taken] (ints >= 0), got {state!r:.80}")
        if state[0] > chunks or (state[0] == chunks and (state[1] or state[2])):
            raise ValueError(f"malformed iterator state for {where}: its 'chunk' must be < {chunks} (the shard's "
                             f"chunk files), got {state[0]}")
        self.chunk, self.record, self.skip = state


def _chunk_blocks(paths: list, codec: Optional[str], cursor: _RecordCursor) -> Iterator:
    """The list iterators of the records' elements of ``paths`` from the cursor on (``chain`` flattens
    them). A restored cursor opens its chunk at the record's offset (a seek) and seeks into its elements:
    only that record is read and decoded again."""
    while cursor.chunk < len(paths):
        start, skip = cursor.record, cursor.skip
        for elements, offset, end in _record_elements(paths[cursor.chunk], codec, start):
            items = cursor.enter(elements, offset, end)
            if skip:
                if skip > len(elements):
                    raise ValueError(f"the iterator state does not fit {paths[cursor.chunk]}: the record at offset "
                                     f"{offset} holds {len(elements)} elements, fewer than the saved {skip}")
                items.__setstate__(skip)
                skip = 0
            yield items
        cursor.items = None
        cursor.chunk += 1
        cursor.record = cursor.skip = 0


class _ShardReader(NodeIterator):
    """One shard's chunk files in order. State: ``[chunk, record offset, elements of that record taken]``;
    restoring seeks to the record."""

    __slots__ = ("__next__", "_paths", "_cursor", "_blocks", "_chain", "_where")

    def __init__(self, paths: list, codec: Optional[str], where: str):
        self._paths = paths
        self._where = where
        self._cursor = _RecordCursor()
        self._blocks = _chunk_blocks(paths, codec, self._cursor)
        self._chain = itertools.chain.from_iterable(self._blocks)
        self.__next__ = self._chain.__next__

    def save(self) -> list:
        return self._cursor.position()

    def restore(self, state: Any) -> None:
        self._cursor.restored(state, len(self._paths), self._where)

    def close(self) -> None:
        self._blocks.close()


class _Turn:
    __slots__ = ("next",)

    def __init__(self) -> None:
        self.next = 0


def _round_robin(elements: list, turn: _Turn) -> Iterator:
    """One element of each shard in turn, passing over the shards that ended (the order ``save`` wrote).
    ``elements[i]`` is shard i's elements (None once it ended); ``turn.next`` the shard whose turn is next."""
    n = len(elements)
    i = turn.next
    left = sum(e is not None for e in elements)
    while left:
        shard = elements[i]
        i += 1
        if i == n:
            i = 0
        if shard is not None:
            for element in shard:  # a for over C iterators: cheaper than a call in a try
                turn.next = i
                yield element
                break
            else:
                elements[i - 1] = None  # i - 1 is -1, the last, when i wrapped
                left -= 1


class _ShardsReader(NodeIterator):
    """The shards of a save read round robin. State: ``{"shards": [each shard's position, or null once it
    ended], "next": the shard whose element comes next}``."""

    __slots__ = ("__next__", "_readers", "_shards", "_turn", "_elements", "_where")

    def __init__(self, readers: list, where: str):
        self._readers = readers
        self._where = where
        self._shards = [reader._chain for reader in readers]
        self._turn = _Turn()
        self._elements = _round_robin(self._shards, self._turn)
        self.__next__ = self._elements.__next__

    def save(self) -> dict:
        return {"shards": [r.save() if shard is not None else None for r, shard in zip(self._readers, self._shards)],
                "next": self._turn.next}

    def restore(self, state: Any) -> None:
        shards = field(state, "shards", list, self._where)
        turn = field(state, "next", int, self._where)
        if len(shards) != len(self._readers):
            raise ValueError(f"malformed iterator state for {self._where}: 'shards' holds {len(shards)} positions, "
                             f"the save has {len(self._readers)} shards")
        if turn >= len(self._readers):
            raise ValueError(f"malformed iterator state for {self._where}: 'next' must be < {len(self._readers)}, "
                             f"got {turn}")
        for i, (reader, shard) in enumerate(zip(self._readers, shards)):
            if shard is None:
                self._shards[i] = None
            else:
                reader.restore(shard)
        self._turn.next = turn

    def close(self) -> None:
        self._elements.close()
        for reader in self._readers:
            reader.close()


class SavedDataset(SplittableSource):
    """The elements of a saved dataset; one split per chunk file.

    Iterated whole, the shards are read round robin, one element of each in turn: a save without
    ``shard_func`` comes back in its original order.
    """

    _op_name = "Dataset.load"

    def __init__(self, directory: str, metadata: dict, element_spec: Any = None):
        self._directory = directory
        self._codec = metadata["compression"]
        self._chunks = [(os.path.join(directory, c["file"]), int(c["shard"]), int(c["num_elements"]))
                        for c in metadata["chunks"]]
        self._num_elements = int(metadata["num_elements"])
        self._spec = element_spec if element_spec is not None else metadata.get("element_spec")

    def _describe(self) -> str:
        return f"Dataset.load({self._directory!r})"

    def cardinality(self) -> int:
        return self._num_elements

    def _element_spec(self) -> Any:
        if self._spec is None:
            raise ValueError(f"{self._describe()}: the saved dataset is empty and its pipeline's element_spec "
                             "was not known without an element; pass element_spec= to load")
        return self._spec

    def num_source_splits(self) -> int:
        return len(self._chunks)

    def read_split(self, index: int) -> Iterator:
        return save_format.read_chunk(self._chunks[index][0], self._codec)

    def shard_chunks(self) -> dict[int, list[int]]:
        """Each shard's chunk indices (splits), in order."""
        shards: dict[int, list[int]] = {}
        for i, (_, shard, _) in enumerate(self._chunks):
            shards.setdefault(shard, []).append(i)
        return shards

    def read_shard(self, shard: int) -> Iterator:
        """The elements of one shard, in the order it was written."""
        for index in self.shard_chunks().get(shard, []):
            yield from self.read_split(index)

    def _shard_reader(self, indices: list) -> _ShardReader:
        return _ShardReader([self._chunks[i][0] for i in indices], self._codec, self._describe())

    def _read_all(self) -> Iterator:
        """Its state: one shard's position (``_ShardReader``), or every shard's and whose turn it is
        (``_ShardsReader``): the chunk, the offset of a record in it and the elements of that record
        already taken. Restoring seeks to the record and reads only it again.

        Example::

            >>> it = iter(Dataset.load("/tmp/saved")); next(it)
            >>> it.state_dict()["position"]
            {'shards': [[0, 0, 1], [0, 0, 0]], 'next': 1}
        """
        readers = [self._shard_reader(indices) for indices in self.shard_chunks().values()]
        if len(readers) == 1:
            return readers[0]
        return _ShardsReader(readers, self._describe())


class _ShardDataset(Dataset):
    """One shard of a saved dataset (an element of ``ShardDatasets``)."""

    _op_name = "Dataset.load shard"

    def __init__(self, saved: SavedDataset, shard: int):
        self._saved = saved
        self._shard = shard

    def _describe(self) -> str:
        return f"shard {self._shard} of {self._saved._describe()}"

    def cardinality(self) -> int:
        return sum(n for _, shard, n in self._saved._chunks if shard == self._shard)

    def _element_spec(self) -> Any:
        return self._saved._element_spec()

    def _iterator(self, ctx: Any) -> Iterator:
        return self._saved._shard_reader(self._saved.shard_chunks().get(self._shard, []))


class ShardDatasets(SplittableSource):
    """What ``load``'s ``reader_func`` receives: a dataset whose elements are the saved shards, each a
    Dataset; one split per shard.

    Example::

        >>> load("/tmp/s", reader_func=lambda shards: shards.shuffle(4).interleave(lambda x: x))
    """

    _op_name = "Dataset.load shards"

    def __init__(self, saved: SavedDataset):
        self._saved = saved
        self._shards = sorted(saved.shard_chunks())

    def _describe(self) -> str:
        return f"the shards of {self._saved._describe()}"

    def cardinality(self) -> int:
        return len(self._shards)

    def _element_spec(self) -> Any:
        from dataservice.data import specs

        return specs.TensorSpec((), object)  # each element is a Dataset

    def num_source_splits(self) -> int:
        return len(self._shards)

    def read_split(self, index: int) -> Iterator:
        return iter((_ShardDataset(self._saved, self._shards[index]),))


# --- reading a distributed_save while it is written -------------------------------------------------
# The files of dataservice.dispatcher.saves (not imported: loading needs no dispatcher code).
_SAVE_FILE = "save.json"
_DONE_FILE = "DONE"
_ERROR_FILE = "ERROR"
_COMMITTED = re.compile(r"^chunk_(\d+)$")
#: How often load(wait=True) looks for new chunks, at most.
WAIT_POLL_S = 0.05


def _save_error(directory: str) -> Optional[str]:
    try:
        with open(os.path.join(directory, _ERROR_FILE), "rb") as f:
            return f.read().decode("utf-8", "replace") or "(no reason given)"
    except FileNotFoundError:
        return None


def _read_save_record(directory: str) -> Optional[dict]:
    """The save.json of a distributed_save in ``directory``; None if it is none."""
    import json

    try:
        with open(os.path.join(directory, _SAVE_FILE), "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return None


class GrowingSave(Dataset):
    """``load(path, wait=True)`` of a ``distributed_save`` not done yet: each committed chunk is read once,
    as it appears, until DONE (then any left); ERROR raises its reason. Chunks come in the order they are
    committed, so elements too: every element exactly once, in no fixed order."""

    _op_name = "Dataset.load(wait=True)"

    def __init__(self, directory: str, record: dict, element_spec: Any = None):
        self._directory = directory
        self._codec = record.get("compression")
        self._spec = element_spec
        if self._spec is None and record.get("element_spec"):
            from dataservice.data import specs
            from dataservice.proto import pipeline_pb2

            self._spec = specs.decode(pipeline_pb2.ElementSpecDef.FromString(bytes.fromhex(record["element_spec"])))

    def _describe(self) -> str:
        return f"Dataset.load({self._directory!r}, wait=True)"

    def _element_spec(self) -> Any:
        if self._spec is None:
            if os.path.exists(os.path.join(self._directory, _DONE_FILE)):
                return save_format.read_metadata(self._directory).get("element_spec")
            raise ValueError(f"{self._describe()}: the element_spec of the pipeline being saved is not known "
                             "without an element; pass element_spec= to load, or wait for the save to finish")
        return self._spec

    def _iterator(self, ctx: Any) -> Iterator:
        return _GrowingReader(self)

    def _groups(self, at: "_Growing") -> Iterator:
        """The list iterators of the records' elements of each committed chunk not read yet, the partly
        read one (restored) first."""
        chunks_dir = os.path.join(self._directory, "chunks")
        read = at.read
        while True:
            error = _save_error(self._directory)
            if error is not None:
                raise errors.PipelineError(f"the distributed_save into {self._directory} failed: {error}")
            # DONE is written after every commit: chunks listed after seeing it are all there are.
            done = os.path.exists(os.path.join(self._directory, _DONE_FILE))
            fresh = sorted(int(m.group(1)) for m in map(_COMMITTED.match, os.listdir(chunks_dir))
                           if m and int(m.group(1)) not in read)
            if at.group is not None and (not fresh or fresh[0] != at.group):
                if at.group not in fresh:  # committed chunks stay: the state is of another save
                    raise ValueError(f"the iterator state does not fit {self._describe()}: its 'chunk' "
                                     f"{at.group} is not a committed chunk of the save")
                fresh.remove(at.group)
                fresh.insert(0, at.group)
            for group in fresh:
                at.group = group
                yield from _chunk_blocks([os.path.join(chunks_dir, f"chunk_{group}")], self._codec, at.cursor)
                read.add(group)
                at.group = None
                at.cursor = _RecordCursor()
            if done:
                return
            if not fresh:
                time.sleep(WAIT_POLL_S)


class _Growing:
    __slots__ = ("read", "group", "cursor")

    def __init__(self) -> None:
        self.read: set = set()        # the chunks read whole
        self.group: Optional[int] = None  # the chunk being read
        self.cursor = _RecordCursor()  # where in it


def _as_ranges(numbers: set) -> list:
    """Sorted ints as [first, last + 1] runs: chunks are committed mostly in order, so a few runs."""
    ranges: list = []
    for n in sorted(numbers):
        if ranges and ranges[-1][1] == n:
            ranges[-1][1] = n + 1
        else:
            ranges.append([n, n + 1])
    return ranges


class _GrowingReader(NodeIterator):
    """``load(wait=True)``'s elements, chunk by chunk as they are committed. State: ``{"read": the chunks
    read whole, as [first, last + 1] runs, "chunk": the chunk being read or null, "record": the offset of
    the record in it, "skip": its elements taken}``. Restoring reads the partly read chunk first, from that
    record, then the chunks not read: every element exactly once, in no fixed order (as before)."""

    __slots__ = ("__next__", "_node", "_at", "_groups")

    def __init__(self, node: GrowingSave):
        self._node = node
        self._at = _Growing()
        self._groups = node._groups(self._at)
        self.__next__ = itertools.chain.from_iterable(self._groups).__next__

    def save(self) -> dict:
        at = self._at
        _, record, skip = at.cursor.position()
        return {"read": _as_ranges(at.read), "chunk": at.group, "record": record, "skip": skip}

    def restore(self, state: Any) -> None:
        where = self._node._describe()
        runs = field(state, "read", list, where)
        group = field(state, "chunk", (int, type(None)), where)
        record = field(state, "record", int, where)
        skip = field(state, "skip", int, where)
        read: set = set()
        for run in runs:
            if not (isinstance(run, list) and len(run) == 2 and all(type(v) is int and v >= 0 for v in run)
                    and run[0] < run[1]):
                raise ValueError(f"malformed iterator state for {where}: 'read' must hold [first, last + 1] runs "
                                 f"of chunk numbers, got {run!r:.80}")
            read.update(range(run[0], run[1]))
        if group is not None and (group < 0 or group in read):
            raise ValueError(f"malformed iterator state for {where}: 'chunk' {group} is read whole already or "
                             "negative")
        at = self._at
        at.read.update(read)
        at.group = group
        at.cursor.record, at.cursor.skip = (record, skip) if group is not None else (0, 0)

    def close(self) -> None:
        self._groups.close()


def load(path: Any, element_spec: Any = None, compression: Optional[str] = None,
         reader_func: Optional[Callable[[Dataset], Dataset]] = None, wait: bool = False) -> Dataset:
    """The dataset saved under ``path`` by ``save``, as tf.data's ``Dataset.load``; no pipeline code
    is needed. It knows its ``cardinality()`` and ``element_spec``, and is splittable (one split per
    chunk) for ``distributed_epoch``.

    ``wait=True`` reads a ``distributed_save`` while it is being written (see ``GrowingSave``).
    ``compression``: None reads as the save was written (the metadata says how); any other value must
    match it, else ValueError. ``element_spec``: checked against the saved one. ``reader_func``
    receives a Dataset of the shards (each a Dataset) and returns the dataset to read, as in tf.data.

    Example::

        >>> ds = load("/tmp/s", reader_func=lambda shards: shards.interleave(lambda x: x, cycle_length=2))
    """
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"path must be a str path, got {path!r}")
    if reader_func is not None and not callable(reader_func):
        raise TypeError(f"reader_func must be callable, got {reader_func!r}")
    directory = os.path.abspath(os.fsdecode(path))
    if wait and not os.path.exists(os.path.join(directory, _DONE_FILE)):
        record = _read_save_record(directory)
        if record is not None:
            if reader_func is not None:
                raise ValueError("load: reader_func needs the save's shards, known once it is done; it cannot be "
                                 "combined with wait=True on a save still being written")
            _check_compression(directory, record.get("compression"), compression)
            growing = GrowingSave(directory, record)
            if element_spec is not None:
                growing._spec = _check_spec(directory, growing._spec, element_spec)
            return growing
    metadata = _complete_metadata(directory)
    _check_compression(directory, metadata["compression"], compression)
    spec = None if element_spec is None else _check_spec(directory, metadata.get("element_spec"), element_spec)
    saved = SavedDataset(directory, metadata, spec)
    if reader_func is None:
        return saved
    result = reader_func(ShardDatasets(saved))
    if not isinstance(result, Dataset):
        raise TypeError(f"load: reader_func {_function_name(reader_func)} must return a Dataset, "
                        f"got {type(result).__name__}")
    return result
