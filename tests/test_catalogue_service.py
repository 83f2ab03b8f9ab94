"""A sliced catalogue dataset fed through the service: distributed_epoch gives every example of the
slice exactly once, parallel_epochs the whole slice from each worker."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from dataservice import catalogue, distribute
from tests.cluster import TestCluster, run_with_deadline

DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("datasets"))
    catalogue.builder("shapes", data_dir=d).download_and_prepare(download_config=catalogue.DownloadConfig(num_shards=8))
    return d


def image_keys(elements) -> collections.Counter:
    return collections.Counter(image.tobytes() for image, _ in elements)


def normalize(image, label):
    return image.astype(np.float32) / 255.0, label


@pytest.mark.parametrize("split", ["train[:10%]+train[-30%:]", "test[25%:75%]"])
def test_distributed_epoch_gives_every_example_of_the_slice_exactly_once(data_dir, split):
    ds = catalogue.load("shapes", split=split, data_dir=data_dir, as_supervised=True)
    assert ds.is_splittable() and ds.num_splits() >= 2  # a file, or the records a slice keeps of one, per split
    expected = image_keys(ds)
    with TestCluster(num_workers=2) as cluster:
        distributed = ds.apply(distribute("distributed_epoch", cluster.target))
        got = run_with_deadline(lambda: list(distributed), DEADLINE_S)
    assert image_keys(got) == expected and max(expected.values()) == 1


def test_parallel_epochs_gives_the_slice_from_every_worker(data_dir):
    ds = catalogue.load("shapes", split="test[:20%]", data_dir=data_dir, as_supervised=True).map(normalize)
    expected = collections.Counter(image.tobytes() for image, _ in ds)
    with TestCluster(num_workers=2) as cluster:
        cluster.wait_for_workers(2)
        distributed = ds.apply(distribute("parallel_epochs", cluster.target))
        got = run_with_deadline(lambda: list(distributed), DEADLINE_S)
    assert got[0][0].dtype == np.float32
    assert collections.Counter(image.tobytes() for image, _ in got) == \
        collections.Counter({k: 2 * n for k, n in expected.items()})


def test_a_shuffled_sliced_dataset_through_the_service(data_dir):
    ds = catalogue.load("shapes", split="train[:50%]", data_dir=data_dir, shuffle_files=True,
                        read_config=catalogue.ReadConfig(shuffle_seed=5)).batch(16)
    expected = collections.Counter(img.tobytes() for batch in ds for img in batch["image"])
    with TestCluster(num_workers=2) as cluster:
        distributed = ds.apply(distribute("distributed_epoch", cluster.target))
        got = run_with_deadline(lambda: list(distributed), DEADLINE_S)
    assert collections.Counter(img.tobytes() for batch in got for img in batch["image"]) == expected
    assert sum(expected.values()) == 3000
