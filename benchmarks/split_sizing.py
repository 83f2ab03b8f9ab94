"""Split sizing on a small, costly dataset (issue 28): do 2 workers deliver 1.6x one worker's images/s?

The image pipeline: N JPEGs of 320x240 (generated once with numpy and Pillow into a temporary directory),
decoded with Pillow, random-resized crop to 224, random flip, normalized to float32 CHW, batched by 32,
read in ``distributed_epoch`` from a dispatcher process and 1 or 2 worker processes
(``python -m dataservice dispatcher`` / ``worker``, one ``worker`` command per worker), all started by
this script and killed when it ends. The reader is this process.

For each N (200, 400, 2,000 by default) and worker count it runs a warm-up epoch, then ``--epochs``
measured ones, and reports the median images/s, the ratio of 2 workers to 1, and the epoch's tail: the
time from the first worker's last image to the last worker's last image (each worker's map function
appends its images' wall-clock times to a trace file of its process; a worker that made nothing in the
epoch was idle from its start). Columns: ``2w busy``, how many of the 2 workers made images in every
epoch; ``busiest``, the busiest worker's share of the images (its inverse bounds the speed-up 2 workers
can give, however loaded the machine is: 1.00 means one worker did everything); ``cpu ms/img``, the
worker processes' CPU per image (what per-split overheads cost, less sensitive to a loaded machine
than images/s).

Usage::

    .venv/bin/python -m benchmarks.split_sizing                       # N = 200, 400, 2000; 3 epochs each
    .venv/bin/python -m benchmarks.split_sizing --sizes 200 --epochs 5 --json out.json

It runs against the dataservice of the checkout it lies in (its directory is put first on the workers'
PYTHONPATH and on this process's ``sys.path``): copy it into an older checkout to measure that one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path[:1]:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

BATCH = 32
CROP = 224
START_TIMEOUT_S = 120.0
EPOCH_TIMEOUT_S = 600.0
_LISTENING = {"dispatcher": re.compile(r"^dispatcher listening on grpc://[^:\s]+:(\d+)\s*$"),
              "worker": re.compile(r"^worker listening on [^:\s]+:\d+\b")}


# --- the images and the pipeline --------------------------------------------------------------------------

def make_images(directory: str, count: int, seed: int = 0) -> list:
    """``count`` JPEGs of 320x240 in ``directory`` (smooth noise, so they compress as photos do).

    Example::

        >>> paths = make_images("/tmp/imgs", 4)
        >>> len(paths), paths[0].endswith(".jpg")
        (4, True)
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        coarse = rng.integers(0, 256, size=(30, 40, 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize((320, 240), Image.BILINEAR)
        path = os.path.join(directory, f"img{i:05d}.jpg")
        image.save(path, quality=90)
        paths.append(path)
    return paths


def load_image(path, trace_dir: str) -> np.ndarray:
    """Decode, random-resized crop to 224, random flip, normalize to float32 CHW; the time it was made is
    appended to this process's trace file."""
    from PIL import Image

    name = path.decode() if isinstance(path, bytes) else str(path)
    rng = np.random.default_rng()
    with Image.open(name) as image:
        image = image.convert("RGB")
        width, height = image.size
        scale = rng.uniform(0.35, 1.0)
        w, h = int(width * np.sqrt(scale)), int(height * np.sqrt(scale))
        left, top = rng.integers(0, width - w + 1), rng.integers(0, height - h + 1)
        image = image.resize((CROP, CROP), Image.BILINEAR, box=(left, top, left + w, top + h))
    array = np.asarray(image, dtype=np.float32)
    if rng.random() < 0.5:
        array = array[:, ::-1]
    array = (array / 255.0 - np.float32(0.45)) / np.float32(0.225)
    out = np.ascontiguousarray(array.transpose(2, 0, 1))
    with open(os.path.join(trace_dir, str(os.getpid())), "a") as trace:
        trace.write(f"{time.time()}\n")
    return out


def pipeline(paths: list, trace_dir: str):
    from dataservice import Dataset

    return Dataset.from_tensor_slices(np.array(paths)).map(lambda p: load_image(p, trace_dir)).batch(BATCH)


# --- processes ------------------------------------------------------------------------------------------------

class Cluster:
    """A dispatcher process and ``num_workers`` worker processes; all killed by ``close``."""

    def __init__(self, num_workers: int, log_dir: str):
        self._procs: list = []
        self._log_dir = log_dir
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
                   PYTHONUNBUFFERED="1")
        env.pop("DATASERVICE_SERVICE", None)
        self._env = env
        try:
            port = self._start("dispatcher", ["dispatcher", "--port", "0"])
            self.target = f"grpc://localhost:{port}"
            for i in range(num_workers):
                self._start(f"worker{i}", ["worker", "--dispatcher", f"localhost:{port}", "--port", "0"])
            self.worker_pids = [p.pid for p in self._procs[1:]]
        except BaseException:
            self.close()
            raise

    def _start(self, name: str, args: list) -> Optional[str]:
        kind = "dispatcher" if name == "dispatcher" else "worker"
        stderr = open(os.path.join(self._log_dir, f"{name}.err"), "w")
        proc = subprocess.Popen([sys.executable, "-m", "dataservice", *args], stdout=subprocess.PIPE,
                                stderr=stderr, text=True, env=self._env, cwd=str(REPO))
        stderr.close()
        self._procs.append(proc)
        found: dict = {}

        def watch() -> None:
            for line in proc.stdout:
                match = _LISTENING[kind].match(line.strip())
                if match and "port" not in found:
                    found["port"] = match.group(1) if match.groups() else ""
            found.setdefault("eof", True)

        threading.Thread(target=watch, daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while "port" not in found:
            if "eof" in found or proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start; see {self._log_dir}/{name}.err")
            time.sleep(0.02)  # a poll of the watcher's finding, with a deadline
        return found["port"]

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _cpu_s(pids: list) -> float:
    """User + system CPU seconds of the processes ``pids`` so far (Linux ``/proc``)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def _traced(trace_dir: str, start: float, end: float) -> dict:
    """``{pid: (images made in [start, end], the last one's time)}`` of the workers that made any."""
    made = {}
    for name in os.listdir(trace_dir):
        with open(os.path.join(trace_dir, name)) as trace:
            times = [float(line) for line in trace if line.strip()]
        inside = [t for t in times if start <= t <= end]
        if inside:
            made[int(name)] = (len(inside), max(inside))
    return made


def measure(paths: list, num_workers: int, epochs: int, work_dir: str) -> dict:
    """Median images/s and epoch tail of ``epochs`` epochs (after a warm-up one) on a fresh cluster."""
    from dataservice import distribute

    trace_dir = tempfile.mkdtemp(prefix="trace-", dir=work_dir)
    cluster = Cluster(num_workers, work_dir)
    try:
        ds = pipeline(paths, trace_dir).apply(distribute("distributed_epoch", cluster.target))
        rates, tails, splits, shares, cpu = [], [], [], [], []
        for epoch in range(epochs + 1):
            start = time.time()
            cpu_before = _cpu_s(cluster.worker_pids)
            count = 0
            for batch in ds:
                count += len(batch)
            end = time.time()
            cpu_used = _cpu_s(cluster.worker_pids) - cpu_before
            if count != len(paths):
                raise RuntimeError(f"an epoch delivered {count} images of {len(paths)}")
            if epoch == 0:
                continue  # warm-up: process start, imports, the pipeline's first load
            made = _traced(trace_dir, start, end)
            idle = [made[pid][1] if pid in made else start for pid in cluster.worker_pids]
            rates.append(count / (end - start))
            cpu.append(cpu_used / count * 1000)
            tails.append(max(idle) - min(idle))
            splits.append(sum(1 for pid in cluster.worker_pids if pid in made))
            # The busiest worker's share of the images: 1/share bounds the speed-up, whatever the load.
            shares.append(max(made[pid][0] for pid in made) / count)
        num_splits = pipeline(paths, trace_dir).num_splits()
    finally:
        cluster.close()
        shutil.rmtree(trace_dir, ignore_errors=True)
    return {"images": len(paths), "workers": num_workers, "images_per_s": statistics.median(rates),
            "rates": rates, "tail_s": statistics.median(tails), "tails": tails,
            "workers_with_work": min(splits), "busiest_share": statistics.median(shares), "shares": shares,
            "worker_cpu_ms_per_image": statistics.median(cpu), "cpu": cpu,
            "num_splits": num_splits}


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="200,400,2000", help="comma-separated numbers of images")
    parser.add_argument("--epochs", type=int, default=3, help="measured epochs per configuration")
    parser.add_argument("--json", help="write the results there too")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    try:
        import PIL  # noqa: F401
    except ImportError:
        print("Pillow is not installed in this environment: the benchmark needs it", file=sys.stderr)
        return 2
    work_dir = tempfile.mkdtemp(prefix="split-sizing-")
    results = []
    try:
        image_dir = os.path.join(work_dir, "images")
        os.makedirs(image_dir)
        all_paths = make_images(image_dir, max(sizes))
        print(f"dataservice from {REPO}; load average {os.getloadavg()[0]:.2f}", flush=True)
        print(f"{'images':>7} {'splits':>6} {'1 worker img/s':>15} {'2 workers img/s':>16} {'ratio':>6} "
              f"{'tail 1w s':>10} {'tail 2w s':>10} {'2w busy':>8} {'busiest':>8} {'cpu ms/img 1w':>14} "
              f"{'cpu ms/img 2w':>14}", flush=True)
        for n in sizes:
            one = measure(all_paths[:n], 1, args.epochs, work_dir)
            two = measure(all_paths[:n], 2, args.epochs, work_dir)
            ratio = two["images_per_s"] / one["images_per_s"]
            results.append({"images": n, "one": one, "two": two, "ratio": ratio})
            print(f"{n:>7} {two['num_splits']:>6} {one['images_per_s']:>15.1f} {two['images_per_s']:>16.1f} "
                  f"{ratio:>6.2f} {one['tail_s']:>10.3f} {two['tail_s']:>10.3f} {two['workers_with_work']:>8} "
                  f"{two['busiest_share']:>8.2f} {one['worker_cpu_ms_per_image']:>14.2f} "
                  f"{two['worker_cpu_ms_per_image']:>14.2f}",
                  flush=True)
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
