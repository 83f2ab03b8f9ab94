"""The Dataset library against TensorFlow 2.21, on recorded answers (no TensorFlow here).

Each case of ``tests/tf_parity/cases_*.py`` is a pipeline written once; ``tests/tf_parity/record.py``
ran it with TensorFlow and recorded the outcome in ``tests/fixtures/tf_parity/`` — the elements
(values, dtypes, shapes, structure, nested datasets), the cardinality, the element_spec, or the kind
of error and whether it came while building the pipeline or while iterating it. Here the same source
runs on dataservice and must give the same outcome, but for the deliberate differences the README
lists (strings may be ``str`` where TensorFlow gives ``bytes``; with ``literal_dtypes``, Python
literals are 64-bit where TensorFlow makes them 32-bit).
"""

from __future__ import annotations

import glob
import importlib
import json
import os
from typing import Any

import numpy as np
import pytest

import dataservice
from dataservice import errors
from dataservice.data import specs
from tests.tf_parity.encoding import Side, run_case

#: Pipelines run in this process; no server is talked to (tests/grpc_leak_guard.py checks it).
pytestmark = pytest.mark.no_grpc

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures", "tf_parity")


def _experimental() -> Any:
    try:
        return importlib.import_module("dataservice.data.experimental")
    except ImportError:
        return None


def _spec(spec: Any) -> Any:
    if isinstance(spec, specs.TensorSpec):
        shape = None if spec.shape is None else list(spec.shape)
        return {"shape": shape, "dtype": "string" if spec.dtype == specs.string else np.dtype(spec.dtype).name}
    dataset_spec = getattr(specs, "DatasetSpec", None)
    if dataset_spec is not None and isinstance(spec, dataset_spec):
        return {"dataset": _spec(spec.element_spec)}
    if isinstance(spec, dict):
        return {k: _spec(v) for k, v in sorted(spec.items())}
    if isinstance(spec, (tuple, list)):
        return [_spec(s) for s in spec]
    return {"other": type(spec).__name__}


def _to_numpy(value: Any) -> Any:
    if hasattr(value, "_fields") and isinstance(value, tuple):
        return tuple(value)
    return value


class OurSide(Side):
    namespace = {
        "D": dataservice.Dataset, "np": np, "Options": dataservice.Options, "AUTOTUNE": dataservice.AUTOTUNE,
        "TensorSpec": dataservice.TensorSpec, "errors": errors, "TFRecordDataset": dataservice.TFRecordDataset,
        "TextLineDataset": dataservice.TextLineDataset,
        "FixedLengthRecordDataset": dataservice.FixedLengthRecordDataset,
        "TFRecordWriter": dataservice.TFRecordWriter, "experimental": _experimental(),
    }

    @staticmethod
    def is_dataset(value: Any) -> bool:
        return isinstance(value, dataservice.Dataset)

    @staticmethod
    def cardinality(ds: Any) -> int:
        return int(ds.cardinality())

    @staticmethod
    def element_spec(ds: Any) -> Any:
        return ds.element_spec

    @staticmethod
    def encode_spec(spec: Any) -> Any:
        return _spec(spec)

    @staticmethod
    def iterate(ds: Any) -> Any:
        return iter(ds)

    to_numpy = staticmethod(_to_numpy)

    @staticmethod
    def error_kind(exc: BaseException) -> str:
        return type(exc).__name__


def _load() -> list[tuple[str, str, dict, Any]]:
    out = []
    for path in sorted(glob.glob(os.path.join(FIXTURES, "*.json"))):
        stem = os.path.basename(path)[:-5]
        module = importlib.import_module(f"tests.tf_parity.cases_{stem}")
        by_name = {case.name: case for case in module.CASES}
        with open(path) as f:
            recorded = json.load(f)["cases"]
        for name, entry in recorded.items():
            out.append((stem, name, entry, by_name.get(name)))
    return out


CASES = _load()

_WIDER = {"int32": "int64", "float32": "float64"}


class Mismatch(AssertionError):
    pass


def _same_dtype(theirs: str, ours: str, loose: bool) -> bool:
    return theirs == ours or (loose and _WIDER.get(theirs) == ours)


def _compare_leaves(theirs: Any, ours: Any, dtype: str, path: str) -> None:
    if isinstance(theirs, list) and isinstance(ours, list):
        if len(theirs) != len(ours):
            raise Mismatch(f"{path}: {len(theirs)} values in TensorFlow, {len(ours)} here")
        for i, (a, b) in enumerate(zip(theirs, ours)):
            _compare_leaves(a, b, dtype, f"{path}[{i}]")
        return
    if dtype == "float32" and isinstance(theirs, float) and isinstance(ours, float):
        if np.float32(theirs) != np.float32(ours):
            raise Mismatch(f"{path}: {theirs!r} in TensorFlow, {ours!r} here")
        return
    if theirs != ours:
        raise Mismatch(f"{path}: {theirs!r} in TensorFlow, {ours!r} here")


def compare(theirs: Any, ours: Any, loose: bool, path: str = "outcome") -> None:
    """Raises Mismatch naming the first place where our outcome differs from TensorFlow's."""
    if isinstance(theirs, dict) and isinstance(ours, dict):
        if theirs.get("t") == "array" and ours.get("t") == "array":
            if not _same_dtype(theirs["dtype"], ours["dtype"], loose):
                raise Mismatch(f"{path}: dtype {theirs['dtype']} in TensorFlow, {ours['dtype']} here")
            if theirs["shape"] != ours["shape"]:
                raise Mismatch(f"{path}: shape {theirs['shape']} in TensorFlow, {ours['shape']} here")
            _compare_leaves(theirs["v"], ours["v"], theirs["dtype"], path)
            return
        if "error" in theirs and "phase" in theirs:
            if "error" not in ours:
                raise Mismatch(f"{path}: TensorFlow raised {theirs['error']} ({theirs.get('message')}); "
                               f"here: {ours}")
            if (theirs["error"], theirs["phase"]) != (ours["error"], ours["phase"]):
                raise Mismatch(f"{path}: TensorFlow raised {theirs['error']} while {theirs['phase']} "
                               f"({theirs.get('message')}); here {ours['error']} while {ours['phase']} "
                               f"({ours.get('message')})")
            return
        if "dtype" in theirs and "shape" in theirs and "t" not in theirs:  # an element_spec leaf
            if not _same_dtype(theirs["dtype"], ours.get("dtype"), loose) or theirs["shape"] != ours.get("shape"):
                raise Mismatch(f"{path}: TensorSpec{theirs} in TensorFlow, {ours} here")
            return
        keys = set(theirs) - {"message"}
        if keys != set(ours) - {"message"}:
            raise Mismatch(f"{path}: TensorFlow has {sorted(keys)}, here {sorted(set(ours) - {'message'})}: "
                           f"{json.dumps(theirs)[:300]} vs {json.dumps(ours)[:300]}")
        for key in sorted(keys):
            compare(theirs[key], ours[key], loose, f"{path}.{key}")
        return
    if isinstance(theirs, list) and isinstance(ours, list):
        if len(theirs) != len(ours):
            raise Mismatch(f"{path}: {len(theirs)} items in TensorFlow, {len(ours)} here: "
                           f"{json.dumps(theirs)[:300]} vs {json.dumps(ours)[:300]}")
        for i, (a, b) in enumerate(zip(theirs, ours)):
            compare(a, b, loose, f"{path}[{i}]")
        return
    if theirs != ours:
        raise Mismatch(f"{path}: {theirs!r} in TensorFlow, {ours!r} here")


def _sorted_elements(outcome: dict) -> dict:
    if "elements" in outcome:
        outcome = dict(outcome, elements=sorted(outcome["elements"], key=lambda e: json.dumps(e, sort_keys=True)))
    return outcome


def test_every_case_has_a_recording_and_every_recording_a_case():
    recorded = {(stem, name) for stem, name, _, _ in CASES}
    assert all(case is not None for _, _, _, case in CASES), [n for s, n, _, c in CASES if c is None]
    for path in glob.glob(os.path.join(HERE, "tf_parity", "cases_*.py")):
        stem = os.path.basename(path)[len("cases_"):-3]
        module = importlib.import_module(f"tests.tf_parity.cases_{stem}")
        missing = [c.name for c in module.CASES if (stem, c.name) not in recorded]
        assert not missing, f"cases_{stem}.py has cases TensorFlow's answers were not recorded for " \
                            f"(run tests/tf_parity/record.py): {missing}"


@pytest.mark.parametrize("stem, name, entry, case", CASES, ids=[f"{s}:{n}" for s, n, _, _ in CASES])
def test_case_behaves_as_in_tensorflow(stem, name, entry, case):
    assert case is not None and case.source == entry["source"], \
        f"{stem}:{name} changed since TensorFlow's answer was recorded (run tests/tf_parity/record.py {stem})"
    theirs = entry["tensorflow"]
    ours = run_case(OurSide(), case.source, case.max_elements)
    if case.unordered:
        theirs, ours = _sorted_elements(theirs), _sorted_elements(ours)
    try:
        compare(theirs, ours, case.literal_dtypes)
    except Mismatch as exc:
        pytest.fail(f"{stem}:{name}\n{case.source}\n{exc}", pytrace=False)
