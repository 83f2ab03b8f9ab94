"""A PyTorch training loop fed by the data service: a small CNN on the catalogue's ``shapes`` dataset.

``shapes`` (28x28 images of circles, squares and triangles, drawn offline; it ships with dataservice)
is prepared in ``--data-dir`` if it is not there yet. The pipeline — decode, normalize, shuffle, batch —
runs on the service's workers in ``distributed_epoch`` mode (every example once per epoch); this process
gets the batches as tensors through ``dataservice.torch.TorchDataset`` (no copy of the received
buffers) and trains a two-layer CNN with SGD. Each epoch prints its throughput and how long the training
loop waited for data (*stall*): the time spent inside ``next()`` on the iterator.

Example::

    $ dataservice local --port 5050 --workers 2 &
    $ python -m client.train_torch --service grpc://localhost:5050 --data-dir /tmp/datasets --epochs 3
    epoch 1/3: 5,400 examples in 8.52 s (634 examples/s, 2.0 MB/s), stall 0.45 s (5%), loss 0.792,
    validation accuracy 0.660
    ...
    test accuracy 0.989 (chance: 0.333)

With DistributedDataParallel: every rank reads a share of one job (the ranks agree on its ``job_name``),
so each example is read once per epoch by one of the ranks::

    $ torchrun --standalone --nproc-per-node 2 -m client.train_torch --service grpc://localhost:5050 \\
          --data-dir /tmp/datasets --epochs 3

From Python::

    >>> from client.train_torch import train
    >>> result = train("grpc://localhost:5050", data_dir="/tmp/datasets", epochs=3)
    >>> result.test_accuracy > 0.9
    True
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
import uuid
from typing import Optional, Sequence, TextIO

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

import dataservice as ds
from dataservice import catalogue, errors
from dataservice.cli import positive_int
from dataservice.torch import TorchDataset

__all__ = ["EpochResult", "TrainResult", "ShapesCNN", "train", "main"]

NUM_CLASSES = 3


def normalize(image: np.ndarray, label: np.int64) -> tuple[np.ndarray, np.int64]:
    """Runs on the workers: uint8 HWC pixels -> float32 CHW in [0, 1] (the layout torch's conv layers take)."""
    return np.ascontiguousarray(image.transpose(2, 0, 1), dtype=np.float32) / np.float32(255.0), label


class ShapesCNN(torch.nn.Module):
    """1x28x28 -> conv 8 -> pool -> conv 16 -> pool -> 3 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.head = torch.nn.Linear(16 * 7 * 7, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.head(x.flatten(1))


@dataclasses.dataclass
class EpochResult:
    examples: int          #: read by this process (all ranks: see TrainResult.examples_all_ranks)
    seconds: float
    stall_s: float         #: time the loop waited inside next() for a batch (the reader's stats())
    loss: float
    validation_accuracy: float
    bytes: int             #: received from the workers by this process
    stall_fraction: float  #: stall_s over the time since the epoch's first next()

    @property
    def examples_per_s(self) -> float:
        return self.examples / self.seconds if self.seconds > 0 else 0.0


@dataclasses.dataclass
class TrainResult:
    epochs: list[EpochResult]
    examples_all_ranks: list[int]   #: per epoch, summed over the DDP ranks (this process's alone without DDP)
    test_accuracy: float


def _accuracy(model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, device: torch.device) -> float:
    model.eval()
    with torch.no_grad():
        x = torch.from_numpy(np.stack([normalize(image, 0)[0] for image in images])).to(device)
        predicted = model(x).argmax(dim=1).cpu().numpy()
    model.train()
    return float(np.mean(predicted == labels))


def _distributed() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def _shared_job_name(job_name: Optional[str]) -> str:
    """One job name for all ranks: rank 0's choice, broadcast (a fresh one per run, so a second run
    does not join the first run's finished job)."""
    names = [job_name or f"train-torch-{uuid.uuid4().hex[:12]}"]
    dist.broadcast_object_list(names, src=0)
    return names[0]


def train(service: str, data_dir: Optional[str] = None, epochs: int = 3, batch_size: int = 64,
          learning_rate: float = 0.05, device: str = "cpu", pin_memory: bool = False, job_name: Optional[str] = None,
          out: TextIO = sys.stdout) -> TrainResult:
    """Trains ``ShapesCNN`` on ``shapes`` read through ``service``; see the module docstring.

    Under ``torchrun`` (``WORLD_SIZE`` > 1) it joins the process group (gloo on CPU, nccl on CUDA),
    wraps the model in DistributedDataParallel and reads one job shared by all ranks.
    """
    rank = 0
    if _distributed():
        dist.init_process_group("nccl" if torch.device(device).type == "cuda" else "gloo")
        rank = dist.get_rank()
        job_name = _shared_job_name(job_name)
    say = (lambda text: print(text, file=out, flush=True)) if rank == 0 else (lambda text: None)

    builder = catalogue.builder("shapes", data_dir=data_dir)
    if rank == 0 and not builder.is_prepared:
        say(f"preparing shapes in {builder.data_dir} ...")
        # Several shards: a file is the unit a worker reads in distributed_epoch.
        builder.download_and_prepare(download_config=catalogue.DownloadConfig(num_shards=8))
    if _distributed():
        dist.barrier()  # the other ranks wait until rank 0 has prepared the data
    pipeline = (catalogue.load("shapes", split="train[:90%]", data_dir=data_dir, as_supervised=True,
                               shuffle_files=True)
                .map(normalize).shuffle(2048).batch(batch_size))
    val_images, val_labels = catalogue.load("shapes", split="train[90%:]", data_dir=data_dir, as_supervised=True,
                                            batch_size=-1)
    test_images, test_labels = catalogue.load("shapes", split="test", data_dir=data_dir, as_supervised=True,
                                              batch_size=-1)

    torch.manual_seed(0)
    target = torch.device(device)
    model: torch.nn.Module = ShapesCNN().to(target)
    if _distributed():
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate, momentum=0.9)
    # One distributed dataset for the whole run: each iteration of it is the job's next iteration, which
    # all ranks (the same job_name) read together.
    distributed = pipeline.apply(ds.distribute("distributed_epoch", service, job_name=job_name))
    batches = TorchDataset(distributed, device=device, pin_memory=pin_memory)

    result = TrainResult([], [], 0.0)
    for epoch in range(1, epochs + 1):
        examples, loss_sum, steps = 0, 0.0, 0
        iterator = iter(batches)  # a TensorIterator: the service's iterator, with stats(), yielding tensors
        # DDP's join(): ranks may get a few batches more or fewer than each other (first come, first
        # served); join lets the ranks that ran out shadow the others' all-reduces instead of hanging.
        joined = model.join() if _distributed() else contextlib.nullcontext()
        start = time.perf_counter()
        with joined:
            for images, labels in iterator:
                optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(images), labels)
                loss.backward()
                optimizer.step()
                loss_sum += loss.item()
                steps += 1
                examples += len(labels)
        seconds = time.perf_counter() - start
        stats = iterator.stats()  # stall_s: the time this loop waited inside next() for a batch
        iterator.close()
        total = examples
        if _distributed():
            counted = torch.tensor([examples])
            dist.all_reduce(counted)
            total = int(counted.item())
        accuracy = _accuracy(model, val_images, val_labels, target)
        epoch_result = EpochResult(examples, seconds, stats.stall_s, loss_sum / max(steps, 1), accuracy,
                                   stats.bytes, stats.stall_fraction)
        result.epochs.append(epoch_result)
        result.examples_all_ranks.append(total)
        # Under DDP: the examples and rate of all ranks; the MB/s and stall are rank 0's own.
        ranks = f" ({dist.get_world_size()} ranks, {examples:,} on rank 0)" if _distributed() else ""
        say(f"epoch {epoch}/{epochs}: {total:,} examples{ranks} in {seconds:.2f} s "
            f"({total / seconds:,.0f} examples/s, {stats.bytes / 1e6 / seconds:,.1f} MB/s), stall "
            f"{stats.stall_s:.2f} s ({stats.stall_fraction:.0%}), loss {epoch_result.loss:.3f}, "
            f"validation accuracy {accuracy:.3f}")
    result.test_accuracy = _accuracy(model, test_images, test_labels, target)
    say(f"test accuracy {result.test_accuracy:.3f} (chance: {1 / NUM_CLASSES:.3f})")
    if _distributed():
        dist.destroy_process_group()
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the example; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m client.train_torch",
                                     description="Train a small CNN on the catalogue's shapes dataset with PyTorch, "
                                                 "reading through the data service.")
    parser.add_argument("--service", default=os.environ.get("DATASERVICE_SERVICE", "grpc://localhost:5050"),
                        help="the dispatcher, grpc://host:port (default: $DATASERVICE_SERVICE or "
                             "grpc://localhost:5050)")
    parser.add_argument("--data-dir", help="where datasets are prepared (default: $DATASERVICE_DATA_DIR, "
                                           "$TFDS_DATA_DIR or ~/tensorflow_datasets); workers must see it too")
    parser.add_argument("--epochs", type=positive_int, default=3)
    parser.add_argument("--batch-size", type=positive_int, default=64)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--device", default="cpu", help="torch device for the model and batches (default: cpu)")
    parser.add_argument("--pin-memory", action="store_true", help="pin batches (needs an accelerator)")
    parser.add_argument("--job-name", help="the shared job's name (default: none alone; under torchrun, a fresh "
                                           "name rank 0 picks and broadcasts)")
    args = parser.parse_args(argv)
    try:
        ds.distribute("distributed_epoch", args.service)  # validates the address before any work
        torch.device(args.device)
    except (ValueError, RuntimeError) as exc:
        parser.error(str(exc))
    try:
        train(args.service, data_dir=args.data_dir, epochs=args.epochs, batch_size=args.batch_size,
              learning_rate=args.learning_rate, device=args.device, pin_memory=args.pin_memory,
              job_name=args.job_name)
    except errors.DataServiceError as exc:
        print(f"train_torch: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
