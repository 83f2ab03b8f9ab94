"""Split slicing: spec strings, ReadInstruction, rounding, even_splits and file instructions (the seed's rules).

Every selection is checked as the records it reads, against plain Python slicing of record ids.
"""

from __future__ import annotations

import pickle

import pytest

from dataservice.catalogue.splits import (
    AbsoluteInstruction,
    EvenSplit,
    FileInstruction,
    ReadInstruction,
    SplitSum,
    even_splits,
    file_instructions,
    to_absolute,
)

#: Pipelines run in this process; no server is talked to (tests/grpc_leak_guard.py checks it).
pytestmark = pytest.mark.no_grpc

ri = ReadInstruction
MNIST = {"train": 60000, "test": 10000}


def records(instruction, lengths) -> list[tuple[str, int]]:
    """The (split, index) of every record the instruction reads, in order."""
    return [(a.split_name, i) for a in to_absolute(instruction, lengths) for i in range(a.from_, a.to)]


def train_ids(instruction, n: int) -> list[int]:
    return [i for _, i in records(instruction, {"train": n})]


def spans(instruction, lengths=MNIST) -> list[tuple[str, int, int]]:
    return [(a.split_name, a.from_, a.to) for a in to_absolute(instruction, lengths)]


# The seed's split strings, their ReadInstruction forms, and what they select of MNIST.
SEED_EXAMPLES = [
    ("train", ri("train"), [("train", 0, 60000)]),
    ("train+test", ri("train") + ri("test"), [("train", 0, 60000), ("test", 0, 10000)]),
    ("train[10:20]", ri("train", from_=10, to=20, unit="abs"), [("train", 10, 20)]),
    ("train[:10%]", ri("train", to=10, unit="%"), [("train", 0, 6000)]),
    ("train[-80%:]", ri("train", from_=-80, unit="%"), [("train", 12000, 60000)]),
    ("train[:10%]+train[-80%:]", ri("train", to=10, unit="%") + ri("train", from_=-80, unit="%"),
     [("train", 0, 6000), ("train", 12000, 60000)]),
    ("train[4_2:9_9]", ri("train", from_=42, to=99), [("train", 42, 99)]),
    ("train[:0.5%]", ri("train", to=0.5, unit="%"), [("train", 0, 300)]),
]


@pytest.mark.parametrize("spec, instruction, expected", SEED_EXAMPLES, ids=[e[0] for e in SEED_EXAMPLES])
def test_the_seeds_strings_and_read_instructions(spec, instruction, expected):
    parsed = ReadInstruction.from_spec(spec)
    assert parsed == instruction and hash(parsed) == hash(instruction)
    assert spans(spec) == spans(parsed) == spans(instruction) == expected
    assert instruction.to_absolute(MNIST) == to_absolute(spec, MNIST)


def test_specs_print_back_as_themselves():
    for spec in ["train", "train+test", "train[10:20]", "train[:10%]", "train[-80%:]", "train[:10%]+train[-80%:]",
                 "train[:0.5%]", "train[10:]", "train[-5:-1]", "test[33.3%:66.7%]", "train[:0.00001%]",
                 "train+test+validation[1:2]", "all"]:
        parsed = ReadInstruction.from_spec(spec)
        assert str(parsed) == spec
        assert ReadInstruction.from_spec(str(parsed)) == parsed
    assert str(ReadInstruction.from_spec("train[4_2:9_9]")) == "train[42:99]"
    assert str(ReadInstruction.from_spec("train[:10.0%]")) == "train[:10%]"
    assert str(ReadInstruction.from_spec("train[:.5%]")) == "train[:0.5%]"
    assert ReadInstruction.from_spec("train + test") == ReadInstruction.from_spec("train+test")


def test_reprs_are_readable():
    assert repr(ri("train", to=10, unit="%")) == "ReadInstruction('train[:10%]')"
    pct1 = ri("train", to=10, unit="%", rounding="pct1_dropremainder")
    # A spec string cannot carry the rounding, so str() falls back to the repr.
    assert repr(pct1) == str(pct1) == "ReadInstruction('train[:10%]', rounding='pct1_dropremainder')"
    assert repr(ri("train") + "test[:5]") == "SplitSum('train+test[:5]')"
    assert repr(AbsoluteInstruction("train", 1, 2)) == "AbsoluteInstruction('train', 1, 2)"
    assert str(AbsoluteInstruction("train", 1, 2)) == "train[1:2]"
    assert spans(str(AbsoluteInstruction("train", 1, 2))) == [("train", 1, 2)]


def test_equality_is_by_value():
    assert ri("train", to=10, unit="%") == ri("train", to=10.0, unit="%")
    assert ri("train", to=10, unit="%") != ri("train", to=10, unit="%", rounding="pct1_dropremainder")
    assert ri("train", to=10, unit="%") != ri("train", to=10, unit="abs")
    assert ri("train") != ri("test") and ri("train") != "train"
    assert len({ri("train[:10%]".split("[")[0], to=10, unit="%"), ReadInstruction.from_spec("train[:10%]")}) == 1


def test_addition_with_instructions_and_strings():
    a, b, c = ri("train", to=10, unit="%"), ri("test"), ri("validation", from_=5)
    assert a + "test" == a + b == ReadInstruction.from_spec("train[:10%]+test")
    assert "test" + a == ReadInstruction.from_spec("test+train[:10%]")
    assert (a + b) + c == a + (b + c) == a + "test+validation[5:]"
    assert isinstance(a + b, SplitSum) and (a + b + c).parts == (a, b, c)
    # Order matters: parts are read one after the other.
    assert a + b != b + a
    lengths = {"train": 100, "test": 3, "validation": 7}
    assert records(a + b + c, lengths) == records(a, lengths) + records(b, lengths) + records(c, lengths)
    # The same slice twice is read twice.
    assert train_ids("train[:2]+train[:2]", 10) == [0, 1, 0, 1]
    with pytest.raises(TypeError, match="only split specs"):
        a + 5
    with pytest.raises(TypeError, match="only split specs"):
        5 + a
    with pytest.raises(ValueError, match="Invalid split spec 'test\\[5\\]'"):
        a + "test[5]"


def test_ten_fold_cross_validation_partitions_the_split():
    n = 60000
    every = set(range(n))
    val_specs = [f"train[{k}%:{k + 10}%]" for k in range(0, 100, 10)]
    train_specs = [f"train[:{k}%]+train[{k + 10}%:]" for k in range(0, 100, 10)]
    val_ris = [ri("train", from_=k, to=k + 10, unit="%") for k in range(0, 100, 10)]
    train_ris = [ri("train", to=k, unit="%") + ri("train", from_=k + 10, unit="%") for k in range(0, 100, 10)]
    assert [ReadInstruction.from_spec(s) for s in val_specs] == val_ris
    assert [ReadInstruction.from_spec(s) for s in train_specs] == train_ris
    for lengths_n in (n, 101, 12345):
        folds = [train_ids(v, lengths_n) for v in val_ris]
        assert sorted(i for fold in folds for i in fold) == list(range(lengths_n))  # disjoint, and cover it all
        for val, train in zip(val_ris, train_ris):
            val_ids, train_ids_ = train_ids(val, lengths_n), train_ids(train, lengths_n)
            assert sorted(val_ids + train_ids_) == list(range(lengths_n))
    assert all(len(train_ids(v, n)) == 6000 for v in val_ris)
    assert all(set(train_ids(t, n)) == every - set(train_ids(v, n)) for v, t in zip(val_ris, train_ris))


BAD_SPECS = [
    ("train[5]", "'train\\[5:6\\]'"),
    ("train[5%]", "single index"),
    ("train[10%:20]", "mixes a percentage and an absolute index"),
    ("train[1shard:]", "by shard"),
    ("train[:]", "write 'train' for the whole split"),
    ("train[]", "empty brackets"),
    ("train[1:2:3]", "no step"),
    ("train[1.5:3]", "fractions need '%'"),
    ("train[:101%]", "\\[-100, 100\\]"),
    ("train[-100.5%:]", "\\[-100, 100\\]"),
    ("train [1:2]", "cannot read"),
    ("train+", "empty part"),
    ("+train", "empty part"),
    ("", "empty part"),
    ("all[:50%]", "'all' \\(every split\\) cannot be sliced"),
    ("train[_5:]", "not an integer"),
    ("train[--5:]", "not a number"),
    ("train[:1e2%]", "not a number"),
    ("train[:1.2.3%]", "not a percentage"),
    ("train[a:b]", "not a number"),
    ("train[1:2]]", "cannot read"),
    ("train[[1:2]", "cannot read"),
    ("train,test", "cannot read"),
]


@pytest.mark.parametrize("spec, reason", BAD_SPECS, ids=[s or "<empty>" for s, _ in BAD_SPECS])
def test_bad_specs_quote_the_spec_and_the_accepted_forms(spec, reason):
    with pytest.raises(ValueError, match=reason) as info:
        ReadInstruction.from_spec(spec)
    message = str(info.value)
    assert f"Invalid split spec {spec!r}" in message
    assert "accepted forms: 'train', 'train+test', 'train[10:20]', 'train[:10%]'" in message
    with pytest.raises(ValueError, match="Invalid split spec"):
        to_absolute(spec, MNIST)


def test_from_spec_takes_strings_and_splits_only():
    instruction = ri("train")
    assert ReadInstruction.from_spec(instruction) is instruction
    with pytest.raises(TypeError, match="'train\\[:10%\\]'"):
        ReadInstruction.from_spec(["train"])


def test_read_instruction_arguments_are_validated():
    with pytest.raises(ValueError, match="unit must be 'abs'.*'%'.*not supported"):
        ri("train", to=1, unit="shard")
    with pytest.raises(ValueError, match="unit must be"):
        ri("train", to=1, unit="percent")
    with pytest.raises(ValueError, match="rounding must be 'closest' or 'pct1_dropremainder'"):
        ri("train", to=1, unit="%", rounding="floor")
    with pytest.raises(TypeError, match="unit='%'"):
        ri("train", to=1.5)
    with pytest.raises(TypeError, match="number or None"):
        ri("train", to="10")
    with pytest.raises(TypeError, match="number or None"):
        ri("train", to=True)
    for bad in (101, -100.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"\[-100, 100\]"):
            ri("train", from_=bad, unit="%")
    with pytest.raises(ValueError, match="whole percentages"):
        ri("train", to=0.5, unit="%", rounding="pct1_dropremainder")
    with pytest.raises(ValueError, match=r"use ReadInstruction.from_spec\('train\[:10%\]'\)"):
        ri("train[:10%]")
    with pytest.raises(ValueError, match="split name"):
        ri("")
    with pytest.raises(TypeError, match="split_name must be a str"):
        ri(5)
    with pytest.raises(ValueError, match="cannot be sliced"):
        ri("all", to=5)
    # Percentages of exactly +-100 and integer-valued floats for pct1 are fine.
    assert spans(ri("train", from_=-100, to=100, unit="%")) == [("train", 0, 60000)]
    assert spans(ri("train", to=10.0, unit="%", rounding="pct1_dropremainder")) == [("train", 0, 6000)]


def test_closest_rounds_a_half_to_even_as_tfds_does():
    # 101 examples, [49%:50%]: 49.49 -> 49, 50.5 -> 50, so record 49 alone (tfds.load's); [:50%] is [0:50].
    assert train_ids("train[49%:50%]", 101) == [49]
    assert train_ids(ri("train", from_=49, to=50, unit="%", rounding="closest"), 101) == [49]
    assert spans("train[:50%]", {"train": 101}) == [("train", 0, 50)]
    assert train_ids("train[:0.5%]", 100) == []    # 0.5 -> 0
    assert train_ids("train[:1.5%]", 100) == [0, 1]  # 1.5 -> 2
    assert train_ids("train[:50%]", 3) == [0, 1]   # 1.5 -> 2
    # In floating point, as TFDS: 10.1 * 500 / 100.0 is 50.49999..., so 50 records.
    assert len(train_ids("train[:10.1%]", 500)) == 50


# (spec, length, expected [from, to)) away from ties; TFDS 4.9.10 gives the same.
CLOSEST = [
    ("train[:10%]", 101, (0, 10)), ("train[:30%]", 101, (0, 30)), ("train[-80%:]", 101, (20, 101)),
    ("train[33%:67%]", 10, (3, 7)), ("train[:33.3%]", 7, (0, 2)), ("train[-1%:]", 260, (257, 260)),
    ("train[12.5%:]", 10, (1, 10)), ("train[:0.1%]", 1001, (0, 1)), ("train[:0.1%]", 1499, (0, 1)),
    ("train[:0.1%]", 1501, (0, 2)), ("train[-99.9%:-0.1%]", 3000, (3, 2997)), ("train[67%:]", 1, (1, 1)),
]


@pytest.mark.parametrize("spec, n, expected", CLOSEST)
def test_closest_rounds_to_the_nearest_record(spec, n, expected):
    assert spans(spec, {"train": n}) == [("train", *expected)]


def test_a_negative_percentage_is_its_positive_counterpart_but_at_ties():
    # p% and (p - 100)% name the same record, except where a boundary falls on half a record of a split of
    # odd length: both round to even, from opposite ends (of 101 records, 50% is 50.5 -> 50 and -50% is
    # -50.5 -> -50, so record 51).
    compared = ties = 0
    for n in range(0, 302):
        for p in (0, 0.5, 1, 12.5, 20, 49.5, 50, 80, 99, 99.5):
            if (100 - p) * n / 100 <= 0.5:
                continue  # the negative one rounds to 0 examples: that is the start, see below
            if (p * n / 100) % 1 == 0.5:
                ties += 1
                (forward,), (backward,) = to_absolute(f"train[{p}%:]", {"train": n}), \
                    to_absolute(f"train[{p - 100}%:]", {"train": n})
                assert forward.from_ % 2 == 0 == (n - backward.from_) % 2
                assert abs(forward.from_ - backward.from_) == n % 2
                continue
            assert spans(f"train[{p - 100}%:]", {"train": n}) == spans(f"train[{p}%:]", {"train": n})
            assert spans(f"train[:{p - 100}%]", {"train": n}) == spans(f"train[:{p}%]", {"train": n})
            compared += 1
    assert compared > 2600 and ties > 150
    assert spans("train[-50%:]", {"train": 101}) == [("train", 51, 101)]
    assert spans("train[50%:]", {"train": 101}) == [("train", 50, 101)]
    # As x[-0:] in Python, and as in TFDS, a boundary of 0 examples is the start of the split.
    assert spans("train[-0.4%:]", {"train": 100}) == [("train", 0, 100)]
    assert spans("train[:-0.4%]", {"train": 100}) == [("train", 0, 0)]


def test_pct1_dropremainder_uses_whole_multiples_of_one_percent():
    def pct1(from_=None, to=None):
        return ri("train", from_=from_, to=to, unit="%", rounding="pct1_dropremainder")

    assert len(train_ids(pct1(to=10), 101)) == 10 and len(train_ids(pct1(to=30), 101)) == 30
    for n in (100, 101, 105, 199, 250, 999, 1000, 60000, 60099):
        assert len(train_ids(pct1(to=30), n)) == 3 * len(train_ids(pct1(to=10), n)) == 30 * (n // 100)
    # With closest it need not be: of 105 examples, 10% is 10.5 -> 10 records, 30% is 31.5 -> 32, not 30.
    assert len(train_ids("train[:10%]", 105)) == 10 and len(train_ids("train[:30%]", 105)) == 32
    # Boundaries are multiples of n // 100 (as TFDS); the last n % 100 records are only reached by an open end.
    assert spans(pct1(to=100), {"train": 199}) == [("train", 0, 100)]
    assert spans(pct1(from_=50), {"train": 199}) == [("train", 50, 199)]
    assert spans(pct1(from_=-80), {"train": 101}) == [("train", 21, 101)]
    assert spans(pct1(from_=49, to=50), {"train": 101}) == [("train", 49, 50)]
    assert spans(pct1(), {"train": 5}) == [("train", 0, 5)]  # no percentage, nothing to round


def test_pct1_dropremainder_refuses_splits_under_100_examples():
    with pytest.raises(ValueError, match="at least 100 examples.*'train' has 99"):
        to_absolute(ri("train", to=50, unit="%", rounding="pct1_dropremainder"), {"train": 99})


def test_absolute_boundaries_behave_like_python_slicing():
    for n in range(0, 13):
        ids = list(range(n))
        bounds = [None, *range(-n - 3, n + 4), -1000, 1000]
        for a in bounds:
            for b in bounds:
                assert train_ids(ri("train", from_=a, to=b), n) == ids[a:b], (n, a, b)
                if a is not None or b is not None:
                    spec = f"train[{'' if a is None else a}:{'' if b is None else b}]"
                    assert train_ids(spec, n) == ids[a:b], spec


def test_negative_and_out_of_range_boundaries_on_the_seeds_split():
    assert spans("train[-10:]") == [("train", 59990, 60000)]
    assert spans("train[:-10]") == [("train", 0, 59990)]
    assert spans("train[-70000:10]") == [("train", 0, 10)]
    assert spans("train[59990:70000]") == [("train", 59990, 60000)]
    assert spans("train[70000:]") == [("train", 60000, 60000)]
    assert spans("train[20:10]") == [("train", 20, 20)]  # empty, as list(range(n))[20:10]
    assert spans("train[-100%:-90%]") == [("train", 0, 6000)]


def test_unknown_splits_list_the_available_ones():
    with pytest.raises(ValueError, match="Unknown split 'validation'; the dataset's splits are: 'train', 'test'"):
        to_absolute("train+validation[:5]", MNIST)
    with pytest.raises(ValueError, match="no splits"):
        to_absolute("train", {})
    with pytest.raises(ValueError, match="'train' has an invalid number of examples -1"):
        to_absolute("train", {"train": -1})
    with pytest.raises(TypeError, match="split_lengths must map"):
        to_absolute("train", [("train", 3)])


def test_all_reads_every_split_in_the_datasets_order():
    lengths = {"test": 2, "train": 3, "validation": 1}
    assert spans("all", lengths) == [("test", 0, 2), ("train", 0, 3), ("validation", 0, 1)]
    assert spans(ri("all"), lengths) == spans("all", lengths)
    assert spans("all+test[:1]", lengths)[-1] == ("test", 0, 1)
    # A dataset with a split really named 'all' reads that split.
    assert spans("all", {"all": 4, "train": 3}) == [("all", 0, 4)]


def test_absolute_instructions_are_splits_too():
    a = AbsoluteInstruction("train", 10, 20)
    assert a.num_examples == 10 and to_absolute(a, MNIST) == [a]
    assert spans(a + "test[:1]") == [("train", 10, 20), ("test", 0, 1)]
    with pytest.raises(ValueError, match="beyond split 'train', which has 15 examples"):
        to_absolute(a, {"train": 15})
    with pytest.raises(ValueError, match="from_ <= to"):
        AbsoluteInstruction("train", 5, 4)
    with pytest.raises(ValueError, match="integer >= 0"):
        AbsoluteInstruction("train", -1, 4)


def test_even_splits_is_the_seeds_assertion():
    assert even_splits("train", n=3) == ["train[0%:33%]", "train[33%:67%]", "train[67%:100%]"]
    assert all(type(s) is str for s in even_splits("train", n=3))
    parts = [train_ids(s, 60000) for s in even_splits("train", n=3)]
    assert [len(p) for p in parts] == [60000 * 0.33, 60000 * 0.34, 60000 * 0.33] == [19800, 20400, 19800]
    assert sorted(i for p in parts for i in p) == list(range(60000))


def test_even_splits_of_a_whole_split_cover_it_exactly():
    assert even_splits("train", n=1) == ["train[0%:100%]"]
    assert even_splits("test", n=4) == ["test[0%:25%]", "test[25%:50%]", "test[50%:75%]", "test[75%:100%]"]
    assert even_splits("train", n=8)[1:4] == ["train[13%:25%]", "train[25%:38%]", "train[38%:50%]"]
    assert even_splits("train", n=100)[7] == "train[7%:8%]"
    for n in (1, 2, 3, 6, 7, 8, 11, 33, 64, 99, 100):
        pieces = even_splits("train", n=n)
        assert len(pieces) == n
        for length in (0, 1, 5, 99, 100, 101, 997, 60000):
            ids = [i for piece in pieces for i in train_ids(piece, length)]
            assert ids == list(range(length)), (n, length)  # in order, disjoint, complete
            # The strings read what the EvenSplit objects of the same split read.
            objects = [EvenSplit(ri("train"), index=i, count=n) for i in range(n)]
            assert [spans(p, {"train": length}) for p in pieces] == [spans(o, {"train": length}) for o in objects]


def test_even_splits_of_a_slice_are_percentages_of_the_slice():
    pieces = even_splits("train[:50%]", n=3)
    assert all(isinstance(p, EvenSplit) for p in pieces)
    assert [spans(p) for p in pieces] == [[("train", 0, 9900)], [("train", 9900, 20100)], [("train", 20100, 30000)]]
    # A slice of a slice: 33%/34%/33% of the 30,000 records of train[-50%:].
    tail = [train_ids(p, 60000) for p in even_splits("train[-50%:]", n=3)]
    assert [len(t) for t in tail] == [9900, 10200, 9900]
    assert [i for t in tail for i in t] == list(range(30000, 60000))
    # Each + part is divided on its own: piece i of train+test is piece i of train, then piece i of test.
    both = even_splits("train+test", n=3)
    assert spans(both[1]) == [("train", 19800, 40200), ("test", 3300, 6700)]
    # A ReadInstruction, and an even split of an even split.
    assert even_splits(ri("train", to=50, unit="%"), n=3) == pieces
    quarter = even_splits(even_splits("train", n=2)[1], n=2)
    assert spans(quarter[0]) == [("train", 30000, 45000)]


def test_even_splits_combine_with_other_splits():
    first = even_splits("train[:50%]", n=2)[0]
    assert spans(first + "test[:10]") == [("train", 0, 15000), ("test", 0, 10)]
    assert spans("test[:10]" + first) == [("test", 0, 10), ("train", 0, 15000)]
    assert str(first) == "even_splits('train[:50%]', n=2)[0]"
    assert repr(first) == "EvenSplit('train[:50%]', index=0, count=2, drop_remainder=False)"


def test_even_splits_drop_remainder_gives_equal_sizes():
    pieces = even_splits("train", n=3, drop_remainder=True)
    assert all(isinstance(p, EvenSplit) for p in pieces)
    assert [spans(p, {"train": 11}) for p in pieces] == [[("train", 0, 3)], [("train", 3, 6)], [("train", 6, 9)]]
    assert [len(train_ids(p, 60000)) for p in even_splits("train", n=7, drop_remainder=True)] == [8571] * 7
    for n in (1, 2, 3, 7, 101, 1000):
        pieces = even_splits("train[10:-3]", n=n, drop_remainder=True)
        for length in (0, 5, 13, 14, 100, 1013):
            ids = [train_ids(p, length) for p in pieces]
            size = max(0, len(range(length)[10:-3])) // n
            assert all(len(i) == size for i in ids), (n, length)
            assert [i for part in ids for i in part] == list(range(length))[10:-3][:size * n]
    assert str(pieces[0]) == "even_splits('train[10:-3]', n=1000, drop_remainder=True)[0]"


def test_even_splits_arguments_are_validated():
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="n must be a positive integer"):
            even_splits("train", n=bad)
    with pytest.raises(ValueError, match="at most 100.*drop_remainder=True"):
        even_splits("train", n=101)
    assert len(even_splits("train", n=101, drop_remainder=True)) == 101
    with pytest.raises(ValueError, match="Invalid split spec 'train\\[5\\]'"):
        even_splits("train[5]", n=2)
    with pytest.raises(TypeError, match="split must be a split spec"):
        even_splits(["train"], n=2)
    with pytest.raises(TypeError, match="drop_remainder must be a bool"):
        even_splits("train", n=2, drop_remainder=1)
    with pytest.raises(ValueError, match="index must be an integer in \\[0, 3\\)"):
        EvenSplit(ri("train"), index=3, count=3)


SHARDS = {"train": [("train-0", 3), ("train-1", 4), ("train-2", 5)],
          "test": [("test-0", 2), ("test-1", 0), ("test-2", 2)]}


def read_files(reads: list[FileInstruction], shards=SHARDS) -> list[tuple[str, int]]:
    """The (split, index) of every record the file reads give; record ids number records across a split's files."""
    ids = {}
    for split, files in shards.items():
        first = 0
        for filename, length in files:
            ids[filename] = [(split, first + i) for i in range(length)]
            first += length
    return [r for read in reads for r in ids[read.filename][read.skip:read.skip + read.take]]


def test_file_instructions_cross_shard_boundaries():
    assert file_instructions("train[2:8]", SHARDS) == [
        FileInstruction("train-0", skip=2, take=1, num_examples=3),
        FileInstruction("train-1", skip=0, take=4, num_examples=4),
        FileInstruction("train-2", skip=0, take=1, num_examples=5),
    ]
    assert file_instructions("train[3:7]", SHARDS) == [FileInstruction("train-1", 0, 4, 4)]
    assert file_instructions("train[-2:]", SHARDS) == [FileInstruction("train-2", 3, 2, 5)]
    assert file_instructions("train[5:5]", SHARDS) == []
    assert file_instructions("train", SHARDS) == [FileInstruction("train-0", 0, 3, 3),
                                                  FileInstruction("train-1", 0, 4, 4),
                                                  FileInstruction("train-2", 0, 5, 5)]
    # The empty shard is never read.
    assert [r.filename for r in file_instructions("test", SHARDS)] == ["test-0", "test-2"]


def test_file_instructions_read_exactly_the_sliced_records():
    n = 12
    bounds = [None, *range(-n - 1, n + 2)]
    for a in bounds:
        for b in bounds:
            instruction = ri("train", from_=a, to=b)
            reads = file_instructions(instruction, SHARDS)
            assert read_files(reads) == [("train", i) for i in list(range(n))[a:b]], (a, b)
            assert all(r.take > 0 for r in reads)
    for spec in ["train[:10%]+train[-80%:]", "train[25%:75%]+test", "test[1:]+train[-3:]+train[:2]", "all",
                 "train[:50%]+train[:50%]"]:
        assert read_files(file_instructions(spec, SHARDS)) == records(spec, {"train": 12, "test": 4}), spec
    for piece in even_splits("train+test", n=3) + even_splits("train", n=5, drop_remainder=True):
        assert read_files(file_instructions(piece, SHARDS)) == records(piece, {"train": 12, "test": 4})


def test_file_instructions_follow_the_order_of_the_parts():
    # The first part's files, then the second's (a file may appear twice), as TFDS does.
    reads = file_instructions("train[-80%:]+train[:10%]", SHARDS)
    assert [(r.filename, r.skip, r.take) for r in reads] == [
        ("train-0", 2, 1), ("train-1", 0, 4), ("train-2", 0, 5),  # train[-80%:] = [2, 12)
        ("train-0", 0, 1),                                        # train[:10%] = [0, 1)
    ]


def test_file_instructions_validate_the_shards():
    with pytest.raises(ValueError, match="'train': every shard must be a \\(filename, num_examples >= 0\\)"):
        file_instructions("train", {"train": [("train-0", -1)]})
    with pytest.raises(ValueError, match="every shard must be"):
        file_instructions("train", {"train": ["train-0"]})
    with pytest.raises(TypeError, match="shards must map"):
        file_instructions("train", [("train-0", 3)])
    with pytest.raises(ValueError, match="Unknown split 'validation'; the dataset's splits are: 'train', 'test'"):
        file_instructions("validation", SHARDS)


def test_file_instruction_fields_are_checked():
    read = FileInstruction("f", skip=1, take=2, num_examples=3)
    assert not read.takes_all and FileInstruction("f", 0, 3, 3).takes_all
    with pytest.raises(ValueError, match="reads beyond its 3 records"):
        FileInstruction("f", skip=2, take=2, num_examples=3)
    with pytest.raises(ValueError, match="skip must be an integer >= 0"):
        FileInstruction("f", skip=-1, take=2, num_examples=3)


def test_instructions_survive_pickling():
    # Pipelines that carry them are shipped to workers with cloudpickle.
    for split in [ri("train", to=10, unit="%", rounding="pct1_dropremainder"),
                  ReadInstruction.from_spec("train[:10%]+test"), even_splits("train[:50%]", n=3)[2],
                  AbsoluteInstruction("train", 1, 2)]:
        back = pickle.loads(pickle.dumps(split))
        assert back == split and spans(back) == spans(split)
