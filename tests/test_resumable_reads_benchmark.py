"""Smoke test of ``python -m benchmarks.resumable_reads``: a small run with real dispatcher and worker processes
prints its tables, and every read it made was checked (order, exactly once, the restored rest). No figure is
asserted: performance is the benchmark's to measure, not a test's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_resumable_reads_benchmark_small_run(tmp_path):
    out = tmp_path / "report.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    result = subprocess.run([sys.executable, "-m", "benchmarks.resumable_reads", "--elements", "4096", "--repeats", "1",
                             "--state-calls", "50", "--work-us", "20", "--slow-by", "sleep", "--no-peers",
                             "--timeout", "100", "--json", str(out)],
                            capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    lines = result.stdout.splitlines()
    for label in ("| 1. throughput, 2 equally fast workers", "| 2b. throughput, one worker 2x slower",
                  "| 3. state_dict() mid-epoch", "| 4. restore at 80%", "| 4c. work calls after restore",
                  "| dataservice, deterministic=True"):
        assert any(line.startswith(label) for line in lines), f"no row {label!r}:\n{result.stdout}"

    report = json.loads(out.read_text())
    for mode in ("deterministic", "dynamic"):
        restored = report["restore"][mode]
        # The restore at 80% did not replay the epoch: its calls are the rest plus at most the partial groups.
        assert restored["remaining"] == 4096 - int(4096 * 0.8)
        assert restored["remaining"] <= restored["calls_after_restore"] < 4096 * 0.8
        state = json.loads(restored["state_example"])
        assert state["format"] == "dataservice.iterator"
