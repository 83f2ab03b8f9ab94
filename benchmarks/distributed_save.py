"""distributed_save throughput with 1 and with 2 worker processes on a CPU-bound pipeline.

Each run starts a fresh cluster (``python -m dataservice dispatcher`` and ``worker --processes N``),
calls ``distributed_save`` and times it from the call to the DONE file; the figure is elements per
second, best of ``--repeats``. The pipeline burns about ``--cost-us`` of pure-Python CPU per element,
so the save is bound by the workers' CPU and not the disk. The goal (issue 14): 2 workers at least
1.7x one worker. Needs at least 2 free cores.

Example::

    $ .venv/bin/python -m benchmarks.distributed_save --n 40000
    workers  elements/s  seconds  speedup
          1      10,880     3.68     1.00
          2      21,676     1.85     1.99
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Optional

from benchmarks.cluster_processes import ProcessGroup, positive_number, start_cluster

#: Iterations of the burn loop per microsecond of CPU, roughly (measured here: 26 with CPython 3.11).
_LOOPS_PER_US = 26


def burn(x, loops: int = 100 * _LOOPS_PER_US):
    """About 100 µs of pure-Python CPU per element (the GIL held: one worker process uses one core)."""
    total = 0
    for i in range(loops):
        total += i
    return x


def measure(num_workers: int, n: int, cost_us: int, directory: str, timeout_s: float) -> float:
    """Seconds from the distributed_save call to its DONE file, on a fresh cluster of ``num_workers``."""
    import functools

    import dataservice as ds

    path = os.path.join(directory, f"save-{num_workers}-{time.monotonic_ns()}")
    with ProcessGroup() as group:
        service, _ = start_cluster(group, "ours", sys.executable, num_workers)
        dataset = ds.Dataset.range(n).map(functools.partial(burn, loops=cost_us * _LOOPS_PER_US))
        start = time.perf_counter()
        ds.distributed_save(dataset, path, service, compression=None)
        deadline = start + timeout_s
        while not os.path.exists(os.path.join(path, "DONE")):
            if os.path.exists(os.path.join(path, "ERROR")):
                raise RuntimeError(open(os.path.join(path, "ERROR")).read())
            if time.perf_counter() > deadline:
                raise RuntimeError(f"the save of {n} elements with {num_workers} workers took over {timeout_s} s")
            time.sleep(0.005)
        seconds = time.perf_counter() - start
    shutil.rmtree(path, ignore_errors=True)
    return seconds


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.distributed_save", description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=positive_number(int), default=40_000, help="elements to save (default 40000)")
    parser.add_argument("--cost-us", type=positive_number(int), default=100,
                        help="CPU per element, in microseconds (default 100)")
    parser.add_argument("--repeats", type=positive_number(int), default=2, help="runs per figure; best kept")
    parser.add_argument("--timeout-s", type=positive_number(float), default=300.0)
    parser.add_argument("--json", metavar="PATH", help="also write the figures here")
    args = parser.parse_args(argv)
    directory = tempfile.mkdtemp(prefix="ds-distributed-save-")
    rows = []
    try:
        for workers in (1, 2):
            seconds = min(measure(workers, args.n, args.cost_us, directory, args.timeout_s)
                          for _ in range(args.repeats))
            rows.append({"workers": workers, "seconds": seconds, "elements_per_s": args.n / seconds})
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    base = rows[0]["elements_per_s"]
    print("workers  elements/s  seconds  speedup")
    for row in rows:
        row["speedup"] = row["elements_per_s"] / base
        print(f"{row['workers']:7d}  {row['elements_per_s']:10,.0f}  {row['seconds']:7.2f}  {row['speedup']:7.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": args.n, "cost_us": args.cost_us, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
