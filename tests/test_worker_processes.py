"""Tests of ``dataservice worker --processes N`` (``dataservice/worker/processes.py``).

The first tests run ``WorkerProcesses`` in this process over a fake worker — a few
lines of Python that print a listening line and then serve, crash, fail or hang as
told — so the supervisor's start, restart, give-up and stop logic is checked in well
under a second each. The others start a real dispatcher and a real supervisor with
real worker processes, read through ``distribute`` and kill processes.

Example::

    $ python -m pytest tests/test_worker_processes.py
"""

from __future__ import annotations

import collections
import io
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from typing import Iterator, Optional

import pytest

import dataservice as ds
from dataservice.worker.processes import WorkerProcesses, WorkerProcessesError, follow_supervisor
from tests.processes import (Processes, Server, WorkerProcessGroup, assert_clean_exit, child_pids, free_port,
                             pid_alive, poll_status, tag_with_pid, wait_until)

pytestmark = pytest.mark.slow  # every test here starts real subprocesses

# --- the supervisor over a fake worker ------------------------------------------------------

#: A stand-in for ``dataservice worker``: argv[1] maps a port (or "*") to what the process does.
FAKE_WORKER = r"""
import json, os, signal, socket, sys, time
behaviours, args = json.loads(sys.argv[1]), sys.argv[2:]
port = int(args[args.index("--port") + 1])
data_port = int(args[args.index("--data-transfer-port") + 1])
if not port:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
what = behaviours.get(str(port), behaviours.get("*", "serve"))
if what == "fail":
    print(f"fake worker: cannot bind port {port}", file=sys.stderr, flush=True)
    sys.exit(1)
if what == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if what != "silent":
    print(f"worker listening on localhost:{port} (fake; pid {os.getpid()}, data port {data_port})", flush=True)
if what == "crash":
    sys.exit(3)
while True:
    time.sleep(60)
"""
LISTENING = re.compile(r"^worker listening on localhost:(\d+) \(fake; pid (\d+), data port (\d+)\)$", re.M)


def processes_with(token: str) -> list[int]:
    """Live processes whose command line contains ``token`` (Linux: /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read().decode(errors="replace")
            except OSError:
                continue
            if token in cmdline and pid_alive(int(entry)):
                found.append(int(entry))
    return found


class FakeGroup:
    """``WorkerProcesses`` over ``FAKE_WORKER``; ``start`` runs it on a thread until ``stop``."""

    def __init__(self, behaviours: dict, num_processes: int, **kwargs):
        self.token = f"fake-worker-{os.getpid()}-{time.monotonic_ns()}"  # finds our processes in /proc
        self.out = io.StringIO()
        self.group = WorkerProcesses([sys.executable, "-c", FAKE_WORKER, json.dumps(behaviours), self.token],
                                     num_processes, out=self.out, **kwargs)
        self.stop_event = threading.Event()
        self.error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None

    def listening(self) -> list[tuple[int, int, int]]:
        """(port, pid, data port) of every listening line so far."""
        return [tuple(map(int, m.groups())) for m in LISTENING.finditer(self.out.getvalue())]

    def start(self) -> "FakeGroup":
        def run() -> None:
            try:
                self.group.run(self.stop_event)
            except BaseException as exc:
                self.error = exc
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        self.stop_event.set()
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the supervisor did not stop"
        if self.error is not None:
            raise self.error

    def alive(self) -> list[int]:
        return processes_with(self.token)


@pytest.fixture
def fakes() -> Iterator[list[FakeGroup]]:
    made: list[FakeGroup] = []
    yield made
    for fake in made:  # nothing may outlive a test
        fake.stop_event.set()
        for pid in fake.alive():
            os.kill(pid, signal.SIGKILL)


def fake_group(fakes: list, behaviours: dict, num_processes: int, **kwargs) -> FakeGroup:
    fake = FakeGroup(behaviours, num_processes, **kwargs)
    fakes.append(fake)
    return fake


def test_consecutive_ports_lines_passed_through_then_a_summary(fakes: list) -> None:
    fake = fake_group(fakes, {}, 3, port=40100, data_transfer_port=40200).start()
    wait_until(lambda: "worker processes started" in fake.out.getvalue(), 20, "the summary line")
    lines = fake.out.getvalue().splitlines()
    assert len(lines) == 4, lines
    assert sorted((port, data) for port, _, data in fake.listening()) == [(40100, 40200), (40101, 40201),
                                                                          (40102, 40202)]
    pids = sorted(pid for _, pid, _ in fake.listening())
    assert {port: pid for port, pid, _ in fake.listening()} == dict(zip(fake.group.ports, fake.group.pids))
    assert lines[3] == f"3 worker processes started (ports 40100, 40101, 40102; " \
                       f"pids {', '.join(map(str, fake.group.pids))})"
    assert sorted(fake.group.pids) == pids == sorted(fake.alive())
    assert fake.group.ports == [40100, 40101, 40102]
    fake.stop()
    assert fake.alive() == []


def test_a_process_that_exits_before_listening_fails_the_start_and_stops_the_others(fakes: list) -> None:
    fake = fake_group(fakes, {"40301": "fail"}, 2, port=40300)
    with pytest.raises(WorkerProcessesError, match=r"^cannot start: worker process 1 \(pid \d+, port 40301\) "
                                                   r"exited with code 1 before it started listening$"):
        fake.group.run(threading.Event())
    assert fake.alive() == []
    assert "worker processes started" not in fake.out.getvalue()


def test_a_process_that_never_listens_fails_the_start_at_the_deadline(fakes: list) -> None:
    fake = fake_group(fakes, {"40401": "silent"}, 2, port=40400, start_timeout_s=1.0)
    start = time.monotonic()
    with pytest.raises(WorkerProcessesError, match=r"worker process 1 \(pid \d+, port 40401\) did not start "
                                                   r"listening within 1 s"):
        fake.group.run(threading.Event())
    assert time.monotonic() - start < 10
    assert fake.alive() == []


def test_a_dead_process_is_restarted_on_its_port_until_it_dies_too_often(fakes: list,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    # --port 0: the port the process picked the first time is the one it is restarted on.
    fake = fake_group(fakes, {"*": "crash"}, 1, port=0, max_restarts=3, restart_backoff_s=0.01)
    with pytest.raises(WorkerProcessesError, match=r"worker process 0 \(pid \d+, port \d+\) exited with code 3: "
                                                   r"it died 4 times within 60 s; giving up"):
        fake.group.run(threading.Event())
    runs = fake.listening()
    assert len(runs) == 4 and len({port for port, _, _ in runs}) == 1 and len({pid for _, pid, _ in runs}) == 4
    restarts = [r.getMessage() for r in caplog.records if "restarting it on port" in r.getMessage()]
    assert len(restarts) == 3, restarts
    assert fake.alive() == []


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period(fakes: list) -> None:
    fake = fake_group(fakes, {"*": "stubborn"}, 2, port=40500, stop_grace_s=0.5).start()
    wait_until(lambda: len(fake.listening()) == 2, 20, "two processes listening")
    start = time.monotonic()
    fake.stop()
    assert time.monotonic() - start < 5
    assert fake.alive() == []


def test_follow_supervisor_does_nothing_without_a_supervisor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATASERVICE_SUPERVISOR_PID", raising=False)
    assert follow_supervisor() is False


# --- real processes -------------------------------------------------------------------------

def read_tagged(dispatcher: Server, mode: str, n: int) -> list[tuple[int, int]]:
    """``range(n).map(tag_with_pid)`` through ``distribute``: (element, pid of the worker process) pairs."""
    dataset = ds.Dataset.range(n).map(tag_with_pid).apply(ds.distribute(mode, dispatcher.target, timeout_ms=30_000))
    return [(int(x), int(pid)) for x, pid in dataset]


def test_worker_processes_register_share_the_work_and_stop_on_sigterm(procs: Processes) -> None:
    dispatcher = procs.dispatcher()
    group = procs.worker_processes(dispatcher.port, 2)
    assert set(group.pids) == child_pids(group.proc.pid)
    poll_status(procs.env, dispatcher.port,
                lambda s: sorted(w["address"] for w in s["workers"]) == sorted(group.addresses),
                f"the two worker processes {group.addresses}")

    # distributed_epoch: every element once, produced by both processes.
    pairs = read_tagged(dispatcher, "distributed_epoch", 20_000)
    assert sorted(x for x, _ in pairs) == list(range(20_000))
    assert {pid for _, pid in pairs} == set(group.pids)

    # parallel_epochs: each process is a worker and produces the whole dataset.
    pairs = read_tagged(dispatcher, "parallel_epochs", 300)
    assert sorted(x for x, _ in pairs) == sorted(list(range(300)) * 2)
    assert collections.Counter(pid for _, pid in pairs) == {pid: 300 for pid in group.pids}

    assert_clean_exit(group.proc, signal.SIGTERM)  # its stderr holds the processes' logs too
    assert not any(pid_alive(pid) for pid in group.pids)


def test_a_killed_worker_process_is_restarted_and_a_killed_supervisor_takes_them_along(procs: Processes) -> None:
    dispatcher = procs.dispatcher()
    group = procs.worker_processes(dispatcher.port, 2)
    killed, survivor = group.pids
    lines_before = len(group.proc.lines)
    os.kill(killed, signal.SIGKILL)

    # Restarted on the port it had, so the dispatcher sees a restarted worker at the same address.
    group.proc.wait_for_line(rf"^worker listening on localhost:{group.ports[0]} ", start=lines_before)
    (restarted,) = wait_until(lambda: child_pids(group.proc.pid) - {survivor}, 10, "the restarted process's pid")
    assert restarted != killed and pid_alive(survivor)
    assert re.search(rf"worker process 0 \(pid {killed}, port {group.ports[0]}\) was killed by SIGKILL; "
                     rf"restarting it on port {group.ports[0]}", group.proc.stderr), group.proc.stderr
    pairs = read_tagged(dispatcher, "parallel_epochs", 100)
    assert collections.Counter(pid for _, pid in pairs) == {survivor: 100, restarted: 100}

    # A SIGKILLed supervisor cannot stop its processes: they notice and stop by themselves.
    group.proc.kill9()
    wait_until(lambda: not pid_alive(survivor) and not pid_alive(restarted), 15,
               "the worker processes to exit after their supervisor was killed", interval_s=0.05)


def _port_with_the_next_one_taken() -> tuple[int, socket.socket]:
    """A free port P and a listening socket on P + 1."""
    for _ in range(50):
        port = free_port()
        blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            blocker.bind(("0.0.0.0", port + 1))
            blocker.listen()
            return port, blocker
        except OSError:
            blocker.close()
    raise AssertionError("found no free port whose next port is free too")


def test_a_worker_process_that_cannot_bind_stops_the_others(procs: Processes) -> None:
    dispatcher = procs.dispatcher()
    port, blocker = _port_with_the_next_one_taken()
    with blocker:
        group: WorkerProcessGroup = procs.worker_processes(dispatcher.port, 2, port=port, wait=False)
        code = group.proc.popen.wait(timeout=60)
    stderr = group.proc.stderr
    assert code == 1, stderr
    assert f"cannot bind 127.0.0.1:{port + 1} (the worker's gRPC port): the port is in use" in stderr  # its own error
    assert re.search(rf"dataservice worker: error: cannot start: worker process 1 \(pid \d+, port {port + 1}\) "
                     rf"exited with code 1 before it started listening", stderr), stderr
    assert "worker processes started" not in "".join(group.proc.poll_lines())
    assert processes_with(f"--port\0{port}\0") == []  # the process on the free port was stopped


WATCHED_CHILD = """
import os, signal, time
import dataservice.worker.processes as processes
processes._set_parent_death_signal = lambda signum: False  # as on a system without prctl
signal.signal(signal.SIGTERM, lambda *_: (print("stopping", flush=True), os._exit(0)))
assert processes.follow_supervisor()
print("following", os.getpid(), flush=True)
while True:
    time.sleep(1)
"""

FAKE_SUPERVISOR = """
import os, subprocess, sys
env = dict(os.environ, DATASERVICE_SUPERVISOR_PID=str(os.getpid()))
subprocess.Popen([sys.executable, "-c", sys.argv[1]], env=env).wait()  # stdout shared with the test
"""


def test_without_pdeathsig_a_worker_process_polls_for_its_supervisor(procs: Processes) -> None:
    supervisor = procs.python(FAKE_SUPERVISOR, WATCHED_CHILD, name="fake-supervisor")
    child = int(supervisor.wait_for_line(r"^following (\d+)$").group(1))
    supervisor.kill9()
    supervisor.wait_for_line(r"^stopping$", timeout_s=10)  # the child still holds the stdout pipe
    wait_until(lambda: not pid_alive(child), 10, "the child to exit")
