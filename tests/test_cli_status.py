"""``dataservice status``: waiting for workers (``--wait-workers``), the default dispatcher address,
and the long polls in its latency table.

The command runs as a real process (``python -m dataservice status``) against a cluster in this
process (the ``cluster`` fixture), or, for the default address, against a dispatcher in a network
namespace of its own, where port 5050 is free whatever else runs on this machine.

Example::

    $ python -m pytest tests/test_cli_status.py
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest

import dataservice as ds
from dataservice.cli import DISPATCHER_PORT
from dataservice.proto import dispatcher_pb2
from tests import netns
from tests.cluster import TestCluster, wait_until
from tests.processes import REPO, Processes, run_cli, subprocess_env

#: Bounds a status command that should have ended (its own deadline is far shorter).
COMMAND_TIMEOUT_S = 60.0


def _status_calls(cluster: TestCluster) -> int:
    """GetStatus calls the cluster's dispatcher has answered."""
    return sum(m.calls for m in cluster.dispatcher.core.rpc_stats.summary() if m.method == "GetStatus")


def _status(cluster: TestCluster, *flags: str) -> subprocess.CompletedProcess:
    return run_cli(subprocess_env(), "status", "--dispatcher", cluster.dispatcher_address, *flags,
                   timeout_s=COMMAND_TIMEOUT_S)


@pytest.mark.slow
def test_wait_workers_exits_0_with_the_status_once_they_registered(cluster: TestCluster) -> None:
    # A third worker comes while the command waits for it.
    command = subprocess.Popen([sys.executable, "-m", "dataservice", "status", "--dispatcher",
                                cluster.dispatcher_address, "--wait-workers", "3", "--timeout-ms", "30000", "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env(),
                               cwd=REPO)
    try:
        # Once it has asked (and seen two workers), the third one starts.
        wait_until(lambda: _status_calls(cluster) >= 1 or command.poll() is not None, COMMAND_TIMEOUT_S,
                   "the command's first GetStatus")
        assert command.poll() is None, command.communicate()  # two workers: it waits on
        worker = cluster.add_worker()
        out, err = command.communicate(timeout=COMMAND_TIMEOUT_S)
    finally:
        if command.poll() is None:
            command.kill()
            command.communicate()
    assert command.returncode == 0, err
    status = json.loads(out)  # what `status --json` prints
    assert worker.address in {w["address"] for w in status["workers"]} and len(status["workers"]) == 3


@pytest.mark.slow
def test_wait_workers_already_there_exits_0_at_once(cluster: TestCluster) -> None:
    result = _status(cluster, "--wait-workers", "2", "--timeout-ms", "30000")
    assert result.returncode == 0, result.stderr
    assert "workers: 2" in result.stdout and all(w.address in result.stdout for w in cluster.workers)


@pytest.mark.slow
def test_wait_workers_exits_1_at_the_deadline_saying_how_many_came(cluster: TestCluster) -> None:
    start = time.monotonic()
    result = _status(cluster, "--wait-workers", "3", "--timeout-ms", "1500")
    elapsed = time.monotonic() - start
    assert result.returncode == 1, result
    assert result.stderr == (f"dataservice status: error: 2 of 3 workers registered with the dispatcher at "
                             f"{cluster.dispatcher_address} within 1500 ms\n"), result.stderr
    assert result.stdout == ""
    assert elapsed >= 1.5, elapsed  # it waited until the deadline


@pytest.mark.slow
def test_wait_workers_does_not_count_a_stopped_worker(cluster: TestCluster) -> None:
    cluster.stop_worker(1)
    # Lost to the dispatcher after worker_timeout_ms (2 s here); the status still lists it.
    wait_until(lambda: cluster.dispatcher.core.recommended_workers().current == 1, 20, "the worker to be lost")
    assert cluster.dispatcher.core.get_status(dispatcher_pb2.GetStatusRequest()).counts.workers == 2
    result = _status(cluster, "--wait-workers", "2", "--timeout-ms", "1500")
    assert result.returncode == 1, result
    assert "1 of 2 workers registered" in result.stderr, result.stderr


@pytest.mark.slow
def test_wait_workers_for_an_unreachable_dispatcher_exits_2(cluster: TestCluster) -> None:
    address = cluster.dispatcher_address
    cluster.stop_dispatcher()
    result = run_cli(subprocess_env(), "status", "--dispatcher", address, "--wait-workers", "1", "--timeout-ms", "500")
    assert result.returncode == 2, result
    assert result.stderr.startswith(f"dataservice status: error: cannot reach the dispatcher at {address} within "
                                    f"500 ms"), result.stderr


@pytest.mark.slow
def test_the_latency_table_marks_long_polls(cluster: TestCluster) -> None:
    # A distributed_epoch read asks for splits (GetSplit); the workers heartbeat (WorkerHeartbeat).
    dataset = ds.Dataset.range(20).apply(ds.distribute("distributed_epoch", cluster.target, timeout_ms=20_000))
    assert sorted(int(x) for x in dataset) == list(range(20))
    table = _status(cluster)
    assert table.returncode == 0, table.stderr
    rows = table.stdout.split("RPC latency", 1)[1].splitlines()
    assert "a long poll waits for news by design" in rows[0], rows[0]
    methods = {row.split("  ")[0]: row for row in rows[2:] if row.strip()}
    assert {"WorkerHeartbeat (long poll)", "GetSplit (long poll)"} <= set(methods), methods
    assert "GetOrCreateIteration" in methods, methods  # an ordinary call: not marked
    status = json.loads(_status(cluster, "--json").stdout)["rpc_latency_ms"]
    assert {m for m, v in status.items() if v["long_poll"]} == {"WorkerHeartbeat", "GetSplit"}, status


@pytest.mark.slow
def test_status_without_dispatcher_asks_localhost_5050(procs: Processes) -> None:
    why = netns.unavailable()
    if why:
        pytest.skip(f"needs a network namespace of its own, so as not to take port {DISPATCHER_PORT} from this "
                    f"machine: {why}")
    with netns.Network("10.78.0") as net:
        host = net.add_host("solo", 2)
        # Both with their defaults: the dispatcher on localhost:5050 of the namespace, status asking there.
        dispatcher = net.spawn(procs, host, "-m", "dataservice", "dispatcher", name="dispatcher")
        dispatcher.wait_for_line(rf"^dispatcher listening on grpc://localhost:{DISPATCHER_PORT}$")
        status = subprocess.run(["ip", "netns", "exec", host.namespace, sys.executable, "-m", "dataservice", "status"],
                                capture_output=True, text=True, env=procs.env, cwd=REPO, timeout=COMMAND_TIMEOUT_S)
        assert status.returncode == 0, status.stderr
        assert status.stdout.startswith(f"dispatcher grpc://localhost:{DISPATCHER_PORT} (incarnation "), status.stdout
        assert dispatcher.stop(signal.SIGINT) == 0, dispatcher.stderr
        # Nothing there: the error says the address was the default.
        missing = subprocess.run(["ip", "netns", "exec", host.namespace, sys.executable, "-m", "dataservice",
                                  "status", "--timeout-ms", "300"], capture_output=True, text=True, env=procs.env,
                                 cwd=REPO, timeout=COMMAND_TIMEOUT_S)
        assert missing.returncode == 2, missing
        assert re.match(rf"dataservice status: error: cannot reach the dispatcher at localhost:{DISPATCHER_PORT} \(the "
                        rf"default without --dispatcher\) within 300 ms", missing.stderr), missing.stderr
