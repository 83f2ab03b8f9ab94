"""Transformation nodes: map, filter, batch, shuffle, repeat, interleave, ...

Each node validates its arguments at construction, with the kind of error
tf.data raises there (see ``ARGUMENT_ERRORS``), naming the argument; computes
its cardinality the way tf.data does, and makes its iterator from its input's.
Where tf.data checks an input's element_spec at construction (concatenate,
padded_batch, unbatch, unique), so does the node when that spec is known without
reading an element; otherwise it checks the first elements it meets. Exceptions
raised by user functions surface with their original type and message, chained,
naming the transformation.

Example::

    >>> ds = Dataset.range(1, 6).interleave(
    ...     lambda x: Dataset.from_tensors(x).repeat(6), cycle_length=2, block_length=4)
    >>> [int(x) for x in ds][:10]
    [1, 1, 1, 1, 2, 2, 2, 2, 1, 1]
"""

from dataservice.data.transformations.batching import BatchDataset, PaddedBatchDataset, UnbatchDataset
from dataservice.data.transformations.combining import ConcatenateDataset, InterleaveDataset, ZipDataset
from dataservice.data.transformations.common import ARGUMENT_ERRORS, _OptionsDataset, _UnaryDataset, raise_user_error
from dataservice.data.transformations.per_element import (EnumerateDataset, FilterDataset, MapDataset,
                                                          TakeWhileDataset, UniqueDataset)
from dataservice.data.transformations.reordering import PrefetchDataset, ShuffleDataset, shuffle_and_repeat
from dataservice.data.transformations.slicing import RepeatDataset, ShardDataset, SkipDataset, TakeDataset

__all__ = [
    "MapDataset", "FilterDataset", "BatchDataset", "PaddedBatchDataset", "UnbatchDataset", "ShuffleDataset",
    "RepeatDataset", "TakeDataset", "SkipDataset", "TakeWhileDataset", "ShardDataset", "EnumerateDataset",
    "InterleaveDataset", "PrefetchDataset", "UniqueDataset", "ZipDataset", "ConcatenateDataset",
    "raise_user_error", "shuffle_and_repeat", "ARGUMENT_ERRORS",
    "_OptionsDataset", "_UnaryDataset",
]

