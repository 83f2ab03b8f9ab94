"""Save / load throughput: ``python -m benchmarks.save_load``, beside ``dd`` and TensorFlow.

Measures, in one run and on the same file system (``--dir``, default a temporary directory
under ``/tmp``):

1. the disk's sequential write speed: ``dd if=/dev/zero of=DIR/dd.bin bs=1M count=N conv=fdatasync``
   (N MiB, the size of workload 2), so the figure includes the flush to the disk, as a save's
   fsyncs do;
2. ``Dataset.range(N).map(i -> np.full(2**18, i, float32)).save(DIR/x)`` (1 MiB float32 arrays), then
   ``for x in Dataset.load(DIR/x)``; MB/s of array data, the pipeline's own time included;
3. the same with ``compression="AUTO"``;
4. ``Dataset.range(M).save(...)`` then ``load`` (small int64 scalars); elements/s;
5. the same with ``compression="AUTO"``.

With ``--tf-python PATH`` (an interpreter with TensorFlow; auto-detected as for
``benchmarks.run``), the same pipelines run through ``tf.data.Dataset.save`` / ``load`` in a
subprocess (``tf.fill`` for ``np.full``); TensorFlow's load is counted by ``Dataset.reduce``, in
its C++ runtime, ours by a Python ``for`` loop. Without TensorFlow those columns say "skipped".
Each figure is the best of ``--repeats`` runs; ``dd`` runs before and after each repeat, so both
see the same machine load (its first write into fresh pages is often much slower than the next).
The loads read files just written: from the page cache. MB is 10**6 bytes.

Usage::

    python -m benchmarks.save_load [--tf-python PATH | --no-tf] [--mib 500] [--scalars 1000000]
                                   [--repeats 2] [--dir /some/disk] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Optional

import numpy as np

from benchmarks.cluster_processes import positive_number, subprocess_env

MB = 1e6
ARRAY_ELEMENTS = 1 << 18  # float32: 1 MiB

TF_SCRIPT = r"""
import json, sys, time
import tensorflow as tf
kind, n, path, compression = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] or None
if compression == "AUTO":
    compression = "SNAPPY"  # Dataset.save takes None, "GZIP" or "SNAPPY"; its fast codec stands for AUTO
if kind == "arrays":
    ds = tf.data.Dataset.range(n).map(lambda i: tf.fill([%d], tf.cast(i, tf.float32)))
else:
    ds = tf.data.Dataset.range(n)
t = time.perf_counter()
ds.save(path, compression=compression)
save_s = time.perf_counter() - t
loaded = tf.data.Dataset.load(path, compression=compression)
t = time.perf_counter()
count = int(loaded.reduce(tf.constant(0, tf.int64), lambda s, _: s + 1))
load_s = time.perf_counter() - t
print(json.dumps({"save_s": save_s, "load_s": load_s, "count": count}))
""" % ARRAY_ELEMENTS


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def find_tf_python(args: argparse.Namespace) -> tuple[Optional[str], str]:
    """As ``benchmarks.run``: the interpreter for the TensorFlow columns, and a note saying which or why none."""
    from benchmarks.run import find_tf_python as find

    python, note = find(args)
    return python, note.replace("tf.data service", "TensorFlow save/load")


def measure_dd(directory: str, mib: int) -> float:
    """MB/s of ``dd ... conv=fdatasync`` writing ``mib`` MiB into ``directory``."""
    target = os.path.join(directory, "dd.bin")
    try:
        started = time.perf_counter()
        subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={mib}", "conv=fdatasync"],
                       check=True, capture_output=True, timeout=600)
        elapsed = time.perf_counter() - started
    finally:
        if os.path.exists(target):
            os.unlink(target)
    return mib * (1 << 20) / elapsed / MB


def measure_ours(kind: str, n: int, directory: str, compression: Optional[str]) -> dict:
    from dataservice import Dataset

    if kind == "arrays":
        ds = Dataset.range(n).map(lambda i: np.full(ARRAY_ELEMENTS, i, np.float32))
    else:
        ds = Dataset.range(n)
    path = os.path.join(directory, "ours")
    try:
        started = time.perf_counter()
        ds.save(path, compression=compression)
        save_s = time.perf_counter() - started
        started = time.perf_counter()
        count = 0
        for _ in Dataset.load(path):
            count += 1
        load_s = time.perf_counter() - started
    finally:
        shutil.rmtree(path, ignore_errors=True)
    if count != n:
        raise RuntimeError(f"ours: loaded {count} elements, saved {n}")
    return {"save_s": save_s, "load_s": load_s}


def measure_tf(python: str, kind: str, n: int, directory: str, compression: Optional[str]) -> dict:
    path = os.path.join(directory, "tf")
    try:
        result = subprocess.run([python, "-c", TF_SCRIPT, kind, str(n), path, compression or ""],
                                capture_output=True, text=True, timeout=1800, env=subprocess_env("tf"))
    finally:
        shutil.rmtree(path, ignore_errors=True)
    if result.returncode != 0:
        raise RuntimeError(f"TensorFlow run failed: {result.stderr.strip()[-2000:]}")
    out = json.loads(result.stdout.strip().splitlines()[-1])
    if out["count"] != n:
        raise RuntimeError(f"TensorFlow: loaded {out['count']} elements, saved {n}")
    return out


def rate(kind: str, n: int, seconds: float) -> float:
    return n * ARRAY_ELEMENTS * 4 / seconds / MB if kind == "arrays" else n / seconds


def fmt(value: Optional[float]) -> str:
    if value is None:
        return "skipped"
    return f"{value:,.0f}"


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.save_load", description=__doc__.split("\n")[0])
    tf = parser.add_mutually_exclusive_group()
    tf.add_argument("--tf-python", metavar="PATH", help="interpreter with TensorFlow (default: auto-detect)")
    tf.add_argument("--no-tf", action="store_true", help="only ours and dd")
    parser.add_argument("--mib", type=positive_number(int), default=500, help="1 MiB arrays to save (default 500)")
    parser.add_argument("--scalars", type=positive_number(int), default=1_000_000,
                        help="int64 scalars to save (default 1000000)")
    parser.add_argument("--repeats", type=positive_number(int), default=2, help="runs per figure; best kept")
    parser.add_argument("--dir", default=None, help="directory on the disk to measure (default: under /tmp)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures here")
    args = parser.parse_args(argv)

    tf_python, tf_note = find_tf_python(args)
    log(tf_note)
    base = tempfile.mkdtemp(prefix="dataservice-save-bench-", dir=args.dir)
    workloads = [("arrays", args.mib, None), ("arrays", args.mib, "AUTO"),
                 ("scalars", args.scalars, None), ("scalars", args.scalars, "AUTO")]
    best: dict = {}
    failures: dict = {}
    dd_best = 0.0
    try:
        for repeat in range(args.repeats):
            dd_best = max(dd_best, measure_dd(base, args.mib))
            log(f"repeat {repeat + 1}: dd {dd_best:,.0f} MB/s (best so far)")
            for kind, n, compression in workloads:
                sides = [("ours", lambda: measure_ours(kind, n, base, compression))]
                if tf_python:
                    sides.append(("tf", lambda: measure_tf(tf_python, kind, n, base, compression)))
                for side, run in sides:
                    key = (kind, compression, side)
                    try:
                        r = run()
                    except RuntimeError as exc:
                        if side != "tf":
                            raise
                        # Reported in the table, not fatal: e.g. TF 2.21's SNAPPY load of 1 MiB elements fails
                        # with "Output buffer ... too small".
                        failures[key] = str(exc).strip().splitlines()[-1][-160:]
                        log(f"  tf {kind} compression={compression}: failed: {failures[key]}")
                        continue
                    save_rate, load_rate = rate(kind, n, r["save_s"]), rate(kind, n, r["load_s"])
                    old = best.get(key, (0.0, 0.0))
                    best[key] = (max(old[0], save_rate), max(old[1], load_rate))
                    log(f"  {side} {kind} compression={compression}: save {save_rate:,.0f}, load {load_rate:,.0f}")
            dd_best = max(dd_best, measure_dd(base, args.mib))
    finally:
        shutil.rmtree(base, ignore_errors=True)

    print(f"save/load benchmark (best of {args.repeats}; {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}); {tf_note}")
    print(f"disk: dd bs=1M count={args.mib} conv=fdatasync: {dd_best:,.0f} MB/s\n")
    print("| workload | compression | ours save | ours load | TF save | TF load |")
    print("|---|---|---|---|---|---|")
    rows = []
    for kind, n, compression in workloads:
        ours = best[(kind, compression, "ours")]
        theirs = best.get((kind, compression, "tf"))
        label = f"{n} x 1 MiB float32 arrays [MB/s]" if kind == "arrays" else f"range({n}), int64 scalars [el/s]"
        codec = compression or "None"
        tf_codec = "" if compression is None else " (TF: SNAPPY)"
        failed = failures.get((kind, compression, "tf"))
        tf_cells = (f"fails: {failed}", "-") if failed and not theirs else \
            (fmt(theirs[0] if theirs else None), fmt(theirs[1] if theirs else None))
        print(f"| {label} | {codec}{tf_codec} | {fmt(ours[0])} | {fmt(ours[1])} | {tf_cells[0]} | {tf_cells[1]} |")
        rows.append({"workload": kind, "n": n, "compression": compression, "ours_save": ours[0],
                     "ours_load": ours[1], "tf_save": theirs[0] if theirs else None,
                     "tf_load": theirs[1] if theirs else None})
    arrays_save = best[("arrays", None, "ours")][0]
    print(f"\n1 MiB arrays, uncompressed: save at {arrays_save / dd_best:.0%} of dd's bandwidth (goal: 50%)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"dd_mb_s": dd_best, "rows": rows, "tf": tf_note}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
