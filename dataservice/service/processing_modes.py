"""The processing modes' names, shared by the client, the dispatcher, the workers and ``dataservice status``.

``parallel_epochs`` and ``distributed_epoch`` are tf.data service's original names (``ShardingPolicy.OFF``
and ``DYNAMIC``); the four static sharding policies (``ShardingPolicy.FILE``, ``DATA``, ``FILE_OR_DATA``,
``HINT``) are named after their ``state.proto`` values. A static mode needs the dispatcher's fixed worker
list (``DispatcherConfig.worker_addresses``); each listed worker produces its own shard
(``dataservice/data/static_sharding.py``).

Example::

    >>> MODE_NAMES[state_pb2.SHARD_FILE]
    'shard_file'
    >>> is_static(state_pb2.SHARD_DATA), is_static(state_pb2.PARALLEL_EPOCHS)
    (True, False)
"""

from __future__ import annotations

from dataservice.proto import state_pb2

__all__ = ["MODE_NAMES", "MODES_BY_NAME", "STATIC_MODES", "is_static", "mode_name", "elastic_reader_id"]

#: Every processing mode a job may have, by its proto value.
MODE_NAMES = {
    state_pb2.PARALLEL_EPOCHS: "parallel_epochs",
    state_pb2.DISTRIBUTED_EPOCH: "distributed_epoch",
    state_pb2.SHARD_FILE: "shard_file",
    state_pb2.SHARD_DATA: "shard_data",
    state_pb2.SHARD_FILE_OR_DATA: "shard_file_or_data",
    state_pb2.SHARD_HINT: "shard_hint",
}
MODES_BY_NAME = {name: mode for mode, name in MODE_NAMES.items()}

#: The static sharding modes: one task per listed worker, each producing its shard of the pipeline.
STATIC_MODES = frozenset({state_pb2.SHARD_FILE, state_pb2.SHARD_DATA, state_pb2.SHARD_FILE_OR_DATA,
                          state_pb2.SHARD_HINT})


def is_static(mode: int) -> bool:
    """Whether ``mode`` is a static sharding mode (needs ``DispatcherConfig.worker_addresses``)."""
    return mode in STATIC_MODES


def mode_name(mode: int) -> str:
    """The mode's name, or its number for a mode this version does not know."""
    return MODE_NAMES.get(mode, str(mode))


def elastic_reader_id(reader_index: int) -> str:
    """The trainer id elastic reader ``reader_index`` (``distribute(..., num_readers=N, reader_index=i)``) reads
    a task's lossless window as (``worker/trainer_cache.TrainerCache(readers=N)``; GetElementsRequest.trainer_id).

    Example::

        >>> elastic_reader_id(2)
        'reader-2'
    """
    return f"reader-{reader_index}"
