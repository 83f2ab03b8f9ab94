"""Across hosts, really: a dispatcher, two workers and a client, each on a "host" of its own — a Linux network
namespace with its own address on a bridged 10.77.0.0/24 (tests/netns.py) — read in both processing modes.

What is checked:

- the elements came over TCP, across the simulated network: the client's per-transport byte counters
  (``dataservice.client.transports.received_bytes``) show every payload byte on the TCP socket and none copied
  from a worker's memory, and the kernel's counters of the client's and each worker's interface moved at least
  that many bytes. The hosts share one kernel and pid space, so a reader could copy from a worker's memory
  (``process_vm_readv``) across namespaces; it does not, because a worker in another network namespace counts
  as another host (``cross_memory.same_network_namespace``), which the first tests check on their own;
- every element arrives intact (its payload is checked), in parallel_epochs once per worker, in
  distributed_epoch once;
- killing every process on one worker's host (SIGKILL) mid-epoch in distributed_epoch still delivers each
  element exactly once: the dispatcher revokes the silent worker's task and its unfinished splits are redone
  by the other.

Skipped, with the reason, where network namespaces cannot be created (not root, no ``ip``, no permission).

Example::

    $ sudo .venv/bin/python -m pytest tests/test_multihost.py -q
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests import netns
from tests.netns import Host, Network
from tests.processes import Proc, Processes, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True, scope="module")
def namespaces_can_be_created() -> None:
    """Skips the module, saying why, where network namespaces cannot be created (probed when it runs, not at
    collection: collecting creates nothing)."""
    why_not = netns.unavailable()
    if why_not is not None:
        pytest.skip(f"multi-host test: {why_not}")

#: Each host has its own port space, so fixed ports never collide with anything else on the machine.
DISPATCHER_PORT, WORKER_PORT, DATA_PORT = 5050, 5051, 5052
#: Bytes of each element's array: large enough to travel out of band, the arrays a memory read would copy.
BLOCK_BYTES = 64 * 1024
#: The longest a read (or its remainder after a kill) may take.
READ_TIMEOUT_S = 45.0
#: The longest a process may take to start: Python with grpc and numpy, on a machine that may be loaded.
START_TIMEOUT_S = 45.0

#: The reader, run on the client host: reads ``range(n)`` mapped to (index, worker pid, block of index % 251)
#: through the service, checks each block, and prints a JSON summary (and "read k" every 100 elements).
#: ``make_block`` is defined in ``__main__``, so cloudpickle ships it by value: the workers need no test code.
CLIENT_SCRIPT = r"""
import collections, json, os, sys, time
import numpy as np
import dataservice as ds
from dataservice.client.transports import received_bytes

service, mode, n, block, pace_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])


def make_block(i):
    if pace_s:
        time.sleep(pace_s)  # paced, so that a kill lands mid-epoch
    return np.int64(i), np.int64(os.getpid()), np.full(block, i % 251, np.uint8)


# compression=None: the byte counts are checked against the payload (these blocks compress to almost nothing,
# and compression="AUTO" compresses between hosts when that pays on the link: tests/test_compression.py).
dataset = ds.Dataset.range(n).map(make_block).apply(
    ds.distribute(mode, service, max_outstanding_requests=32, timeout_ms=30_000, compression=None))
indices, by_pid, corrupt, payload = [], collections.Counter(), [], 0
for k, (i, pid, data) in enumerate(dataset, 1):
    indices.append(int(i))
    by_pid[int(pid)] += 1
    payload += data.nbytes
    if data.shape != (block,) or data.min() != int(i) % 251 or data.max() != int(i) % 251:
        corrupt.append(int(i))
    if k % 100 == 0:
        print(f"read {k}", flush=True)
print("result " + json.dumps({"indices": indices, "by_pid": by_pid, "corrupt": corrupt, "payload": payload,
                              "received": received_bytes()}), flush=True)
"""


class Cluster:
    """The four hosts and the processes on them."""

    def __init__(self, procs: Processes, net: Network, token_file: Path):
        self.procs, self.net, self.token_file = procs, net, token_file
        self.dispatcher_host = net.add_host("dispatcher", 2)
        self.worker_hosts = [net.add_host("worker1", 3), net.add_host("worker2", 4)]
        self.client_host = net.add_host("client", 5)
        self.service = f"{self.dispatcher_host.address}:{DISPATCHER_PORT}"
        self.dispatcher = net.spawn(
            procs, self.dispatcher_host, "-m", "dataservice", "dispatcher", "--host", self.dispatcher_host.address,
            "--port", str(DISPATCHER_PORT), "--auth-token-file", str(token_file),
            # Short: a killed worker is noticed within a second.
            "--worker-timeout-ms", "1000", "--job-gc-check-interval-ms", "200", name="dispatcher")
        self.workers = [self.start_worker(host) for host in self.worker_hosts]
        # The stdout lines name the address given with --host, once: not again in the log.
        self.dispatcher.wait_for_line(rf"^dispatcher listening on grpc://{re.escape(self.service)}$", START_TIMEOUT_S)
        assert "listening on" not in self.dispatcher.stderr, self.dispatcher.stderr
        for host, worker in zip(self.worker_hosts, self.workers):
            worker.wait_for_line(rf"^worker listening on {re.escape(self.worker_address(host))} \(dispatcher ",
                                 START_TIMEOUT_S)
            wait_until(lambda: f"worker {self.worker_address(host)} registered" in self.dispatcher.stderr,
                       START_TIMEOUT_S, f"worker {host.name} to register with the dispatcher")

    @staticmethod
    def worker_address(host: Host) -> str:
        return f"{host.address}:{WORKER_PORT}"

    def start_worker(self, host: Host) -> Proc:
        return self.net.spawn(
            self.procs, host, "-m", "dataservice", "worker", "--dispatcher", self.service, "--host", host.address,
            "--port", str(WORKER_PORT), "--data-transfer-port", str(DATA_PORT),
            "--worker-address", f"{host.address}:%port%", "--auth-token-file", str(self.token_file),
            "--heartbeat-interval-ms", "100", "--dispatcher-timeout-ms", "30000", name="worker")

    def read(self, mode: str, n: int, pace_s: float = 0.0) -> Proc:
        """Starts the reader on the client host."""
        return self.net.spawn(self.procs, self.client_host, "-c", CLIENT_SCRIPT, self.service, mode, str(n),
                              str(BLOCK_BYTES), str(pace_s), name=f"client-{mode}")

    def traffic(self) -> dict[str, dict[str, int]]:
        """Each host's interface counters (bytes in and out)."""
        return {host.name: self.net.interface_bytes(host) for host in self.net.hosts}


def result_of(client: Proc) -> dict:
    line = client.wait_for_line(r"^result ", READ_TIMEOUT_S).string
    return json.loads(line[len("result "):])


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Cluster]:
    procs = Processes(tmp_path)
    # The token is what lets the servers listen beyond localhost; the client reads the same file.
    token_file = tmp_path / "token"
    token_file.write_text("multihost-test-token-" + "k" * 32)
    procs.env["DATASERVICE_AUTH_TOKEN_FILE"] = str(token_file)
    net = Network("10.77.0")
    try:
        yield Cluster(procs, net, token_file)
    finally:
        try:
            procs.close()
        finally:
            net.close()  # the namespaces go even when the test (or a process) failed
        for proc in procs.procs:  # shown by pytest when the test failed
            print(f"===== {' '.join(proc.args[3:7])} (exit {proc.popen.returncode})\n"
                  f"stdout: {''.join(proc.lines[-5:])}\nstderr (tail): {proc.stderr[-3000:]}")


def delta(before: dict, after: dict) -> dict[str, dict[str, int]]:
    return {host: {way: after[host][way] - before[host][way] for way in ("rx", "tx")} for host in after}


def assert_crossed_the_network(hosts: Cluster, result: dict, moved: dict) -> None:
    """Every payload byte came over TCP (none from a worker's memory), and the interfaces carried them."""
    payload = result["payload"]
    received = result["received"]
    shares = {host.name: result["by_pid"].get(str(worker.pid), 0) for host, worker in zip(hosts.worker_hosts,
                                                                                           hosts.workers)}
    # The figures (pytest -s shows them): the README quotes them.
    print(f"\npayload {payload:,} B; elements by worker: {shares}; the client's transports: {received}; "
          f"interfaces: {moved}")
    assert received["memory"] == 0 and received["grpc"] == 0, f"not all over TCP: {received}"
    assert received["tcp"] >= payload, f"TCP carried {received['tcp']} bytes of {payload}: {received}"
    assert moved["client"]["rx"] >= payload, f"the client's interface received less than the payload: {moved}"
    for host, worker in zip(hosts.worker_hosts, hosts.workers):
        sent = result["by_pid"].get(str(worker.pid), 0) * BLOCK_BYTES
        assert sent > 0, f"{host.name} (pid {worker.pid}) produced nothing: {result['by_pid']}"
        assert moved[host.name]["tx"] >= sent, f"{host.name} sent less than its {sent} bytes of elements: {moved}"


# --- the same-host decision, on its own --------------------------------------------------------------------

#: Serves two one-task DataServers on argv[1] (each to one reader), prints their ports, serves until killed.
SERVE_SCRIPT = r"""
import sys, time
from dataservice import Dataset
from dataservice.worker.data_server import DataServer
from tests.test_data_transfer import OneTaskWorker, big

servers = [DataServer(OneTaskWorker(Dataset.range(20).map(big)), host=sys.argv[1]) for _ in range(2)]
for server in servers:
    server.start()
print(" ".join(str(server.port) for server in servers), flush=True)
time.sleep(600)
"""

#: Reads the one task of the DataServer at argv[1] over TcpTransport (memory reads allowed) and prints what it
#: decided: the pid it copies from (or null), the bytes by transport and whether the elements are right.
TRANSPORT_SCRIPT = r"""
import json, sys
from dataservice.client.transports import TcpTransport, received_bytes
from tests.test_data_transfer import big, read_all

transport = TcpTransport(sys.argv[1], memory_reads=True)
elements = read_all(transport)
ok = [int(e[0]) for e in elements] == list(range(20)) and all((e == big(int(e[0]))).all() for e in elements)
print(json.dumps({"memory_pid": transport.memory_pid, "received": received_bytes(), "ok": ok}), flush=True)
transport.close()
"""


WAIT_SCRIPT = "import time; print('up', flush=True); time.sleep(600)"


def test_same_network_namespace_tells_a_process_on_another_host(tmp_path):
    from dataservice.service.cross_memory import same_network_namespace

    procs = Processes(tmp_path)
    net = Network("10.77.0")
    try:
        # Each prints "up", then waits to be killed (at the end of the test).
        here = procs.python(WAIT_SCRIPT, name="here")
        there = net.spawn(procs, net.add_host("there", 2), "-c", WAIT_SCRIPT, name="there")
        here.wait_for_line("^up$", START_TIMEOUT_S)
        there.wait_for_line("^up$", START_TIMEOUT_S)
        assert same_network_namespace(os.getpid())
        assert same_network_namespace(here.pid)
        assert not same_network_namespace(there.pid)
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        assert not same_network_namespace(gone.pid)  # no such process: not known to be here
    finally:
        try:
            procs.close()
        finally:
            net.close()


def test_reader_copies_memory_only_from_a_worker_in_its_network_namespace(tmp_path):
    procs = Processes(tmp_path)
    net = Network("10.77.0")
    try:
        server_host, other_host = net.add_host("server", 2), net.add_host("other", 3)
        server = net.spawn(procs, server_host, "-c", SERVE_SCRIPT, server_host.address, name="dataservers")
        ports = server.wait_for_line(r"^(\d+) (\d+)$", START_TIMEOUT_S).groups()
        answers = {}
        for host, port in zip((server_host, other_host), ports):
            reader = net.spawn(procs, host, "-c", TRANSPORT_SCRIPT, f"{server_host.address}:{port}", name="reader")
            answers[host.name] = json.loads(reader.wait_for_line(r"^\{", READ_TIMEOUT_S).string)
        same, other = answers["server"], answers["other"]
        assert same["ok"] and other["ok"], answers
        # The same network namespace: the large arrays are copied from the server's memory.
        assert same["memory_pid"] == server.pid and same["received"]["memory"] > 0, answers
        # Another one, on the same kernel and pid space: over TCP, though the copy would have worked.
        assert other["memory_pid"] is None and other["received"]["memory"] == 0, answers
        assert other["received"]["tcp"] >= same["received"]["memory"] > 0, answers  # the same arrays, by socket
    finally:
        try:
            procs.close()
        finally:
            net.close()


# --- the cluster across hosts ------------------------------------------------------------------------------

def test_parallel_epochs_across_hosts_comes_over_tcp(hosts):
    n = 300
    before = hosts.traffic()
    result = result_of(hosts.read("parallel_epochs", n))
    moved = delta(before, hosts.traffic())
    # Each worker produces the whole dataset: every element twice, once from each.
    assert collections.Counter(result["indices"]) == {i: 2 for i in range(n)}
    assert sorted(result["by_pid"].values()) == [n, n], result["by_pid"]
    assert result["corrupt"] == []
    assert result["payload"] == 2 * n * BLOCK_BYTES
    assert_crossed_the_network(hosts, result, moved)


def test_distributed_epoch_across_hosts_comes_over_tcp(hosts):
    n = 600
    before = hosts.traffic()
    result = result_of(hosts.read("distributed_epoch", n))
    assert sorted(result["indices"]) == list(range(n)), f"{len(result['indices'])} elements, not range({n}) once"
    assert result["corrupt"] == []
    assert_crossed_the_network(hosts, result, delta(before, hosts.traffic()))


def test_distributed_epoch_across_hosts_keeps_exactly_once_when_a_worker_host_is_killed(hosts):
    # One worker's host loses every process (SIGKILL) mid-epoch: still each element once.
    n = 3000
    victim_host, victim = hosts.worker_hosts[0], hosts.workers[0]
    before = hosts.traffic()
    client = hosts.read("distributed_epoch", n, pace_s=0.002)  # ~3 s of production per worker
    client.wait_for_line(r"^read 600$", READ_TIMEOUT_S)
    assert not any(line.startswith("result ") for line in client.poll_lines()), \
        "the read ended before the kill: make the pipeline slower"
    killed = hosts.net.pids(victim_host)
    assert victim.pid in killed, f"the worker (pid {victim.pid}) is not among {victim_host.name}'s processes {killed}"
    for pid in killed:  # every process on that host: all started by this test
        os.kill(pid, signal.SIGKILL)
    victim.popen.wait(timeout=10)
    wait_until(lambda: not hosts.net.pids(victim_host), 10, f"{victim_host.name}'s processes to die")
    result = result_of(client)
    counts = collections.Counter(result["indices"])
    missing = [i for i in range(n) if counts[i] == 0]
    repeated = sorted(i for i, c in counts.items() if c > 1)
    assert not missing and not repeated and len(counts) == n, \
        f"{len(result['indices'])} elements: {len(missing)} missing (first {missing[:10]}), " \
        f"{len(repeated)} repeated (first {repeated[:10]})"
    assert result["corrupt"] == []
    # Both served (assert_crossed_the_network checks each sent its share): the killed one until the kill, the
    # other the rest, its own splits and the killed one's unfinished ones, once the dispatcher revoked its task.
    assert re.search(rf"revoked task \d+ on worker {re.escape(hosts.worker_address(victim_host))} "
                     rf"\(no heartbeat for 1000 ms\)", hosts.dispatcher.stderr), hosts.dispatcher.stderr[-3000:]
    assert_crossed_the_network(hosts, result, delta(before, hosts.traffic()))
