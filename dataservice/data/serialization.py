"""Pipelines to bytes and back, with cloudpickle.

A pipeline carries user code (lambdas, closures, helpers, classes). Code from
the user's own modules — files beside the script, a project checkout,
``__main__`` — travels by value, recursively; installed libraries travel by
reference (``dataservice.data.code_shipping`` says which is which). The bytes
are a ``PipelineDef``: the pickle, the client's versions of Python,
cloudpickle, numpy and dataservice, the names of the modules shipped by
value, the source text of the files that code comes from (so that a
worker's traceback shows the user's lines: ``dataservice.data.shipped_source``),
and the pipeline's element_spec where it is known without running any of it
(``registered_element_spec`` reads it back without unpickling). Loading
checks the versions first (``dataservice.data.environment``) and names a
missing module, so a worker can say what is wrong instead of showing an
unpickling traceback.

Serializing is deterministic: the same code gives the same bytes, in any
process (classes shipped by value get an id derived from the shipped source,
not cloudpickle's random one), so the dataset id — a fingerprint of the bytes
— is stable across runs and changes when any shipped code changes.

When something in a pipeline cannot be pickled, the error names the offending
object and where it hangs in the pipeline.

Example::

    >>> blob = serialize_dataset(Dataset.range(3).map(lambda x: x + 1))
    >>> [int(x) for x in deserialize_dataset(blob)]
    [1, 2, 3]
"""

from __future__ import annotations

import hashlib
import io
import pickle
import sys
import threading
import types
from typing import Any, Iterator

import cloudpickle
from google.protobuf.message import DecodeError

from dataservice import errors
from dataservice.data import specs
from dataservice.data.code_shipping import is_shipped_by_value, shipped_modules, source_digest
from dataservice.data.dataset import UNKNOWN_CARDINALITY, Dataset
from dataservice.data.environment import describe_versions, differences, skew, versions
from dataservice.data.shipped_source import reduce_code, register_sources, sources_of
from dataservice.errors import PipelineSerializationError
from dataservice.proto import pipeline_pb2

__all__ = ["serialize_dataset", "deserialize_dataset", "dataset_fingerprint", "registered_element_spec",
           "registered_cardinality"]

# cloudpickle's by-value registry is process-wide: one serialization at a time changes it.
_registry_lock = threading.Lock()


def _tracker_tables():
    # Private to cloudpickle (3.x): the ids that let a process unpickle one dynamic class once.
    module = cloudpickle.cloudpickle
    return (getattr(module, "_DYNAMIC_CLASS_TRACKER_LOCK", None), getattr(module, "_DYNAMIC_CLASS_TRACKER_BY_CLASS", None),
            getattr(module, "_DYNAMIC_CLASS_TRACKER_BY_ID", None))


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, with deterministic ids for the classes it ships by value.

    cloudpickle tags each class it pickles by value with a random id, so the same code would
    give other bytes — another dataset id — in every process. Here a module-level class gets an
    id derived from the digest of all shipped source and its qualified name: the same code gives
    the same id, and a change anywhere in the shipped code gives new ones (so a long-lived worker
    never mistakes a changed class for the one it already loaded).
    """

    def __init__(self, file: io.BytesIO, digest: str):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._digest = digest
        #: The files of the code shipped by value: their source travels with the pipeline.
        self.code_files: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.CodeType):
            reduced = reduce_code(obj)
            if reduced is not NotImplemented:
                self.code_files.add(obj.co_filename)
                return reduced
        elif isinstance(obj, type) and "<locals>" not in obj.__qualname__:
            module = sys.modules.get(obj.__module__)
            if module is not None and is_shipped_by_value(module) and \
                    getattr(module, obj.__qualname__.split(".")[0], None) is not None:
                self._seed_tracker_id(obj)
        return super().reducer_override(obj)

    def _seed_tracker_id(self, cls: type) -> None:
        lock, by_class, by_id = _tracker_tables()
        if lock is None or by_class is None or by_id is None:
            return  # another cloudpickle: ids stay random, dataset ids differ per process
        tracker_id = hashlib.sha256(f"{self._digest}:{cls.__module__}:{cls.__qualname__}".encode()).hexdigest()[:32]
        with lock:
            by_class[cls] = tracker_id
            by_id[tracker_id] = cls


def serialize_dataset(dataset: Dataset) -> bytes:
    """Serializes a pipeline; raises PipelineSerializationError naming what failed."""
    if not isinstance(dataset, Dataset):
        raise TypeError(f"expected a Dataset, got {type(dataset).__name__}")
    with _registry_lock:
        modules = shipped_modules()
        registered = cloudpickle.list_registry_pickle_by_value()
        added = [m for m in modules if m.__name__ not in registered]
        for module in added:
            cloudpickle.register_pickle_by_value(module)
        try:
            buffer = io.BytesIO()
            pickler = _Pickler(buffer, source_digest(modules))
            try:
                pickler.dump(dataset)
            except Exception as exc:
                culprit = _find_culprit(dataset)
                raise PipelineSerializationError(
                    f"cannot serialize the pipeline: {culprit or 'an object in it'} "
                    f"cannot be pickled ({type(exc).__name__}: {exc})") from exc
        finally:
            for module in added:
                cloudpickle.unregister_pickle_by_value(module)
    definition = pipeline_pb2.PipelineDef(pipeline=buffer.getvalue(), versions=versions(),
                                          shipped_modules=[m.__name__ for m in modules],
                                          sources=sources_of(pickler.code_files))
    _record_element_spec(definition, dataset)
    definition.cardinality = dataset.cardinality()
    return definition.SerializeToString(deterministic=True)


def _record_element_spec(definition: pipeline_pb2.PipelineDef, dataset: Dataset) -> None:
    # Only the static spec: registering never reads an element or calls a user function, and the
    # bytes (so the dataset id) are the same whether or not element_spec was asked for before.
    spec, why = specs.static_element_spec(dataset)
    if spec is not None:
        try:
            definition.element_spec.CopyFrom(specs.encode(spec))
            return
        except ValueError as exc:
            why = f"it cannot be recorded: {exc}"
    definition.element_spec_unknown = why


def registered_element_spec(blob: bytes, dataset: str = "the dataset") -> Any:
    """The element_spec recorded in a serialized pipeline, read from the proto alone: the pipeline
    is not unpickled, so the reading process needs none of its modules.

    Raises ValueError, saying why, when the spec was not known without running the pipeline.

    Example::

        >>> registered_element_spec(serialize_dataset(Dataset.range(3).batch(2)))
        TensorSpec(shape=(None,), dtype=int64, name=None)
    """
    try:
        definition = pipeline_pb2.PipelineDef.FromString(blob)
    except DecodeError as exc:
        raise ValueError(f"{dataset}: not a serialized dataservice pipeline: {exc}") from exc
    if definition.HasField("element_spec"):
        return specs.decode(definition.element_spec)
    why = definition.element_spec_unknown or "it was registered by a version of dataservice that did not record it"
    raise ValueError(f"the element_spec of {dataset} is not known without running its pipeline: {why}. Pass "
                     "element_spec= to from_dataset_id, or declare it in the pipeline (map(..., "
                     "output_signature=...), from_generator(..., output_signature=...)).")


def registered_cardinality(blob: bytes) -> int:
    """The cardinality recorded in a serialized pipeline (UNKNOWN_CARDINALITY if none was), read from
    the proto alone.

    Example::

        >>> registered_cardinality(serialize_dataset(Dataset.range(3).repeat()))
        -1
    """
    try:
        definition = pipeline_pb2.PipelineDef.FromString(blob)
    except DecodeError:
        return UNKNOWN_CARDINALITY
    return definition.cardinality if definition.HasField("cardinality") else UNKNOWN_CARDINALITY


def deserialize_dataset(blob: bytes) -> Dataset:
    """The inverse of :func:`serialize_dataset`.

    Raises ``errors.VersionSkewError`` when this process's versions cannot load what the
    serializing process's versions pickled, ``errors.MissingModuleError`` naming a module
    the pipeline needs and this process cannot import, and ``errors.WorkerEnvironmentError``
    for any other failure to load.
    """
    try:
        definition = pipeline_pb2.PipelineDef.FromString(blob)
    except DecodeError as exc:
        raise errors.WorkerEnvironmentError(f"not a serialized dataservice pipeline: {exc}") from exc
    theirs, mine = dict(definition.versions), versions()
    mismatched = skew(theirs, mine)
    if mismatched:
        raise errors.VersionSkewError(
            f"the pipeline was serialized with {describe_versions(theirs)}; this process has "
            f"{describe_versions(mine)}: {', '.join(mismatched)}", client_versions=theirs, worker_versions=mine)
    try:
        dataset = cloudpickle.loads(definition.pipeline)
    except ModuleNotFoundError as exc:
        raise errors.MissingModuleError(f"the pipeline needs module {exc.name!r}, which cannot be imported here",
                                        module=exc.name or "") from exc
    except (Exception, SystemExit) as exc:
        # SystemExit too: user code run while unpickling (a module's top level) may call sys.exit(),
        # and on a worker it would pass every handler and end the heartbeat thread for good.
        differ = differences(theirs, mine)
        if differ:
            raise errors.VersionSkewError(
                f"the pipeline cannot be loaded ({type(exc).__name__}: {exc}), and versions differ: "
                f"{', '.join(differ)}", client_versions=theirs, worker_versions=mine) from exc
        raise errors.WorkerEnvironmentError(f"the pipeline cannot be loaded: {type(exc).__name__}: {exc}") from exc
    if not isinstance(dataset, Dataset):
        raise errors.WorkerEnvironmentError(f"the serialized object is a {type(dataset).__name__}, not a Dataset")
    register_sources(definition.sources)
    return dataset


def dataset_fingerprint(blob: bytes) -> str:
    """A stable fingerprint of a serialized pipeline (the same bytes, the same id)."""
    return hashlib.sha256(blob).hexdigest()


def _picklable(obj: Any) -> bool:
    try:
        cloudpickle.dumps(obj)
    except Exception:
        return False
    return True


def _walk(dataset: Dataset, path: str) -> Iterator[tuple[str, Any]]:
    for name, value in vars(dataset).items():
        if isinstance(value, Dataset):
            yield from _walk(value, f"{path} -> {value._describe()}")
        elif isinstance(value, tuple) and value and all(isinstance(v, Dataset) for v in value):
            for v in value:
                yield from _walk(v, f"{path} -> {v._describe()}")
        else:
            yield f"{path}.{name.lstrip('_')}", value


def _function_parts(fn: types.FunctionType) -> Iterator[tuple[str, Any]]:
    code = fn.__code__
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            yield f"captured variable {name!r}", cell.cell_contents
        except ValueError:
            continue
    for name in code.co_names:
        if name in fn.__globals__:
            yield f"global {name!r}", fn.__globals__[name]


def _find_culprit(dataset: Dataset) -> str:
    for where, value in _walk(dataset, dataset._describe()):
        if _picklable(value):
            continue
        if isinstance(value, types.FunctionType):
            for part, inner in _function_parts(value):
                if not _picklable(inner):
                    return (f"{part} (a {type(inner).__module__}.{type(inner).__qualname__}) "
                            f"of function {value.__qualname__!r} in {where}")
        return f"{type(value).__module__}.{type(value).__qualname__} at {where}"
    return ""
