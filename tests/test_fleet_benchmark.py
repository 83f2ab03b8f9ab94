"""``python -m benchmarks.fleet`` with a tiny fleet: a real dispatcher process, simulated workers and readers
speaking the real protocol, real workers and a real reader beside them; the report's fields, the
exactly-once check of the real read, and failure detection of a real worker killed in the window."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.processes import REPO, pid_alive, subprocess_env


def _env() -> dict:
    env = subprocess_env()
    for name in ("DATASERVICE_AUTH_TOKEN", "DATASERVICE_AUTH_TOKEN_FILE"):  # --token sets its own
        env.pop(name, None)
    return env


@pytest.mark.slow
@pytest.mark.parametrize("flags", [("--worker-timeout-ms", "2000"), ("--token", "--fault-tolerant", "--no-kill-worker"),
                                   ("--task-lists", "full", "--no-kill-worker")],
                         ids=["delta-kill", "token-journal", "full-lists"])
def test_small_fleet_reports_every_cost_and_the_real_read_is_exactly_once(tmp_path, flags):
    out = tmp_path / "fleet.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.fleet", "--workers", "20", "--readers", "50", "--jobs", "2",
         "--duration-s", "5", "--warmup-s", "4", "--json", str(out), *flags],
        capture_output=True, text=True, cwd=REPO, env=_env(), timeout=240)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    report = json.loads(out.read_text())
    assert report["workers"] == 20 and report["readers"] == 50 and report["jobs"] == 2
    dispatcher = report["dispatcher"]
    assert 0 < dispatcher["cpu_core"] < 4
    assert 0 < dispatcher["cpu_ms_per_call"] < 1000
    assert 10 < dispatcher["rss_mb"] <= dispatcher["peak_rss_mb"] < 4096
    # Every simulated kind of call was answered inside the window, with sane latencies.
    for method in ("WorkerHeartbeat", "ClientHeartbeat", "GetSplit"):
        m = report["methods"][method]
        assert m["calls"] > 0 and 0 <= m["p50_ms"] <= m["p99_ms"] <= m["max_ms"] < 60_000, (method, m)
    assert report["ready"]["workers"] + report["ready"]["workers_late"] == 20
    assert report["ready"]["readers"] + report["ready"]["readers_late"] == 50
    assert report["ready"]["readers_failed"] == 0
    assert report["lost"]["workers_declared_lost"] == 0 and report["lost"]["clients_released"] == 0
    assert report["lost"]["readers_unknown"] == 0
    for key in ("late_p50_ms", "late_p99_ms", "late_over_100ms", "late_over_interval", "answered_early_no_news"):
        assert key in report["worker_heartbeat"]
    for key in ("latency_p50_ms", "latency_p99_ms", "late_over_100ms", "late_over_interval"):
        assert key in report["client_heartbeat"]
    # The late heartbeats again, per second of the window they were sent in.
    by_second = report["late_by_second"]
    assert sum(by_second["worker"].values()) == report["worker_heartbeat"]["late_over_100ms"]
    assert sum(by_second["client"].values()) == report["client_heartbeat"]["late_over_100ms"]
    assert all(0 <= int(t) < report["duration_s"] for kind in by_second.values() for t in kind), by_second
    # The dispatcher's CPU in each second of the window, and its full collections there (times it).
    assert len(report["cpu_by_second"]) == report["duration_s"]
    assert all(0 <= c < 4 for c in report["cpu_by_second"]) and sum(report["cpu_by_second"]) > 0
    full = report["full_collections"]
    assert full["since_start"] >= len(full["in_window"])
    assert all(0 <= at <= report["duration_s"] and ms >= 0 for at, ms in full["in_window"])
    real = report["real_read"]
    for read in (real["idle"], real["loaded"]):
        assert read["elements"] == 20_000 and read["exactly_once"] is True and read["elements_per_s"] > 0
    # The loaded read's process was started before the window, and waited for it to begin reading.
    assert real["loaded"]["started_unix"] >= report["window_start_unix"] - 0.05
    # Simulated workers heard of the real read's job (made at the window's start), and when. Not necessarily
    # all: one between two polls when the read ends (it takes a fraction of a second) is never told.
    heard = report["new_job_heard"]
    assert 0 < heard["workers"] <= 20 and 0 <= heard["half_s"] <= heard["last_s"] <= report["duration_s"], heard
    # The simulators' own pauses, per second of the window: their worst loop lag, and their full collections.
    sim = report["simulator"]
    assert all(0 <= int(t) <= report["duration_s"] and ms >= 0 for t, ms in sim["lag_by_second_ms"].items())
    assert all(ms >= 0 for ms in sim["full_collections_ms"])
    if "--worker-timeout-ms" in flags:
        # A real worker killed (-9) early in the window is declared lost within its timeout (plus the
        # dispatcher's one-second liveness tick, and slack for a loaded machine). The real read beside the
        # fleet reads the real workers only (COLOCATED), and is over by then.
        assert report["kill_worker"] and report["failure_detection_s"] is not None, report.get("failure_detection_s")
        # (It can be under the timeout: the worker was last seen when its last poll began, up to half of it before.)
        assert 0 < report["failure_detection_s"] <= 2.0 + 1.0 + 3.0
    if "full" not in flags:
        lists = report["worker_task_lists"]
        # A full list registers each worker (before the window) and follows a resync; the rest are deltas.
        assert lists["delta"] > 0 and lists["full"] <= lists["resync_asked"] + 20, lists
    if "--fault-tolerant" in flags:
        assert dispatcher["journal_fsyncs_per_s"] is not None and dispatcher["journal_fsyncs_per_s"] > 0
    else:
        assert dispatcher["journal_fsyncs_per_s"] is None
    assert "real read of 20000" in result.stdout and "dispatcher:" in result.stdout
    # Nothing the benchmark started outlives it: the dispatcher, the real workers, the simulators.
    for pid in report["pids"]:
        assert not pid_alive(pid), pid


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="--pin needs 2 CPUs")
def test_pin_puts_every_thread_of_the_dispatcher_on_one_cpu_and_the_rest_on_the_others():
    from benchmarks import fleet

    # A stand-in dispatcher with a few threads (the real one's are pinned the same way, by /proc).
    code = ("import threading, time\n"
            "[threading.Thread(target=time.sleep, args=(30,), daemon=True).start() for _ in range(3)]\n"
            "print('ready', flush=True); time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    before = os.sched_getaffinity(0)
    try:
        assert child.stdout.readline().strip() == "ready"
        pinned = fleet.pin_apart(child.pid)
        tasks = os.listdir(f"/proc/{child.pid}/task")
        assert len(tasks) >= 4
        assert all(os.sched_getaffinity(int(t)) == set(pinned["dispatcher"]) for t in tasks)
        assert os.sched_getaffinity(0) == set(pinned["others"])
        assert not set(pinned["dispatcher"]) & set(pinned["others"])
    finally:
        os.sched_setaffinity(0, before)
        child.kill()
        child.wait()


def test_late_heartbeats_are_counted_per_second_of_the_window_and_summed_over_simulators():
    from benchmarks.fleet import _by_second, _Recorder

    shards = []
    for late_calls in ((101.5, 101.9, 103.2), (101.1,)):
        recorder = _Recorder((100.0, 120.0))
        for started in late_calls:
            recorder.late_at("worker", started)
        recorder.call("ClientHeartbeat", 104.0, 104.3)   # 300 ms: late
        recorder.call("ClientHeartbeat", 105.0, 105.05)  # 50 ms: not
        recorder.call("ClientHeartbeat", 99.0, 99.5)     # before the window: not counted
        shards.append({"late_by_second": recorder.late_by_second})
    assert _by_second(shards, "worker") == {1: 3, 3: 1}
    assert _by_second(shards, "client") == {4: 2}


def test_simulator_loop_lag_is_the_worst_of_the_simulators_per_second():
    from benchmarks.fleet import _lag_by_second

    shards = [{"lag_by_second": {"0": 0.120, "3": 0.010}}, {"lag_by_second": {"0": 0.060, "5": 0.2}}, {}]
    assert _lag_by_second(shards) == {0: pytest.approx(120.0), 3: pytest.approx(10.0), 5: pytest.approx(200.0)}


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup") or shutil.which("nice") is None,
                    reason="needs Linux's scheduling autogroups and nice(1)")
def test_guests_run_below_the_simulators_in_their_own_session_too(tmp_path):
    """The real workers and reader are guests: nice 10, and so is their session's scheduling group (a nice value
    alone counts only inside its session where Linux groups the scheduling by session)."""
    from benchmarks.fleet import GUEST_NICE, _Child

    guest = _Child([sys.executable, "-c", "import time; time.sleep(30)"], None, str(tmp_path), tmp_path / "g.log",
                   "guest", guest=True)
    host = _Child([sys.executable, "-c", "import time; time.sleep(30)"], None, str(tmp_path), tmp_path / "h.log", "host")
    try:
        def nice(pid: int) -> int:
            with open(f"/proc/{pid}/stat") as f:
                return int(f.read().rsplit(")", 1)[1].split()[16])

        def group_nice(pid: int) -> int:
            with open(f"/proc/{pid}/autogroup") as f:
                return int(f.read().split("nice")[1])

        # nice(1) sets the value, then runs the command: poll until it has (or the deadline passes).
        deadline = time.monotonic() + 10
        while nice(guest.pid) != GUEST_NICE and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (nice(guest.pid), group_nice(guest.pid)) == (GUEST_NICE, GUEST_NICE)
        assert group_nice(host.pid) == 0
    finally:
        guest.stop()
        host.stop()
