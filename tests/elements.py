"""Elements as plain Python values, so tests can compare them with ``==``."""

import numpy as np


def values(ds, tuples_as_lists: bool = False):
    """The elements of ``ds`` with arrays as lists and numpy scalars as Python numbers
    (and tuples as lists with ``tuples_as_lists``, to compare with what JSON gives back)."""
    def conv(x):
        if isinstance(x, np.ndarray):
            return x.tolist()
        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, tuple):
            items = [conv(v) for v in x]
            return items if tuples_as_lists else tuple(items)
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        return x
    return [conv(x) for x in ds]


def ints(dataset) -> list[int]:
    """The elements of ``dataset`` as Python ints."""
    return [int(x) for x in dataset]
