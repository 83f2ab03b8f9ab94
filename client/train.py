"""An example training loop that reads its input pipeline from the data service.

The pipeline makes fake 32x32x3 uint8 images with labels and ids and batches them; it
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

Checkpoints (``--checkpoint-dir DIR [--checkpoint-every N]``): every N steps (default 100) and at the end,
the run saves the model's weights and the data iterator's ``state_dict()`` (its position in the
distributed read: plain JSON) together in one atomic checkpoint (``client/checkpoints.py``:
``DIR/step-00000100/`` with ``model.npz`` and ``state.json``; complete or absent, whenever the
process dies). Started again with the same DIR, it resumes from the latest checkpoint: the weights, the
epoch and step, and the read, restored with ``load_state_dict`` so that the service continues where the
checkpoint was taken. Checkpointing reads in the deterministic order by default (``--deterministic``):
the resumed run then reads the very batches an uninterrupted run reads after that step, and ends with the
same weights. ``--no-deterministic`` keeps the dynamic order, where a resumed run reads every element
the checkpoint had not, once. Only ``--mode distributed_epoch`` resumes. ``--record-ids FILE`` appends
each step's example ids to FILE (``read_record`` reads them back: what a killed and resumed run trained on)::

    $ python -m client.train --checkpoint-dir /tmp/run --checkpoint-every 50 --no-progress
    checkpoint saved: /tmp/run/step-00000050 (step 50)
    ^C (or kill -9)
    $ python -m client.train --checkpoint-dir /tmp/run --checkpoint-every 50 --no-progress
    resumed from /tmp/run/step-00000050: step 50 (epoch 1/1, batch 50), 3,200 examples trained on before
    checkpoint saved: /tmp/run/step-00000100 (step 100)
    ...
    read 9,600 elements (150 batches) in 1.10 s: 8,727 elements/s, 26.8 MB/s
    final loss 2.2993
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

from client import checkpoints

__all__ = ["TrainResult", "make_dataset", "train", "build_parser", "main", "ProgressBar", "read_record"]

DEFAULT_SERVICE = "grpc://localhost:5050"
IMAGE_SHAPE = (32, 32, 3)
NUM_CLASSES = 10
DEFAULT_CHECKPOINT_EVERY = 100
#: What a checkpoint must agree on with the run resuming it (more epochs, or other --steps, may differ).
_RESUME_CONFIG = ("mode", "deterministic", "num_examples", "batch_size", "learning_rate")

# Workers deserialize the pipeline, including make_example below. They need not
# have this module installed (the Docker image's workers only install the
# dataservice package), so its functions travel by value rather than by name.
if __name__ != "__main__":  # __main__ is pickled by value already
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def make_example(index: np.int64) -> tuple[np.ndarray, np.int64, np.int64]:
    """A deterministic fake image, its label and its id ``index`` (runs on the workers)."""
    rng = np.random.default_rng(int(index))
    image = rng.integers(0, 256, size=IMAGE_SHAPE, dtype=np.uint8)
    return image, np.int64(int(index) % NUM_CLASSES), np.int64(index)


def make_dataset(num_examples: int, batch_size: int) -> ds.Dataset:
    """The input pipeline before ``distribute``: ``range -> map(make_example) -> batch``; each batch is
    ``(images, labels, ids)``."""
    return ds.Dataset.range(num_examples).map(make_example).batch(batch_size)


@dataclasses.dataclass
class TrainResult:
    """What a training run read, and how fast."""

    elements: int
    batches: int
    bytes: int
    seconds: float
    final_loss: float
    #: The checkpoint this run resumed from: its step (None: started from scratch), and the examples
    #: trained on before it.
    resumed_from_step: Optional[int] = None
    elements_before: int = 0
    #: The last step (batches trained on, counted from the first run's start).
    step: int = 0

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


class _Recorder:
    """Appends each step's example ids to a file, one line a step ("step epoch: id id ..."), each line in
    one write to a file opened for appending: a killed process leaves whole lines (and perhaps a cut last
    one, which ``read_record`` ignores)."""

    def __init__(self, path: Optional[str]):
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if path else None

    def record(self, step: int, epoch: int, ids: np.ndarray) -> None:
        if self._fd is not None:
            os.write(self._fd, f"{step} {epoch}: {' '.join(map(str, ids.tolist()))}\n".encode())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_record(path: str) -> dict[int, tuple[int, list[int]]]:
    """What ``--record-ids`` wrote: for each step, its epoch and example ids. A step recorded twice (by a run
    killed after its last checkpoint, then by the run that resumed from it) is the later record's.

    Example::

        >>> steps = read_record("ids.txt")
        >>> sorted(i for _, ids in steps.values() for i in ids) == list(range(12_800))  # one epoch, once
        True
    """
    steps: dict[int, tuple[int, list[int]]] = {}
    with open(path) as f:
        for line in f:
            if not line.endswith("\n"):
                break  # the cut last line of a killed run
            head, _, ids = line.partition(":")
            step, epoch = (int(x) for x in head.split())
            steps[step] = (epoch, [int(x) for x in ids.split()])
    return steps


def _resume(checkpoint_dir: str, config: dict, out: TextIO) -> Optional[checkpoints.Checkpoint]:
    """The latest checkpoint in ``checkpoint_dir`` (None if none), checked against this run's ``config``."""
    checkpoint = checkpoints.latest(checkpoint_dir)
    if checkpoint is None:
        return None
    saved = checkpoint.state.get("config", {})
    differ = [f"{key} {saved.get(key)!r} (this run: {config[key]!r})" for key in _RESUME_CONFIG
              if saved.get(key) != config[key]]
    if differ:
        raise ValueError(f"checkpoint {checkpoint.path} was written by another training: {', '.join(differ)}; "
                         f"resume it with the same arguments, or give another --checkpoint-dir")
    state, epochs = checkpoint.state, config["epochs"]
    where = (f"epoch {state['epoch'] + 1}/{epochs}, batch {state['epoch_step']}" if state["epoch"] < epochs
             else f"the end of epoch {state['epoch']}/{epochs}")
    print(f"resumed from {checkpoint.path}: step {checkpoint.step} ({where}), {state['elements']:,} examples trained "
          f"on before", file=out, flush=True)
    return checkpoint


def train(service: str, mode: str = "distributed_epoch", epochs: int = 1, steps: Optional[int] = None,
          num_examples: int = 12_800, batch_size: int = 64, learning_rate: float = 0.01,
          progress: bool = True, progress_out: TextIO = sys.stderr, timeout_ms: int = 60_000,
          checkpoint_dir: Optional[str] = None, checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
          deterministic: Optional[bool] = None, record_ids: Optional[str] = None,
          out: Optional[TextIO] = None) -> TrainResult:
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
      checkpoint_dir: save a checkpoint (weights and the read's position) there every
        ``checkpoint_every`` steps and at the end, and resume from the latest one there (a line on ``out``
        says which); distributed_epoch only. See the module docstring.
      deterministic: read in the deterministic order; default: True with ``checkpoint_dir``, else False.
      record_ids: append each step's example ids to this file (``read_record`` reads it).
      out: where the checkpoint lines go (default: stdout).

    Example::

        >>> train(service, checkpoint_dir="/tmp/run", checkpoint_every=50)  # killed, then run again:
        >>> train(service, checkpoint_dir="/tmp/run", checkpoint_every=50).resumed_from_step
        50
    """
    out = sys.stdout if out is None else out
    if deterministic is None:
        deterministic = checkpoint_dir is not None
    if checkpoint_dir is not None and mode != "distributed_epoch":
        raise ValueError(f"checkpoint_dir needs mode='distributed_epoch': a {mode} read cannot save its position")
    if checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
    read = ds.distribute(mode, service, timeout_ms=timeout_ms, deterministic=deterministic)
    dataset = make_dataset(num_examples, batch_size).apply(read)
    batches_per_pass = math.ceil(num_examples / batch_size)
    if steps is not None:
        total: Optional[int] = steps
    elif mode == "distributed_epoch":
        total = batches_per_pass
    else:
        workers = _num_workers(service) if progress else None
        total = batches_per_pass * workers if workers else None

    config = {"mode": mode, "deterministic": deterministic, "num_examples": num_examples, "batch_size": batch_size,
              "learning_rate": learning_rate, "epochs": epochs, "steps": steps}
    checkpoint = _resume(checkpoint_dir, config, out) if checkpoint_dir is not None else None
    if checkpoint is not None:
        weights = checkpoint.arrays["weights"]
        step, first_epoch = checkpoint.step, checkpoint.state["epoch"]
        elements_before = checkpoint.state["elements"]
        loss = float("nan") if checkpoint.state["loss"] is None else checkpoint.state["loss"]
    else:
        rng = np.random.default_rng(0)
        weights = rng.normal(0, 0.01, size=(int(np.prod(IMAGE_SHAPE)), NUM_CLASSES)).astype(np.float32)
        step, first_epoch, elements_before, loss = 0, 0, 0, float("nan")

    def save(epoch: int, epoch_step: int, data: Optional[dict]) -> None:
        path = checkpoints.save(checkpoint_dir, step, {"weights": weights},
                                {"config": config, "epoch": epoch, "epoch_step": epoch_step, "data": data,
                                 "elements": elements_before + elements,
                                 "loss": loss if math.isfinite(loss) else None})
        end = ", the end: nothing left to read" if data is None else ""
        print(f"checkpoint saved: {path} (step {step}{end})", file=out, flush=True)

    elements = batches = nbytes = 0
    recorder = _Recorder(record_ids)
    start = time.perf_counter()
    try:
        for epoch in range(first_epoch, epochs):
            it = iter(dataset)  # each epoch a new iteration of the job
            epoch_step = 0
            if checkpoint is not None and epoch == checkpoint.state["epoch"] and checkpoint.state["data"] is not None:
                epoch_step = checkpoint.state["epoch_step"]
                it.load_state_dict(checkpoint.state["data"])  # the read continues at the checkpoint
            bar = ProgressBar(f"epoch {epoch + 1}/{epochs}", total, out=progress_out, enabled=progress)
            bar.count = epoch_step
            try:
                while steps is None or epoch_step < steps:
                    try:
                        images, labels, ids = next(it)
                    except StopIteration:
                        break
                    loss, weights = _train_step(weights, images, labels, learning_rate)
                    n = len(labels)
                    step += 1
                    epoch_step += 1
                    elements += n
                    batches += 1
                    nbytes += _batch_nbytes((images, labels, ids))
                    recorder.record(step, epoch, ids)
                    bar.update(1, n)
                    if checkpoint_dir is not None and step % checkpoint_every == 0:
                        save(epoch, epoch_step, it.state_dict())
            finally:
                it.close()  # releases the job on the service
            bar.close()
        if checkpoint_dir is not None:
            save(epochs, 0, None)  # the end: a run started again with this directory has nothing left to do
    finally:
        recorder.close()
    seconds = time.perf_counter() - start
    return TrainResult(elements=elements, batches=batches, bytes=nbytes, seconds=seconds, final_loss=loss,
                       resumed_from_step=checkpoint.step if checkpoint is not None else None,
                       elements_before=elements_before, step=step)


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
    parser.add_argument("--checkpoint-dir", default=None,
                        help="save a checkpoint (the weights and the data read's position, together, atomically) "
                             "in this directory every --checkpoint-every steps and at the end, and resume from "
                             "the latest one there when started again (distributed_epoch only)")
    parser.add_argument("--checkpoint-every", type=positive_int, default=DEFAULT_CHECKPOINT_EVERY,
                        help=f"steps between checkpoints (default: {DEFAULT_CHECKPOINT_EVERY})")
    parser.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=None,
                        help="read the batches in the deterministic order, the same every run, so that a resumed "
                             "run trains exactly as an uninterrupted one (default: on with --checkpoint-dir; "
                             "distributed_epoch only). --no-deterministic: the dynamic order, fastest; a resumed "
                             "run reads every example it had not, once")
    parser.add_argument("--record-ids", metavar="FILE", default=None,
                        help="append each step's example ids to FILE, a line a step (to check what a killed and "
                             "resumed run trained on)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the example; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        ds.distribute(args.mode, args.service)  # validates the address before any work
    except ValueError as exc:
        parser.error(f"argument --service: {exc}")
    if args.mode != "distributed_epoch" and args.checkpoint_dir is not None:
        parser.error(f"argument --checkpoint-dir: needs --mode distributed_epoch (a {args.mode} read cannot save "
                     f"its position)")
    if args.mode != "distributed_epoch" and args.deterministic:
        parser.error("argument --deterministic: needs --mode distributed_epoch")
    try:
        result = train(args.service, args.mode, epochs=args.epochs, steps=args.steps,
                       num_examples=args.num_examples, batch_size=args.batch_size,
                       progress=not args.no_progress, timeout_ms=args.timeout_ms,
                       checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                       deterministic=args.deterministic, record_ids=args.record_ids)
    except (errors.DataServiceError, ValueError) as exc:
        print(f"train: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    print(result.summary(), flush=True)
    print(f"final loss {result.final_loss:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
