"""Service benchmarks: ``python -m benchmarks.run``, our service against TensorFlow's tf.data service.

Runs each workload against our service with the dispatcher, the worker(s) and
the client as separate processes, and prints one table: elements/s, MB/s, time
to first element (ms) and client peak RSS (MB). When an interpreter with
TensorFlow is available, the same workloads run on tf.data service
(TensorFlow's C++ ``DispatchServer`` and ``WorkerServer``, each in its own
process, the client in a third) in the same run, and the table shows the ratio
ours / theirs. TensorFlow is not a dependency: ``--tf-python`` names an
interpreter that has it (default: ``/work/tfvenv/bin/python`` or a ``tfvenv``
next to this checkout if there is one, else this interpreter if it can import
tensorflow; otherwise the TensorFlow columns are skipped with a note).

Usage::

    python -m benchmarks.run [--tf-python /work/tfvenv/bin/python | --no-tf]
                             [--workloads all|small|range,float_arrays,...|1,2,...]
                             [--modes parallel_epochs,distributed_epoch]
                             [--quick] [--repeats 2] [--json out.json] [--timeout 900]

``make bench`` runs it with the defaults. On 2 cores the full run with
TensorFlow takes about 11 minutes, half of it TensorFlow reading
``range(200000)`` (about 2,000 elements/s); ``--quick`` (one run each, smaller
datasets) about 2.5 minutes, or 15 s with ``--no-tf``.

Workloads (each in both processing modes, one worker unless stated):

1. ``range``: ``range(200000)``, int64 scalars; elements/s.
2. ``float_arrays``: ``range(3000).map(x -> 1 MiB float32 array)`` (``np.full`` / ``tf.fill``); MB/s.
   Row 2b is the client's peak RSS in that read, with the default ``max_outstanding_requests``.
3. ``image_batches``: ``range(25600).map(x -> (64x64x3 uint8, int64)).batch(64)``; MB/s.
4. ``first_element``: time to the first element of ``range(10)``, from applying ``distribute`` (which
   registers the dataset, for TensorFlow) and creating the iterator to the first element; the cluster is up.
   Row 4b: from the last element of that read to the end of the sequence (``StopIteration``).
   A smoke check compares our figure with the one stored in ``benchmarks/first_element_baseline.json``
   and prints a warning when it is more than ``warn_ratio`` (1.5) times that.
5. ``client_rss``: the client's peak RSS (``getrusage``) reading workload 2 with
   ``max_outstanding_requests=8``, against ``baseline + (8 + 1) x 1 MiB`` (baseline: RSS before the read; the
   ``+ 1`` is the element the consumer holds); what remains above that is the fixed overhead.
6. ``cpu_map``: ``range(8000).map(f)``, ``f`` a pure-Python busy loop of about 0.5 ms, with 1 worker process
   and with 2; elements/s (all workers' elements) and the speedup (target 1.7x on 2 cores). TensorFlow cannot
   run Python on its workers (``tf.py_function`` stays in the client), so its ``f`` is a ``tf.while_loop``
   calibrated to the same time per element; compare the speedups.
7. ``float_arrays_tcp``: workload 2 with ``distribute(data_transfer_protocol="tcp")``: the path between hosts.
   By default a client on the worker's host copies large arrays straight out of the worker's memory (one
   copy instead of TCP's two; ``dataservice.service.cross_memory``), which is what workload 2 measures here,
   where everything runs on one host. Compared with tf.data service's workload 2.

Method: every run starts fresh processes (dispatcher, workers and client; the
client's imports overlap the workers' start-up), waits until the workers are
up, then times the read in the client process: the first element (time to
first element), then the first to the last element (throughput counts the
elements after the first; the end of the sequence, which tf.data service learns
about a second later, is timed apart). Each number is the best of ``--repeats``
runs (highest throughput, lowest time or RSS); a run whose read takes over 30 s
is not repeated. The 1- and 2-worker runs of workload 6 alternate, so a change
in load hits both alike. Both services run with their defaults otherwise
(TensorFlow's ``compression="AUTO"`` may compress elements, and the constant
arrays of workloads 2 and 3 compress well). MB is 10**6 bytes. Every process is
killed when its run ends, fails or times out. Progress goes to stderr, the
table to stdout, everything to ``--json``.

Example::

    $ python -m benchmarks.run --quick --workloads range,first_element --modes parallel_epochs
    dataservice benchmarks (quick, best of 1; 2 CPUs, Python 3.11.7); tf.data service: TensorFlow 2.21.0 under ...

    | workload                                            | mode            |    ours | tf.data service | ratio |
    |-----------------------------------------------------|-----------------|---------|-----------------|-------|
    | 1. range(20000), int64 scalars [el/s]               | parallel_epochs | 291,528 |           2,174 |  134x |
    | 4. time to first element, range(10) [ms]            | parallel_epochs |     9.1 |            85.4 | 0.11x |
    | 4b. last element to end of sequence, same read [ms] | parallel_epochs |    25.0 |           953.1 | 0.03x |
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from benchmarks.cluster_processes import (CLIENT_MODULES, REPO, START_TIMEOUT_S, BenchmarkError, ProcessGroup,
                                          interrupt_on_sigterm, positive_number, run_client, subprocess_env,
                                          tensorflow_works)
from benchmarks.workloads import FLOAT_ARRAY_ELEMENTS, GROUPS, MB, MODES, WORKLOADS, Workload

#: Reads longer than this are stable enough: they are not repeated.
LONG_READ_S = 30.0
DEFAULT_TIMEOUT_S = 900.0
TF_PYTHON_CANDIDATES = (Path("/work/tfvenv/bin/python"), REPO.parent / "tfvenv" / "bin" / "python",
                        REPO / "tfvenv" / "bin" / "python")
SIDES = ("ours", "tf")
#: Workload 5's bound above the baseline RSS: the outstanding requests' elements and the one the consumer holds.
CLIENT_RSS_BOUND_MB = (WORKLOADS["client_rss"].max_outstanding_requests + 1) * FLOAT_ARRAY_ELEMENTS * 4 / MB
_WORKLOAD_NUMBERS = {str(i + 1): key for i, key in enumerate(WORKLOADS)}
#: Workload 4's stored figures, per mode, and the ratio above which a run warns (see first_element_check).
FIRST_ELEMENT_BASELINE = Path(__file__).with_name("first_element_baseline.json")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- arguments --------------------------------------------------------------------------------------

def _workload_list(text: str) -> list[str]:
    keys: list[str] = []
    for name in (part.strip() for part in text.split(",") if part.strip()):
        name = _WORKLOAD_NUMBERS.get(name, name)
        if name in GROUPS:
            keys.extend(GROUPS[name])
        elif name in WORKLOADS:
            keys.append(name)
        else:
            raise argparse.ArgumentTypeError(
                f"unknown workload {name!r}: choose from {', '.join(WORKLOADS)}, 1-{len(WORKLOADS)}, "
                f"or a group ({', '.join(GROUPS)})")
    if not keys:
        raise argparse.ArgumentTypeError("no workloads given")
    return list(dict.fromkeys(keys))  # in order, without repeats


def _mode_list(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    for mode in modes:
        if mode not in MODES:
            raise argparse.ArgumentTypeError(f"unknown mode {mode!r}: choose from {', '.join(MODES)}")
    if not modes:
        raise argparse.ArgumentTypeError("no modes given")
    return list(dict.fromkeys(modes))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description="Benchmark our data service (dispatcher, workers and client in separate processes) and, "
                    "when TensorFlow is available, tf.data service on the same workloads.")
    tf = parser.add_mutually_exclusive_group()
    tf.add_argument("--tf-python", metavar="PATH",
                    help="interpreter with TensorFlow for the tf.data service side (default: auto-detect)")
    tf.add_argument("--no-tf", action="store_true", help="only our service")
    parser.add_argument("--workloads", type=_workload_list, default=list(WORKLOADS), metavar="LIST",
                        help=f"comma-separated: {', '.join(WORKLOADS)}, their numbers 1-{len(WORKLOADS)}, "
                             f"or a group: {', '.join(k + ' (' + '+'.join(v) + ')' for k, v in GROUPS.items())}"
                             " (default: all)")
    parser.add_argument("--modes", type=_mode_list, default=list(MODES), metavar="LIST",
                        help=f"comma-separated processing modes (default: {','.join(MODES)})")
    parser.add_argument("--quick", action="store_true", help="smaller datasets and one run each")
    parser.add_argument("--repeats", type=positive_number(int), default=None,
                        help="runs per measurement, the best is reported (default: 2; 1 with --quick)")
    parser.add_argument("--json", metavar="PATH", help="also write every run's results as JSON here")
    parser.add_argument("--timeout", type=positive_number(float), default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help=f"give up on one run's read after this long (default: {DEFAULT_TIMEOUT_S:.0f})")
    parser.add_argument("--cpu-map-ms", type=positive_number(float), default=0.5, metavar="MS",
                        help="time per element of workload 6's busy loop (default: 0.5)")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep the processes' stderr files (their directory is printed)")
    return parser


# --- TensorFlow ----------------------------------------------------------------------------------------

def find_tf_python(args: argparse.Namespace) -> tuple[Optional[str], str]:
    """The interpreter for the tf side and a note saying which (or why none)."""
    if args.no_tf:
        return None, "tf.data service skipped (--no-tf)"
    if args.tf_python:
        ok, info = tensorflow_works(args.tf_python)
        if not ok:
            raise SystemExit(f"python -m benchmarks.run: error: --tf-python {args.tf_python} cannot import "
                             f"tensorflow: {info}")
        return args.tf_python, f"tf.data service: TensorFlow {info} under {args.tf_python}"
    candidates = [str(p) for p in TF_PYTHON_CANDIDATES if p.exists()]
    if importlib.util.find_spec("tensorflow") is not None:
        candidates.append(sys.executable)
    tried = []
    for python in dict.fromkeys(candidates):
        ok, info = tensorflow_works(python)
        if ok:
            return python, f"tf.data service: TensorFlow {info} under {python}"
        tried.append(f"{python} ({info})")
    why = "; tried " + ", ".join(tried) if tried else ""
    return None, f"tf.data service skipped: no interpreter with TensorFlow found (pass --tf-python PATH){why}"


# --- measurements ----------------------------------------------------------------------------------------

@dataclasses.dataclass
class Measurement:
    side: str
    workload: str
    mode: str
    workers: int
    n: int
    runs: list = dataclasses.field(default_factory=list)
    best: Optional[dict] = None
    error: Optional[str] = None
    warnings: list = dataclasses.field(default_factory=list)


def _better(workload: Workload, a: dict, b: dict) -> bool:
    """Whether run ``a`` beats run ``b`` on the workload's metric."""
    if workload.key == "first_element":
        return a["first_element_ms"] < b["first_element_ms"]
    if workload.key == "client_rss":
        return a["peak_rss_mb"] < b["peak_rss_mb"]
    if workload.metric == "MB/s":
        return a["mb_per_s"] > b["mb_per_s"]
    return a["elements_per_s"] > b["elements_per_s"]


def _run_summary(workload: Workload, result: dict) -> str:
    parts = [f"{result['elements']:,} elements", f"first {result['first_element_ms']:.1f} ms",
             f"read {result['read_s']:.2f} s", f"end of sequence +{result['end_of_sequence_ms']:.0f} ms",
             f"{result['elements_per_s']:,.0f} el/s"]
    if workload.metric == "MB/s" or workload.key == "client_rss":
        parts.append(f"{result['mb_per_s']:,.1f} MB/s")
    parts.append(f"peak RSS {result['peak_rss_mb']:,.1f} MB")
    return ", ".join(parts)


def measure_once(m: Measurement, python: str, workload: Workload, attempt: int, repeats: int,
                 timeout_s: float, keep_logs: bool, extra_args: tuple = ()) -> Optional[dict]:
    """One run of ``m`` on fresh processes, recorded in ``m``; None if it failed (``m.error`` says why)."""
    label = (f"[{m.side}] {m.workload} {m.mode} ({m.workers} worker{'s' if m.workers > 1 else ''}, "
             f"n={m.n:,}) run {attempt + 1}/{repeats}")
    started = time.monotonic()
    try:
        with ProcessGroup(keep_logs=keep_logs) as group:
            result = run_client(group, m.side, python, m.workers,
                                ["--workload", m.workload, "--mode", m.mode, "--n", str(m.n), *extra_args],
                                timeout_s)
            if keep_logs:
                log(f"  logs: {group.log_dir}")
    except (BenchmarkError, ValueError, OSError) as exc:
        m.error = str(exc)
        log(f"{label}: FAILED after {time.monotonic() - started:.1f} s:\n{exc}")
        return None
    result["wall_s"] = time.monotonic() - started
    m.runs.append(result)
    if result["elements"] != result["expected_elements"]:
        warning = (f"{m.side} {m.workload} {m.mode} with {m.workers} worker(s): read {result['elements']:,} "
                   f"elements, expected {result['expected_elements']:,}")
        if warning not in m.warnings:
            m.warnings.append(warning)
    log(f"{label}: {_run_summary(workload, result)} (wall {result['wall_s']:.1f} s)")
    if m.best is None or _better(workload, result, m.best):
        m.best = result
    return result


def measure(side: str, python: str, workload: Workload, mode: str, n: int, repeats: int, timeout_s: float,
            keep_logs: bool, extra_args: tuple = ()) -> list[Measurement]:
    """Best of ``repeats`` runs for each of the workload's worker counts. The counts alternate within
    a repeat (1, 2, 1, 2), so a change in the machine's load affects both sides of a speedup alike."""
    ms = [Measurement(side, workload.key, mode, workers, n) for workers in workload.worker_counts]
    for attempt in range(repeats):
        long_read = False
        for m in ms:
            if m.error is None:
                result = measure_once(m, python, workload, attempt, repeats, timeout_s, keep_logs, extra_args)
                long_read |= result is not None and result["total_s"] > LONG_READ_S
        if all(m.error for m in ms):
            break
        if long_read and attempt + 1 < repeats:
            log(f"[{side}] {workload.key} {mode}: a read took over {LONG_READ_S:.0f} s; not repeating it")
            break
    return ms


def calibrate(side: str, python: str, target_ms: float) -> dict:
    """The busy-loop length of workload 6 for ``target_ms`` per element, measured under ``python``."""
    try:
        result = subprocess.run([python, "-m", CLIENT_MODULES[side], "calibrate", "--target-ms", str(target_ms)],
                                capture_output=True, text=True, timeout=START_TIMEOUT_S, cwd=REPO,
                                env=subprocess_env(side))
    except subprocess.TimeoutExpired as exc:
        raise BenchmarkError(f"calibrating the busy loop under {python} took over {START_TIMEOUT_S:.0f} s") from exc
    for line in result.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise BenchmarkError(f"calibrating the busy loop under {python} failed (exit code {result.returncode}): "
                         f"{result.stderr[-2000:]}")


def first_element_check(measurements: list[Measurement], baseline_path: Path = FIRST_ELEMENT_BASELINE
                        ) -> tuple[list[str], list[str]]:
    """(notes, warnings) of the smoke check of workload 4: our best time to first element in each mode
    against the figure stored in ``baseline_path``, a warning where it is more than ``warn_ratio`` times that.
    A slow first element hides behind good throughput (the first ``distribute()`` of a process once scanned
    every installed distribution's metadata, 35-80 ms): this keeps it in sight.

    Example::

        >>> m = Measurement("ours", "first_element", "parallel_epochs", 1, 10, best={"first_element_ms": 80.0})
        >>> first_element_check([m])[1]
        ['time to first element, parallel_epochs: 80.0 ms, more than 1.5x the stored 26.6 ms
          (first_element_baseline.json): a regression, or a loaded machine; profile the first next() of a
          distributed dataset']
    """
    ours = [m for m in measurements if m.side == "ours" and m.workload == "first_element" and m.best]
    if not ours:
        return [], []
    try:
        stored = json.loads(baseline_path.read_text())
        ratio = float(stored["warn_ratio"])
        figures = {mode: float(ms) for mode, ms in stored["first_element_ms"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return [f"time to first element not checked: cannot read {baseline_path}: {exc}"], []
    notes, warnings = [], []
    for m in ours:
        figure, measured = figures.get(m.mode), m.best["first_element_ms"]
        if figure is None:
            notes.append(f"time to first element, {m.mode}: no stored figure in {baseline_path.name}")
        elif measured > ratio * figure:
            warnings.append(f"time to first element, {m.mode}: {measured:.1f} ms, more than {ratio:g}x the stored "
                            f"{figure:g} ms ({baseline_path.name}): a regression, or a loaded machine; profile the "
                            f"first next() of a distributed dataset")
        else:
            notes.append(f"time to first element, {m.mode}: {measured:.1f} ms, within {ratio:g}x the stored "
                         f"{figure:g} ms ({baseline_path.name})")
    return notes, warnings


# --- the table ----------------------------------------------------------------------------------------------

def _fmt(value: Optional[float], unit: str) -> str:
    if value is None:
        return "-"
    if unit == "x":
        return f"{value:.2f}x"
    if unit in ("ms", "MB", "MB/s") and value < 1000:
        return f"{value:,.1f}"
    return f"{value:,.0f}"


def _ratio(ours: Optional[float], theirs: Optional[float]) -> str:
    if ours is None or theirs is None or theirs == 0:
        return "-"
    r = ours / theirs
    return f"{r:.2f}x" if r < 10 else f"{r:.0f}x"


def build_rows(measurements: list[Measurement], quick: bool, tf_enabled: bool) -> list[dict]:
    """Table rows: {workload, mode, unit, ours, tf, ours_error, tf_error}."""
    found = {(m.side, m.workload, m.mode, m.workers): m for m in measurements}
    rows: list[dict] = []

    def cell(side: str, key: str, mode: str, workers: int, pick) -> tuple[Optional[float], Optional[str]]:
        m = found.get((side, key, mode, workers))
        if m is None:
            return None, None
        if m.best is None:
            return None, m.error or "no result"
        return pick(m.best), None

    def add(label: str, mode: str, unit: str, key: str, workers: int, pick) -> None:
        ours, ours_error = cell("ours", key, mode, workers, pick)
        theirs, tf_error = cell("tf", WORKLOADS[key].tf_counterpart or key, mode, workers, pick)
        rows.append({"workload": label, "mode": mode, "unit": unit, "ours": ours, "tf": theirs,
                     "ours_error": ours_error, "tf_error": tf_error if tf_enabled else None})

    keys = list(dict.fromkeys(m.workload for m in measurements))
    modes = list(dict.fromkeys(m.mode for m in measurements))
    for key in keys:
        w = WORKLOADS[key]
        title = w.describe(quick)
        for mode in modes:
            if key in ("range",):
                add(f"{title} [el/s]", mode, "el/s", key, 1, lambda r: r["elements_per_s"])
            elif key in ("float_arrays", "image_batches", "float_arrays_tcp"):
                add(f"{title} [MB/s]", mode, "MB/s", key, 1, lambda r: r["mb_per_s"])
                if key == "float_arrays":
                    add("2b. client peak RSS, workload 2, default max_outstanding_requests [MB]", mode, "MB", key,
                        1, lambda r: r["peak_rss_mb"])
            elif key == "first_element":
                add(f"{title} [ms]", mode, "ms", key, 1, lambda r: r["first_element_ms"])
                add("4b. last element to end of sequence, same read [ms]", mode, "ms", key, 1,
                    lambda r: r["end_of_sequence_ms"])
            elif key == "client_rss":
                add(f"{title} [MB]", mode, "MB", key, 1, lambda r: r["peak_rss_mb"])
                add("5b. baseline RSS + (8 + 1) x 1 MiB [MB]", mode, "MB", key, 1,
                    lambda r: r["baseline_rss_mb"] + CLIENT_RSS_BOUND_MB)
                add("5c. peak RSS - 5b: fixed overhead [MB]", mode, "MB", key, 1,
                    lambda r: r["peak_rss_mb"] - r["baseline_rss_mb"] - CLIENT_RSS_BOUND_MB)
            elif key == "cpu_map":
                for workers in w.worker_counts:
                    add(f"{title}, {workers} worker process{'es' if workers > 1 else ''} [el/s]", mode, "el/s",
                        key, workers, lambda r: r["elements_per_s"])
                label = f"6b. speedup, {max(w.worker_counts)} vs 1 worker processes (target 1.7x)"
                speed = {}
                for side in SIDES:
                    one, _ = cell(side, key, mode, 1, lambda r: r["elements_per_s"])
                    two, _ = cell(side, key, mode, max(w.worker_counts), lambda r: r["elements_per_s"])
                    speed[side] = two / one if one and two else None
                rows.append({"workload": label, "mode": mode, "unit": "x", "ours": speed["ours"], "tf": speed["tf"],
                             "ours_error": None, "tf_error": None})
    return rows


def format_table(rows: list[dict], tf_enabled: bool) -> str:
    headers = ["workload", "mode", "ours", "tf.data service", "ratio"]
    cells = [headers]
    for row in rows:
        ours = "error" if row["ours_error"] else _fmt(row["ours"], row["unit"])
        if not tf_enabled:
            theirs, ratio = "skipped", "-"
        else:
            theirs = "error" if row["tf_error"] else _fmt(row["tf"], row["unit"])
            ratio = _ratio(row["ours"], row["tf"])
        cells.append([row["workload"], row["mode"], ours, theirs, ratio])
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    right = {2, 3, 4}

    def line(r: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if i in right else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(r, widths))) + " |"

    out = [line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


# --- main ---------------------------------------------------------------------------------------------------

def main(argv: Optional[list] = None) -> int:
    args = build_parser().parse_args(argv)
    interrupt_on_sigterm()
    repeats = args.repeats or (1 if args.quick else 2)
    started = time.monotonic()
    tf_python, tf_note = find_tf_python(args)
    log(tf_note)
    sides = {"ours": sys.executable}
    if tf_python:
        sides["tf"] = tf_python

    calibration: dict[str, dict] = {}
    measurements: list[Measurement] = []
    errors: list[str] = []
    try:
        if "cpu_map" in args.workloads:
            for side, python in sides.items():
                try:
                    calibration[side] = calibrate(side, python, args.cpu_map_ms)
                    log(f"[{side}] cpu_map busy loop: {calibration[side]['iters']} iterations, "
                        f"{calibration[side]['ms_per_element']:.3f} ms per element (run locally)")
                except BenchmarkError as exc:
                    errors.append(f"{side} cpu_map calibration: {exc}")
                    log(str(exc))
        for key in args.workloads:
            workload = WORKLOADS[key]
            n = workload.size(args.quick)
            for mode in args.modes:
                for side, python in sides.items():
                    if side == "tf" and workload.tf_counterpart:
                        continue  # measured on its own row
                    extra: tuple = ()
                    if key == "cpu_map":
                        if side not in calibration:
                            continue
                        extra = ("--busy-iters", str(calibration[side]["iters"]))
                    for m in measure(side, python, workload, mode, n, repeats, args.timeout, args.keep_logs,
                                     extra):
                        measurements.append(m)
                        if m.error:
                            errors.append(f"{side} {key} {mode} ({m.workers} worker(s)): {m.error}")
    except KeyboardInterrupt:
        log("interrupted: printing what was measured")
        errors.append("interrupted")
    duration = time.monotonic() - started

    rows = build_rows(measurements, args.quick, tf_python is not None)
    print(f"dataservice benchmarks ({'quick, ' if args.quick else ''}best of {repeats}; "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}); {tf_note}")
    print()
    print(format_table(rows, tf_python is not None))
    print()
    notes = ["ratio = ours / tf.data service: above 1 is better for el/s, MB/s and speedup; "
             "below 1 is better for ms and MB (RSS)."]
    for side, c in calibration.items():
        notes.append(f"workload 6, {side}: busy loop of {c['iters']} iterations, {c['ms_per_element']:.3f} ms per "
                     f"element run locally" + (" (tf.while_loop: tf.py_function cannot run on tf.data service "
                                                 "workers; tf.data also parallelizes a stateless map within one "
                                                 "worker by default, experimental_optimization.map_parallelization"
                                                 ", so one tf worker already uses every core)"
                                                 if side == "tf" else " (pure Python)"))
    for m in measurements:
        notes.extend(f"warning: {w}" for w in m.warnings)
    first_notes, first_warnings = first_element_check(measurements)
    notes.extend(first_notes)
    notes.extend(f"warning: {w}" for w in first_warnings)
    for warning in first_warnings:
        log(f"warning: {warning}")
    for note in notes:
        print(note)
    print(f"total time {duration:.0f} s")
    if errors:
        print()
        print(f"{len(errors)} error(s):")
        for error in errors:
            print("  - " + error.replace("\n", "\n    "))
    sys.stdout.flush()

    if args.json:
        report: dict[str, Any] = {
            "command": " ".join([sys.executable, "-m", "benchmarks.run", *(sys.argv[1:] if argv is None else argv)]),
            "duration_s": duration,
            "quick": args.quick,
            "repeats": repeats,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
            "tf_python": tf_python,
            "tf_note": tf_note,
            "calibration": calibration,
            "rows": rows,
            "measurements": [dataclasses.asdict(m) for m in measurements],
            "errors": errors,
            "first_element_check": {"notes": first_notes, "warnings": first_warnings},
        }
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        log(f"wrote {args.json}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
