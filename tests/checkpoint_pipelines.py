"""Pipelines that the iterator-state tests build in this process and again in another one (a trainer
restarted from its checkpoint): each builder is importable, so a subprocess builds the same pipeline.

Example::

    python -c "from tests.checkpoint_pipelines import build; print(list(build('map_filter_batch', '/tmp/d')))"
"""

from __future__ import annotations

import os
from typing import Callable

import numpy as np

from dataservice import Dataset, TextLineDataset, TFRecordDataset, TFRecordWriter


def write_files(directory: str) -> None:
    """The files the file-reading pipelines read: three text files and two TFRecord files (one GZIP)."""
    for f in range(3):
        with open(os.path.join(directory, f"lines-{f}.txt"), "w") as out:
            out.writelines(f"file {f} line {i}\n" for i in range(7 + 3 * f))
    for f, compression in enumerate([None, "GZIP"]):
        with TFRecordWriter(os.path.join(directory, f"records-{f}.tfrecord"), compression) as writer:
            for i in range(40):
                writer.write(f"record {f}:{i}".encode() * (1 + i % 3))


def _square(x):
    return x * x


BUILDERS: dict[str, Callable[[str], Dataset]] = {
    "map_filter_batch": lambda d: Dataset.range(1000).map(lambda x: x * 3).filter(lambda x: x % 2 == 0).batch(7),
    "shuffle_repeat": lambda d: Dataset.range(60).shuffle(16, seed=5).repeat(3).batch(5),
    "files_interleave": lambda d: Dataset.list_files(os.path.join(d, "lines-*.txt")).interleave(
        TextLineDataset, cycle_length=2, block_length=3).map(lambda line: line + b"!"),
    "tfrecord": lambda d: TFRecordDataset([os.path.join(d, "records-0.tfrecord")]).map(len),
    "tfrecord_gzip": lambda d: TFRecordDataset([os.path.join(d, "records-1.tfrecord")], compression_type="GZIP"),
    "window": lambda d: Dataset.range(40).window(5, 2).flat_map(lambda w: w.batch(5)),
    "cache_file": lambda d: Dataset.range(30).map(_square).cache(os.path.join(d, "cache")).repeat(2),
    "zip_concat_prefetch": lambda d: Dataset.zip(Dataset.range(50), Dataset.range(50).map(lambda x: -x)).concatenate(
        Dataset.zip(Dataset.range(5), Dataset.range(5))).prefetch(4),
    "parallel_map": lambda d: Dataset.range(500).map(lambda x: np.full((2,), x), num_parallel_calls=4).batch(10),
    "slices_unbatch": lambda d: Dataset.from_tensor_slices({"a": np.arange(300).reshape(100, 3)}).batch(8).unbatch(),
}


def build(name: str, directory: str) -> Dataset:
    """The pipeline ``name`` over the files ``write_files`` wrote in ``directory``."""
    return BUILDERS[name](directory)
