"""What a prepared dataset is: ``DatasetInfo`` and its splits, read from and written to ``dataset_info.json``.

The file is TensorFlow Datasets' own (the proto-JSON of its ``DatasetInfo``
message), so a directory prepared by TFDS describes itself to us and one we
prepare describes itself to TFDS::

    {"name": "mnist", "version": "3.0.1", "fileFormat": "tfrecord",
     "splits": [{"name": "train", "shardLengths": ["30000", "30000"], "numBytes": "20610000",
                 "filepathTemplate": "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"}, ...],
     "supervisedKeys": {"tuple": {"items": [{"featureKey": "image"}, {"featureKey": "label"}]}}, ...}

int64 fields are strings in proto-JSON; we write them so and read either. Fields
we do not model (statistics, download checksums, ...) are kept as read and
written back unchanged, so a round trip loses nothing TFDS put there.

Example::

    >>> info = DatasetInfo.read_from_directory("~/tensorflow_datasets/mnist/3.0.1")
    >>> info.splits["train"].num_examples, info.splits["train"].num_shards
    (60000, 1)
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from typing import Any, Mapping, Optional, Sequence

from dataservice.catalogue.features import FeatureConnector, FeaturesDict, load_features, save_features
from dataservice.catalogue.versions import Version

__all__ = ["DatasetInfo", "SplitDict", "SplitInfo", "DATASET_INFO_FILENAME", "DEFAULT_FILEPATH_TEMPLATE"]

DATASET_INFO_FILENAME = "dataset_info.json"
#: How TFDS names shard files when a split does not say (and how we name ours).
DEFAULT_FILEPATH_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """One split of a prepared dataset: its shards' lengths, in order, and their size.

    Example::

        >>> s = SplitInfo("train", shard_lengths=(8, 9, 8), num_bytes=750)
        >>> s.num_examples, s.num_shards
        (25, 3)
    """

    name: str
    shard_lengths: tuple[int, ...]
    num_bytes: int = 0
    filepath_template: str = DEFAULT_FILEPATH_TEMPLATE

    @property
    def num_examples(self) -> int:
        return sum(self.shard_lengths)

    @property
    def num_shards(self) -> int:
        return len(self.shard_lengths)

    def filenames(self, dataset_name: str, file_format: str = "tfrecord") -> list[str]:
        """The shard files' names (no directory), in order, from the split's template."""
        n = self.num_shards
        names = []
        for index in range(n):
            names.append(self.filepath_template.format_map(_TemplateFields(
                DATASET=dataset_name, SPLIT=self.name, FILEFORMAT=file_format,
                SHARD_INDEX=f"{index:05d}", NUM_SHARDS=f"{n:05d}", SHARD_X_OF_Y=f"{index:05d}-of-{n:05d}")))
        return names


class _TemplateFields(dict):
    def __missing__(self, key: str) -> str:
        raise ValueError(f"unknown field {{{key}}} in a split's filepathTemplate; known: "
                         f"{', '.join('{' + k + '}' for k in sorted(self))}")


class SplitDict(dict):
    """The splits of a dataset by name, as ``info.splits``; ``info.splits["train"].num_examples``."""

    @property
    def total_num_examples(self) -> int:
        return sum(s.num_examples for s in self.values())

    def __missing__(self, key: str) -> SplitInfo:
        raise KeyError(f"no split {key!r}; the splits are: {', '.join(self) or '(none: not prepared)'}")


class DatasetInfo:
    """A dataset's description: features, splits, supervised keys, version; what ``_info()`` returns.

    A builder passes itself as ``builder=`` (name, version and config come from it); the splits are
    filled in by preparation, or read back from ``dataset_info.json``.

    Example::

        >>> def _info(self):
        ...     return DatasetInfo(builder=self, features=FeaturesDict({"x": Tensor(shape=(), dtype=np.int64)}),
        ...                        supervised_keys=("x", "x"), description="integers")
    """

    def __init__(self, *, builder: Any = None, features: Optional[FeatureConnector] = None,
                 supervised_keys: Any = None, description: str = "", homepage: str = "", citation: str = "",
                 name: Optional[str] = None, version: Any = None, config_name: str = "",
                 config_description: str = "", release_notes: Optional[Mapping[str, str]] = None):
        if builder is not None:
            name = name or builder.name
            version = version or builder.version
            config = getattr(builder, "builder_config", None)
            if config is not None:
                config_name = config_name or config.name
                config_description = config_description or (config.description or "")
            release_notes = release_notes if release_notes is not None else getattr(builder, "RELEASE_NOTES", None)
        if name is None:
            raise ValueError("DatasetInfo needs builder= (or name=)")
        if features is not None and not isinstance(features, FeatureConnector):
            if isinstance(features, dict):
                features = FeaturesDict(features)
            else:
                raise TypeError(f"features must be a FeatureConnector (e.g. FeaturesDict), got {features!r}")
        self.name = name
        self.version = Version(version) if version is not None else None
        self.features = features
        self.supervised_keys = _check_supervised_keys(supervised_keys)
        self.description = description
        self.homepage = homepage
        self.citation = citation
        self.config_name = config_name
        self.config_description = config_description
        self.release_notes = dict(release_notes or {})
        self.file_format = "tfrecord"
        self.module_name = type(builder).__module__ if builder is not None else ""
        self.splits = SplitDict()
        self.data_dir: Optional[str] = None
        self._extra: dict = {}  # fields of a read file we do not model, written back unchanged

    def __repr__(self) -> str:
        splits = ", ".join(f"{s.name}: {s.num_examples}" for s in self.splits.values())
        return f"DatasetInfo(name={self.name!r}, version={self.version}, splits={{{splits}}})"

    @property
    def full_name(self) -> str:
        """``name[/config]/version``: the dataset's directory under a data_dir."""
        parts = [self.name] + ([self.config_name] if self.config_name else []) + [str(self.version)]
        return "/".join(parts)

    @property
    def dataset_size(self) -> int:
        """Bytes of all splits' records on disk (what autocaching compares with 250 MiB); 0 if unknown."""
        return sum(s.num_bytes for s in self.splits.values())

    def set_splits(self, splits: Sequence[SplitInfo]) -> None:
        self.splits = SplitDict((s.name, s) for s in splits)

    # --- dataset_info.json ---------------------------------------------------------
    def to_json(self) -> dict:
        doc: dict = copy.deepcopy(self._extra)
        doc.update({"name": self.name, "version": str(self.version), "fileFormat": self.file_format})
        if self.module_name:
            doc["moduleName"] = self.module_name
        for key, value in (("description", self.description), ("citation", self.citation),
                           ("configName", self.config_name), ("configDescription", self.config_description)):
            if value:
                doc[key] = value
        if self.homepage:
            doc["location"] = {"urls": [self.homepage]}
        if self.release_notes:
            doc["releaseNotes"] = dict(self.release_notes)
        doc["splits"] = [{"name": s.name, "numBytes": str(s.num_bytes),
                          "shardLengths": [str(n) for n in s.shard_lengths],
                          "filepathTemplate": s.filepath_template} for s in self.splits.values()]
        if self.supervised_keys is not None:
            doc["supervisedKeys"] = {"tuple": {"items": [_supervised_item(k) for k in self.supervised_keys]}}
        return doc

    def write_to_directory(self, directory: str) -> None:
        """Writes ``dataset_info.json``, ``features.json`` and label files into ``directory``."""
        with open(os.path.join(directory, DATASET_INFO_FILENAME), "w") as f:
            json.dump(self.to_json(), f, indent=2, sort_keys=True)
        if self.features is not None:
            save_features(self.features, directory)

    @classmethod
    def read_from_directory(cls, directory: str) -> "DatasetInfo":
        """The info of a prepared dataset directory (``name[/config]/version``), TFDS's or ours.

        Raises FileNotFoundError naming the directory when it holds no ``dataset_info.json``.
        """
        directory = os.path.expanduser(os.fspath(directory))
        path = os.path.join(directory, DATASET_INFO_FILENAME)
        try:
            with open(path) as f:
                doc = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"{directory} is not a prepared dataset: it has no {DATASET_INFO_FILENAME}") \
                from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from exc
        features = None
        if os.path.exists(os.path.join(directory, "features.json")):
            features = load_features(directory)
        info = cls(name=doc.get("name") or os.path.basename(os.path.dirname(directory)),
                   version=doc.get("version") or os.path.basename(directory), features=features,
                   supervised_keys=_read_supervised_keys(doc.get("supervisedKeys")),
                   description=doc.get("description", ""), citation=doc.get("citation", ""),
                   homepage=(doc.get("location") or {}).get("urls", [""])[0],
                   config_name=doc.get("configName", ""), config_description=doc.get("configDescription", ""),
                   release_notes=doc.get("releaseNotes"))
        info.file_format = doc.get("fileFormat") or "tfrecord"
        info.module_name = doc.get("moduleName", "")
        info.set_splits([_read_split(s, path) for s in doc.get("splits", [])])
        info.data_dir = directory
        modelled = {"name", "version", "fileFormat", "moduleName", "description", "citation", "configName",
                    "configDescription", "location", "releaseNotes", "splits", "supervisedKeys"}
        info._extra = {k: v for k, v in doc.items() if k not in modelled}
        return info


def _read_split(doc: Mapping, path: str) -> SplitInfo:
    try:
        lengths = tuple(int(n) for n in doc.get("shardLengths", []))
        return SplitInfo(name=doc["name"], shard_lengths=lengths, num_bytes=int(doc.get("numBytes", 0)),
                         filepath_template=doc.get("filepathTemplate") or DEFAULT_FILEPATH_TEMPLATE)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: a split entry is malformed ({exc!r}): {doc!r}") from exc


def _supervised_item(key: Any) -> dict:
    if isinstance(key, str):
        return {"featureKey": key}
    if isinstance(key, tuple):
        return {"tuple": {"items": [_supervised_item(k) for k in key]}}
    if isinstance(key, dict):
        return {"dict": {"dict": {name: _supervised_item(k) for name, k in key.items()}}}
    raise TypeError(f"supervised_keys entries must be feature names, tuples or dicts of them, got {key!r}")


def _read_supervised_item(doc: Mapping) -> Any:
    if "featureKey" in doc:
        return doc["featureKey"]
    if "tuple" in doc:
        return tuple(_read_supervised_item(d) for d in doc["tuple"].get("items", []))
    if "dict" in doc:
        return {k: _read_supervised_item(d) for k, d in doc["dict"].get("dict", {}).items()}
    raise ValueError(f"unreadable supervisedKeys entry: {doc!r}")


def _read_supervised_keys(doc: Optional[Mapping]) -> Any:
    if not doc:
        return None
    if "input" in doc or "output" in doc:  # the form TFDS wrote before 4.0
        return (doc.get("input"), doc.get("output"))
    return _read_supervised_item(doc)


def _check_supervised_keys(keys: Any) -> Any:
    if keys is None:
        return None
    if isinstance(keys, list):
        keys = tuple(keys)
    if not isinstance(keys, tuple) or len(keys) not in (2, 3):
        raise ValueError(f"supervised_keys must be a tuple (input, label[, weight]), got {keys!r}")
    _supervised_item(keys)  # checks the nesting
    return keys
