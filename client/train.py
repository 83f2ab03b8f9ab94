"""An example training loop that reads its input pipeline from the data service.

The pipeline makes fake 32x32x3 uint8 images with labels and batches them; it
runs on the service's workers (``distribute``), and this process only runs a
fake numpy "training step" (a softmax regression) on each batch. At the end it
prints the read throughput.

Example::

    $ python -m client.train --service grpc://localhost:5050 --mode distributed_epoch --epochs 2
    epoch 1/2 [##############################] 200/200 batches  10,400 el/s
    ...
    read 25,600 elements (400 batches) in 2.46 s: 10,400 elements/s, 31.9 MB/s

The same from Python::

    >>> from client.train import train
    >>> result = train("grpc://localhost:5050", "distributed_epoch", epochs=1)
    >>> result.elements
    12800
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from typing import Optional, Sequence, TextIO

import cloudpickle
import numpy as np

import dataservice as ds
from dataservice import errors
from dataservice.cli import positive_int

__all__ = ["TrainResult", "make_dataset", "train", "build_parser", "main", "ProgressBar"]

DEFAULT_SERVICE = "grpc://localhost:5050"
IMAGE_SHAPE = (32, 32, 3)
NUM_CLASSES = 10

# Workers deserialize the pipeline, including make_example below. They need not
# have this module installed (the Docker image's workers only install the
# dataservice package), so its functions travel by value rather than by name.
if __name__ != "__main__":  # __main__ is pickled by value already
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def make_example(index: np.int64) -> tuple[np.ndarray, np.int64]:
    """A deterministic fake image and its label for element ``index`` (runs on the workers)."""
    rng = np.random.default_rng(int(index))
    image = rng.integers(0, 256, size=IMAGE_SHAPE, dtype=np.uint8)
    return image, np.int64(int(index) % NUM_CLASSES)


def make_dataset(num_examples: int, batch_size: int) -> ds.Dataset:
    """The input pipeline before ``distribute``: ``range -> map(make_example) -> batch``."""
    return ds.Dataset.range(num_examples).map(make_example).batch(batch_size)


@dataclasses.dataclass
class TrainResult:
    """What a training run read, and how fast."""

    elements: int
    batches: int
    bytes: int
    seconds: float
    final_loss: float

    @property
    def elements_per_s(self) -> float:
        return self.elements / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        return (f"read {self.elements:,} elements ({self.batches:,} batches) in {self.seconds:.2f} s: "
                f"{self.elements_per_s:,.0f} elements/s, {self.mb_per_s:,.1f} MB/s")


class ProgressBar:
    """A one-line text progress bar.

    On a terminal it redraws in place; elsewhere (a log file, ``docker logs``) it
    prints a line at most every ``log_interval_s`` so logs stay readable.
    """

    def __init__(self, label: str, total: Optional[int], out: TextIO = sys.stderr, width: int = 30,
                 log_interval_s: float = 2.0, enabled: bool = True):
        self._label = label
        self._total = total
        self._out = out
        self._width = width
        self._enabled = enabled
        self._tty = hasattr(out, "isatty") and out.isatty()
        self._interval = 0.1 if self._tty else log_interval_s
        self._start = time.perf_counter()
        self._last_draw = float("-inf")
        self.count = 0
        self.elements = 0

    def update(self, batches: int = 1, elements: int = 0) -> None:
        self.count += batches
        self.elements += elements
        now = time.perf_counter()
        if now - self._last_draw >= self._interval:
            self._draw(now)

    def close(self) -> None:
        self._draw(time.perf_counter(), final=True)

    def _line(self, now: float) -> str:
        rate = self.elements / (now - self._start) if now > self._start else 0.0
        if self._total:
            done = min(self.count, self._total)
            filled = int(self._width * done / self._total)
            bar = f"[{'#' * filled}{'-' * (self._width - filled)}] {self.count}/{self._total}"
        else:
            bar = f"{self.count}"
        return f"{self._label} {bar} batches  {rate:,.0f} el/s"

    def _draw(self, now: float, final: bool = False) -> None:
        if not self._enabled:
            return
        self._last_draw = now
        if self._tty:
            self._out.write("\r" + self._line(now) + ("\n" if final else "\x1b[K"))
        else:
            self._out.write(self._line(now) + "\n")
        self._out.flush()


def _num_workers(service: str) -> Optional[int]:
    """How many workers the dispatcher knows (for the progress bar's total); None if it cannot tell."""
    from dataservice.service.dispatcher_client import DispatcherClient

    client = DispatcherClient.from_environment(service, timeout_ms=2000)
    try:
        return len(client.get_status().workers) or None
    except errors.DataServiceError:
        return None
    finally:
        client.close()


def _batch_nbytes(batch) -> int:
    return sum(np.asarray(part).nbytes for part in batch)


def train(service: str, mode: str = "distributed_epoch", epochs: int = 1, steps: Optional[int] = None,
          num_examples: int = 12_800, batch_size: int = 64, learning_rate: float = 0.01,
          progress: bool = True, progress_out: TextIO = sys.stderr, timeout_ms: int = 60_000) -> TrainResult:
    """Trains a fake model for ``epochs`` epochs on batches read from the service.

    Args:
      service: the dispatcher, "grpc://host:port".
      mode: "parallel_epochs" (every worker produces the whole dataset, so an epoch
        reads it once per worker) or "distributed_epoch" (every element once).
      epochs: passes over the data; each is a new job on the service.
      steps: stop each epoch after this many batches (default: the whole epoch).
      num_examples, batch_size: size of the fake dataset and of its batches.
      progress: draw a progress bar on ``progress_out``.
      timeout_ms: how long to wait for an unreachable dispatcher.
    """
    dataset = make_dataset(num_examples, batch_size).apply(ds.distribute(mode, service, timeout_ms=timeout_ms))
    batches_per_pass = math.ceil(num_examples / batch_size)
    if steps is not None:
        total: Optional[int] = steps
    elif mode == "distributed_epoch":
        total = batches_per_pass
    else:
        workers = _num_workers(service) if progress else None
        total = batches_per_pass * workers if workers else None

    rng = np.random.default_rng(0)
    weights = rng.normal(0, 0.01, size=(int(np.prod(IMAGE_SHAPE)), NUM_CLASSES)).astype(np.float32)
    elements = batches = nbytes = 0
    loss = float("nan")
    start = time.perf_counter()
    for epoch in range(epochs):
        bar = ProgressBar(f"epoch {epoch + 1}/{epochs}", total, out=progress_out, enabled=progress)
        for images, labels in dataset:
            loss, weights = _train_step(weights, images, labels, learning_rate)
            n = len(labels)
            elements += n
            batches += 1
            nbytes += _batch_nbytes((images, labels))
            bar.update(1, n)
            if steps is not None and bar.count >= steps:
                break  # closing the iterator releases the job on the service
        bar.close()
    seconds = time.perf_counter() - start
    return TrainResult(elements=elements, batches=batches, bytes=nbytes, seconds=seconds, final_loss=loss)


def _train_step(weights: np.ndarray, images: np.ndarray, labels: np.ndarray,
                learning_rate: float) -> tuple[float, np.ndarray]:
    """One SGD step of softmax regression: enough arithmetic to look like training."""
    x = images.reshape(len(images), -1).astype(np.float32) / 255.0
    logits = x @ weights
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    labels = labels.astype(np.int64)
    loss = float(-np.log(probs[np.arange(len(labels)), labels] + 1e-9).mean())
    probs[np.arange(len(labels)), labels] -= 1.0
    grad = x.T @ probs / len(labels)
    return loss, weights - learning_rate * grad


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m client.train`` (also used to check deploy files)."""
    parser = argparse.ArgumentParser(prog="python -m client.train",
                                     description="Example training loop reading its input from the data service.")
    parser.add_argument("--service", default=os.environ.get("DATASERVICE_SERVICE", DEFAULT_SERVICE),
                        help=f"the dispatcher, grpc://host:port (default: $DATASERVICE_SERVICE or {DEFAULT_SERVICE})")
    parser.add_argument("--mode", choices=("parallel_epochs", "distributed_epoch"), default="distributed_epoch",
                        help="processing mode: parallel_epochs (each worker produces all the data) or "
                             "distributed_epoch (every element once; default)")
    parser.add_argument("--epochs", type=positive_int, default=1, help="number of epochs (default: 1)")
    parser.add_argument("--steps", type=positive_int, default=None,
                        help="stop each epoch after this many batches (default: the whole epoch)")
    parser.add_argument("--num-examples", type=positive_int, default=12_800,
                        help="examples in the fake dataset (default: 12800)")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="batch size (default: 64)")
    parser.add_argument("--timeout-ms", type=positive_int, default=60_000,
                        help="how long to wait for an unreachable dispatcher (default: 60000)")
    parser.add_argument("--no-progress", action="store_true", help="do not draw the progress bar")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the example; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        ds.distribute(args.mode, args.service)  # validates the address before any work
    except ValueError as exc:
        parser.error(f"argument --service: {exc}")
    try:
        result = train(args.service, args.mode, epochs=args.epochs, steps=args.steps,
                       num_examples=args.num_examples, batch_size=args.batch_size,
                       progress=not args.no_progress, timeout_ms=args.timeout_ms)
    except errors.DataServiceError as exc:
        print(f"train: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    print(result.summary(), flush=True)
    print(f"final loss {result.final_loss:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
