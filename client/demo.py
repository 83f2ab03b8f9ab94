"""The demo behind ``make demo``: a local cluster in a subprocess, and the example
training loop reading from it.

It starts ``python -m dataservice local --workers 2 --port 0`` as a real
process, reads the target from the line it prints, trains in each processing mode
from this process, trains a classifier on the catalogue's ``shapes`` dataset
(``client/shapes_classifier.py``) through the same cluster, then stops the cluster with SIGINT
(as Ctrl-C would) and checks it exits cleanly.

Example::

    $ python -m client.demo
    starting a local cluster: python -m dataservice local --workers 2 --port 0
    local cluster: grpc://localhost:40123 with 2 workers
    ...
    read 25,600 elements (400 batches) in 2.10 s: 12,190 elements/s, 37.6 MB/s
    ...
    test accuracy 0.78 (chance: 0.333)
    cluster stopped (exit code 0)

    Next: run a cluster yourself, in three terminals (from this directory):
    ...
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Optional, Sequence

from client.shapes_classifier import train_shapes
from client.train import train

__all__ = ["start_local_cluster", "stop_process", "main"]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: How long the cluster may take to print its target.
START_TIMEOUT_S = 30.0
#: How long the cluster may take to exit after SIGINT before it is killed.
STOP_TIMEOUT_S = 20.0

_TARGET = re.compile(r"local cluster: (grpc://\S+) with \d+ workers?")

#: What the demo ends with: how to run the same by hand, and where its code is.
NEXT_STEPS = """
Next: run a cluster yourself, in three terminals (from this directory):
  .venv/bin/dataservice dispatcher --port 5050
  .venv/bin/dataservice worker --dispatcher localhost:5050
  .venv/bin/python -m client.train --epochs 2          # reads from localhost:5050
and see it with: .venv/bin/dataservice status
The code: client/train.py (the training loop and its pipeline), client/shapes_classifier.py (a catalogue
dataset), client/demo.py (this demo); the README starts with a distributed read in ten lines."""


def _subprocess_env() -> dict:
    # The cluster must import this checkout's dataservice even when it is not pip-installed.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
    return env


def _pump(stream: IO[str], lines: "queue.Queue[Optional[str]]") -> None:
    """Forwards a child's stdout into ``lines``, and keeps draining it after the target
    is found, so the child never blocks on a full pipe."""
    for line in stream:
        lines.put(line)
    lines.put(None)


def start_local_cluster(workers: int = 2, extra_args: Sequence[str] = (),
                        timeout_s: float = START_TIMEOUT_S) -> tuple[subprocess.Popen, str]:
    """Starts ``dataservice local`` in a subprocess; returns it and its target."""
    cmd = [sys.executable, "-m", "dataservice", "local", "--workers", str(workers), "--port", "0", *extra_args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1, cwd=REPO_ROOT,
                            env=_subprocess_env())
    lines: "queue.Queue[Optional[str]]" = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"the local cluster did not print its target within {timeout_s:.0f} s")
            try:
                line = lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"the local cluster exited with code {proc.wait()} before printing its target")
            match = _TARGET.search(line)
            if match:
                print(line.rstrip(), flush=True)
                return proc, match.group(1)
    except BaseException:
        stop_process(proc, timeout_s=1.0)
        raise


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGINT, timeout_s: float = STOP_TIMEOUT_S) -> int:
    """Sends ``sig`` and waits; kills the process if it has not exited within ``timeout_s``."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def main() -> int:
    """Runs the demo; returns 0 when training finished and the cluster exited cleanly."""
    print("starting a local cluster: python -m dataservice local --workers 2 --port 0", flush=True)
    proc, service = start_local_cluster(workers=2, extra_args=["--log-level", "WARNING"])
    ok = False
    try:
        # parallel_epochs reads the data once per worker: one epoch keeps the demo short.
        for mode, epochs in (("distributed_epoch", 2), ("parallel_epochs", 1)):
            print(f"\ntraining for {epochs} epoch{'s' if epochs > 1 else ''}, {mode}, reading from {service}",
                  flush=True)
            result = train(service, mode, epochs=epochs)
            print(result.summary(), flush=True)
            print(f"final loss {result.final_loss:.4f}", flush=True)
        # A named dataset of the catalogue, prepared offline, sliced, and fed through the same cluster.
        with tempfile.TemporaryDirectory(prefix="dataservice-datasets-") as data_dir:
            print(f"\ntraining a classifier on the catalogue's shapes dataset (prepared in {data_dir}), "
                  f"distributed_epoch, reading from {service}", flush=True)
            train_shapes(service, data_dir=data_dir, epochs=3)
        ok = True
    finally:
        code = stop_process(proc, signal.SIGINT)
        print(f"\ncluster stopped (exit code {code})", flush=True)
    if ok and code == 0:
        print(NEXT_STEPS, flush=True)
    return 0 if ok and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
