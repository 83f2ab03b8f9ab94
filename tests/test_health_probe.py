"""Tests of ``dataservice health`` (``dataservice/service/health_probe.py``), the command the compose
file's and the Dockerfile's healthchecks run, against real dispatchers and workers on 127.0.0.1.

Example::

    $ python -m pytest tests/test_health_probe.py
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dataservice import cli
from dataservice.service.auth import TOKEN_ENV, TOKEN_FILE_ENV
from dataservice.service.health_probe import check_health
from dataservice.service.tls import TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV
from tests.cluster import TestCluster, free_port
from tests.processes import run_cli, subprocess_env
from tests.test_tls import pki, tls_cluster  # noqa: F401 - pki is a fixture used here

TOKEN = "the-cluster-token-0123456789abcdef"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """Tokens and TLS files only where a test gives them."""
    for name in (TOKEN_ENV, TOKEN_FILE_ENV, TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV):
        monkeypatch.delenv(name, raising=False)


def health(capsys, *argv: str) -> tuple[int, str, str]:
    """``dataservice health argv...`` in this process: (exit code, stdout, stderr)."""
    code = cli.main(["health", *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def token_file(tmp_path: Path, token: str = TOKEN) -> str:
    path = tmp_path / "token"
    path.write_text(token + "\n")
    return str(path)


def token_cluster() -> TestCluster:
    """A dispatcher and one worker that require the cluster token."""
    cluster = TestCluster(num_workers=0, auth_token=TOKEN)
    try:
        cluster.add_worker(auth_token=TOKEN)
        cluster.wait_for_workers(1)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="module")
def one_worker_cluster():
    cluster = TestCluster(num_workers=1)
    try:
        yield cluster
    finally:
        cluster.stop()


def test_a_serving_dispatcher_and_worker_exit_0(one_worker_cluster, capsys) -> None:
    cluster = one_worker_cluster
    worker = f"localhost:{cluster.workers[0].port}"
    assert health(capsys, cluster.dispatcher_address) == \
        (0, f"grpc://{cluster.dispatcher_address}: SERVING\n", "")
    assert health(capsys, cluster.target, "--service", "dispatcher") == \
        (0, f"grpc://{cluster.dispatcher_address}: SERVING (dataservice.Dispatcher)\n", "")
    assert health(capsys, worker, "--service", "worker") == (0, f"grpc://{worker}: SERVING (dataservice.Worker)\n", "")
    assert health(capsys, worker, "--service", "dataservice.Worker")[0] == 0


def test_the_wrong_kind_of_server_is_unhealthy(one_worker_cluster, capsys) -> None:
    cluster = one_worker_cluster
    code, out, err = health(capsys, cluster.dispatcher_address, "--service", "worker")
    assert (code, out) == (1, "")
    assert err == f"dataservice health: error: {cluster.dispatcher_address} does not serve dataservice.Worker " \
                  f"(is it the right kind of server?)\n"


def test_a_workers_data_transfer_port_is_named(one_worker_cluster, capsys) -> None:
    data_address = one_worker_cluster.workers[0].data_address
    code, _, err = health(capsys, data_address)
    assert code == 1
    assert "is a worker's data-transfer port: pass its gRPC port" in err


def test_nothing_listening_exits_1_with_one_line(capsys) -> None:
    address = f"127.0.0.1:{free_port()}"
    assert health(capsys, address, "--timeout-ms", "2000") == \
        (1, "", f"dataservice health: error: nothing listens at {address} (connection refused)\n")


def test_bad_arguments_are_usage_errors(capsys) -> None:
    code, _, err = health(capsys, "no-port-here")
    assert code == 2 and "dataservice health: error: argument HOST:PORT" in err
    code, _, err = health(capsys, "localhost:5050", "--service", "not a name")
    assert code == 2 and "expected dispatcher, worker, any or a gRPC service name" in err


def test_a_token_cluster_serves_health_without_the_token(capsys, tmp_path) -> None:
    # The health service stays open (Kubernetes' grpc probes cannot send a token); --check-auth asks more.
    with token_cluster() as cluster:
        address = cluster.dispatcher_address
        assert health(capsys, address, "--service", "dispatcher")[0] == 0

        code, out, err = health(capsys, address, "--check-auth")
        assert (code, out) == (1, "")
        assert err == f"dataservice health: error: --check-auth needs the cluster token: pass --auth-token-file " \
                      f"or set {TOKEN_ENV} or {TOKEN_FILE_ENV}\n"

        assert health(capsys, address, "--check-auth", "--auth-token-file", token_file(tmp_path)) == \
            (0, f"grpc://{address}: SERVING; the cluster token is accepted\n", "")


def test_check_auth_with_the_environment_token_and_a_rotated_one(capsys, tmp_path, monkeypatch) -> None:
    # The token from the environment, as the compose services have it.
    with token_cluster() as cluster:
        worker = f"localhost:{cluster.workers[0].port}"
        monkeypatch.setenv(TOKEN_FILE_ENV, token_file(tmp_path))
        assert health(capsys, worker, "--service", "worker", "--check-auth")[0] == 0
        # The file rotated, the server not restarted: it still holds the old token.
        monkeypatch.setenv(TOKEN_FILE_ENV, token_file(tmp_path, "a-rotated-token-0123456789abcdef"))
        code, out, err = health(capsys, worker, "--check-auth")
        assert (code, out) == (1, "")
        assert err.startswith(f"dataservice health: error: {worker} refused this cluster token: it runs with "
                              f"another one")
        # A token file that cannot be read is a failed probe (1), not a traceback.
        monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "missing"))
        code, _, err = health(capsys, worker, "--check-auth")
        assert code == 1 and "cannot read the auth token file" in err


def test_check_auth_of_a_server_without_a_token(one_worker_cluster, capsys, tmp_path) -> None:
    address = one_worker_cluster.dispatcher_address
    code, _, err = health(capsys, address, "--check-auth", "--auth-token-file", token_file(tmp_path))
    assert code == 1
    assert err == f"dataservice health: error: {address} accepts calls without any token: it does not run with " \
                  f"the cluster token\n"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls(pki, capsys) -> None:  # noqa: F811 - the fixture
    with tls_cluster(pki, num_workers=1) as cluster:
        address = f"localhost:{cluster.port}"
        assert health(capsys, address, "--tls-ca", pki.ca)[0] == 0
        code, _, err = health(capsys, address)
        assert code == 1 and f"{address} speaks TLS: pass --tls-ca" in err
        assert check_health(address, "dataservice.Dispatcher", tls=None).healthy is False
        code, _, err = health(capsys, address, "--tls-ca", pki.other_ca)
        assert code == 1 and f"the TLS handshake with {address} failed" in err and "CA" in err
    with tls_cluster(pki, mutual=True, num_workers=1) as cluster:
        address = f"localhost:{cluster.port}"
        code, _, err = health(capsys, address, "--tls-ca", pki.ca)
        assert code == 1 and f"the TLS handshake with {address} failed" in err
        assert health(capsys, address, "--tls-ca", pki.ca, "--tls-cert", pki.client_cert, "--tls-key",
                      pki.client_key)[0] == 0


@pytest.mark.slow
def test_the_command_as_a_process(one_worker_cluster) -> None:
    """What a healthcheck runs: the real command's exit codes."""
    env = subprocess_env()
    result = run_cli(env, "health", one_worker_cluster.dispatcher_address, "--service", "dispatcher")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.endswith("SERVING (dataservice.Dispatcher)\n")
    result = run_cli(env, "health", f"127.0.0.1:{free_port()}", "--timeout-ms", "1000")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("dataservice health: error: nothing listens at 127.0.0.1:")
