"""Encodes what a parity case produced as JSON, the same way on both sides (numpy only, no TensorFlow).

A side supplies how to turn its framework's values into numpy (``to_numpy``), whether a value is a
dataset, how to iterate one, its cardinality and its element_spec; the rest is shared.
"""

from __future__ import annotations

import base64
import math
import os
import tempfile
import traceback
from typing import Any, Callable

import numpy as np

#: Error kinds compared as such; anything else is "other:<class name>".
KNOWN_ERRORS = ("ValueError", "TypeError", "InvalidArgumentError", "OutOfRangeError", "NotFoundError",
                "DataLossError", "StopIteration", "IndexError", "KeyError", "UnimplementedError")


class Side:
    """What differs between TensorFlow and dataservice when running a case."""

    namespace: dict
    is_dataset: Callable[[Any], bool]
    cardinality: Callable[[Any], int]
    element_spec: Callable[[Any], Any]
    iterate: Callable[[Any], Any]
    to_numpy: Callable[[Any], Any]
    error_kind: Callable[[BaseException], str]


def _text(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return "b64:" + base64.b64encode(value).decode()
    return value


def _float(value: float) -> Any:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _leaves(value: Any) -> Any:
    if isinstance(value, list):
        return [_leaves(v) for v in value]
    if isinstance(value, float):
        return _float(value)
    return _text(value)


def dtype_name(dtype: np.dtype) -> str:
    return "string" if dtype.kind in "OSU" else dtype.name


def encode_value(side: Side, value: Any, depth: int = 0) -> Any:
    value = side.to_numpy(value)
    if side.is_dataset(value):
        return {"t": "dataset", "v": encode_elements(side, value, 100, depth + 1)["elements"]}
    if isinstance(value, (bytes, str)):
        return {"t": "str", "v": _text(value)}
    if isinstance(value, bool):
        return {"t": "array", "dtype": "bool", "shape": [], "v": value}
    if isinstance(value, (int, float)) and not isinstance(value, np.generic):
        return {"t": "py" + type(value).__name__, "v": _float(value) if isinstance(value, float) else value}
    if isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
        return {"t": "array", "dtype": dtype_name(array.dtype), "shape": list(array.shape),
                "v": _leaves(array.tolist())}
    if isinstance(value, dict):
        return {"t": "dict", "v": {str(k): encode_value(side, v, depth) for k, v in sorted(value.items())}}
    if isinstance(value, tuple):
        return {"t": "tuple", "v": [encode_value(side, v, depth) for v in value]}
    if isinstance(value, list):
        return {"t": "list", "v": [encode_value(side, v, depth) for v in value]}
    if value is None:
        return {"t": "none"}
    return {"t": "other", "v": type(value).__name__}


def encode_error(side: Side, exc: BaseException, phase: str) -> dict:
    kind = side.error_kind(exc)
    return {"error": kind if kind in KNOWN_ERRORS else f"other:{kind}", "phase": phase,
            "message": str(exc).splitlines()[0][:300] if str(exc) else ""}


def encode_elements(side: Side, ds: Any, max_elements: int, depth: int = 0) -> dict:
    elements = []
    out: dict = {"elements": elements}
    try:
        for element in side.iterate(ds):
            elements.append(encode_value(side, element, depth))
            if len(elements) >= max_elements:
                out["truncated"] = True
                break
    except Exception as exc:  # recorded: the kind of error, and after how many elements
        out["error"] = encode_error(side, exc, "iterate")
    return out


def encode_spec(side: Side, spec: Any) -> Any:
    return side.encode_spec(spec)


def run_case(side: Side, source: str, max_elements: int) -> dict:
    """Runs ``source`` on ``side``; returns its outcome as JSON-ready data."""
    namespace = dict(side.namespace)
    with tempfile.TemporaryDirectory() as tmp:
        namespace["tmp"] = tmp + os.sep
        try:
            exec(compile(source, "<case>", "exec"), namespace)
        except Exception as exc:
            return {"raised": encode_error(side, exc, "construct")}
        except BaseException:
            return {"raised": {"error": "other:" + traceback.format_exc().splitlines()[-1], "phase": "construct"}}
        if "ds" in namespace:
            ds = namespace["ds"]
            outcome: dict = {}
            try:
                outcome["cardinality"] = side.cardinality(ds)
            except Exception as exc:
                outcome["cardinality"] = encode_error(side, exc, "cardinality")
            try:
                outcome["element_spec"] = side.encode_spec(side.element_spec(ds))
            except Exception as exc:
                outcome["element_spec"] = encode_error(side, exc, "element_spec")
            outcome.update(encode_elements(side, ds, max_elements))
            return outcome
        if "result" in namespace:
            return {"result": encode_value(side, namespace["result"])}
        return {"raised": {"error": "other:the case defines neither ds nor result", "phase": "construct"}}
