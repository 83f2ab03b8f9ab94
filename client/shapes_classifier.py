"""An example training loop on a named catalogue dataset, fed through the data service.

It prepares ``shapes`` (the offline builder that ships with dataservice: 28x28 images of circles,
squares and triangles) if the data directory does not have it yet, then:

- trains a small numpy MLP (784 -> 64 ReLU -> 3, softmax cross-entropy) on ``train[:90%]``, read through the service in
  ``distributed_epoch`` mode (every example once per epoch, whichever worker reads it), with the
  decoding and normalization running on the workers;
- validates on ``train[90%:]`` and tests on ``test``, read locally (``batch_size=-1``: one array).

Example::

    $ python -m client.shapes_classifier --service grpc://localhost:5050 --epochs 3
    epoch 1/3: 5,400 examples from the service in 0.82 s, validation accuracy 0.712
    ...
    test accuracy 0.745 (chance: 0.333)

From Python::

    >>> from client.shapes_classifier import train_shapes
    >>> result = train_shapes("grpc://localhost:5050", data_dir="/tmp/datasets", epochs=3)
    >>> result.test_accuracy > 0.6
    True
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Optional, Sequence

import numpy as np

import dataservice as ds
from dataservice import catalogue
from dataservice.cli import positive_int

__all__ = ["ShapesResult", "train_shapes", "main"]

NUM_CLASSES = 3
PIXELS = 28 * 28


def normalize(image: np.ndarray, label: np.int64) -> tuple[np.ndarray, np.int64]:
    """Runs on the workers: uint8 pixels -> float32 in [0, 1], flattened."""
    return image.reshape(-1).astype(np.float32) / 255.0, label


@dataclasses.dataclass
class ShapesResult:
    examples_per_epoch: list[int]
    validation_accuracy: list[float]
    test_accuracy: float


class _MLP:
    """784 -> HIDDEN (ReLU) -> 3, trained by plain SGD on the softmax cross-entropy."""

    HIDDEN = 64

    def __init__(self, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.w1 = (rng.standard_normal((PIXELS, self.HIDDEN)) * np.sqrt(2 / PIXELS)).astype(np.float32)
        self.b1 = np.zeros(self.HIDDEN, np.float32)
        self.w2 = (rng.standard_normal((self.HIDDEN, NUM_CLASSES)) * np.sqrt(1 / self.HIDDEN)).astype(np.float32)
        self.b2 = np.zeros(NUM_CLASSES, np.float32)

    def _forward(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        hidden = np.maximum(x @ self.w1 + self.b1, 0.0)
        return hidden, hidden @ self.w2 + self.b2

    def step(self, x: np.ndarray, y: np.ndarray, learning_rate: float) -> None:
        hidden, logits = self._forward(x)
        logits -= logits.max(axis=1, keepdims=True)
        grad = np.exp(logits)
        grad /= grad.sum(axis=1, keepdims=True)
        grad[np.arange(len(y)), y] -= 1.0
        grad /= len(y)
        grad_hidden = grad @ self.w2.T
        grad_hidden[hidden <= 0] = 0.0
        self.w2 -= learning_rate * hidden.T @ grad
        self.b2 -= learning_rate * grad.sum(axis=0)
        self.w1 -= learning_rate * x.T @ grad_hidden
        self.b1 -= learning_rate * grad_hidden.sum(axis=0)

    def accuracy(self, images: np.ndarray, labels: np.ndarray) -> float:
        x = images.reshape(len(images), -1).astype(np.float32) / 255.0
        return float(np.mean(np.argmax(self._forward(x)[1], axis=1) == labels))


def train_shapes(service: str, data_dir: Optional[str] = None, epochs: int = 3, batch_size: int = 64,
                 learning_rate: float = 0.1, out=sys.stdout) -> ShapesResult:
    """Trains on ``shapes`` read through ``service``; returns accuracies per epoch and on ``test``."""
    builder = catalogue.builder("shapes", data_dir=data_dir)
    if not builder.is_prepared:
        print(f"preparing shapes in {builder.data_dir} ...", file=out, flush=True)
        builder.download_and_prepare()
    train = builder.as_dataset(split="train[:90%]", as_supervised=True, shuffle_files=True)
    pipeline = train.map(normalize).shuffle(2048).batch(batch_size)
    val_images, val_labels = builder.as_dataset(split="train[90%:]", as_supervised=True, batch_size=-1)
    test_images, test_labels = builder.as_dataset(split="test", as_supervised=True, batch_size=-1)
    model = _MLP()
    result = ShapesResult([], [], 0.0)
    for epoch in range(1, epochs + 1):
        distributed = pipeline.apply(ds.distribute("distributed_epoch", service, job_name=None))
        seen = 0
        start = time.perf_counter()
        for x, y in distributed:
            model.step(x, y, learning_rate)
            seen += len(y)
        elapsed = time.perf_counter() - start
        accuracy = model.accuracy(val_images, val_labels)
        result.examples_per_epoch.append(seen)
        result.validation_accuracy.append(accuracy)
        print(f"epoch {epoch}/{epochs}: {seen:,} examples from the service in {elapsed:.2f} s, "
              f"validation accuracy {accuracy:.3f}", file=out, flush=True)
    result.test_accuracy = model.accuracy(test_images, test_labels)
    print(f"test accuracy {result.test_accuracy:.3f} (chance: {1 / NUM_CLASSES:.3f})", file=out, flush=True)
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Train a classifier on the catalogue's shapes dataset, "
                                                 "reading through the data service.")
    parser.add_argument("--service", required=True, help="the dispatcher's address, e.g. grpc://localhost:5050")
    parser.add_argument("--data-dir", help="where datasets are prepared (default: $DATASERVICE_DATA_DIR, "
                                           "$TFDS_DATA_DIR or ~/tensorflow_datasets)")
    parser.add_argument("--epochs", type=positive_int, default=3)
    parser.add_argument("--batch-size", type=positive_int, default=64)
    args = parser.parse_args(argv)
    train_shapes(args.service, data_dir=args.data_dir, epochs=args.epochs, batch_size=args.batch_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
