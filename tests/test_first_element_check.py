"""The smoke check of workload 4 in ``python -m benchmarks.run``: our time to first element against the
figure stored in ``benchmarks/first_element_baseline.json``, a warning above ``warn_ratio`` times it."""

from __future__ import annotations

import json

import pytest

from benchmarks.run import FIRST_ELEMENT_BASELINE, Measurement, first_element_check
from benchmarks.workloads import MODES

pytestmark = pytest.mark.no_grpc


def _first(mode: str, ms: float, side: str = "ours") -> Measurement:
    return Measurement(side, "first_element", mode, 1, 10, best={"first_element_ms": ms})


@pytest.fixture
def baseline(tmp_path):
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"warn_ratio": 1.5, "first_element_ms": {"parallel_epochs": 20.0}}))
    return path


def test_the_stored_figures_cover_every_mode():
    stored = json.loads(FIRST_ELEMENT_BASELINE.read_text())
    assert stored["warn_ratio"] > 1
    assert set(stored["first_element_ms"]) == set(MODES)
    assert all(0 < ms <= 30 for ms in stored["first_element_ms"].values())  # the issue 28 budget


def test_a_first_element_above_the_ratio_warns_and_one_within_it_is_noted(baseline):
    notes, warnings = first_element_check([_first("parallel_epochs", 30.5)], baseline)
    assert notes == []
    assert len(warnings) == 1 and "parallel_epochs: 30.5 ms, more than 1.5x the stored 20 ms" in warnings[0]

    notes, warnings = first_element_check([_first("parallel_epochs", 29.9)], baseline)
    assert warnings == []
    assert len(notes) == 1 and "within 1.5x the stored 20 ms" in notes[0]


def test_other_workloads_sides_and_failed_runs_are_not_checked(baseline):
    failed = Measurement("ours", "first_element", "parallel_epochs", 1, 10, error="boom")
    theirs = _first("parallel_epochs", 500.0, side="tf")
    other = Measurement("ours", "range", "parallel_epochs", 1, 10, best={"first_element_ms": 500.0})
    assert first_element_check([failed, theirs, other], baseline) == ([], [])


def test_a_mode_without_a_figure_or_an_unreadable_file_is_said_not_raised(baseline, tmp_path):
    notes, warnings = first_element_check([_first("distributed_epoch", 500.0)], baseline)
    assert warnings == [] and "no stored figure" in notes[0]
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    notes, warnings = first_element_check([_first("parallel_epochs", 500.0)], broken)
    assert warnings == [] and "not checked" in notes[0]
