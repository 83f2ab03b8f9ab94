"""``distributed_save``: the service's workers write a dataset to a directory in parallel, as
tf.data service's ``tf.data.experimental.distributed_save``.

The call registers the pipeline, asks the dispatcher to start the save and returns at once. The
dispatcher hands the pipeline's split groups (``Dataset.split_groups``) to the workers; each group
becomes one chunk, committed by an atomic rename. ``DONE`` appears in the directory once every chunk
is committed (with ``metadata.json``: ``load(path)`` reads it like a ``Dataset.save``), ``ERROR`` with
the reason if the pipeline failed. ``load(path, wait=True)`` reads the chunks while they are written.
The directory must be on a file system the dispatcher and every worker share.

Example::

    >>> distributed_save(Dataset.range(1000).map(lambda x: x * 2), "/shared/saves/doubled", dispatcher.target)
    >>> sorted(int(x) for x in load("/shared/saves/doubled", wait=True))[:3]
    [0, 2, 4]
"""

from __future__ import annotations

import os
from typing import Any, Optional

from dataservice.client.distribute import _num_splits, _parse_service, _parse_timeout
from dataservice.data import save_format, specs
from dataservice.data.dataset import INFINITE_CARDINALITY, Dataset
from dataservice.data.serialization import serialize_dataset
from dataservice.service.auth import ClusterAuth
from dataservice.service.dispatcher_client import DispatcherClient
from dataservice.service.tls import TlsSettings

__all__ = ["distributed_save"]


def distributed_save(dataset: Dataset, path: Any, service: str, compression: Optional[str] = "AUTO",
                     timeout_ms: int = 60_000, auth_token: Optional[str] = None, tls_ca: Optional[str] = None,
                     tls_cert: Optional[str] = None, tls_key: Optional[str] = None) -> None:
    """Starts saving ``dataset`` into the directory ``path`` through the service at ``service``; returns at
    once (see the module docstring). ``compression``: "AUTO" (LZ4), "GZIP", "ZLIB", "LZ4", "ZSTD" or None.
    ``path`` must not exist or be empty: a path that holds a save, started or completed, raises
    ``errors.AlreadyExistsError`` (as tf.data service). Progress: ``dataservice save-status PATH``.

    Example::

        >>> distributed_save(Dataset.range(10), "/shared/saves/r10", "grpc://dispatcher:5050")
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"distributed_save expects a Dataset, got {type(dataset).__name__}")
    if not isinstance(path, (str, bytes, os.PathLike)) or not os.fsdecode(path):
        raise TypeError(f"path must be a non-empty str path, got {path!r}")
    address = _parse_service(service)
    _parse_timeout(timeout_ms)
    codec = save_format.resolve_compression(compression)
    if dataset.cardinality() == INFINITE_CARDINALITY:
        raise ValueError(f"distributed_save: {dataset._describe()} is infinite; take() a finite part to save it")
    directory = os.path.abspath(os.fsdecode(path))
    spec, _ = specs.static_element_spec(dataset)
    encoded_spec = specs.encode(spec).SerializeToString() if spec is not None else b""
    blob = serialize_dataset(dataset)
    client = DispatcherClient(address, timeout_ms=timeout_ms, auth=ClusterAuth.resolve(auth_token),
                              tls=TlsSettings.resolve(tls_ca, tls_cert, tls_key))
    try:
        dataset_id = client.register_dataset(blob, _num_splits(dataset))
        client.distributed_save(dataset_id, directory, codec or "", encoded_spec)
    finally:
        client.close()
