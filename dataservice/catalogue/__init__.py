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

#: Where each public name is defined, imported on first use (PEP 562 ``__getattr__`` below): the
#: ``dataservice`` command imports ``catalogue.command`` to build its parser, and the builders, features
#: and readers (numpy and the pipeline library) would cost every command a quarter of a second.
_PUBLIC_HOMES = {
    "BenchmarkResult": "benchmarking", "benchmark": "benchmarking",
    "BuilderConfig": "builders", "DatasetBuilder": "builders", "GeneratorBasedBuilder": "builders",
    "ReadOnlyBuilder": "builders", "default_data_dir": "builders",
    "DatasetInfo": "dataset_info", "SplitDict": "dataset_info", "SplitInfo": "dataset_info",
    "DownloadConfig": "downloads", "DownloadManager": "downloads",
    "ClassLabel": "features", "FeatureConnector": "features", "FeaturesDict": "features", "Image": "features",
    "Scalar": "features", "Tensor": "features", "Text": "features",
    "InputContext": "reading", "ReadConfig": "reading",
    "as_numpy": "registry", "builder": "registry", "builder_from_directory": "registry",
    "list_builders": "registry", "load": "registry",
    "ReadInstruction": "splits", "even_splits": "splits",
    "Version": "versions",
}

__all__ = [
    "BenchmarkResult", "BuilderConfig", "ClassLabel", "DatasetBuilder", "DatasetInfo", "DownloadConfig",
    "DownloadManager", "FeatureConnector", "FeaturesDict", "GeneratorBasedBuilder", "Image", "InputContext",
    "ReadConfig", "ReadInstruction", "ReadOnlyBuilder", "Scalar", "SplitDict", "SplitInfo", "Tensor", "Text",
    "Version", "as_numpy", "benchmark", "builder", "builder_from_directory", "default_data_dir", "even_splits",
    "list_builders", "load",
]


def __getattr__(name: str) -> object:
    """Imports a public name on first use, then keeps it in the module's namespace.

    Example::

        >>> from dataservice import catalogue
        >>> catalogue.Version("1.2.3").major      # dataservice.catalogue.versions is imported here
        1
    """
    import importlib
    import importlib.util

    home = _PUBLIC_HOMES.get(name)
    if home is None:
        # Its modules too (catalogue.features, ...), bound here as when this module imported them all.
        if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
            return importlib.import_module(f"{__name__}.{name}")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
