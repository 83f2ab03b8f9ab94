"""Dataset builders in TFDS's shape: a class that knows how to prepare a dataset, and reads it back.

A builder declares its versions and configs, describes its features in ``_info()``, and yields
``(key, example)`` pairs per split; ``download_and_prepare`` writes them in TFDS's on-disk format
(``<data_dir>/<name>[/<config>]/<version>/``: ``dataset_info.json``, ``features.json``, TFRecord
shards of ``tf.train.Example``), and ``as_dataset`` reads a split, or a slice of one, as a
``dataservice`` Dataset. A directory prepared by TensorFlow Datasets reads the same way
(``ReadOnlyBuilder``), with no builder code and no TensorFlow.

Example::

    >>> class Squares(GeneratorBasedBuilder):
    ...     VERSION = Version("1.0.0")
    ...     def _info(self):
    ...         return DatasetInfo(builder=self, features=FeaturesDict({"x": np.int64, "y": np.int64}),
    ...                            supervised_keys=("x", "y"))
    ...     def _split_generators(self, dl_manager):
    ...         return {"train": self._generate_examples(1000), "test": self._generate_examples(100)}
    ...     def _generate_examples(self, n):
    ...         for i in range(n):
    ...             yield i, {"x": i, "y": i * i}
    >>> b = Squares(data_dir="/tmp/datasets")
    >>> b.download_and_prepare()
    >>> ds = b.as_dataset(split="train[:10%]", as_supervised=True)
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from dataservice.catalogue import splits as splits_lib
from dataservice.catalogue.dataset_info import DATASET_INFO_FILENAME, DatasetInfo
from dataservice.catalogue.downloads import DownloadConfig, DownloadManager
from dataservice.catalogue.preparation import KeyOrder, SplitWriter, incomplete_directory
from dataservice.catalogue.reading import AUTOCACHE_MAX_BYTES, ReadConfig, read_file_instructions
from dataservice.catalogue.versions import Version, resolve_version
from dataservice.data.dataset import Dataset
from dataservice.data.structure import map_structure

__all__ = ["BuilderConfig", "DatasetBuilder", "GeneratorBasedBuilder", "ReadOnlyBuilder", "default_data_dir",
           "camel_to_snake"]


def default_data_dir() -> str:
    """``$DATASERVICE_DATA_DIR``, else ``$TFDS_DATA_DIR``, else ``~/tensorflow_datasets`` (TFDS's default,
    so data TFDS prepared on this machine is found)."""
    for variable in ("DATASERVICE_DATA_DIR", "TFDS_DATA_DIR"):
        if os.environ.get(variable):
            return os.path.expanduser(os.environ[variable])
    return os.path.expanduser("~/tensorflow_datasets")


def camel_to_snake(name: str) -> str:
    """A builder class's dataset name: ``OpenImagesV4`` -> ``open_images_v4``, as TFDS names them."""
    name = re.sub(r"(.)([A-Z][a-z0-9]+)", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


@dataclasses.dataclass(eq=False)
class BuilderConfig:
    """One variant of a dataset (``name/config``), with its own versions; subclass it to add fields.

    Example::

        >>> class ShapesConfig(BuilderConfig):
        ...     size: int = 28
        >>> BUILDER_CONFIGS = [ShapesConfig(name="small", version=Version("1.0.0"), size=28)]
    """

    name: str
    version: Optional[Union[Version, str]] = None
    supported_versions: Sequence[Union[Version, str]] = ()
    description: Optional[str] = None
    release_notes: Optional[Mapping[str, str]] = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not re.fullmatch(r"[\w\-.]+", self.name):
            raise ValueError(f"a BuilderConfig name must be a non-empty word (letters, digits, _ - .), "
                             f"got {self.name!r}")


def _registered(cls: type) -> None:
    from dataservice.catalogue import registry

    registry.register(cls)


class DatasetBuilder:
    """The base of builders: versions, configs, info, and reading the prepared data.

    Subclasses set ``VERSION`` (and optionally ``SUPPORTED_VERSIONS``, ``BUILDER_CONFIGS``,
    ``RELEASE_NOTES``, ``name``) and implement ``_info()`` and preparation. Defining a subclass
    registers it under ``name`` (the class name in snake_case), for ``builder(name)`` and ``load``.
    """

    name: str = ""
    VERSION: Optional[Union[Version, str]] = None
    SUPPORTED_VERSIONS: Sequence[Union[Version, str]] = ()
    BUILDER_CONFIGS: Sequence[BuilderConfig] = ()
    RELEASE_NOTES: Mapping[str, str] = {}
    MANUAL_DOWNLOAD_INSTRUCTIONS: Optional[str] = None
    #: True keeps the generator's order on disk (keys are then the order); TFDS's attribute.
    disable_shuffling: bool = False
    _abstract = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_abstract" in cls.__dict__:
            return
        if not cls.__dict__.get("name"):
            cls.name = camel_to_snake(cls.__name__)
        _registered(cls)

    def __init__(self, *, data_dir: Optional[str] = None, config: Union[None, str, BuilderConfig] = None,
                 version: Union[None, str, Version] = None):
        self._builder_config = self._pick_config(config)
        canonical, supported = self._declared_versions()
        self._version = resolve_version(version, canonical, supported, dataset=self._display_name())
        self._data_dir_root = os.path.expanduser(os.fspath(data_dir)) if data_dir else default_data_dir()
        self._info_cache: Optional[DatasetInfo] = None

    # --- identity --------------------------------------------------------------------
    def _pick_config(self, config: Union[None, str, BuilderConfig]) -> Optional[BuilderConfig]:
        configs = list(self.BUILDER_CONFIGS)
        if config is None:
            return configs[0] if configs else None
        if isinstance(config, BuilderConfig):
            return config
        if not configs:
            raise ValueError(f"dataset {self.name!r} has no configs, but config {config!r} was asked for")
        for candidate in configs:
            if candidate.name == config:
                return candidate
        raise ValueError(f"dataset {self.name!r} has no config {config!r}; its configs are: "
                         f"{', '.join(c.name for c in configs)}")

    def _declared_versions(self) -> tuple[Version, list[Version]]:
        config = self._builder_config
        canonical = config.version if config is not None and config.version is not None else self.VERSION
        if canonical is None:
            raise ValueError(f"builder {type(self).__name__} declares no VERSION (set VERSION = Version('1.0.0'))")
        supported = config.supported_versions if config is not None and config.version is not None \
            else self.SUPPORTED_VERSIONS
        return Version(canonical), [Version(v) for v in supported]

    def _display_name(self) -> str:
        return self.name + (f"/{self._builder_config.name}" if self._builder_config is not None else "")

    @property
    def builder_config(self) -> Optional[BuilderConfig]:
        return self._builder_config

    @property
    def version(self) -> Version:
        return self._version

    @property
    def supported_versions(self) -> list[Version]:
        return self._declared_versions()[1]

    @property
    def data_dir_root(self) -> str:
        return self._data_dir_root

    @property
    def data_dir(self) -> str:
        """The version directory: ``<data_dir>/<name>[/<config>]/<version>``."""
        parts = [self._data_dir_root, self.name]
        if self._builder_config is not None:
            parts.append(self._builder_config.name)
        return os.path.join(*parts, str(self._version))

    @property
    def is_prepared(self) -> bool:
        return os.path.exists(os.path.join(self.data_dir, DATASET_INFO_FILENAME))

    # --- info ------------------------------------------------------------------------
    def _info(self) -> DatasetInfo:
        raise NotImplementedError(f"{type(self).__name__} must implement _info()")

    @property
    def info(self) -> DatasetInfo:
        """The dataset's info: features and keys from ``_info()``; splits from disk once prepared."""
        if self._info_cache is None or (not self._info_cache.splits and self.is_prepared):
            info = self._info()
            if not isinstance(info, DatasetInfo):
                raise TypeError(f"{type(self).__name__}._info() must return a DatasetInfo, got {info!r}")
            if self.is_prepared:
                on_disk = DatasetInfo.read_from_directory(self.data_dir)
                info.splits = on_disk.splits
                info.data_dir = self.data_dir
            self._info_cache = info
        return self._info_cache

    # --- preparation -----------------------------------------------------------------
    def download_and_prepare(self, *, data_dir: Optional[str] = None,
                             download_config: Optional[DownloadConfig] = None) -> None:
        """Prepares the dataset under ``data_dir`` (the builder's by default), unless it already is.

        The files are written to a temporary directory renamed into place at the end, so a failed
        or killed preparation leaves nothing that ``as_dataset`` would read.
        """
        if data_dir is not None:
            self._data_dir_root = os.path.expanduser(os.fspath(data_dir))
            self._info_cache = None
        if self.is_prepared:
            return
        if getattr(self._version, "tfds_version_to_prepare", None):
            raise ValueError(f"{self._display_name()}:{self._version} can be read once prepared, but this code "
                             f"cannot prepare it (it was prepared by TFDS {self._version.tfds_version_to_prepare}); "
                             f"the versions it can prepare: {self._preparable()}")
        config = download_config or DownloadConfig()
        download_dir = config.download_dir or os.path.join(self._data_dir_root, "downloads")
        manager = DownloadManager(download_dir, config.manual_dir)
        info = self._info()
        with incomplete_directory(self.data_dir) as tmp:
            info.set_splits(self._prepare_splits(tmp, manager, info, config))
            info.write_to_directory(tmp)
        if self.is_prepared:  # ours, or another preparation's that committed first: the same splits
            info.data_dir = self.data_dir
            self._info_cache = info

    def _preparable(self) -> str:
        canonical, supported = self._declared_versions()
        return ", ".join(str(v) for v in sorted({canonical, *supported}, reverse=True)
                         if not getattr(v, "tfds_version_to_prepare", None))

    def _prepare_splits(self, directory: str, manager: DownloadManager, info: DatasetInfo,
                        config: DownloadConfig) -> list:
        raise NotImplementedError(f"{type(self).__name__} cannot prepare data")

    # --- reading ---------------------------------------------------------------------
    def as_dataset(self, split: Any = None, *, batch_size: Optional[int] = None, shuffle_files: bool = False,
                   read_config: Optional[ReadConfig] = None, as_supervised: bool = False) -> Any:
        """The split (a str, ReadInstruction or list of them; None: a dict of all splits) as Dataset(s).

        ``batch_size=-1`` gives the whole split as one element (numpy arrays) instead of a Dataset.
        """
        if not self.is_prepared:
            raise FileNotFoundError(f"{self._display_name()}:{self._version} is not prepared in {self.data_dir}: "
                                    "call download_and_prepare() first (or load(..., download=True))")
        read_config = read_config or ReadConfig()
        if not isinstance(read_config, ReadConfig):
            raise TypeError(f"read_config must be a ReadConfig, got {read_config!r}")
        info = self.info
        if split is None:
            return {name: self._build_one(name, batch_size, shuffle_files, read_config, as_supervised)
                    for name in info.splits}
        if isinstance(split, (list, tuple)):
            return [self._build_one(s, batch_size, shuffle_files, read_config, as_supervised) for s in split]
        return self._build_one(split, batch_size, shuffle_files, read_config, as_supervised)

    def _build_one(self, split: Any, batch_size: Optional[int], shuffle_files: bool, read_config: ReadConfig,
                   as_supervised: bool) -> Any:
        info = self.info
        if info.features is None:
            raise ValueError(f"{self._display_name()} has no features.json: its records cannot be decoded")
        if as_supervised and not info.supervised_keys:
            raise ValueError(f"as_supervised=True, but {self._display_name()} declares no supervised_keys")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size == 0 or batch_size < -1):
            raise ValueError(f"batch_size must be a positive int, -1 (the whole split) or None, got {batch_size!r}")
        shards = {name: [(os.path.join(self.data_dir, filename), length)
                         for filename, length in zip(s.filenames(info.name, info.file_format), s.shard_lengths)]
                  for name, s in info.splits.items()}
        if info.file_format != "tfrecord":
            raise ValueError(f"{self.data_dir} holds {info.file_format!r} files; only 'tfrecord' can be read")
        instructions = splits_lib.file_instructions(split, shards)
        ds: Dataset = read_file_instructions(
            instructions, info.features.deserialize_example, info.features.element_spec, read_config=read_config,
            shuffle_files=shuffle_files, disable_shuffling=self.disable_shuffling,
            what=f"{self._display_name()}:{self._version} {split}")
        if self._should_autocache(info, len(instructions), shuffle_files, read_config):
            ds = ds.cache()
        whole = batch_size == -1
        if whole:
            batch_size = max(sum(i.take for i in instructions), 1)
        if batch_size:
            ds = ds.padded_batch(batch_size)
        if as_supervised:
            ds = ds.map(_SupervisedLookup(info.supervised_keys))
        if whole:
            return next(iter(ds))
        return ds

    def _should_autocache(self, info: DatasetInfo, num_files: int, shuffle_files: bool,
                          read_config: ReadConfig) -> bool:
        # TFDS's rule: a known total size under 250 MiB, and no reshuffling of several files (a cache would
        # freeze their order).
        if not read_config.try_autocaching or not info.dataset_size or info.dataset_size > AUTOCACHE_MAX_BYTES:
            return False
        return not (shuffle_files and read_config.shuffle_reshuffle_each_iteration is not False and num_files > 1)


class _SupervisedLookup:
    """Picks the supervised keys out of a features dict: ``(input, label)``, nested as declared (a class,
    not a lambda, so that the pipeline pickles by reference)."""

    def __init__(self, keys: Any):
        self._keys = keys

    def __call__(self, features: dict) -> Any:
        return map_structure(features.__getitem__, self._keys)


class GeneratorBasedBuilder(DatasetBuilder):
    """A builder whose ``_split_generators(dl_manager)`` returns, per split, an iterable of ``(key, example)``.

    Keys must be unique within a split (str, bytes or int); they fix the records' order on disk
    (their md5, as TFDS), so the same generator gives the same slices on every machine.
    """

    _abstract = True

    def _split_generators(self, dl_manager: DownloadManager) -> Mapping[str, Iterable]:
        raise NotImplementedError(f"{type(self).__name__} must implement _split_generators(dl_manager)")

    def _generate_examples(self, *args: Any, **kwargs: Any) -> Iterable:
        raise NotImplementedError(f"{type(self).__name__} must implement _generate_examples(...)")

    def _prepare_splits(self, directory: str, manager: DownloadManager, info: DatasetInfo,
                        config: DownloadConfig) -> list:
        generators = self._split_generators(manager)
        if not isinstance(generators, Mapping) or not generators:
            raise TypeError(f"{type(self).__name__}._split_generators must return a non-empty dict "
                            f"{{split name: (key, example) iterable}}, got {generators!r}")
        if info.features is None:
            raise ValueError(f"{type(self).__name__}._info() declares no features")
        prepared = []
        for split_name, examples in generators.items():
            splits_lib.check_split_name(split_name)
            writer = SplitWriter(directory, info.name, split_name, KeyOrder(split_name, self.disable_shuffling))
            if config.max_examples_per_split is not None:
                examples = itertools.islice(examples, config.max_examples_per_split)
            for item in examples:
                if not isinstance(item, tuple) or len(item) != 2:
                    raise TypeError(f"{type(self).__name__}: split {split_name!r} must yield (key, example) "
                                    f"pairs, got {type(item).__name__}")
                key, example = item
                try:
                    record = info.features.serialize_example(example)
                except (TypeError, ValueError) as exc:
                    raise type(exc)(f"split {split_name!r}, example {key!r}: {exc}") from exc
                writer.add(key, record)
            prepared.append(writer.finish(config.num_shards))
        return prepared


class ReadOnlyBuilder(DatasetBuilder):
    """Reads a prepared directory with no builder code: TFDS's, or ours from another machine.

    Example::

        >>> b = ReadOnlyBuilder("~/tensorflow_datasets/mnist/3.0.1")
        >>> ds = b.as_dataset(split="test[:1%]")
    """

    _abstract = True

    def __init__(self, directory: str):
        directory = os.path.expanduser(os.fspath(directory)).rstrip("/")
        info = DatasetInfo.read_from_directory(directory)
        self.name = info.name
        self._builder_config = BuilderConfig(name=info.config_name) if info.config_name else None
        self._version = info.version
        root = os.path.dirname(directory)
        if info.config_name:
            root = os.path.dirname(root)
        self._data_dir_root = os.path.dirname(root)
        self._directory = directory
        self._info_cache = info

    @property
    def data_dir(self) -> str:
        return self._directory

    def _info(self) -> DatasetInfo:
        return self._info_cache

    @property
    def info(self) -> DatasetInfo:
        return self._info_cache

    def _declared_versions(self) -> tuple[Version, list[Version]]:
        return self._version, []

    def download_and_prepare(self, *, data_dir: Optional[str] = None,
                             download_config: Optional[DownloadConfig] = None) -> None:
        """Nothing to do: the data is prepared (a read-only builder has no code to prepare more)."""
        if data_dir is not None and os.path.expanduser(os.fspath(data_dir)) != self._data_dir_root:
            raise ValueError(f"{self.name} is read from {self._directory}; it has no builder code here to "
                             f"prepare it into {data_dir}")
