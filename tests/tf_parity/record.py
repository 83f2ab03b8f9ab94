"""Records TensorFlow's answers for every parity case: ``tests/fixtures/tf_parity/<cases module>.json``.

Run once with a Python that has TensorFlow 2.21 (not a dependency of dataservice or its tests)::

    /work/tfvenv/bin/python -m tests.tf_parity.record            # every tests/tf_parity/cases_*.py
    /work/tfvenv/bin/python -m tests.tf_parity.record windows     # only cases_windows.py

from the repository root. Each fixture maps a case's name to its source and TensorFlow's outcome
(elements, cardinality, element_spec, or the kind of error and when it came); ``tests/test_tf_parity.py``
runs the same sources here and compares.
"""

from __future__ import annotations

import glob
import importlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.tf_parity.encoding import Side, run_case  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(os.path.dirname(HERE), "fixtures", "tf_parity")


def _spec(spec):
    if isinstance(spec, tf.TensorSpec):
        shape = None if spec.shape.rank is None else [d for d in spec.shape.as_list()]
        return {"shape": shape, "dtype": "string" if spec.dtype == tf.string else spec.dtype.name}
    if isinstance(spec, tf.data.DatasetSpec):
        return {"dataset": _spec(spec.element_spec)}
    if isinstance(spec, tf.RaggedTensorSpec):
        return {"ragged": spec.dtype.name}
    if isinstance(spec, dict):
        return {k: _spec(v) for k, v in sorted(spec.items())}
    if isinstance(spec, (tuple, list)):
        return [_spec(s) for s in spec]
    return {"other": type(spec).__name__}


def _to_numpy(value):
    if isinstance(value, (tf.Tensor, tf.Variable)) and not isinstance(value, tf.RaggedTensor):
        return value.numpy()
    if isinstance(value, tf.RaggedTensor):
        return value.to_list()
    if hasattr(value, "_fields") and isinstance(value, tuple):  # namedtuple: compared as a tuple
        return tuple(value)
    return value


def _iterate(ds):
    for element in ds:
        yield tf.nest.map_structure(_to_numpy, element) if not isinstance(element, tf.data.Dataset) else element


class TensorFlowSide(Side):
    namespace = {
        "D": tf.data.Dataset, "np": np, "Options": tf.data.Options, "AUTOTUNE": tf.data.AUTOTUNE,
        "TensorSpec": tf.TensorSpec, "errors": tf.errors, "TFRecordDataset": tf.data.TFRecordDataset,
        "TextLineDataset": tf.data.TextLineDataset, "FixedLengthRecordDataset": tf.data.FixedLengthRecordDataset,
        "TFRecordWriter": tf.data.experimental.TFRecordWriter, "experimental": tf.data.experimental, "tf": tf,
    }

    @staticmethod
    def is_dataset(value):
        return isinstance(value, tf.data.Dataset)

    @staticmethod
    def cardinality(ds):
        return int(ds.cardinality())

    @staticmethod
    def element_spec(ds):
        return ds.element_spec

    @staticmethod
    def encode_spec(spec):
        return _spec(spec)

    iterate = staticmethod(_iterate)
    to_numpy = staticmethod(_to_numpy)

    @staticmethod
    def error_kind(exc):
        return type(exc).__name__


def record(module_name: str) -> str:
    module = importlib.import_module(f"tests.tf_parity.{module_name}")
    cases = {}
    for case in module.CASES:
        if case.name in cases:
            raise SystemExit(f"{module_name}: two cases named {case.name!r}")
        outcome = run_case(TensorFlowSide(), case.source, case.max_elements)
        cases[case.name] = {"source": case.source, "tensorflow": outcome}
    path = os.path.join(OUT, module_name.removeprefix("cases_") + ".json")
    os.makedirs(OUT, exist_ok=True)
    with open(path, "w") as f:
        json.dump({"tensorflow_version": tf.__version__, "cases": cases}, f, indent=1, sort_keys=True)
    return path


def main(argv: list[str]) -> None:
    names = [f"cases_{n}" for n in argv] or sorted(
        os.path.basename(p)[:-3] for p in glob.glob(os.path.join(HERE, "cases_*.py")))
    for name in names:
        print("wrote", record(name), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
