"""Nested element structures: normalisation to numpy, batching and unbatching.

An element is a leaf (a numpy array or scalar, ``bytes``, ``str`` or any other
Python object) or a tuple/namedtuple/dict nesting of elements. Python numbers
become numpy scalars so that iteration yields what tf.data's
``as_numpy_iterator`` yields.

Example::

    >>> stack([(np.int64(1), b"a"), (np.int64(2), b"b")])
    (array([1, 2]), array([b'a', b'b'], dtype=object))
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from dataservice.data import batch_memory

__all__ = ["normalize", "flatten", "pack_as", "map_structure", "stack", "unstack", "pad_and_stack",
           "assert_same_structure"]

_LEAF_FAST = (np.ndarray, np.generic, bytes, str)


def normalize(value: Any) -> Any:
    """Converts Python numbers and lists to numpy; keeps tuples, dicts, bytes and str."""
    if isinstance(value, _LEAF_FAST):
        return value
    if isinstance(value, bool):
        return np.bool_(value)
    if isinstance(value, int):
        return np.int64(value)
    if isinstance(value, float):
        return np.float64(value)
    if isinstance(value, tuple):
        if hasattr(value, "_fields"):
            return type(value)(*(normalize(v) for v in value))
        return tuple(normalize(v) for v in value)
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items()}
    if isinstance(value, list):
        return _list_to_array(value)
    return value


def _list_to_array(value: list) -> np.ndarray:
    try:
        arr = np.asarray(value)
    except ValueError as exc:
        raise ValueError(f"cannot convert a ragged list to an array: {exc}") from exc
    if arr.dtype.kind in "US":
        # tf.data turns strings into bytes only at its edges; we keep str but
        # as an object array so that elements come back as plain ``str``. Bytes
        # too: a fixed-width "S" array would drop their trailing NUL bytes.
        arr = np.array(value, dtype=object)
    return arr


def flatten(value: Any) -> list:
    """The leaves of ``value`` in a defined order (dict keys sorted, as tf.nest does)."""
    if isinstance(value, tuple):
        out: list = []
        for v in value:
            out.extend(flatten(v))
        return out
    if isinstance(value, dict):
        out = []
        for k in sorted(value):
            out.extend(flatten(value[k]))
        return out
    return [value]


def pack_as(structure: Any, leaves: Sequence) -> Any:
    """Inverse of :func:`flatten`: rebuilds ``structure`` with ``leaves``."""
    it = iter(leaves)
    result = _pack(structure, it)
    return result


def _pack(structure: Any, it) -> Any:
    if isinstance(structure, tuple):
        items = [_pack(v, it) for v in structure]
        return type(structure)(*items) if hasattr(structure, "_fields") else tuple(items)
    if isinstance(structure, dict):
        packed = {k: _pack(structure[k], it) for k in sorted(structure)}
        return {k: packed[k] for k in structure}
    return next(it)


def map_structure(fn: Callable, *structures: Any) -> Any:
    """Applies ``fn`` leafwise over structures of the same shape."""
    first = structures[0]
    if isinstance(first, tuple):
        items = [map_structure(fn, *parts) for parts in zip(*structures)]
        return type(first)(*items) if hasattr(first, "_fields") else tuple(items)
    if isinstance(first, dict):
        return {k: map_structure(fn, *(s[k] for s in structures)) for k in first}
    return fn(*structures)


def assert_same_structure(a: Any, b: Any, what: str = "elements") -> None:
    """Raises TypeError when ``a`` and ``b`` nest differently."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        if not (isinstance(a, tuple) and isinstance(b, tuple)) or len(a) != len(b):
            raise TypeError(f"{what} have different structures: {_describe(a)} vs {_describe(b)}")
        for x, y in zip(a, b):
            assert_same_structure(x, y, what)
    elif isinstance(a, dict) or isinstance(b, dict):
        if not (isinstance(a, dict) and isinstance(b, dict)) or set(a) != set(b):
            raise TypeError(f"{what} have different structures: {_describe(a)} vs {_describe(b)}")
        for k in a:
            assert_same_structure(a[k], b[k], what)


def _describe(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(_describe(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_describe(v)}" for k, v in value.items()) + "}"
    return "leaf"


def _stack_leaves(leaves: list, component: int) -> Any:
    first = leaves[0]
    if isinstance(first, np.ndarray):
        shape = first.shape
        for i, leaf in enumerate(leaves):
            if not isinstance(leaf, np.ndarray) or leaf.shape != shape:
                other = np.shape(leaf)
                raise ValueError(
                    f"Cannot batch tensors with different shapes in component {component}. "
                    f"First element had shape {list(shape)} and element {i} had shape {list(other)}."
                )
        dtype = first.dtype
        if all(leaf.dtype == dtype for leaf in leaves):
            # In a worker, a large batch may go straight into memory a reader maps (batch_memory).
            out = batch_memory.allocate((len(leaves), *shape), dtype)
            if out is not None:
                return np.stack(leaves, out=out)
        return np.stack(leaves)
    if isinstance(first, (np.generic, bool, int, float)) and not isinstance(first, (bytes, str, np.str_, np.bytes_)):
        # One C loop over the scalars: the common case of batching a range.
        arr = np.array(leaves)
        if arr.ndim != 1:
            raise ValueError(f"Cannot batch scalars mixed with arrays in component {component}.")
        return arr
    arr = np.empty(len(leaves), dtype=object)
    for i, leaf in enumerate(leaves):
        arr[i] = leaf
    return arr


def stack(elements: list) -> Any:
    """Batches a list of same-structured elements along a new first axis."""
    first = elements[0]
    if not isinstance(first, (tuple, dict)):
        return _stack_leaves(elements, 0)
    flat = [flatten(e) for e in elements]
    n = len(flat[0])
    for i, f in enumerate(flat):
        if len(f) != n:
            raise TypeError(f"Cannot batch elements with different structures: element 0 and element {i}.")
    columns = [_stack_leaves([f[j] for f in flat], j) for j in range(n)]
    return pack_as(first, columns)


def _leaf_rows(leaf: Any) -> Sequence:
    if isinstance(leaf, np.ndarray):
        if leaf.ndim == 0:
            raise ValueError("Cannot unbatch an element with a scalar component; every component needs a batch axis.")
        return leaf
    raise ValueError(f"Cannot unbatch a component of type {type(leaf).__name__}; it has no batch axis.")


def unstack(element: Any) -> list:
    """Splits an element along its first axis; every leaf must have the same length."""
    if not isinstance(element, (tuple, dict)):
        return list(_leaf_rows(element))
    leaves = [_leaf_rows(leaf) for leaf in flatten(element)]
    n = len(leaves[0])
    for leaf in leaves:
        if len(leaf) != n:
            raise ValueError(
                f"Cannot unbatch components with different batch sizes: {n} and {len(leaf)}.")
    return [pack_as(element, [leaf[i] for leaf in leaves]) for i in range(n)]


def pad_and_stack(elements: list, padded_shapes: Any = None, padding_values: Any = None) -> Any:
    """Pads each leaf to a common shape (the batch maximum, or ``padded_shapes``) then stacks."""
    first = elements[0]
    flat = [flatten(e) for e in elements]
    n = len(flat[0])
    # Flatten only down to the element's leaves: a component's shape may itself be
    # a tuple, as in padded_shapes=((4, None), (2,)).
    shapes = _flatten_up_to(first, padded_shapes, "padded_shapes") if padded_shapes is not None else [None] * n
    values = (_flatten_up_to(first, padding_values, "padding_values")
              if isinstance(padding_values, (tuple, dict)) else [padding_values] * n)
    columns = []
    for j in range(n):
        leaves = [np.asarray(f[j]) for f in flat]
        columns.append(_pad_column(leaves, shapes[j], values[j], j))
    if not isinstance(first, (tuple, dict)):
        return columns[0]
    return pack_as(first, columns)


def _flatten_up_to(template: Any, value: Any, what: str) -> list:
    """``value``'s parts at the positions of ``template``'s leaves (in :func:`flatten` order)."""
    if isinstance(template, tuple):
        if not isinstance(value, (tuple, list)) or len(value) != len(template):
            raise ValueError(f"{what} must match the structure of the elements: {_describe(template)}")
        out: list = []
        for t, v in zip(template, value):
            out.extend(_flatten_up_to(t, v, what))
        return out
    if isinstance(template, dict):
        if not isinstance(value, dict) or set(value) != set(template):
            raise ValueError(f"{what} must match the structure of the elements: {_describe(template)}")
        out = []
        for k in sorted(template):
            out.extend(_flatten_up_to(template[k], value[k], what))
        return out
    return [value]


def _pad_column(leaves: list, shape: Any, value: Any, component: int) -> np.ndarray:
    ndim = leaves[0].ndim
    for leaf in leaves:
        if leaf.ndim != ndim:
            raise ValueError(f"Cannot pad component {component}: elements have different ranks.")
    max_shape = [max(leaf.shape[d] for leaf in leaves) for d in range(ndim)]
    if shape is not None:
        shape = [shape] if np.isscalar(shape) else list(shape)
        if len(shape) != ndim:
            raise ValueError(
                f"padded_shapes for component {component} has rank {len(shape)} but the elements have rank {ndim}.")
        target = []
        for d, (want, have) in enumerate(zip(shape, max_shape)):
            if want is None or want == -1:
                target.append(have)
            else:
                if have > want:
                    raise ValueError(
                        f"Component {component} has size {have} in dimension {d}, larger than the padded shape {want}.")
                target.append(int(want))
    else:
        target = max_shape
    # The common dtype, not the first element's: "<U1" would truncate a longer string.
    dtype = np.result_type(*leaves)
    if value is None:
        # tf.data pads strings with the empty string.
        if dtype.kind == "U" or (dtype.kind == "O" and any(isinstance(v, str) for leaf in leaves
                                                           for v in leaf.flat)):
            fill = ""
        else:
            fill = b"" if dtype.kind in "SO" else 0
    else:
        fill = value
    out = np.full([len(leaves)] + target, fill, dtype=dtype)
    for i, leaf in enumerate(leaves):
        out[(i,) + tuple(slice(0, s) for s in leaf.shape)] = leaf
    return out
