"""``SqlDataset``: the rows of a SQL query over a SQLite database.

Each row becomes a tuple converted per ``output_types`` (or a single value
when ``output_types`` is not a tuple). Numbers come out as numpy scalars;
``bytes``/``np.bytes_`` columns as ``bytes`` (text encoded as UTF-8) and
``str``/``np.str_`` columns as ``str``. As in TensorFlow, a NULL becomes 0,
False or an empty string.

The database is opened read-only for each iteration and closed after it, so
a pipeline holds no connection and pickles. A query is one stream of rows
that cannot be divided, so the dataset is not splittable.

Example::

    >>> ds = SqlDataset("sqlite", "/tmp/people.db", "SELECT name, age FROM people",
    ...                 (np.bytes_, np.int32))
    >>> next(iter(ds))
    (b'Ada', 36)
"""

from __future__ import annotations

import itertools
import os
import pathlib
import sqlite3
from typing import Any, Callable, Iterator

import numpy as np

from dataservice.data.checkpoint import NodeIterator, field
from dataservice.data.dataset import Dataset, IteratorContext
from dataservice.errors import NotSplittableError

__all__ = ["SqlDataset"]

#: Rows fetched from SQLite at a time.
_FETCH_ROWS = 1024


def _to_bytes(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    # SQLite renders numbers as text when asked for a string column; so does this.
    return str(value).encode("utf-8")


def _to_str(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


def _numeric_converter(dtype: np.dtype) -> Callable[[Any], Any]:
    scalar = dtype.type
    if dtype.kind == "b":
        return lambda value: scalar(bool(int(value))) if value is not None else scalar(False)
    if dtype.kind in "iu":
        # int() first: a REAL column read as an integer truncates, as sqlite3_column_int64 does.
        return lambda value: scalar(int(value)) if value is not None else scalar(0)
    return lambda value: scalar(value) if value is not None else scalar(0)


def _converter(output_type: Any) -> Callable[[Any], Any]:
    if output_type in (bytes, np.bytes_):
        return _to_bytes
    if output_type in (str, np.str_):
        return _to_str
    try:
        dtype = np.dtype(output_type)
    except TypeError:
        dtype = None
    if dtype is not None and dtype.kind == "S":
        return _to_bytes
    if dtype is not None and dtype.kind == "U":
        return _to_str
    if dtype is None or dtype.kind not in "biuf":
        raise TypeError(f"SqlDataset: unsupported output type {output_type!r}; use a numpy integer, float or "
                        "bool type, bytes/np.bytes_ or str/np.str_")
    return _numeric_converter(dtype)


class SqlDataset(Dataset):
    """The rows of ``query`` run on the SQLite database at ``data_source_name``.

    ``driver_name`` must be "sqlite". ``output_types``: a tuple with one type
    per column (each row is a tuple), or one type for a one-column query (each
    row is a single value).
    """

    _op_name = "SqlDataset"

    def __init__(self, driver_name: str, data_source_name: Any, query: str, output_types: Any):
        if driver_name != "sqlite":
            raise ValueError(f"SqlDataset: driver_name must be 'sqlite' (the only driver), got {driver_name!r}")
        if not isinstance(query, str):
            raise TypeError(f"SqlDataset: query must be a str, got {type(query).__name__}")
        self._data_source_name = os.fsdecode(data_source_name)
        self._query = query
        self._single = not isinstance(output_types, tuple)
        self._output_types = (output_types,) if self._single else tuple(output_types)
        if not self._output_types:
            raise ValueError("SqlDataset: output_types must name at least one type")
        for t in self._output_types:
            _converter(t)  # reject unsupported types now, not at iteration time

    def _describe(self) -> str:
        return f"SqlDataset({self._data_source_name!r}, {self._query!r})"

    def _element_spec(self) -> Any:
        from dataservice.data import specs

        # One scalar per column, typed as output_types says (bytes/str columns: string).
        leaves = tuple(specs.TensorSpec((), t) for t in self._output_types)
        return leaves[0] if self._single else leaves

    def _split_source(self):
        raise NotSplittableError(
            f"{self._describe()} is not splittable: a query's rows cannot be divided into splits. "
            "Use processing_mode='parallel_epochs', or shard the query itself (e.g. WHERE id % n = i).")

    def _connect(self) -> sqlite3.Connection:
        path = self._data_source_name
        if not os.path.exists(path):
            raise FileNotFoundError(2, f"{self._op_name}: no such database file", path)
        # Read-only: a reader must never create or change the database.
        uri = pathlib.Path(path).absolute().as_uri() + "?mode=ro"
        # The generator may be resumed on another thread (prefetch); it alone uses the connection.
        return sqlite3.connect(uri, uri=True, check_same_thread=False)

    def _query_error(self, exc: sqlite3.Error) -> sqlite3.Error:
        try:
            return type(exc)(f"{self._op_name}: {exc}; query: {self._query!r}")
        except Exception:  # pragma: no cover - an exotic subclass
            return exc

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        return _SqlRows(self)

    def _batches(self, at: "_RowCursor") -> Iterator:
        """The list iterators of the converted rows, a fetch at a time (``chain`` flattens them), from row
        ``at.rows`` on."""
        converters = [_converter(t) for t in self._output_types]
        single = self._single
        convert = converters[0]
        connection = self._connect()
        try:
            try:
                cursor = connection.execute(self._query)
            except sqlite3.Error as exc:
                raise self._query_error(exc) from exc
            columns = [d[0] for d in cursor.description or ()]
            if len(columns) != len(converters):
                raise ValueError(
                    f"{self._op_name}: the query returns {len(columns)} columns but output_types has "
                    f"{len(converters)} types; query: {self._query!r}")
            skip = at.rows
            while skip:
                # Passed over as SQLite hands them out, not converted. Not "LIMIT -1 OFFSET n" around the
                # query: SQLite computes the rows an OFFSET drops anyway, so it would save nothing, and
                # wrapping the query in a subquery may change its plan, and so the order of rows of a query
                # without ORDER BY, or fail for one that is not a plain SELECT.
                try:
                    rows = cursor.fetchmany(min(skip, _FETCH_ROWS))
                except sqlite3.Error as exc:
                    raise self._query_error(exc) from exc
                if not rows:
                    raise ValueError(f"the iterator state does not fit {self._describe()}: the query returned "
                                     f"{at.rows - skip} rows, fewer than the saved 'rows' {at.rows} (did the "
                                     "database change?)")
                skip -= len(rows)
            while True:
                try:
                    rows = cursor.fetchmany(_FETCH_ROWS)
                except sqlite3.Error as exc:
                    raise self._query_error(exc) from exc
                if not rows:
                    return
                elements: list = []
                append = elements.append
                try:
                    if single:
                        for row in rows:
                            append(convert(row[0]))
                    else:
                        for row in rows:
                            append(tuple([c(value) for c, value in zip(converters, row)]))
                except (ValueError, TypeError, OverflowError, UnicodeDecodeError) as exc:
                    # The rows before the bad one still come out, then the error.
                    yield at.enter(elements)
                    raise self._conversion_error(rows[len(elements)], columns, converters, exc) from exc
                yield at.enter(elements)
        finally:
            connection.close()

    def _conversion_error(self, row: tuple, columns: list, converters: list, exc: Exception) -> ValueError:
        for column, output_type, convert, value in zip(columns, self._output_types, converters, row):
            try:
                convert(value)
            except Exception:
                return ValueError(f"{self._op_name}: cannot convert column {column!r} value {value!r} to "
                                  f"{getattr(output_type, '__name__', output_type)}: {exc}")
        return ValueError(f"{self._op_name}: cannot convert row {row!r}: {exc}")


class _RowCursor:
    __slots__ = ("rows", "items", "count")

    def __init__(self) -> None:
        self.rows = 0  # rows before the current batch (or to pass over, before the first)
        self.items: Any = None  # the current batch's list iterator
        self.count = 0  # its length

    def enter(self, elements: list) -> Any:
        if self.items is not None:
            self.rows += self.count
        self.count = len(elements)
        self.items = items = iter(elements)
        return items

    def position(self) -> int:
        items = self.items
        if items is None:
            return self.rows
        reduced = items.__reduce__()
        return self.rows + (reduced[2] if len(reduced) > 2 else self.count)


class _SqlRows(NodeIterator):
    """The query's rows. State: ``{"rows": rows taken}``. Restoring runs the query again and passes over
    that many rows as SQLite returns them, without converting them (see ``SqlDataset._batches`` for why not
    an OFFSET); it assumes the database and the order of the query's rows did not change since.

    Example::

        >>> it = iter(SqlDataset("sqlite", "/tmp/people.db", "SELECT age FROM people", np.int32)); next(it)
        >>> it.state_dict()["position"]
        {'rows': 1}
    """

    __slots__ = ("__next__", "_node", "_at", "_batches")

    def __init__(self, node: SqlDataset):
        self._node = node
        self._at = _RowCursor()
        # Nothing runs (no connection) before the first element.
        self._batches = node._batches(self._at)
        self.__next__ = itertools.chain.from_iterable(self._batches).__next__

    def save(self) -> dict:
        return {"rows": self._at.position()}

    def restore(self, state: Any) -> None:
        self._at.rows = field(state, "rows", int, self._node._describe())

    def close(self) -> None:
        self._batches.close()
