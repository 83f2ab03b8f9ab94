"""The demo behind ``make demo``: a local cluster in a subprocess, and the example
training loop reading from it.

It starts ``python -m dataservice local --workers 2 --port 0`` as a real
process, reads the target from the line it prints, trains in each processing mode
from this process, then shows a training killed and resumed: ``python -m client.train
--checkpoint-dir DIR`` in a subprocess, killed with SIGKILL right after its first checkpoint, then run
again, resumes from that checkpoint, and the example ids its steps trained on (``--record-ids``) are
every example of the epoch exactly once. Then it trains a classifier on the catalogue's ``shapes``
dataset (``client/shapes_classifier.py``) through the same cluster, stops the cluster with SIGINT
(as Ctrl-C would) and checks it exits cleanly.

Example::

    $ python -m client.demo
    starting a local cluster: python -m dataservice local --workers 2 --port 0
    local cluster: grpc://localhost:40123 with 2 workers
    ...
    read 25,600 elements (400 batches) in 2.10 s: 12,190 elements/s, 37.6 MB/s
    ...
    killed the trainer (SIGKILL) at step 61, after its checkpoint at step 50
    ...
    resumed from /tmp/dataservice-checkpoints-x1/run/step-00000050: step 50 (epoch 1/1, batch 50), 3,200 examples ...
    resumed from step 50: 3,200 examples trained on before the checkpoint + 22,400 after it = 25,600: every
    example of the epoch exactly once
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
from client.train import read_record, train

__all__ = ["start_local_cluster", "stop_process", "main"]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: How long the cluster may take to print its target.
START_TIMEOUT_S = 30.0
#: How long the cluster may take to exit after SIGINT before it is killed.
STOP_TIMEOUT_S = 20.0

_TARGET = re.compile(r"local cluster: (grpc://\S+) with \d+ workers?")
#: The killed and resumed training: an epoch of 400 steps, a checkpoint every 50.
CHECKPOINT_EXAMPLES = 25_600
CHECKPOINT_EVERY = 50
#: How long one run of that training may take.
TRAIN_TIMEOUT_S = 120.0
_SAVED = re.compile(r"^checkpoint saved: \S+ \(step (\d+)\)$")
_RESUMED = re.compile(r"^resumed from \S+: step (\d+) ")

#: What the demo ends with: how to run the same by hand, and where its code is.
NEXT_STEPS = """
Next: run a cluster yourself, in three terminals (from this directory):
  .venv/bin/dataservice dispatcher --port 5050
  .venv/bin/dataservice worker --dispatcher localhost:5050
  .venv/bin/python -m client.train --epochs 2          # reads from localhost:5050
  .venv/bin/python -m client.train --checkpoint-dir /tmp/run   # kill it, start it again: it resumes
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


def _next_line(lines: "queue.Queue[Optional[str]]", deadline: float) -> Optional[str]:
    """The next line from ``_pump`` (None at the end); RuntimeError at ``deadline``."""
    remaining = deadline - time.monotonic()
    try:
        return lines.get(timeout=max(remaining, 0.0))
    except queue.Empty:
        raise RuntimeError(f"the training printed nothing for {TRAIN_TIMEOUT_S:.0f} s") from None


def kill_and_resume(service: str) -> bool:
    """Runs ``python -m client.train --checkpoint-dir`` in a subprocess, kills it (SIGKILL) after its first
    checkpoint, runs it again to the end, and checks that its steps trained on every example of the epoch
    exactly once; returns whether they did.

    Example::

        >>> kill_and_resume("grpc://localhost:5050")
        True
    """
    with tempfile.TemporaryDirectory(prefix="dataservice-checkpoints-") as tmp:
        directory, record = os.path.join(tmp, "run"), os.path.join(tmp, "ids.txt")
        args = ["-m", "client.train", "--service", service, "--checkpoint-dir", directory, "--checkpoint-every",
                str(CHECKPOINT_EVERY), "--num-examples", str(CHECKPOINT_EXAMPLES), "--record-ids", record,
                "--no-progress"]
        print(f"\ntraining with a checkpoint every {CHECKPOINT_EVERY} steps (the weights and the read's position; "
              f"deterministic order), killed and resumed, reading from {service}:\n"
              f"  python {' '.join(args)}", flush=True)
        proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, text=True, bufsize=1,
                                cwd=REPO_ROOT, env=_subprocess_env())
        try:
            lines: "queue.Queue[Optional[str]]" = queue.Queue()
            threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
            deadline = time.monotonic() + TRAIN_TIMEOUT_S
            while True:
                line = _next_line(lines, deadline)
                if line is None:
                    raise RuntimeError(f"the training exited with code {proc.wait()} before its first checkpoint")
                if _SAVED.match(line.strip()):
                    break
            proc.kill()  # SIGKILL: no handler, no cleanup, as a preempted machine
            proc.wait()
        finally:
            stop_process(proc, signal.SIGKILL, timeout_s=1.0)
        saved = int(_SAVED.match(line.strip()).group(1))
        print(f"  {line.strip()}", flush=True)
        reached = max(read_record(record), default=0)
        lost = (f"at step {reached}, {reached - saved} steps after its checkpoint at step {saved} (they are trained "
                f"again)" if reached > saved else f"right after its checkpoint at step {saved}")
        print(f"killed the trainer (SIGKILL) {lost}", flush=True)

        print(f"\nrunning it again:\n  python {' '.join(args)}", flush=True)
        again = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO_ROOT,
                               env=_subprocess_env(), timeout=TRAIN_TIMEOUT_S)
        if again.returncode != 0:
            raise RuntimeError(f"the resumed training exited with code {again.returncode}: {again.stderr.strip()}")
        out_lines = again.stdout.splitlines()
        saved_lines = [i for i, out_line in enumerate(out_lines) if _SAVED.match(out_line)]
        for i, out_line in enumerate(out_lines):
            if i not in saved_lines[1:-1]:  # of the checkpoint lines, the first and the last
                print(f"  {out_line}", flush=True)
            elif i == saved_lines[1]:
                print(f"  ... ({len(saved_lines) - 2} more checkpoints)", flush=True)
        resumed = _RESUMED.search(again.stdout)
        if resumed is None:
            print("the second run did not resume from a checkpoint", flush=True)
            return False
        step = int(resumed.group(1))
        steps = read_record(record)  # a step trained twice counts as the resumed run trained it
        before = sum(len(ids) for s, (_, ids) in steps.items() if s <= step)
        after = sum(len(ids) for s, (_, ids) in steps.items() if s > step)
        every_once = sorted(i for _, ids in steps.values() for i in ids) == list(range(CHECKPOINT_EXAMPLES))
        print(f"resumed from step {step}: {before:,} examples trained on before the checkpoint + {after:,} after it = "
              f"{before + after:,}: " + ("every example of the epoch exactly once" if every_once else
                                          f"NOT every one of the {CHECKPOINT_EXAMPLES:,} examples once"), flush=True)
        return every_once


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
        resumed_exactly = kill_and_resume(service)
        # A named dataset of the catalogue, prepared offline, sliced, and fed through the same cluster.
        with tempfile.TemporaryDirectory(prefix="dataservice-datasets-") as data_dir:
            print(f"\ntraining a classifier on the catalogue's shapes dataset (prepared in {data_dir}), "
                  f"distributed_epoch, reading from {service}", flush=True)
            train_shapes(service, data_dir=data_dir, epochs=3)
        ok = resumed_exactly
    finally:
        code = stop_process(proc, signal.SIGINT)
        print(f"\ncluster stopped (exit code {code})", flush=True)
    if ok and code == 0:
        print(NEXT_STEPS, flush=True)
    return 0 if ok and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
