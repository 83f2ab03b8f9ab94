"""Pipelines serialize with cloudpickle and run in another process."""

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from dataservice import Dataset
from dataservice.data.serialization import dataset_fingerprint, deserialize_dataset, serialize_dataset
from dataservice.errors import PipelineSerializationError
from tests.elements import values as json_values

#: Pipelines run in this process; no server is talked to (tests/grpc_leak_guard.py checks it).
pytestmark = pytest.mark.no_grpc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def values(ds):
    return json_values(ds, tuples_as_lists=True)  # JSON has no tuples


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    return env


def _python(script, *args):
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          env=_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# Runs a serialized pipeline in a fresh interpreter and prints its elements as JSON.
RUN_BLOB = """
import json, sys
from dataservice.data.serialization import deserialize_dataset
from tests.elements import values  # numpy and plain Python only: nothing of the pipeline's test module

with open(sys.argv[1], "rb") as f:
    ds = deserialize_dataset(f.read())
print(json.dumps(values(ds, tuples_as_lists=True)))
"""


def _run_in_subprocess(ds, tmp_path):
    blob_path = tmp_path / "pipeline.pkl"
    blob_path.write_bytes(serialize_dataset(ds))
    return json.loads(_python(RUN_BLOB, str(blob_path)))


def _pipeline():
    """Lambdas, closures over locals, nested helpers, captured arrays, parallel stages."""
    offset = 100
    table = np.array([10, 20, 30, 40, 50])

    def lookup(i):
        return table[i % len(table)]

    def featurize(x):
        return {"x": x + offset, "looked_up": lookup(x), "name": f"e{int(x)}"}

    def make_inner(d):
        return Dataset.from_tensors(d["x"]).repeat(2)

    return (Dataset.range(20)
            .filter(lambda x: x % 3 != 0)
            .map(featurize, num_parallel_calls=2)
            .map(lambda d: (d, d["looked_up"] * 2))
            .shuffle(8, seed=11)
            .batch(3)
            .unbatch()
            .map(lambda d, doubled: {**d, "doubled": doubled})
            .enumerate()
            .cache()
            .prefetch(2)), make_inner


def test_roundtrip_in_process():
    ds, make_inner = _pipeline()
    blob = serialize_dataset(ds)
    assert isinstance(blob, bytes)
    assert values(deserialize_dataset(blob)) == values(ds)
    inter = Dataset.range(1, 6).interleave(lambda x: Dataset.from_tensors(x).repeat(6), cycle_length=2,
                                           block_length=4)
    assert values(deserialize_dataset(serialize_dataset(inter))) == values(inter)


@pytest.mark.slow
def test_pipeline_runs_in_another_process(tmp_path):
    ds, make_inner = _pipeline()
    expected = values(ds)
    assert len(expected) == 13
    assert _run_in_subprocess(ds, tmp_path) == expected
    # Nested datasets built by a captured helper in interleave, a generator source, zip.
    nested = Dataset.zip((
        Dataset.from_generator(lambda: ({"x": np.int64(i)} for i in range(4))).interleave(make_inner, cycle_length=2),
        Dataset.from_tensor_slices((["a", "b", "c", "d", "e", "f", "g", "h"], np.arange(8.0))),
    ))
    assert _run_in_subprocess(nested, tmp_path) == values(nested)


# A driver script: helpers and constants defined in __main__, as a user's training
# script has them, serialized in one process and run in another.
DRIVER = """
import sys
import numpy as np
from dataservice import Dataset
from dataservice.data.serialization import serialize_dataset

SCALE = 3

def scale(x):
    return x * SCALE

class Tokenizer:
    def __init__(self, vocab):
        self.vocab = vocab
    def __call__(self, x):
        return self.vocab[int(x) % len(self.vocab)]

tok = Tokenizer(["a", "b", "c"])
ds = Dataset.range(6).map(scale).map(lambda x: (x, tok(x)))
with open(sys.argv[1], "wb") as f:
    f.write(serialize_dataset(ds))
"""


@pytest.mark.slow
def test_main_module_helpers_run_in_another_process(tmp_path):
    blob_path = str(tmp_path / "driver.pkl")
    _python(DRIVER, blob_path)
    assert json.loads(_python(RUN_BLOB, blob_path)) == [[3 * i, "abc"[3 * i % 3]] for i in range(6)]


def test_unpicklable_capture_is_named():
    lock = threading.Lock()

    def uses_lock(x):
        with lock:
            return x + 1

    ds = Dataset.range(3).map(lambda x: x * 2).map(uses_lock).batch(2)
    with pytest.raises(PipelineSerializationError) as info:
        serialize_dataset(ds)
    message = str(info.value)
    assert "'lock'" in message and "uses_lock" in message and "Dataset.map" in message
    assert "lock" in type(info.value.__cause__).__name__.lower() or "lock" in str(info.value.__cause__)
    assert isinstance(info.value, TypeError)


def test_unpicklable_lambda_capture_is_named():
    guard = threading.Lock()
    ds = Dataset.zip((Dataset.range(3), Dataset.range(3).filter(lambda x: guard is not None)))
    with pytest.raises(PipelineSerializationError, match="'guard'.*Dataset.filter"):
        serialize_dataset(ds)


def test_unpicklable_generator_is_named():
    live = (i for i in range(3))
    ds = Dataset.from_generator(lambda: live)
    with pytest.raises(PipelineSerializationError, match="'live'"):
        serialize_dataset(ds)


def test_serialize_rejects_non_datasets():
    with pytest.raises(TypeError, match="Dataset"):
        serialize_dataset([1, 2, 3])
    import cloudpickle
    from dataservice.data.environment import versions
    from dataservice.errors import WorkerEnvironmentError
    from dataservice.proto import pipeline_pb2
    with pytest.raises(WorkerEnvironmentError, match="not a Dataset"):
        deserialize_dataset(pipeline_pb2.PipelineDef(pipeline=cloudpickle.dumps([1, 2, 3]),
                                                     versions=versions()).SerializeToString())
    with pytest.raises(WorkerEnvironmentError, match="not a serialized dataservice pipeline"):
        deserialize_dataset(b"\xff" * 16)


def test_memory_cache_contents_are_not_serialized():
    ds = Dataset.range(2000).map(lambda x: np.full(100, x)).cache()
    empty_size = len(serialize_dataset(ds))
    assert len(list(ds)) == 2000  # fills the in-memory cache (1.6 MB)
    blob = serialize_dataset(ds)
    assert len(blob) < empty_size + 1000
    assert values(deserialize_dataset(blob))[1999] == [1999] * 100


def test_fingerprint():
    a = serialize_dataset(Dataset.range(10).batch(2))
    assert dataset_fingerprint(a) == dataset_fingerprint(a)
    b = serialize_dataset(Dataset.range(10).batch(3))
    assert dataset_fingerprint(a) != dataset_fingerprint(b)


def test_a_copy_starts_at_the_first_epoch(tmp_path):
    # Iteration state (shuffle's and list_files' epoch counts) is not part of the pipeline.
    for name in "abcdefgh":
        (tmp_path / name).write_text("")
    ds = Dataset.zip((Dataset.range(20).shuffle(20, seed=3),
                      Dataset.list_files(str(tmp_path / "*"), shuffle=True, seed=3).repeat()))
    before = serialize_dataset(ds)
    first_epoch = values(ds)
    assert values(ds) != first_epoch  # the original moves on to its next epoch
    after = serialize_dataset(ds)
    assert after == before
    assert dataset_fingerprint(after) == dataset_fingerprint(before)
    assert values(deserialize_dataset(after)) == first_epoch


def test_registered_cardinality_of_bytes_that_are_no_pipeline_is_unknown():
    from dataservice.data.dataset import UNKNOWN_CARDINALITY
    from dataservice.data.serialization import registered_cardinality

    assert registered_cardinality(b"\xff\xff not a PipelineDef") == UNKNOWN_CARDINALITY
