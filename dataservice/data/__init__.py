"""The pipeline library: a tf.data-style ``Dataset`` for Python and numpy.

Example::

    >>> from dataservice.data import Dataset
    >>> list(Dataset.range(3).map(lambda x: x * 10).as_numpy_iterator())
    [0, 10, 20]
"""

from dataservice.data.dataset import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset
from dataservice.data.options import AUTOTUNE, Options, ThreadingOptions
from dataservice.data.readers import (FixedLengthRecordDataset, SqlDataset, TextLineDataset, TFRecordDataset,
                                      TFRecordWriter)
from dataservice.data.saved import load, save
from dataservice.data.serialization import dataset_fingerprint, deserialize_dataset, serialize_dataset
from dataservice.data.snapshots import snapshot
from dataservice.data.iterators import Optional
from dataservice.data.specs import DatasetSpec, TensorSpec
from dataservice.data.transformations import shuffle_and_repeat
from dataservice.data import experimental  # noqa: E402  (after the names it builds on)

__all__ = [
    "AUTOTUNE",
    "Dataset",
    "DatasetSpec",
    "FixedLengthRecordDataset",
    "INFINITE_CARDINALITY",
    "Optional",
    "Options",
    "SqlDataset",
    "TFRecordDataset",
    "TFRecordWriter",
    "TensorSpec",
    "TextLineDataset",
    "ThreadingOptions",
    "UNKNOWN_CARDINALITY",
    "dataset_fingerprint",
    "experimental",
    "deserialize_dataset",
    "load",
    "save",
    "serialize_dataset",
    "shuffle_and_repeat",
    "snapshot",
]
