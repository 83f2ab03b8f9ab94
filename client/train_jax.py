"""A JAX training loop fed by the data service: an MLP on the catalogue's ``shapes`` dataset.

``shapes`` (28x28 images of circles, squares and triangles, drawn offline; it ships with dataservice)
is prepared in ``--data-dir`` if it is not there yet. The pipeline — decode, normalize, shuffle, batch —
runs on the service's workers in ``distributed_epoch`` mode; ``dataservice.jax.prefetch_to_device`` puts
each batch on the device(s) ``--prefetch`` batches ahead of the step, split over the local devices
(``batch_sharding()``). The model is a 784 -> 128 -> 3 MLP in ``jax.numpy``, trained by a hand-written,
jitted SGD step (no optimizer library). Each epoch prints its throughput and how long the loop waited
for data (*stall*, the reader's ``stats()``).

Example::

    $ dataservice local --port 5050 --workers 2 &
    $ python -m client.train_jax --service grpc://localhost:5050 --data-dir /tmp/datasets --epochs 3
    devices: 1 x cpu; batches split over them, prefetched 2 ahead
    epoch 1/3: 5,312 examples in 2.71 s (1,964 examples/s), stall 0.51 s (19%), loss 0.853, validation accuracy 0.582
    ...
    test accuracy 0.784 (chance: 0.333)

From Python::

    >>> from client.train_jax import train
    >>> result = train("grpc://localhost:5050", data_dir="/tmp/datasets", epochs=3)
    >>> result.test_accuracy > 0.5
    True

Checkpoints (``--checkpoint-dir DIR [--checkpoint-every N] [--max-steps N]``): every N steps (default 50)
and at the end of each epoch, the parameters (``model.npz``, the arrays as numpy) and, beside them, a plain
JSON state with the data position — ``prefetch_to_device(...).state_dict()``: the consumer's position in the
distributed read, not the read-ahead's — are written together, atomically (``client/checkpoints.py``). Started
again with the same DIR, the run resumes from the latest: the parameters, the epoch's counters and the read
(``load_state_dict``), so it trains on exactly the batches an uninterrupted run would, in the same order, and
ends with the same parameters. Checkpointing reads in the deterministic order (``deterministic=True``) with
a seeded file order and shuffle. ``--max-steps N`` stops (after a checkpoint) once N steps are done in
all, counting the runs before: a time-boxed slice of a longer training::

    $ python -m client.train_jax --data-dir /tmp/datasets --checkpoint-dir /tmp/jax-run --max-steps 100
    ...
    stopped at step 100 (--max-steps); checkpoint saved: /tmp/jax-run/step-00000100
    $ python -m client.train_jax --data-dir /tmp/datasets --checkpoint-dir /tmp/jax-run
    resumed from /tmp/jax-run/step-00000100: step 100 (epoch 2/3, batch 17)
    ...
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from typing import Optional, Sequence, TextIO

import jax
import jax.numpy as jnp
import numpy as np

import dataservice as ds
from dataservice import catalogue, errors
from dataservice.cli import positive_int
from dataservice.jax import batch_sharding, prefetch_to_device

from client import checkpoints

__all__ = ["EpochResult", "TrainResult", "init_params", "train", "main"]

NUM_CLASSES = 3
PIXELS = 28 * 28
HIDDEN = 128
DEFAULT_CHECKPOINT_EVERY = 50
#: The seed of the file order and of the shuffle when checkpointing: a resumed run's pipeline is the same.
CHECKPOINT_SEED = 0


def normalize(image: np.ndarray, label: np.int64) -> tuple[np.ndarray, np.int32]:
    """Runs on the workers: uint8 pixels -> float32 in [0, 1], flattened; the label as int32 (JAX's default)."""
    return image.reshape(-1).astype(np.float32) / np.float32(255.0), np.int32(label)


def init_params(seed: int = 0) -> dict:
    """He-initialised weights of the 784 -> 128 -> 3 MLP."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {"w1": jax.random.normal(k1, (PIXELS, HIDDEN)) * jnp.sqrt(2.0 / PIXELS), "b1": jnp.zeros(HIDDEN),
            "w2": jax.random.normal(k2, (HIDDEN, NUM_CLASSES)) * jnp.sqrt(1.0 / HIDDEN),
            "b2": jnp.zeros(NUM_CLASSES)}


def _logits(params: dict, x: jax.Array) -> jax.Array:
    hidden = jax.nn.relu(x @ params["w1"] + params["b1"])
    return hidden @ params["w2"] + params["b2"]


def _loss(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    log_probs = jax.nn.log_softmax(_logits(params, x))
    return -jnp.mean(jnp.take_along_axis(log_probs, y[:, None], axis=1))


@jax.jit
def _step(params: dict, x: jax.Array, y: jax.Array, learning_rate: float) -> tuple[dict, jax.Array]:
    """One SGD step; with a batch split over devices, jit runs it where the batch is and all-reduces the grads."""
    loss, grads = jax.value_and_grad(_loss)(params, x, y)
    return jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params, grads), loss


def _accuracy(params: dict, images: np.ndarray, labels: np.ndarray) -> float:
    x = images.reshape(len(images), -1).astype(np.float32) / 255.0
    return float(jnp.mean(jnp.argmax(_logits(params, x), axis=1) == labels))


@dataclasses.dataclass
class EpochResult:
    examples: int
    seconds: float
    stall_s: float          #: time the loop waited inside next() for a batch (the reader's stats())
    stall_fraction: float
    loss: float
    validation_accuracy: float


@dataclasses.dataclass
class TrainResult:
    epochs: list[EpochResult]   #: the epochs this run finished
    test_accuracy: float
    params: Optional[dict] = None  #: the trained parameters
    step: int = 0  #: steps done, counting those of the runs this one resumed from
    resumed_from_step: Optional[int] = None


def _resume(checkpoint_dir: str, config: dict, epochs: int, out: TextIO) -> Optional[checkpoints.Checkpoint]:
    checkpoint = checkpoints.latest(checkpoint_dir)
    if checkpoint is None:
        return None
    if checkpoint.state.get("config") != config:
        raise ValueError(f"checkpoint {checkpoint.path} was written by another training "
                         f"({checkpoint.state.get('config')}, this run: {config}); resume it with the same arguments, "
                         f"or give another --checkpoint-dir")
    state = checkpoint.state
    where = f"epoch {state['epoch']}/{epochs}, batch {state['steps']}" if state["epoch"] <= epochs else "the end"
    print(f"resumed from {checkpoint.path}: step {checkpoint.step} ({where})", file=out, flush=True)
    return checkpoint


def train(service: str, data_dir: Optional[str] = None, epochs: int = 3, batch_size: int = 64,
          learning_rate: float = 0.3, prefetch: int = 2, out: TextIO = sys.stdout,
          checkpoint_dir: Optional[str] = None, checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
          max_steps: Optional[int] = None) -> TrainResult:
    """Trains the MLP on ``shapes`` read through ``service``; see the module docstring.

    ``checkpoint_dir``: save the parameters and the data position there every ``checkpoint_every`` steps
    and at each epoch's end, and resume from the latest checkpoint there. ``max_steps``: stop (with a
    checkpoint) once that many steps are done, counting those of the runs resumed from.

    Example::

        >>> train(service, data_dir=d, checkpoint_dir="/tmp/jax-run", max_steps=100).step
        100
        >>> train(service, data_dir=d, checkpoint_dir="/tmp/jax-run").resumed_from_step
        100
    """
    devices = jax.local_devices()
    if batch_size % len(devices):
        raise ValueError(f"batch_size {batch_size} must be a multiple of the {len(devices)} local devices it is "
                         f"split over")
    if checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
    builder = catalogue.builder("shapes", data_dir=data_dir)
    if not builder.is_prepared:
        print(f"preparing shapes in {builder.data_dir} ...", file=out, flush=True)
        builder.download_and_prepare(download_config=catalogue.DownloadConfig(num_shards=8))
    # A resumed run must build the very pipeline it saved the position of: seeded, read in the deterministic order.
    seed = CHECKPOINT_SEED if checkpoint_dir is not None else None
    # drop_remainder: every batch splits evenly over the devices, and jit compiles one shape.
    pipeline = (catalogue.load("shapes", split="train[:90%]", data_dir=data_dir, as_supervised=True,
                               shuffle_files=True, read_config=catalogue.ReadConfig(shuffle_seed=seed))
                .map(normalize).shuffle(2048, seed=seed).batch(batch_size, drop_remainder=True))
    val_images, val_labels = catalogue.load("shapes", split="train[90%:]", data_dir=data_dir, as_supervised=True,
                                            batch_size=-1)
    test_images, test_labels = catalogue.load("shapes", split="test", data_dir=data_dir, as_supervised=True,
                                              batch_size=-1)
    distributed = pipeline.apply(ds.distribute("distributed_epoch", service, deterministic=checkpoint_dir is not None))
    sharding = batch_sharding(devices)
    print(f"devices: {len(devices)} x {devices[0].platform}; batches split over them, prefetched {prefetch} ahead",
          file=out, flush=True)

    config = {"batch_size": batch_size, "learning_rate": learning_rate, "devices": len(devices)}
    checkpoint = _resume(checkpoint_dir, config, epochs, out) if checkpoint_dir is not None else None
    params = init_params()
    step, first_epoch = 0, 1
    if checkpoint is not None:
        params = {name: jnp.asarray(array) for name, array in checkpoint.arrays.items()}
        step, first_epoch = checkpoint.step, checkpoint.state["epoch"]

    def save(epoch: int, counters: tuple[int, float, int], data: Optional[dict]) -> str:
        examples, loss_sum, steps = counters
        return checkpoints.save(checkpoint_dir, step, {name: np.asarray(p) for name, p in params.items()},
                                {"config": config, "epoch": epoch, "examples": examples, "loss_sum": loss_sum,
                                 "steps": steps, "data": data})

    result = TrainResult([], 0.0, step=step, resumed_from_step=checkpoint.step if checkpoint is not None else None)
    for epoch in range(first_epoch, epochs + 1):
        examples, loss_sum, steps = 0, 0.0, 0
        batches = prefetch_to_device(distributed, size=prefetch, sharding=sharding)  # a new iteration of the job
        if checkpoint is not None and epoch == checkpoint.state["epoch"] and checkpoint.state["data"] is not None:
            state = checkpoint.state
            batches.load_state_dict(state["data"])  # the read continues where the checkpoint was taken
            examples, loss_sum, steps = state["examples"], state["loss_sum"], state["steps"]
        start = time.perf_counter()
        loss = None
        stopped = False
        for x, y in batches:
            params, loss = _step(params, x, y, learning_rate)
            steps += 1
            step += 1
            examples += len(y)
            if steps % 16 == 0:
                loss_sum += float(loss) * 16  # an occasional sync, not one per step: the device runs ahead
            stopped = max_steps is not None and step >= max_steps
            if checkpoint_dir is not None and (step % checkpoint_every == 0 or stopped):
                path = save(epoch, (examples, loss_sum, steps), batches.state_dict())
            if stopped:
                break
        if stopped:
            batches.close()
            saved = f"; checkpoint saved: {path}" if checkpoint_dir is not None else ""
            print(f"stopped at step {step} (--max-steps){saved}", file=out, flush=True)
            result.step, result.params = step, params
            return result
        if loss is not None:
            loss_sum += float(loss) * (steps % 16)
        seconds = time.perf_counter() - start
        stats = batches.stats()
        batches.close()
        accuracy = _accuracy(params, val_images, val_labels)
        epoch_result = EpochResult(examples, seconds, stats.stall_s, stats.stall_fraction,
                                   loss_sum / max(steps, 1), accuracy)
        result.epochs.append(epoch_result)
        print(f"epoch {epoch}/{epochs}: {examples:,} examples in {seconds:.2f} s ({examples / seconds:,.0f} "
              f"examples/s), stall {stats.stall_s:.2f} s ({stats.stall_fraction:.0%}), loss {epoch_result.loss:.3f}, "
              f"validation accuracy {accuracy:.3f}", file=out, flush=True)
        if checkpoint_dir is not None:
            save(epoch + 1, (0, 0.0, 0), None)  # the epoch is done: a resumed run starts the next one
    result.test_accuracy = _accuracy(params, test_images, test_labels)
    result.step, result.params = step, params
    print(f"test accuracy {result.test_accuracy:.3f} (chance: {1 / NUM_CLASSES:.3f})", file=out, flush=True)
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the example; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m client.train_jax",
                                     description="Train an MLP on the catalogue's shapes dataset with JAX, reading "
                                                 "through the data service.")
    parser.add_argument("--service", default=os.environ.get("DATASERVICE_SERVICE", "grpc://localhost:5050"),
                        help="the dispatcher, grpc://host:port (default: $DATASERVICE_SERVICE or "
                             "grpc://localhost:5050)")
    parser.add_argument("--data-dir", help="where datasets are prepared (default: $DATASERVICE_DATA_DIR, "
                                           "$TFDS_DATA_DIR or ~/tensorflow_datasets); workers must see it too")
    parser.add_argument("--epochs", type=positive_int, default=3)
    parser.add_argument("--batch-size", type=positive_int, default=64)
    parser.add_argument("--learning-rate", type=float, default=0.3)
    parser.add_argument("--prefetch", type=positive_int, default=2, help="batches put on the device ahead (default: 2)")
    parser.add_argument("--checkpoint-dir", default=None,
                        help="save the parameters and the data position (JSON) together in this directory every "
                             "--checkpoint-every steps and at each epoch's end, and resume from the latest "
                             "checkpoint there (the read then in the deterministic order, the pipeline seeded)")
    parser.add_argument("--checkpoint-every", type=positive_int, default=DEFAULT_CHECKPOINT_EVERY,
                        help=f"steps between checkpoints (default: {DEFAULT_CHECKPOINT_EVERY})")
    parser.add_argument("--max-steps", type=positive_int, default=None,
                        help="stop (after a checkpoint) once this many steps are done, counting those of the runs "
                             "resumed from: run again with the same --checkpoint-dir to go on")
    args = parser.parse_args(argv)
    try:
        ds.distribute("distributed_epoch", args.service)  # validates the address before any work
    except ValueError as exc:
        parser.error(str(exc))
    if args.batch_size % len(jax.local_devices()):
        parser.error(f"argument --batch-size: {args.batch_size} is not a multiple of the "
                     f"{len(jax.local_devices())} local devices each batch is split over")
    try:
        train(args.service, data_dir=args.data_dir, epochs=args.epochs, batch_size=args.batch_size,
              learning_rate=args.learning_rate, prefetch=args.prefetch, checkpoint_dir=args.checkpoint_dir,
              checkpoint_every=args.checkpoint_every, max_steps=args.max_steps)
    except (errors.DataServiceError, ValueError) as exc:
        print(f"train_jax: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
