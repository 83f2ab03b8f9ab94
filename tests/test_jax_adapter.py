"""``dataservice.jax``: real JAX (the CPU build the test extra pins) over a real TestCluster.

Device arrays in order, how far ahead ``size=`` pulls (counted by a generator), structures, sharding
over several (forced) CPU devices in a subprocess, bad arguments, and the example ``client/train_jax.py``
end to end (slow).
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed: pip install -e '.[test]'")

import dataservice as ds  # noqa: E402
from dataservice.jax import DevicePrefetchIterator, batch_sharding, prefetch_to_device  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
#: The longest a subprocess may take on a loaded 2-core machine.
SUBPROCESS_TIMEOUT_S = 300

Pair = collections.namedtuple("Pair", "index name")
LARGE = 32 * 1024  # float32 values: 128 KiB, sent out of band into a receive buffer of its own


class CountingSource:
    """An iterator of numbered arrays that counts how many have been pulled from it."""

    def __init__(self, n: int):
        self.n = n
        self.pulled = 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.pulled == self.n:
            raise StopIteration
        self.pulled += 1
        return np.full(4, self.pulled - 1, np.float32)


def test_the_module_uses_the_real_jax():
    """``import jax`` inside dataservice/jax.py is absolute: JAX itself, not the module."""
    import dataservice.jax as adapter

    assert adapter.jax is sys.modules["jax"] and hasattr(adapter.jax, "device_put")


def test_yields_device_arrays_in_order():
    device = jax.devices()[0]
    out = list(prefetch_to_device(CountingSource(10), size=3, device=device))
    assert len(out) == 10
    for i, array in enumerate(out):
        assert isinstance(array, jax.Array)
        assert array.devices() == {device}
        np.testing.assert_array_equal(np.asarray(array), np.full(4, i, np.float32))


@pytest.mark.parametrize("size", [1, 2, 5])
def test_size_bounds_how_far_ahead_it_pulls(size):
    source = CountingSource(12)
    iterator = prefetch_to_device(source, size=size)
    assert source.pulled == 0  # nothing before the first next()
    for k in range(1, 13):
        array = next(iterator)
        assert int(array[0]) == k - 1
        # While the consumer holds element k, the next `size` are on their way, and no more.
        assert source.pulled == min(k + size, 12), f"holding element {k}"
    with pytest.raises(StopIteration):
        next(iterator)


def test_structures_are_kept_and_strings_pass_through():
    elements = [{"pair": Pair(np.int64(i), f"item-{i}"), "xy": (np.arange(3) + i, np.float32(i)),
                 "names": np.array(["a", "b"]), "raw": b"bytes"} for i in range(3)]
    for i, element in enumerate(prefetch_to_device(elements, size=2)):
        assert type(element["pair"]) is Pair and element["pair"].name == f"item-{i}"
        assert isinstance(element["pair"].index, jax.Array) and int(element["pair"].index) == i
        assert type(element["xy"]) is tuple and isinstance(element["xy"][0], jax.Array)
        assert element["xy"][0].tolist() == [i, i + 1, i + 2] and float(element["xy"][1]) == i
        assert isinstance(element["names"], np.ndarray) and element["names"].tolist() == ["a", "b"]
        assert element["raw"] == b"bytes"


def test_a_distributed_dataset_arrives_once_and_kept_arrays_keep_their_values(cluster):
    """The client reuses a receive buffer once nothing refers to it: what JAX made of an element must not
    change while the read goes on, whether JAX copied the buffer or kept it."""
    dataset = ds.Dataset.range(120).map(lambda i: {"image": np.full(LARGE, i, np.float32), "index": i})
    distributed = dataset.apply(ds.distribute("distributed_epoch", cluster.target))
    for _ in range(2):  # each prefetch_to_device is a new iteration of the job
        iterator = prefetch_to_device(distributed, size=4)
        kept = {int(e["index"]): e["image"] for e in iterator}
        assert sorted(kept) == list(range(120))
        for index, image in kept.items():
            assert bool((image == index).all()), f"element {index}'s array was overwritten"
        stats = iterator.stats()
        assert stats.elements == 120 and stats.bytes >= 120 * LARGE * 4


def test_close_ends_the_source():
    closed = []

    def source():
        try:
            for i in range(100):
                yield np.int64(i)
        finally:
            closed.append(True)

    iterator = prefetch_to_device(source(), size=2)
    assert int(next(iterator)) == 0
    iterator.close()
    assert closed == [True]
    with pytest.raises(StopIteration):
        next(iterator)


def test_bad_arguments_are_named():
    for size in (0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match="size must be a positive int"):
            prefetch_to_device([], size=size)
    with pytest.raises(ValueError, match="pass device= or sharding=, not both"):
        prefetch_to_device([], device=jax.devices()[0], sharding=batch_sharding())
    with pytest.raises(ValueError, match="device must be a jax.Device.*'gpu0'"):
        prefetch_to_device([], device="gpu0")
    with pytest.raises(ValueError, match="sharding must be a jax.sharding.Sharding"):
        prefetch_to_device([], sharding="batch")
    assert isinstance(prefetch_to_device(iter([])), DevicePrefetchIterator)


_SHARDING_SCRIPT = textwrap.dedent("""
    import numpy as np, jax
    from dataservice.jax import batch_sharding, prefetch_to_device
    assert len(jax.local_devices()) == 4, jax.local_devices()
    batches = [(np.arange(8 * 3, dtype=np.float32).reshape(8, 3) + b, np.int32(b)) for b in range(3)]
    for b, (x, step) in enumerate(prefetch_to_device(batches, size=2, sharding=batch_sharding())):
        shards = sorted((s.index[0].start, s.device.id) for s in x.addressable_shards)
        assert shards == [(0, 0), (2, 1), (4, 2), (6, 3)], shards  # 2 rows of the batch on each device
        assert len(step.devices()) == 4 and step.sharding.is_fully_replicated  # a scalar: on every device
        np.testing.assert_array_equal(np.asarray(x), batches[b][0])
    try:
        list(prefetch_to_device([np.zeros((6, 2))], sharding=batch_sharding()))
    except ValueError as exc:
        print("refused:", exc)
    print("sharded ok")
""")


@pytest.mark.slow
def test_batch_sharding_splits_the_first_axis_over_local_devices():
    env = {**os.environ, "PYTHONPATH": str(REPO), "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    proc = subprocess.run([sys.executable, "-c", _SHARDING_SCRIPT], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sharded ok" in proc.stdout
    assert re.search(r"refused: element: an array of shape \(6, 2\) does not fit sharding .*batch by a multiple "
                     r"of the device count \(len\(jax.local_devices\(\)\) = 4\)", proc.stdout), proc.stdout


@pytest.mark.slow
def test_example_trains_from_the_service(cluster, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    argv = [sys.executable, "-m", "client.train_jax", "--service", cluster.target, "--data-dir",
            str(tmp_path / "data"), "--epochs", "2"]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    out = proc.stdout
    assert "devices: 2 x cpu; batches split over them, prefetched 2 ahead" in out, out
    epochs = re.findall(r"^epoch (\d)/2: ([\d,]+) examples in [\d.]+ s \([\d,]+ examples/s\), stall [\d.]+ s "
                        r"\(\d+%\), loss [\d.]+, validation accuracy [\d.]+$", out, re.M)
    # 5,400 examples in batches of 64 with drop_remainder, each worker batching what it reads: a few short
    # batches are dropped, never more than one per split group.
    assert [e[0] for e in epochs] == ["1", "2"], out
    assert all(5000 <= int(e[1].replace(",", "")) <= 5400 and int(e[1].replace(",", "")) % 64 == 0
               for e in epochs), out
    accuracy = float(re.search(r"^test accuracy ([\d.]+) \(chance: 0.333\)$", out, re.M).group(1))
    assert accuracy > 0.5, out  # it learned: 3 classes, chance is 1/3


# --- saving the position beside the model ----------------------------------------------------------------

def _batches():
    return ds.Dataset.range(100).map(lambda x: np.full((3,), x, np.float32)).batch(4)


@pytest.mark.parametrize("taken", [0, 1, 5, 25])
def test_device_prefetch_saves_the_consumers_position_not_the_read_ahead(taken):
    it = prefetch_to_device(_batches(), size=3)
    head = [np.asarray(next(it)).tolist() for _ in range(taken)]
    state = json.loads(json.dumps(it.state_dict()))
    rest = [np.asarray(b).tolist() for b in it]
    resumed = prefetch_to_device(_batches(), size=3)
    resumed.load_state_dict(state)
    assert [np.asarray(b).tolist() for b in resumed] == rest
    assert len(head) + len(rest) == 25


def test_device_prefetch_refuses_a_late_load():
    it = prefetch_to_device(_batches(), size=2)
    state = it.state_dict()
    next(it)
    with pytest.raises(ValueError, match="before the iterator's first element"):
        it.load_state_dict(state)
