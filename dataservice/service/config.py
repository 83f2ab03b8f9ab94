"""Dispatcher and worker configuration: frozen, validated dataclasses.

Durations carry their unit in the name. ``None`` means the documented default
(resolved in the constructor, so a config always shows the values in force).

Example::

    >>> DispatcherConfig(port=5050, work_dir="/var/lib/ds", fault_tolerant_mode=True)
    >>> WorkerConfig(dispatcher_address="grpc://localhost:5050", heartbeat_interval_ms=500)
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from dataservice.service.addresses import channel_address

__all__ = ["DispatcherConfig", "WorkerConfig", "DATA_TRANSFER_PROTOCOLS"]

_PROTOCOLS = ("grpc",)
#: How a worker may send elements (``WorkerConfig.data_transfer_protocol``).
DATA_TRANSFER_PROTOCOLS = ("tcp", "grpc")


def _check_port(port: int) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port < 65536:
        raise ValueError(f"port must be an int in 0..65535 (0 picks a free port), got {port!r}")


def _check_protocol(protocol: str) -> None:
    if protocol not in _PROTOCOLS:
        raise ValueError(f"protocol must be one of {_PROTOCOLS}, got {protocol!r}")


def _positive_ms(config, name: str, default: int) -> None:
    value = getattr(config, name)
    if value is None:
        object.__setattr__(config, name, default)
        return
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive number of milliseconds, got {value!r}")


@dataclasses.dataclass(frozen=True)
class DispatcherConfig:
    """Configuration of a dispatcher.

    Attributes:
      port: port to listen on; 0 picks a free one (see ``DispatchServer.target``).
      protocol: "grpc".
      work_dir: directory for the journal; required by ``fault_tolerant_mode``.
      fault_tolerant_mode: journal every state change to ``work_dir`` and replay it on start.
      job_gc_check_interval_ms: how often to look for jobs to collect (default 60 s).
      job_gc_timeout_ms: a job no client has read for this long is collected (default 5 min).
      worker_timeout_ms: a worker silent for this long is considered lost (default 10 s).
      client_timeout_ms: a client silent for this long is considered gone (default 60 s).
    """

    port: int = 0
    protocol: str = "grpc"
    work_dir: Optional[str] = None
    fault_tolerant_mode: bool = False
    job_gc_check_interval_ms: Optional[int] = None
    job_gc_timeout_ms: Optional[int] = None
    worker_timeout_ms: Optional[int] = None
    client_timeout_ms: Optional[int] = None

    def __post_init__(self) -> None:
        _check_port(self.port)
        _check_protocol(self.protocol)
        if self.fault_tolerant_mode and not self.work_dir:
            raise ValueError("fault_tolerant_mode=True requires work_dir: set work_dir to a directory "
                             "the dispatcher can write its journal to")
        _positive_ms(self, "job_gc_check_interval_ms", 60_000)
        _positive_ms(self, "job_gc_timeout_ms", 300_000)
        _positive_ms(self, "worker_timeout_ms", 10_000)
        _positive_ms(self, "client_timeout_ms", 60_000)


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """Configuration of a worker.

    Attributes:
      dispatcher_address: the dispatcher, as "host:port" or "grpc://host:port".
      worker_address: the address clients use to reach this worker; "%port%" is
        replaced by the bound port (default "localhost:%port%").
      port: port to listen on; 0 picks a free one.
      protocol: "grpc".
      heartbeat_interval_ms: the longest a worker goes without telling the dispatcher
        its state (default 1 s). New tasks arrive at once regardless: the heartbeat
        is a long poll the dispatcher answers early when it has news.
      dispatcher_timeout_ms: how long the worker keeps retrying an unreachable
        dispatcher before giving up on a call (default 60 s).
      data_transfer_protocol: how elements travel to clients: "tcp" (default: a plain
        socket fed straight from numpy buffers; a client on this host copies large
        arrays straight from the worker's memory instead) or "grpc" (through the gRPC port).
      data_transfer_port: the TCP data-transfer port; 0 picks a free one.
    """

    dispatcher_address: str
    worker_address: Optional[str] = None
    port: int = 0
    protocol: str = "grpc"
    heartbeat_interval_ms: Optional[int] = None
    dispatcher_timeout_ms: Optional[int] = None
    data_transfer_protocol: str = "tcp"
    data_transfer_port: int = 0

    def __post_init__(self) -> None:
        channel_address(self.dispatcher_address, "dispatcher")
        _check_port(self.port)
        _check_port(self.data_transfer_port)
        if self.data_transfer_protocol not in DATA_TRANSFER_PROTOCOLS:
            raise ValueError(f"data_transfer_protocol must be one of {DATA_TRANSFER_PROTOCOLS}, "
                             f"got {self.data_transfer_protocol!r}")
        _check_protocol(self.protocol)
        if self.worker_address is None:
            object.__setattr__(self, "worker_address", "localhost:%port%")
        elif not isinstance(self.worker_address, str) or not self.worker_address:
            raise ValueError(f"worker_address must be 'host:port' (may contain %port%), got {self.worker_address!r}")
        _positive_ms(self, "heartbeat_interval_ms", 1_000)
        _positive_ms(self, "dispatcher_timeout_ms", 60_000)
