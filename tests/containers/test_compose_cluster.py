"""Issue 29: ``docker-compose.yml`` built and run for real, broken, and torn down (``make test-containers``).

In order, on one cluster (the tests share it and must run in this file's order; ``-x`` stops at the first
failure, and the last test tears everything down whatever happened):

1. The image builds with the locked versions, from ``python:3.11-slim`` or, where no registry answers, from
   ``deploy/base-image.sh``'s base; it runs as a non-root user.
2. ``docker compose up``: dispatcher, two workers, the token secret, health checks, all ``healthy``; then the
   client service, as written, trains through them to its end.
3. ``docker kill`` of a worker container mid-epoch in ``distributed_epoch``: the read completes with every
   element exactly once, and the worker container is back and healthy.
4. The dispatcher container restarted (``--fault-tolerant`` on its named volume) mid-read of a named job: the
   journal is replayed and the job's read completes, exactly once.
5. The token rotated: the servers refuse the old one once they restart with the new one, and are healthy.
6. ``/metrics`` and ``/status.json`` scraped from the host's loopback port.
7. ``docker compose down -v``: no container, network or volume of the project is left.

The figures (image size, build time, time to healthy, a worker's recovery after its kill) are printed and
written to ``$DATASERVICE_CONTAINER_FIGURES`` (JSON) when set.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.containers.compose_cluster import IMAGE, REPO, ComposeProject, build_image, \
    engine_problem, image_size_mb, run

SERVERS = ["dispatcher", "worker1", "worker2"]
#: Bounds: a cold build downloads the dependencies; a start replays nothing; a read of the checks is seconds.
HEALTHY_TIMEOUT_S = 240.0
READ_TIMEOUT_S = 300.0
FIGURES: dict = {}
COUNT_READ = (Path(__file__).with_name("count_read.py")).read_text()


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> ComposeProject:
    problem = engine_problem(tmp_path_factory.mktemp("engine") / "dockerd.log")
    if problem is not None:
        pytest.skip(f"container tests skipped: {problem}")
    FIGURES["build_s"] = round(build_image(), 1)
    FIGURES["image_mb"] = round(image_size_mb(), 1)
    project = ComposeProject(tmp_path_factory.mktemp("compose"), token=secrets.token_urlsafe(32))
    try:
        yield project
    finally:
        project.down()
        path = os.environ.get("DATASERVICE_CONTAINER_FIGURES")
        if path:
            Path(path).write_text(json.dumps(FIGURES, indent=1) + "\n")
        print(f"\ncontainer figures: {json.dumps(FIGURES)}")


class Reader:
    """``count_read.py`` in a client container, its output followed line by line on a thread."""

    def __init__(self, project: ComposeProject, n: int, delay_ms: float, job_name: str = ""):
        self.lines: list[str] = []
        self._progress = threading.Condition()
        self.proc = subprocess.Popen(project.client_command("-c", COUNT_READ, str(n), str(delay_ms), job_name,
                                                            entrypoint="python"),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     stdin=subprocess.DEVNULL)
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        for line in self.proc.stdout:
            with self._progress:
                self.lines.append(line.rstrip("\n"))
                self._progress.notify_all()
        with self._progress:
            self._progress.notify_all()

    def received(self) -> int:
        counts = [int(m.group(1)) for line in self.lines for m in [re.fullmatch(r"progress (\d+)", line)] if m]
        return max(counts, default=0)

    def wait_for(self, count: int, timeout_s: float) -> None:
        """Until ``count`` elements were received (the reader is mid-read)."""
        deadline = time.monotonic() + timeout_s
        with self._progress:
            while self.received() < count:
                if self.proc.poll() is not None and not self._thread.is_alive():
                    raise AssertionError("the reader ended before receiving "
                                         f"{count} elements:\n" + "\n".join(self.lines[-40:]))
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"the reader received {self.received()} of {count} elements in "
                                         f"{timeout_s:.0f} s:\n" + "\n".join(self.lines[-40:]))
                self._progress.wait(remaining)

    def result(self, timeout_s: float) -> dict:
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"the reader did not end within {timeout_s:.0f} s:\n" + "\n".join(self.lines[-40:]))
        self._thread.join(10)
        found = [line[len("RESULT "):] for line in self.lines if line.startswith("RESULT ")]
        assert self.proc.returncode == 0 and found, \
            f"the reader exited with {self.proc.returncode}:\n" + "\n".join(self.lines[-40:])
        return json.loads(found[-1])


def assert_exactly_once(result: dict, n: int) -> None:
    assert result == {"elements": n, "distinct": n, "duplicates": 0, "missing": 0}, result


def wait_healthy(project: ComposeProject, services: list, timeout_s: float) -> float:
    """Seconds until every one of ``services`` is healthy."""
    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        states = {s: project.health(s) for s in services}
        if all(v == "healthy" for v in states.values()):
            return time.monotonic() - started
        if time.monotonic() > deadline:
            raise AssertionError(f"not all healthy after {timeout_s:.0f} s: {states}")
        time.sleep(0.5)


def dispatcher_status(token: str, check: bool = True) -> subprocess.CompletedProcess:
    """``dataservice status`` from the host, through the published loopback port, with ``token``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATASERVICE_")}
    env["DATASERVICE_AUTH_TOKEN"] = token
    return run([sys.executable, "-m", "dataservice", "status", "--dispatcher", "127.0.0.1:5050", "--json"], 60,
               check=check, env=env)


# --- 1. the image ------------------------------------------------------------------------------------------

def test_the_image_runs_as_a_non_root_user_with_the_locked_versions(project):
    uid = run(["docker", "run", "--rm", "--entrypoint", "id", IMAGE, "-u"], 60).stdout.strip()
    assert uid == "1000"
    # The build's secrets (pip's configuration, the CA bundle) were mounted for one RUN: no layer holds them.
    leftovers = run(["docker", "run", "--rm", "-u", "0", "--entrypoint", "sh", IMAGE, "-c",
                     "ls /etc/pip.conf /run/secrets/ca-certificates.crt /root/.cache/pip 2>/dev/null || true"],
                    60).stdout.strip()
    assert leftovers == "", leftovers
    version = run(["docker", "run", "--rm", IMAGE, "--version"], 60).stdout.strip()
    assert version.startswith("dataservice "), version
    installed = run(["docker", "run", "--rm", "--entrypoint", "python", IMAGE, "-m", "pip", "freeze"], 120).stdout
    locked = {line.split("==")[0].lower(): line.strip() for line in (REPO / "requirements" / "lock.txt").read_text()
              .splitlines() if "==" in line and not line.startswith("#")}
    pins = [line.strip() for line in installed.splitlines() if "==" in line]
    assert pins, installed
    for pin in pins:
        name = pin.split("==")[0].lower()
        if name in locked:
            assert pin == locked[name], f"{pin} in the image, {locked[name]} in requirements/lock.txt"
    assert any(p.lower().startswith("numpy==") for p in pins) and any(p.lower().startswith("grpcio==") for p in pins)


# --- 2. up, healthy, the client trains ---------------------------------------------------------------------

def test_the_cluster_comes_up_healthy_and_the_client_trains(project):
    FIGURES["healthy_s"] = round(project.up_healthy(SERVERS, HEALTHY_TIMEOUT_S), 1)
    assert {s: project.health(s) for s in SERVERS} == {s: "healthy" for s in SERVERS}
    # The client service exactly as the file writes it: distributed_epoch, 2 epochs.
    started = time.monotonic()
    out = project.compose("run", "--rm", "-T", "client", timeout_s=READ_TIMEOUT_S)
    FIGURES["client_run_s"] = round(time.monotonic() - started, 1)
    text = out.stdout + out.stderr
    assert re.search(r"read 25,600 elements \(400 batches\)", text), text[-2000:]
    assert re.search(r"final loss \d+\.\d+", text), text[-2000:]
    # Arguments replace the service's command; the service's environment still names the dispatcher.
    out = project.compose("run", "--rm", "-T", "client", "--mode", "parallel_epochs", "--no-progress",
                          "--num-examples", "640", timeout_s=READ_TIMEOUT_S)
    assert re.search(r"read 1,280 elements", out.stdout), out.stdout[-2000:] + out.stderr[-2000:]


# --- 3. a worker container killed mid-epoch ----------------------------------------------------------------

def test_a_worker_killed_mid_epoch_loses_nothing_and_comes_back(project):
    n = 6000
    reader = Reader(project, n, delay_ms=2)
    reader.wait_for(1500, READ_TIMEOUT_S)
    killed = project.container("worker1")
    run(["docker", "kill", killed], 60)
    killed_at = time.monotonic()
    assert_exactly_once(reader.result(READ_TIMEOUT_S), n)
    # The read went on with worker2 and ended once the dispatcher declared worker1 lost (worker_timeout_ms)
    # and its splits were produced again, less what the reader held.
    FIGURES["read_done_after_kill_s"] = round(time.monotonic() - killed_at, 1)
    # Docker's restart policy (unless-stopped) does not restart a container `docker kill` stopped: it counts
    # as stopped by hand. The operator's `docker compose up -d` brings it back.
    FIGURES["killed_worker_restarted_by_docker"] = project.state("worker1")["Status"] == "running"
    if not FIGURES["killed_worker_restarted_by_docker"]:
        project.compose("up", "-d", "--no-build", "worker1")
    up_at = time.monotonic()
    wait_healthy(project, ["worker1"], HEALTHY_TIMEOUT_S)
    FIGURES["worker_up_to_healthy_s"] = round(time.monotonic() - up_at, 1)
    # It rejoined: the dispatcher lists two live workers again, and a read uses both.
    deadline = time.monotonic() + 60
    while True:
        status = json.loads(dispatcher_status(project.token).stdout)
        live = {w["address"] for w in status["workers"] if w["last_heartbeat_s_ago"] < 5}
        if live == {"worker1:5051", "worker2:5051"}:
            break
        assert time.monotonic() < deadline, f"the dispatcher does not list 2 live workers: {status.get('workers')}"
        time.sleep(0.5)
    assert_exactly_once(Reader(project, 1000, delay_ms=0).result(READ_TIMEOUT_S), 1000)


# --- 4. the dispatcher restarted on its journal ------------------------------------------------------------

def test_a_restarted_dispatcher_replays_its_journal_and_the_named_job_continues(project):
    n = 6000
    reader = Reader(project, n, delay_ms=2, job_name="restart-me")
    reader.wait_for(1500, READ_TIMEOUT_S)
    project.compose("restart", "--timeout", "10", "dispatcher", timeout_s=120)
    assert_exactly_once(reader.result(READ_TIMEOUT_S), n)
    logs = project.compose("logs", "--no-color", "dispatcher").stdout
    replays = re.findall(r"fault-tolerant mode: replayed (\d+) updates", logs)
    assert replays and int(replays[-1]) > 0, logs[-3000:]
    wait_healthy(project, SERVERS, HEALTHY_TIMEOUT_S)


# --- 5. the token rotated ----------------------------------------------------------------------------------

def test_a_rotated_token_refuses_the_old_one_once_the_services_restart(project):
    old = project.token
    assert dispatcher_status(old).returncode == 0
    project.write_token(secrets.token_urlsafe(32))
    # Running servers still hold the old token: their health checks (--check-auth) now fail until restarted.
    project.compose("restart", "--timeout", "10", *SERVERS, timeout_s=180)
    wait_healthy(project, SERVERS, HEALTHY_TIMEOUT_S)
    refused = dispatcher_status(old, check=False)
    assert refused.returncode != 0
    assert re.search(r"token", refused.stderr, re.I) and "Traceback" not in refused.stderr, refused.stderr
    assert dispatcher_status(project.token).returncode == 0
    assert_exactly_once(Reader(project, 1000, delay_ms=0).result(READ_TIMEOUT_S), 1000)


# --- 6. metrics and the status page from the host ----------------------------------------------------------

def _get(path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:8080{path}", timeout=30) as response:
        assert response.status == 200
        return response.read().decode()


def test_metrics_and_the_status_page_answer_on_the_host_port(project):
    metrics = _get("/metrics")
    assert re.search(r"^dataservice_\w+", metrics, re.M), metrics[:2000]
    status = json.loads(_get("/status.json"))
    assert len(status["workers"]) >= 2, status
    assert "<html" in _get("/").lower()


# --- 7. down -v leaves nothing -----------------------------------------------------------------------------

def test_down_removes_every_container_network_and_volume(project):
    assert project.resources()["volumes"], "the dispatcher's named volume should exist before down"
    project.down()
    assert project.resources() == {"containers": [], "networks": [], "volumes": []}
