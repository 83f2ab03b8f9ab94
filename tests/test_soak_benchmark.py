"""``python -m benchmarks.soak`` with tiny parameters: real dispatcher and worker processes, a row per
interval, the first-against-last table; and its hang guard, which ends the run when the worker stops
answering."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    for name in ("DATASERVICE_AUTH_TOKEN", "DATASERVICE_AUTH_TOKEN_FILE", "DATASERVICE_SERVICE"):
        env.pop(name, None)
    return env


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except OSError:
        return False


def _soak(tmp_path: Path, *flags: str) -> tuple[list[str], dict]:
    """Runs the soak to its end; its stdout lines and its --json report."""
    out = tmp_path / "soak.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks.soak", *flags, "--json", str(out)],
                            capture_output=True, text=True, cwd=REPO, env=_env(), timeout=90)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout.splitlines(), json.loads(out.read_text())


@pytest.mark.slow
def test_soak_prints_rows_and_first_against_last(tmp_path):
    lines, report = _soak(tmp_path, "--jobs", "30", "--report-every", "15", "--warmup", "4", "--seed", "3",
                          "--with-token")
    text = "\n".join(lines)
    assert re.match(rf"^dataservice soak: 30 short jobs, .*\(separate processes, with a cluster token\); "
                    rf"machine: {os.cpu_count()} cores", lines[0]), text
    rows = [line for line in lines if re.match(r"^\| +(15|30) \|", line)]
    assert len(rows) == 2, text
    for label in ("time per job [ms]", "WorkerHeartbeat p50 [ms]", "GetSplit p50 [ms]", "ClientHeartbeat p50 [ms]"):
        (line,) = [line for line in lines if line.startswith(f"| {label}")]
        assert len(line.split("|")) == 6, line
    (per_job,) = [line for line in lines if line.startswith("| time per job [ms]")]
    assert re.search(r"\| +\d+\.\d\dx \|$", per_job), per_job

    assert report["jobs"] == 30 and sum(report["kinds"].values()) == 30
    assert [iv["jobs_done"] for iv in report["intervals"]] == [15, 30]
    assert all(iv["jobs"] == 15 and iv["ms_per_job"] > 0 for iv in report["intervals"])
    last = report["intervals"][-1]
    assert last["dispatcher_rss_mb"] > 10 and last["dispatcher_threads"] >= 1
    assert last["worker_rss_mb"] > 10 and last["worker_threads"] >= 1
    assert last["journal_bytes"] is None
    assert last["status_json_bytes"] > last["status_reply_bytes"] > 0
    # Every job the soak read was a job the dispatcher saw (the warm-up's too).
    assert last["counts"]["workers"] == 1 and last["counts"]["jobs_finished"] >= 30 - report["named_again_empty"]
    assert last["latency"]["GetOrCreateIteration"]["calls"] >= 34
    # The same status printed by the real CLI, with the run's token taken from the environment.
    assert re.match(r"^[\d,]+ bytes$", report["cli_status_json"]), report["cli_status_json"]
    assert report["read_by_others_warnings"] == report["named_again_empty"]


@pytest.mark.slow
def test_soak_fault_tolerant_reports_the_journal(tmp_path):
    lines, report = _soak(tmp_path, "--jobs", "10", "--report-every", "5", "--warmup", "2", "--fault-tolerant")
    assert "dispatcher --fault-tolerant" in lines[0], lines[0]
    assert any(line.startswith("| journal [MB]") for line in lines), "\n".join(lines)
    first, last = report["intervals"]
    assert 0 < first["journal_bytes"] < last["journal_bytes"]


@pytest.mark.slow
def test_soak_stops_with_an_error_when_the_worker_stops_answering():
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.soak", "--jobs", "100000", "--read-timeout", "2",
                             "--warmup", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=_env())
    lines: list[str] = []
    worker_pid = None
    seen = threading.Event()

    def pump() -> None:
        for line in proc.stdout:
            lines.append(line)
            if re.search(r"the worker \(pid \d+\)", line):
                seen.set()
        seen.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        assert seen.wait(60), "the soak printed no header within 60 s"
        match = re.search(r"the worker \(pid (\d+)\)", "".join(lines))
        assert match, f"no worker pid in the header:\n{''.join(lines)}\n{proc.stderr.read()}"
        worker_pid = int(match.group(1))
        os.kill(worker_pid, signal.SIGSTOP)  # it keeps its sockets but answers nothing: reads hang
        stopped = time.monotonic()
        code = proc.wait(timeout=45)
        took = time.monotonic() - stopped
        stderr = proc.stderr.read()
        assert code == 1, f"exit code {code}\nstdout:\n{''.join(lines)}\nstderr:\n{stderr}"
        assert "python -m benchmarks.soak: error: job #" in stderr, stderr
        assert took < 30, f"the run took {took:.1f} s to stop"
        # The run stopped its servers, the stopped worker included.
        deadline = time.monotonic() + 10
        while _pid_alive(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _pid_alive(worker_pid), f"worker pid {worker_pid} still runs after the soak exited"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if worker_pid is not None and _pid_alive(worker_pid):
            os.kill(worker_pid, signal.SIGKILL)
