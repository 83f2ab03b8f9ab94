"""Snapshot throughput: ``python -m benchmarks.snapshot``.

For each workload: the upstream pipeline alone, the first pass through ``dataservice.snapshot``
(which runs upstream and writes), and a second pass (which reads the snapshot), in elements/s.
The snapshot goes to a temporary directory under ``--dir`` (default /tmp), removed afterwards;
AUTO compression, default sharding.

Example (2 cores)::

    $ python -m benchmarks.snapshot
    1 MiB float32 x 500: upstream alone 36,000/s, write pass 750/s, read pass 1,200/s
    int64 scalars x 1,000,000: upstream alone 11,000,000/s, write pass 1,250,000/s, read pass 1,500,000/s
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import numpy as np

import dataservice as ds


def measure(name: str, dataset: ds.Dataset, n: int, directory: str) -> None:
    path = tempfile.mkdtemp(dir=directory)
    try:
        snapshotted = dataset.apply(ds.snapshot(path))
        started = time.perf_counter()
        written = sum(1 for _ in snapshotted)
        write_s = time.perf_counter() - started
        started = time.perf_counter()
        read = sum(1 for _ in snapshotted)
        read_s = time.perf_counter() - started
        started = time.perf_counter()
        upstream = sum(1 for _ in dataset)
        upstream_s = time.perf_counter() - started
        if not written == read == upstream == n:
            raise SystemExit(f"{name}: expected {n} elements each pass, got {written}, {read}, {upstream}")
        print(f"{name}: upstream alone {n / upstream_s:,.0f}/s, write pass {n / write_s:,.0f}/s, "
              f"read pass {n / read_s:,.0f}/s", flush=True)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="/tmp", help="where the snapshots go (default /tmp)")
    args = parser.parse_args()
    array = np.random.default_rng(0).standard_normal(262_144).astype(np.float32)  # 1 MiB
    measure("1 MiB float32 x 500", ds.Dataset.range(500).map(lambda i: array + np.float32(i)), 500, args.dir)
    measure("int64 scalars x 1,000,000", ds.Dataset.range(1_000_000), 1_000_000, args.dir)


if __name__ == "__main__":
    main()
