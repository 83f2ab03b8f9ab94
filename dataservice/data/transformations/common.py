"""What every transformation shares: argument checks with tf.data's kinds of error, user-function
errors that name the transformation, the one-input node, and the options node."""

from __future__ import annotations

from itertools import chain, repeat, starmap
from typing import Any, Callable, Iterator, NoReturn, Optional

import numpy as np

from dataservice.data.background import direct_iterator
from dataservice.data.checkpoint import NodeIterator
from dataservice.data.dataset import (
    Dataset,
    IteratorContext,
)
from dataservice.data.options import AUTOTUNE, Options, default_parallelism
from dataservice.errors import InvalidArgumentError, NotCheckpointableError

ARGUMENT_ERRORS = {
    "a count, size, seed or index that is not an int (e.g. take(1.5), batch('2'))": "TypeError",
    "batch/padded_batch batch_size < 1; shuffle buffer_size < 1 (other than -2: the whole input)":
        "InvalidArgumentError",
    "prefetch buffer_size < -1; shard num_shards < 1 or index outside [0, num_shards)": "InvalidArgumentError",
    "map/interleave num_parallel_calls, interleave cycle_length: 0 or < -1; block_length < 1":
        "InvalidArgumentError",
    "map/filter/flat_map/interleave/take_while/reduce with a function that is not callable": "ValueError",
    "Dataset.zip() with no dataset, or with something other than datasets (a list included)": "TypeError",
    "concatenate of datasets whose structures or dtypes differ": "TypeError",
    "padded_batch padding_values of another dtype than its component": "TypeError",
    "padded_batch padding_values that are not scalars; padded_shapes that do not fit": "ValueError",
    "unbatch of scalar components, or of components whose leading dimensions differ": "ValueError",
    "unique of elements that are not int32, int64 or string": "TypeError",
    "unique of elements with several components": "InvalidArgumentError",
    "apply with a function that does not return a Dataset": "TypeError",
}


def raise_user_error(exc: Exception, where: str) -> NoReturn:
    """Re-raises a user function's exception: same type, message naming ``where``, chained."""
    if getattr(exc, "_dataservice_where", None) is not None:
        raise exc  # an inner transformation already named itself
    try:
        new = type(exc)(f"{exc} [raised in {where}]")
    except Exception:
        new = None
    if new is None or type(new) is not type(exc):
        if hasattr(exc, "add_note"):  # Python >= 3.11
            exc.add_note(f"raised in {where}")
        exc._dataservice_where = where
        raise exc
    new._dataservice_where = where
    raise new from exc


def _check_int(name: str, value: Any) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    return int(value)


def _check_count(name: str, value: Any, minimum: int) -> int:
    # tf.data refuses these values when it builds the op: InvalidArgumentError (a ValueError here).
    value = _check_int(name, value)
    if value < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_signed_count(name: str, value: Any) -> int:
    """take/skip/repeat's count: as tf.data, every negative count means -1 (all, or forever)."""
    return max(-1, _check_int(name, value))


def _check_parallelism(name: str, value: Any) -> Optional[int]:
    if value is None:
        return None
    if _check_int(name, value) == AUTOTUNE:
        return AUTOTUNE
    if value < 1:
        raise InvalidArgumentError(f"{name} must be >= 1 or AUTOTUNE (-1), got {value}")
    return int(value)


def _check_callable(name: str, fn: Any) -> Callable:
    # ValueError, as tf.data's "Argument `func` must be a callable".
    if not callable(fn):
        raise ValueError(f"{name} must be callable, got {fn!r}")
    return fn


def _static_spec(dataset: Dataset) -> Any:
    """``dataset``'s element_spec when it is known without reading an element (else None): what a node
    checks at construction, as tf.data does. A pipeline whose spec needs an element stays lazy."""
    from dataservice.data import specs

    return specs.static_element_spec(dataset)[0]


def _spec_of(element: Any) -> Any:
    from dataservice.data import specs

    return specs.spec_from_value(element)


class _UnaryDataset(Dataset):
    def __init__(self, input_dataset: Dataset):
        if not isinstance(input_dataset, Dataset):
            raise TypeError(f"expected a Dataset, got {type(input_dataset).__name__}")
        self._input = input_dataset

    def _inputs(self) -> tuple[Dataset, ...]:
        return (self._input,)

    def cardinality(self) -> int:
        return self._input.cardinality()

    def _element_spec(self) -> Any:
        # filter, shuffle, repeat, take, skip, prefetch, cache, ...: elements pass through unchanged.
        return self._input.element_spec

    def _producer(self) -> Dataset:
        # Those that keep this _element_spec pass their input's elements on unchanged (see above): the
        # element came from further up.
        if type(self)._element_spec is _UnaryDataset._element_spec:
            return self._input._producer()
        return self


class _OptionsDataset(_UnaryDataset):
    _op_name = "Dataset.with_options"

    def __init__(self, input_dataset: Dataset, options: Options):
        super().__init__(input_dataset)
        if not isinstance(options, Options):
            raise TypeError(f"with_options expects an Options, got {type(options).__name__}")
        self._options = options

    def _merged_options(self) -> Options:
        return self._input._merged_options().merge(self._options)

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        return self._input._iterator(ctx)


def _deterministic(explicit: Optional[bool], ctx: IteratorContext) -> bool:
    if explicit is not None:
        return explicit
    return ctx.options.deterministic is not False


def _in_flight(num_parallel_calls: int, ctx: IteratorContext) -> int:
    n = default_parallelism() if num_parallel_calls == AUTOTUNE else num_parallel_calls
    cap = ctx.options.threading.max_intra_op_parallelism
    return max(1, min(n, cap) if cap else n)


def _result(future, where: str) -> Any:
    try:
        return future.result()
    except Exception as exc:
        raise_user_error(exc, where)


#: What an input's state may be, for ``checkpoint.field``: whatever JSON a node's ``save()`` returns.
STATE = (dict, list, str, int, float, bool, type(None))


def elements_of(it: Iterator) -> Iterator:
    """``it``'s elements, for a loop in C (``for``, islice, zip, map) that reads them one by one. Call it
    when the first element is wanted (in a generator's body, or see ``later``): after a restore.

    A ``NodeIterator``'s ``__next__`` is an instance attribute, which such a loop would look up on the
    type and bind for every element. Mostly it is the ``__next__`` of a generator or a C iterator (a
    ``Follows``, a ``ChunkIterator``): then that one is read directly (``background.direct_iterator``);
    otherwise its ``__next__`` is called directly.

    Example::

        >>> source = Dataset.range(10)._iterator(ctx)
        >>> list(itertools.islice(elements_of(source), 3))
        [0, 1, 2]
    """
    if not isinstance(it, NodeIterator):
        return it
    direct = direct_iterator(it)
    return direct if direct is not it else starmap(it.__next__, repeat(()))


def later(it: Iterator) -> Iterator:
    """``elements_of(it)``, taken at the first element: for a C iterator made now (zip, chain) that reads
    ``it`` once the iterator was restored."""
    return chain.from_iterable(_later(it))


def _later(it: Iterator) -> Iterator:
    yield elements_of(it)


def check_rewindable(rewound: Optional[IteratorContext], node: Dataset) -> None:
    """Before ``node`` saves a state that its input is to be read again from (``IteratorContext.rewound``):
    ``NotCheckpointableError`` if a node in that input found it would not give the same elements again (an
    interleave whose function returned a dataset of no fixed order)."""
    if rewound is not None and rewound.unrewindable is not None:
        raise NotCheckpointableError(f"{node._describe()} cannot be checkpointed: its input "
                                     f"{node._input._describe()} would not be read again alike: {rewound.unrewindable}")


def not_replayed(dataset: Dataset) -> str:
    """Why a node that restores by reading ``dataset`` again cannot (``replays`` said no)."""
    return (f"restoring would read {dataset._describe()} again from a recorded position, and a parallel map or "
            f"interleave with deterministic=False before it gives its elements in another order the second time; "
            f"use deterministic=True there to save this pipeline's state")


def replays(dataset: Dataset, ctx: IteratorContext) -> bool:
    """Whether reading ``dataset`` again from a state it saved gives the same elements in the same order:
    what a node that rewinds its input (``checkpoint.Marks``: reads it again from a recorded state, dropping what
    its consumer took) relies on. Not so when a parallel map or interleave upstream is nondeterministic
    (``deterministic=False``, or ``Options.deterministic`` False), nor past a node that says so
    (``_replays(ctx)`` returning False). Datasets made inside a function (interleave's) are not looked at.

    Example::

        >>> replays(Dataset.range(9).map(f, num_parallel_calls=2, deterministic=False), ctx)
        False
    """
    seen: set = set()
    todo = [dataset]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        own = getattr(node, "_replays", None)
        if own is not None and not own(ctx):
            return False
        if (getattr(node, "_num_parallel_calls", None) is not None
                and not _deterministic(getattr(node, "_deterministic", None), ctx)):
            return False
        todo.extend(node._inputs())
    return True
