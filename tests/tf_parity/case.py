"""One parity case: a pipeline written once, run by TensorFlow (recorded) and by dataservice (tested).

``source`` is Python run with these names bound (to TensorFlow's objects when recording, to ours
when testing; see ``record.py`` and ``tests/test_tf_parity.py``):

- ``D``: the Dataset class (``tf.data.Dataset`` / ``dataservice.Dataset``)
- ``np``; ``Options``; ``AUTOTUNE``; ``TensorSpec``; ``errors`` (``tf.errors`` / ``dataservice.errors``)
- ``TFRecordDataset``, ``TextLineDataset``, ``FixedLengthRecordDataset``
- ``TFRecordWriter``: the dataset writer (``tf.data.experimental.TFRecordWriter`` / ours)
- ``experimental``: ``tf.data.experimental`` / ``dataservice.data.experimental``
- ``tmp``: a fresh empty directory for files the case writes

It must leave ``ds`` (a dataset: its elements, cardinality and element_spec are compared) or
``result`` (any value made of numpy values, strings, tuples, lists and dicts). An exception is
recorded by kind and phase (building the pipeline, or iterating it).

No TensorFlow and no dataservice here: this module is imported on both sides.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    source: str
    #: Elements compared at most (an infinite dataset is cut there).
    max_elements: int = 100
    #: TensorFlow makes Python int and float literals int32 and float32; we keep them 64-bit (a deliberate
    #: difference). With this set, int32/int64 and float32/float64 compare by value (floats at float32).
    literal_dtypes: bool = False
    #: Compare the elements as a multiset (a nondeterministic order).
    unordered: bool = False
