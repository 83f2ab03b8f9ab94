"""dataservice: a distributed data service for machine-learning input pipelines.

Write a pipeline with :class:`Dataset` (the tf.data API, for Python and numpy)
and run it locally, or on a cluster of workers through ``distribute()``.

Example::

    >>> import dataservice as ds
    >>> [int(x) for x in ds.Dataset.range(5).filter(lambda x: x % 2 == 0)]
    [0, 2, 4]
"""

# ruff: noqa: E402  (the imports below must come after import_grpc(), which must precede grpc's import)

from dataservice.grpc_startup import import_grpc as _import_grpc

_import_grpc()  # before anything of ours imports grpc: see dataservice.grpc_startup

from dataservice import errors

#: Where each public name is defined. ``import dataservice`` imports none of them: each is imported on
#: first use (PEP 562 ``__getattr__`` below), so the ``dataservice`` command's cheap subcommands
#: (``--version``, ``health``, ``status``), which import the package first, skip the pipeline library,
#: numpy and the servers they never use. ``from dataservice import X`` and ``dataservice.X`` work as if
#: the names were imported here.
_PUBLIC_HOMES = {
    "AUTOTUNE": "dataservice.data",
    "CrossTrainerCache": "dataservice.client.distribute",
    "Dataset": "dataservice.data",
    "DispatchServer": "dataservice.dispatcher.server",
    "DispatcherConfig": "dataservice.service.config",
    "FixedLengthRecordDataset": "dataservice.data",
    "INFINITE_CARDINALITY": "dataservice.data",
    "Options": "dataservice.data",
    "SHARD_HINT": "dataservice.data.static_sharding",
    "ShardingPolicy": "dataservice.client.distribute",
    "SqlDataset": "dataservice.data",
    "TFRecordDataset": "dataservice.data",
    "TFRecordWriter": "dataservice.data",
    "TensorSpec": "dataservice.data",
    "TextLineDataset": "dataservice.data",
    "ThreadingOptions": "dataservice.data",
    "UNKNOWN_CARDINALITY": "dataservice.data",
    "WorkerConfig": "dataservice.service.config",
    "WorkerServer": "dataservice.worker.server",
    "distribute": "dataservice.client.distribute",
    "distributed_save": "dataservice.client.distributed_save",
    "from_dataset_id": "dataservice.client.distribute",
    "load": "dataservice.data.saved",
    "register_dataset": "dataservice.client.distribute",
    "save": "dataservice.data.saved",
    "ship_by_reference": "dataservice.data.code_shipping",
    "ship_by_value": "dataservice.data.code_shipping",
    "shuffle_and_repeat": "dataservice.data",
    "snapshot": "dataservice.data.snapshots",
}
#: Subpackages bound on first use too: ``import dataservice`` used to import these, so code that
#: reaches ``dataservice.data.experimental`` through the package alone keeps working.
_SUBPACKAGES = frozenset({"catalogue", "client", "data", "dispatcher", "proto", "service", "worker"})

__version__ = "0.1.0"

__all__ = [
    "AUTOTUNE",
    "CrossTrainerCache",
    "Dataset",
    "DispatchServer",
    "DispatcherConfig",
    "FixedLengthRecordDataset",
    "INFINITE_CARDINALITY",
    "Options",
    "SHARD_HINT",
    "ShardingPolicy",
    "SqlDataset",
    "TFRecordDataset",
    "TFRecordWriter",
    "TensorSpec",
    "TextLineDataset",
    "ThreadingOptions",
    "UNKNOWN_CARDINALITY",
    "WorkerConfig",
    "WorkerServer",
    "catalogue",
    "distribute",
    "distributed_save",
    "errors",
    "from_dataset_id",
    "load",
    "register_dataset",
    "save",
    "ship_by_reference",
    "ship_by_value",
    "shuffle_and_repeat",
    "snapshot",
]


def __getattr__(name: str) -> object:
    """Imports a public name on first use (PEP 562), then keeps it in the module's namespace.

    Example::

        >>> import dataservice
        >>> dataservice.Dataset.__module__       # dataservice.data.dataset is imported here
        'dataservice.data.dataset'
    """
    import importlib

    if name in _SUBPACKAGES:
        return importlib.import_module(f"dataservice.{name}")  # which binds it here
    home = _PUBLIC_HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'dataservice' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
