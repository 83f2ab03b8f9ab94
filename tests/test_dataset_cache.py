"""Dataset.cache: in memory, and in a file that persists across runs (real processes)."""

import os
import subprocess
import sys

import numpy as np
import pytest

from dataservice import Dataset
from tests.elements import values

#: Pipelines run in this process; no server is talked to (tests/grpc_leak_guard.py checks it).
pytestmark = pytest.mark.no_grpc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))




def counting_map(calls):
    def f(x):
        calls.append(int(x))
        return x * x
    return f


# --- in memory --------------------------------------------------------------------

def test_memory_cache_runs_the_input_once():
    calls = []
    ds = Dataset.range(5).map(counting_map(calls)).cache()
    assert values(ds) == [0, 1, 4, 9, 16]
    assert values(ds) == [0, 1, 4, 9, 16]
    assert values(ds.repeat(2)) == [0, 1, 4, 9, 16] * 2
    assert calls == [0, 1, 2, 3, 4]


def test_memory_cache_under_repeat_fills_on_the_first_epoch():
    calls = []
    ds = Dataset.range(4).map(counting_map(calls)).cache().repeat(3)
    assert values(ds) == [0, 1, 4, 9] * 3
    assert calls == [0, 1, 2, 3]


def test_memory_cache_partial_pass_is_not_cached():
    calls = []
    ds = Dataset.range(5).map(counting_map(calls)).cache()
    assert values(ds.take(2)) == [0, 1]
    assert values(ds) == [0, 1, 4, 9, 16]  # a full pass after the partial one runs the input
    assert values(ds) == [0, 1, 4, 9, 16]
    assert calls == [0, 1, 0, 1, 2, 3, 4]


def test_shuffle_after_cache_reshuffles_and_before_cache_freezes():
    reshuffled = Dataset.range(30).cache().shuffle(30, seed=1)
    a, b = values(reshuffled), values(reshuffled)
    assert sorted(a) == sorted(b) == list(range(30)) and a != b
    frozen = Dataset.range(30).shuffle(30, seed=1).cache()
    assert values(frozen) == values(frozen)


# --- in a file --------------------------------------------------------------------

def test_file_cache_reads_the_file_on_later_passes(tmp_path):
    path = str(tmp_path / "cache")
    calls = []
    ds = Dataset.range(5).map(counting_map(calls)).cache(path)
    assert values(ds) == [0, 1, 4, 9, 16]
    assert os.path.exists(path + ".data")
    assert values(ds) == [0, 1, 4, 9, 16]
    assert calls == [0, 1, 2, 3, 4]
    # Another pipeline with the same file reads it: even the first pass, even if the
    # pipeline before cache() changed (tf.data's documented behaviour).
    other_calls = []
    other = Dataset.range(10).map(counting_map(other_calls)).cache(path)
    assert values(other) == [0, 1, 4, 9, 16]
    assert other_calls == []


def test_file_cache_keeps_structure_and_types(tmp_path):
    path = str(tmp_path / "c")
    ds = Dataset.from_tensor_slices({"x": np.arange(6, dtype=np.int32).reshape(3, 2),
                                     "s": ["a", "bb", "c"],
                                     "b": [b"\x00", b"y\x00", b""]}).map(lambda d: (d, d["x"].sum()))
    first = list(ds.cache(path))
    second = list(ds.cache(path))
    assert values(second) == values(first)
    d, total = second[1]
    assert type(d) is dict and list(d) == ["x", "s", "b"]
    assert d["x"].dtype == np.int32 and d["x"].shape == (2,)
    assert d["s"] == "bb" and d["b"] == b"y\x00"
    assert type(total) is type(first[1][1])


def test_file_cache_partial_pass_leaves_nothing(tmp_path):
    path = str(tmp_path / "cache")
    calls = []
    ds = Dataset.range(5).map(counting_map(calls)).cache(path)
    assert values(ds.take(2)) == [0, 1]
    assert os.listdir(tmp_path) == []  # no cache file, no temporary file left behind
    assert values(ds) == [0, 1, 4, 9, 16]
    assert os.listdir(tmp_path) == ["cache.data"]


def test_file_cache_error_mid_pass_leaves_nothing(tmp_path):
    path = str(tmp_path / "cache")

    def boom(x):
        if x == 3:
            raise RuntimeError("boom")
        return x

    with pytest.raises(RuntimeError, match="boom"):
        list(Dataset.range(5).map(boom).cache(path))
    assert os.listdir(tmp_path) == []


def test_file_cache_two_passes_at_once_keep_one_complete_pass(tmp_path):
    # Two writers in the same thread (zip of the dataset with itself) must not
    # write into one temporary file: the cache holds exactly one complete pass.
    path = str(tmp_path / "cache")
    calls = []

    def gen():
        k = len(calls)
        calls.append(k)
        for i in range(5 if k == 0 else 3):  # the second pass is shorter and completes first
            yield k, i

    ds = Dataset.from_generator(gen).cache(path)
    assert values(Dataset.zip(ds, ds)) == [((0, i), (1, i)) for i in range(3)]
    assert values(ds) == [(1, 0), (1, 1), (1, 2)]
    assert len(calls) == 2
    assert os.listdir(tmp_path) == ["cache.data"]


def test_file_cache_missing_directory(tmp_path):
    ds = Dataset.range(3).cache(str(tmp_path / "no" / "such" / "dir" / "cache"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list(ds)


def test_file_cache_rejects_a_non_path():
    with pytest.raises(TypeError, match="filename"):
        Dataset.range(3).cache(5)


CACHE_SCRIPT = """
import sys
from dataservice import Dataset

log, cache = sys.argv[1], sys.argv[2]

def record(x):
    with open(log, "a") as f:
        f.write(f"{int(x)}\\n")
    return {"x": x, "sq": x * x, "name": f"item{int(x)}"}

ds = Dataset.range(6).map(record).cache(cache).map(lambda d: d["sq"] + 1)
print([int(v) for v in ds])
"""


def _run(script, *args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_file_cache_persists_across_processes(tmp_path):
    log, cache = str(tmp_path / "calls.log"), str(tmp_path / "features")
    expected = str([i * i + 1 for i in range(6)])
    assert _run(CACHE_SCRIPT, log, cache).strip() == expected
    with open(log) as f:
        assert f.read().split() == [str(i) for i in range(6)]
    # A second process reads the cache: the map fn before cache() does not run at all.
    assert _run(CACHE_SCRIPT, log, cache).strip() == expected
    with open(log) as f:
        assert f.read().split() == [str(i) for i in range(6)]
    # Removing the cache file makes the next process run the input again.
    os.remove(cache + ".data")
    assert _run(CACHE_SCRIPT, log, cache).strip() == expected
    with open(log) as f:
        assert f.read().split() == [str(i) for i in range(6)] * 2
