"""The HTTP side of dispatchers and workers (--http-port): /metrics scraped and parsed with
prometheus_client's parser, /status.json, errors, shutdown, and the status page in headless Chromium."""

from __future__ import annotations

import gc
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dataservice import Dataset, DispatcherConfig, DispatchServer, Options, WorkerConfig, WorkerServer
from dataservice.cli import build_parser, dispatcher_config, main
from dataservice.client.distribute import distribute
from dataservice.data.experimental import StatsAggregator
from dataservice.dispatcher import collector_pauses
from dataservice.errors import ServiceUnavailableError
from tests.cluster import TestCluster, run_with_deadline, wait_until
from tests.journals import named_job

N = 2000


def get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return response.read()


def scrape(port: int) -> dict:
    """Every sample of /metrics, parsed by prometheus_client: {(sample name, sorted label items): value}."""
    samples = {}
    for family in text_string_to_metric_families(get(port, "/metrics").decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted((k, str(v)) for k, v in labels.items())))
    assert key in samples, f"{name}{labels} not in /metrics: {sorted(k for k in samples if k[0] == name)}"
    return samples[key]


@pytest.fixture
def http_cluster():
    """A dispatcher and two workers, each serving HTTP on a free port."""
    cluster = TestCluster(num_workers=0, http_port=0)
    try:
        cluster.add_worker(http_port=0)
        cluster.add_worker(http_port=0)
        cluster.wait_for_workers(2)
        yield cluster
    finally:
        cluster.stop()


def _gated_range(n: int, gate: Path) -> Dataset:
    """``Dataset.range(n)``, each element 16 int64s; from 3n/4 on, elements wait (20 s at most) for the file
    ``gate`` to exist. The workers cannot finish the job before the test has looked at it mid-read: they
    would otherwise produce all n elements long before the test reads half of them. (A file, not an Event:
    the function travels to the workers by value.)"""
    path = str(gate)

    def element(x):
        if x >= n * 3 // 4:
            deadline = time.monotonic() + 20
            while not os.path.exists(path) and time.monotonic() < deadline:
                time.sleep(0.005)
        return np.full(16, x, dtype=np.int64)

    return Dataset.range(n).map(element)


def test_metrics_follow_a_real_read(http_cluster, tmp_path):
    cluster = http_cluster
    gate = tmp_path / "gate"
    ds = _gated_range(N, gate).apply(distribute("distributed_epoch", cluster.target, job_name="metrics-read"))
    it = iter(ds)
    got = [next(it) for _ in range(N // 2)]
    core = cluster.dispatcher.core
    # Mid-read: the client reports its stats in heartbeats; the dispatcher exports them.
    wait_until(lambda: any(c.elements for c in core.client_stats()), 10, "a stats report counting elements")
    client = core.client_stats()[0]
    mid = scrape(cluster.dispatcher.http_port)
    assert value(mid, "dataservice_clients") == 1
    stall = value(mid, "dataservice_client_stall_fraction", client_id=client.client_id, job_id=client.job_id)
    assert 0.0 <= stall <= 1.0
    assert value(mid, "dataservice_recommended_workers") == core.recommended_workers().count >= 1
    assert value(mid, "dataservice_jobs", state="running") == 1
    assert value(mid, "dataservice_iterations", state="active") == 1
    assert value(mid, "dataservice_splits_handed_out") >= 1
    gate.touch()
    got += list(it)
    assert sorted(int(x[0]) for x in got) == list(range(N))

    after = scrape(cluster.dispatcher.http_port)
    assert value(after, "dataservice_workers_alive") == 2
    assert value(after, "dataservice_workers_registered") == 2
    assert value(after, "dataservice_datasets") == 1
    assert value(after, "dataservice_jobs", state="finished") == 1
    assert value(after, "dataservice_jobs_finished_total") == 1
    assert value(after, "dataservice_splits_left") == 0
    assert value(after, "dataservice_rpc_calls_total", method="GetSplit") >= 1
    assert value(after, "dataservice_rpc_latency_seconds", method="GetSplit", quantile="0.99") > 0
    assert value(after, "dataservice_rpc_calls_total", method="WorkerHeartbeat") >= 2
    with core._cond:
        job_id = named_job(core.state, "metrics-read")

    # Elements produced by the workers, in all and for the job, add up to the elements read.
    produced = job_produced = 0
    for worker in cluster.workers:
        samples = scrape(worker.http_port)
        produced += value(samples, "dataservice_worker_elements_total")
        job_produced += samples.get(("dataservice_worker_job_elements_total", (("job_id", str(job_id)),)), 0)
        assert value(samples, "dataservice_worker_bytes_total") >= 16 * 8 * value(
            samples, "dataservice_worker_elements_total")
        assert value(samples, "dataservice_worker_memory_budget_bytes") == worker.memory_budget.limit_bytes
    assert produced == N
    assert job_produced == N


def test_status_json_shows_workers_jobs_and_clients(http_cluster, tmp_path):
    cluster = http_cluster
    gate = tmp_path / "gate"
    ds = _gated_range(N, gate).apply(distribute("distributed_epoch", cluster.target, job_name="status-read"))
    it = iter(ds)
    got = [next(it) for _ in range(100)]
    core = cluster.dispatcher.core
    wait_until(lambda: any(c.elements for c in core.client_stats()), 10, "a stats report counting elements")
    status = json.loads(get(cluster.dispatcher.http_port, "/status.json"))
    assert status["server"] == "dispatcher" and status["incarnation"] == core.incarnation
    assert sorted(w["address"] for w in status["workers"]) == sorted(w.address for w in cluster.workers)
    assert all(w["alive"] for w in status["workers"])
    (job,) = status["jobs"]
    assert job["name"] == "status-read" and job["mode"] == "distributed_epoch" and not job["finished"]
    (iteration,) = job["iterations"]
    with core._cond:
        num_splits = core.state.datasets[job["dataset_id"]].num_splits
    assert iteration["splits"] == num_splits and iteration["splits_left"] > 0
    (client,) = status["clients"]
    assert client["job_id"] == job["job_id"] and client["elements"] >= 1
    assert status["recommended_workers"]["current"] == 2
    gate.touch()
    got += list(it)
    assert len(got) == N

    done = json.loads(get(cluster.dispatcher.http_port, "/status.json"))
    assert done["jobs"][0]["finished"] and done["counts"]["splits_left"] == 0
    served = [json.loads(get(w.http_port, "/status.json")) for w in cluster.workers]
    assert [s["address"] for s in served] == [w.address for w in cluster.workers]
    assert sum(s["totals"]["elements"] for s in served) == N
    assert all(s["server"] == "worker" and s["memory_budget"]["limit_bytes"] > 0 for s in served)


def test_pipeline_stage_latencies_from_the_stats_aggregator(http_cluster):
    cluster = http_cluster
    options = Options()
    options.experimental_stats.aggregator = StatsAggregator()
    options.experimental_stats.latency_all_edges = True
    ds = Dataset.range(500).map(lambda x: x * 2).with_options(options)
    assert sorted(int(x) for x in ds.apply(distribute("parallel_epochs", cluster.target))) == sorted(
        list(range(0, 1000, 2)) * 2)
    for worker in cluster.workers:
        samples = scrape(worker.http_port)
        counts = {dict(labels)["stage"]: v for (name, labels), v in samples.items()
                  if name == "dataservice_worker_stage_latency_seconds_count"}
        # Each worker ran the whole pipeline once (parallel_epochs): 500 elements through each stage.
        assert counts == {"record_latency::MapDataset/_1": 500, "record_latency::RangeDataset/_0": 500}
        inf = [v for (name, labels), v in samples.items() if name == "dataservice_worker_stage_latency_seconds_bucket"
               and dict(labels)["le"] == "+Inf" and dict(labels)["stage"] == "record_latency::MapDataset/_1"]
        assert inf == [500]
        page = json.loads(get(worker.http_port, "/status.json"))
        (pipeline,) = page["pipelines"]
        assert pipeline["latency_us"]["record_latency::MapDataset/_1"]["count"] == 500


def test_journal_fsync_histogram_in_fault_tolerant_mode(tmp_path):
    with TestCluster(num_workers=1, http_port=0, fault_tolerant_mode=True, work_dir=str(tmp_path),
                     journal_checkpoint_records=5) as cluster:
        assert sorted(int(x) for x in Dataset.range(50).apply(distribute("distributed_epoch", cluster.target))) \
            == list(range(50))
        journal = cluster.dispatcher.core.store.journal
        assert journal.wait_checkpoint()
        samples = scrape(cluster.dispatcher.http_port)
        # Every 5 records a forked child wrote a checkpoint; the fork held the lock for a few milliseconds.
        assert value(samples, "dataservice_journal_checkpoints_total") >= 1
        assert value(samples, "dataservice_journal_checkpoint_fork_seconds_count") >= \
            value(samples, "dataservice_journal_checkpoints_total")
        # Read after the journal's own figures: a scrape can only see as many fsyncs or more.
        assert value(samples, "dataservice_journal_fsync_seconds_count") >= 1
        assert value(samples, "dataservice_journal_fsync_seconds_bucket", le="+Inf") == \
            value(samples, "dataservice_journal_fsync_seconds_count")
        assert value(samples, "dataservice_journal_records_total") >= 1
        assert journal.fsyncs >= value(samples, "dataservice_journal_fsync_seconds_count") - 1


def test_distributed_save_progress(http_cluster, tmp_path):
    import dataservice as ds

    cluster = http_cluster
    path = str(tmp_path / "save")
    dataset = Dataset.range(3000).map(lambda x: x * 2)
    ds.distributed_save(dataset, path, cluster.target)
    port = cluster.dispatcher.http_port

    def finished_save():
        saves = json.loads(get(port, "/status.json"))["saves"]
        return saves if saves and saves[0]["state"] == "finished" else None

    (save,) = wait_until(finished_save, 30, "the save to finish")
    groups = dataset.split_groups().num_groups
    assert (save["path"], save["groups"], save["committed"], save["leased"], save["elements"]) == \
        (path, groups, groups, 0, 3000)
    samples = scrape(port)
    assert value(samples, "dataservice_saves", state="finished") == 1
    assert value(samples, "dataservice_saves", state="running") == 0


def test_bad_paths_and_methods():
    with DispatchServer(DispatcherConfig(http_port=0)) as dispatcher:
        port = dispatcher.http_port
        with pytest.raises(urllib.error.HTTPError) as missing:
            get(port, "/nothing-here")
        assert missing.value.code == 404
        assert b"/metrics" in missing.value.read()
        post = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(post, timeout=10)
        assert refused.value.code == 405 and refused.value.headers["Allow"] == "GET, HEAD"
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("HEAD", "/status.json")
        head = conn.getresponse()
        assert head.status == 200 and int(head.headers["Content-Length"]) > 0 and head.read() == b""
        conn.close()
        page = get(port, "/").decode()
        # The page arrives with the status in it, "</" escaped inside its script.
        initial = re.search(r"const INITIAL = (.*);\n", page).group(1)
        assert json.loads(initial.replace("<\\/", "</"))["server"] == "dispatcher"


def test_servers_stop_their_http_port_and_refuse_a_taken_one():
    dispatcher = DispatchServer(DispatcherConfig(http_port=0))
    worker = WorkerServer(WorkerConfig(dispatcher_address=f"localhost:{dispatcher.port}", http_port=0))
    ports = [dispatcher.http_port, worker.http_port]
    assert all(get(p, "/metrics").startswith(b"# HELP") for p in ports)
    worker.stop()
    dispatcher.stop()
    for port in ports:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    # Stopped means closed: the same port serves again at once.
    again = DispatchServer(DispatcherConfig(http_port=ports[0]))
    try:
        assert again.http_port == ports[0] and b"dataservice_workers_alive" in get(ports[0], "/metrics")
        with pytest.raises(ServiceUnavailableError, match=rf"cannot bind 127\.0\.0\.1:{ports[0]} \(the dispatcher's HTTP "
                                                         rf"port\): the port is in use"):
            DispatchServer(DispatcherConfig(http_port=ports[0]))
    finally:
        again.stop()
    with pytest.raises(RuntimeError, match="set DispatcherConfig.http_port"):
        DispatchServer(DispatcherConfig()).http_port  # noqa: B018 (the property raises)
    with pytest.raises(ValueError, match="http_port must be None"):
        DispatcherConfig(http_port=70000)


def test_http_port_flags(capsys):
    args = build_parser().parse_args(["dispatcher", "--http-port", "9100"])
    assert dispatcher_config(args).http_port == 9100
    assert dispatcher_config(build_parser().parse_args(["dispatcher"])).http_port is None
    assert main(["worker", "--dispatcher", "localhost:1", "--processes", "2", "--worker-address", "h:%port%",
                 "--http-port", "9100"]) == 2
    assert "pass --http-port 0" in capsys.readouterr().err


# --- the page in a real browser -----------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
_CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                   "--disable-background-networking", "--disable-component-update", "--disable-sync",
                   "--hide-scrollbars"]


def _chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    return subprocess.run([CHROMIUM, *_CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=90)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (Debian: apt-get install chromium)")
def test_status_page_in_headless_chromium(http_cluster, tmp_path):
    cluster = http_cluster
    gate = tmp_path / "gate"
    ds = _gated_range(N, gate).apply(distribute("distributed_epoch", cluster.target, job_name="browser-read"))
    it = iter(ds)
    got = [next(it) for _ in range(N // 4)]
    core = cluster.dispatcher.core
    wait_until(lambda: any(c.elements for c in core.client_stats()), 10, "a stats report counting elements")
    client_id = core.client_stats()[0].client_id
    url = f"http://127.0.0.1:{cluster.dispatcher.http_port}/"
    dom = run_with_deadline(lambda: _chromium(tmp_path, "--dump-dom", url), 120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout

    def rows(table_id: str) -> list[str]:
        table = re.search(rf'<table id="{table_id}">(.*?)</table>', html, re.S)
        assert table, f"no table #{table_id} in the page Chromium rendered:\n{html[:3000]}"
        return re.findall(r"<tr>(.*?)</tr>", table.group(1), re.S)[1:]  # after the header row

    workers = rows("workers")
    assert sorted(re.search(r"<td[^>]*>([^<]+)</td>", r).group(1) for r in workers) == \
        sorted(w.address for w in cluster.workers)
    assert all(">yes<" in r for r in workers)
    (job,) = rows("jobs")
    assert "browser-read" in job and "distributed_epoch" in job and "active" in job
    (client,) = rows("clients")
    assert f">{client_id}<" in client and "browser-read" in client
    assert re.search(r'id="recommended">\d+<', html)

    shot = tmp_path / "dispatcher.png"
    taken = run_with_deadline(lambda: _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,900", url), 120)
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000

    gate.touch()
    got += list(it)
    assert len(got) == N
    # A worker's page: its totals and the job's row.
    worker = cluster.workers[0]
    served = json.loads(get(worker.http_port, "/status.json"))["totals"]["elements"]
    page = run_with_deadline(lambda: _chromium(tmp_path, "--dump-dom", f"http://127.0.0.1:{worker.http_port}/"), 120)
    assert page.returncode == 0, page.stderr[-2000:]
    assert f'<span id="totals">{served:,} elements' in page.stdout


@pytest.mark.slow
def test_metrics_overhead_benchmark_runs(tmp_path):
    """``benchmarks.metrics_overhead`` (README: What metrics cost) on the smallest setting: both sides measured,
    the scraper scraped during the 'on' run, and the in-process scrape cost printed."""
    import os
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH")) if p))
    out = tmp_path / "overhead.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks.metrics_overhead", "--quick", "--workloads", "range",
                             "--modes", "parallel_epochs", "--repeats", "1", "--json", str(out)],
                            capture_output=True, text=True, cwd=repo, env=env, timeout=180)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    (row,) = json.loads(out.read_text())["rows"]
    assert row["off"] > 0 and row["on"] > 0 and row["scrapes"] >= 1
    assert any(line.startswith("| 1. range(20000)") for line in result.stdout.splitlines()), result.stdout
    cost = subprocess.run([sys.executable, "-m", "benchmarks.metrics_overhead", "--scrape-cost", "20"],
                          capture_output=True, text=True, cwd=repo, env=env, timeout=120)
    assert cost.returncode == 0, cost.stderr
    assert re.search(r"^worker: \d+ series, .* CPU per scrape: collectors [\d.]+ ms", cost.stdout, re.M), cost.stdout


@pytest.mark.slow
def test_cli_local_prints_each_servers_http_port(procs):
    """``dataservice local --http-port 0``: the dispatcher and each worker serve HTTP on a port they print;
    SIGTERM stops them all (exit code 0)."""
    import signal

    proc = procs.spawn("-m", "dataservice", "local", "--workers", "2", "--port", "0", "--http-port", "0",
                       name="local")
    proc.wait_for_line(r"^local cluster: grpc://localhost:\d+ with 2 workers$")
    line = r"^(dispatcher|worker \S+) serves /metrics, /status.json and its status page on http://localhost:(\d+)/$"
    pattern = re.compile(line)

    def http_lines():
        found = [m for m in map(pattern.search, proc.poll_lines()) if m]
        return found if len(found) >= 3 else None

    ports = {m.group(1): int(m.group(2)) for m in wait_until(http_lines, 30, "the three servers' HTTP lines")}
    assert len(ports) == 3 and "dispatcher" in ports
    dispatcher = json.loads(get(ports.pop("dispatcher"), "/status.json"))
    assert sorted(w["address"] for w in dispatcher["workers"]) == sorted(k.split()[1] for k in ports)
    for name, port in ports.items():
        assert json.loads(get(port, "/status.json"))["address"] == name.split()[1]
    assert proc.stop(signal.SIGTERM) == 0


def test_the_dispatcher_shows_its_full_collections_on_metrics_and_status():
    with TestCluster(num_workers=1, http_port=0) as cluster:
        assert sorted(int(x) for x in Dataset.range(20).apply(distribute("distributed_epoch", cluster.target))) \
            == list(range(20))
        before = collector_pauses.FULL_COLLECTIONS.snapshot().pauses.count
        gc.collect()
        port = cluster.dispatcher.http_port
        samples = scrape(port)
        count = value(samples, "dataservice_gc_full_collections_total")
        assert count >= before + 1
        assert value(samples, "dataservice_gc_full_collection_seconds_bucket", le="+Inf") == \
            value(samples, "dataservice_gc_full_collection_seconds_count") >= count
        page = json.loads(get(port, "/status.json"))["gc"]
        assert page["full_collections"] >= count
        assert page["recent"][-1]["ms"] >= 0 and page["recent"][-1]["ended_unix"] > 0
