"""Sources: range, from_tensor_slices, from_tensors, from_generator, list_files, zip, concatenate.

Expected values follow tf.data's documented examples (``as_numpy_iterator``).
"""

import os

import numpy as np
import pytest

from dataservice import Dataset, TensorSpec
from dataservice.errors import InvalidArgumentError
from tests.elements import values
from dataservice.data import sources

#: Pipelines run in this process; no server is talked to (tests/grpc_leak_guard.py checks it).
pytestmark = pytest.mark.no_grpc


# --- range ------------------------------------------------------------------------

@pytest.mark.parametrize("args, expected", [
    ((5,), [0, 1, 2, 3, 4]),
    ((2, 5), [2, 3, 4]),
    ((1, 5, 2), [1, 3]),
    ((1, 5, -2), []),
    ((5, 1), []),
    ((5, 1, -2), [5, 3]),
    ((0,), []),
    ((-3,), []),
])
def test_range_follows_python_range_semantics(args, expected):
    assert values(Dataset.range(*args)) == expected


def test_range_yields_int64_scalars():
    elements = list(Dataset.range(3))
    assert [type(x) for x in elements] == [np.int64] * 3
    assert all(np.ndim(x) == 0 for x in elements)


def test_range_dtype():
    elements = list(Dataset.range(1, 5, 2, dtype=np.float32))
    assert elements == [1.0, 3.0]
    assert all(type(x) is np.float32 for x in elements)


def test_range_longer_than_one_chunk_is_complete_and_ordered():
    n = 3 * sources.MAX_SPLIT_ELEMENTS + 17
    assert values(Dataset.range(n)) == list(range(n))
    # A negative step across chunk boundaries too.
    assert values(Dataset.range(n, 0, -3)) == list(range(n, 0, -3))


def test_range_rejects_bad_arguments():
    # tf.data's kinds of error: TypeError for a non-int, ValueError for no arguments (or None),
    # InvalidArgumentError for step 0.
    with pytest.raises(TypeError, match="stop"):
        Dataset.range(2.5)
    with pytest.raises(ValueError, match="1 to 3 arguments"):
        Dataset.range()
    with pytest.raises(ValueError, match="1 to 3 arguments"):
        Dataset.range(1, 2, 3, 4)
    with pytest.raises(ValueError, match="stop"):
        Dataset.range(None)
    with pytest.raises(InvalidArgumentError, match="step"):
        Dataset.range(0, 10, 0)
    with pytest.raises(InvalidArgumentError, match="output_type"):
        Dataset.range(3, output_type=bytes)
    with pytest.raises(InvalidArgumentError, match="output_type"):
        Dataset.range(3, output_type=np.bool_)
    with pytest.raises(TypeError, match="disagree"):
        Dataset.range(3, output_type=np.int32, dtype=np.int64)


def test_iteration_protocol():
    ds = Dataset.range(2)
    it = iter(ds)
    assert iter(it) is it
    assert next(it) == 0
    assert next(it) == 1
    with pytest.raises(StopIteration):
        next(it)
    # Every iteration starts over.
    assert values(ds) == [0, 1]
    assert values(ds.as_numpy_iterator()) == [0, 1]


def test_reduce():
    assert Dataset.range(5).reduce(np.int64(0), lambda state, x: state + x) == 10
    assert Dataset.range(5).reduce(0, lambda state, _: state + 1) == 5


# --- from_tensor_slices ---------------------------------------------------------------

def test_from_tensor_slices_1d_gives_scalars():
    elements = list(Dataset.from_tensor_slices([1, 2, 3]))
    assert elements == [1, 2, 3]
    assert all(isinstance(x, np.integer) and np.ndim(x) == 0 for x in elements)


def test_from_tensor_slices_2d_gives_rows():
    elements = list(Dataset.from_tensor_slices(np.arange(6).reshape(3, 2)))
    assert len(elements) == 3
    for i, row in enumerate(elements):
        assert isinstance(row, np.ndarray) and row.shape == (2,)
        assert row.tolist() == [2 * i, 2 * i + 1]


def test_from_tensor_slices_tuple_and_dict_keep_structure():
    assert values(Dataset.from_tensor_slices(([1, 2], [3, 4], [5, 6]))) == [(1, 3, 5), (2, 4, 6)]
    assert values(Dataset.from_tensor_slices({"a": [1, 2], "b": [3, 4]})) == [{"a": 1, "b": 3}, {"a": 2, "b": 4}]
    # tf.data's nested example.
    nested = list(Dataset.from_tensor_slices({"a": ([1, 2], [3, 4]), "b": [5, 6]}))
    assert values(nested) == [{"a": (1, 3), "b": 5}, {"a": (2, 4), "b": 6}]
    assert type(nested[0]) is dict and type(nested[0]["a"]) is tuple


def test_from_tensor_slices_dict_keeps_key_order():
    element = next(iter(Dataset.from_tensor_slices({"z": [1], "a": [2], "m": [3]})))
    assert list(element) == ["z", "a", "m"]
    assert values([element]) == [{"z": 1, "a": 2, "m": 3}]


def test_from_tensor_slices_features_and_labels():
    features = np.array([[1, 3], [2, 1], [3, 3]])
    labels = ["A", "B", "A"]
    elements = list(Dataset.from_tensor_slices((features, labels)))
    assert [(f.tolist(), label) for f, label in elements] == [([1, 3], "A"), ([2, 1], "B"), ([3, 3], "A")]
    assert all(type(label) is str for _, label in elements)


def test_from_tensor_slices_strings_and_bytes_are_exact():
    assert list(Dataset.from_tensor_slices(["hello", "a"])) == ["hello", "a"]
    # Binary records keep trailing NUL bytes (a fixed-width "S" array would drop them).
    records = [b"ab\x00", b"\x00", b"c"]
    assert list(Dataset.from_tensor_slices(records)) == records


def test_from_tensor_slices_elements_do_not_alias_the_source():
    source = np.arange(6).reshape(3, 2)
    ds = Dataset.from_tensor_slices(source)
    source[:] = -1
    first = next(iter(ds))
    assert first.tolist() == [0, 1]
    first[:] = 99  # mutating an element does not change the next pass
    assert next(iter(ds)).tolist() == [0, 1]


def test_from_tensor_slices_longer_than_one_chunk():
    n = sources.MAX_SPLIT_ELEMENTS + 5
    ds = Dataset.from_tensor_slices((np.arange(n), np.arange(n) * 2))
    assert values(ds) == [(i, 2 * i) for i in range(n)]


def test_from_tensor_slices_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="same size"):
        Dataset.from_tensor_slices(([1, 2, 3], [1, 2]))
    with pytest.raises(ValueError, match="same size"):
        Dataset.from_tensor_slices({"a": np.zeros(2), "b": np.zeros(3)})


def test_from_tensor_slices_rejects_scalars():
    with pytest.raises(ValueError, match="dimension"):
        Dataset.from_tensor_slices(np.int64(3))
    with pytest.raises(ValueError, match="dimension"):
        Dataset.from_tensor_slices(([1, 2], 3))


def test_from_tensor_slices_empty():
    ds = Dataset.from_tensor_slices(np.zeros((0, 3)))
    assert list(ds) == []
    assert ds.cardinality() == 0


# --- from_tensors ------------------------------------------------------------------

def test_from_tensors_single_element():
    elements = list(Dataset.from_tensors([1, 2, 3]))
    assert len(elements) == 1
    assert isinstance(elements[0], np.ndarray) and elements[0].tolist() == [1, 2, 3]
    assert values(Dataset.from_tensors(([1, 2, 3], "A"))) == [([1, 2, 3], "A")]
    assert values(Dataset.from_tensors(np.array([1, 2, 3])).repeat(2)) == [[1, 2, 3], [1, 2, 3]]


def test_python_scalars_become_numpy_scalars():
    assert type(next(iter(Dataset.from_tensors(1)))) is np.int64
    assert type(next(iter(Dataset.from_tensors(1.5)))) is np.float64
    assert type(next(iter(Dataset.from_tensors(True)))) is np.bool_
    assert next(iter(Dataset.from_tensors(b"x"))) == b"x"
    assert next(iter(Dataset.from_tensors("x"))) == "x"
    element = next(iter(Dataset.from_tensors({"a": 1, "b": (2.0, "s")})))
    assert type(element["a"]) is np.int64 and type(element["b"][0]) is np.float64 and element["b"][1] == "s"


# --- from_generator ---------------------------------------------------------------

def test_from_generator_called_anew_each_iteration():
    calls = []

    def gen():
        calls.append(1)
        yield from [(1, "foo"), (2, "bar")]

    ds = Dataset.from_generator(gen)
    assert values(ds) == [(1, "foo"), (2, "bar")]
    assert values(ds) == [(1, "foo"), (2, "bar")]
    assert len(calls) == 2
    assert type(next(iter(ds))[0]) is np.int64


def test_from_generator_args_and_lists():
    ds = Dataset.from_generator(lambda n, k: ([i] * k for i in range(n)), args=(3, 2))
    elements = list(ds)
    assert all(isinstance(e, np.ndarray) for e in elements)
    assert values(elements) == [[0, 0], [1, 1], [2, 2]]


def test_from_generator_requires_a_callable():
    with pytest.raises(TypeError, match="callable"):
        Dataset.from_generator([1, 2, 3])


# --- list_files ---------------------------------------------------------------------

@pytest.fixture
def file_tree(tmp_path):
    names = ["c.py", "a.txt", "b.py", "d.py", "e.csv"]
    for name in names:
        (tmp_path / name).write_text(name)
    return tmp_path


def test_list_files_sorted_str_paths(file_tree):
    ds = Dataset.list_files(str(file_tree / "*.py"))
    paths = list(ds)
    assert paths == [str(file_tree / n) for n in ("b.py", "c.py", "d.py")]
    assert all(type(p) is str for p in paths)
    assert ds.cardinality() == 3


def test_list_files_several_patterns(file_tree):
    paths = list(Dataset.list_files([str(file_tree / "*.csv"), str(file_tree / "a.*")]))
    assert paths == [str(file_tree / "a.txt"), str(file_tree / "e.csv")]
    # Overlapping patterns list a file once per pattern that matches it, as tf.data (recorded in
    # tests/fixtures/tf_parity/sources.json, list_files_count).
    assert len(list(Dataset.list_files([str(file_tree / "*.py"), str(file_tree / "b.*")]))) == 4
    # As tf.data, one pattern without matches is fine while another matches.
    paths = list(Dataset.list_files([str(file_tree / "*.nothing"), str(file_tree / "*.csv")]))
    assert paths == [str(file_tree / "e.csv")]


def test_list_files_no_match_is_a_clear_error(tmp_path):
    pattern = str(tmp_path / "*.tfrecord")
    with pytest.raises(FileNotFoundError, match="no files matched") as info:
        Dataset.list_files(pattern)
    assert pattern in str(info.value)


def test_list_files_shuffle(tmp_path):
    for i in range(12):
        (tmp_path / f"f{i:02d}").write_text("")
    expected = sorted(os.path.join(tmp_path, f"f{i:02d}") for i in range(12))
    ds = Dataset.list_files(str(tmp_path / "f*"), shuffle=True, seed=7)
    first, second = list(ds), list(ds)
    assert sorted(first) == expected and sorted(second) == expected
    assert first != expected  # shuffled (deterministically, for a fixed seed)
    assert first != second  # reshuffled each epoch
    # The same seed gives the same order in a new pipeline.
    assert list(Dataset.list_files(str(tmp_path / "f*"), shuffle=True, seed=7)) == first


# --- zip and concatenate ----------------------------------------------------------------

def test_zip_tuples_and_argument_forms():
    a, b = Dataset.range(1, 4), Dataset.range(4, 7)
    assert values(Dataset.zip((a, b))) == [(1, 4), (2, 5), (3, 6)]
    assert values(Dataset.zip((b, a))) == [(4, 1), (5, 2), (6, 3)]
    assert values(Dataset.zip(a, b)) == [(1, 4), (2, 5), (3, 6)]
    c = Dataset.range(7, 13).batch(2)
    assert values(Dataset.zip((a, b, c))) == [(1, 4, [7, 8]), (2, 5, [9, 10]), (3, 6, [11, 12])]


def test_zip_single_dataset_as_tf():
    a = Dataset.range(3)
    assert values(Dataset.zip(a)) == [0, 1, 2]
    assert values(Dataset.zip((a,))) == [(0,), (1,), (2,)]


def test_zip_stops_at_shortest():
    a, d = Dataset.range(1, 4), Dataset.range(13, 15)
    assert values(Dataset.zip((a, d))) == [(1, 13), (2, 14)]
    assert values(Dataset.zip((d, a))) == [(13, 1), (14, 2)]
    assert values(Dataset.zip((Dataset.range(3), Dataset.range(10).repeat()))) == [(0, 0), (1, 1), (2, 2)]
    assert values(Dataset.zip((Dataset.range(0), Dataset.range(5)))) == []


def test_zip_nested_structures():
    a, b = Dataset.range(3), Dataset.from_tensor_slices((["x", "y", "z"], [1.0, 2.0, 3.0]))
    assert values(Dataset.zip({"n": a, "pair": (b, a)})) == [
        {"n": 0, "pair": (("x", 1.0), 0)},
        {"n": 1, "pair": (("y", 2.0), 1)},
        {"n": 2, "pair": (("z", 3.0), 2)},
    ]


def test_zip_rejects_non_datasets():
    with pytest.raises(TypeError, match="Dataset"):
        Dataset.zip((Dataset.range(3), [1, 2, 3]))
    with pytest.raises(ValueError):
        Dataset.zip(())


def test_concatenate():
    a, b = Dataset.range(1, 4), Dataset.range(4, 8)
    assert values(a.concatenate(b)) == [1, 2, 3, 4, 5, 6, 7]
    assert values(b.concatenate(a)) == [4, 5, 6, 7, 1, 2, 3]
    assert values(Dataset.range(0).concatenate(a)) == [1, 2, 3]
    with pytest.raises(TypeError, match="Dataset"):
        a.concatenate([4, 5])


def test_len_of_finite_and_unknown_and_infinite():
    assert len(Dataset.range(10)) == 10
    assert len(Dataset.from_tensor_slices([1, 2, 3])) == 3
    with pytest.raises(TypeError, match="infinite"):
        len(Dataset.range(3).repeat())
    with pytest.raises(TypeError, match="unknown"):
        len(Dataset.from_generator(lambda: iter([1])))
    assert bool(Dataset.range(0))  # truth never falls back to len()


# --- issue 16: range(output_type=), from_generator's declarations and args ----------------------

def test_range_output_type():
    assert [x.tolist() for x in Dataset.range(2, 5, output_type=np.int32)] == [2, 3, 4]
    assert Dataset.range(2, 5, output_type=np.int32).element_spec.dtype == np.int32
    values = list(Dataset.range(1, 5, 2, output_type=np.float32))
    assert values == [1.0, 3.0] and all(type(v) is np.float32 for v in values)
    assert list(Dataset.range(3, dtype=np.int16)) == [0, 1, 2]  # the older keyword stays
    assert [int(x) for x in Dataset.range(250, 260, output_type=np.int8)] == [-6, -5, -4, -3, -2, -1, 0, 1, 2, 3]
    big = Dataset.range(10_000, output_type=np.int32)  # several splits: each cast
    assert big.num_source_splits() > 1 and all(type(x) is np.int32 for x in big.read_split(1))


def test_from_generator_converts_by_tf_data_rules():
    # output_types alone (unknown shape): Python literals only where nothing is lost.
    assert [type(x) for x in Dataset.from_generator(lambda: iter([1, 2]), np.int32)] == [np.int32, np.int32]
    assert list(Dataset.from_generator(lambda: iter([np.float64(1.5)]), np.int32)) == [1]
    for bad, dtype in ((1.5, np.int32), (2, np.bool_), ("a", np.int32), (1, "string"), (None, np.int32)):
        with pytest.raises(InvalidArgumentError, match="cannot be converted"):
            list(Dataset.from_generator(lambda: iter([bad]), dtype))
    # A known shape: numpy's casts, then the shape is checked.
    known = Dataset.from_generator(lambda: iter([1.7, "4"]), output_signature=TensorSpec((), np.int32))
    assert list(known) == [1, 4]
    with pytest.raises(InvalidArgumentError, match=r"shape \(3,\) where the output_types says \(2,\)"):
        list(Dataset.from_generator(lambda: iter([[1, 2, 3]]), np.int32, [2]))
    # Structure: a list is not a tuple (tf.nest's rule); a tuple for a single component is an array.
    with pytest.raises(InvalidArgumentError, match="structure"):
        list(Dataset.from_generator(lambda: iter([[1, 2]]), (np.int32, np.int32)))
    assert [x.tolist() for x in Dataset.from_generator(lambda: iter([(1, 2)]), np.int32)] == [[1, 2]]


def test_from_generator_args_are_numpy_values():
    seen = []

    def gen(n, name, values):
        seen.append((type(n), type(name), type(values)))
        yield from range(int(n))

    ds = Dataset.from_generator(gen, np.int64, args=[3, "x", [1, 2]])
    assert list(ds) == [0, 1, 2]
    assert seen == [(np.int64, str, np.ndarray)]
    with pytest.raises(TypeError, match="args must be a tuple or list"):
        Dataset.from_generator(gen, np.int64, args=3)
    with pytest.raises(ValueError, match=r"args\[0\] is None"):
        Dataset.from_generator(gen, np.int64, args=(None,))


def test_list_files_keeps_a_file_two_patterns_match(tmp_path):
    for name in ("a.txt", "b.txt", "a.py"):
        (tmp_path / name).write_bytes(b"")
    files = list(Dataset.list_files([str(tmp_path / "*.txt"), str(tmp_path / "a.*")]))
    assert [os.path.basename(f) for f in files] == ["a.py", "a.txt", "a.txt", "b.txt"]
