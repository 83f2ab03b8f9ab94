"""The dataset catalogue: TFDS-compatible builders, split slicing, versions, loading and benchmarking.

Named data, read the same on every machine: ``load("shapes:1.*.*", split="train[:10%]+train[-80%:]")``
prepares the dataset once (TFDS's on-disk format: TFRecord shards of ``tf.train.Example``, with
``dataset_info.json`` and ``features.json``), and reads the slice — the same records wherever it
runs — as a ``dataservice`` Dataset, which ``distribute()`` can feed through the service. Data
prepared by TensorFlow Datasets loads here with no TensorFlow, and data prepared here loads in TFDS.

Modules: ``builders`` (DatasetBuilder, GeneratorBasedBuilder, ReadOnlyBuilder), ``registry`` (names,
``builder``, ``load``), ``features`` (feature connectors and tf.train.Example), ``dataset_info``,
``splits`` (slicing), ``versions``, ``preparation`` (writing shards), ``reading`` (ReadConfig and the
read pipeline), ``downloads``, ``benchmarking``, ``builtin`` (datasets that ship with dataservice).

Example::

    >>> from dataservice import catalogue
    >>> ds, info = catalogue.load("shapes", split="train[:50%]", as_supervised=True, with_info=True)
    >>> info.splits["train"].num_examples
    6000
    >>> catalogue.benchmark(ds.batch(32), batch_size=32)
"""

from dataservice.catalogue.benchmarking import BenchmarkResult, benchmark
from dataservice.catalogue.builders import (BuilderConfig, DatasetBuilder, GeneratorBasedBuilder, ReadOnlyBuilder,
                                            default_data_dir)
from dataservice.catalogue.dataset_info import DatasetInfo, SplitDict, SplitInfo
from dataservice.catalogue.downloads import DownloadConfig, DownloadManager
from dataservice.catalogue.features import (ClassLabel, FeatureConnector, FeaturesDict, Image, Scalar, Tensor,
                                            Text)
from dataservice.catalogue.reading import InputContext, ReadConfig
from dataservice.catalogue.registry import as_numpy, builder, builder_from_directory, list_builders, load
from dataservice.catalogue.splits import ReadInstruction, even_splits
from dataservice.catalogue.versions import Version

__all__ = [
    "BenchmarkResult", "BuilderConfig", "ClassLabel", "DatasetBuilder", "DatasetInfo", "DownloadConfig",
    "DownloadManager", "FeatureConnector", "FeaturesDict", "GeneratorBasedBuilder", "Image", "InputContext",
    "ReadConfig", "ReadInstruction", "ReadOnlyBuilder", "Scalar", "SplitDict", "SplitInfo", "Tensor", "Text",
    "Version", "as_numpy", "benchmark", "builder", "builder_from_directory", "default_data_dir", "even_splits",
    "list_builders", "load",
]
