"""The ``dataservice`` command: run a dispatcher, a worker or a local cluster, and
show a dispatcher's status.

Each server command prints one line saying where it listens (flushed, so a
parent process can read the port when it passes ``--port 0``; ``worker --processes N``
prints one per worker process, then a summary line) — said once: the server's own log
record of it is dropped (``service.listening``). It logs through ``logging`` on stderr
(on loopback, the default, a notice of how to open it up), and exits with code 0 on
SIGTERM or SIGINT after stopping its servers. A port it cannot bind exits with code 1 and
one line saying why (in use, not an address of this machine, permission denied). Wrong
arguments print a one-line error after the usage and exit with code 2, never a traceback.

Example::

    $ dataservice dispatcher --port 5050 --work-dir /var/lib/ds --fault-tolerant
    dispatcher listening on grpc://localhost:5050
    $ dataservice worker --dispatcher localhost:5050 --port 5051
    worker listening on localhost:5051 (dispatcher localhost:5050)
    $ dataservice worker --dispatcher localhost:5050 --port 5061 --processes 2
    worker listening on localhost:5061 (dispatcher localhost:5050)
    worker listening on localhost:5062 (dispatcher localhost:5050)
    2 worker processes started (dispatcher localhost:5050; ports 5061, 5062; pids 4121, 4122)
    $ dataservice status --dispatcher localhost:5050 --json
    {"dispatcher": "grpc://localhost:5050", "workers": [...], "datasets": [...], "jobs": [...]}
    $ dataservice status --wait-workers 2 --timeout-ms 60000     # localhost:5050; exit 0 once 2 registered
    $ dataservice status --wait-workers 3 --timeout-ms 2000
    dataservice status: error: 2 of 3 workers registered with the dispatcher at localhost:5050 within 2000 ms
    $ dataservice dispatcher --port 5050       # while another process holds 5050 (exit code 1)
    dataservice dispatcher: error: cannot start: cannot bind 127.0.0.1:5050 (the dispatcher's gRPC port): the port ...
    $ dataservice local --workers 2 --port 0
    local cluster: grpc://localhost:40123 with 2 workers
    $ dataservice status --dispatcher localhost:5051
    dataservice status: error: localhost:5051 is a dataservice worker, not the dispatcher: pass the ...
    $ dataservice health localhost:5050 --service dispatcher      # exit 0 when serving (healthchecks)
    grpc://localhost:5050: SERVING (dataservice.Dispatcher)
    $ dataservice --version
    dataservice 0.1.0

TLS (``dataservice.service.tls``)::

    $ dataservice dispatcher --tls-cert server.pem --tls-key server.key [--tls-client-ca ca.pem]
    $ dataservice worker --dispatcher localhost:5050 --tls-ca ca.pem --tls-cert worker.pem --tls-key worker.key
    $ dataservice status --dispatcher localhost:5050 --tls-ca ca.pem [--tls-cert client.pem --tls-key client.key]

gRPC's own log lines are kept off the terminal by ``import dataservice``, which every
entry point runs before grpc is imported (see ``dataservice.grpc_startup``).

The same from Python (``main`` returns the exit code instead of exiting)::

    >>> from dataservice.cli import main
    >>> main(["status", "--dispatcher", "localhost:1", "--timeout-ms", "200"])
    dataservice status: error: cannot reach the dispatcher at localhost:1 within 200 ms (...)
    2
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, TextIO

import dataservice
from dataservice import errors
# The long-poll methods, whose time in ``status`` is waiting by design: from rpc_stats, a module of few imports,
# not from the dispatcher's core, whose import brings the pipeline library (ten times the rest of ``status``).
from dataservice.dispatcher.rpc_stats import LONG_POLL_METHODS
from dataservice.service.addresses import channel_address, target
from dataservice.service.auth import ClusterAuth, read_token_file
from dataservice.service.tls import TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV, TlsSettings
from dataservice.service.worker_list import check_worker_addresses

# What only some commands use is imported by them: a healthcheck runs `dataservice health` every few
# seconds in every container, and `--version`, `health` and `status` need neither the servers nor the
# pipeline library (numpy, cloudpickle). tests/test_cli_startup.py checks what they import.
if TYPE_CHECKING:
    from dataservice.service.config import DispatcherConfig, WorkerConfig
    from dataservice.service.dispatcher_client import DispatcherClient

__all__ = ["main", "build_parser", "dispatcher_config", "worker_config", "worker_process_flags", "status_as_dict",
           "format_status", "positive_int"]

log = logging.getLogger("dataservice.cli")

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: Default of ``status --timeout-ms``: long enough for a busy dispatcher, short enough for a human.
STATUS_TIMEOUT_MS = 5000
#: The port ``dispatcher`` and ``local`` listen on by default, where ``status`` looks without ``--dispatcher``.
DISPATCHER_PORT = 5050
#: How often ``status --wait-workers`` asks the dispatcher (one GetStatus call: well under a millisecond of its time).
STATUS_POLL_S = 0.2
#: Exit code of a runtime failure (port in use, unwritable work dir); 2 is for bad arguments.
EXIT_FAILURE = 1
EXIT_USAGE = 2


# --- argument types -----------------------------------------------------------------
# argparse turns ArgumentTypeError into "argument --flag: <message>", naming the flag.

def _int_flag(what: str, low: int, high: Optional[int] = None, name: str = "") -> Callable[[str], int]:
    """An argparse type: an int in ``[low, high]``, with a message saying what is expected."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be an integer in {low}..{high} ({what}), got {text!r}" if name
                else f"expected {what}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{name} must be in {low}..{high} ({what}), got {value}" if name
                                             else f"expected {what}, got {value}")
        return value
    return parse


_port = _int_flag("0 picks a free port", 0, 65535, name="port")
_positive_ms = _int_flag("a positive number of milliseconds", 1)
#: An argparse type: a positive integer (also used by ``client.train``).
positive_int = _int_flag("a positive integer", 1)
_non_negative_int = _int_flag("a non-negative integer", 0)


def _processes(text: str) -> int:
    """``--processes``: a positive integer, or "auto" for one process per available core."""
    if text.strip().lower() == "auto":
        from dataservice.worker.processes import available_cpus

        return available_cpus()
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto' (one process per core), "
                                         f"got {text!r}")
    return value


def _worker_tags(text: str) -> tuple:
    # Commas separate tags; spaces inside a tag stay ("Unused tag 1,zone-a"), those around a comma go.
    from dataservice.service.config import check_worker_tags

    try:
        return check_worker_tags([tag.strip() for tag in text.split(",")])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _dispatcher_address(text: str) -> str:
    try:
        return channel_address(text, "dispatcher")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _log_level(text: str) -> str:
    level = text.upper()
    if level not in _LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"log level must be one of {', '.join(_LOG_LEVELS)}, got {text!r}")
    return level


# --- the parser -----------------------------------------------------------------------

def _add_dispatcher_address(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dispatcher", type=_dispatcher_address, required=True, metavar="HOST:PORT",
                        help="the dispatcher's address, as host:port or grpc://host:port")


def _add_auth_token_file(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--auth-token-file", metavar="PATH", default=None,
                        help="file holding the cluster's shared auth token; every member (dispatcher, workers, "
                             "clients) needs the same one (default: $DATASERVICE_AUTH_TOKEN, then the file named "
                             "by $DATASERVICE_AUTH_TOKEN_FILE; none: no authentication, loopback only)")


def _add_listen_flags(parser: argparse.ArgumentParser) -> None:
    _add_auth_token_file(parser)
    parser.add_argument("--host", default=None, metavar="HOST",
                        help="interface to listen on: localhost (the default: this machine only), 0.0.0.0 or :: "
                             "for every interface, which needs an auth token or --insecure")
    parser.add_argument("--insecure", action="store_true",
                        help="listen beyond localhost without an auth token: anyone who reaches the port can run "
                             "code on the workers (a warning on every start)")
    parser.add_argument("--http-port", type=_port, default=None, metavar="P",
                        help="also serve /metrics (Prometheus), /status.json and a status page / over plain HTTP "
                             "on this port, on --host (read-only, no token); 0 picks a free one, printed at the "
                             "start (default: no HTTP)")


def _add_server_tls_flags(parser: argparse.ArgumentParser, verifies_dispatcher: bool) -> None:
    parser.add_argument("--tls-cert", metavar="PEM", default=None,
                        help="this server's TLS certificate (with --tls-key): its ports then speak TLS only; "
                             "clients verify it with --tls-ca. List every name clients use for the host in its "
                             "subjectAltName")
    parser.add_argument("--tls-key", metavar="PEM", default=None, help="the private key of --tls-cert")
    parser.add_argument("--tls-client-ca", metavar="PEM", default=None,
                        help="require client certificates signed by this CA (mutual TLS); needs --tls-cert")
    if verifies_dispatcher:
        parser.add_argument("--tls-ca", metavar="PEM", default=None,
                            help=f"the CA that signed the dispatcher's certificate, to verify it with (default: "
                                 f"${TLS_CA_ENV}; none: the dispatcher is reached in plaintext). Under mutual TLS "
                                 f"the worker presents --tls-cert to the dispatcher")


def _add_client_tls_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tls-ca", metavar="PEM", default=None,
                        help=f"the CA that signed the cluster's certificates, for a cluster that speaks TLS "
                             f"(default: ${TLS_CA_ENV})")
    parser.add_argument("--tls-cert", metavar="PEM", default=None,
                        help=f"this client's certificate, for a cluster that requires one (mutual TLS) "
                             f"(default: ${TLS_CERT_ENV})")
    parser.add_argument("--tls-key", metavar="PEM", default=None,
                        help=f"the private key of --tls-cert (default: ${TLS_KEY_ENV})")


def _auth_token(args: argparse.Namespace) -> Optional[str]:
    """The token of --auth-token-file; None leaves the environment to the configs."""
    return read_token_file(args.auth_token_file) if getattr(args, "auth_token_file", None) else None


def _add_log_level(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", type=_log_level, default="INFO", metavar="LEVEL",
                        help=f"logging level on stderr: one of {', '.join(_LOG_LEVELS)} (default: INFO)")


def _add_dispatcher_flags(parser: argparse.ArgumentParser, default_port: int) -> None:
    parser.add_argument("--port", type=_port, default=default_port,
                        help=f"port the dispatcher listens on; 0 picks a free one (default: {default_port})")
    parser.add_argument("--work-dir", metavar="DIR", default=None,
                        help="directory for the dispatcher's journal; required by --fault-tolerant")
    parser.add_argument("--fault-tolerant", action="store_true",
                        help="journal every state change to --work-dir and replay it on restart")
    parser.add_argument("--job-gc-check-interval-ms", type=_positive_ms, metavar="N", default=None,
                        help="how often to look for jobs to garbage-collect (default: 60000)")
    parser.add_argument("--job-gc-timeout-ms", type=_positive_ms, metavar="N", default=None,
                        help="a job no client has read for this long is garbage-collected (default: 300000)")
    parser.add_argument("--worker-timeout-ms", type=_positive_ms, metavar="N", default=None,
                        help="a worker silent for this long is considered lost (default: 10000)")
    parser.add_argument("--client-timeout-ms", type=_positive_ms, metavar="N", default=None,
                        help="a client silent for this long is considered gone (default: 60000)")
    parser.add_argument("--max-dataset-def-bytes", type=positive_int, metavar="N", default=None,
                        help="largest pipeline definition accepted (default: 33554432, at most 62914560)")
    parser.add_argument("--finished-jobs-kept", type=_non_negative_int, metavar="N", default=None,
                        help="finished jobs the status keeps listing; older ones leave the state (default: 100)")
    parser.add_argument("--recover-journal", action="store_true",
                        help="start although the journal in --work-dir is damaged, from what is valid before the "
                             "damage; what follows it is dropped and logged (an operator's decision)")
    parser.add_argument("--journal-checkpoint-records", type=positive_int, metavar="N", default=None,
                        help="with --fault-tolerant: journal records between two checkpoints, which a forked "
                             "child writes; a start replays at most about this many (default: 10000)")
    parser.add_argument("--worker-addresses", type=_worker_addresses, metavar="A,B,...", default=None,
                        help="the fixed worker list static sharding needs (ShardingPolicy FILE, DATA, FILE_OR_DATA, "
                             "HINT), comma-separated: host:port, or host:%%port%% for any port on the host; a "
                             "worker's shard is its entry's position, and unlisted workers are refused "
                             "(default: any worker may register)")


def _add_worker_timing_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--heartbeat-interval-ms", type=_positive_ms, metavar="N", default=None,
                        help="longest time between two heartbeats to the dispatcher (default: 1000)")
    parser.add_argument("--dispatcher-timeout-ms", type=_positive_ms, metavar="N", default=None,
                        help="how long to keep retrying an unreachable dispatcher on a call (default: 60000)")
    parser.add_argument("--data-transfer-protocol", choices=("tcp", "grpc"), default="tcp",
                        help="how elements travel to clients: tcp (a plain socket fed from numpy buffers, the "
                             "fast path) or grpc (through the gRPC port) (default: tcp)")
    parser.add_argument("--data-transfer-port", type=_port, metavar="P", default=0,
                        help="port of the tcp data-transfer server; 0 picks a free one (default: 0)")
    parser.add_argument("--memory-budget-bytes", type=positive_int, metavar="N", default=None,
                        help="most bytes all tasks buffer ahead of their readers (default: a quarter of the "
                             "host's memory, shared by --processes)")
    parser.add_argument("--cross-trainer-cache-size-bytes", type=positive_int, metavar="N", default=None,
                        help="the sliding window each task of a job read with cross_trainer_cache keeps for its "
                             "trainers; a trainer further behind the fastest one skips ahead (default: 268435456, "
                             "or half of --memory-budget-bytes if less; at most the budget of one process)")
    parser.add_argument("--data-idle-timeout-ms", type=_positive_ms, metavar="N", default=None,
                        help="close a data-transfer connection idle for this long (default: 300000)")
    parser.add_argument("--data-request-timeout-ms", type=_positive_ms, metavar="N", default=None,
                        help="a data-transfer request must arrive whole within this long (default: 10000)")
    parser.add_argument("--data-max-connections", type=positive_int, metavar="N", default=None,
                        help="data-transfer connections served at once; more are refused (default: 1024)")
    parser.add_argument("--shared-batch-bytes", type=_non_negative_int, metavar="N", default=None,
                        help="each worker process's shared memory for large batches, which readers on this host map "
                             "instead of copying (default: 268435456, or the memory budget if less; 0: off)")


def build_parser() -> argparse.ArgumentParser:
    """The parser of the ``dataservice`` command (also used to check deploy files)."""
    parser = argparse.ArgumentParser(
        prog="dataservice",
        # Room for the longest command name, so the command list does not wrap.
        formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=32),
        description="Run the data service: a dispatcher, workers, or both in one process; "
                    "or show what a dispatcher knows.")
    parser.add_argument("--version", action="version", version=f"dataservice {dataservice.__version__}",
                        help="print the version of dataservice and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # Each subcommand records its own parser, so errors print its usage ("dataservice worker: error: ...").

    dispatcher = commands.add_parser(
        "dispatcher", help="run a dispatcher",
        description="Run a dispatcher: it registers datasets, creates jobs and assigns their tasks to workers.")
    _add_dispatcher_flags(dispatcher, default_port=DISPATCHER_PORT)
    _add_listen_flags(dispatcher)
    _add_server_tls_flags(dispatcher, verifies_dispatcher=False)
    _add_log_level(dispatcher)
    dispatcher.set_defaults(_parser=dispatcher)

    worker = commands.add_parser(
        "worker", help="run a worker",
        description="Run a worker: it produces elements of the tasks the dispatcher assigns it.")
    _add_dispatcher_address(worker)
    worker.add_argument("--port", type=_port, default=0,
                        help="port the worker listens on; 0 picks a free one (default: 0)")
    worker.add_argument("--worker-address", metavar="ADDR", default=None,
                        help="address clients use to reach this worker, e.g. worker1:5051; %%port%% is "
                             "replaced by the bound port (default: localhost:%%port%%)")
    worker.add_argument("--processes", type=_processes, default=1, metavar="N|auto",
                        help="run N worker processes on this host, each a worker of its own (use all the cores "
                             "for CPU-bound Python pipelines); 'auto' starts one per available core. With N > 1 "
                             "this command supervises them: they listen on --port P, P+1, ..., P+N-1 (free ports "
                             "with --port 0), --worker-address must contain %%port%%, and a process that dies is "
                             "restarted on its port (default: 1)")
    _add_worker_timing_flags(worker)
    worker.add_argument("--worker-tags", type=_worker_tags, metavar="TAG[,TAG...]", default=(),
                        help="comma-separated tags of this worker, shown by `dataservice status` (spaces inside "
                             "a tag are kept: --worker-tags 'Unused tag 1,zone-a'); COLOCATED: it runs "
                             "beside trainers, whose readers (target_workers=AUTO) then read from their host's "
                             "workers only")
    _add_listen_flags(worker)
    _add_server_tls_flags(worker, verifies_dispatcher=True)
    _add_log_level(worker)
    worker.set_defaults(_parser=worker)

    status = commands.add_parser(
        "status", help="show a dispatcher's workers, datasets and jobs",
        description="Show the workers, datasets and jobs a dispatcher knows about; with --wait-workers N, first "
                    "wait until N workers have registered (exit code 0), or give up at --timeout-ms (exit code 1).")
    status.add_argument("--dispatcher", type=_dispatcher_address, default=None, metavar="HOST:PORT",
                        help=f"the dispatcher's address, as host:port or grpc://host:port (default: "
                             f"localhost:{DISPATCHER_PORT}, where `dataservice dispatcher` listens by default)")
    _add_auth_token_file(status)
    _add_client_tls_flags(status)
    status.add_argument("--json", action="store_true",
                        help='print JSON with the keys "workers", "datasets" and "jobs" instead of tables')
    status.add_argument("--wait-workers", type=positive_int, metavar="N", default=None,
                        help="wait until the dispatcher counts N live workers, polling it every "
                             f"{STATUS_POLL_S:g} s, then print the status (exit code 0); at --timeout-ms, say how "
                             "many registered and exit with code 1. For scripts and init containers")
    status.add_argument("--timeout-ms", type=_positive_ms, metavar="N", default=STATUS_TIMEOUT_MS,
                        help=f"give up on an unreachable dispatcher after this long, exit code 2; with "
                             f"--wait-workers, the deadline of the wait (default: {STATUS_TIMEOUT_MS})")
    status.set_defaults(_parser=status)

    save_status = commands.add_parser(
        "save-status", help="show a distributed_save's progress",
        description="Show a distributed_save's progress: chunks committed, elements, done or error. From the "
                    "dispatcher with --dispatcher, else from the save's directory alone.")
    save_status.add_argument("path", metavar="PATH", help="the directory the save writes")
    save_status.add_argument("--dispatcher", type=_dispatcher_address, default=None, metavar="HOST:PORT",
                             help="ask this dispatcher (default: read the directory)")
    _add_auth_token_file(save_status)
    _add_client_tls_flags(save_status)
    save_status.add_argument("--wait", action="store_true",
                             help="wait until the save is done (exit 0) or failed (exit 1), showing a progress bar")
    save_status.add_argument("--json", action="store_true", help="print the progress as JSON")
    save_status.add_argument("--timeout-ms", type=_positive_ms, metavar="N", default=STATUS_TIMEOUT_MS,
                             help=f"give up on an unreachable dispatcher after this long "
                                  f"(default: {STATUS_TIMEOUT_MS})")
    save_status.set_defaults(_parser=save_status)

    local = commands.add_parser(
        "local", help="run a dispatcher and N workers in this process",
        description="Run a dispatcher and N workers in one process: a whole cluster for development and tests.")
    local.add_argument("--workers", type=positive_int, default=2, metavar="N",
                       help="number of workers to start (default: 2)")
    _add_dispatcher_flags(local, default_port=DISPATCHER_PORT)
    _add_worker_timing_flags(local)
    _add_listen_flags(local)
    _add_server_tls_flags(local, verifies_dispatcher=True)
    _add_log_level(local)
    local.set_defaults(_parser=local)

    from dataservice.catalogue import command as datasets_command

    datasets_command.add_parser(commands, positive_int)
    from dataservice.service import health_probe

    health_probe.add_parser(commands, _positive_ms, _add_auth_token_file, _add_client_tls_flags)
    return parser


# --- configs from arguments ------------------------------------------------------------

def _worker_addresses(text: str) -> tuple:
    """``--worker-addresses a:1,b:%port%``: the entries of DispatcherConfig.worker_addresses."""
    try:
        return check_worker_addresses([entry.strip() for entry in text.split(",")])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def dispatcher_config(args: argparse.Namespace) -> DispatcherConfig:
    """The DispatcherConfig that ``args`` ask for; ValueError worded in terms of flags."""
    from dataservice.service.config import DispatcherConfig

    if args.fault_tolerant and not args.work_dir:
        raise ValueError("--fault-tolerant requires --work-dir DIR, the directory the journal is written to")
    return DispatcherConfig(port=args.port, work_dir=args.work_dir, fault_tolerant_mode=args.fault_tolerant,
                            job_gc_check_interval_ms=args.job_gc_check_interval_ms,
                            job_gc_timeout_ms=args.job_gc_timeout_ms, worker_timeout_ms=args.worker_timeout_ms,
                            client_timeout_ms=args.client_timeout_ms, host=args.host, auth_token=_auth_token(args),
                            insecure=args.insecure, tls_cert=args.tls_cert, tls_key=args.tls_key,
                            tls_client_ca=args.tls_client_ca, max_dataset_def_bytes=args.max_dataset_def_bytes,
                            finished_jobs_kept=args.finished_jobs_kept, recover_journal=args.recover_journal,
                            journal_checkpoint_records=args.journal_checkpoint_records, http_port=args.http_port,
                            worker_addresses=getattr(args, "worker_addresses", None))


def worker_config(args: argparse.Namespace, dispatcher_address: Optional[str] = None,
                  port: Optional[int] = None) -> WorkerConfig:
    """The WorkerConfig that ``args`` ask for (``local`` passes its own dispatcher and port)."""
    from dataservice.service.config import WorkerConfig

    return WorkerConfig(dispatcher_address=dispatcher_address or args.dispatcher,
                        worker_address=getattr(args, "worker_address", None),
                        port=args.port if port is None else port,
                        heartbeat_interval_ms=args.heartbeat_interval_ms,
                        dispatcher_timeout_ms=args.dispatcher_timeout_ms,
                        data_transfer_protocol=args.data_transfer_protocol,
                        data_transfer_port=args.data_transfer_port, host=args.host, auth_token=_auth_token(args),
                        insecure=args.insecure, tls_cert=args.tls_cert, tls_key=args.tls_key, tls_ca=args.tls_ca,
                        tls_client_ca=args.tls_client_ca, memory_budget_bytes=args.memory_budget_bytes,
                        data_idle_timeout_ms=args.data_idle_timeout_ms,
                        data_request_timeout_ms=args.data_request_timeout_ms,
                        data_max_connections=args.data_max_connections,
                        shared_batch_bytes=getattr(args, "shared_batch_bytes", None),
                        cross_trainer_cache_size_bytes=getattr(args, "cross_trainer_cache_size_bytes", None),
                        worker_tags=getattr(args, "worker_tags", ()),
                        # local: the dispatcher has --http-port; its workers take free ports.
                        http_port=args.http_port if dispatcher_address is None or args.http_port is None else 0)


# --- running servers ---------------------------------------------------------------------

def _setup_logging(level: str, with_pid: bool = False) -> None:
    # The processes of ``worker --processes N`` share a stderr: each one's lines carry its pid.
    logging.basicConfig(level=getattr(logging, level), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s" + ("[%(process)d]" if with_pid else "") +
                               ": %(message)s")


def _announce(line: str) -> None:
    # stdout, flushed at once: a parent that passed --port 0 reads the port from this line.
    print(line, flush=True)


class _Shutdown:
    """Turns SIGTERM/SIGINT into an Event the main thread waits on.

    The handler does not set the Event itself: it runs on the main thread, which
    may hold the Event's internal lock at that instant (inside ``wait``), so
    setting it there could deadlock. A short-lived thread sets it instead.
    A second signal exits at once, for a shutdown that hangs.
    """

    def __init__(self) -> None:
        self.event = threading.Event()
        self._signals = 0
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        self._signals += 1
        if self._signals > 1:
            os.write(2, b"dataservice: second signal, exiting without a clean shutdown\n")
            os._exit(128 + signum)
        log.info("received %s, shutting down", signal.Signals(signum).name)
        threading.Thread(target=self.event.set, name="dataservice-shutdown", daemon=True).start()

    def wait(self) -> None:
        # A timeout keeps the wait interruptible on every platform and Python version.
        while not self.event.wait(0.5):
            pass


def _make_work_dir(work_dir: Optional[str]) -> None:
    if work_dir:
        os.makedirs(work_dir, exist_ok=True)


def _shown_host(host: Optional[str]) -> str:
    """The host to print in "listening on": the one given with --host, unless it is every interface
    (0.0.0.0, ::) or none, where localhost reaches the server from this machine."""
    if not host or host in ("0.0.0.0", "::", "[::]"):  # every interface: this machine reaches it as localhost
        return "localhost"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _drop_listening(record: logging.LogRecord) -> bool:
    """A logging filter: drops a server's "listening on" record (``listening.log_listening``)."""
    from dataservice.service.listening import LISTENING_RECORD

    return not getattr(record, LISTENING_RECORD, False)


def _serve(prog: str, start: Callable[[], list], announce: Callable[[list], str],
           announced: Sequence[str] = ("dataservice.dispatcher", "dataservice.worker")) -> int:
    """Starts servers (``start`` returns them in start order), announces them, waits for a
    signal, and stops them in reverse order (workers before their dispatcher).

    The servers whose loggers are ``announced`` have their line printed by ``announce``: their own
    "listening on" log record is dropped, so each is said once."""
    shutdown = _Shutdown()
    # Before starting, so a signal during a slow start still shuts down cleanly.
    shutdown.install()
    servers: list = []
    for name in announced:
        logging.getLogger(name).addFilter(_drop_listening)
    try:
        try:
            servers.extend(start())
        except (errors.DataServiceError, OSError) as exc:
            print(f"{prog}: error: cannot start: {_one_line(exc)}", file=sys.stderr, flush=True)
            return EXIT_FAILURE
        # Worked out before anything is announced: whoever waits for the listening line may start using the
        # ports at once (a flood of connections can leave no file descriptor for an import after it).
        http_lines = _http_lines(servers)
        _announce(announce(servers))
        for line in http_lines:
            _announce(line)
        shutdown.wait()
        return 0
    finally:
        for server in reversed(servers):
            try:
                server.stop()
            except Exception:  # stop the others regardless
                log.exception("error while stopping %s", type(server).__name__)
        shutdown.restore()
        for name in announced:
            logging.getLogger(name).removeFilter(_drop_listening)


def _http_lines(servers: list) -> list[str]:
    """A line per server serving HTTP (--http-port): where its status page is (a parent that passed
    --http-port 0 reads the port from it)."""
    from dataservice.dispatcher.server import DispatchServer

    lines = []
    for server in servers:
        if server.config.http_port is None:
            continue
        host = _shown_host(server.config.host)
        what = "dispatcher" if isinstance(server, DispatchServer) else f"worker {server.address}"
        lines.append(f"{what} serves /metrics, /status.json and its status page on http://{host}:{server.http_port}/")
    return lines


def _run_dispatcher(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from dataservice.dispatcher.collector_pauses import reduce_full_collections
    from dataservice.dispatcher.server import DispatchServer
    from dataservice.service.listening import tls_note

    try:
        config = dispatcher_config(args)
    except ValueError as exc:
        parser.error(str(exc))
    _setup_logging(args.log_level)

    def start() -> list:
        _make_work_dir(config.work_dir)
        reduce_full_collections()  # the process is the dispatcher's: no full collection every few seconds
        return [DispatchServer(config)]

    def announce(servers: list) -> str:
        tls = tls_note(config.tls)
        line = f"dispatcher listening on grpc://{_shown_host(args.host)}:{servers[0].port}"
        return line + (f" ({tls})" if tls else "")

    return _serve(parser.prog, start, announce)


def _run_worker(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from dataservice.service.listening import tls_note
    from dataservice.worker.processes import follow_supervisor
    from dataservice.worker.server import WorkerServer

    try:
        config = worker_config(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.processes > 1:
        return _run_worker_processes(args, parser, config)
    supervised = follow_supervisor()  # started by --processes N: stop if the supervisor dies
    _setup_logging(args.log_level, with_pid=supervised)

    def announce(servers: list) -> str:
        worker = servers[0]
        tls = tls_note(config.tls if config.tls is not None and config.tls.serves else None)
        line = f"worker listening on {_shown_host(args.host)}:{worker.port} (dispatcher {config.dispatcher_address}" \
               f"{'; ' + tls if tls else ''})"
        if worker.address != f"{_shown_host(args.host)}:{worker.port}":
            line += f"; advertised to clients as {worker.address}"
        return line

    return _serve(parser.prog, lambda: [WorkerServer(config)], announce)


def worker_process_flags(args: argparse.Namespace) -> list[str]:
    """The flags each process of ``worker --processes N`` gets: all of ``args`` but the ports and
    ``--processes``, which the supervisor sets per process."""
    from dataservice.service.config import default_memory_budget_bytes

    flags = ["--dispatcher", args.dispatcher, "--data-transfer-protocol", args.data_transfer_protocol,
             "--log-level", args.log_level]
    if args.worker_address is not None:
        flags += ["--worker-address", args.worker_address]
    if getattr(args, "worker_tags", ()):
        flags += ["--worker-tags", ",".join(args.worker_tags)]
    if args.host is not None:
        flags += ["--host", args.host]
    if args.http_port is not None:
        flags += ["--http-port", "0"]  # each process on a free port of its own (each prints it)
    if args.insecure:
        flags.append("--insecure")
    if args.auth_token_file:
        flags += ["--auth-token-file", args.auth_token_file]  # the path, not the token: argv is public
    for flag, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key), ("--tls-ca", args.tls_ca),
                       ("--tls-client-ca", args.tls_client_ca)):
        if path is not None:
            flags += [flag, path]  # paths: the key's bytes never reach argv
    for flag, value in (("--heartbeat-interval-ms", args.heartbeat_interval_ms),
                        ("--dispatcher-timeout-ms", args.dispatcher_timeout_ms),
                        ("--data-idle-timeout-ms", args.data_idle_timeout_ms),
                        ("--data-request-timeout-ms", args.data_request_timeout_ms),
                        ("--data-max-connections", args.data_max_connections),
                        ("--shared-batch-bytes", args.shared_batch_bytes),
                        ("--cross-trainer-cache-size-bytes", args.cross_trainer_cache_size_bytes)):
        if value is not None:
            flags += [flag, str(value)]
    # The budget is the whole worker's: its processes share it.
    budget = args.memory_budget_bytes or default_memory_budget_bytes()
    flags += ["--memory-budget-bytes", str(max(1, budget // max(1, args.processes)))]
    return flags


def _run_worker_processes(args: argparse.Namespace, parser: argparse.ArgumentParser, config) -> int:
    """``worker --processes N`` with N > 1: supervise N worker processes (dataservice.worker.processes)."""
    from dataservice.worker.processes import WorkerProcesses, WorkerProcessesError, worker_command

    n = args.processes
    if args.http_port:
        parser.error(f"--http-port {args.http_port} with --processes {n}: each process serves HTTP on a port of "
                     f"its own; pass --http-port 0 (free ports, each printed at the start)")
    if "%port%" not in config.worker_address:
        parser.error(f"--worker-address {config.worker_address!r} must contain %port% with --processes {n}: "
                     f"each process listens on a port of its own, and clients tell the processes apart by it "
                     f"(e.g. {config.worker_address.rsplit(':', 1)[0]}:%port%)")
    # Only tcp data transfer listens on a port of its own; 0 (free ports) needs no check.
    data_transfer_port = args.data_transfer_port if args.data_transfer_protocol == "tcp" else 0
    for flag, first in (("--port", args.port), ("--data-transfer-port", data_transfer_port)):
        if first and first + n - 1 > 65535:
            parser.error(f"{flag} {first} with --processes {n} needs the ports {first}..{first + n - 1}, "
                         f"beyond 65535")
    if args.port and data_transfer_port and abs(args.port - data_transfer_port) < n:
        parser.error(f"with --processes {n}, the ports {args.port}..{args.port + n - 1} and the data-transfer "
                     f"ports {data_transfer_port}..{data_transfer_port + n - 1} overlap")
    _setup_logging(args.log_level)
    group = WorkerProcesses(worker_command(worker_process_flags(args)), n, port=args.port,
                            data_transfer_port=data_transfer_port, dispatcher_address=config.dispatcher_address)
    shutdown = _Shutdown()
    shutdown.install()
    try:
        group.run(shutdown.event)
        return 0
    except WorkerProcessesError as exc:
        print(f"{parser.prog}: error: {_one_line(exc)}", file=sys.stderr, flush=True)
        return EXIT_FAILURE
    finally:
        shutdown.restore()


def _run_local(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from dataservice.dispatcher.server import DispatchServer
    from dataservice.worker.server import WorkerServer

    # The worker flags need no check here: argparse checked each of them, and they have no combinations
    # a WorkerConfig rejects.
    try:
        config = dispatcher_config(args)
        probe = worker_config(args, dispatcher_address="localhost:1", port=0)  # the workers' TLS files, checked
    except ValueError as exc:
        parser.error(str(exc))
    if config.tls is not None and probe.tls_ca is None:
        parser.error(f"--tls-cert needs --tls-ca (or ${TLS_CA_ENV}) here: the workers verify the dispatcher with "
                     f"the CA that signed its certificate")
    _setup_logging(args.log_level)

    def start() -> list:
        _make_work_dir(config.work_dir)
        servers: list = []
        try:
            dispatcher = DispatchServer(config)
            servers.append(dispatcher)
            for _ in range(args.workers):
                servers.append(WorkerServer(worker_config(args, dispatcher_address=dispatcher.target, port=0)))
        except BaseException:
            for server in reversed(servers):
                server.stop()
            raise
        return servers

    def announce(servers: list) -> str:
        n = len(servers) - 1
        return f"local cluster: {servers[0].target} with {n} worker{'s' if n != 1 else ''}"

    # The workers' ports are on no printed line: their own log lines stay.
    return _serve(parser.prog, start, announce, announced=("dataservice.dispatcher",))


# --- status ---------------------------------------------------------------------------------

def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def status_as_dict(response: Any, dispatcher: str, now: Optional[float] = None) -> dict:
    """A GetStatusResponse as plain JSON-able data."""
    from dataservice.service.processing_modes import mode_name

    now = time.time() if now is None else now
    return {
        "dispatcher": dispatcher,
        "incarnation": response.dispatcher_incarnation,
        "workers": [{
            "address": w.address,
            "last_heartbeat_unix": w.last_heartbeat_unix,
            "last_heartbeat_s_ago": round(max(0.0, now - w.last_heartbeat_unix), 3) if w.last_heartbeat_unix else None,
            "tasks": list(w.tasks),
            "num_tasks": w.num_tasks,
            "tags": list(w.tags),
            "host_id": w.host_id,
        } for w in response.workers],
        # By worker address, the share of time its producers were busy over the recent window (the scaling
        # signal's input), for the workers that reported it.
        "worker_busy_fraction": {w.address: round(w.busy_fraction, 4) for w in response.workers
                                 if w.HasField("busy_fraction")},
        "datasets": [{
            "dataset_id": d.dataset_id,
            "dataset_names": list(d.dataset_names),
            "fingerprint": d.fingerprint,
            "num_splits": d.num_splits,
            "size_bytes": d.size_bytes,
        } for d in response.datasets],
        "jobs": [{
            "job_id": j.job_id,
            "job_name": j.job_name,
            "dataset_id": j.dataset_id,
            # The chosen dataset id its readers named ("": the numeric id): with job_name, the job's key.
            "dataset_name": j.dataset_name,
            "processing_mode": mode_name(j.processing_mode),
            "finished": j.finished,
            "num_clients": j.num_clients,
            "iterations": list(j.iterations),
            "garbage_collected": j.garbage_collected,
            # How its readers read it (distribute's num_consumers, cross_trainer_cache, target_workers).
            "num_consumers": j.num_consumers,
            "cross_trainer_cache": j.cross_trainer_cache,
            "target_workers": j.target_workers or "AUTO",
        } for j in response.jobs],
        "counts": {field: getattr(response.counts, field) for field in _COUNT_FIELDS},
        # long_poll: the call waits at the dispatcher for news by design, so its time is not slowness.
        "rpc_latency_ms": {r.method: {"calls": r.calls, "p50": round(r.p50_ms, 3), "p99": round(r.p99_ms, 3),
                                      "max": round(r.max_ms, 3), "long_poll": r.method in LONG_POLL_METHODS}
                           for r in response.rpc_latency},
        # Each reader's last report (iterator.stats()), the most stalled first; metrics the dispatcher
        # keeps in memory only.
        "clients": [{
            "client_id": c.client_id,
            "job_id": c.job_id,
            "job_name": c.job_name,
            "iteration_id": c.iteration_id,
            "elements": c.elements,
            "bytes": c.bytes,
            "stall_s": round(c.stall_s, 3),
            "elapsed_s": round(c.elapsed_s, 3),
            "stall_fraction": round(c.stall_fraction, 4),
            "last_report_s_ago": round(max(0.0, now - c.last_report_unix), 3),
        } for c in response.clients],
        "recommended_workers": {"count": response.scaling.count, "current": response.scaling.current,
                                "reason": response.scaling.reason} if response.HasField("scaling") else None,
    }


_COUNT_FIELDS = ("workers", "datasets", "jobs", "iterations", "tasks", "clients", "jobs_finished", "jobs_pruned")


def _shown(listed: list, total: int, what: str) -> str:
    return f"{what}: {total}" + (f" (showing {len(listed)})" if len(listed) < total else "")


def _table(headers: Sequence[str], rows: list[Sequence[Any]], out: TextIO) -> None:
    cells = [list(headers)] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + "\n")


def _ids(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values) or "-"


def _percent(fraction: Optional[float]) -> str:
    return "-" if fraction is None else f"{fraction * 100:.0f}%"


def _ago(seconds: Optional[float]) -> str:
    return "never" if seconds is None else f"{seconds:.1f} s ago"


def _reads(job: dict) -> str:
    """A job's read options for the status table: "-" for the default (first come first served, any worker)."""
    shown = []
    if job.get("num_consumers"):
        shown.append(f"coordinated x{job['num_consumers']}")
    if job.get("cross_trainer_cache"):
        shown.append("cross-trainer cache")
    if job.get("target_workers", "AUTO") != "AUTO":
        shown.append(job["target_workers"])
    return ", ".join(shown) or "-"


def format_status(status: dict, out: TextIO) -> None:
    """Writes ``status_as_dict``'s result as readable tables."""
    out.write(f"dispatcher {status['dispatcher']}" +
              (f" (incarnation {status['incarnation'][:12]})" if status["incarnation"] else "") + "\n")
    counts = status.get("counts") or {}
    out.write(f"\n{_shown(status['workers'], counts.get('workers', len(status['workers'])), 'workers')}\n")
    if status["workers"]:
        _table(["ADDRESS", "LAST HEARTBEAT", "BUSY", "TAGS", "TASKS"],
               [[w["address"], _ago(w["last_heartbeat_s_ago"]),
                 _percent((status.get("worker_busy_fraction") or {}).get(w["address"])),
                 ",".join(w.get("tags", ())) or "-",
                 _ids(w["tasks"]) + (f" (+{w['num_tasks'] - len(w['tasks'])})" if w.get("num_tasks", 0) > len(w["tasks"])
                                     else "")] for w in status["workers"]], out)
    out.write(f"\n{_shown(status['datasets'], counts.get('datasets', len(status['datasets'])), 'datasets')}\n")
    if status["datasets"]:
        _table(["ID", "NAMES", "FINGERPRINT", "SPLITS", "SIZE"],
               [[d["dataset_id"], ",".join(d.get("dataset_names", ())) or "-", d["fingerprint"][:16],
                 d["num_splits"] if d["num_splits"] >= 0 else "-", f"{d['size_bytes']:,} B"]
                for d in status["datasets"]], out)
    jobs_line = _shown(status["jobs"], counts.get("jobs", len(status["jobs"])), "jobs")
    if counts.get("jobs_finished"):
        jobs_line += f"; {counts['jobs_finished']} finished since the state began, {counts.get('jobs_pruned', 0)} of " \
                     f"them pruned"
    out.write(f"\n{jobs_line}\n")
    if status["jobs"]:
        _table(["ID", "NAME", "DATASET", "MODE", "READS", "FINISHED", "CLIENTS", "ITERATIONS", "GARBAGE COLLECTED"],
               [[j["job_id"], j["job_name"] or "-",
                 f'{j["dataset_id"]} ({j["dataset_name"]})' if j.get("dataset_name") else j["dataset_id"],
                 j["processing_mode"], _reads(j),
                 "yes" if j["finished"] else "no", j["num_clients"], _ids(j["iterations"]),
                 "yes" if j["garbage_collected"] else "no"] for j in status["jobs"]], out)
    clients = status.get("clients") or []
    if clients:
        out.write(f"\nclients reading: {len(clients)} (stall: the share of its time a consumer waited for data)\n")
        _table(["CLIENT", "JOB", "ELEMENTS", "BYTES", "STALL", "ELAPSED", "LAST REPORT"],
               [[c["client_id"], f"{c['job_name'] or '-'} ({c['job_id']})", f"{c['elements']:,}",
                 f"{c['bytes']:,} B", f"{c['stall_fraction'] * 100:.1f}% ({c['stall_s']:.1f} s)",
                 f"{c['elapsed_s']:.1f} s", _ago(c["last_report_s_ago"])] for c in clients], out)
    recommended = status.get("recommended_workers")
    if recommended:
        out.write(f"\nrecommended workers: {recommended['count']} (now {recommended['current']}): "
                  f"{recommended['reason']}\n")
    latency = status.get("rpc_latency_ms") or {}
    if latency:
        out.write("\nRPC latency (recent calls; a long poll waits for news by design: its time is not slowness):\n")
        _table(["METHOD", "CALLS", "P50 MS", "P99 MS", "MAX MS"],
               [[m + (" (long poll)" if v.get("long_poll") else ""), v["calls"], f"{v['p50']:.2f}", f"{v['p99']:.2f}",
                 f"{v['max']:.2f}"] for m, v in latency.items()], out)


def _dispatcher_client(args: argparse.Namespace, parser: argparse.ArgumentParser) -> DispatcherClient:
    """A client of ``--dispatcher`` with the command's token and TLS flags (a bad one exits with usage)."""
    from dataservice.service.dispatcher_client import DispatcherClient

    try:
        auth = ClusterAuth.resolve(_auth_token(args))
        tls = TlsSettings.resolve(args.tls_ca, args.tls_cert, args.tls_key)
    except ValueError as exc:
        parser.error(str(exc))
    return DispatcherClient(args.dispatcher, timeout_ms=args.timeout_ms, auth=auth, tls=tls)


def _registered_workers(response: Any) -> int:
    """The workers a GetStatusResponse counts as registered: those the dispatcher counts as live
    (``scaling.current``), and, when the list is whole, no more than it has heard from since it started (a
    restarted dispatcher's journal lists workers that may not come back).

    Example::

        >>> _registered_workers(client.get_status())
        2
    """
    live = response.scaling.current if response.HasField("scaling") else response.counts.workers
    if len(response.workers) == response.counts.workers:
        live = min(live, sum(1 for w in response.workers if w.last_heartbeat_unix > 0))
    return live


def _wait_for_status(client: DispatcherClient, args: argparse.Namespace) -> tuple[Any, bool]:
    """GetStatus's answer; with ``--wait-workers N``, the first that counts N registered workers, asked every
    STATUS_POLL_S until ``--timeout-ms`` passes. The second value says whether the answer is the one asked for
    (False: the last answer before the deadline)."""
    deadline = time.monotonic() + args.timeout_ms / 1000
    while True:
        response = client.get_status(timeout_s=max(0.05, deadline - time.monotonic()))
        if args.wait_workers is None or _registered_workers(response) >= args.wait_workers:
            return response, True
        if time.monotonic() + STATUS_POLL_S > deadline:
            return response, False
        time.sleep(STATUS_POLL_S)


def _run_status(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    defaulted = args.dispatcher is None
    if defaulted:
        args.dispatcher = _dispatcher_address(f"localhost:{DISPATCHER_PORT}")
    client = _dispatcher_client(args, parser)
    try:
        response, waited = _wait_for_status(client, args)
    except errors.ServiceUnavailableError as exc:
        where = f"{args.dispatcher} (the default without --dispatcher)" if defaulted else args.dispatcher
        print(f"dataservice status: error: cannot reach the dispatcher at {where} within "
              f"{args.timeout_ms} ms ({_one_line(exc)})", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except (errors.WrongEndpointError, errors.PermissionDeniedError) as exc:
        # A wrong --dispatcher or token, like a malformed one: the same exit code.
        print(f"dataservice status: error: {_one_line(exc)}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except errors.DataServiceError as exc:
        print(f"dataservice status: error: {_one_line(exc)}", file=sys.stderr, flush=True)
        return EXIT_FAILURE
    finally:
        client.close()
    if not waited:
        print(f"dataservice status: error: {_registered_workers(response)} of {args.wait_workers} workers registered "
              f"with the dispatcher at {args.dispatcher} within {args.timeout_ms} ms", file=sys.stderr, flush=True)
        return EXIT_FAILURE
    status = status_as_dict(response, target(args.dispatcher))
    if args.json:
        json.dump(status, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        format_status(status, sys.stdout)
    sys.stdout.flush()
    return 0


#: How often ``save-status --wait`` polls.
SAVE_STATUS_POLL_S = 0.5


def _run_save_status(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from dataservice.client.save_status import format_progress, progress_bar, save_progress

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    client = _dispatcher_client(args, parser) if args.dispatcher is not None else None
    bar = args.wait and not args.json and sys.stderr.isatty()
    try:
        while True:
            try:
                progress = save_progress(args.path, client, timeout_s=args.timeout_ms / 1000)
            except FileNotFoundError as exc:
                print(f"dataservice save-status: error: {args.path}: {exc.strerror}", file=sys.stderr, flush=True)
                return EXIT_USAGE
            except errors.DataServiceError as exc:
                print(f"dataservice save-status: error: {_one_line(exc)}", file=sys.stderr, flush=True)
                return EXIT_USAGE if isinstance(exc, errors.ServiceUnavailableError) else EXIT_FAILURE
            if not args.wait or progress["state"] != "running":
                break
            if bar:
                sys.stderr.write("\r" + progress_bar(progress))
                sys.stderr.flush()
            time.sleep(SAVE_STATUS_POLL_S)
    finally:
        if client is not None:
            client.close()
    if bar:
        sys.stderr.write("\r" + progress_bar(progress) + "\n")
    if args.json:
        json.dump(progress, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        format_progress(progress, sys.stdout)
    sys.stdout.flush()
    return EXIT_FAILURE if progress["state"] == "error" else 0


def _run_datasets(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from dataservice.catalogue import command as datasets_command

    return datasets_command.run(args, parser)


def _run_health(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from dataservice.service import health_probe

    return health_probe.run(args, parser)


_COMMANDS = {"dispatcher": _run_dispatcher, "worker": _run_worker, "status": _run_status, "local": _run_local,
             "save-status": _run_save_status, "datasets": _run_datasets, "health": _run_health}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the ``dataservice`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return _COMMANDS[args.command](args, args._parser)
    except SystemExit as exc:  # argparse's --help and errors; return the code instead of exiting
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_USAGE)
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers are installed
        return 130
