"""Reading a prepared split: ``ReadConfig``, ``InputContext`` and the ``Dataset`` over its shard files.

What ``as_dataset`` builds, in TFDS's order::

    file instructions of the slice           (splits.file_instructions: a slice is absolute record indices)
      -> shard(num_input_pipelines, id)       (ReadConfig.input_context: each pipeline reads its share of files)
      -> shuffle(files, shuffle_seed)         (shuffle_files=True: file order changes every epoch)
      -> interleave(read, cycle_length=16, block_length=16)
      -> map(decode)                          (the features' tf.train.Example decoding)

Each file instruction (a shard, or the records of a shard the slice keeps) is one split of the
pipeline, so under ``distribute("distributed_epoch", ...)`` every record of the slice is read
exactly once, whichever worker reads it.

Example::

    >>> config = ReadConfig(input_context=InputContext(input_pipeline_id=1, num_input_pipelines=4),
    ...                     shuffle_seed=7)
    >>> ds = load("shapes", split="train", read_config=config, shuffle_files=True)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Optional, Sequence

from dataservice.catalogue.splits import FileInstruction
from dataservice.data.checkpoint import NodeIterator, close_input, field, restore_input, save_input
from dataservice.data.dataset import UNKNOWN_CARDINALITY, Dataset, IteratorContext
from dataservice.data.options import Options
from dataservice.data.readers.tfrecord import TFRecordDataset
from dataservice.data.sources import SplittableSource
from dataservice.data.transformations import _UnaryDataset
from dataservice.errors import DataLossError

__all__ = ["InputContext", "ReadConfig", "read_file_instructions", "AUTOCACHE_MAX_BYTES"]

#: Datasets (all splits) smaller than this are cached in memory on first read (TFDS's rule).
AUTOCACHE_MAX_BYTES = 250 * 1024 * 1024
_DEFAULT_CYCLE_LENGTH = 16


@dataclasses.dataclass(frozen=True)
class InputContext:
    """Which of ``num_input_pipelines`` input pipelines this one is (as ``tf.distribute.InputContext``).

    Example::

        >>> InputContext(input_pipeline_id=1, num_input_pipelines=4)
    """

    num_input_pipelines: int = 1  # tf.distribute.InputContext's order of arguments
    input_pipeline_id: int = 0
    num_replicas_in_sync: int = 1

    def __post_init__(self) -> None:
        for name in ("input_pipeline_id", "num_input_pipelines", "num_replicas_in_sync"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"InputContext.{name} must be an int, got {value!r}")
        if self.num_input_pipelines < 1:
            raise ValueError(f"InputContext.num_input_pipelines must be >= 1, got {self.num_input_pipelines}")
        if not 0 <= self.input_pipeline_id < self.num_input_pipelines:
            raise ValueError(f"InputContext.input_pipeline_id must be in [0, {self.num_input_pipelines}), "
                             f"got {self.input_pipeline_id}")


@dataclasses.dataclass(frozen=True)
class ReadConfig:
    """How ``as_dataset``/``load`` read the files, as ``tfds.ReadConfig``.

    - ``input_context``: read only this input pipeline's share of the slice's files.
    - ``shuffle_seed``: with ``shuffle_files=True``, the seed of the file order (deterministic per epoch);
      None gives a different order each run (and lets the interleave yield in completion order).
    - ``shuffle_reshuffle_each_iteration``: False keeps one file order for every epoch.
    - ``interleave_cycle_length`` / ``interleave_block_length``: files read at once, and records taken
      from one before moving to the next (None for the cycle: 16, or 1 for a dataset whose builder
      disables shuffling, to keep its order).
    - ``try_autocaching``: cache small datasets in memory (see ``AUTOCACHE_MAX_BYTES``).
    - ``options``: ``dataservice.data.Options`` applied to the dataset.

    Example::

        >>> ReadConfig(shuffle_seed=42, interleave_cycle_length=4, try_autocaching=False)
    """

    input_context: Optional[InputContext] = None
    shuffle_seed: Optional[int] = None
    shuffle_reshuffle_each_iteration: Optional[bool] = None
    interleave_cycle_length: Optional[int] = None
    interleave_block_length: int = 16
    try_autocaching: bool = True
    options: Optional[Options] = None

    def __post_init__(self) -> None:
        if self.input_context is not None and not isinstance(self.input_context, InputContext):
            raise TypeError(f"ReadConfig.input_context must be an InputContext, got {self.input_context!r}")
        if self.shuffle_seed is not None and (not isinstance(self.shuffle_seed, int)
                                              or isinstance(self.shuffle_seed, bool)):
            raise TypeError(f"ReadConfig.shuffle_seed must be an int or None, got {self.shuffle_seed!r}")
        for name in ("interleave_cycle_length", "interleave_block_length"):
            value = getattr(self, name)
            if value is None and name == "interleave_cycle_length":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ReadConfig.{name} must be an int >= 1, got {value!r}")
        if self.options is not None and not isinstance(self.options, Options):
            raise TypeError(f"ReadConfig.options must be a dataservice.data.Options, got {self.options!r}")


class _FileInstructionsSource(SplittableSource):
    """The file instructions of a slice, one element and one split each."""

    _op_name = "catalogue.file_instructions"

    def __init__(self, instructions: Sequence[FileInstruction]):
        self._instructions = list(instructions)

    def _describe(self) -> str:
        return f"{self._op_name}({len(self._instructions)} files)"

    def cardinality(self) -> int:
        return len(self._instructions)

    def num_source_splits(self) -> int:
        return len(self._instructions)

    def read_split(self, index: int) -> Iterator:
        return iter((self._instructions[index],))


def _read_instruction(instruction: FileInstruction) -> Dataset:
    ds: Dataset = TFRecordDataset(instruction.filename)
    if instruction.skip:
        ds = ds.skip(instruction.skip)
    if instruction.take != instruction.num_examples - instruction.skip:
        ds = ds.take(instruction.take)
    return ds


class _DecodedRecords(_UnaryDataset):
    """The decoded records: their element_spec from the features, and their count checked.

    dataset_info.json says how many records each shard holds; a full pass that reads a different
    number means the files and the metadata disagree, which is data loss, not a shorter epoch.
    ``count`` is None when the total is not known here (one input pipeline's share).
    """

    _op_name = "catalogue.records"

    def __init__(self, input_dataset: Dataset, count: Optional[int], element_spec: Any, what: str):
        super().__init__(input_dataset)
        self._count = count
        self._spec = element_spec
        self._what = what

    def _describe(self) -> str:
        return f"{self._op_name}({self._what})"

    def cardinality(self) -> int:
        return UNKNOWN_CARDINALITY if self._count is None else self._count

    def _element_spec(self) -> Any:
        return self._spec

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        it = self._input._iterator(ctx)
        if ctx.split_provider is not None or self._count is None:
            return it  # a subset of the files: no total to check; its position is its input's
        return _CountedRecords(self, it)

    def _counted(self, it: Iterator, count: "_Count") -> Iterator:
        count.counter = counter = enumerate(it, count.start + 1)
        n = count.start  # records read before this iterator's (a restored pass)
        for n, element in counter:  # noqa: B007 (n counts)
            yield element
        if n != self._count:
            raise DataLossError(f"{self._what}: read {n} records where dataset_info.json says {self._count}; the "
                                "shard files do not match their metadata (prepare the dataset again)")


class _Count:
    __slots__ = ("start", "counter")

    def __init__(self) -> None:
        self.start = 0        # records read before (restored)
        self.counter = None   # the enumerate that counts the records since, once reading


class _CountedRecords(NodeIterator):
    """``_DecodedRecords`` checking its total. State: ``{"input": the input's, "records": records read}``,
    so that a restored pass still checks its whole count. The count is an ``enumerate``'s, read from it
    when asked: nothing more per record.

    Example::

        >>> it = iter(load("shapes", split="train")); next(it)
        >>> it.state_dict()["position"]["records"]
        1
    """

    __slots__ = ("__next__", "_node", "_input", "_count", "_elements")

    def __init__(self, node: _DecodedRecords, input_iterator: Iterator):
        self._node = node
        self._input = input_iterator
        self._count = _Count()
        self._elements = node._counted(input_iterator, self._count)
        self.__next__ = self._elements.__next__

    def save(self) -> dict:
        count = self._count
        records = count.start if count.counter is None else count.counter.__reduce__()[1][1] - 1
        return {"input": save_input(self._input, self._node._input), "records": records}

    def restore(self, state: Any) -> None:
        where = self._node._describe()
        records = field(state, "records", int, where)
        restore_input(self._input, self._node._input, field(state, "input", (dict, list, int, str, type(None)), where))
        self._count.start = records

    def close(self) -> None:
        close_input(self._elements)
        close_input(self._input)


def read_file_instructions(instructions: Sequence[FileInstruction], decode: Callable[[bytes], Any],
                           element_spec: Any, *, read_config: ReadConfig, shuffle_files: bool, disable_shuffling: bool = False,
                           what: str = "dataset") -> Dataset:
    """The Dataset of the decoded records the file instructions select; see the module docstring.

    Example::

        >>> instructions = file_instructions(ReadInstruction.from_spec("train[:10%]"), shards)
        >>> ds = read_file_instructions(instructions, features.deserialize_example, features.element_spec,
        ...                             read_config=ReadConfig(), shuffle_files=False)
    """
    instructions = [i for i in instructions if i.take > 0]
    context = read_config.input_context
    ds: Dataset = _FileInstructionsSource(instructions)
    sharded = context is not None and context.num_input_pipelines > 1
    if sharded:
        if len(instructions) < context.num_input_pipelines:
            raise ValueError(
                f"cannot shard {what} across {context.num_input_pipelines} input pipelines: the slice has only "
                f"{len(instructions)} file(s), so some pipelines would read nothing. Slice the split instead "
                f"(e.g. even_splits(split, n={context.num_input_pipelines})), or prepare it with more shards.")
        ds = ds.shard(context.num_input_pipelines, context.input_pipeline_id)
    if shuffle_files:
        ds = ds.shuffle(max(len(instructions), 1), seed=read_config.shuffle_seed,
                        reshuffle_each_iteration=read_config.shuffle_reshuffle_each_iteration)
    cycle = read_config.interleave_cycle_length
    if cycle is None:
        cycle = 1 if disable_shuffling else _DEFAULT_CYCLE_LENGTH
    # As TFDS: shuffled files with no seed may come out in completion order; otherwise the order is fixed.
    deterministic = not (shuffle_files and read_config.shuffle_seed is None)
    ds = ds.interleave(_read_instruction, cycle_length=cycle, block_length=read_config.interleave_block_length,
                       deterministic=deterministic)
    ds = _DecodedRecords(ds.map(decode), None if sharded else sum(i.take for i in instructions), element_spec, what)
    if read_config.options is not None:
        ds = ds.with_options(read_config.options)
    return ds
