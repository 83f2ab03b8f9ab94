"""Finding datasets by name: the registry of builder classes, ``builder(name)``, ``load`` and ``as_numpy``.

A name is ``dataset[/config][:version]``, the version exact (``"1.2.3"``) or with wildcards
(``"1.*.*"``: the highest supported 1.x.y). A name with no registered builder is looked up on disk:
a directory TFDS (or another machine) prepared under ``data_dir`` reads with no builder code.

Example::

    >>> ds = load("shapes:1.*.*", split="train[:10%]+train[-80%:]", data_dir="/tmp/datasets")
    >>> (images, labels), info = load("shapes", split="test", batch_size=-1, as_supervised=True, with_info=True)
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterator, Optional

from dataservice.catalogue.builders import DatasetBuilder, ReadOnlyBuilder, default_data_dir
from dataservice.catalogue.dataset_info import DATASET_INFO_FILENAME
from dataservice.catalogue.reading import ReadConfig
from dataservice.catalogue.versions import Version, resolve_version
from dataservice.data.dataset import Dataset
from dataservice.errors import DatasetNotFoundError, UnsupportedVersionError

__all__ = ["register", "list_builders", "builder", "builder_from_directory", "load", "as_numpy", "parse_name"]

_REGISTRY: dict[str, type] = {}
_NAME = re.compile(r"^(?P<name>[a-z0-9_]+)(?:/(?P<config>[\w\-.]+))?(?::(?P<version>[\d*]+\.[\d*]+\.[\d*]+))?$")


def register(cls: type) -> None:
    """Registers a builder class under its ``name`` (done when a ``DatasetBuilder`` subclass is defined).

    Redefining the same class (same module and qualified name, e.g. a re-run notebook cell) replaces
    it; another class with a taken name is an error.
    """
    existing = _REGISTRY.get(cls.name)
    if existing is not None and (existing.__module__, existing.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"a dataset named {cls.name!r} is already registered ({existing.__module__}."
                         f"{existing.__qualname__}); give {cls.__qualname__} another name = '...'")
    _REGISTRY[cls.name] = cls


def list_builders() -> list[str]:
    """The names of the registered builders, sorted."""
    _import_builtin()
    return sorted(_REGISTRY)


def _import_builtin() -> None:
    import dataservice.catalogue.builtin  # noqa: F401  (defining the classes registers them)


def parse_name(name: str) -> tuple[str, Optional[str], Optional[str]]:
    """``"name/config:1.*.*"`` -> ``("name", "config", "1.*.*")``; a malformed name is a ValueError."""
    if not isinstance(name, str):
        raise TypeError(f"a dataset name must be a str, got {name!r}")
    match = _NAME.match(name.strip())
    if match is None:
        raise ValueError(f"malformed dataset name {name!r}: expected 'name', 'name/config', 'name:1.2.3' or "
                         "'name/config:1.*.*' (lower-case name; version MAJOR.MINOR.PATCH, '*' for any)")
    return match["name"], match["config"], match["version"]


def _prepared_versions(directory: str) -> list[Version]:
    found = []
    if os.path.isdir(directory):
        for entry in os.listdir(directory):
            if os.path.exists(os.path.join(directory, entry, DATASET_INFO_FILENAME)):
                try:
                    found.append(Version(entry))
                except ValueError:
                    continue
    return sorted(found, reverse=True)


def builder(name: str, *, data_dir: Optional[str] = None, **builder_kwargs: Any) -> DatasetBuilder:
    """The builder of ``name`` (``dataset[/config][:version]``); see the module docstring.

    Example::

        >>> b = builder("shapes:1.0.0", data_dir="/tmp/datasets")
        >>> b.download_and_prepare()
        >>> b.info.splits["train"].num_examples
        6000
    """
    _import_builtin()
    dataset, config, version = parse_name(name)
    root = os.path.expanduser(os.fspath(data_dir)) if data_dir else default_data_dir()
    cls = _REGISTRY.get(dataset)
    if cls is not None:
        return cls(data_dir=root, config=config, version=version, **builder_kwargs)
    directory = os.path.join(root, dataset, *([config] if config else []))
    available = _prepared_versions(directory)
    if not available:
        raise DatasetNotFoundError(f"no dataset named {dataset!r}: it is not registered (registered: "
                         f"{', '.join(sorted(_REGISTRY))}) and nothing is prepared in {directory}")
    chosen = resolve_version(version, available[0], available[1:], dataset=f"{dataset}"
                             + (f"/{config}" if config else "") + f" (prepared in {directory})")
    return ReadOnlyBuilder(os.path.join(directory, str(chosen)))


def builder_from_directory(directory: str) -> ReadOnlyBuilder:
    """A builder reading the prepared ``directory`` (``.../name[/config]/version``) with no builder code."""
    return ReadOnlyBuilder(directory)


def load(name: str, split: Any = None, data_dir: Optional[str] = None, batch_size: Optional[int] = None,
         shuffle_files: bool = False, as_supervised: bool = False, with_info: bool = False,
         read_config: Optional[ReadConfig] = None, download: bool = True,
         builder_kwargs: Optional[dict] = None) -> Any:
    """The dataset ``name``, prepared first if need be, as a Dataset (or several; see ``as_dataset``).

    ``split``: ``"train"``, ``"train[:10%]+train[-80%:]"``, a ``ReadInstruction``, a list of them
    (a list of datasets back) or None (a dict of every split). ``download=False`` raises instead of
    preparing, listing the prepared versions. ``with_info=True`` returns ``(dataset, info)``.

    Example::

        >>> train, test = load("shapes", split=["train", "test"], data_dir="/tmp/datasets")
    """
    b = builder(name, data_dir=data_dir, **(builder_kwargs or {}))
    if not b.is_prepared:
        if not download:
            directory = os.path.dirname(b.data_dir)
            prepared = _prepared_versions(directory)
            raise UnsupportedVersionError(
                f"{name}: version {b.version} is not prepared in {directory} and download=False; prepared "
                f"versions: {', '.join(map(str, prepared)) or 'none'}", dataset=name, requested=str(b.version),
                available=prepared)
        b.download_and_prepare()
    ds = b.as_dataset(split=split, batch_size=batch_size, shuffle_files=shuffle_files, read_config=read_config,
                      as_supervised=as_supervised)
    return (ds, b.info) if with_info else ds


class _NumpyIterable:
    """A Dataset seen as numpy: iterable any number of times, with a length when the dataset has one."""

    def __init__(self, dataset: Dataset):
        self._dataset = dataset

    def __iter__(self) -> Iterator:
        return self._dataset.as_numpy_iterator()

    def __len__(self) -> int:
        return len(self._dataset)

    def __repr__(self) -> str:
        return f"as_numpy({self._dataset!r})"


def as_numpy(value: Any) -> Any:
    """Datasets (alone or in lists, tuples, dicts) as iterables of numpy; numpy values unchanged.

    Example::

        >>> (x_train, y_train), (x_test, y_test) = as_numpy(load("shapes", split=["train", "test"],
        ...                                                    batch_size=-1, as_supervised=True))
    """
    if isinstance(value, Dataset):
        return _NumpyIterable(value)
    if isinstance(value, dict):
        return {k: as_numpy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_numpy(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(as_numpy(v) for v in value)
    return value

