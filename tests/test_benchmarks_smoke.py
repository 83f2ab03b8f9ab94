"""Smoke test of the service benchmarks: ``python -m benchmarks.run --quick --no-tf --workloads small``
runs real dispatcher, worker and client processes and prints its table."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _cell_number(text: str) -> float:
    return float(text.replace(",", ""))


def run_benchmark(module: str, *args: str, timeout_s: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    """``python -m benchmarks.<module> ARGS`` from the checkout, as a user runs it; with ``check``, it must
    exit 0 (its output in the message otherwise)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    result = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *args], capture_output=True, text=True,
                            cwd=REPO, env=env, timeout=timeout_s)
    if check:
        assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


@pytest.mark.slow
def test_benchmark_run_quick_prints_table(tmp_path):
    out = tmp_path / "bench.json"
    result = run_benchmark("run", "--quick", "--no-tf", "--workloads", "small", "--modes", "parallel_epochs",
                           "--json", str(out))

    lines = result.stdout.splitlines()
    assert any(re.match(r"^\| workload +\| mode +\| +ours \| tf\.data service \| ratio \|$", l) for l in lines), \
        result.stdout
    range_rows = [l for l in lines if l.startswith("| 1. range(") and "[el/s]" in l]
    assert len(range_rows) == 1, result.stdout
    cells = [c.strip() for c in range_rows[0].strip("|").split("|")]
    assert cells[1] == "parallel_epochs"
    assert _cell_number(cells[2]) > 0, range_rows[0]
    assert cells[3] == "skipped"
    first_rows = [l for l in lines if l.startswith("| 4. time to first element")]
    assert len(first_rows) == 1 and _cell_number(first_rows[0].strip("|").split("|")[2]) > 0, result.stdout

    report = json.loads(out.read_text())
    assert report["errors"] == []
    (measured,) = [m for m in report["measurements"] if m["workload"] == "range"]
    assert measured["best"]["elements"] == measured["best"]["expected_elements"] == 20_000
    assert measured["best"]["elements_per_s"] > 0


@pytest.mark.slow
def test_unread_iterations_prints_rows_and_summary():
    result = run_benchmark("unread_iterations", "--iterations", "30", "--stalled-readers", "2", "--element-bytes",
                           "4096", "--elements", "10", "--memory-budget-bytes", "1000000", "--sample-s", "1")

    lines = result.stdout.splitlines()
    assert re.match(rf"^dataservice unread iterations: 30 iterations of range\(10\)\.map\(-> 4,096-byte uint8 "
                    rf"array\), 2 read once then stalled; worker pid \d+, --memory-budget-bytes 1,000,000; "
                    rf"machine: {os.cpu_count()} cores", lines[0]), result.stdout
    assert re.match(r"^\|  idle \| +\d+\.\d \| +\d+ \| +- \|$", lines[2]), result.stdout
    rows = [l for l in lines if re.match(r"^\| +\d+\.\ds \| +\d+\.\d \| +\d+ \| +\d+\.\d \|$", l)]
    assert len(rows) == 2, result.stdout  # --sample-s 1: a row every 0.5 s
    summary = re.match(r"^worker: 30 tasks .*; RSS (\d+\.\d) MB idle, (\d+\.\d) MB at the peak row; .* over 1 s$",
                       lines[-1])
    assert summary and 0 < float(summary.group(1)) <= float(summary.group(2)), result.stdout


@pytest.mark.slow
def test_recovery_prints_an_undisturbed_and_a_killed_epoch():
    result = run_benchmark("recovery", "--elements", "20000", "--work", "500", "--dispatcher-flags",
                           "--worker-timeout-ms 1000")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in result.stdout.splitlines()
            if line.startswith("| 1 |")]
    assert [r[1] for r in rows] == ["undisturbed", "worker killed at 25%"], result.stdout
    calm, hit = rows
    assert calm[6] == hit[6] == "20,000", result.stdout  # every element once: the benchmark checks it
    # Redone after the (shortened) worker timeout, not the garbage collector's 60 s. ("-": the killed worker
    # had delivered no split in part, which a kill between two of its splits allows.)
    end = float(hit[4])
    first_redone = end if hit[3] == "-" else float(hit[3])
    assert 0 < first_redone <= end < 30, result.stdout


@pytest.mark.slow
def test_iterator_state_prints_sizes_and_restore_times(tmp_path):
    out = tmp_path / "state.json"
    result = run_benchmark("iterator_state", "--no-tf", "--elements", "3200", "--records", "1000", "--buffer", "100",
                           "--repeats", "1", "--dir", str(tmp_path), "--json", str(out))

    lines = result.stdout.splitlines()
    assert "| pipeline | position | ours state bytes | TF checkpoint bytes | ours restore ms | TF restore ms |" \
        in lines, result.stdout
    rows = [[c.strip() for c in l.strip("|").split("|")] for l in lines if re.match(r"^\| P\d ", l)]
    table = [r for r in rows if len(r) == 6]
    # 4 positions (0, 1%, 50%, 95%) of each pipeline; P1 has 100 batches of 32.
    assert [(r[0][:2], r[1]) for r in table] == [
        (p, pos) for p, n in (("P1", 100), ("P2", 1000), ("P3", 3200))
        for pos in (f"{k:,} ({k / n:.0%})" for k in (0, n // 100, n // 2, n * 95 // 100))], result.stdout
    for r in table:
        assert _cell_number(r[2]) > 0 and _cell_number(r[4]) > 0 and r[3] == r[5] == "-", r
    saves = [r for r in rows if len(r) == 4]
    assert [r[0][:2] for r in saves] == ["P1", "P2", "P3"] and all(_cell_number(r[1]) > 0 for r in saves), \
        result.stdout
    assert any(re.match(r"^P2, ours: restore at 95% and read the rest .* = \d+\.\d{3} \(requirement <= 0\.25: ",
                        l) for l in lines), result.stdout

    report = json.loads(out.read_text())
    assert report["errors"] == {} and len(report["rows"]) == 12 and report["p2_rest_ratio"] > 0
    # Without a buffering node the state stays small; the shuffle's holds its buffer of 100 elements.
    assert all(r["ours_state_bytes"] < 4096 for r in report["rows"] if r["pipeline"] != "P3")


def test_mass_loss_revokes_every_lost_task_and_prints_how_long_the_lock_was_held():
    result = run_benchmark("mass_loss", "--workers", "300", "--lost", "0.5", "--runs", "1")
    line = re.match(r"^300 workers, 150 lost at once: 300 of 600 tasks revoked, ([\d,]+) splits leased; the pass "
                    r"held the lock ([\d,]+) ms \(best of 1\)$", result.stdout.strip())
    assert line and int(line.group(1).replace(",", "")) == 600 * 2, result.stdout  # 2 splits an answer at 300


def test_new_job_fan_out_makes_the_first_workers_tasks_at_once_and_the_rest_in_the_woken_polls_passes():
    from dataservice.dispatcher.core import EAGER_TASK_WORKERS

    result = run_benchmark("new_job_fan_out", "--workers", "100", "--repeats", "1")
    line = re.match(r"^100 workers, fault-tolerant: GetOrCreateIteration [\d.]+ ms \((\d+) tasks made\); the woken "
                    r"polls' passes [\d.]+ ms per batch of 8 at p50, [\d.]+ ms the slowest; (\d+) tasks in all "
                    r"\(best of 1\)$", result.stdout.strip())
    assert line, result.stdout
    assert (int(line.group(1)), int(line.group(2))) == (EAGER_TASK_WORKERS, 100)


def test_grpc_call_cost_measures_both_servers_per_rate_and_refuses_unknown_ones():
    result = run_benchmark("grpc_call_cost", "--rates", "50,0", "--seconds", "0.5")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in result.stdout.splitlines()
            if line.startswith("| bare") or line.startswith("| dataservice")]
    assert [row[0] for row in rows] == ["bare grpc.aio"] * 2 + ["dataservice dispatcher"] * 2, result.stdout
    for row in rows:
        assert _cell_number(row[1]) > 0 and row[2].endswith(" ms") and row[3].endswith(" ms"), row
        assert _cell_number(row[3][:-3]) > 0, row  # the client's CPU: every call costs it something
    paced, back_to_back = _cell_number(rows[0][1]), _cell_number(rows[1][1])
    assert paced <= 55 and back_to_back > paced, result.stdout  # the schedule holds the rate; 0 does not

    bad = run_benchmark("grpc_call_cost", "--servers", "tf", timeout_s=60, check=False)
    assert bad.returncode == 2 and "--servers takes bare, dispatcher; got 'tf'" in bad.stderr, bad.stderr
