"""``TorchDataset`` as torch's ``Stateful``: ``state_dict()``/``load_state_dict()`` on the dataset object, as
torchdata's ``StatefulDataLoader`` calls them, through ``torch.save``/``torch.load(weights_only=True)``.

A local pipeline and a read from a real ``TestCluster`` (``distributed_epoch``, ``deterministic=True``): the
elements before the save plus those of the restored dataset are the uninterrupted run, element for element.
With torchdata installed (it is not a dependency of the project: the tests that need it are skipped
without it), the same through ``StatefulDataLoader``.
"""

from __future__ import annotations

import io
import pickle
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: pip install -e '.[test]'")

import dataservice as ds  # noqa: E402
from dataservice.torch import TorchDataset  # noqa: E402


def _pair(x):
    return np.full((2,), x, np.float32), x


def local_pipeline() -> ds.Dataset:
    return ds.Dataset.range(50).map(_pair).batch(4)  # 13 batches, the last of 2


def service_pipeline(target: str) -> ds.Dataset:
    # Per element then batched: a deterministic read gives the same batches in the same order every run.
    return (ds.Dataset.range(240).map(_pair).filter(lambda image, x: x % 7 != 3).batch(8)
            .apply(ds.distribute("distributed_epoch", target, deterministic=True)))


def ids(batches) -> list[list[int]]:
    return [labels.tolist() for _, labels in batches]


def through_torch_save(checkpoint: dict) -> dict:
    """``checkpoint`` written by ``torch.save`` and read back as a restarted trainer would: weights only."""
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def save_after(tds: TorchDataset, k: int) -> tuple[list, dict]:
    """The first ``k`` batches of a new iteration of ``tds``, and a checkpoint (model and data) taken then."""
    it = iter(tds)
    head = ids(next(it) for _ in range(k))
    model = torch.nn.Linear(2, 1)
    checkpoint = through_torch_save({"model": model.state_dict(), "data": tds.state_dict()})
    assert torch.equal(checkpoint["model"]["weight"], model.weight.detach())
    return head, checkpoint


# --- a local pipeline ---------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [0, 1, 6, 12, 13])
def test_dataset_state_resumes_exactly_through_torch_save(k):
    full = ids(TorchDataset(local_pipeline()))
    head, checkpoint = save_after(TorchDataset(local_pipeline()), k)
    restored = TorchDataset(local_pipeline())  # the trainer restarted: the pipeline built again
    restored.load_state_dict(checkpoint["data"])
    assert head + ids(restored) == full
    assert ids(restored) == full  # only the next iteration starts at the state: the one after is an epoch


def test_state_is_the_most_recent_iterators_position():
    tds = TorchDataset(local_pipeline())
    start = tds.state_dict()  # before any iter(): the start
    first = iter(tds)
    next(first)
    second = iter(tds)
    for _ in range(3):
        next(second)
    assert tds.state_dict() == second.state_dict() != first.state_dict()
    restored = TorchDataset(local_pipeline())
    restored.load_state_dict(start)
    assert ids(restored) == ids(TorchDataset(local_pipeline()))


def test_loaded_state_is_the_state_until_the_next_iteration():
    _, checkpoint = save_after(TorchDataset(local_pipeline()), 5)
    tds = TorchDataset(local_pipeline())
    iterated = iter(tds)
    next(iterated)
    tds.load_state_dict(checkpoint["data"])
    assert tds.state_dict() == checkpoint["data"]  # saved again before iterating: the same position
    it = iter(tds)
    assert it.state_dict() == checkpoint["data"]
    assert ids(it) == ids(TorchDataset(local_pipeline()))[5:]


def test_a_state_of_another_pipeline_fails_at_iter_and_stays_pending():
    _, checkpoint = save_after(TorchDataset(local_pipeline()), 2)
    other = TorchDataset(ds.Dataset.range(50).map(_pair).batch(5))
    other.load_state_dict(checkpoint["data"])
    for _ in range(2):
        with pytest.raises(ValueError, match="the iterator state is of another pipeline"):
            iter(other)
    with pytest.raises(ValueError, match="expects the dict state_dict"):
        other.load_state_dict("not a state")


def test_iterator_restored_twice():
    """As StatefulDataLoader does: the dataset restored (its new iterator with it), then that iterator
    with the same state: once. A different state before the first element replaces the first."""
    at_two = save_after(TorchDataset(local_pipeline()), 2)[1]["data"]
    at_nine = save_after(TorchDataset(local_pipeline()), 9)[1]["data"]
    full = ids(TorchDataset(local_pipeline()))
    tds = TorchDataset(local_pipeline())
    tds.load_state_dict(at_two)
    it = iter(tds)
    it.load_state_dict(at_two)
    assert ids(it) == full[2:]
    it = iter(tds)
    it.load_state_dict(at_two)
    it.load_state_dict(at_nine)
    assert ids(it) == full[9:]


def test_a_dataset_with_an_iterator_pickles_without_it():
    """A DataLoader worker started by spawn gets a pickled copy of the dataset: the pending state travels,
    the live iterator of this process does not."""
    _, checkpoint = save_after(TorchDataset(local_pipeline()), 4)
    tds = TorchDataset(local_pipeline())
    next(iter(tds))
    tds.load_state_dict(checkpoint["data"])
    copy = pickle.loads(pickle.dumps(tds))
    assert ids(copy) == ids(TorchDataset(local_pipeline()))[4:]


# --- a read from the service --------------------------------------------------------------------------

@pytest.mark.parametrize("k", [0, 5, 25])
def test_service_read_resumes_exactly_through_torch_save(cluster, k):
    full = ids(TorchDataset(service_pipeline(cluster.target)))
    assert sorted(x for batch in full for x in batch) == [x for x in range(240) if x % 7 != 3]
    assert len(full) > 25
    head, checkpoint = save_after(TorchDataset(service_pipeline(cluster.target)), k)
    cluster.add_worker()  # the cluster changed between the save and the restore
    restored = TorchDataset(service_pipeline(cluster.target))
    restored.load_state_dict(checkpoint["data"])
    assert head + ids(restored) == full
    assert ids(restored) == full  # the next epoch: a new iteration, from the start


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "dynamic"])
def test_service_read_resumes_through_torch_distributed_checkpoint(cluster, tmp_path, deterministic):
    # dcp.load fills in the keys of a fresh object's state_dict(): a read's state has the same keys anywhere.
    import torch.distributed.checkpoint as dcp

    def make() -> TorchDataset:
        return TorchDataset(ds.Dataset.range(600).map(_pair).apply(
            ds.distribute("distributed_epoch", cluster.target, deterministic=deterministic)).batch(8))

    full = ids(make())
    tds = make()
    it = iter(tds)
    head = ids(next(it) for _ in range(20))
    restored = make()
    with warnings.catch_warnings():  # no process group: dcp warns that it saves and loads in this process alone
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"data": tds}, checkpoint_id=str(tmp_path / "ckpt"))
        dcp.load({"data": restored}, checkpoint_id=str(tmp_path / "ckpt"))
    tail = ids(restored)
    if deterministic:
        assert head + tail == full
    else:
        assert sorted(x for b in head + tail for x in b) == sorted(x for b in full for x in b)


def test_service_read_state_at_the_end_restores_nothing(cluster):
    tds = TorchDataset(service_pipeline(cluster.target))
    full = ids(tds)
    restored = TorchDataset(service_pipeline(cluster.target))
    restored.load_state_dict(through_torch_save({"data": tds.state_dict()})["data"])
    assert ids(restored) == []
    assert ids(restored) == full


# --- torchdata's StatefulDataLoader ---------------------------------------------------------------------

#: torchdata 0.11 calls a torch function that newer torch releases deprecate.
_TORCHDATA_WARNING = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


def _stateful_dataloader():
    module = pytest.importorskip("torchdata.stateful_dataloader",
                                 reason="torchdata is not installed (not a dependency of dataservice)")
    return module.StatefulDataLoader


def _loader_resumes(make_tds, k: int, num_workers: int = 0) -> None:
    StatefulDataLoader = _stateful_dataloader()
    full = ids(StatefulDataLoader(make_tds(), batch_size=None, num_workers=num_workers))
    tds = make_tds()
    loader = StatefulDataLoader(tds, batch_size=None, num_workers=num_workers)
    it = iter(loader)
    head = ids(next(it) for _ in range(k))
    checkpoint = through_torch_save({"loader": loader.state_dict()})
    if num_workers == 0:
        # The loader saved the dataset's own state beside its iterator's: a restore seeks, never replays.
        assert checkpoint["loader"]["dataset_state"] == tds.state_dict()
        assert checkpoint["loader"]["fetcher_state"]["dataset_iter_state"] == tds.state_dict()
    restored = StatefulDataLoader(make_tds(), batch_size=None, num_workers=num_workers)
    restored.load_state_dict(checkpoint["loader"])
    assert head + ids(restored) == full
    assert ids(restored) == full


@_TORCHDATA_WARNING
@pytest.mark.parametrize("k", [0, 4, 13])
def test_stateful_dataloader_resumes_a_local_pipeline(k):
    _loader_resumes(lambda: TorchDataset(local_pipeline()), k)


@_TORCHDATA_WARNING
@pytest.mark.slow
def test_stateful_dataloader_with_worker_processes_resumes_a_local_pipeline():
    """Each loader worker iterates its shard of the pipeline and saves that iterator's position."""
    _loader_resumes(lambda: TorchDataset(local_pipeline()), 5, num_workers=2)


@_TORCHDATA_WARNING
@pytest.mark.parametrize("k", [3, 20])
def test_stateful_dataloader_resumes_a_read_from_the_service(cluster, k):
    _loader_resumes(lambda: TorchDataset(service_pipeline(cluster.target)), k)
