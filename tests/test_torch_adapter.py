"""``dataservice.torch``: real PyTorch (the CPU build the test extra pins) over a real TestCluster.

Every element once through ``DataLoader(batch_size=None)`` in ``distributed_epoch``; tensors that are the
received buffers (no copy) and keep them from reuse while held; nested structures; read-only arrays;
``pin_memory`` and ``device``; ``DataLoader(num_workers>0)``; and the example ``client/train_torch.py``
end to end, alone and under ``torchrun`` with DistributedDataParallel (slow).
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: pip install -e '.[test]'")

import dataservice as ds  # noqa: E402
from dataservice.torch import TensorIterator, TorchDataset, keep_structure, to_torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
#: The longest an example run may take on a loaded 2-core machine.
EXAMPLE_TIMEOUT_S = 300

Pair = collections.namedtuple("Pair", "index name")

#: Elements with arrays of 64 KiB or more: they arrive out of band, each in a receive buffer of its own.
LARGE = 32 * 1024  # float32 values: 128 KiB


def large_element(i):
    return {"image": np.full(LARGE, i, np.float32), "index": i}


def nested_element(i):
    # (A list in an element is an array to tf.data and to us: tuples are the structure.)
    return {"pair": Pair(i, f"item-{i}"), "arrays": (np.arange(3) + i, np.full((2, 2), i, np.float64)),
            "tuple": (np.int32(i), b"raw", np.str_("text")), "flag": np.bool_(i % 2 == 0)}


def test_the_module_uses_the_real_torch():
    """``import torch`` inside dataservice/torch.py is absolute: PyTorch itself, not the module."""
    import dataservice.torch as adapter

    assert adapter.torch is sys.modules["torch"] and hasattr(adapter.torch, "from_numpy")
    assert issubclass(TorchDataset, sys.modules["torch"].utils.data.IterableDataset)


def test_loader_gives_every_element_once_in_distributed_epoch(cluster):
    dataset = ds.Dataset.range(300).map(large_element).batch(10)
    distributed = dataset.apply(ds.distribute("distributed_epoch", cluster.target))
    loader = torch.utils.data.DataLoader(TorchDataset(distributed), batch_size=None)
    for epoch in range(2):  # each epoch of the loader is a new iteration of the job
        seen = []
        for batch in loader:
            # Each worker batches the splits it draws: a group's last batch may be short.
            assert isinstance(batch["image"], torch.Tensor) and batch["image"].shape[1:] == (LARGE,)
            assert isinstance(batch["index"], torch.Tensor) and batch["index"].dtype == torch.int64
            assert torch.equal(batch["image"][:, 0], batch["index"].to(torch.float32))
            seen.extend(batch["index"].tolist())
        assert sorted(seen) == list(range(300)), f"epoch {epoch}"


def test_tensors_are_the_received_buffers(cluster):
    """to_torch (what TorchDataset applies) shares the memory of the arrays as they arrive; a tensor
    from the service is writable without a warning (the buffers are the client's own)."""
    distributed = ds.Dataset.range(6).map(large_element).apply(ds.distribute("parallel_epochs", cluster.target))
    count = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when it wraps a non-writable array
        for element in distributed:
            array = element["image"]
            tensor = to_torch(element)["image"]
            assert tensor.data_ptr() == array.ctypes.data
            assert np.shares_memory(tensor.numpy(), array)
            tensor[0] = -1.0
            assert array[0] == -1.0
            count += 1
    assert count == 12


def test_torch_dataset_and_loader_do_not_copy():
    """The arrays a pipeline yields are the tensors' memory, through TorchDataset and through DataLoader."""
    arrays = [np.full(1000, i, np.float32) for i in range(5)]
    dataset = ds.Dataset.from_generator(lambda: iter(arrays), output_signature=ds.TensorSpec((1000,), np.float32))
    direct = list(TorchDataset(dataset))
    loaded = list(torch.utils.data.DataLoader(TorchDataset(dataset), batch_size=None))
    for array, a, b in zip(arrays, direct, loaded, strict=True):
        assert a.data_ptr() == b.data_ptr() == array.ctypes.data


def test_kept_tensors_keep_their_buffers(cluster):
    """The client reuses a receive buffer once nothing refers to it: a tensor held by the consumer must keep
    its buffer (and its values) while the read goes on."""
    distributed = ds.Dataset.range(200).map(large_element).apply(
        ds.distribute("distributed_epoch", cluster.target))
    kept = {}
    for element in TorchDataset(distributed):
        kept[int(element["index"])] = element["image"]
    assert sorted(kept) == list(range(200))
    for index, image in kept.items():
        assert bool((image == index).all()), f"element {index}'s tensor was overwritten"
    assert len({image.data_ptr() for image in kept.values()}) == 200


def test_nested_structures_are_kept(cluster):
    distributed = ds.Dataset.range(4).map(nested_element).apply(ds.distribute("distributed_epoch", cluster.target))
    # The loader's default_convert would turn the plain tuples into lists; keep_structure hands them over as
    # TorchDataset made them (on its own, TorchDataset yields the same).
    loader = torch.utils.data.DataLoader(TorchDataset(distributed), batch_size=None, collate_fn=keep_structure)
    elements = sorted(loader, key=lambda e: int(e["pair"].index))
    assert len(elements) == 4
    for i, element in enumerate(elements):
        assert type(element["pair"]) is Pair
        assert isinstance(element["pair"].index, torch.Tensor) and int(element["pair"].index) == i
        assert element["pair"].name == f"item-{i}"
        assert type(element["arrays"]) is tuple
        assert torch.equal(element["arrays"][0], torch.arange(3) + i)
        assert element["arrays"][1].dtype == torch.float64 and element["arrays"][1].shape == (2, 2)
        number, raw, text = element["tuple"]
        assert number.dtype == torch.int32 and number.shape == () and int(number) == i
        assert raw == b"raw" and text == "text"
        assert element["flag"].dtype == torch.bool and bool(element["flag"]) == (i % 2 == 0)


def test_the_default_loader_turns_tuples_into_lists():
    """torch's own default_convert (DataLoader(batch_size=None) without collate_fn), kept as torch has it."""
    dataset = ds.Dataset.range(2).map(lambda i: (np.full(2, i), np.int64(i)))
    assert [type(e) for e in TorchDataset(dataset)] == [tuple, tuple]
    assert [type(e) for e in torch.utils.data.DataLoader(TorchDataset(dataset), batch_size=None)] == [list, list]


def test_string_arrays_pass_through_and_scalars_become_tensors():
    element = to_torch({"names": np.array(["a", "bc"]), "count": np.int64(3), "weight": 0.5, "none": None,
                        "list": [np.zeros(2), "x"]})
    assert isinstance(element["list"], list) and element["list"][0].dtype == torch.float64
    assert isinstance(element["names"], np.ndarray) and element["names"].tolist() == ["a", "bc"]
    assert isinstance(element["count"], torch.Tensor) and element["count"].item() == 3
    assert element["weight"] == 0.5 and element["none"] is None


def test_read_only_arrays_are_copied_without_a_warning():
    buffer = np.arange(6, dtype=np.int64).tobytes()
    read_only = np.frombuffer(buffer, dtype=np.int64)  # a view of immutable bytes
    assert not read_only.flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tensor = to_torch(read_only)
    assert tensor.tolist() == list(range(6))
    assert tensor.data_ptr() != read_only.ctypes.data
    tensor[0] = 99  # the copy is the tensor's own
    assert read_only[0] == 0


def test_views_torch_cannot_wrap_are_copied():
    reversed_view = np.arange(5)[::-1]
    swapped = np.arange(3, dtype=">i4")
    assert to_torch(reversed_view).tolist() == [4, 3, 2, 1, 0]
    assert to_torch(swapped).tolist() == [0, 1, 2]
    strided = np.arange(10)[::2]  # positive strides: shared
    assert to_torch(strided).data_ptr() == strided.ctypes.data


def test_device_cpu_keeps_the_buffer(cluster):
    distributed = ds.Dataset.range(4).map(large_element).apply(ds.distribute("distributed_epoch", cluster.target))
    seen = []
    for element in TorchDataset(distributed, device="cpu"):
        assert element["image"].device == torch.device("cpu")
        seen.append(int(element["index"]))
    assert sorted(seen) == [0, 1, 2, 3]
    array = np.ones(100, np.float32)
    assert to_torch(array, device="cpu").data_ptr() == array.ctypes.data


def _accelerator_available() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    return bool(accelerator.is_available()) if accelerator is not None else torch.cuda.is_available()


@pytest.mark.skipif(_accelerator_available(), reason="an accelerator is available: memory is pinned for real")
def test_pin_memory_without_an_accelerator_warns_and_does_not_pin():
    # This torch build cannot pin without an accelerator: Tensor.pin_memory() raises.
    with pytest.raises(RuntimeError):
        torch.zeros(1).pin_memory()
    with pytest.warns(UserWarning, match="no accelerator is available, so memory is not pinned"):
        dataset = TorchDataset(ds.Dataset.range(3), pin_memory=True)
    assert dataset.pin_memory is False
    assert [int(t) for t in dataset] == [0, 1, 2]


@pytest.mark.skipif(not _accelerator_available(), reason="pinning memory needs an accelerator; this torch build "
                                                          "has none (the CPU build the test extra pins)")
def test_pin_memory_pins():  # pragma: no cover - needs an accelerator
    dataset = ds.Dataset.range(3).map(lambda i: np.full(4, i, np.float32))
    assert all(t.is_pinned() for t in TorchDataset(dataset, pin_memory=True))


def test_stats_come_from_the_reader(cluster):
    distributed = ds.Dataset.range(50).map(large_element).apply(ds.distribute("distributed_epoch", cluster.target))
    iterator = iter(TorchDataset(distributed))
    assert isinstance(iterator, TensorIterator)
    assert sum(1 for _ in iterator) == 50
    stats = iterator.stats()
    assert stats.elements == 50
    assert stats.bytes >= 50 * LARGE * 4
    local = iter(TorchDataset(ds.Dataset.range(3)))
    assert sum(1 for _ in local) == 3 and local.stats().elements == 0  # a local pipeline: nothing from the service


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="TorchDataset wraps a dataservice Dataset.*got list"):
        TorchDataset([1, 2, 3])
    with pytest.raises(ValueError, match="device must be None or a torch device.*'warp-drive'"):
        TorchDataset(ds.Dataset.range(3), device="warp-drive")
    with pytest.raises(ValueError, match="pin_memory must be True or False"):
        TorchDataset(ds.Dataset.range(3), pin_memory="yes")
    with pytest.raises(TypeError, match=r"element\['x'\]: a numpy array of dtype float128"):
        to_torch({"x": np.zeros(2, np.longdouble)})


def test_loader_workers_shard_a_local_dataset():
    """num_workers=2 over a local pipeline: each loader worker keeps every 2nd element, so the loader gives
    every element once, in order (spawned workers: no fork of this process's threads)."""
    loader = torch.utils.data.DataLoader(TorchDataset(ds.Dataset.range(11)), batch_size=None, num_workers=2,
                                         multiprocessing_context="spawn")
    assert [int(t) for t in loader] == list(range(11))


def test_loader_workers_are_refused_for_a_dataset_read_from_the_service(cluster):
    dataset_id = ds.register_dataset(cluster.target, ds.Dataset.range(10))
    reader = ds.from_dataset_id("distributed_epoch", cluster.target, dataset_id)
    loader = torch.utils.data.DataLoader(TorchDataset(reader), batch_size=None, num_workers=1,
                                         multiprocessing_context="spawn")
    with pytest.raises(RuntimeError, match=r"(?s)in DataLoader worker 0 of 1: use DataLoader\(num_workers=0\)"):
        list(loader)


# --- the example, end to end --------------------------------------------------------------------------------

def _run_example(argv: list, tmp_path: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT_S)
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_example_trains_from_the_service(cluster, tmp_path):
    out = _run_example([sys.executable, "-m", "client.train_torch", "--service", cluster.target,
                        "--data-dir", str(tmp_path / "data"), "--epochs", "2"], tmp_path)
    epochs = re.findall(r"^epoch (\d)/2: ([\d,]+) examples in [\d.]+ s \(([\d,]+) examples/s, [\d.,]+ MB/s\), "
                        r"stall ([\d.]+) s \((\d+)%\), loss [\d.]+, validation accuracy ([\d.]+)$", out, re.M)
    assert [(e[0], e[1]) for e in epochs] == [("1", "5,400"), ("2", "5,400")], out  # every example once
    accuracy = float(re.search(r"^test accuracy ([\d.]+) \(chance: 0.333\)$", out, re.M).group(1))
    assert accuracy > 0.6, out  # it learned: 3 classes, chance is 1/3


@pytest.mark.slow
def test_example_under_torchrun_ddp_reads_one_shared_job(cluster, tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed beside this Python")
    out = _run_example([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "client.train_torch",
                        "--service", cluster.target, "--data-dir", str(tmp_path / "data"), "--epochs", "2"],
                       tmp_path)
    epochs = re.findall(r"^epoch (\d)/2: ([\d,]+) examples \(2 ranks, ([\d,]+) on rank 0\)", out, re.M)
    # The two ranks' shares add up to every example once per epoch; each rank read some.
    assert [(e[0], e[1]) for e in epochs] == [("1", "5,400"), ("2", "5,400")], out
    assert all(0 < int(e[2].replace(",", "")) < 5400 for e in epochs), out


def test_torch_iterator_is_stateful_through_torch_save(tmp_path):
    def make():
        return TorchDataset(ds.Dataset.range(50).map(lambda x: (np.full((2,), x, np.float32), x)).batch(4))

    it = iter(make())
    for _ in range(3):
        next(it)
    torch.save({"data": it.state_dict()}, tmp_path / "ckpt.pt")
    rest = [images.tolist() for images, _ in it]
    resumed = iter(make())
    resumed.load_state_dict(torch.load(tmp_path / "ckpt.pt", weights_only=True)["data"])
    assert [images.tolist() for images, _ in resumed] == rest and len(rest) == 10
