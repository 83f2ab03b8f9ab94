"""Catalogue throughput: ``python -m benchmarks.catalogue``, beside TensorFlow Datasets on the same files.

Prepares, in a temporary data directory (``--dir``):

1. ``shapes`` (6,000 + 1,000 28x28 PNG images with labels: decoding images), with our builder;
2. ``bench_numbers``: ``--numbers`` examples of ``{"x": int64, "v": float32[8]}`` in 4 shards (small
   records: the per-record cost), with our builder — and, with TensorFlow, the same dataset prepared
   by TFDS's own builder in a separate directory, to compare preparation times.

Then reads every split of each, from the files our builder wrote, two passes over one dataset object:
the first reads the files (``try_autocaching`` on, as by default, so it also fills the cache), the
second reads the auto-cache; then the same with ``.batch(64)``. Ours iterates ``catalogue.load(...)`` in a Python loop; TFDS (in a
subprocess of ``--tf-python``, TensorFlow 2.21 + tensorflow-datasets) iterates
``tfds.as_numpy(tfds.builder_from_directory(dir).as_dataset(...))`` in a Python loop too — what a
numpy/PyTorch/JAX training loop does. Figures are examples/s, best of ``--repeats``.

Usage::

    python -m benchmarks.catalogue [--tf-python PATH | --no-tf] [--numbers 300000] [--repeats 2] [--json out.json]
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
from typing import Any, Callable, Optional

import numpy as np

from benchmarks.cluster_processes import positive_number, subprocess_env

TF_SCRIPT = r"""
import json, sys, time, os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
mode, path, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "prepare":
    n = int(sys.argv[4])
    class BenchNumbers(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")
        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
                {"x": np.int64, "v": tfds.features.Tensor(shape=(8,), dtype=np.float32)}))
        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(n)}
        def _generate_examples(self, n):
            v = np.arange(8, dtype=np.float32)
            for i in range(n):
                yield i, {"x": i, "v": v + i}
    t = time.perf_counter()
    BenchNumbers(data_dir=path).download_and_prepare(
        download_config=tfds.download.DownloadConfig(num_shards=4))
    print(json.dumps({"prepare_s": time.perf_counter() - t}))
else:
    def best_two_passes(make, count):
        best = [0.0, 0.0]
        for _ in range(repeats):
            ds = make()
            for p in range(2):
                t = time.perf_counter()
                n = count(tfds.as_numpy(ds))
                best[p] = max(best[p], n / (time.perf_counter() - t))
        return {"first": best[0], "cached": best[1], "count": n}
    b = tfds.builder_from_directory(path)
    out = {}
    for split in b.info.splits:
        out[split] = best_two_passes(lambda: b.as_dataset(split=split), lambda it: sum(1 for _ in it))
        out[split + " batch(64)"] = best_two_passes(lambda: b.as_dataset(split=split).batch(64),
                                                    lambda it: sum(len(x[next(iter(x))]) for x in it))
    print(json.dumps(out))
"""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _numbers_builder(n: int):
    from dataservice import catalogue

    class BenchNumbers(catalogue.GeneratorBasedBuilder):
        VERSION = catalogue.Version("1.0.0")

        def _info(self):
            return catalogue.DatasetInfo(builder=self, features=catalogue.FeaturesDict(
                {"x": np.int64, "v": catalogue.Tensor(shape=(8,), dtype=np.float32)}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(n)}

        def _generate_examples(self, count):
            v = np.arange(8, dtype=np.float32)
            for i in range(count):
                yield i, {"x": i, "v": v + i}

    return BenchNumbers


def best_two_passes(make: Callable[[], Any], count: Callable[[Any], int], repeats: int) -> dict:
    """Examples/s of a first and a second pass over one dataset (the second reads the auto-cache), best of
    ``repeats`` fresh datasets. The TensorFlow script does the same."""
    best = [0.0, 0.0]
    n = 0
    for _ in range(repeats):
        ds = make()
        for p in range(2):
            t = time.perf_counter()
            n = count(ds)
            best[p] = max(best[p], n / (time.perf_counter() - t))
    return {"first": best[0], "cached": best[1], "count": n}


def read_rates(directory: str, repeats: int) -> dict:
    from dataservice import catalogue

    b = catalogue.builder_from_directory(directory)
    out = {}
    for split in b.info.splits:
        out[split] = best_two_passes(lambda: b.as_dataset(split=split), lambda ds: sum(1 for _ in ds), repeats)
        out[split + " batch(64)"] = best_two_passes(lambda: b.as_dataset(split=split).batch(64),
                                                    lambda ds: sum(len(x[next(iter(x))]) for x in ds), repeats)
    return out


def tf_run(python: str, args: list[str]) -> dict:
    proc = subprocess.run([python, "-c", TF_SCRIPT, *args], capture_output=True, text=True, timeout=1800,
                          env=subprocess_env("tf"))
    if proc.returncode != 0:
        raise RuntimeError(f"the TensorFlow side failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: Optional[list[str]] = None) -> dict:
    from dataservice import catalogue
    from benchmarks.save_load import find_tf_python

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tf-python", help="an interpreter with tensorflow and tensorflow-datasets")
    parser.add_argument("--no-tf", action="store_true", help="skip the TFDS columns")
    parser.add_argument("--numbers", type=positive_number(int), default=300_000)
    parser.add_argument("--repeats", type=positive_number(int), default=2)
    parser.add_argument("--dir", help="where to prepare (default: a temporary directory)")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args(argv)
    tf_python, note = find_tf_python(args)
    log(note.replace("TensorFlow save/load", "TFDS"))
    root = tempfile.mkdtemp(prefix="catalogue-bench-", dir=args.dir)
    results: dict = {"numbers": args.numbers}
    try:
        ours_dir = os.path.join(root, "ours")
        t = time.perf_counter()
        catalogue.builder("shapes", data_dir=ours_dir).download_and_prepare()
        results["prepare_shapes_s"] = time.perf_counter() - t
        numbers = _numbers_builder(args.numbers)
        t = time.perf_counter()
        numbers(data_dir=ours_dir).download_and_prepare(download_config=catalogue.DownloadConfig(num_shards=4))
        results["prepare_numbers_s"] = {"ours": time.perf_counter() - t}
        if tf_python:
            results["prepare_numbers_s"]["tfds"] = tf_run(
                tf_python, ["prepare", os.path.join(root, "tfds"), "1", str(args.numbers)])["prepare_s"]
        for name in ("shapes", "bench_numbers"):
            directory = os.path.join(ours_dir, name, "1.0.0")
            results[name] = {"ours": read_rates(directory, args.repeats)}
            if tf_python:
                results[name]["tfds"] = tf_run(tf_python, ["read", directory, str(args.repeats)])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


def print_table(results: dict) -> None:
    def fmt(value: Optional[float]) -> str:
        return "skipped" if value is None else f"{value:,.0f}"

    print(f"prepare shapes (ours): {results['prepare_shapes_s']:.2f} s; prepare bench_numbers "
          f"({results['numbers']:,} examples): ours {results['prepare_numbers_s']['ours']:.2f} s, TFDS "
          + (f"{results['prepare_numbers_s']['tfds']:.2f} s" if "tfds" in results["prepare_numbers_s"] else "skipped"))
    print("| dataset / split | ours, first pass | TFDS, first pass | ours, cached | TFDS, cached |")
    print("|---|---|---|---|---|")
    for name in ("shapes", "bench_numbers"):
        for split, ours in results[name]["ours"].items():
            tfds = results[name].get("tfds", {}).get(split, {})
            print(f"| {name} {split} ({ours['count']:,}) | {fmt(ours['first'])} | {fmt(tfds.get('first'))} | "
                  f"{fmt(ours['cached'])} | {fmt(tfds.get('cached'))} |")


if __name__ == "__main__":
    main()
