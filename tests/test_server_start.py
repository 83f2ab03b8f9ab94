"""What a server says when it starts: its listening line once, why a port cannot be bound, and
that it listens on loopback only (``dataservice.service.listening``).

The ``slow`` tests start the ``dataservice`` command as real processes; a taken port is a socket
this test binds and listens on itself.

Example::

    $ python -m pytest tests/test_server_start.py
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from dataservice import DispatchServer, DispatcherConfig, WorkerConfig, WorkerServer
from dataservice import errors
from dataservice.service.listening import LISTENING_RECORD, bind_error
from tests.processes import REPO, Processes, assert_clean_exit, run_cli, subprocess_env

LOOPBACK_NOTICE = "listens on loopback only"


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port of 127.0.0.1 this test listens on, so that a server cannot have it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _listening_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "listening on" in line]


# --- the listening line, once ---------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("command", ["dispatcher", "worker", "local"])
def test_a_server_says_where_it_listens_once(procs: Processes, command: str) -> None:
    if command == "worker":
        dispatcher = procs.dispatcher()
        args = ["worker", "--dispatcher", dispatcher.address, "--port", "0"]
    else:
        args = [command, "--port", "0"] + (["--workers", "1"] if command == "local" else [])
    proc = procs.spawn("-m", "dataservice", *args, name=command)
    proc.wait_for_line(r"^(dispatcher|worker) listening on |^local cluster: ")
    assert_clean_exit(proc, signal.SIGTERM)
    stdout = "".join(proc.poll_lines())
    if command == "local":
        # The printed line names the dispatcher; the worker's port is said in its log line only.
        assert re.fullmatch(r"local cluster: grpc://localhost:\d+ with 1 worker\n", stdout), stdout
        logged = _listening_lines(proc.stderr)
        assert len(logged) == 1 and "dataservice.worker: worker listening on port " in logged[0], proc.stderr
    else:
        assert len(_listening_lines(stdout)) == 1 and stdout.startswith(f"{command} listening on "), stdout
        assert _listening_lines(proc.stderr) == [], proc.stderr


def test_an_in_process_server_logs_where_it_listens_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dataservice")
    dispatcher = DispatchServer(DispatcherConfig(port=0))
    try:
        worker = WorkerServer(WorkerConfig(dispatcher_address=f"localhost:{dispatcher.port}"))
        worker.stop()
    finally:
        dispatcher.stop()
    said = [r.getMessage() for r in caplog.records if "listening on" in r.getMessage()]
    assert said == [f"dispatcher listening on 127.0.0.1:{dispatcher.port}",
                    f"worker listening on port {worker.port} as localhost:{worker.port}; dispatcher "
                    f"localhost:{dispatcher.port}"], said
    # Marked, so that the command, which prints the line itself, can drop it from its log.
    assert all(getattr(r, LISTENING_RECORD, False) for r in caplog.records if "listening on" in r.getMessage())


# --- a port that cannot be bound --------------------------------------------------------------------

#: (command and flags, which port the taken one is, what the error calls it)
TAKEN = {
    "dispatcher gRPC": (["dispatcher", "--port", "{port}"], "the dispatcher's gRPC port"),
    "dispatcher HTTP": (["dispatcher", "--port", "0", "--http-port", "{port}"], "the dispatcher's HTTP port"),
    "worker gRPC": (["worker", "--dispatcher", "localhost:1", "--port", "{port}"], "the worker's gRPC port"),
    "worker data-transfer": (["worker", "--dispatcher", "localhost:1", "--data-transfer-port", "{port}"],
                             "the worker's data-transfer port"),
    "worker HTTP": (["worker", "--dispatcher", "localhost:1", "--http-port", "{port}"], "the worker's HTTP port"),
}


@pytest.mark.slow
@pytest.mark.parametrize("which", sorted(TAKEN))
def test_a_taken_port_says_it_is_in_use(taken_port: int, which: str) -> None:
    args, role = TAKEN[which]
    result = run_cli(subprocess_env(), *(a.format(port=taken_port) for a in args))
    command = args[0]
    assert result.returncode == 1, result
    # One line, the same wording for every port.
    assert result.stderr == (f"dataservice {command}: error: cannot start: cannot bind 127.0.0.1:{taken_port} "
                             f"({role}): the port is in use\n"), result.stderr
    assert result.stdout == ""


@pytest.mark.slow
@pytest.mark.parametrize("host, reason", [
    ("192.0.2.1", "the address is not one of this machine's: listen on one of its addresses, or on 0.0.0.0 for "
                  "every interface"),  # TEST-NET-1: no machine has it
    ("no-such-host.invalid", "the host name does not resolve ("),  # .invalid never resolves (RFC 6761)
])
def test_an_address_that_cannot_be_assigned_is_told_from_a_taken_port(host: str, reason: str) -> None:
    result = run_cli(subprocess_env(), "dispatcher", "--port", "0", "--host", host, "--insecure")
    assert result.returncode == 1, result
    assert result.stderr.startswith(f"dataservice dispatcher: error: cannot start: cannot bind {host}:0 (the "
                                    f"dispatcher's gRPC port): {reason}"), result.stderr
    assert "in use" not in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr


@pytest.mark.slow
def test_a_privileged_port_says_permission_denied(tmp_path: Path) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("privileged ports are tested on Linux")
    first = int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text())
    if first <= 1:
        pytest.skip(f"every port from {first} up is unprivileged here (net.ipv4.ip_unprivileged_port_start)")
    command = [sys.executable, "-m", "dataservice", "dispatcher", "--port", "1"]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("runs as root, and util-linux's setpriv (to drop CAP_NET_BIND_SERVICE) is not installed")
        command = ["setpriv", "--bounding-set", "-net_bind_service", "--inh-caps", "-net_bind_service", *command]
    result = subprocess.run(command, capture_output=True, text=True, env=subprocess_env(), cwd=REPO, timeout=30)
    assert result.returncode == 1, result
    assert result.stderr == ("dataservice dispatcher: error: cannot start: cannot bind 127.0.0.1:1 (the dispatcher's "
                             "gRPC port): permission denied: ports below 1024 need root (or CAP_NET_BIND_SERVICE); "
                             "use a port from 1024 up\n"), result.stderr


def test_the_reason_is_found_by_binding_the_address(taken_port: int) -> None:
    # What create_server does when gRPC says only that it failed: no error in hand, so it binds itself.
    assert str(bind_error(f"127.0.0.1:{taken_port}", "the dispatcher's gRPC port")) == \
        f"cannot bind 127.0.0.1:{taken_port} (the dispatcher's gRPC port): the port is in use"
    assert str(bind_error("[::]:0", "the worker's gRPC port")).endswith(
        "it failed, though the address can be bound now (another process held the port for a moment?)")


def test_a_worker_whose_data_port_is_taken_frees_its_grpc_port(taken_port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(errors.ServiceUnavailableError, match=rf"cannot bind 127\.0\.0\.1:{taken_port} \(the worker's "
                                                             rf"data-transfer port\): the port is in use"):
        WorkerServer(WorkerConfig(dispatcher_address="localhost:1", port=port, data_transfer_port=taken_port,
                                  dispatcher_timeout_ms=200))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as again:
        again.bind(("127.0.0.1", port))  # OSError if the failed worker still held it


# --- loopback only --------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("command", ["dispatcher", "worker"])
def test_a_loopback_server_says_so_and_how_to_open_it_up(procs: Processes, tmp_path: Path, command: str) -> None:
    args = ["-m", "dataservice", command, "--port", "0"]
    if command == "worker":  # a dispatcher to register with: a worker prints its line once registered (or 5 s on)
        args += ["--dispatcher", procs.dispatcher().address]
    loopback = procs.spawn(*args, name=f"loopback-{command}")
    port = int(loopback.wait_for_line(rf"^{command} listening on (?:grpc://)?localhost:(\d+)").group(1))
    # Logged during the start, before the line above is printed.
    notice = [line for line in loopback.stderr.splitlines() if LOOPBACK_NOTICE in line]
    assert len(notice) == 1, loopback.stderr
    assert f"the {command} listens on loopback only (127.0.0.1:{port}): other machines " \
           f"cannot reach it. To open it up: --host 0.0.0.0 with the cluster's token on every member " \
           f"(--auth-token-file PATH, or DATASERVICE_AUTH_TOKEN / DATASERVICE_AUTH_TOKEN_FILE" in notice[0]

    token = tmp_path / "token"
    token.write_text("a-cluster-token-of-32-characters")
    opened = procs.spawn(*args, "--host", "0.0.0.0", "--auth-token-file", str(token), name=f"opened-{command}")
    opened.wait_for_line(rf"^{command} listening on ")
    assert LOOPBACK_NOTICE not in opened.stderr, opened.stderr
