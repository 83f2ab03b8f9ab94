"""Builders, versions, ``load``, read configs, autocaching and ``benchmark``, on real prepared files.

The seed's examples (``../shared/seeds/003_…``) run here in our names on ``shapes``, the builder
that ships with dataservice (6,000 train and 1,000 test examples, drawn offline), and on small
builders defined below.
"""

from __future__ import annotations

import glob
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from dataservice import Dataset, catalogue
from dataservice.catalogue import ReadInstruction as ri
from dataservice.catalogue.preparation import KeyOrder, SplitWriter, number_of_shards
from dataservice.errors import DatasetNotFoundError, UnsupportedVersionError
from dataservice.data.readers.tfrecord import TFRecordDataset
from dataservice.errors import DataLossError
from tests.cluster import wait_until

#: Pipelines run in this process; no server is talked to (tests/grpc_leak_guard.py checks it).
pytestmark = pytest.mark.no_grpc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def shapes_dir(tmp_path_factory):
    """``shapes`` prepared once for the module (about a second)."""
    data_dir = str(tmp_path_factory.mktemp("datasets"))
    catalogue.builder("shapes", data_dir=data_dir).download_and_prepare()
    return data_dir


def load(split, shapes_dir, **kwargs):
    return catalogue.load("shapes", split=split, data_dir=shapes_dir, **kwargs)


def labels_of(ds) -> list[int]:
    return [int(e["label"]) for e in ds]


# --- small builders ---------------------------------------------------------------------------

class CatNumbers(catalogue.GeneratorBasedBuilder):
    """Integers with their squares; versions 1.0.0 (canonical), 1.1.0, 2.0.0 and a read-only 0.9.0."""

    VERSION = catalogue.Version("1.0.0")
    SUPPORTED_VERSIONS = [catalogue.Version("1.1.0"), catalogue.Version("2.0.0"),
                          catalogue.Version("0.9.0", tfds_version_to_prepare="v1.0.0")]
    SIZE = 300

    def _info(self):
        features = {"x": catalogue.Tensor(shape=(), dtype=np.int64), "y": catalogue.Tensor(shape=(), dtype=np.int64)}
        if self.version >= "1.1.0":  # MINOR: a feature added, the records unchanged
            features["odd"] = catalogue.Tensor(shape=(), dtype=np.bool_)
        return catalogue.DatasetInfo(builder=self, features=catalogue.FeaturesDict(features), supervised_keys=("x", "y"))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(self.SIZE), "test": self._generate_examples(40)}

    def _generate_examples(self, n):
        for i in range(n):
            example = {"x": i, "y": (i * i if self.version.major < 2 else -i)}  # MAJOR: the data changed
            if self.version >= "1.1.0":
                example["odd"] = bool(i % 2)
            yield i, example


class CatConfigured(catalogue.GeneratorBasedBuilder):
    """Two configs with versions of their own."""

    BUILDER_CONFIGS = [
        catalogue.BuilderConfig(name="small", version="1.0.0", supported_versions=["1.2.0"], description="10"),
        catalogue.BuilderConfig(name="large", version="2.0.0", description="100"),
    ]

    def _info(self):
        return catalogue.DatasetInfo(builder=self, features=catalogue.FeaturesDict({"x": np.int64}))

    def _split_generators(self, dl_manager):
        return {"train": ((i, {"x": i}) for i in range(int(self.builder_config.description)))}


class CatBroken(catalogue.GeneratorBasedBuilder):
    VERSION = "1.0.0"
    FAIL_AT = 50

    def _info(self):
        return catalogue.DatasetInfo(builder=self, features=catalogue.FeaturesDict({"x": np.int64}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i in range(100):
            if i == self.FAIL_AT:
                raise RuntimeError("the source went away")
            yield i, {"x": i}


# --- the seed's slicing examples on shapes -----------------------------------------------------

def test_split_strings_of_the_seed(shapes_dir):
    train, test = load(["train", "test"], shapes_dir)
    assert len(train) == 6000 and len(test) == 1000
    assert len(load("train+test", shapes_dir)) == 7000
    assert len(load("train[10:20]", shapes_dir)) == 10
    assert len(load("train[:10%]", shapes_dir)) == 600
    top10_last80 = load("train[:10%]+train[-80%:]", shapes_dir)
    assert len(top10_last80) == 600 + 4800
    # The same slices with ReadInstruction.
    assert len(load(ri("train"), shapes_dir)) == 6000
    assert len(load(ri("train") + ri("test"), shapes_dir)) == 7000
    assert len(load(ri("train", from_=10, to=20, unit="abs"), shapes_dir)) == 10
    assert labels_of(load(ri("train", to=10, unit="%"), shapes_dir)) == labels_of(load("train[:10%]", shapes_dir))
    ri_ = ri("train", to=10, unit="%") + ri("train", from_=-80, unit="%")
    assert labels_of(load(ri_, shapes_dir)) == labels_of(top10_last80)


def test_ten_fold_cross_validation_partitions_the_split(shapes_dir):
    order = catalogue.ReadConfig(interleave_cycle_length=1)
    everything = [e["image"].tobytes() for e in load("train", shapes_dir, read_config=order)]
    vals = load([f"train[{k}%:{k + 10}%]" for k in range(0, 100, 10)], shapes_dir, read_config=order)
    trains = load([f"train[:{k}%]+train[{k + 10}%:]" for k in range(0, 100, 10)], shapes_dir, read_config=order)
    same_as_strings = load([ri("train", from_=k, to=k + 10, unit="%") for k in range(0, 100, 10)], shapes_dir,
                           read_config=order)
    folds = [[e["image"].tobytes() for e in v] for v in vals]
    assert [len(f) for f in folds] == [600] * 10
    assert [x for fold in folds for x in fold] == everything  # disjoint, in order, covering the split
    for k, (fold, rest) in enumerate(zip(folds, trains)):
        rest = [e["image"].tobytes() for e in rest]
        assert len(rest) == 5400 and set(rest).isdisjoint(fold), k
    assert [[e["image"].tobytes() for e in v] for v in same_as_strings] == folds


class CatSixtyThousand(catalogue.GeneratorBasedBuilder):
    """As many train examples as MNIST, for the seed's even_splits assertion (small records: quick)."""

    VERSION = "1.0.0"

    def _info(self):
        return catalogue.DatasetInfo(builder=self, features=catalogue.FeaturesDict({"x": np.int64}))

    def _split_generators(self, dl_manager):
        return {"train": ((i, {"x": i}) for i in range(60_000))}


def test_even_splits_as_the_seed_asserts(shapes_dir):
    assert catalogue.even_splits("train", n=3) == ["train[0%:33%]", "train[33%:67%]", "train[67%:100%]"]
    list_of_split = catalogue.load("cat_sixty_thousand", split=catalogue.even_splits("train", n=3),
                                   data_dir=shapes_dir)
    for split in list_of_split:
        assert isinstance(split, Dataset)
    whole_trainset = catalogue.load("cat_sixty_thousand", split="train", data_dir=shapes_dir)
    assert len(whole_trainset) == 60000
    assert len(whole_trainset) * 0.33 == len(list_of_split[0])
    assert len(whole_trainset) * 0.34 == len(list_of_split[1])
    assert len(whole_trainset) * 0.33 == len(list_of_split[2])
    equal = load(catalogue.even_splits("test", n=3, drop_remainder=True), shapes_dir)
    assert [len(s) for s in equal] == [333, 333, 333]


def test_pct1_dropremainder_makes_thirty_percent_three_times_ten(shapes_dir):
    ten = load(ri("test", to=10, unit="%", rounding="pct1_dropremainder"), shapes_dir)
    thirty = load(ri("test", to=30, unit="%", rounding="pct1_dropremainder"), shapes_dir)
    assert len(thirty) == 3 * len(ten) == 300


def test_a_slice_is_the_same_records_whatever_the_file_order(shapes_dir, tmp_path):
    """Reproducibility: the slice picks records by absolute index; shuffle_files only reorders them."""
    data_dir = str(tmp_path)
    catalogue.builder("shapes", data_dir=data_dir).download_and_prepare(
        download_config=catalogue.DownloadConfig(num_shards=8))
    plain = load("train[25%:35%]", data_dir)
    shuffled = load("train[25%:35%]", data_dir, shuffle_files=True,
                    read_config=catalogue.ReadConfig(shuffle_seed=3))
    one_shard = load("train[25%:35%]", shapes_dir)  # the same data prepared in 1 shard on "another machine"
    key = sorted
    records = key(e["image"].tobytes() for e in plain)
    assert key(e["image"].tobytes() for e in shuffled) == records
    assert key(e["image"].tobytes() for e in one_shard) == records


# --- load's arguments ------------------------------------------------------------------------------

def test_load_returns_what_its_arguments_ask(shapes_dir):
    everything = load(None, shapes_dir)
    assert set(everything) == {"train", "test"} and len(everything["test"]) == 1000
    ds, info = load("test", shapes_dir, with_info=True)
    assert info.splits["train"].num_examples == 6000 and info.splits["test"].num_shards == 1
    assert info.features["label"].names == ["circle", "square", "triangle"]
    element = next(iter(ds))
    assert set(element) == {"image", "label"} and element["image"].shape == (28, 28, 1)
    image, label = next(iter(load("test", shapes_dir, as_supervised=True)))
    assert image.dtype == np.uint8 and label.dtype == np.int64
    batches = list(load("test", shapes_dir, batch_size=64))
    assert batches[0]["image"].shape == (64, 28, 28, 1) and batches[-1]["image"].shape == (1000 % 64, 28, 28, 1)


def test_batch_size_minus_one_gives_the_whole_split_as_numpy(shapes_dir):
    (img_train, label_train), (img_test, label_test) = catalogue.as_numpy(catalogue.load(
        "shapes", split=["train", "test"], batch_size=-1, as_supervised=True, data_dir=shapes_dir))
    assert img_train.shape == (6000, 28, 28, 1) and label_train.shape == (6000,)
    assert img_test.shape == (1000, 28, 28, 1) and img_test.dtype == np.uint8
    assert np.bincount(label_train).min() > 1800  # three balanced classes


def test_as_numpy_iterates_a_dataset_again_and_again(shapes_dir):
    numpy_ds = catalogue.as_numpy(load("test[:5]", shapes_dir))
    assert len(numpy_ds) == 5
    first = [e["label"] for e in numpy_ds]
    assert [e["label"] for e in numpy_ds] == first
    assert catalogue.as_numpy(np.arange(3)).tolist() == [0, 1, 2]


def test_bad_arguments_are_named(shapes_dir):
    with pytest.raises(DatasetNotFoundError, match="no dataset named 'nope'"):
        catalogue.load("nope", data_dir=shapes_dir)
    with pytest.raises(ValueError, match="malformed dataset name"):
        catalogue.load("Shapes!", data_dir=shapes_dir)
    with pytest.raises((KeyError, ValueError), match="validation"):
        load("validation", shapes_dir)
    with pytest.raises(ValueError, match="batch_size"):
        load("test", shapes_dir, batch_size=0)
    with pytest.raises(ValueError, match="supervised"):
        catalogue.load("cat_configured", split="train", as_supervised=True, data_dir=shapes_dir)
    with pytest.raises(ValueError, match="input pipelines"):
        load("test", shapes_dir, read_config=catalogue.ReadConfig(
            input_context=catalogue.InputContext(input_pipeline_id=0, num_input_pipelines=2)))


# --- versions and configs ---------------------------------------------------------------------------

def test_versions_resolve_to_the_highest_supported_match(tmp_path):
    data_dir = str(tmp_path)
    assert catalogue.builder("cat_numbers", data_dir=data_dir).version == "1.0.0"  # canonical by default
    assert catalogue.builder("cat_numbers:1.*.*", data_dir=data_dir).version == "1.1.0"
    assert catalogue.builder("cat_numbers:2.*.*", data_dir=data_dir).version == "2.0.0"
    assert catalogue.builder("cat_numbers:1.0.0", data_dir=data_dir).version == "1.0.0"
    with pytest.raises(UnsupportedVersionError) as raised:
        catalogue.builder("cat_numbers:3.*.*", data_dir=data_dir)
    for available in ("2.0.0", "1.1.0", "1.0.0", "0.9.0"):
        assert available in str(raised.value)


def test_patch_minor_major_guarantees(tmp_path):
    """What the seed promises across versions, on a builder that keeps the promises."""
    data_dir = str(tmp_path)
    v100 = catalogue.load("cat_numbers:1.0.0", split="train[10:20]", data_dir=data_dir)
    v110 = catalogue.load("cat_numbers:1.1.0", split="train[10:20]", data_dir=data_dir)
    v200 = catalogue.load("cat_numbers:2.0.0", split="train[10:20]", data_dir=data_dir)
    old = [(int(e["x"]), int(e["y"])) for e in v100]
    # MINOR: the same records for a slice, with a feature more.
    assert [(int(e["x"]), int(e["y"])) for e in v110] == old
    assert all(bool(e["odd"]) == bool(e["x"] % 2) for e in v110)
    # MAJOR: the same slice may hold other values.
    assert [int(e["x"]) for e in v200] == [x for x, _ in old]
    assert [int(e["y"]) for e in v200] != [y for _, y in old]


def test_an_unprepared_version_lists_what_is_prepared(tmp_path):
    data_dir = str(tmp_path)
    catalogue.builder("cat_numbers:2.0.0", data_dir=data_dir).download_and_prepare()
    with pytest.raises(UnsupportedVersionError, match="prepared versions: 2.0.0"):
        catalogue.load("cat_numbers:1.0.0", split="train", data_dir=data_dir, download=False)
    with pytest.raises(ValueError, match="cannot prepare it"):
        catalogue.load("cat_numbers:0.9.0", split="train", data_dir=data_dir)


def test_configs_have_their_own_versions_and_directories(tmp_path):
    data_dir = str(tmp_path)
    small = catalogue.load("cat_configured/small:1.*.*", split="train", data_dir=data_dir, with_info=True)
    assert small[1].version == "1.2.0" and len(small[0]) == 10
    large, info = catalogue.load("cat_configured/large", split="train", data_dir=data_dir, with_info=True)
    assert info.version == "2.0.0" and len(large) == 100 and info.config_name == "large"
    assert os.path.isdir(os.path.join(data_dir, "cat_configured", "small", "1.2.0"))
    assert os.path.isdir(os.path.join(data_dir, "cat_configured", "large", "2.0.0"))
    assert len(catalogue.load("cat_configured", split="train", data_dir=data_dir)) == 10  # the first config
    with pytest.raises(ValueError, match="configs are: small, large"):
        catalogue.builder("cat_configured/medium", data_dir=data_dir)
    with pytest.raises(UnsupportedVersionError):
        catalogue.builder("cat_configured/large:1.*.*", data_dir=data_dir)


def test_prepared_data_loads_by_name_without_its_builder(tmp_path):
    """A directory prepared elsewhere (by TFDS, or by code not imported here) reads by name and version."""
    data_dir = str(tmp_path)
    shutil.copytree(os.path.join(REPO, "tests", "fixtures", "catalogue", "tfds"), data_dir, dirs_exist_ok=True)
    ds, info = catalogue.load("zoo:1.*.*", split="test[:10]", data_dir=data_dir, with_info=True)
    assert info.name == "zoo" and len(list(ds)) == 10
    with pytest.raises(UnsupportedVersionError, match="1.0.0"):
        catalogue.load("zoo:2.*.*", data_dir=data_dir)


def test_registering_a_taken_name_is_an_error():
    with pytest.raises(ValueError, match="already registered"):
        type("Shapes", (catalogue.GeneratorBasedBuilder,), {"VERSION": "1.0.0"})
    assert "shapes" in catalogue.list_builders() and "cat_numbers" in catalogue.list_builders()


# --- reading: input pipelines, shuffling, autocaching -----------------------------------------------

@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("sharded"))
    catalogue.builder("shapes", data_dir=data_dir).download_and_prepare(
        download_config=catalogue.DownloadConfig(num_shards=8))
    return data_dir


def test_input_pipelines_read_disjoint_shares_of_the_slice(sharded_dir):
    whole = sorted(e["image"].tobytes() for e in load("train[:50%]", sharded_dir))
    shares = []
    for pipeline in range(2):
        config = catalogue.ReadConfig(input_context=catalogue.InputContext(input_pipeline_id=pipeline,
                                                                           num_input_pipelines=2))
        shares.append([e["image"].tobytes() for e in load("train[:50%]", sharded_dir, read_config=config)])
    assert [len(s) for s in shares] == [1500, 1500]  # each a quarter of train: the seed's example
    assert sorted(shares[0] + shares[1]) == whole


def test_shuffle_files_reorders_files_each_epoch_deterministically_with_a_seed(sharded_dir):
    def epochs(ds, n):
        return [[e["image"].tobytes() for e in ds] for _ in range(n)]

    config = catalogue.ReadConfig(shuffle_seed=11)
    a = epochs(load("train", sharded_dir, shuffle_files=True, read_config=config), 3)
    b = epochs(load("train", sharded_dir, shuffle_files=True, read_config=config), 3)
    assert a == b  # the same seed: the same sequence of orders
    assert a[0] != a[1] or a[1] != a[2]  # reshuffled between epochs
    plain = [e["image"].tobytes() for e in load("train", sharded_dir)]
    assert all(sorted(epoch) == sorted(plain) for epoch in a)
    fixed = epochs(load("train", sharded_dir, shuffle_files=True, read_config=catalogue.ReadConfig(
        shuffle_seed=11, shuffle_reshuffle_each_iteration=False)), 2)
    assert fixed[0] == fixed[1]


def _remove_shards(data_dir: str) -> None:
    version_dir = os.path.join(data_dir, "shapes", "1.0.0")
    for name in os.listdir(version_dir):
        if ".tfrecord-" in name:
            os.unlink(os.path.join(version_dir, name))


def test_small_datasets_are_cached_after_the_first_pass(tmp_path):
    data_dir = str(tmp_path)
    catalogue.builder("shapes", data_dir=data_dir).download_and_prepare()
    cached = load("test", data_dir)
    uncached = load("test", data_dir, read_config=catalogue.ReadConfig(try_autocaching=False))
    shuffled = load("test", data_dir, shuffle_files=True)  # one shard: shuffling files is a no-op, cached
    first = [e["label"] for e in cached]
    assert len(list(uncached)) == 1000 and len(list(shuffled)) == 1000
    _remove_shards(data_dir)
    assert [e["label"] for e in cached] == first  # the second pass reads memory, not the deleted files
    assert len(list(shuffled)) == 1000
    with pytest.raises(FileNotFoundError):
        list(uncached)


def test_shuffling_several_files_is_not_cached(tmp_path):
    data_dir = str(tmp_path)
    catalogue.builder("shapes", data_dir=data_dir).download_and_prepare(
        download_config=catalogue.DownloadConfig(num_shards=4))
    ds = load("test", data_dir, shuffle_files=True)
    assert len(list(ds)) == 1000
    _remove_shards(data_dir)
    with pytest.raises(FileNotFoundError):
        list(ds)


# --- benchmark -----------------------------------------------------------------------------------

def test_benchmark_reports_any_iterable(shapes_dir):
    ds = load("train", shapes_dir).batch(32).prefetch(2)
    out = io.StringIO()
    first = catalogue.benchmark(ds, batch_size=32, file=out)
    assert first.num_iter == 188 and first.num_examples == 188 * 32 and first.batch_size == 32
    assert 0 < first.first_batch_s <= first.total_s and first.examples_per_s > 0
    assert "Examples/sec (first included)" in out.getvalue()
    # The second run reads the auto-cache: the files are not needed any more.
    _remove_shards_copy = os.path.join(shapes_dir, "shapes", "1.0.0")
    saved = {n: open(os.path.join(_remove_shards_copy, n), "rb").read()
             for n in os.listdir(_remove_shards_copy) if ".tfrecord-" in n}
    try:
        _remove_shards(shapes_dir)
        second = catalogue.benchmark(ds, batch_size=32, file=out)
        assert second.num_examples == first.num_examples
    finally:
        for name, data in saved.items():
            with open(os.path.join(_remove_shards_copy, name), "wb") as f:
                f.write(data)
    limited = catalogue.benchmark(catalogue.as_numpy(load("test", shapes_dir)), num_iter=10, file=out)
    assert limited.num_iter == 10 and limited.batch_size == 1
    assert catalogue.benchmark(iter(range(5)), file=out).num_examples == 5
    with pytest.raises(ValueError, match="batch_size"):
        catalogue.benchmark(ds, batch_size=0)


# --- preparation ----------------------------------------------------------------------------------

def test_a_failed_preparation_leaves_nothing(tmp_path):
    data_dir = str(tmp_path)
    b = catalogue.builder("cat_broken", data_dir=data_dir)
    with pytest.raises(RuntimeError, match="the source went away"):
        b.download_and_prepare()
    assert not b.is_prepared
    assert os.listdir(os.path.join(data_dir, "cat_broken")) == []  # no incomplete directory left
    with pytest.raises(FileNotFoundError, match="not prepared"):
        b.as_dataset(split="train")


def test_duplicate_keys_are_refused(tmp_path):
    class CatDuplicates(catalogue.GeneratorBasedBuilder):
        VERSION = "1.0.0"

        def _info(self):
            return catalogue.DatasetInfo(builder=self, features=catalogue.FeaturesDict({"x": np.int64}))

        def _split_generators(self, dl_manager):
            return {"train": ((i % 3, {"x": i}) for i in range(5))}

    with pytest.raises(ValueError, match="two examples have the key 0"):
        CatDuplicates(data_dir=str(tmp_path)).download_and_prepare()


def test_shards_that_disagree_with_their_metadata_are_data_loss(tmp_path):
    data_dir = str(tmp_path)
    b = catalogue.builder("cat_numbers", data_dir=data_dir)
    b.download_and_prepare()
    info_path = os.path.join(b.data_dir, "dataset_info.json")
    text = open(info_path).read()
    with open(info_path, "w") as f:
        f.write(text.replace('"300"', '"301"'))
    with pytest.raises(DataLossError, match="dataset_info.json says 301"):
        list(catalogue.load("cat_numbers", split="train", data_dir=data_dir))


def test_records_are_ordered_by_key_hash_even_when_spilled(tmp_path):
    records = [(f"k{i}", f"record {i}".encode()) for i in range(2000)]
    in_memory = SplitWriter(str(tmp_path), "d", "train", KeyOrder("train"))
    spilled = SplitWriter(str(tmp_path), "e", "train", KeyOrder("train"), max_memory_bytes=1000)
    for key, record in records:
        in_memory.add(key, record)
        spilled.add(key, record)
    a, b = in_memory.finish(num_shards=3), spilled.finish(num_shards=3)
    assert a.shard_lengths == b.shard_lengths == (667, 666, 667)
    files = [sorted(glob.glob(str(tmp_path / f"{name}-train.tfrecord-*"))) for name in ("d", "e")]
    assert len(files[0]) == len(files[1]) == 3
    order = KeyOrder("train")
    expected = [record for _, record in sorted(records, key=lambda kr: order.hash_key(kr[0]))]
    assert list(TFRecordDataset(files[0])) == list(TFRecordDataset(files[1])) == expected
    assert not [p for p in os.listdir(tmp_path) if p.startswith("buckets")]


def test_number_of_shards_follows_tfds_rule():
    assert number_of_shards(10 << 20, 1000) == 1
    assert number_of_shards(300 << 20, 100_000) == 4   # 64 MiB..1 GiB shards, a power of two
    assert number_of_shards(300 << 20, 3) == 2         # never more shards than records allow
    assert number_of_shards(3000 << 30, 10_000_000) == 3072  # past 1,024 shards: a multiple of 1,024


def test_downloads_are_fetched_once_and_extracted(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.csv").write_text("1,2\n3,4\n")
    archive = tmp_path / "data.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source / "train.csv", arcname="train.csv")
    manager = catalogue.DownloadManager(str(tmp_path / "downloads"))
    paths = manager.download_and_extract({"data": f"file://{archive}"})
    assert open(os.path.join(paths["data"], "train.csv")).read() == "1,2\n3,4\n"
    archive.unlink()  # the second call reuses the download
    assert manager.download_and_extract({"data": f"file://{archive}"}) == paths
    with pytest.raises(FileNotFoundError, match="downloaded by hand"):
        manager.manual_dir


SLOW_PREPARE = """
import sys, time
import numpy as np
sys.path.insert(0, {repo!r})
from dataservice import catalogue

class CatSlow(catalogue.GeneratorBasedBuilder):
    VERSION = "1.0.0"
    def _info(self):
        return catalogue.DatasetInfo(builder=self, features=catalogue.FeaturesDict({{"x": np.int64}}))
    def _split_generators(self, dl_manager):
        return {{"train": self._generate_examples()}}
    def _generate_examples(self):
        for i in range(1000):
            if i == 10:
                print("generating", flush=True)
                time.sleep(60)
            yield i, {{"x": i}}

CatSlow(data_dir={data_dir!r}).download_and_prepare()
"""


@pytest.mark.slow
def test_a_killed_preparation_is_never_read_and_is_swept(tmp_path):
    data_dir = str(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", SLOW_PREPARE.format(repo=REPO, data_dir=data_dir)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "generating"
        parent = os.path.join(data_dir, "cat_slow")
        wait_until(lambda: any(e.startswith("incomplete.") for e in os.listdir(parent)), 10, "an incomplete dir")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not os.path.exists(os.path.join(data_dir, "cat_slow", "1.0.0"))
    with pytest.raises(DatasetNotFoundError, match="nothing is prepared"):
        catalogue.load("cat_slow", data_dir=data_dir)  # not registered here, and nothing prepared

    class CatSlow(catalogue.GeneratorBasedBuilder):  # the same dataset, quick this time
        VERSION = "1.0.0"

        def _info(self):
            return catalogue.DatasetInfo(builder=self, features=catalogue.FeaturesDict({"x": np.int64}))

        def _split_generators(self, dl_manager):
            return {"train": ((i, {"x": i}) for i in range(1000))}

    assert len(catalogue.load("cat_slow", split="train", data_dir=data_dir)) == 1000
    assert os.listdir(os.path.join(data_dir, "cat_slow")) == ["1.0.0"]  # the killed attempt was swept


# --- the command line ------------------------------------------------------------------------------

USER_BUILDERS = """
import numpy as np
from dataservice import catalogue

class MyCounts(catalogue.GeneratorBasedBuilder):
    VERSION = "2.1.0"
    def _info(self):
        return catalogue.DatasetInfo(builder=self, features=catalogue.FeaturesDict({"n": np.int64}))
    def _split_generators(self, dl_manager):
        return {"train": ((i, {"n": i}) for i in range(50)), "validation": ((i, {"n": -i}) for i in range(7))}
"""


def run_cli(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, str(tmp_path)]))
    env.pop("DATASERVICE_DATA_DIR", None)
    return subprocess.run([sys.executable, "-m", "dataservice", "datasets", *args], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.slow
def test_the_datasets_command_builds_and_lists(tmp_path):
    data_dir = str(tmp_path / "data")
    (tmp_path / "my_builders.py").write_text(USER_BUILDERS)
    built = run_cli(tmp_path, "build", "shapes", "--data-dir", data_dir, "--num-shards", "2")
    assert built.returncode == 0, built.stderr
    assert built.stdout.startswith(f"prepared shapes:1.0.0 in {data_dir}/shapes/1.0.0: train 6,000 examples "
                                   "(2 shards), test 1,000 examples (2 shards)")
    mine = run_cli(tmp_path, "build", "my_counts:2.*.*", "--data-dir", data_dir, "--import", "my_builders")
    assert mine.returncode == 0 and "train 50 examples (1 shard), validation 7 examples" in mine.stdout, mine
    listed = run_cli(tmp_path, "list", "--data-dir", data_dir, "--json", "--import", "my_builders")
    assert listed.returncode == 0, listed.stderr
    listing = json.loads(listed.stdout)
    assert {b["name"] for b in listing["builders"]} >= {"shapes", "my_counts"}
    assert {(p["name"], p["version"]): p["splits"] for p in listing["prepared"]} == {
        ("shapes", "1.0.0"): {"train": {"examples": 6000, "shards": 2}, "test": {"examples": 1000, "shards": 2}},
        ("my_counts", "2.1.0"): {"train": {"examples": 50, "shards": 1}, "validation": {"examples": 7, "shards": 1}},
    }
    assert len(catalogue.load("shapes", split="test", data_dir=data_dir)) == 1000  # what the command prepared
    # Without --import the builder is unknown, but the prepared data is found: nothing to do.
    again = run_cli(tmp_path, "build", "my_counts", "--data-dir", data_dir)
    assert again.returncode == 0 and again.stdout.startswith("already prepared my_counts:2.1.0"), again
    wrong = run_cli(tmp_path, "build", "nope", "--data-dir", data_dir)
    assert wrong.returncode == 2 and "error: no dataset named 'nope'" in wrong.stderr and "Traceback" not in wrong.stderr
    version = run_cli(tmp_path, "build", "shapes:2.*.*", "--data-dir", data_dir)
    assert version.returncode == 2 and "Available versions: 1.0.0" in version.stderr


def test_a_preparation_leaves_a_live_concurrent_preparation_alone(tmp_path):
    """Another process preparing the same dataset holds its attempt's lock: it is not swept."""
    from dataservice.data.attempts import Attempt

    parent = tmp_path / "cat_numbers"
    parent.mkdir()
    other = Attempt(str(parent), prefix="incomplete.", suffix="_1.0.0")  # a live writer's attempt
    try:
        b = catalogue.builder("cat_numbers", data_dir=str(tmp_path))
        b.download_and_prepare()
        assert b.is_prepared and os.path.isdir(other.directory)
        assert not other.commit(b.data_dir)  # the place is taken: the latecomer discards its attempt
        assert sorted(os.listdir(parent)) == ["1.0.0"]
    finally:
        other.discard()
