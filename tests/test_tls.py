"""TLS on the dispatcher, the workers' gRPC ports and their TCP data path; mutual TLS (issue #10).

A throwaway CA is made here with the ``openssl`` CLI (module fixture ``pki``): a CA, a server
certificate for localhost/127.0.0.1 and a client certificate it signed, and an unrelated CA.
Real dispatchers and workers in this process (``TestCluster``), and real processes for the CLI.
Every failure must be a clear error from ``dataservice.errors`` within a bound: no hang, no
retry loop until ``timeout_ms``, no bare grpc error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import pickle
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import pytest

from dataservice import Dataset, DispatcherConfig, WorkerConfig, distribute, errors, from_dataset_id, \
    register_dataset
from dataservice.client.transports import TcpTransport
from dataservice.proto import worker_pb2
from dataservice.service import cross_memory
from dataservice.service.auth import TOKEN_ENV, TOKEN_FILE_ENV
from dataservice.service.data_transfer import HELLO_MAGIC, REQUEST_HEADER
from dataservice.service.endpoint_probe import EndpointKind, probe_endpoint
from dataservice.service.tls import TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV, TlsSettings
from dataservice.service.wire import OUT_OF_BAND_BYTES
from dataservice.worker.data_server import TLS_PLAINTEXT_ALERT
from tests.cluster import TestCluster, run_with_deadline as cluster_run_with_deadline
from tests.processes import REPO, Processes

TOKEN = "the-cluster-token-0123456789abcdef"
#: The longest any read or refusal here may take: far below the readers' timeout_ms (60 s), so a
#: refusal that turned into a retry loop fails the test instead of passing late.
DEADLINE_S = 20.0

pytestmark = [
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command"),
    # A background thread (fetcher, heartbeat, connection) dying of an exception fails the test.
    pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning"),
]


@dataclasses.dataclass(frozen=True)
class Pki:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    """A throwaway CA, a server certificate for localhost and 127.0.0.1 and a client certificate
    signed by it, and an unrelated CA."""
    d = tmp_path_factory.mktemp("pki")
    days = "2"
    for name in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem",
                 "-days", days, "-subj", f"/CN=dataservice test {name}", cwd=d)
    (d / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subject in (("server", "/CN=localhost"), ("client", "/CN=a dataservice client")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", subject, cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", days, "-extfile", f"{name}.ext", cwd=d)
    return Pki(ca=str(d / "ca.pem"), server_cert=str(d / "server.pem"), server_key=str(d / "server.key"),
               client_cert=str(d / "client.pem"), client_key=str(d / "client.key"), other_ca=str(d / "other-ca.pem"))


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """TLS files and tokens only where a test gives them."""
    for name in (TOKEN_ENV, TOKEN_FILE_ENV, TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV):
        monkeypatch.delenv(name, raising=False)


def big(x):
    """An element with an out-of-band array (its bytes travel as a buffer of their own)."""
    return np.full(OUT_OF_BAND_BYTES // 8 + 3, x, np.float64)


@contextlib.contextmanager
def tls_cluster(pki: Pki, mutual: bool = False, token: Optional[str] = None, num_workers: int = 2,
                data_transfer_protocol: str = "tcp") -> Iterator[TestCluster]:
    """A dispatcher and workers that speak TLS only (requiring client certificates if ``mutual``)."""
    client_ca = pki.ca if mutual else None
    cluster = TestCluster(num_workers=0, tls_cert=pki.server_cert, tls_key=pki.server_key, tls_client_ca=client_ca,
                          auth_token=token)
    try:
        for _ in range(num_workers):
            # Under mutual TLS a worker presents its (server) certificate to the dispatcher.
            cluster.add_worker(tls_cert=pki.server_cert, tls_key=pki.server_key, tls_ca=pki.ca,
                               tls_client_ca=client_ca, auth_token=token,
                               data_transfer_protocol=data_transfer_protocol)
        cluster.wait_for_workers(num_workers)
        yield cluster
    finally:
        cluster.stop()


def run_with_deadline(fn, timeout_s: float = DEADLINE_S):
    return cluster_run_with_deadline(fn, timeout_s)


def read(cluster: TestCluster, mode: str = "parallel_epochs", n: int = 10, **client) -> list:
    ds = Dataset.range(n).map(big).apply(distribute(mode, cluster.target, timeout_ms=60_000, **client))
    return run_with_deadline(lambda: sorted(int(x[0]) for x in ds))


def expected(mode: str, n: int = 10, workers: int = 2) -> list:
    return sorted(list(range(n)) * (workers if mode == "parallel_epochs" else 1))


def data_port(cluster: TestCluster) -> int:
    return int(cluster.workers[0].data_address.rsplit(":", 1)[1])


# --- settings --------------------------------------------------------------------------------------------

def test_settings_say_what_is_wrong(pki, tmp_path, monkeypatch) -> None:
    with pytest.raises(ValueError, match="needs its key: give both --tls-cert and --tls-key"):
        DispatcherConfig(tls_cert=pki.server_cert)
    with pytest.raises(ValueError, match="needs its certificate"):
        WorkerConfig(dispatcher_address="localhost:1", tls_key=pki.server_key)
    with pytest.raises(ValueError, match=f"cannot read the TLS certificate file {tmp_path}/missing.pem"):
        DispatcherConfig(tls_cert=str(tmp_path / "missing.pem"), tls_key=pki.server_key)
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ValueError, match="is not a PEM file"):
        TlsSettings.resolve(ca_file=str(tmp_path / "junk.pem"))
    with pytest.raises(ValueError, match=f"the TLS key file {pki.client_key} does not belong to the certificate"):
        DispatcherConfig(tls_cert=pki.server_cert, tls_key=pki.client_key)
    _openssl("pkey", "-in", pki.client_key, "-out", str(tmp_path / "encrypted.key"), "-aes256", "-passout",
             "pass:secret", cwd=tmp_path)
    with pytest.raises(ValueError, match="is encrypted: give an unencrypted key"):
        TlsSettings.resolve(ca_file=pki.ca, cert_file=pki.client_cert, key_file=str(tmp_path / "encrypted.key"))
    with pytest.raises(ValueError, match="--tls-client-ca .* needs --tls-cert"):
        DispatcherConfig(tls_client_ca=pki.ca)
    with pytest.raises(ValueError, match="needs the CA"):
        distribute("parallel_epochs", "localhost:1", tls_cert=pki.client_cert, tls_key=pki.client_key)
    assert TlsSettings.resolve() is None  # nothing given, nothing set: plaintext
    monkeypatch.setenv(TLS_CA_ENV, pki.ca)
    assert TlsSettings.resolve().ca_file == pki.ca
    assert WorkerConfig(dispatcher_address="localhost:1").tls.ca_file == pki.ca
    settings = TlsSettings.resolve(cert_file=pki.client_cert, key_file=pki.client_key)
    assert "PRIVATE KEY" not in repr(settings) and b"PRIVATE KEY" not in pickle.dumps(settings)
    assert pickle.loads(pickle.dumps(settings)).key == settings.key  # read again from the file


# --- reads ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["parallel_epochs", "distributed_epoch"])
@pytest.mark.parametrize("protocol", ["tcp", "grpc", None])
def test_tls_reads(pki, mode, protocol) -> None:
    with tls_cluster(pki) as cluster:
        assert read(cluster, mode, tls_ca=pki.ca, data_transfer_protocol=protocol) == expected(mode)


@pytest.mark.parametrize("protocol", ["tcp", "grpc"])
def test_tls_reads_with_a_token(pki, protocol) -> None:
    with tls_cluster(pki, token=TOKEN) as cluster:
        assert read(cluster, "distributed_epoch", tls_ca=pki.ca, auth_token=TOKEN,
                    data_transfer_protocol=protocol) == expected("distributed_epoch")


def test_tls_through_workers_that_serve_grpc_only(pki) -> None:
    with tls_cluster(pki, data_transfer_protocol="grpc") as cluster:
        assert read(cluster, "parallel_epochs", tls_ca=pki.ca) == expected("parallel_epochs")


def test_the_ca_from_the_environment_and_registered_datasets(pki, monkeypatch) -> None:
    with tls_cluster(pki) as cluster:
        monkeypatch.setenv(TLS_CA_ENV, pki.ca)
        dataset_id = register_dataset(cluster.target, Dataset.range(6).map(big))
        ds = from_dataset_id("distributed_epoch", cluster.target, dataset_id, data_transfer_protocol="tcp")
        assert run_with_deadline(lambda: sorted(int(x[0]) for x in ds)) == list(range(6))
        # A pickled reader carries the paths (never a key) and reads where it is loaded.
        assert run_with_deadline(lambda: sorted(int(x[0]) for x in pickle.loads(pickle.dumps(ds)))) == list(range(6))


@pytest.mark.parametrize("protocol", ["tcp", "grpc"])
def test_mutual_tls_reads_with_a_client_certificate(pki, protocol) -> None:
    with tls_cluster(pki, mutual=True, token=TOKEN) as cluster:
        assert read(cluster, "distributed_epoch", tls_ca=pki.ca, tls_cert=pki.client_cert, tls_key=pki.client_key,
                    auth_token=TOKEN, data_transfer_protocol=protocol) == expected("distributed_epoch")


def test_mutual_tls_with_the_client_certificate_from_the_environment(pki, monkeypatch) -> None:
    with tls_cluster(pki, mutual=True) as cluster:
        monkeypatch.setenv(TLS_CA_ENV, pki.ca)
        monkeypatch.setenv(TLS_CERT_ENV, pki.client_cert)
        monkeypatch.setenv(TLS_KEY_ENV, pki.client_key)
        assert read(cluster) == expected("parallel_epochs")


# --- refusals: clear, and fast ----------------------------------------------------------------------------

def _timed_failure(fn, kind: type) -> tuple[str, float]:
    start = time.monotonic()
    with pytest.raises(kind) as info:
        run_with_deadline(fn)
    return str(info.value), time.monotonic() - start


def test_mutual_tls_without_a_client_certificate_fails_clearly(pki) -> None:
    with tls_cluster(pki, mutual=True) as cluster:
        message, took = _timed_failure(lambda: read(cluster, tls_ca=pki.ca), errors.PermissionDeniedError)
    assert "requires a client certificate" in message and "tls_cert=" in message and TLS_CERT_ENV in message
    assert took < 10, took


def test_a_client_without_the_ca_fails_clearly_and_fast(pki) -> None:
    with tls_cluster(pki) as cluster:
        message, took = _timed_failure(lambda: read(cluster), errors.WrongEndpointError)
        assert "speaks TLS" in message and "tls_ca=" in message and TLS_CA_ENV in message, message
        assert took < 5, took
        message, _ = _timed_failure(lambda: register_dataset(cluster.target, Dataset.range(3)),
                                    errors.WrongEndpointError)
        assert "--tls-ca" in message


def test_a_client_with_the_wrong_ca_fails_clearly(pki) -> None:
    with tls_cluster(pki) as cluster:
        message, took = _timed_failure(lambda: read(cluster, tls_ca=pki.other_ca), errors.PermissionDeniedError)
    assert "TLS" in message and "not signed by this client's CA" in message and "CERTIFICATE_VERIFY_FAILED" in message
    assert took < 10, took


def test_a_tls_client_of_a_plaintext_cluster_fails_clearly(pki) -> None:
    with TestCluster(num_workers=1) as cluster:
        message, _ = _timed_failure(lambda: read(cluster, tls_ca=pki.ca), errors.WrongEndpointError)
    assert "does not speak TLS" in message, message


def test_a_worker_with_a_certificate_from_another_ca_is_refused_by_the_reader(pki) -> None:
    """The data path verifies the worker too: a TcpTransport with another CA refuses it at once."""
    with tls_cluster(pki, num_workers=1) as cluster:
        transport = TcpTransport(cluster.workers[0].data_address, memory_reads=False,
                                 tls=TlsSettings.resolve(ca_file=pki.other_ca))
        try:
            with pytest.raises(errors.PermissionDeniedError, match="not signed by this client's CA"):
                transport.get(worker_pb2.GetElementsRequest(task_id=1, max_elements=1))
        finally:
            transport.close()


def test_a_plaintext_client_of_the_data_port_is_refused_and_told(pki, caplog) -> None:
    with tls_cluster(pki, num_workers=1, token=TOKEN) as cluster:
        port = data_port(cluster)
        caplog.set_level(logging.WARNING, "dataservice.worker")
        # A raw socket sending the token HELLO: a TLS alert, then the close; nothing is served.
        with socket.create_connection(("localhost", port), timeout=5) as sock:
            sock.sendall(HELLO_MAGIC + bytes(32))
            answer = b""
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
        assert answer == TLS_PLAINTEXT_ALERT
        assert "spoke plaintext to this TLS port" in caplog.text
        # A request without any handshake: the same.
        with socket.create_connection(("localhost", port), timeout=5) as sock:
            body = worker_pb2.GetElementsRequest(probe_memory=True).SerializeToString()
            sock.sendall(REQUEST_HEADER.pack(len(body)) + body)
            assert sock.recv(4096) == TLS_PLAINTEXT_ALERT
        # A dataservice client without the CA says what to do.
        transport = TcpTransport(cluster.workers[0].data_address, memory_reads=False)
        try:
            with pytest.raises(errors.WrongEndpointError, match="speaks TLS.*tls_ca="):
                transport.get(worker_pb2.GetElementsRequest(task_id=1, max_elements=1))
        finally:
            transport.close()
        assert probe_endpoint(f"localhost:{port}").kind is EndpointKind.TLS
        # A silent peer holds its own thread only: TLS readers are served meanwhile.
        with socket.create_connection(("localhost", port), timeout=5):
            assert read(cluster, tls_ca=pki.ca, auth_token=TOKEN, data_transfer_protocol="tcp") == list(range(10))


def test_memory_reads_stay_on_with_tls(pki) -> None:
    if not cross_memory.available():
        pytest.skip("cross-process memory reads are not available here")
    with tls_cluster(pki, num_workers=1) as cluster:
        transport = TcpTransport(cluster.workers[0].data_address, tls=TlsSettings.resolve(ca_file=pki.ca))
        try:
            transport.get(worker_pb2.GetElementsRequest(task_id=10 ** 6, max_elements=1, wait_ms=1))
        except Exception:
            pass  # an unknown task: what matters is the probe, over TLS, before it
        finally:
            assert transport.memory_pid is not None
            transport.close()


# --- the command line ----------------------------------------------------------------------------------

def test_cli_flags_are_checked(pki, capsys) -> None:
    from dataservice import cli

    assert cli.main(["dispatcher", "--port", "0", "--tls-cert", pki.server_cert]) == 2
    assert "give both --tls-cert and --tls-key" in capsys.readouterr().err
    assert cli.main(["worker", "--dispatcher", "localhost:1", "--tls-key", pki.server_key]) == 2
    assert "needs its certificate" in capsys.readouterr().err
    assert cli.main(["status", "--dispatcher", "localhost:1", "--tls-cert", pki.client_cert,
                     "--tls-key", pki.client_key]) == 2
    assert "needs the CA" in capsys.readouterr().err
    assert cli.main(["status", "--dispatcher", "localhost:1", "--tls-ca", "/nonexistent/ca.pem"]) == 2
    assert "cannot read the TLS CA file /nonexistent/ca.pem" in capsys.readouterr().err


@pytest.fixture
def tls_procs(tmp_path) -> Iterator[Processes]:
    with Processes(tmp_path) as procs:
        for name in (TOKEN_ENV, TOKEN_FILE_ENV, TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV):
            procs.env.pop(name, None)
        yield procs


def _status(procs: Processes, port: int, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dataservice", "status", "--dispatcher", f"localhost:{port}",
                           "--json", "--timeout-ms", "5000", *flags], capture_output=True, text=True,
                          env=procs.env, cwd=REPO, timeout=30)


@pytest.mark.slow
def test_cli_servers_with_mutual_tls_and_status(pki, tls_procs) -> None:
    server = ("--tls-cert", pki.server_cert, "--tls-key", pki.server_key, "--tls-client-ca", pki.ca)
    dispatcher = tls_procs.dispatcher(*server)
    tls_procs.worker(dispatcher.port, *server, "--tls-ca", pki.ca)
    client = ("--tls-ca", pki.ca, "--tls-cert", pki.client_cert, "--tls-key", pki.client_key)
    deadline = time.monotonic() + 20
    while True:
        result = _status(tls_procs, dispatcher.port, *client)
        assert result.returncode == 0, result.stderr
        if '"address"' in result.stdout or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert '"address": "localhost:' in result.stdout  # the worker registered over mutual TLS
    # Without a client certificate, and without the CA: exit 2, and a line saying why.
    result = _status(tls_procs, dispatcher.port, "--tls-ca", pki.ca)
    assert result.returncode == 2 and "requires a client certificate" in result.stderr, result.stderr
    result = _status(tls_procs, dispatcher.port)
    assert result.returncode == 2 and "speaks TLS" in result.stderr and "--tls-ca" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    # A client process reads through both the TCP data path and gRPC.
    for protocol in ("tcp", "grpc"):
        code = ("import sys; from dataservice import Dataset, distribute\n"
                "ds = Dataset.range(8).apply(distribute('distributed_epoch', sys.argv[1], tls_ca=sys.argv[2], "
                "tls_cert=sys.argv[3], tls_key=sys.argv[4], data_transfer_protocol=sys.argv[5], timeout_ms=20000))\n"
                "print(sorted(int(x) for x in ds))\n")
        proc = tls_procs.python(code, f"localhost:{dispatcher.port}", pki.ca, pki.client_cert, pki.client_key,
                                protocol)
        proc.wait_for_line(r"^\[0, 1, 2, 3, 4, 5, 6, 7\]$")


@pytest.mark.slow
def test_cli_worker_processes_and_local_with_tls(pki, tls_procs) -> None:
    server = ("--tls-cert", pki.server_cert, "--tls-key", pki.server_key)
    dispatcher = tls_procs.dispatcher(*server)
    tls_procs.worker_processes(dispatcher.port, 2, *server, "--tls-ca", pki.ca)
    result = _status(tls_procs, dispatcher.port, "--tls-ca", pki.ca)
    assert result.returncode == 0, result.stderr
    local = tls_procs.spawn("-m", "dataservice", "local", "--workers", "1", "--port", "0", *server,
                            "--tls-ca", pki.ca, name="local")
    match = local.wait_for_line(r"^local cluster: grpc://localhost:(\d+) with 1 worker$")
    result = _status(tls_procs, int(match.group(1)), "--tls-ca", pki.ca)
    assert result.returncode == 0, result.stderr
    missing = subprocess.run([sys.executable, "-m", "dataservice", "local", "--port", "0", *server],
                             capture_output=True, text=True, env=tls_procs.env, cwd=REPO, timeout=30)
    assert missing.returncode == 2 and "--tls-cert needs --tls-ca" in missing.stderr, missing.stderr
