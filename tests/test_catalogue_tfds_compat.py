"""The catalogue against TensorFlow Datasets itself, through fixtures TFDS made (no TensorFlow here).

``tests/fixtures/catalogue/`` holds the ``zoo`` dataset (every feature kind) twice: prepared by TFDS
4.9.10 (``tfds/``) and by our builder (``ours/``), with what ``tfds.load`` returned from each —
every record decoded, and the record ids of a set of slices in the order TFDS yielded them
(``tests/fixtures/make_catalogue_fixtures.py`` says how they were made).

Percent boundaries round as TFDS 4.9.10 rounds them, a half to even (Python's ``round``): of 101
records ``[49%:50%]`` is record 49 alone, and ``[:50%]`` is records 0 to 49. So every slice, those
whose boundary falls exactly on half a record included, selects TFDS's records;
``catalogue/tfds_slice_boundaries.json`` (``tests/fixtures/record_tfds_slice_boundaries.py``) holds
where TFDS puts the boundaries of such slices on every split length up to 250, and a few larger.
"""

from __future__ import annotations

import base64
import filecmp
import hashlib
import json
import os
from fractions import Fraction

import numpy as np
import pytest

from dataservice import catalogue
from dataservice.catalogue import splits as splits_lib
from tests.catalogue_zoo import FIXTURES, Zoo, zoo_examples

#: Pipelines run in this process; no server is talked to (tests/grpc_leak_guard.py checks it).
pytestmark = pytest.mark.no_grpc

TFDS_DIR = os.path.join(FIXTURES, "tfds", "zoo", "1.0.0")
OURS_DIR = os.path.join(FIXTURES, "ours", "zoo", "1.0.0")
NO_CACHE = catalogue.ReadConfig(try_autocaching=False)


def load_json(name: str) -> dict:
    with open(os.path.join(FIXTURES, name)) as f:
        return json.load(f)


def encode(value):
    """As the fixture script encodes a decoded value (bytes in base64; arrays by dtype, shape, digest)."""
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return {"bytes": base64.b64encode(value).decode()}
    array = np.asarray(value)
    return {"dtype": array.dtype.str, "shape": list(array.shape),
            "sha256": hashlib.sha256(array.tobytes()).hexdigest()[:16]}


def ids(ds) -> list[str]:
    return [e["id"].decode() for e in ds]


def has_half_tie(spec: str, lengths: dict) -> bool:
    """Whether a percent boundary of ``spec`` lands exactly on half a record (where the roundings differ)."""
    for part in spec.split("+"):
        name, _, rest = part.partition("[")
        for bound in rest.rstrip("]").split(":"):
            if bound.endswith("%"):
                exact = Fraction(bound[:-1]) * lengths[name] / 100
                if exact.denominator == 2:
                    return True
    return False


@pytest.fixture(scope="module", params=[("tfds", TFDS_DIR, "tfds_expected.json"),
                                        ("ours", OURS_DIR, "ours_read_by_tfds.json")], ids=["tfds", "ours"])
def prepared(request):
    which, directory, expected = request.param
    return which, catalogue.builder_from_directory(directory), load_json(expected)


def test_every_record_decodes_as_tfds_decoded_it(prepared):
    _, builder, expected = prepared
    seen = {}
    for split in ("train", "test"):
        for example in builder.as_dataset(split=split, read_config=NO_CACHE):
            seen[example["id"].decode()] = encode(example)
    assert seen.keys() == expected["records"].keys()
    for key, record in expected["records"].items():
        assert seen[key] == record, key


def test_the_info_is_what_tfds_wrote(prepared):
    _, builder, expected = prepared
    info = builder.info
    assert {name: list(s.shard_lengths) for name, s in info.splits.items()} == expected["splits"]
    assert str(info.version) == expected["version"] == "1.0.0"
    assert info.supervised_keys == ("image", "label")
    assert info.features["label"].names == zoo_examples.LABELS
    assert info.splits["test"].num_examples == 101


def test_slices_give_the_records_tfds_gave_in_its_order(prepared):
    _, builder, expected = prepared
    compared = 0
    for spec, expected_ids in expected["slices"].items():
        got = ids(builder.as_dataset(split=spec, read_config=NO_CACHE))
        assert got == expected_ids, spec
        compared += 1
    assert compared >= 25


def test_half_ties_round_to_even_as_tfds_does(prepared):
    """A boundary on exactly half a record: TFDS's records, on TFDS's own data (test has 101 records)."""
    _, builder, expected = prepared
    lengths = {name: s.num_examples for name, s in builder.info.splits.items()}
    ties = [spec for spec in expected["slices"] if has_half_tie(spec, lengths)]
    assert "test[49%:50%]" in ties and "train[40%:50%]" in ties
    # Record ids in on-disk order, to name records by absolute index.
    on_disk = {split: ids(builder.as_dataset(split=split, read_config=catalogue.ReadConfig(
        interleave_cycle_length=1, try_autocaching=False))) for split in ("train", "test")}
    assert expected["slices"]["test[49%:50%]"] == on_disk["test"][49:50]  # TFDS: 50.5 -> 50, record 49 alone
    assert ids(builder.as_dataset(split="test[49%:50%]")) == on_disk["test"][49:50]
    assert splits_lib.to_absolute("test[:50%]", lengths) == [splits_lib.AbsoluteInstruction("test", 0, 50)]
    for spec in ties:
        assert ids(builder.as_dataset(split=spec, read_config=NO_CACHE)) == expected["slices"][spec], spec


def test_percent_boundaries_fall_where_tfds_puts_them():
    """TFDS's own ReadInstruction.to_absolute, recorded for slices with ties, on every split length up to 250."""
    recorded = load_json("tfds_slice_boundaries.json")
    assert recorded["tfds_version"] == "4.9.10"
    compared = 0
    for rounding in ("closest", "pct1_dropremainder"):
        for key, answers in recorded[rounding].items():
            if rounding == "closest":
                instruction = splits_lib.ReadInstruction.from_spec(key)
            else:
                from_, to = (None if v == "None" else int(v) for v in key.split(":"))
                instruction = splits_lib.ReadInstruction("train", from_=from_, to=to, unit="%", rounding=rounding)
            for n, theirs in zip(recorded["lengths"], answers):
                if isinstance(theirs, str):  # pct1_dropremainder under 100 examples: refused, as here
                    with pytest.raises(ValueError, match="at least 100 examples"):
                        splits_lib.to_absolute(instruction, {"train": n})
                    continue
                (ours,) = splits_lib.to_absolute(instruction, {"train": n})
                # The same records (ranges compare as sequences): TFDS leaves an empty slice's boundaries as
                # computed ([1, 0) of 2 records for [-37.5%:-12.5%]), ours end where they start.
                assert range(ours.from_, ours.to) == range(*theirs), (key, rounding, n, theirs)
                compared += 1
    assert compared > 7000


def test_input_pipelines_read_the_files_tfds_gave_them(prepared):
    _, builder, expected = prepared
    for name, expected_ids in expected["sharded"].items():
        spec, _, rest = name.partition(" pipeline ")
        context = catalogue.InputContext(input_pipeline_id=int(rest.split()[0]), num_input_pipelines=2)
        got = ids(builder.as_dataset(split=spec, read_config=catalogue.ReadConfig(input_context=context)))
        assert got == expected_ids, name


def test_input_pipelines_share_a_slice_of_the_files(prepared):
    """The seed's example: slicing first, then each of 2 pipelines reads its files of train[:50%]."""
    _, builder, expected = prepared
    parts = []
    for pipeline in range(2):
        context = catalogue.InputContext(input_pipeline_id=pipeline, num_input_pipelines=2)
        parts.append(ids(builder.as_dataset(split="train[:50%]", read_config=catalogue.ReadConfig(
            input_context=context, try_autocaching=False))))
    whole = ids(builder.as_dataset(split="train[:50%]", read_config=NO_CACHE))
    assert sorted(parts[0] + parts[1]) == sorted(whole) and not set(parts[0]) & set(parts[1])
    assert all(len(p) < len(whole) * 0.6 for p in parts)  # about a quarter of train each
    # Pipeline 1 reads whole files (shards 1 and 3 are not cut by the slice): TFDS's records exactly.
    assert parts[1] == expected["sharded"]["train[:50%] pipeline 1 of 2"]


def test_interleave_parameters_give_tfds_order(prepared):
    _, builder, expected = prepared
    config = catalogue.ReadConfig(interleave_cycle_length=3, interleave_block_length=2, try_autocaching=False)
    assert ids(builder.as_dataset(split="train", read_config=config)) == expected["orders"]["train cycle 3 block 2"]


def test_our_preparation_is_tfds_record_for_record():
    """Same generator, same keys: our shards hold the records TFDS's hold, in the same order (the
    bytes differ a little: TensorFlow's PNG encoder is not Pillow's)."""
    ours = catalogue.builder_from_directory(OURS_DIR)
    theirs = catalogue.builder_from_directory(TFDS_DIR)
    assert {n: s.shard_lengths for n, s in ours.info.splits.items()} == \
        {n: s.shard_lengths for n, s in theirs.info.splits.items()}
    with open(os.path.join(OURS_DIR, "features.json")) as a, open(os.path.join(TFDS_DIR, "features.json")) as b:
        assert json.load(a) == json.load(b)
    for split in ("train", "test"):
        in_order = catalogue.ReadConfig(interleave_cycle_length=1, try_autocaching=False)
        assert ids(ours.as_dataset(split=split, read_config=in_order)) == \
            ids(theirs.as_dataset(split=split, read_config=in_order))


def test_preparing_again_gives_the_fixture(tmp_path):
    """Today's builder still prepares the checked-in fixture (that TFDS read): same files, same records."""
    zoo = Zoo(data_dir=str(tmp_path))
    zoo.download_and_prepare(download_config=catalogue.DownloadConfig(num_shards=zoo_examples.NUM_SHARDS))
    assert sorted(os.listdir(OURS_DIR)) == sorted(os.listdir(zoo.data_dir))
    _, mismatch, errors = filecmp.cmpfiles(OURS_DIR, zoo.data_dir, ["features.json", "label.labels.txt"],
                                           shallow=False)
    assert not mismatch and not errors, (mismatch, errors)
    fixture = catalogue.builder_from_directory(OURS_DIR)
    in_order = catalogue.ReadConfig(interleave_cycle_length=1, try_autocaching=False)
    for split in ("train", "test"):
        again = [encode(e) for e in zoo.as_dataset(split=split, read_config=in_order)]
        assert again == [encode(e) for e in fixture.as_dataset(split=split, read_config=in_order)]
