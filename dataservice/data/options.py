"""Pipeline options, after ``tf.data.Options``.

Every option here acts; tf.data's others (``experimental_optimization``, ``experimental_slack``,
``autotune``, ...) are absent, so setting one raises AttributeError rather than being ignored.
``experimental_deterministic`` and ``experimental_threading`` are tf.data's older spellings of
``deterministic`` and ``threading`` (the same option, read and set through either name).

Example::

    >>> opts = Options()
    >>> opts.experimental_deterministic = False       # the same as opts.deterministic = False
    >>> opts.threading.private_threadpool_size = 4
    >>> opts.experimental_distribute.split_group_size = 8   # distributed_epoch: 8 splits per group
    >>> ds = Dataset.range(10).map(f, num_parallel_calls=AUTOTUNE).with_options(opts)
    >>> ds.options() == opts
    True
"""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any, Optional

__all__ = ["AUTOTUNE", "DistributeOptions", "Options", "ThreadingOptions", "default_parallelism"]

#: Let the executor pick a level of parallelism (the number of cores).
AUTOTUNE = -1


def default_parallelism() -> int:
    """What AUTOTUNE resolves to: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _check_positive_int(name: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int or None, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{name} must be >= 1 or None, got {value}")


class _OptionsGroup:
    """What Options and its groups share: only declared options can be set (an unknown name raises
    AttributeError, never being silently kept), each checked by ``_check``; tf.data's older
    spellings (``_ALIASES``) name the same option; ``==`` compares values (dataclass); ``merge``
    takes the other's value wherever it differs from the default; a read-only copy (what
    ``Dataset.options()`` returns) refuses changes with ValueError, as tf.data does, since a change
    there would have no effect.

    A new option is one dataclass field (a value, or a group: an ``_OptionsGroup`` made by its
    ``default_factory``) and, if its values need checking, a case in ``_check``.
    """

    _ALIASES: dict = {}

    def _check(self, name: str, value: Any) -> None:
        """Raises TypeError/ValueError for a bad ``value`` of option ``name``."""

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails: the older spellings.
        target = type(self)._ALIASES.get(name)
        if target is None:
            raise AttributeError(f"{type(self).__name__} has no option {name!r}")
        return getattr(self, target)

    def __setattr__(self, name: str, value: Any) -> None:
        name = type(self)._ALIASES.get(name, name)
        if self.__dict__.get("_read_only"):
            raise ValueError(
                f"cannot set {type(self).__name__}.{name}: these are the options Dataset.options() returned, and "
                "changing them would have no effect. Set options with Dataset.with_options(options).")
        defaults = self._defaults()
        if name not in defaults:
            known = ", ".join(sorted(defaults) + sorted(type(self)._ALIASES))
            raise AttributeError(f"{type(self).__name__} has no option {name!r} (its options: {known})")
        default = defaults[name]
        if isinstance(default, _OptionsGroup) and not isinstance(value, type(default)):
            raise TypeError(f"{name} must be a {type(default).__name__}, got {type(value).__name__}")
        self._check(name, value)
        object.__setattr__(self, name, value)

    @classmethod
    def _defaults(cls) -> dict:
        """Each option's default, by name, made once per class (a group's default instance is only
        compared with and type-checked against, never changed)."""
        cached = cls.__dict__.get("_defaults_cache")
        if cached is None:
            cached = {f.name: _default(f) for f in dataclasses.fields(cls)}
            type.__setattr__(cls, "_defaults_cache", cached)
        return cached

    def _merged(self, other: "_OptionsGroup") -> "_OptionsGroup":
        out = copy.copy(self)
        out.__dict__.pop("_read_only", None)
        for name, default in self._defaults().items():
            mine, theirs = getattr(self, name), getattr(other, name)
            if isinstance(default, _OptionsGroup):
                value = mine._merged(theirs)
            else:
                value = theirs if theirs != default else mine
            object.__setattr__(out, name, value)
        return out

    def _frozen(self) -> "_OptionsGroup":
        out = copy.copy(self)
        for name, default in self._defaults().items():
            if isinstance(default, _OptionsGroup):
                object.__setattr__(out, name, getattr(self, name)._frozen())
        object.__setattr__(out, "_read_only", True)
        return out

    def __getstate__(self) -> dict:
        # A read-only copy pickles as a plain one: the flag is not part of the options' value.
        state = dict(self.__dict__)
        state.pop("_read_only", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)


def _default(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


@dataclasses.dataclass(eq=True)
class ThreadingOptions(_OptionsGroup):
    """Threads a pipeline may use (``Options.threading``, or ``Options.experimental_threading``).

    ``private_threadpool_size``: the most threads the whole pipeline runs user
    functions on at once (None: the number of cores).
    ``max_intra_op_parallelism``: the most of those one transformation may
    use at once (None: no cap beyond its own ``num_parallel_calls``).

    Example::

        >>> opts = Options()
        >>> opts.experimental_threading.private_threadpool_size = 10
        >>> opts.threading.private_threadpool_size
        10
    """

    private_threadpool_size: Optional[int] = None
    max_intra_op_parallelism: Optional[int] = None

    def _check(self, name: str, value: Any) -> None:
        _check_positive_int(name, value)


@dataclasses.dataclass(eq=True)
class DistributeOptions(_OptionsGroup):
    """How the service runs a pipeline (``Options.experimental_distribute``, after tf.data's).

    ``split_group_size``: in distributed_epoch, the least number of consecutive source splits a
    worker runs the pipeline over together — the unit of recovery after a worker loss (see
    ``Dataset.split_groups``). None: derived from the pipeline (interleave cycles, shuffle buffers).
    tf.data's ``auto_shard_policy`` and ``num_devices`` are absent (sharding is the dispatcher's).

    Example::

        >>> opts = Options()
        >>> opts.experimental_distribute.split_group_size = 8
    """

    split_group_size: Optional[int] = None

    def _check(self, name: str, value: Any) -> None:
        _check_positive_int(name, value)


def _stats_options() -> "_OptionsGroup":
    from dataservice.data.stats import StatsOptions

    return StatsOptions()


@dataclasses.dataclass(eq=True)
class Options(_OptionsGroup):
    """Options for a pipeline, set with ``Dataset.with_options``, as ``tf.data.Options``.

    ``deterministic`` (or ``experimental_deterministic``): when False, parallel ``map`` and
    ``interleave`` whose own ``deterministic`` argument is None may yield elements out of order to
    avoid head-of-line blocking. None means True.
    ``threading`` (or ``experimental_threading``): a ``ThreadingOptions``.
    ``experimental_distribute``: a ``DistributeOptions``.
    ``experimental_stats``: a ``StatsOptions`` (``dataservice.data.experimental``): statistics.

    ``a == b`` compares the values set; ``a.merge(b)`` is a new Options with ``b``'s settings
    overriding ``a``'s (unset ones keep ``a``'s). ``Dataset.options()`` returns a read-only copy:
    setting an option on it raises ValueError (it would have no effect); use ``with_options``.

    Example::

        >>> opts = Options()
        >>> opts.experimental_deterministic = False
        >>> Dataset.range(42).with_options(opts).options().deterministic
        False
    """

    _ALIASES = {"experimental_deterministic": "deterministic", "experimental_threading": "threading"}

    deterministic: Optional[bool] = None
    threading: ThreadingOptions = dataclasses.field(default_factory=ThreadingOptions)
    experimental_distribute: DistributeOptions = dataclasses.field(default_factory=DistributeOptions)
    #: A ``dataservice.data.stats.StatsOptions`` (made on demand: that module builds on this one).
    experimental_stats: Any = dataclasses.field(default_factory=_stats_options)

    def _check(self, name: str, value: Any) -> None:
        if name == "deterministic" and value is not None and not isinstance(value, bool):
            raise TypeError(f"deterministic must be a bool or None, got {value!r} ({type(value).__name__})")

    def merge(self, options: "Options") -> "Options":
        """A new Options: ``options``' settings override this one's; what it leaves unset stays.

        Example::

            >>> a, b = Options(), Options()
            >>> a.deterministic, b.threading.private_threadpool_size = False, 4
            >>> merged = a.merge(b)
            >>> merged.deterministic, merged.threading.private_threadpool_size
            (False, 4)
        """
        if not isinstance(options, Options):
            raise TypeError(f"Options.merge expects an Options, got {type(options).__name__}")
        return self._merged(options)

    def read_only(self) -> "Options":
        """A copy that refuses changes (ValueError): what ``Dataset.options()`` hands out."""
        return self._frozen()
