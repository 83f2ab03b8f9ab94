"""Pipeline options, after ``tf.data.Options``.

Example::

    >>> opts = Options()
    >>> opts.deterministic = False
    >>> opts.threading.private_threadpool_size = 4
    >>> opts.experimental_distribute.split_group_size = 8   # distributed_epoch: 8 splits per group
    >>> ds = Dataset.range(10).map(f, num_parallel_calls=AUTOTUNE).with_options(opts)
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

__all__ = ["AUTOTUNE", "DistributeOptions", "Options", "ThreadingOptions", "default_parallelism"]

#: Let the executor pick a level of parallelism (the number of cores).
AUTOTUNE = -1


def default_parallelism() -> int:
    """What AUTOTUNE resolves to: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


@dataclasses.dataclass
class ThreadingOptions:
    """Threads a pipeline may use.

    ``private_threadpool_size``: the most threads the whole pipeline runs user
    functions on at once (None: the number of cores).
    ``max_intra_op_parallelism``: the most of those one transformation may
    use at once (None: no cap beyond its own ``num_parallel_calls``).
    """

    private_threadpool_size: Optional[int] = None
    max_intra_op_parallelism: Optional[int] = None

    def __setattr__(self, name: str, value) -> None:
        if name not in ("private_threadpool_size", "max_intra_op_parallelism"):
            raise AttributeError(f"ThreadingOptions has no option {name!r}")
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        super().__setattr__(name, value)


@dataclasses.dataclass
class DistributeOptions:
    """How the service runs a pipeline (``Options.experimental_distribute``, after tf.data's).

    ``split_group_size``: in distributed_epoch, the least number of consecutive source splits a
    worker runs the pipeline over together — the unit of recovery after a worker loss (see
    ``Dataset.split_groups``). None: derived from the pipeline (interleave cycles, shuffle buffers).
    """

    split_group_size: Optional[int] = None

    def __setattr__(self, name: str, value) -> None:
        if name != "split_group_size":
            raise AttributeError(f"DistributeOptions has no option {name!r}")
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        super().__setattr__(name, value)


@dataclasses.dataclass
class Options:
    """Options for a pipeline, set with ``Dataset.with_options``.

    ``deterministic``: when False, parallel ``map`` and ``interleave`` whose own
    ``deterministic`` argument is None may yield elements out of order to avoid
    head-of-line blocking. None means True.
    ``threading``: a ``ThreadingOptions``; ``experimental_distribute``: a ``DistributeOptions``.
    """

    deterministic: Optional[bool] = None
    threading: ThreadingOptions = dataclasses.field(default_factory=ThreadingOptions)
    experimental_distribute: DistributeOptions = dataclasses.field(default_factory=DistributeOptions)

    def __setattr__(self, name: str, value) -> None:
        if name not in ("deterministic", "threading", "experimental_distribute"):
            raise AttributeError(f"Options has no option {name!r}")
        if name == "deterministic" and value is not None and not isinstance(value, bool):
            raise ValueError(f"deterministic must be a bool or None, got {value!r}")
        if name == "threading" and not isinstance(value, ThreadingOptions):
            raise ValueError("threading must be a ThreadingOptions")
        if name == "experimental_distribute" and not isinstance(value, DistributeOptions):
            raise ValueError("experimental_distribute must be a DistributeOptions")
        super().__setattr__(name, value)

    def merge(self, other: "Options") -> "Options":
        """A new Options with ``other``'s set values overriding this one's."""
        def pick(a, b):
            return b if b is not None else a

        return Options(
            deterministic=pick(self.deterministic, other.deterministic),
            threading=ThreadingOptions(
                private_threadpool_size=pick(self.threading.private_threadpool_size,
                                             other.threading.private_threadpool_size),
                max_intra_op_parallelism=pick(self.threading.max_intra_op_parallelism,
                                              other.threading.max_intra_op_parallelism),
            ),
            experimental_distribute=DistributeOptions(
                split_group_size=pick(self.experimental_distribute.split_group_size,
                                      other.experimental_distribute.split_group_size),
            ),
        )
