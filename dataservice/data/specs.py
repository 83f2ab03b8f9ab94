"""Element specs: the type of a pipeline's elements, as tf.data's ``element_spec``.

A spec is a nested structure (tuples, namedtuples, dicts, as the elements nest) of
:class:`TensorSpec` leaves: a shape, with ``None`` for a dimension that varies (and
``shape=None`` when even the rank is unknown), and a dtype — a ``numpy.dtype``, the dtype
:data:`string` for ``bytes``/``str`` components, or ``numpy.dtype(object)`` for any other
Python object (which tf.data cannot hold).

Each node computes its spec from its inputs' (``_element_spec``), without running the
pipeline, as tf.data does, except where only an element can tell: a ``map`` without
``output_signature``, ``interleave``/``flat_map`` (their function is called on the input's
first element), ``from_generator`` without a signature, and a node that does not say. There
the input runs in this process up to its first element, on a fresh copy of the pipeline (a
seeded shuffle's later order is untouched), never reading from the service. One element
tells the structure, dtypes and ranks, not which dimensions vary, so such a spec has every
dimension None (``relaxed``); an ``output_signature`` gives static dimensions.

A pipeline's *static* spec (:func:`static_element_spec`) is the spec where no element is
needed, else unknown; it is what ``register_dataset`` stores for ``from_dataset_id``, encoded
with :func:`encode` (no TensorFlow, no pickle).

Example::

    >>> Dataset.range(10).map(lambda x: (x, float(x))).batch(4).element_spec  # map runs once, on 0
    (TensorSpec(shape=(None,), dtype=int64, name=None), TensorSpec(shape=(None,), dtype=float64, name=None))
    >>> Dataset.from_tensor_slices({"x": np.zeros((8, 3), np.float32)}).batch(4, drop_remainder=True).element_spec
    {'x': TensorSpec(shape=(4, 3), dtype=float32, name=None)}
"""

from __future__ import annotations

import collections
import contextvars
import copy
import operator
import threading
import weakref
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import numpy as np

from dataservice.data import structure
from dataservice.data.checkpoint import Follows
from dataservice.data.dataset import Dataset, IteratorContext
from dataservice.data import stats
from dataservice.data.transformations import _OptionsDataset, _UnaryDataset
from dataservice.data.transformations.common import later

__all__ = ["TensorSpec", "DatasetSpec", "string", "as_dtype", "spec_from_value", "as_structure", "element_spec_of",
           "static_element_spec", "first_element", "relaxed", "traced_spec", "returned_dataset_spec",
           "inspected_spec", "needs_element", "batched", "unbatched",
           "padded_batched", "concatenated", "is_compatible", "declared", "with_generator_signature",
           "DeclaredSpecDataset",
           "encode", "decode"]


class _StringDType:
    """The dtype of ``bytes``/``str`` components: tf.data's ``tf.string``.

    Equal to itself and to ``"string"``; ``as_dtype`` also takes ``bytes``, ``str``,
    ``np.bytes_``, ``np.str_`` and numpy "S"/"U" dtypes for it.
    """

    __slots__ = ()
    name = "string"

    def __repr__(self) -> str:
        return "string"

    def __eq__(self, other: object) -> bool:
        return other is self or (isinstance(other, str) and other == "string")

    def __hash__(self) -> int:
        return hash("string")

    def __reduce__(self) -> str:
        return "string"  # the module's singleton, by name


#: The dtype of string components (``bytes`` or ``str`` elements, arrays of them).
string = _StringDType()
_OBJECT = np.dtype(object)

DType = Union[np.dtype, _StringDType]
Shape = Optional[tuple]


def as_dtype(value: Any) -> DType:
    """A spec dtype from a numpy dtype or type, ``bytes``/``str``/``"string"``, or a tf.DType.

    Example::

        >>> as_dtype(np.float32), as_dtype(bytes), as_dtype("int64")
        (dtype('float32'), string, dtype('int64'))
    """
    if isinstance(value, _StringDType):
        return string
    if isinstance(value, str) and value == "string":
        return string
    if any(value is t for t in (bytes, str, np.bytes_, np.str_)):
        return string
    if value is None:
        raise TypeError("dtype must be a numpy dtype, bytes/str/'string' or a tf.DType, got None")
    if hasattr(value, "as_numpy_dtype") and isinstance(getattr(value, "name", None), str):
        # A tf.DType, taken by duck typing (TensorFlow is never imported here).
        if value.name == "string":
            return string
        value = value.as_numpy_dtype
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"dtype must be a numpy dtype, bytes/str/'string' or a tf.DType, got {value!r}") from exc
    return string if dtype.kind in "SU" else dtype


def _as_shape(shape: Any) -> Shape:
    if shape is None:
        return None
    if hasattr(shape, "as_list") and hasattr(shape, "rank"):  # a tf.TensorShape
        if shape.rank is None:
            return None
        shape = shape.as_list()
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)  # as tf.TensorShape(3): one dimension
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"shape must be a tuple of ints and Nones, or None (unknown rank), got {shape!r}")
    dims = []
    for d in shape:
        if d is None:
            dims.append(None)
            continue
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"a shape's dimensions must be ints or None, got {d!r} in {shape!r}")
        if d < 0:
            raise ValueError(f"a shape's dimensions must be >= 0 or None (unknown), got {d} in {shape!r}")
        dims.append(int(d))
    return tuple(dims)


def _shape_repr(shape: Shape) -> str:
    return "<unknown>" if shape is None else repr(shape)


def _dtype_repr(dtype: DType) -> str:
    return dtype.name


def _shapes_compatible(a: Shape, b: Shape) -> bool:
    if a is None or b is None:
        return True
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


class TensorSpec:
    """The type of one component of an element: ``shape`` (``None`` for a dimension that varies,
    ``shape=None`` for an unknown rank), ``dtype`` and an optional ``name``, as ``tf.TensorSpec``.

    Example::

        >>> spec = TensorSpec((None, 3), np.float32)
        >>> spec
        TensorSpec(shape=(None, 3), dtype=float32, name=None)
        >>> spec.is_compatible_with(np.zeros((5, 3), np.float32)), spec.is_compatible_with(TensorSpec((2,), "float32"))
        (True, False)
    """

    __slots__ = ("_shape", "_dtype", "_name")

    def __init__(self, shape: Any, dtype: Any = np.float32, name: Optional[str] = None):
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str or None, got {name!r}")
        self._shape = _as_shape(shape)
        self._dtype = as_dtype(dtype)
        self._name = name

    @property
    def shape(self) -> Shape:
        """A tuple of ints and ``None`` (a dimension that varies); ``None`` when the rank is unknown."""
        return self._shape

    @property
    def dtype(self) -> DType:
        return self._dtype

    @property
    def name(self) -> Optional[str]:
        return self._name

    @classmethod
    def from_value(cls, value: Any) -> "TensorSpec":
        """The spec of one component (an array, a scalar, ``bytes``/``str``, any other object)."""
        if isinstance(value, (tuple, dict)):
            raise TypeError(f"TensorSpec.from_value takes one component, got a {type(value).__name__}; "
                            "use spec_from_value for a nested element")
        return _leaf_spec(structure.normalize(value))

    def is_compatible_with(self, spec_or_value: Any) -> bool:
        """Whether the dtypes are equal and the shapes agree where both are known."""
        other = spec_or_value if isinstance(spec_or_value, TensorSpec) else TensorSpec.from_value(spec_or_value)
        return self._dtype == other._dtype and _shapes_compatible(self._shape, other._shape)

    def most_specific_common_supertype(self, others: Sequence["TensorSpec"]) -> Optional["TensorSpec"]:
        """The most specific spec every one of ``self`` and ``others`` fits, or None if the dtypes differ:
        dimensions that differ become None, different ranks an unknown rank (as tf.TensorSpec)."""
        specs = [self, *others]
        if any(not isinstance(s, TensorSpec) or s._dtype != self._dtype for s in specs):
            return None
        shape = self._shape
        for s in specs[1:]:
            if shape is None or s._shape is None or len(shape) != len(s._shape):
                shape = None
                break
            shape = tuple(a if a == b else None for a, b in zip(shape, s._shape))
        name = self._name if all(s._name == self._name for s in specs) else None
        return TensorSpec(shape, self._dtype, name)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorSpec):
            return NotImplemented
        return self._shape == other._shape and self._dtype == other._dtype and self._name == other._name

    def __hash__(self) -> int:
        return hash((self._shape, self._dtype, self._name))

    def __repr__(self) -> str:
        return f"TensorSpec(shape={_shape_repr(self._shape)}, dtype={_dtype_repr(self._dtype)}, name={self._name!r})"

    def __reduce__(self):
        return (TensorSpec, (self._shape, self._dtype, self._name))


class DatasetSpec:
    """The type of a component that is itself a dataset (a window of ``Dataset.window``, a dataset a
    ``map`` returns), as ``tf.data.DatasetSpec``: the ``element_spec`` of that dataset.

    Example::

        >>> Dataset.range(7).window(2).element_spec
        DatasetSpec(TensorSpec(shape=(), dtype=int64, name=None), TensorShape([]))
        >>> Dataset.from_tensor_slices(([1, 2], [3, 4])).window(2).element_spec[1].element_spec
        TensorSpec(shape=(), dtype=int64, name=None)
    """

    __slots__ = ("_element_spec", "_dataset_shape")

    def __init__(self, element_spec: Any, dataset_shape: Any = ()):
        self._element_spec = as_structure(element_spec, "DatasetSpec's element_spec")
        self._dataset_shape = _as_shape(dataset_shape)

    @property
    def element_spec(self) -> Any:
        """The spec of the dataset's elements."""
        return self._element_spec

    @property
    def shape(self) -> Shape:
        """``()`` for a dataset; ``(n,)`` or ``(None,)`` for a batch of them (``window(...).batch(n)``)."""
        return self._dataset_shape

    @classmethod
    def from_value(cls, value: Dataset) -> "DatasetSpec":
        """The spec of a dataset value."""
        if not isinstance(value, Dataset):
            raise TypeError(f"DatasetSpec.from_value takes a Dataset, got {type(value).__name__}")
        return cls(value.element_spec)

    def is_compatible_with(self, spec_or_value: Any) -> bool:
        """Whether the other (a DatasetSpec or a Dataset) has elements of a compatible spec."""
        other = DatasetSpec.from_value(spec_or_value) if isinstance(spec_or_value, Dataset) else spec_or_value
        if not isinstance(other, DatasetSpec) or not _same_kind(self._element_spec, other._element_spec):
            return False
        return all(a.is_compatible_with(b) for a, b in zip(structure.flatten(self._element_spec),
                                                           structure.flatten(other._element_spec)))

    def most_specific_common_supertype(self, others: Sequence["DatasetSpec"]) -> Optional["DatasetSpec"]:
        """The spec every one of ``self`` and ``others`` fits (leafwise), or None if there is none."""
        if any(not isinstance(s, DatasetSpec) or not _same_kind(self._element_spec, s._element_spec)
               for s in others):
            return None
        common = [a.most_specific_common_supertype(list(rest)) for a, *rest in zip(
            structure.flatten(self._element_spec), *(structure.flatten(s._element_spec) for s in others))]
        if any(c is None for c in common):
            return None
        return DatasetSpec(structure.pack_as(self._element_spec, common), self._dataset_shape)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DatasetSpec):
            return NotImplemented
        return self._dataset_shape == other._dataset_shape and _same_kind(self._element_spec, other._element_spec) \
            and structure.flatten(self._element_spec) == structure.flatten(other._element_spec)

    def __hash__(self) -> int:
        return hash((self._dataset_shape, tuple(structure.flatten(self._element_spec))))

    def __repr__(self) -> str:
        shape = "TensorShape(None)" if self._dataset_shape is None else f"TensorShape({list(self._dataset_shape)})"
        return f"DatasetSpec({self._element_spec!r}, {shape})"

    def __reduce__(self):
        return (DatasetSpec, (self._element_spec, self._dataset_shape))


# --- specs of values ----------------------------------------------------------------------


def _array_dtype(array: np.ndarray) -> DType:
    kind = array.dtype.kind
    if kind in "SU":
        return string
    if kind == "O":
        # Our batches of bytes/str are object arrays (fixed-width ones would drop trailing NULs).
        if array.size and all(isinstance(x, (bytes, str)) for x in array.flat):
            return string
        return _OBJECT
    return array.dtype


def _leaf_spec(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return TensorSpec(value.shape, _array_dtype(value))
    if isinstance(value, Dataset):  # a window, a dataset a map returned: a DatasetSpec, as tf.data's
        return DatasetSpec(value.element_spec)
    if isinstance(value, (bytes, str)):  # np.bytes_ and np.str_ too
        return TensorSpec((), string)
    if isinstance(value, np.generic):
        return TensorSpec((), _OBJECT if value.dtype.kind == "O" else value.dtype)
    return TensorSpec((), _OBJECT)


def spec_from_value(value: Any) -> Any:
    """The spec of an element: its structure, with the spec of each component.

    Example::

        >>> spec_from_value((np.zeros((2, 3)), b"x"))
        (TensorSpec(shape=(2, 3), dtype=float64, name=None), TensorSpec(shape=(), dtype=string, name=None))
    """
    value = structure.normalize(value)
    return structure.map_structure(_leaf_spec, value)


def as_structure(value: Any, what: str = "element_spec") -> Any:
    """``value`` checked as a nested structure of TensorSpecs; a tf.TensorSpec leaf is converted.

    Raises TypeError naming the first leaf that is not a spec.
    """
    if isinstance(value, (TensorSpec, DatasetSpec)):
        return value
    if isinstance(value, tuple):
        items = [as_structure(v, what) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, dict):
        return {k: as_structure(v, what) for k, v in value.items()}
    if hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, (type, np.ndarray, np.generic)):
        # A tf.TensorSpec, taken by duck typing.
        try:
            return TensorSpec(value.shape, value.dtype, getattr(value, "name", None))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{what}: cannot convert {value!r} to a TensorSpec: {exc}") from exc
    kind = "a list (use a tuple)" if isinstance(value, list) else f"{type(value).__name__} {value!r}"
    raise TypeError(f"{what} must be a TensorSpec or a tuple/dict of them, got {kind}")


# --- computing a pipeline's spec ---------------------------------------------------------------

# Set while computing a static spec: no element may be read, no user function called.
_STATIC = contextvars.ContextVar("dataservice_static_element_spec", default=False)
# Specs are kept beside the nodes, not in them: a node's pickle (and so its dataset id) must not
# depend on whether its spec was asked for.
_cache: "weakref.WeakKeyDictionary[Dataset, Any]" = weakref.WeakKeyDictionary()
_static_cache: "weakref.WeakKeyDictionary[Dataset, Any]" = weakref.WeakKeyDictionary()
_cache_lock = threading.Lock()


class _NeedsElement(Exception):
    """Raised in static mode where a spec needs an element; the message says where."""


def _cached(cache: weakref.WeakKeyDictionary, dataset: Dataset) -> Any:
    with _cache_lock:
        try:
            return cache.get(dataset)
        except TypeError:  # a node class that made itself unhashable
            return None


def element_spec_of(dataset: Dataset) -> Any:
    """``dataset.element_spec``: computed once per node (static where it can be, else by inspecting)."""
    static = _STATIC.get()
    spec = _cached(_static_cache, dataset)
    if spec is None and not static:
        spec = _cached(_cache, dataset)
    if spec is not None:
        return spec
    spec = as_structure(dataset._element_spec(), f"the element_spec of {dataset._describe()}")
    with _cache_lock:
        try:
            (_static_cache if static else _cache)[dataset] = spec
        except TypeError:
            pass
    return spec


def static_element_spec(dataset: Dataset) -> tuple[Any, str]:
    """(spec, "") where the spec is known without reading an element or calling a user function;
    (None, why) otherwise, or when computing it raises. Deterministic: the same pipeline gives the
    same answer in any process.

    Example::

        >>> static_element_spec(Dataset.range(3).map(lambda x: x))
        (None, 'Dataset.map(<lambda>) has no output_signature: its element_spec needs one element of its input')
    """
    token = _STATIC.set(True)
    try:
        return element_spec_of(dataset), ""
    except _NeedsElement as exc:
        return None, str(exc)
    except Exception as exc:  # e.g. concatenating incompatible datasets: element_spec raises it
        return None, f"{type(exc).__name__}: {exc}"
    finally:
        _STATIC.reset(token)


def needs_element(why: str) -> None:
    """Call before reading an element or calling a user function to learn a spec: in a static
    computation this stops it, with ``why`` as the reason."""
    if _STATIC.get():
        raise _NeedsElement(why)


def _fresh_copy(node: Dataset, memo: dict) -> Dataset:
    """A copy of the pipeline whose iteration changes nothing in the original: copies go through
    each node's pickling state, so epoch counters (seeded shuffles, list_files) start afresh, and
    an in-memory cache is left alone. Arrays are shared, not copied."""
    if id(node) in memo:
        return memo[id(node)]
    clone = copy.copy(node)
    memo[id(node)] = clone
    if isinstance(clone, _OptionsDataset):  # learning a spec is not a run of the pipeline: record no stats
        clone._options = stats.without_aggregator(clone._options)
    attributes = getattr(clone, "__dict__", {})
    for name, value in list(attributes.items()):
        if isinstance(value, Dataset):
            attributes[name] = _fresh_copy(value, memo)
        elif isinstance(value, tuple) and value and all(isinstance(v, Dataset) for v in value):
            copies = [_fresh_copy(v, memo) for v in value]
            attributes[name] = type(value)(*copies) if hasattr(value, "_fields") else tuple(copies)
    return clone


def first_element(dataset: Dataset, why: str) -> Any:
    """The first element of ``dataset``, read from a fresh copy of it in this process.

    ``why`` says which node needs it (the reason in a static computation, and in errors).
    Raises ValueError if the pipeline reads from the service (reading would take an element from
    the job) or is empty.
    """
    needs_element(why)
    if dataset._reads_from_service():
        raise ValueError(f"cannot compute the element_spec: {why}, and that input reads from the service; an "
                         "element is never read from the service to learn a spec. Declare the spec instead "
                         "(map(..., output_signature=...)).")
    it = iter(_fresh_copy(dataset, {}))
    try:
        return next(it)
    except StopIteration:
        raise ValueError(f"cannot compute the element_spec: {why}, but {dataset._describe()} is empty. "
                         "Declare the spec instead (map(..., output_signature=...)).") from None
    finally:
        it.close()


def _call(fn: Callable, element: Any, where: str) -> Any:
    from dataservice.data.transformations import raise_user_error

    try:
        return fn(*element) if type(element) is tuple else fn(element)
    except Exception as exc:
        raise_user_error(exc, where)


def relaxed(spec: Any) -> Any:
    """``spec`` with every dimension None: what one element tells of all (their structure, dtypes and
    ranks; not which dimensions vary)."""
    return structure.map_structure(
        lambda s: s if isinstance(s, DatasetSpec) else  # a dataset's spec says all of it
        TensorSpec(None if s.shape is None else (None,) * len(s.shape), s.dtype), spec)


def traced_spec(input_dataset: Dataset, fn: Callable, where: str) -> Any:
    """A map's spec without a declared signature: ``fn`` called once on its input's first element;
    the result's structure, dtypes and ranks, with every dimension None."""
    element = first_element(input_dataset, f"{where} has no output_signature: its element_spec needs one "
                                           "element of its input")
    return relaxed(spec_from_value(_call(fn, element, where)))


def returned_dataset_spec(input_dataset: Dataset, fn: Callable, where: str) -> Any:
    """interleave's and flat_map's spec: that of the dataset ``fn`` returns for its input's first element."""
    element = first_element(input_dataset, f"{where}: its element_spec is that of the dataset its function "
                                           "returns, which needs one element of its input")
    returned = _call(fn, element, where)
    if not isinstance(returned, Dataset):
        raise TypeError(f"{where}: the function must return a Dataset, got {type(returned).__name__}")
    return element_spec_of(returned)


def inspected_spec(dataset: Dataset, why: str) -> Any:
    """The spec of ``dataset``'s first element, every dimension None (a node that cannot say otherwise)."""
    return relaxed(spec_from_value(first_element(dataset, why)))


# --- what transformations do to a spec ----------------------------------------------------------


def batched(spec: Any, batch_size: Optional[int]) -> Any:
    """``spec`` with a leading dimension: ``batch_size`` (drop_remainder) or None."""
    return structure.map_structure(
        lambda s: DatasetSpec(s.element_spec, (batch_size,) + s.shape) if isinstance(s, DatasetSpec) else
        TensorSpec(None if s.shape is None else (batch_size,) + s.shape, s.dtype), spec)


def unbatched(spec: Any, where: str) -> Any:
    """``spec`` without its leading dimension; ValueError for a scalar component."""
    def one(s: TensorSpec) -> TensorSpec:
        if s.shape == ():
            raise ValueError(f"{where}: cannot unbatch an input with scalar components (element_spec {spec})")
        if isinstance(s, DatasetSpec):  # batched windows
            return DatasetSpec(s.element_spec, s.shape[1:])
        return TensorSpec(None if s.shape is None else s.shape[1:], s.dtype)

    return structure.map_structure(one, spec)


def padded_batched(spec: Any, batch_size: Optional[int], padded_shapes: Any, where: str) -> Any:
    """padded_batch's spec: the padded shape of each component (its input shape where none is given,
    None for a dimension padded to the batch's longest), after the batch dimension."""
    leaves = structure.flatten(spec)
    if any(isinstance(s, DatasetSpec) for s in leaves):  # TypeError, as tf.data's
        raise TypeError(f"{where}: padded_batch is not supported for datasets of datasets (windows)")
    if padded_shapes is None:
        targets: list = [None] * len(leaves)
    else:
        targets = structure._flatten_up_to(spec, padded_shapes, "padded_shapes")
    out = []
    for s, target in zip(leaves, targets):
        if target is None:
            shape = s.shape
        else:
            dims = [target] if np.isscalar(target) else list(target)
            shape = tuple(None if d is None or d == -1 else int(d) for d in dims)
            if s.shape is not None and (len(shape) != len(s.shape) or any(
                    p is not None and i is not None and p < i for p, i in zip(shape, s.shape))):
                raise ValueError(f"{where}: the padded shape {shape} is not compatible with the shape "
                                 f"{_shape_repr(s.shape)} of the corresponding input component")
        out.append(TensorSpec(None if shape is None else (batch_size,) + shape, s.dtype))
    return structure.pack_as(spec, out)


def _same_kind(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        fa, fb = getattr(a, "_fields", None), getattr(b, "_fields", None)
        return len(a) == len(b) and fa == fb and (fa is None or type(a).__name__ == type(b).__name__) and all(
            _same_kind(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return set(a) == set(b) and all(_same_kind(a[k], b[k]) for k in a)
    if isinstance(a, DatasetSpec) or isinstance(b, DatasetSpec):
        return isinstance(a, DatasetSpec) and isinstance(b, DatasetSpec)
    return isinstance(a, TensorSpec) and isinstance(b, TensorSpec)


def is_compatible(spec: Any, other: Any) -> bool:
    """Whether elements described by ``other`` fit ``spec``, by tf.data's rule (``is_compatible_with``): the
    same structure (tuples, named tuples, dict keys), and component by component the same dtype and shapes
    that agree wherever both are known (a ``None`` dimension, or an unknown rank, fits any). Names are not
    compared.

    Example::

        >>> is_compatible(TensorSpec((None, 8), np.float32), TensorSpec((64, 8), np.float32))
        True
        >>> is_compatible(TensorSpec((), np.int32), TensorSpec((), np.int64))
        False
    """
    return _same_kind(spec, other) and all(
        a.is_compatible_with(b) for a, b in zip(structure.flatten(spec), structure.flatten(other)))


def concatenated(first: Any, second: Any) -> Any:
    """concatenate's spec: the most specific spec both inputs' elements fit (tf.data's rule);
    TypeError when the structures or dtypes differ."""
    def common(a: TensorSpec, b: TensorSpec) -> TensorSpec:
        result = a.most_specific_common_supertype([b])
        if result is None:
            raise TypeError(f"No common supertype of {a} and {b}.")
        return result

    try:
        if not _same_kind(first, second):
            raise TypeError("the structures differ")
        return structure.map_structure(common, first, second)
    except TypeError as exc:
        raise TypeError(f"Incompatible dataset elements in Dataset.concatenate: {first} vs. {second} ({exc})") \
            from None


# --- declared signatures: from_generator's output_signature, map's output_signature ---------------


class _StructureMismatch(Exception):
    """An element nests differently from the declared spec (reported whole by _conformer)."""


def _leaf_conformer(spec: TensorSpec, describe: Callable[[], str], verb: str, component: str) -> Callable:
    dtype, shape = spec.dtype, spec.shape
    where = f" component {component}" if component else " value"

    def check_shape(actual: tuple) -> None:
        if not _shapes_compatible(shape, actual):
            raise ValueError(f"{describe()} {verb} an element whose{where} has shape {actual} where the "
                             f"output_signature says {_shape_repr(shape)}")

    def wrong_type(value: Any, exc: Optional[Exception] = None) -> TypeError:
        shown = f"{type(value).__name__} of dtype {value.dtype}" if isinstance(value, (np.ndarray, np.generic)) \
            else type(value).__name__
        return TypeError(f"{describe()} {verb} an element whose{where} ({shown}) cannot be converted to the "
                         f"output_signature's dtype {_dtype_repr(dtype)}" + (f": {exc}" if exc else ""))

    if dtype is string:
        def conform_string(value: Any) -> Any:
            if isinstance(value, (bytes, str)):
                check_shape(())
            elif isinstance(value, np.ndarray) and value.dtype.kind in "SUO":
                check_shape(value.shape)
            elif isinstance(value, (tuple, dict)):
                raise _StructureMismatch()
            else:
                raise wrong_type(value)
            return value
        return conform_string
    if dtype == _OBJECT:
        def conform_object(value: Any) -> Any:
            if isinstance(value, (tuple, dict)):
                raise _StructureMismatch()
            check_shape(value.shape if isinstance(value, np.ndarray) else ())
            return value
        return conform_object
    scalar = dtype.type
    scalar_ok = shape is None or shape == ()
    exact = shape if shape is not None and None not in shape else None

    def conform(value: Any) -> Any:
        kind = type(value)
        if kind is scalar and scalar_ok:
            return value  # the common cases first: nothing to do
        if kind is np.ndarray:
            have = value.dtype
            if have is dtype or have == dtype:
                if value.shape != exact and shape is not None:
                    check_shape(value.shape)
                return value
        if isinstance(value, (tuple, dict)):
            raise _StructureMismatch()
        if isinstance(value, (bytes, str)) or (isinstance(value, np.ndarray) and value.dtype.kind in "SUO"):
            raise wrong_type(value)
        try:
            array = np.asarray(value, dtype=dtype)
        except (TypeError, ValueError, OverflowError) as exc:
            raise wrong_type(value, exc) from exc
        check_shape(array.shape)
        return array[()] if array.ndim == 0 else array
    return conform


def _node_conformer(spec: Any, describe: Callable[[], str], verb: str, path: str) -> Callable:
    if isinstance(spec, tuple):
        parts = [_node_conformer(v, describe, verb, f"{path}[{i}]") for i, v in enumerate(spec)]
        n = len(parts)
        pairs = list(enumerate(parts))
        make = type(spec) if hasattr(spec, "_fields") else None

        def conform_tuple(element: Any) -> Any:
            if not isinstance(element, tuple) or len(element) != n:
                raise _StructureMismatch()
            values = [f(element[i]) for i, f in pairs]
            return make(*values) if make is not None else tuple(values)
        return conform_tuple
    if isinstance(spec, dict):
        parts = {k: _node_conformer(v, describe, verb, f"{path}[{k!r}]") for k, v in spec.items()}
        keys = set(spec)

        def conform_dict(element: Any) -> Any:
            if not isinstance(element, dict) or element.keys() != keys:
                raise _StructureMismatch()
            return {k: f(element[k]) for k, f in parts.items()}
        return conform_dict
    return _leaf_conformer(spec, describe, verb, path)


def _conformer(spec: Any, describe: Callable[[], str], verb: str) -> Callable[[Any], Any]:
    """A function that makes an element match ``spec`` (converting dtypes as tf.data's from_generator
    does, with numpy's casting; the element takes the spec's tuple, namedtuple or dict) or raises
    naming the mismatch: TypeError for a structure or dtype, ValueError for a shape."""
    inner = _node_conformer(spec, describe, verb, "")

    def conform(element: Any) -> Any:
        try:
            return inner(element)
        except _StructureMismatch:
            raise TypeError(f"{describe()} {verb} an element that does not match the output_signature's "
                            f"structure: expected {spec}, got {spec_from_value(element)}") from None
    return conform


class DeclaredSpecDataset(_UnaryDataset):
    """Its input's elements, each made to match a declared spec (``output_signature``): components
    converted to the declared dtype, shapes and structure checked. Its spec is the declared one, so
    nothing runs to learn it."""

    _op_name = "output_signature"

    def __init__(self, input_dataset: Dataset, spec: Any, verb: str):
        super().__init__(input_dataset)
        self._spec = spec
        self._verb = verb

    def _describe(self) -> str:
        return self._input._describe()

    def _element_spec(self) -> Any:
        return self._spec

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        it = self._input._iterator(ctx)
        return Follows(map(_conformer(self._spec, self._input._describe, self._verb), later(it)), it,
                       self._input)


def declared(dataset: Dataset, output_signature: Any, verb: str = "returned") -> Dataset:
    """``dataset`` with ``output_signature`` declared (map's ``output_signature=``)."""
    return DeclaredSpecDataset(dataset, as_structure(output_signature, "output_signature"), verb)


class _Unconvertible(Exception):
    """A yielded component that cannot take its declared dtype (reported by _generator_conformer)."""


_LITERAL_KINDS = ((bool, "bool"), (np.bool_, "bool"), (int, "int"), (np.integer, "int"), (float, "float"),
                  (np.floating, "float"), (complex, "complex"), (np.complexfloating, "complex"),
                  ((bytes, str), "str"))
#: The Python literal kinds tf.data's convert_to_tensor takes for each kind of dtype.
_LITERALS_FOR = {"b": {"bool"}, "i": {"bool", "int"}, "u": {"bool", "int"}, "f": {"bool", "int", "float"},
                 "c": {"bool", "int", "float", "complex"}}


def _literal_kinds(value: Any, kinds: set) -> set:
    if isinstance(value, (list, tuple)):
        for v in value:
            _literal_kinds(v, kinds)
        return kinds
    for types, kind in _LITERAL_KINDS:
        if isinstance(value, types):
            kinds.add(kind)
            return kinds
    raise _Unconvertible()


def _is_strings(array: np.ndarray) -> bool:
    return array.dtype.kind in "SU" or (array.dtype.kind == "O" and all(isinstance(x, (bytes, str))
                                                                        for x in array.flat))


def _strict_component(value: Any, dtype: DType) -> Any:
    """tf.data's conversion of a component declared with an unknown shape (TensorFlow's
    convert_to_tensor): numpy values are cast (but never numbers to strings or back); Python literals
    only where no information is lost: a float is no int, an int no bool, a number no string."""
    if isinstance(value, (np.ndarray, np.generic)) and not isinstance(value, (np.bytes_, np.str_)):
        array = np.asarray(value)
        if (dtype is string) != _is_strings(array):
            raise _Unconvertible()
        if dtype is string:
            return value
        try:
            return value if array.dtype == dtype else array.astype(dtype)[()]
        except (TypeError, ValueError) as exc:
            raise _Unconvertible() from exc
    kinds = _literal_kinds(value, set())
    if not kinds <= ({"str"} if dtype is string else _LITERALS_FOR.get(dtype.kind, set())):
        raise _Unconvertible()
    try:
        if dtype is string:
            return value if isinstance(value, (bytes, str)) else np.array(value, dtype=object)
        return np.asarray(value).astype(dtype)[()]  # an int wraps into a narrower dtype, as in tf.data
    except (TypeError, ValueError, OverflowError) as exc:  # a ragged list, an int beyond int64
        raise _Unconvertible() from exc


def _lax_component(value: Any, dtype: DType) -> Any:
    """tf.data's conversion of a component with a known shape (numpy's ``asarray(value, dtype)``):
    numpy's casts, so a float becomes an int and "3" the number 3."""
    if dtype is string:
        if isinstance(value, (bytes, str)):
            return value
        try:
            array = np.asarray(value, dtype=object)
        except (TypeError, ValueError) as exc:
            raise _Unconvertible() from exc
        if not all(isinstance(x, (bytes, str)) for x in array.flat):
            raise _Unconvertible()
        return array[()] if array.ndim == 0 else array
    if type(value) is dtype.type:
        return value
    try:
        try:
            array = np.asarray(value, dtype=dtype)
        except OverflowError:  # a Python int too large for dtype: wraps, as in tf.data
            array = np.asarray(value).astype(dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise _Unconvertible() from exc
    return array[()] if array.ndim == 0 else array


def _generator_conformer(spec: Any, describe: Callable[[], str], declared_by: str) -> Callable[[Any], Any]:
    """A function making a yielded element match from_generator's declaration as tf.data does, or
    raising InvalidArgumentError (tf.data's error there) naming the mismatch. tf.data converts a
    component whose declared shape is unknown (``output_types`` alone, or ``TensorSpec(None, ...)``)
    by TensorFlow's rules (``_strict_component``) and otherwise with numpy's casts
    (``_lax_component``), then checks the shape."""
    from dataservice.errors import InvalidArgumentError

    strict = isinstance(spec, TensorSpec) and spec.shape is None

    def fail(message: str, cause: Optional[BaseException] = None) -> InvalidArgumentError:
        error = InvalidArgumentError(f"{describe()} yielded an element {message}")
        error.__cause__ = cause
        return error

    def structure_error(element: Any) -> InvalidArgumentError:
        return fail(f"that does not match the {declared_by}'s structure: expected {spec}, got {element!r}")

    def leaf(s: TensorSpec, path: str) -> Callable[[Any, Any], Any]:
        where = f"component {path}" if path else "value"
        convert = _strict_component if strict else _lax_component

        def conform(value: Any, element: Any) -> Any:
            try:
                out = convert(value, s.dtype)
            except _Unconvertible as exc:
                if isinstance(value, (tuple, dict)) and value is element:
                    raise structure_error(element) from None
                shown = f"{type(value).__name__} of dtype {value.dtype}" if isinstance(
                    value, (np.ndarray, np.generic)) else type(value).__name__
                raise fail(f"whose {where} ({shown}) cannot be converted to the {declared_by}'s dtype "
                           f"{_dtype_repr(s.dtype)}: {value!r:.80}", exc.__cause__) from None
            if s.shape is not None:
                shape = out.shape if isinstance(out, (np.ndarray, np.generic)) else ()
                if not _shapes_compatible(s.shape, shape):
                    raise fail(f"whose {where} has shape {shape} where the {declared_by} says "
                               f"{_shape_repr(s.shape)}")
            return out
        return conform

    def node(s: Any, path: str) -> Callable[[Any, Any], Any]:
        if isinstance(s, tuple):
            parts = [node(v, f"{path}[{i}]") for i, v in enumerate(s)]
            fields = getattr(s, "_fields", None)
            make = type(s) if fields is not None else tuple

            def conform_tuple(value: Any, element: Any) -> Any:
                # tf.nest's rule: a tuple is not a list, a namedtuple needs the same fields.
                if not isinstance(value, tuple) or len(value) != len(parts) or \
                        getattr(value, "_fields", None) != fields:
                    raise structure_error(element)
                values = [f(v, element) for f, v in zip(parts, value)]
                return make(*values) if fields is not None else tuple(values)
            return conform_tuple
        if isinstance(s, dict):
            parts = {k: node(v, f"{path}[{k!r}]") for k, v in s.items()}

            def conform_dict(value: Any, element: Any) -> Any:
                if not isinstance(value, dict) or value.keys() != parts.keys():
                    raise structure_error(element)
                return {k: f(value[k], element) for k, f in parts.items()}
            return conform_dict
        return leaf(s, path)

    top = node(spec, "")
    return lambda element: top(element, element)


class _YieldedSpecDataset(DeclaredSpecDataset):
    """from_generator with a declaration: each yielded element converted and checked as tf.data does
    (``_generator_conformer``); InvalidArgumentError for one that does not fit."""

    def __init__(self, input_dataset: Dataset, spec: Any, declared_by: str):
        super().__init__(input_dataset, spec, "yielded")
        self._declared_by = declared_by

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        # The generator's own values (its source's _raw_elements), not normalized ones: tf.data's rules
        # tell a Python int from a numpy one.
        raw = getattr(self._input, "_raw_elements", None)
        it = raw(ctx) if raw is not None else self._input._iterator(ctx)
        return Follows(map(_generator_conformer(self._spec, self._input._describe, self._declared_by),
                           later(it)), it, self._input)


def with_generator_signature(dataset: Dataset, output_types: Any, output_shapes: Any,
                             output_signature: Any) -> Dataset:
    """from_generator's declarations, as tf.data takes them: ``output_signature``, or ``output_types``
    with optional ``output_shapes`` (unknown shapes where not given); none: the dataset as it is (its
    element_spec then comes from its first element: tf.data refuses that, TypeError)."""
    if output_signature is not None:
        if output_types is not None or output_shapes is not None:
            raise TypeError("from_generator: output_types and output_shapes must not be given with "
                            "output_signature")
        return _YieldedSpecDataset(dataset, as_structure(output_signature, "output_signature"), "output_signature")
    if output_types is None:
        if output_shapes is not None:
            raise TypeError("from_generator: output_shapes needs output_types (or use output_signature)")
        return dataset
    types = structure.flatten(output_types)
    if output_shapes is None:
        shapes: list = [None] * len(types)
    else:
        shapes = structure._flatten_up_to(output_types, output_shapes, "output_shapes")
    try:
        leaves = [TensorSpec(s, t) for t, s in zip(types, shapes)]
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"from_generator: {exc}") from None
    return _YieldedSpecDataset(dataset, structure.pack_as(output_types, leaves), "output_types")


# --- a spec on the wire: PipelineDef.element_spec, without TensorFlow ---------------------------

_namedtuple_types: dict = {}
_namedtuple_lock = threading.Lock()


def _namedtuple(name: str, fields: tuple) -> type:
    # One class per (name, fields), so decoded specs of the same structure share it.
    with _namedtuple_lock:
        kind = _namedtuple_types.get((name, fields))
        if kind is None:
            kind = collections.namedtuple(name, fields)
            _namedtuple_types[(name, fields)] = kind
        return kind


def _dtype_text(dtype: DType) -> str:
    if dtype is string:
        return "string"
    if np.dtype(dtype.name) == dtype:
        return dtype.name
    if np.dtype(dtype.str) == dtype:
        return dtype.str
    raise ValueError(f"the dtype {dtype} cannot be encoded")


def encode(spec: Any):
    """``spec`` as a ``pipeline_pb2.ElementSpecDef``; ValueError for what it cannot hold (a dict key
    that is neither str nor int, a structured numpy dtype)."""
    from dataservice.proto import pipeline_pb2

    if isinstance(spec, TensorSpec):
        tensor = pipeline_pb2.TensorSpecDef(unknown_rank=spec.shape is None, dtype=_dtype_text(spec.dtype))
        if spec.shape is not None:
            tensor.dims.extend(-1 if d is None else d for d in spec.shape)
        if spec.name is not None:
            tensor.name = spec.name
        return pipeline_pb2.ElementSpecDef(tensor=tensor)
    if isinstance(spec, tuple):
        fields = getattr(spec, "_fields", None)
        message = pipeline_pb2.ElementSpecDef()
        message.tuple.SetInParent()  # an empty tuple is a tuple too
        message.tuple.items.extend(encode(v) for v in spec)
        if fields is not None:
            message.tuple.is_namedtuple = True
            message.tuple.namedtuple_name = type(spec).__name__
            message.tuple.namedtuple_fields.extend(fields)
        return message
    if isinstance(spec, dict):
        entries = []
        for key, value in spec.items():
            if isinstance(key, str):
                entries.append(pipeline_pb2.DictSpecEntry(str_key=key, value=encode(value)))
            elif isinstance(key, (int, np.integer)) and not isinstance(key, bool):
                entries.append(pipeline_pb2.DictSpecEntry(int_key=operator.index(key), value=encode(value)))
            else:
                raise ValueError(f"the dict key {key!r} cannot be encoded (only str and int keys)")
        message = pipeline_pb2.ElementSpecDef()
        message.dict.SetInParent()  # an empty dict is a dict too
        message.dict.entries.extend(entries)
        return message
    raise ValueError(f"not a spec: {spec!r}")


def decode(message) -> Any:
    """The inverse of :func:`encode`; a namedtuple comes back as a namedtuple of the same name and fields."""
    kind = message.WhichOneof("kind")
    if kind == "tensor":
        t = message.tensor
        shape = None if t.unknown_rank else tuple(None if d < 0 else d for d in t.dims)
        return TensorSpec(shape, as_dtype(t.dtype), t.name if t.HasField("name") else None)
    if kind == "tuple":
        items = [decode(v) for v in message.tuple.items]
        if message.tuple.is_namedtuple:
            return _namedtuple(message.tuple.namedtuple_name, tuple(message.tuple.namedtuple_fields))(*items)
        return tuple(items)
    if kind == "dict":
        return {(e.str_key if e.WhichOneof("key") == "str_key" else e.int_key): decode(e.value)
                for e in message.dict.entries}
    raise ValueError("an empty ElementSpecDef")
