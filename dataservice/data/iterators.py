"""``Optional``: a value that may be absent, as ``tf.experimental.Optional``.

``iter(dataset).get_next_as_optional()`` returns one: the next element, or no value at the end of
the dataset (where ``get_next()`` raises ``errors.OutOfRangeError``).

Example::

    >>> it = iter(Dataset.from_tensors(42))
    >>> opt = it.get_next_as_optional()
    >>> opt.has_value(), opt.get_value()
    (True, 42)
    >>> it.get_next_as_optional().has_value()
    False
"""

from __future__ import annotations

from typing import Any

__all__ = ["Optional"]

_UNSET = object()


class Optional:
    """A value, or none, with the ``element_spec`` of the value it holds or would hold.

    Make one with ``Optional.from_value(value)`` or ``Optional.empty(element_spec)``; an iterator's
    ``get_next_as_optional()`` makes them too. ``get_value()`` on an empty one raises
    ``errors.InvalidArgumentError``, as TensorFlow's.

    Example::

        >>> Optional.from_value((1, b"a")).get_value()
        (1, b'a')
        >>> Optional.empty(TensorSpec((), np.int64)).has_value()
        False
    """

    __slots__ = ("_value", "_spec", "_spec_source")

    def __init__(self, value: Any = _UNSET, element_spec: Any = None, spec_source: Any = None):
        # Not for users (use from_value / empty). spec_source: a dataset whose element_spec this has,
        # asked only if element_spec is (computing a spec can mean reading an element).
        self._value = value
        self._spec = element_spec
        self._spec_source = spec_source

    @staticmethod
    def from_value(value: Any) -> "Optional":
        """An Optional holding ``value`` (any element: a nesting of arrays, scalars, strings)."""
        from dataservice.data import structure

        return Optional(structure.normalize(value))

    @staticmethod
    def empty(element_spec: Any) -> "Optional":
        """An Optional without a value, for values of ``element_spec`` (a structure of TensorSpec)."""
        from dataservice.data import specs

        return Optional(element_spec=specs.as_structure(element_spec, "Optional.empty's element_spec"))

    def has_value(self) -> bool:
        """Whether there is a value (a Python bool; TensorFlow's is a bool tensor)."""
        return self._value is not _UNSET

    def get_value(self) -> Any:
        """The value; ``errors.InvalidArgumentError`` if there is none (TensorFlow raises that too)."""
        if self._value is _UNSET:
            from dataservice.errors import InvalidArgumentError

            raise InvalidArgumentError("The given optional does not have a value.")
        return self._value

    @property
    def element_spec(self) -> Any:
        """The spec of the value (the iterator's element_spec, for one from ``get_next_as_optional``)."""
        if self._spec is None:
            from dataservice.data import specs

            if self._spec_source is not None:
                self._spec = self._spec_source.element_spec
            elif self._value is not _UNSET:
                self._spec = specs.spec_from_value(self._value)
            else:
                raise ValueError("this empty Optional was made without an element_spec")
        return self._spec

    def __repr__(self) -> str:
        return f"Optional({self._value!r})" if self.has_value() else "Optional(<no value>)"
