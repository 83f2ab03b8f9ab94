"""An image pipeline against the loaders a user would pick instead: ``python -m benchmarks.image_pipeline``.

Issue 28's real workload: ``--images`` (2,000) JPEGs of 320x240, made once with a fixed seed into a cache
directory, each read, decoded with Pillow, random-resized cropped to 224, flipped at random and normalized to
float32 CHW; batches of 32 (``benchmarks.image_pipeline_peers.transform`` and ``collate``: the same code in
every system). Every system uses ``--workers`` (2) worker processes or threads, one system at a time:

- plain loop: ``transform`` and ``collate`` in this one process, no loader (the machine's reference);
- plain loops side by side: 2 forked processes, each the plain loop over every other batch, no loader: what 2
  cores give at all (two busy vCPUs may each run slower than one alone);
- dataservice: a real dispatcher and ``dataservice worker --processes 2`` (a supervisor and 2 worker
  processes), started from the command line; the reader in this process reads
  ``range(n).map(transform).batch(32)`` through ``distribute("distributed_epoch", ...)``;
- the peers, under ``--peer-python`` (an interpreter with torch, SPDL and Grain, default
  ``/work/peervenv/bin/python``; none of them is a dependency of dataservice): torch ``DataLoader(num_workers=2)``
  with persistent workers and without, SPDL with 2 threads, Grain ``mp_prefetch`` with 2 workers (an iterator per
  epoch) and the plain loop again in that interpreter (``benchmarks.image_pipeline_peers``). They run after ours, so the two
  never share the CPUs.

Each system: one warm-up epoch, then ``--repeats`` (3) timed epochs; the table gives the medians of images/s
and of CPU-seconds per 1,000 images of the whole process tree: this process and every descendant (dispatcher,
workers, loader processes), from /proc (``image_pipeline_peers.tree_cpu_s``: each live process's utime + stime
+ cutime + cstime, so an exited and reaped child counts in its parent). Issue 28's targets are checked in the
last lines: dataservice >= 1.15x torch DataLoader with persistent workers, >= 90% of 2x the plain loop, and
CPU per image <= 1.05x the plain loop's.

Usage::

    python -m benchmarks.image_pipeline [--images 2000] [--batch 32] [--workers 2] [--repeats 3] [--warmup 1]
                                        [--rounds 1] [--cache-dir DIR] [--seed 0]
                                        [--systems plain,side-by-side,dataservice]
                                        [--peer-python PATH | --no-peers] [--json out.json] [--timeout 900]

A full run takes about 2 minutes on 2 cores. Progress goes to stderr, the table to stdout (markdown). The
header and the last line give the load average: a figure taken while other processes shared the CPUs is worth
less. Every process it starts is stopped when it ends, fails, times out (``--timeout``) or gets SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from benchmarks.peer_python import add_peer_arguments, find_peer_python
from benchmarks.cluster_processes import (REPO, BenchmarkError, ProcessGroup, add_run_arguments, interrupt_after,
                                          positive_number, start_cluster, subprocess_env)
from benchmarks.image_pipeline_peers import (count_batches, make_images, measure_epochs, plain_loop,
                                             plain_loops_side_by_side, transform)

DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dataservice-bench"
OUR_SYSTEMS = ("plain", "side-by-side", "dataservice")
PLAIN = "plain loop, 1 process"
SIDE_BY_SIDE = "plain loops side by side, no loader"
#: Issue 28's targets for dataservice.
TORCH_RATIO_TARGET = 1.15
MACHINE_SHARE_TARGET = 0.90
CPU_RATIO_TARGET = 1.05


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def dataservice_system(group: ProcessGroup, paths: list[str], args: argparse.Namespace) -> Callable[[int], int]:
    """A dispatcher and ``worker --processes N`` of our own (children of this process); each epoch a new
    ``distributed_epoch`` read of the pipeline in this process."""
    import dataservice as ds

    service, _ = start_cluster(group, "ours", sys.executable, args.workers)
    batch, seed = args.batch, args.seed

    def run(epoch: int) -> int:
        # A plain function of (i, epoch): it travels to the workers with the paths it names.
        dataset = (ds.Dataset.range(len(paths)).map(lambda i: transform(paths[i], i, seed, epoch)).batch(batch)
                   .apply(ds.distribute("distributed_epoch", service)))
        return count_batches(dataset, batch, len(paths))
    return run


def run_ours(paths: list[str], args: argparse.Namespace) -> list[dict]:
    results = []
    for system in args.systems:
        if system == "plain":
            results.append(measure_epochs(plain_loop(paths, args.batch, args.seed), len(paths), args.repeats,
                                          args.warmup, log, PLAIN))
        elif system == "side-by-side":
            results.append(measure_epochs(plain_loops_side_by_side(paths, args.batch, args.seed, args.workers),
                                          len(paths), args.repeats, args.warmup, log,
                                          f"{SIDE_BY_SIDE}, {args.workers} processes"))
        elif system == "dataservice":
            with ProcessGroup(keep_logs=args.keep_logs) as group:
                run = dataservice_system(group, paths, args)
                results.append(measure_epochs(run, len(paths), args.repeats, args.warmup, log,
                                              f"dataservice, `worker --processes {args.workers}`"))
    return results


def run_peers(python: str, directory: str, args: argparse.Namespace) -> dict:
    cfg = {"dir": directory, "n": args.images, "batch": args.batch, "workers": args.workers,
           "repeats": args.repeats, "seed": args.seed}
    try:
        result = subprocess.run([python, "-m", "benchmarks.image_pipeline_peers", json.dumps(cfg)],
                                stdout=subprocess.PIPE, stderr=None, text=True, cwd=REPO,
                                env=subprocess_env("peers"), timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"systems": [], "errors": [{"system": "peers", "error": f"took over {args.timeout:.0f} s"}]}
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        return {"systems": [], "errors": [{"system": "peers", "error": f"exit code {result.returncode}"}]}
    return json.loads(lines[-1])


def merge(results: list[dict]) -> list[dict]:
    """The results of several rounds, one per system (in the order first seen), each with all its runs and
    their medians.

    Example::

        >>> merge([{"name": "a", "runs": [{"images_per_s": 1, "cpu_s_per_1000": 2}]}] * 2)[0]["images_per_s"]
        1
    """
    by: dict[str, list[dict]] = {}
    for result in results:
        by.setdefault(result["name"], []).extend(result["runs"])
    return [{"name": name, "runs": runs,
             "images_per_s": statistics.median(r["images_per_s"] for r in runs),
             "cpu_s_per_1000": statistics.median(r["cpu_s_per_1000"] for r in runs)} for name, runs in by.items()]


def table(systems: list[dict], errors: list[dict]) -> str:
    """The markdown table: images/s and CPU-s per 1,000 images, with each run's figures."""
    rows = ["| system | images/s | CPU-s per 1,000 images | runs (images/s) | load average (runs) |",
            "|---|---:|---:|---|---|"]
    for s in systems:
        runs = ", ".join(f"{r['images_per_s']:,.0f}" for r in s["runs"])
        loads = ", ".join(f"{r['load']:.1f}" for r in s["runs"] if "load" in r)
        rows.append(f"| {s['name']} | {s['images_per_s']:,.0f} | {s['cpu_s_per_1000']:.2f} | {runs} | {loads} |")
    for e in errors:
        rows.append(f"| {e['system']} | error | - | {e['error'].splitlines()[0][:100]} | - |")
    return "\n".join(rows)


def targets(systems: list[dict]) -> list[str]:
    """Issue 28's targets, each a line saying whether it holds (those whose systems were measured)."""
    by = {s["name"]: s for s in systems}
    ours = next((s for s in systems if s["name"].startswith("dataservice")), None)
    plain = by.get(PLAIN)
    pair = next((s for s in systems if s["name"].startswith(SIDE_BY_SIDE)), None)
    torch = next((s for s in systems if "persistent" in s["name"]), None)
    lines = []
    if ours and torch:
        ratio = ours["images_per_s"] / torch["images_per_s"]
        lines.append(f"dataservice / torch persistent: {ratio:.2f}x (target >= {TORCH_RATIO_TARGET}x): "
                     f"{'met' if ratio >= TORCH_RATIO_TARGET else 'NOT met'}")
    if ours and plain:
        share = ours["images_per_s"] / (2 * plain["images_per_s"])
        lines.append(f"dataservice / (2 x plain loop): {share:.0%} (target >= {MACHINE_SHARE_TARGET:.0%}): "
                     f"{'met' if share >= MACHINE_SHARE_TARGET else 'NOT met'}")
        if pair:
            lines.append(f"dataservice / plain loops side by side: {ours['images_per_s'] / pair['images_per_s']:.0%} "
                         f"(their CPU per image {pair['cpu_s_per_1000'] / plain['cpu_s_per_1000']:.2f}x the "
                         f"single loop's: what running 2 at once costs on this machine, loader or not)")
        cpu = ours["cpu_s_per_1000"] / plain["cpu_s_per_1000"]
        lines.append(f"dataservice CPU per image / plain loop's: {cpu:.2f}x (target <= {CPU_RATIO_TARGET}x): "
                     f"{'met' if cpu <= CPU_RATIO_TARGET else 'NOT met'}")
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.image_pipeline", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=positive_number(int), default=2000)
    parser.add_argument("--batch", type=positive_number(int), default=32)
    parser.add_argument("--workers", type=positive_number(int), default=2,
                        help="worker processes (threads for SPDL) of every system (default 2)")
    parser.add_argument("--repeats", type=positive_number(int), default=3)
    parser.add_argument("--warmup", type=int, default=1, help="untimed epochs first (default 1)")
    parser.add_argument("--rounds", type=positive_number(int), default=1,
                        help="measure every system this many times in turn (ours, then the peers), so a change "
                             "in the machine's load hits all of them; medians over all the runs (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE,
                        help=f"where the images are made once (default {DEFAULT_CACHE})")
    parser.add_argument("--systems", default=",".join(OUR_SYSTEMS),
                        help=f"ours to measure, comma-separated, of {', '.join(OUR_SYSTEMS)} (default: both)")
    add_peer_arguments(parser, "torch, SPDL and Grain")
    add_run_arguments(parser)
    return parser


def main(argv: Optional[list] = None) -> int:
    args = build_parser().parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if any(s not in OUR_SYSTEMS for s in args.systems):
        raise SystemExit(f"--systems: expected some of {', '.join(OUR_SYSTEMS)}, got {args.systems}")
    try:
        import PIL  # noqa: F401 - Pillow is the benchmark's need, not dataservice's
    except ImportError:
        raise SystemExit("the image pipeline needs Pillow: pip install pillow (a benchmark-only package)") from None
    interrupt_after(args.timeout)
    directory = str(args.cache_dir / f"images-320x240-seed{args.seed}")
    started = time.monotonic()
    paths = make_images(directory, args.images, args.seed)
    log(f"{len(paths):,} images in {directory} ({time.monotonic() - started:.1f} s)")
    command = " ".join(["python", "-m", "benchmarks.image_pipeline", *(sys.argv[1:] if argv is None else argv)])
    header = (f"image pipeline: {args.images:,} JPEGs 320x240 -> decode (Pillow), random-resized crop 224, flip, "
              f"normalize float32 CHW, batch {args.batch}; {args.workers} workers per system; median of "
              f"{args.repeats} epochs after {args.warmup} warm-up; CPU of the whole process tree; "
              f"{os.cpu_count()} cores, Python {platform.python_version()}; load average "
              f"{os.getloadavg()[0]:.2f} at the start")
    log(header)
    peer_python, peer_note = find_peer_python(args, "torch==2.13.0 torchdata grain spdl pillow")
    report: dict[str, Any] = {"command": command, "header": header, "peer_note": peer_note}
    rounds: list[dict] = []
    peers: dict = {"systems": [], "errors": []}
    try:
        for number in range(args.rounds):
            if args.rounds > 1:
                log(f"round {number + 1} of {args.rounds}")
            rounds.extend(run_ours(paths, args))
            if peer_python:
                log(peer_note)
                got = run_peers(peer_python, directory, args)
                rounds.extend(got.get("systems", []))
                peers["errors"].extend(got.get("errors", []))
                peers["versions"] = got.get("versions")
    except (BenchmarkError, RuntimeError, KeyboardInterrupt) as exc:
        print(f"image pipeline benchmark failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.alarm(0)
    everything = merge(rounds)
    versions = peers.get("versions") or {}
    print(header)
    print()
    print(table(everything, peers.get("errors", [])))
    print()
    if versions:
        print("peers: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v) + f" ({peer_note})")
    else:
        print(peer_note)
    for line in targets(everything):
        print(line)
    print(f"command: {command}; total {time.monotonic() - started:.0f} s; load average {os.getloadavg()[0]:.2f} "
          f"at the end (above 2 on 2 cores: other processes shared the CPUs)")
    if args.json:
        report.update(systems=everything, errors=peers.get("errors", []), versions=versions)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
