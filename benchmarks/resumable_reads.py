"""Resumable reads against the dynamic order and peers: ``python -m benchmarks.resumable_reads``.

Issue 27's performance targets, measured with real processes: our dispatcher and 2 worker processes
started from the command line (``python -m dataservice dispatcher|worker``), the reader in this process.
The pipeline is ``range(--elements).map(work)``, ``work`` (``benchmarks.resumable_reads_peers.work``) about
``--work-us`` of numpy per element (calibrated here), each element ``(index, float32[--floats])``: 4 KiB by
default, 64 split groups of 1,024 elements. Every figure is the median of ``--repeats`` (default 3):

1. throughput (elements/s, ``iter`` to the end of the epoch) of ``distribute("distributed_epoch", ...,
   deterministic=True)`` against the dynamic order (``deterministic=False``), 2 equally fast workers.
   Target: deterministic >= 90% of dynamic. Each read is checked: the deterministic one gives ``0 .. n-1``
   in order, the dynamic one every element once. The two modes alternate, so a change in load hits both.
2. the same with one worker slowed 2x per element: its process alone has ``BENCH_SLOWDOWN=2``, and ``work``
   there (a) repeats itself, or (b) sleeps as long as it worked (``--slow-by``). On 2 cores (a) also takes CPU
   from the fast worker and the reader, so (b), a worker on a slower host, is the case the target is about.
   Target: >= 75%. The table's notes give each worker's share of the elements.
3. ``it.state_dict()`` of an iterator reading from the service, mid-epoch: ``--state-calls`` calls spread
   between 10% and 80% of the epoch, median and p99 (target < 1 ms); the state's JSON size at 80%, and the
   largest mid-epoch.
4. restoring the state taken at ``--restore-at`` (80%) into a new iterator of the pipeline built again, on
   the same cluster once the saving read is closed: from ``load_state_dict`` to the first element, next to one
   split group's compute time (measured in this process; target: within that + 1 s), and the number of
   ``work`` calls the workers made from the restore to the end of the epoch (each worker appends the index
   of every call to a file) against the elements that remained: not a replay of the first 80%. The rest of
   the epoch is checked: the same sequence (deterministic) or exactly the elements not taken (dynamic).
5. peers in the same run, the same elements and work: torchdata ``StatefulDataLoader(num_workers=2)`` and
   Grain (``DataLoader(worker_count=2)``, a ``MapDataset`` iterator), for state size and restore time at 80%
   (``benchmarks.resumable_reads_peers``, under ``--peer-python``: an interpreter with torch, torchdata and
   grain, default ``/work/peervenv/bin/python`` when it exists; neither is a dependency of dataservice).
   They run after ours, so the two never share the CPUs.

Usage::

    python -m benchmarks.resumable_reads [--elements 65536] [--work-us 100] [--floats 1024] [--repeats 3]
                                         [--restore-at 0.8] [--state-calls 2000] [--batch 32]
                                         [--slow-by work,sleep] [--peer-python PATH | --no-peers]
                                         [--json out.json] [--keep-logs] [--timeout 900]

A full run takes about 6 minutes on 2 cores, 1.5 of them the peers'. The header and the last line give the
load average: a figure taken while other processes shared the CPUs is worth less. Progress goes to stderr,
the tables to stdout. Every process it starts is stopped when it ends, fails, times out (``--timeout``) or
gets SIGTERM.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

import dataservice as ds
from benchmarks.peer_python import add_peer_arguments, find_peer_python
from benchmarks.cluster_processes import (REPO, START_TIMEOUT_S, BenchmarkError, Proc, ProcessGroup,
                                          _SERVER_LINES, _server_args, add_run_arguments, interrupt_after,
                                          positive_number, subprocess_env)
from benchmarks.resumable_reads_peers import COUNT_DIR_ENV, SLOW_BY_ENV, SLOWDOWN_ENV, count_calls, time_work, work
from dataservice.service.dispatcher_client import DispatcherClient

MODES = {"deterministic": True, "dynamic": False}
#: How the slow worker is slowed (``BENCH_SLOW_BY``), as the table says it.
SLOW_BY_LABELS = {"work": "repeats its work", "sleep": "sleeps as long as it works"}
#: Issue 27's targets.
EQUAL_RATIO_TARGET = 0.90
SLOW_RATIO_TARGET = 0.75
STATE_DICT_TARGET_MS = 1.0
DETERMINISTIC_STATE_MAX_BYTES = 4096
RESTORE_SLACK_S = 1.0
#: How long a closed read's job may keep the workers busy before the restore starts anyway.
QUIET_TIMEOUT_S = 30.0
QUIET_FOR_S = 1.0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- the cluster ------------------------------------------------------------------------------------------

class Cluster:
    """A dispatcher and one process per worker, each worker with extra environment variables of its own;
    every worker counts its ``work`` calls in ``count_dir``.

    Example::

        >>> with ProcessGroup() as group:
        ...     cluster = Cluster(group, [{}, {"BENCH_SLOWDOWN": "2"}])   # the second worker 2x slower
        ...     _, mark = cluster.calls()
        ...     read_epoch(cluster, args, deterministic=True)["shares"]
        [0.66, 0.34]
    """

    def __init__(self, group: ProcessGroup, worker_envs: list[dict]):
        python = sys.executable
        self.count_dir = tempfile.mkdtemp(prefix="resumable-reads-calls-")
        dispatcher = group.spawn(_server_args("ours", python, "dispatcher"), "ours", "dispatcher")
        port = int(dispatcher.wait_for_line(_SERVER_LINES["ours", "dispatcher"], START_TIMEOUT_S).group(1))
        self.service = f"grpc://localhost:{port}"
        workers: list[Proc] = []
        for i, extra in enumerate(worker_envs):
            env = subprocess_env("ours")
            env.pop(SLOWDOWN_ENV, None)
            env.pop(SLOW_BY_ENV, None)
            env.update({COUNT_DIR_ENV: self.count_dir, **extra})
            path = group.log_dir / f"{len(group.procs):02d}-ours-worker{i}.stderr"
            proc = Proc(_server_args("ours", python, "worker", port), env, path, f"ours worker{i}")
            group.procs.append(proc)
            workers.append(proc)
        for proc in workers:
            proc.wait_for_line(_SERVER_LINES["ours", "worker"], START_TIMEOUT_S)
        #: Each worker's count file (it runs the pipeline in its own process).
        self.files = [f"calls-{proc.pid}.txt" for proc in workers]
        client = DispatcherClient(f"localhost:{port}")
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while len(client.get_status(timeout_s=30).workers) < len(worker_envs):
                if time.monotonic() > deadline:
                    raise BenchmarkError(f"the dispatcher did not list {len(worker_envs)} workers in time")
                time.sleep(0.05)
        finally:
            client.close()

    def calls(self, since: Optional[dict] = None) -> tuple[list[int], dict]:
        return count_calls(self.count_dir, since)

    def shares(self, since: dict) -> list[float]:
        """Each worker's part of the calls made since the ``calls()`` offsets ``since``."""
        done = []
        for name in self.files:
            try:
                with open(os.path.join(self.count_dir, name), "rb") as f:
                    f.seek(since.get(name, 0))
                    done.append(f.read().count(b"\n"))
            except FileNotFoundError:
                done.append(0)
        total = sum(done) or 1
        return [d / total for d in done]

    def wait_quiet(self) -> int:
        """Until the workers' call counts stand still for ``QUIET_FOR_S`` (a closed read's job winding down);
        the calls made meanwhile."""
        _, start = self.calls()
        last, since = start, time.monotonic()
        deadline = since + QUIET_TIMEOUT_S
        while time.monotonic() - since < QUIET_FOR_S and time.monotonic() < deadline:
            time.sleep(0.1)
            _, now = self.calls()
            if now != last:
                last, since = now, time.monotonic()
        return len(self.calls(start)[0])

    def close(self) -> None:
        shutil.rmtree(self.count_dir, ignore_errors=True)


# --- the pipeline -----------------------------------------------------------------------------------------

def make_pipeline(args: argparse.Namespace) -> ds.Dataset:
    """``range(n).map(work)``, built anew each time as a restarted trainer would."""
    iters, floats = args.iters, args.floats
    # A plain function, not functools.partial: the pipeline's fingerprint digests a partial by pickling it,
    # and where ``work`` travels by value (on a worker) that pickle holds its module's changing globals, so
    # a group state one worker recorded would be "of another pipeline" to the other (a seek refused).
    return ds.Dataset.range(args.elements).map(lambda x: work(x, iters, floats))


def read_from(service: str, args: argparse.Namespace, deterministic: bool) -> ds.Dataset:
    return make_pipeline(args).apply(ds.distribute("distributed_epoch", service, deterministic=deterministic))


def calibrate(target_us: float, floats: int) -> tuple[int, float]:
    """The ``iters`` of ``work`` closest to ``target_us`` per element here, and its measured time (us)."""
    iters = 16
    for _ in range(3):
        iters = max(1, round(iters * target_us / time_work(iters, floats, count=100)))
    return iters, time_work(iters, floats)


def slow_work_us(args: argparse.Namespace, slow_by: str) -> float:
    """``work``'s time per element in a process set up as the slow worker (measured in a subprocess)."""
    env = {**subprocess_env("ours"), SLOWDOWN_ENV: "2", SLOW_BY_ENV: slow_by}
    env.pop(COUNT_DIR_ENV, None)
    code = (f"from benchmarks.resumable_reads_peers import time_work; "
            f"print(time_work({args.iters}, {args.floats}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env,
                            timeout=START_TIMEOUT_S)
    if result.returncode != 0:
        raise BenchmarkError(f"timing the slow worker's work failed: {result.stderr[-2000:]}")
    return float(result.stdout.split()[-1])


def group_compute_s(args: argparse.Namespace, group: int) -> float:
    """One split group's elements computed in this process (no service): what a worker redoes at most. The
    least of 3, as ``time_work``."""
    pipeline = make_pipeline(args)
    times = []
    for _ in range(3):
        started = time.perf_counter()
        for _ in pipeline.iterate_split_group(group):
            pass
        times.append(time.perf_counter() - started)
    return min(times)


# --- measurements ---------------------------------------------------------------------------------------------

def read_epoch(cluster: Cluster, args: argparse.Namespace, deterministic: bool) -> dict:
    """One whole epoch: elements/s from ``iter`` to the end, the order checked, each worker's share."""
    _, mark = cluster.calls()
    dataset = read_from(cluster.service, args, deterministic)
    started = time.perf_counter()
    indices = [int(x) for x, _ in dataset]
    seconds = time.perf_counter() - started
    n = args.elements
    if deterministic and indices != list(range(n)):
        wrong = next((i for i, (a, b) in enumerate(zip(indices, range(n))) if a != b), min(len(indices), n))
        raise BenchmarkError(f"deterministic read: {len(indices)} elements, first out of order at {wrong}")
    if not deterministic and sorted(indices) != list(range(n)):
        raise BenchmarkError(f"dynamic read: {len(indices)} elements, not every element once")
    return {"seconds": seconds, "elements_per_s": n / seconds, "shares": cluster.shares(mark)}


def _close(it: Any) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()


def save_read(service: str, args: argparse.Namespace, deterministic: bool) -> dict:
    """Reads to ``--restore-at`` of the epoch, timing ``state_dict()`` on the way; returns the state there
    (as JSON text), the indices taken, and the times."""
    n = args.elements
    stop_at = int(n * args.restore_at)
    first_call = int(n * 0.1)
    step = max(1, (stop_at - first_call) // args.state_calls)
    call_at = set(range(first_call, stop_at, step))
    dataset = read_from(service, args, deterministic)
    started = time.perf_counter()
    it = iter(dataset)
    taken = [int(next(it)[0])]
    first_s = time.perf_counter() - started
    times_ns: list[int] = []
    sizes: list[int] = []
    while len(taken) < stop_at:
        if len(taken) in call_at:
            t0 = time.perf_counter_ns()
            state = it.state_dict()
            times_ns.append(time.perf_counter_ns() - t0)
            sizes.append(len(json.dumps(state)))
        taken.append(int(next(it)[0]))
    t0 = time.perf_counter_ns()
    state = it.state_dict()
    times_ns.append(time.perf_counter_ns() - t0)
    text = json.dumps(state)
    sizes.append(len(text))
    _close(it)
    del it
    gc.collect()
    if deterministic and taken != list(range(stop_at)):
        raise BenchmarkError("deterministic read: the first elements are not 0, 1, 2, ...")
    times_ms = sorted(t / 1e6 for t in times_ns)
    return {"first_s": first_s, "state": text, "taken": taken, "state_bytes": len(text.encode()),
            "state_bytes_max": max(sizes), "state_dict_ms_median": statistics.median(times_ms),
            "state_dict_ms_p99": times_ms[min(len(times_ms) - 1, int(len(times_ms) * 0.99))],
            "state_dict_ms_max": times_ms[-1], "state_dict_calls": len(times_ms),
            "partial_groups": len(state["position"].get("partial", {})) if isinstance(state.get("position"), dict)
            else None}


def restore_read(cluster: Cluster, args: argparse.Namespace, deterministic: bool, saved: dict) -> dict:
    """A new iterator of the pipeline built again, restored from the saved state: the time from
    ``load_state_dict`` to its first element, the rest of the epoch checked, and the workers' calls."""
    n = args.elements
    taken = saved["taken"]
    _, mark = cluster.calls()
    dataset = read_from(cluster.service, args, deterministic)
    it = iter(dataset)
    state = json.loads(saved["state"])
    started = time.perf_counter()
    it.load_state_dict(state)
    rest = [int(next(it)[0])]
    first_s = time.perf_counter() - started
    rest.extend(int(x) for x, _ in it)
    ended_s = time.perf_counter() - started
    del it
    gc.collect()
    taken_set = set(taken)
    if deterministic and rest != list(range(len(taken), n)):
        raise BenchmarkError(f"deterministic restore: the rest ({len(rest)} elements) is not "
                             f"{len(taken)} .. {n - 1} in order")
    if not deterministic and sorted(rest) != sorted(set(range(n)) - taken_set):
        raise BenchmarkError(f"dynamic restore: the rest ({len(rest)} elements) is not every element not "
                             f"taken ({n - len(taken)}) once")
    calls, _ = cluster.calls(mark)
    return {"first_s": first_s, "rest_s": ended_s, "remaining": n - len(taken), "calls": len(calls),
            "replayed_calls": sum(1 for c in calls if c in taken_set)}


def median_of(runs: list[dict], key: str) -> Optional[float]:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def throughput(cluster: Cluster, args: argparse.Namespace, label: str) -> dict:
    """``--repeats`` epochs of each mode, alternating which goes first."""
    runs: dict[str, list] = {m: [] for m in MODES}
    for repeat in range(args.repeats):
        order = list(MODES) if repeat % 2 == 0 else list(reversed(MODES))
        for mode in order:
            result = read_epoch(cluster, args, MODES[mode])
            runs[mode].append(result)
            log(f"[{label}] {mode} run {repeat + 1}/{args.repeats}: {result['elements_per_s']:,.0f} el/s "
                f"({result['seconds']:.2f} s; workers' shares "
                f"{', '.join(f'{s:.0%}' for s in result['shares'])})")
    return {mode: {"runs": r, "elements_per_s": median_of(r, "elements_per_s"),
                   "shares": [statistics.median(run["shares"][i] for run in r) for i in range(len(r[0]["shares"]))]}
            for mode, r in runs.items()}


def save_and_restore(cluster: Cluster, args: argparse.Namespace) -> dict:
    """Per repeat and mode: a read saved at ``--restore-at`` (timing ``state_dict``), closed, then restored."""
    out: dict[str, dict] = {m: {"saves": [], "restores": [], "abandoned_calls": []} for m in MODES}
    for repeat in range(args.repeats):
        order = list(MODES) if repeat % 2 == 0 else list(reversed(MODES))
        for mode in order:
            _, mark = cluster.calls()
            saved = save_read(cluster.service, args, MODES[mode])
            cluster.wait_quiet()
            abandoned = len(cluster.calls(mark)[0]) - len(saved["taken"])
            restored = restore_read(cluster, args, MODES[mode], saved)
            out[mode]["saves"].append({k: v for k, v in saved.items() if k not in ("taken",)})
            out[mode]["restores"].append(restored)
            out[mode]["abandoned_calls"].append(abandoned)
            log(f"[restore] {mode} run {repeat + 1}/{args.repeats}: state_dict median "
                f"{saved['state_dict_ms_median']:.3f} ms, p99 {saved['state_dict_ms_p99']:.3f} ms, "
                f"{saved['state_bytes']} B; restore -> first {restored['first_s'] * 1e3:.0f} ms; "
                f"calls after restore {restored['calls']:,} for {restored['remaining']:,} remaining "
                f"({restored['replayed_calls']:,} of taken elements); the saving read's job computed "
                f"{abandoned:,} elements it never took")
    summary: dict[str, dict] = {}
    for mode, o in out.items():
        saves, restores = o["saves"], o["restores"]
        summary[mode] = {
            "runs": o,
            **{key: median_of(saves, key) for key in ("state_dict_ms_median", "state_dict_ms_p99",
                                                      "state_dict_ms_max", "state_bytes", "partial_groups")},
            "state_bytes_max": max(s["state_bytes_max"] for s in saves),
            "fresh_first_s": median_of(saves, "first_s"),
            "restore_first_s": median_of(restores, "first_s"),
            "calls_after_restore": median_of(restores, "calls"),
            "replayed_calls": median_of(restores, "replayed_calls"),
            "remaining": restores[0]["remaining"],
            "abandoned_calls": statistics.median(o["abandoned_calls"]),
            "state_example": saves[-1]["state"],
        }
    return summary


# --- peers ------------------------------------------------------------------------------------------------

def run_peers(python: str, args: argparse.Namespace) -> dict:
    cfg = {"n": args.elements, "iters": args.iters, "floats": args.floats, "restore_at": args.restore_at,
           "repeats": args.repeats, "batch": args.batch}
    env = subprocess_env("ours")
    env.pop(COUNT_DIR_ENV, None)
    env.pop(SLOWDOWN_ENV, None)
    try:
        result = subprocess.run([python, "-m", "benchmarks.resumable_reads_peers", json.dumps(cfg)],
                                capture_output=True, text=True, cwd=REPO, env=env, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"peers": [], "errors": [{"peer": "all", "error": f"the peers took over {args.timeout:.0f} s"}]}
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        return {"peers": [], "errors": [{"peer": "all", "error": f"exit code {result.returncode}: "
                                                                 f"{result.stderr[-2000:]}"}]}
    return json.loads(lines[-1])


# --- tables ---------------------------------------------------------------------------------------------------

def _table(headers: list[str], rows: list[list[str]], right: set) -> str:
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if i in right else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(r, widths))) + " |"

    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def _n(value: Optional[float], digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _shares(measured: dict) -> str:
    """The second worker's share of the elements in each mode."""
    return ", ".join(f"{mode} {m['shares'][1]:.0%}" for mode, m in measured.items())


def _yes(ok: bool) -> str:
    return "yes" if ok else "NO"


def ours_table(equal: dict, slow: dict, restore: dict, group_s: float, group_elements: int) -> tuple[str, bool]:
    """Our figures beside issue 27's targets, and whether every target was met. ``slow``: slow-by -> throughput."""
    det, dyn = restore["deterministic"], restore["dynamic"]
    rows = []
    met = True

    def ratio_row(label: str, measured: dict, target: float) -> None:
        nonlocal met
        a, b = measured["deterministic"]["elements_per_s"], measured["dynamic"]["elements_per_s"]
        ratio = a / b
        met &= ratio >= target
        rows.append([label, _n(a), _n(b), f"{ratio:.0%} (target >= {target:.0%})", _yes(ratio >= target)])

    ratio_row("1. throughput, 2 equally fast workers [el/s]", equal, EQUAL_RATIO_TARGET)
    for slow_by, measured in slow.items():
        how = SLOW_BY_LABELS[slow_by]
        ratio_row(f"2{'ab'[list(SLOW_BY_LABELS).index(slow_by)]}. throughput, one worker 2x slower ({how}) [el/s]",
                  measured, SLOW_RATIO_TARGET)
    ok = max(det["state_dict_ms_p99"], dyn["state_dict_ms_p99"]) < STATE_DICT_TARGET_MS
    met &= ok
    rows.append(["3. state_dict() mid-epoch, median / p99 [ms]",
                 f"{det['state_dict_ms_median']:.3f} / {det['state_dict_ms_p99']:.3f}",
                 f"{dyn['state_dict_ms_median']:.3f} / {dyn['state_dict_ms_p99']:.3f}",
                 f"p99 < {STATE_DICT_TARGET_MS:g} ms", _yes(ok)])
    ok = det["state_bytes_max"] <= DETERMINISTIC_STATE_MAX_BYTES
    met &= ok
    rows.append(["3b. state JSON at 80% (largest mid-epoch) [bytes]",
                 f"{_n(det['state_bytes'])} ({_n(det['state_bytes_max'])})",
                 f"{_n(dyn['state_bytes'])} ({_n(dyn['state_bytes_max'])})",
                 f"deterministic <= {DETERMINISTIC_STATE_MAX_BYTES:,}", _yes(ok)])
    bound = group_s + RESTORE_SLACK_S
    ok = max(det["restore_first_s"], dyn["restore_first_s"]) <= bound
    met &= ok
    rows.append(["4. restore at 80%: load_state_dict -> first element [ms]", _n(det["restore_first_s"] * 1e3),
                 _n(dyn["restore_first_s"] * 1e3),
                 f"<= one group ({group_s * 1e3:,.0f} ms) + 1 s", _yes(ok)])
    rows.append(["4b. fresh read: iter -> first element [ms]", _n(det["fresh_first_s"] * 1e3),
                 _n(dyn["fresh_first_s"] * 1e3), "-", "-"])
    taken = det["remaining"]
    ok = all(m["replayed_calls"] <= max(1, m["partial_groups"] or 0) * group_elements for m in (det, dyn))
    met &= ok
    rows.append(["4c. work calls after restore / elements remaining",
                 f"{_n(det['calls_after_restore'])} / {_n(taken)}",
                 f"{_n(dyn['calls_after_restore'])} / {_n(dyn['remaining'])}",
                 "not a replay of the 80%", _yes(ok)])
    rows.append(["4d. of which elements taken before the save (partial groups' prefixes)",
                 f"{_n(det['replayed_calls'])} ({_n(det['partial_groups'])} group)",
                 f"{_n(dyn['replayed_calls'])} ({_n(dyn['partial_groups'])} groups)",
                 f"<= partial groups x {group_elements:,}", "-"])
    return _table(["measure", "deterministic=True", "dynamic (default)", "target", "met"], rows, {1, 2}), met


def peers_table(restore: dict, peers: dict) -> str:
    """Ours beside the peers: state size, first element fresh and restored, work calls after a restore."""
    rows = []
    for mode, label in (("deterministic", "dataservice, deterministic=True (2 worker processes)"),
                        ("dynamic", "dataservice, dynamic order (2 worker processes)")):
        m = restore[mode]
        rows.append([label, _n(m["state_bytes"]), "JSON", _n(m["fresh_first_s"] * 1e3),
                     _n(m["restore_first_s"] * 1e3),
                     f"{_n(m['calls_after_restore'])} / {_n(m['remaining'])}",
                     "new job: done groups skipped, the partial group's prefix dropped"])
    for p in peers.get("peers", []):
        size, fmt = (p["state_json_bytes"], "JSON") if p["state_json_bytes"] is not None else \
            (p["state_pickle_bytes"], "pickle")
        rows.append([p["name"], _n(size), fmt, _n(p["fresh_s"] * 1e3), _n(p["restore_s"] * 1e3),
                     f"{_n(p['calls_after_restore'])} / {_n(p['remaining'])}", p["how"]])
    for e in peers.get("errors", []):
        rows.append([e["peer"], "error", "-", "-", "-", "-", e["error"].splitlines()[0][:120]])
    headers = ["reader", "state [bytes]", "format", "fresh: first element/batch [ms]",
               "restore at 80%: first [ms]", "work calls after restore / remaining", "how it resumes"]
    return _table(headers, rows, {1, 3, 4, 5})


# --- main ------------------------------------------------------------------------------------------------

def _slow_by_list(text: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values or any(v not in SLOW_BY_LABELS for v in values):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(SLOW_BY_LABELS)}, "
                                         f"got {text!r}")
    return list(dict.fromkeys(values))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.resumable_reads",
                                     description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elements", type=positive_number(int), default=65_536)
    parser.add_argument("--work-us", type=positive_number(float), default=100.0,
                        help="numpy work per element, calibrated here (default 100)")
    parser.add_argument("--floats", type=positive_number(int), default=1024,
                        help="float32 values per element (default 1024: 4 KiB)")
    parser.add_argument("--repeats", type=positive_number(int), default=3)
    parser.add_argument("--restore-at", type=positive_number(float), default=0.8)
    parser.add_argument("--state-calls", type=positive_number(int), default=2000)
    parser.add_argument("--batch", type=positive_number(int), default=32, help="the peers' batch size")
    parser.add_argument("--slow-by", type=_slow_by_list, default=list(SLOW_BY_LABELS), metavar="LIST",
                        help="how the slow worker of measurement 2 is slowed: work (it repeats its work, taking "
                             "CPU from the others on a shared host), sleep (it sleeps as long as it works: a "
                             "slower host), or both (default: work,sleep)")
    add_peer_arguments(parser, "torch, torchdata and grain")
    add_run_arguments(parser)
    return parser


def main(argv: Optional[list] = None) -> int:
    args = build_parser().parse_args(argv)
    if not 0 < args.restore_at < 1:
        raise SystemExit("--restore-at must be between 0 and 1")
    interrupt_after(args.timeout)
    started = time.monotonic()
    for name in (COUNT_DIR_ENV, SLOWDOWN_ENV, SLOW_BY_ENV):
        os.environ.pop(name, None)  # this process's own work() (calibration, group time) neither counts nor slows
    args.iters, work_us = calibrate(args.work_us, args.floats)
    slow_us = {slow_by: slow_work_us(args, slow_by) for slow_by in args.slow_by}
    pipeline = make_pipeline(args)
    groups = pipeline.split_groups()
    group_elements = -(-args.elements // groups.num_groups)
    restore_group = int(args.elements * args.restore_at) // group_elements
    group_s = group_compute_s(args, restore_group)
    header = (f"resumable reads: range({args.elements:,}).map(work), {args.iters} numpy rounds = {work_us:.0f} us per "
              f"element here, elements of {args.floats * 4 + 8:,} bytes, {groups.num_groups} split groups "
              f"(about {group_elements:,} elements, {group_s * 1e3:,.0f} ms each); 2 worker processes; median of "
              f"{args.repeats}; {os.cpu_count()} cores, Python {platform.python_version()}; load average "
              f"{os.getloadavg()[0]:.1f} at the start")
    log(header)
    if groups.num_groups < 16:
        log(f"warning: only {groups.num_groups} split groups; use more --elements")
    peer_python, peer_note = find_peer_python(args, "torch==2.13.0 torchdata grain")
    report: dict[str, Any] = {"command": " ".join([sys.executable, "-m", "benchmarks.resumable_reads",
                                                   *(sys.argv[1:] if argv is None else argv)]),
                              "work_us": work_us, "iters": args.iters, "num_groups": groups.num_groups,
                              "group_compute_s": group_s, "slow_work_us": slow_us, "peer_note": peer_note}
    try:
        with ProcessGroup(keep_logs=args.keep_logs) as group:
            cluster = Cluster(group, [{}, {}])
            try:
                equal = throughput(cluster, args, "2 equal workers")
                restore = save_and_restore(cluster, args)
            finally:
                cluster.close()
        slow: dict[str, dict] = {}
        for slow_by in args.slow_by:
            with ProcessGroup(keep_logs=args.keep_logs) as group:
                cluster = Cluster(group, [{}, {SLOWDOWN_ENV: "2", SLOW_BY_ENV: slow_by}])
                try:
                    slow[slow_by] = throughput(cluster, args, f"one worker 2x slower, {SLOW_BY_LABELS[slow_by]}")
                finally:
                    cluster.close()
        peers: dict = {"peers": [], "errors": []}
        if peer_python:
            log(f"peers: {peer_note}")
            peers = run_peers(peer_python, args)
    except (BenchmarkError, ds.errors.DataServiceError, KeyboardInterrupt) as exc:
        print(f"resumable reads benchmark failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.alarm(0)
    duration = time.monotonic() - started

    table, met = ours_table(equal, slow, restore, group_s, group_elements)
    print(header)
    print()
    print(table)
    print()
    versions = peers.get("versions") or {}
    print(f"Peers (same elements and work, batches of {args.batch}; "
          + ", ".join(f"{k} {v}" for k, v in versions.items() if v) + f"; {peer_note}):")
    print()
    print(peers_table(restore, peers))
    print()
    print(f"deterministic state at 80%: {restore['deterministic']['state_example']}")
    print(f"dynamic state at 80%: {restore['dynamic']['state_example']}")
    print(f"the saving read's workers computed {restore['deterministic']['abandoned_calls']:,.0f} "
          f"(deterministic) and {restore['dynamic']['abandoned_calls']:,.0f} (dynamic) elements beyond what it "
          f"took (read ahead, dropped when it closed; median)")
    for slow_by, measured in slow.items():
        print(f"2{'ab'[list(SLOW_BY_LABELS).index(slow_by)]}: the slow worker took {slow_us[slow_by]:.0f} us per "
              f"element ({slow_us[slow_by] / work_us:.1f}x, measured alone); its share of the elements: "
              + _shares(measured) + f" (equal workers: {_shares(equal)})")
    print(f"every target met: {_yes(met)}; total time {duration:.0f} s; load average {os.getloadavg()[0]:.1f} at "
          f"the end (above 2 on 2 cores: other processes shared the CPUs)")
    if args.json:
        report.update(duration_s=duration, equal=equal, slow=slow, restore=restore, peers=peers, met=met)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
