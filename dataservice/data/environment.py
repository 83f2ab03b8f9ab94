"""What a process needs to load another process's pipeline: versions, and who provides a module.

A pipeline is pickled by the client and unpickled by a worker. Code shipped by
value is bytecode, which only the same Python minor version can run; pickles of
one cloudpickle, numpy or dataservice release are not promised to load in
another. The client records its versions in the pipeline; the worker compares
them with its own before unpickling (:func:`skew`), so a mismatch is reported
naming both versions instead of as an unpickling traceback.

Example::

    >>> mine = versions()
    >>> sorted(mine)
    ['cloudpickle', 'dataservice', 'numpy', 'python']
    >>> skew(mine, mine)
    []
    >>> skew({**mine, "python": "3.10.14"}, {**mine, "python": "3.11.7"})
    ['python 3.10.14 (client) vs 3.11.7 (worker)']
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
from typing import Mapping

import cloudpickle
import numpy

__all__ = ["versions", "skew", "differences", "distribution_of", "describe_versions"]

#: How much of each version must agree for a pipeline to load: Python's bytecode changes with
#: each minor release; cloudpickle and dataservice pickle formats may change with a minor
#: release (pre-1.0 releases too); numpy's pickles move modules across major releases only
#: (numpy.core became numpy._core in 2.0).
_PARTS_THAT_MUST_MATCH = {"python": 2, "cloudpickle": 2, "numpy": 1, "dataservice": 2}


@functools.lru_cache(maxsize=1)
def _versions() -> tuple:
    from dataservice import __version__  # here, not at the top: the package imports this module
    return (("python", platform.python_version()), ("cloudpickle", cloudpickle.__version__),
            ("numpy", numpy.__version__), ("dataservice", __version__))


def versions() -> dict[str, str]:
    """This process's versions of what pickles and loads pipelines."""
    return dict(_versions())


def _release(version: str, parts: int) -> tuple:
    return tuple(version.split(".")[:parts])


def skew(client: Mapping[str, str], worker: Mapping[str, str]) -> list[str]:
    """The versions that differ too much to load the client's pipeline, as "name a (client) vs b (worker)".
    A version the client did not record is not compared."""
    return [f"{name} {client[name]} (client) vs {worker.get(name, '?')} (worker)"
            for name, parts in _PARTS_THAT_MUST_MATCH.items()
            if client.get(name) and _release(client[name], parts) != _release(worker.get(name, ""), parts)]


def differences(client: Mapping[str, str], worker: Mapping[str, str]) -> list[str]:
    """Every version that differs at all (a patch release included), in :func:`skew`'s form."""
    return [f"{name} {client[name]} (client) vs {worker.get(name, '?')} (worker)"
            for name in _PARTS_THAT_MUST_MATCH if client.get(name) and client[name] != worker.get(name)]


def describe_versions(found: Mapping[str, str]) -> str:
    return ", ".join(f"{name} {found[name]}" for name in _PARTS_THAT_MUST_MATCH if name in found)


@functools.lru_cache(maxsize=1)
def _distributions() -> dict:
    return importlib.metadata.packages_distributions()


def distribution_of(module: str) -> tuple[str, str]:
    """The installed distribution that provides top-level ``module`` here, and its version;
    ("", "") if none does (the module is the user's own code, or not installed here either).

    Example::

        >>> distribution_of("numpy.linalg")
        ('numpy', '2.4.6')
    """
    top = module.partition(".")[0]
    names = _distributions().get(top)
    if not names:
        return "", ""
    name = names[0]
    try:
        return name, importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return name, ""
