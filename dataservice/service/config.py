"""Dispatcher and worker configuration: frozen, validated dataclasses.

Durations carry their unit in the name. ``None`` means the documented default
(resolved in the constructor, so a config always shows the values in force).

Servers listen on loopback unless told otherwise (``host``); listening on other
interfaces needs the cluster's auth token (``auth_token``, or the environment:
``dataservice.service.auth``) or an explicit ``insecure=True``, because anyone
who reaches a dispatcher or a worker can run code on the workers.

Example::

    >>> DispatcherConfig(port=5050, work_dir="/var/lib/ds", fault_tolerant_mode=True)
    >>> WorkerConfig(dispatcher_address="grpc://localhost:5050", heartbeat_interval_ms=500)
    >>> DispatcherConfig(host="0.0.0.0")
    ValueError: the dispatcher would listen on '0.0.0.0' without an auth token: ...
    >>> DispatcherConfig(tls_cert="/etc/ds/server.pem", tls_key="/etc/ds/server.key")   # TLS
    >>> WorkerConfig(dispatcher_address="ds:5050", tls_cert="/etc/ds/w.pem", tls_key="/etc/ds/w.key",
    ...              tls_ca="/etc/ds/ca.pem", tls_client_ca="/etc/ds/ca.pem")          # mutual TLS
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from typing import Optional, Sequence

from dataservice.service.addresses import channel_address
from dataservice.service.auth import resolve_token
from dataservice.service.host_identity import check_host_id
from dataservice.service.tls import TLS_CA_ENV, TlsSettings
from dataservice.service.worker_list import check_worker_addresses

__all__ = ["DispatcherConfig", "WorkerConfig", "DATA_TRANSFER_PROTOCOLS", "DEFAULT_HOST", "is_loopback",
           "bind_address", "COLOCATED_TAG", "check_worker_tags", "worker_tags_problem", "WORKER_TAG_RULE",
           "DEFAULT_DATASET_DEF_BYTES", "MAX_DATASET_DEF_LIMIT_BYTES", "default_memory_budget_bytes"]

_PROTOCOLS = ("grpc",)
#: How a worker may send elements (``WorkerConfig.data_transfer_protocol``).
DATA_TRANSFER_PROTOCOLS = ("tcp", "grpc")


def _check_port(port: int) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port < 65536:
        raise ValueError(f"port must be an int in 0..65535 (0 picks a free port), got {port!r}")


def _check_http_port(port: Optional[int]) -> None:
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 <= port < 65536):
        raise ValueError(f"http_port must be None (no HTTP) or an int in 0..65535 (0 picks a free port), "
                         f"got {port!r}")


def _check_protocol(protocol: str) -> None:
    if protocol not in _PROTOCOLS:
        raise ValueError(f"protocol must be one of {_PROTOCOLS}, got {protocol!r}")


#: The host a server listens on when none is given: this machine only.
DEFAULT_HOST = "localhost"


def is_loopback(host: str) -> bool:
    """Whether ``host`` reaches this machine only ("localhost", 127.0.0.0/8, ::1)."""
    host = host.strip("[]")
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_address(host: str, port: int) -> str:
    """``host:port`` for a listener; "" and "::" mean every interface. "localhost" is 127.0.0.1: gRPC
    would bind it on ::1 as well and start even if another process held 127.0.0.1's port."""
    if host in ("", "::", "[::]"):
        return f"[::]:{port}"
    if host == "localhost":
        return f"127.0.0.1:{port}"
    return f"[{host.strip('[]')}]:{port}" if ":" in host.strip("[]") else f"{host}:{port}"


def _check_access(config, what: str) -> None:
    """Resolves the auth token and the host; refuses to expose an unauthenticated server."""
    object.__setattr__(config, "auth_token", resolve_token(config.auth_token))
    if config.host is None:
        object.__setattr__(config, "host", DEFAULT_HOST)
    elif not isinstance(config.host, str):
        raise ValueError(f"host must be a host name or address to listen on, got {config.host!r}")
    if not is_loopback(config.host) and config.auth_token is None and not config.insecure:
        raise ValueError(
            f"the {what} would listen on {config.host or 'every interface'!r} without an auth token: anyone who "
            f"can reach it could run code on the workers. Set the cluster's token (auth_token=, "
            f"DATASERVICE_AUTH_TOKEN or DATASERVICE_AUTH_TOKEN_FILE; --auth-token-file on the command line), "
            f"or pass insecure=True (--insecure) on a network you trust")


def _positive_ms(config, name: str, default: int) -> None:
    _positive(config, name, default, "milliseconds", None)


#: ``DispatcherConfig.max_dataset_def_bytes`` by default, and the most it may be: a definition travels
#: in one gRPC message (``rpc.MAX_MESSAGE_BYTES``, 64 MiB) and lives in the state and its checkpoints.
DEFAULT_DATASET_DEF_BYTES = 32 * 1024 * 1024
MAX_DATASET_DEF_LIMIT_BYTES = 60 * 1024 * 1024


#: Journal records between two checkpoints of a fault-tolerant dispatcher (``journal.DEFAULT_CHECKPOINT_RECORDS``).
DEFAULT_JOURNAL_CHECKPOINT_RECORDS = 10_000


def _positive(config, name: str, default: int, unit: str, most: Optional[int], allow_zero: bool = False) -> None:
    value = getattr(config, name)
    if value is None:
        object.__setattr__(config, name, default)
        return
    least = 0 if allow_zero else 1
    if not isinstance(value, int) or isinstance(value, bool) or value < least or (most is not None and value > most):
        bound = f" and at most {most}" if most is not None else ""
        raise ValueError(f"{name} must be a{' non-negative' if allow_zero else ' positive'} number of {unit}{bound}, "
                         f"got {value!r}")


#: The worker tag that makes ``target_workers="AUTO"`` readers on the worker's host read from that host only.
COLOCATED_TAG = "COLOCATED"


#: The most tags a worker may carry, and the characters of each: checked by ``WorkerConfig`` and again by the
#: dispatcher on every heartbeat (``worker_tags_problem``), since tags travel in every task definition.
MAX_WORKER_TAGS = 32
MAX_WORKER_TAG_CHARS = 64
# tf.data takes any string as a tag. Refused here only what cannot travel as written: a comma (it separates
# tags in --worker-tags and in `dataservice status`), whitespace around a tag (--worker-tags drops the spaces
# around commas), and line breaks or other unprintable characters (they would break log lines and tables).
WORKER_TAG_RULE = (f"at most {MAX_WORKER_TAGS} tags, each a non-empty string of at most {MAX_WORKER_TAG_CHARS} "
                   f"printable characters, without commas and without whitespace at either end; spaces inside a tag "
                   f"are fine (say, 'COLOCATED', 'zone-a' or 'Unused tag 1')")


def worker_tags_problem(tags: Sequence) -> Optional[str]:
    """What is wrong with ``tags`` (a sequence) as a worker's tags (``WORKER_TAG_RULE``), or None if nothing.

    Example::

        >>> worker_tags_problem(["COLOCATED", "Unused tag 1"]) is None, worker_tags_problem(["a,b"])
        (True, "the tag 'a,b'")
    """
    if len(tags) > MAX_WORKER_TAGS:
        return f"{len(tags)} tags, more than {MAX_WORKER_TAGS}"
    for tag in tags:
        if not isinstance(tag, str) or not tag or len(tag) > MAX_WORKER_TAG_CHARS \
                or "," in tag or tag != tag.strip() or not tag.isprintable():
            shown = repr(tag) if not isinstance(tag, str) or len(tag) <= 80 else f"{tag[:60]!r}..."
            return f"the tag {shown}"
    return None


def check_worker_tags(tags) -> tuple:
    """``WorkerConfig.worker_tags`` as a tuple, each tag checked: they travel comma-separated on the command
    line and in task definitions to every reader."""
    if isinstance(tags, str):
        listed = [t for t in tags.split(",") if t]
        raise ValueError(f"worker_tags must be a list of tags, not one string: worker_tags={listed!r} "
                         f"(or --worker-tags {tags} on the command line)")
    try:
        tags = tuple(tags)
    except TypeError:
        raise ValueError(f"worker_tags must be a list of strings, got {tags!r}") from None
    problem = worker_tags_problem(tags)
    if problem is not None:
        raise ValueError(f"worker_tags: {problem} in {list(tags)!r}: a worker has {WORKER_TAG_RULE}; split a list "
                         f"into separate tags, and drop empty ones")
    return tags


#: ``WorkerConfig.cross_trainer_cache_size_bytes`` by default (capped at half the memory budget): a window of
#: thousands of typical batches, so that trainers running at similar speeds share nearly every element,
#: without holding gigabytes per task (tf.data's default, 10 GB, assumes a host dedicated to the service).
DEFAULT_CROSS_TRAINER_CACHE_BYTES = 256 * 1024 * 1024
#: Each worker process's shared batch segments (WorkerConfig.shared_batch_bytes; worker.shared_batches).
DEFAULT_SHARED_BATCH_BYTES = 256 * 1024 * 1024


def default_memory_budget_bytes() -> int:
    """A worker's default budget for buffered elements: a quarter of the host's memory (1 GiB
    if it cannot be read), so several workers and the pipelines themselves fit beside it."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 30
    return max(64 << 20, total // 4)


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
      host: the interface to listen on (default "localhost": this machine only; "0.0.0.0" or
        "::" for every interface, which needs ``auth_token`` or ``insecure``).
      auth_token: the cluster's shared secret; every call must carry it. None reads
        DATASERVICE_AUTH_TOKEN, then the file named by DATASERVICE_AUTH_TOKEN_FILE.
      insecure: allow listening beyond loopback without a token (a warning on every start).
      tls_cert, tls_key: PEM files of the server's certificate and key: its port then speaks TLS only
        (``dataservice.service.tls``); clients verify it with the CA that signed it.
      tls_client_ca: PEM file of a CA: with it, every client must present a certificate it signed
        (mutual TLS). Needs ``tls_cert``.
      tls: the ``TlsSettings`` read from those files (set by the constructor; None without TLS).
      max_dataset_def_bytes: the largest pipeline definition ``register_dataset`` accepts (default
        32 MiB, at most ``MAX_DATASET_DEF_LIMIT_BYTES``): a pipeline that captures a large array
        should read it from a file instead.
      recover_journal: start even though the journal or checkpoint in ``work_dir`` is damaged, from
        what is valid up to the damage, logging what is dropped (an operator's decision: updates
        after the damage are lost). Without it a damaged work_dir refuses to start.
      journal_checkpoint_records: in fault-tolerant mode, journal records between two checkpoints (default
        10,000). A start replays the last checkpoint and at most about this many records; each checkpoint
        is written by a forked child. A smaller figure means more of them: each holds the dispatcher's lock
        for its fork (6-13 ms at 190 MB of memory) and costs the child's CPU and the pages the dispatcher
        writes while it runs.
      finished_jobs_kept: finished jobs the dispatcher keeps listing in its status (default 100); older
        ones leave the state, and only their count remains.
      http_port: serve ``/metrics`` (Prometheus), ``/status.json`` and a status page ``/`` over plain HTTP
        on this port, on ``host`` (``dataservice.service.http_status``); 0 picks a free one
        (``DispatchServer.http_port``); None (the default): no HTTP. Read-only and unauthenticated.
      worker_addresses: the fixed list of workers static sharding needs (``ShardingPolicy.FILE``, ``DATA``,
        ``FILE_OR_DATA``, ``HINT``), kept as a tuple: each entry "host:port", or "host:%port%" (or just
        "host") for a worker on that host at any port. A worker's shard index is the position of its
        entry. An entry without a port is bound to the first worker that matches it, until that worker is
        lost. With a list, a worker that matches no free entry is refused (it logs why and keeps
        retrying); None (the default): any worker may register, and static sharding is refused.
    """

    port: int = 0
    protocol: str = "grpc"
    work_dir: Optional[str] = None
    fault_tolerant_mode: bool = False
    job_gc_check_interval_ms: Optional[int] = None
    job_gc_timeout_ms: Optional[int] = None
    worker_timeout_ms: Optional[int] = None
    client_timeout_ms: Optional[int] = None
    host: Optional[str] = None
    auth_token: Optional[str] = dataclasses.field(default=None, repr=False)
    insecure: bool = False
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None
    tls_client_ca: Optional[str] = None
    tls: Optional[TlsSettings] = dataclasses.field(default=None, init=False, repr=False, compare=False)
    max_dataset_def_bytes: Optional[int] = None
    recover_journal: bool = False
    journal_checkpoint_records: Optional[int] = None
    finished_jobs_kept: Optional[int] = None
    http_port: Optional[int] = None
    worker_addresses: Optional[Sequence[str]] = None

    def __post_init__(self) -> None:
        _check_port(self.port)
        _check_http_port(self.http_port)
        _check_protocol(self.protocol)
        object.__setattr__(self, "worker_addresses", check_worker_addresses(self.worker_addresses))
        _check_access(self, "dispatcher")
        object.__setattr__(self, "tls", TlsSettings.for_server(self.tls_cert, self.tls_key, self.tls_client_ca))
        if self.fault_tolerant_mode and not self.work_dir:
            raise ValueError("fault_tolerant_mode=True requires work_dir: set work_dir to a directory "
                             "the dispatcher can write its journal to")
        _positive_ms(self, "job_gc_check_interval_ms", 60_000)
        _positive_ms(self, "job_gc_timeout_ms", 300_000)
        _positive_ms(self, "worker_timeout_ms", 10_000)
        _positive_ms(self, "client_timeout_ms", 60_000)
        _positive(self, "max_dataset_def_bytes", DEFAULT_DATASET_DEF_BYTES, "bytes", MAX_DATASET_DEF_LIMIT_BYTES)
        _positive(self, "finished_jobs_kept", 100, "jobs", None, allow_zero=True)
        _positive(self, "journal_checkpoint_records", DEFAULT_JOURNAL_CHECKPOINT_RECORDS, "records", None)
        if self.recover_journal and not self.fault_tolerant_mode:
            raise ValueError("recover_journal=True only applies to fault_tolerant_mode: set fault_tolerant_mode=True "
                             "and work_dir to the damaged journal's directory")


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
      host, auth_token, insecure: as for ``DispatcherConfig``; the token is also what the
        worker shows the dispatcher and what its clients must show it.
      tls_cert, tls_key, tls_client_ca: as for ``DispatcherConfig``, for the worker's gRPC port and
        its data-transfer port. Under mutual TLS the worker also presents this certificate to the
        dispatcher, so it must allow client authentication.
      tls_ca: PEM file of the CA the worker verifies the dispatcher with (None reads
        DATASERVICE_TLS_CA; neither: the dispatcher is reached in plaintext).
      tls: the ``TlsSettings`` read from those files (set by the constructor; None without any).
      memory_budget_bytes: the most all of this worker's tasks buffer ahead of their readers, in
        all (default a quarter of the host's memory); a task stops producing while the worker is
        at its budget, and a task with nothing buffered may always produce one element.
      data_idle_timeout_ms: a data-transfer connection with no request for this long is closed (default
        5 min); readers reconnect on their next request.
      data_request_timeout_ms: a data-transfer request (or handshake) must arrive whole within this
        long of its first byte (default 10 s), or the connection is closed.
      data_max_connections: data-transfer connections served at once (default 1024); more are refused
        with an error naming the limit.
      shared_batch_bytes: the most memory of each worker process's shared batch segments
        (``dataservice.worker.shared_batches``; default 256 MiB, or ``memory_budget_bytes`` if that is
        less): a large batch is built in one, and a reader on this host maps it instead of copying it.
        0 turns them off (readers on this host then copy batches out of the worker's memory).
      http_port: as for ``DispatcherConfig`` (``WorkerServer.http_port``): the worker's own metrics and page.
      cross_trainer_cache_size_bytes: the sliding window each task of a job read with ``cross_trainer_cache``
        keeps for its trainers (``dataservice.worker.trainer_cache``); default 256 MiB, or half of
        ``memory_budget_bytes`` if that is less; at most ``memory_budget_bytes``, which it counts against.
        A trainer that falls further behind the fastest one than the window holds skips ahead.
      worker_tags: labels of this worker, shown by ``dataservice status`` (a list of strings, kept as a tuple).
        "COLOCATED" (any case) says the worker runs beside trainers: a reader with ``target_workers="AUTO"``
        on a host with such a worker reads only from the workers on its host.
      host_id: the host this worker says it runs on, which readers compare with theirs
        (``dataservice.service.host_identity``; None: ``$DATASERVICE_HOST_ID``, else derived from the
        kernel and the network namespace).
    """

    dispatcher_address: str
    worker_address: Optional[str] = None
    port: int = 0
    protocol: str = "grpc"
    heartbeat_interval_ms: Optional[int] = None
    dispatcher_timeout_ms: Optional[int] = None
    data_transfer_protocol: str = "tcp"
    data_transfer_port: int = 0
    host: Optional[str] = None
    auth_token: Optional[str] = dataclasses.field(default=None, repr=False)
    insecure: bool = False
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None
    tls_ca: Optional[str] = None
    tls_client_ca: Optional[str] = None
    tls: Optional[TlsSettings] = dataclasses.field(default=None, init=False, repr=False, compare=False)
    memory_budget_bytes: Optional[int] = None
    data_idle_timeout_ms: Optional[int] = None
    data_request_timeout_ms: Optional[int] = None
    data_max_connections: Optional[int] = None
    shared_batch_bytes: Optional[int] = None
    http_port: Optional[int] = None
    cross_trainer_cache_size_bytes: Optional[int] = None
    worker_tags: Sequence[str] = ()
    host_id: Optional[str] = None

    def __post_init__(self) -> None:
        channel_address(self.dispatcher_address, "dispatcher")
        object.__setattr__(self, "worker_tags", check_worker_tags(self.worker_tags))
        if self.host_id is not None:
            check_host_id(self.host_id, "host_id")
        _check_access(self, "worker")
        if self.tls_ca is None:
            object.__setattr__(self, "tls_ca", os.environ.get(TLS_CA_ENV) or None)
        tls = TlsSettings.for_server(self.tls_cert, self.tls_key, self.tls_client_ca, ca_file=self.tls_ca)
        if tls is None and self.tls_ca is not None:
            tls = TlsSettings(ca_file=self.tls_ca)  # a plaintext worker of a dispatcher that speaks TLS
        object.__setattr__(self, "tls", tls)
        _check_port(self.port)
        _check_port(self.data_transfer_port)
        _check_http_port(self.http_port)
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
        _positive(self, "memory_budget_bytes", default_memory_budget_bytes(), "bytes", None)
        _positive_ms(self, "data_idle_timeout_ms", 300_000)
        _positive_ms(self, "data_request_timeout_ms", 10_000)
        _positive(self, "data_max_connections", 1024, "connections", None)
        if self.shared_batch_bytes is None:
            object.__setattr__(self, "shared_batch_bytes", min(DEFAULT_SHARED_BATCH_BYTES, self.memory_budget_bytes))
        elif isinstance(self.shared_batch_bytes, bool) or not isinstance(self.shared_batch_bytes, int) \
                or self.shared_batch_bytes < 0:
            raise ValueError(f"shared_batch_bytes must be a number of bytes >= 0 (0 turns shared batches off), got "
                             f"{self.shared_batch_bytes!r}")
        _positive(self, "cross_trainer_cache_size_bytes",
                  max(1, min(DEFAULT_CROSS_TRAINER_CACHE_BYTES, self.memory_budget_bytes // 2)), "bytes", None)
        if self.cross_trainer_cache_size_bytes > self.memory_budget_bytes:
            raise ValueError(f"cross_trainer_cache_size_bytes ({self.cross_trainer_cache_size_bytes}) must not exceed "
                             f"memory_budget_bytes ({self.memory_budget_bytes}): a task's cross-trainer cache counts "
                             f"against the worker's memory budget. Lower the cache size, or raise the budget "
                             f"(--memory-budget-bytes)")
