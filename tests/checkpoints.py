"""Checking that an iterator resumes exactly: the state after k elements, through JSON, restored in a fresh
iterator of the pipeline built again, gives the rest of the uninterrupted run.

Example::

    assert_resumes(lambda: Dataset.range(100).map(lambda x: x * 2))
"""

from __future__ import annotations

import collections
import json
from typing import Any, Callable, Iterable, Optional

import numpy as np


def typed(x: Any) -> Any:
    """An element as comparable plain data that keeps dtypes and structure: arrays as (dtype, shape, list)."""
    if isinstance(x, np.ndarray):
        return ("array", x.dtype.str, x.shape, x.tolist())
    if isinstance(x, np.generic):
        return ("scalar", x.dtype.str, x.item())
    if isinstance(x, tuple):
        return (type(x).__name__,) + tuple(typed(v) for v in x)
    if isinstance(x, dict):
        return ("dict",) + tuple((k, typed(x[k])) for k in sorted(x))
    if isinstance(x, list):
        return ("list",) + tuple(typed(v) for v in x)
    return (type(x).__name__, x)


def hashable(x: Any) -> Any:
    """``typed`` made hashable (lists as tuples), for multiset comparisons."""
    if isinstance(x, (list, tuple)):
        return tuple(hashable(v) for v in x)
    return x


def default_cuts(n: int) -> list[int]:
    """0, 1, the middle, the last element and the end."""
    return sorted({0, min(1, n), n // 2, max(0, n - 1), n})


def state_after(make: Callable[[], Any], k: int) -> tuple[list, dict]:
    """The first ``k`` elements of a fresh iterator and its state then (through JSON); the state taken
    twice, to check that taking it changes nothing."""
    it = iter(make())
    head = [typed(next(it)) for _ in range(k)]
    first = it.state_dict()
    text = json.dumps(first)
    assert json.loads(json.dumps(it.state_dict())) == json.loads(text), "taking the state twice gave two states"
    it.close()
    return head, json.loads(text)


def resumed(make: Callable[[], Any], state: dict, limit: Optional[int] = None) -> list:
    """The elements of a fresh iterator restored at ``state`` (at most ``limit``)."""
    it = iter(make())
    it.load_state_dict(state)
    out = []
    for x in it:
        out.append(typed(x))
        if limit is not None and len(out) >= limit:
            break
    it.close()
    return out


def assert_resumes(make: Callable[[], Any], cuts: Optional[Iterable[int]] = None, ordered: bool = True,
                   limit: Optional[int] = None) -> list:
    """For each cut k: head (k elements) + what a restored iterator yields == the uninterrupted run.
    ``ordered=False`` compares multisets (a nondeterministic order: exactly once, in any order).
    ``limit`` bounds an infinite pipeline. Returns the uninterrupted run."""
    it = iter(make())
    full = []
    for x in it:
        full.append(typed(x))
        if limit is not None and len(full) >= limit:
            break
    it.close()
    for k in (default_cuts(len(full)) if cuts is None else cuts):
        head, state = state_after(make, k)
        rest = resumed(make, state, None if limit is None else limit - k)
        if ordered:
            assert head == full[:k], f"cut {k}: the head differs from the uninterrupted run"
            assert head + rest == full, (
                f"cut {k}: resumed run differs: {len(head)} + {len(rest)} elements vs {len(full)}; first "
                f"difference at {_first_difference(head + rest, full)}")
        else:
            got = collections.Counter(hashable(x) for x in head + rest)
            want = collections.Counter(hashable(x) for x in full)
            assert got == want, (f"cut {k}: not exactly once: repeated {sorted((got - want).elements())[:5]}, "
                                 f"lost {sorted((want - got).elements())[:5]}")
    return full


def _first_difference(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"index {i}: {x!r} != {y!r}"
    return f"lengths {len(a)} != {len(b)}"
