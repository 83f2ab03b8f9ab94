"""Which modules travel with a pipeline by value, and which by reference.

A pipeline refers to code: the functions passed to ``map`` and ``filter``,
their helpers, the helpers' helpers, classes, module-level constants. Code
that the workers have installed — the standard library and installed
distributions (numpy, Pillow, torch, ... and dataservice itself) — travels
*by reference* (module and name; the worker imports it). Everything else is
the user's own code — files beside the script, a project checkout on
``sys.path``, ``__main__``, a notebook — and travels *by value*: cloudpickle
serializes the functions and classes themselves, recursively, so workers
started anywhere (``cd / && dataservice worker ...``) run them without having
the files.

The rule, for a module imported in the client process:

1. named with :func:`ship_by_value` / :func:`ship_by_reference` (a package
   name covers its submodules): as said;
2. the standard library, a built-in or a compiled extension module: by reference;
3. provided by an installed distribution (``importlib.metadata``; an
   editable install — ``pip install -e`` — counts as installed) or lying in a
   site-packages directory: by reference;
4. any other module with a source file: by value.

Example::

    >>> import augment                       # ./augment.py beside the script
    >>> is_shipped_by_value(augment)
    True
    >>> ship_by_reference("augment")         # it is installed on the workers after all
    >>> is_shipped_by_value(augment)
    False
"""

from __future__ import annotations

import csv
import functools
import hashlib
import importlib.metadata
import json
import os
import site
import sys
import sysconfig
import threading
import types
from typing import Iterable, Union

__all__ = ["ship_by_value", "ship_by_reference", "is_shipped_by_value", "shipped_modules", "source_digest"]

#: Never by value, whatever their location: the workers run these themselves, and
#: a second copy of dataservice's classes would not be the worker's.
_ALWAYS_BY_REFERENCE = frozenset({"dataservice", "cloudpickle", "numpy", "__mp_main__"})
_EXTENSION_SUFFIXES = (".so", ".pyd", ".dylib")

_lock = threading.Lock()
_by_value: set[str] = set()
_by_reference: set[str] = set()

ModuleLike = Union[str, types.ModuleType]


def _names(modules: Iterable[ModuleLike], what: str) -> list[str]:
    names = []
    for module in modules:
        if isinstance(module, types.ModuleType):
            module = module.__name__
        if not isinstance(module, str) or not module or module.startswith(".") or module.endswith("."):
            raise TypeError(f"{what} takes modules or dotted module names like 'augment' or 'myproject.data', "
                            f"got {module!r}")
        names.append(module)
    return names


def _choose(names: list[str], chosen: set[str], other: set[str]) -> None:
    with _lock:
        chosen.update(names)
        other.difference_update(names)


def ship_by_value(*modules: ModuleLike) -> None:
    """Ships these modules (or packages, with their submodules) by value, whatever the rule says:
    for your own code that happens to be installed on this machine (``pip install -e .``) but not
    on the workers.

    Example::

        >>> dataservice.ship_by_value("myproject")
    """
    _choose(_names(modules, "ship_by_value"), _by_value, _by_reference)


def ship_by_reference(*modules: ModuleLike) -> None:
    """Ships these modules (or packages, with their submodules) by reference: the workers import
    them. For your own code that the workers have too (baked into their image, or on their
    ``PYTHONPATH``), or a module that cannot be serialized by value.

    Example::

        >>> dataservice.ship_by_reference("company_internal")
    """
    _choose(_names(modules, "ship_by_reference"), _by_reference, _by_value)


def _override(name: str) -> Union[bool, None]:
    """True/False if the user named this module or a package above it; the innermost name wins."""
    while True:
        if name in _by_value:
            return True
        if name in _by_reference:
            return False
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]


@functools.lru_cache(maxsize=1)
def _installed_top_levels() -> frozenset:
    # The keys of importlib.metadata.packages_distributions(), without what makes it slow: it parses
    # every distribution's METADATA for a name we do not use and makes a path object per RECORD line
    # (35-80 ms with scipy, jax and torch installed), and the first distribute() of a process waits for
    # it: most of the time to the first element. Still 10-16 ms with 69 distributions (a test venv), so
    # the names are kept on disk for the next process, while sys.path and its directories are unchanged.
    path, stamp = _top_levels_cache_file(), _path_stamp()
    cached = _read_top_levels_cache(path, stamp)
    if cached is not None:
        return cached
    names = frozenset(name for dist in importlib.metadata.distributions() for name in _top_level_names(dist))
    _write_top_levels_cache(path, stamp, names)
    return names


#: The directory where one process leaves the installed top-level names for the next
#: (``_installed_top_levels``). Set it to "" to keep nothing; unset, ``$XDG_CACHE_HOME/dataservice`` or
#: ``~/.cache/dataservice``.
CACHE_DIR_ENV = "DATASERVICE_CACHE_DIR"


def _top_levels_cache_file() -> Union[str, None]:
    """The cache file of this interpreter and environment, or None if caching is off."""
    directory = os.environ.get(CACHE_DIR_ENV)
    if directory is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        directory = os.path.join(base, "dataservice")
    if not directory:
        return None
    # One file per interpreter and environment (a venv shares its base's executable, not its prefix).
    which = hashlib.sha256(f"{sys.executable}\0{sys.prefix}".encode()).hexdigest()[:16]
    return os.path.join(directory, f"installed-top-levels-{which}.json")


def _path_stamp() -> list:
    """What the installed distributions are found from: each ``sys.path`` entry and the time it last
    changed. Installing or removing a distribution adds or removes its ``.dist-info`` directory in one of
    them (pip reinstalls one in place the same way), which changes that directory's time.

    Example::

        >>> _path_stamp()[:1]
        [['/work/project', 1795877851330591200]]
    """
    stamp = []
    for entry in sys.path:
        try:
            stamp.append([entry, os.stat(entry or ".").st_mtime_ns])
        except (OSError, TypeError, ValueError):
            stamp.append([entry, None])
    return stamp


def _read_top_levels_cache(path: Union[str, None], stamp: list) -> Union[frozenset, None]:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            cached = json.load(f)
        if cached.get("stamp") == stamp and isinstance(cached.get("names"), list):
            return frozenset(str(name) for name in cached["names"])
    except (OSError, ValueError, AttributeError):
        pass  # none yet, unreadable or torn: read the distributions, and write it again
    return None


def _write_top_levels_cache(path: Union[str, None], stamp: list, names: frozenset) -> None:
    if path is None:
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # A file of our own, then a rename: a process reading at the same time sees the old file or the new.
        temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    except OSError:
        return  # a read-only home (a container): every process reads the distributions itself
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump({"stamp": stamp, "names": sorted(names)}, f)
        os.replace(temporary, path)
    except OSError:
        try:
            os.unlink(temporary)
        except OSError:
            pass


def _top_level_names(dist: importlib.metadata.Distribution) -> Iterable[str]:
    """The top-level names that ``dist`` provides, as ``packages_distributions`` finds them: its
    ``top_level.txt``, else the first part of each ``.py`` file it lists.

    Example::

        >>> sorted(_top_level_names(importlib.metadata.distribution("cloudpickle")))
        ['cloudpickle']
    """
    declared = (dist.read_text("top_level.txt") or "").split()
    if declared:
        return declared
    record = dist.read_text("RECORD")
    if record is not None and '"' not in record:
        # No quoted path, so ".py," ends a row's path (a hash or a size holds no dot). Found with
        # str.find: a RECORD can list thousands of data files (mkdocs-material's icons took 14 ms
        # through the csv module and 13 ms by regex, most of the first element's time; this is 1 ms).
        return set(_py_record_tops(record))
    files = ([row[0] for row in csv.reader(record.splitlines()) if row] if record is not None
             else [str(f) for f in dist.files or ()])  # egg-info: its SOURCES.txt as importlib reads it
    return {f.split("/", 1)[0] if "/" in f else f[:-3] for f in files if f.endswith(".py")}


def _py_record_tops(record: str) -> Iterable[str]:
    r"""The first part of each ``.py`` path in an unquoted RECORD (rows ``path,hash,size``), the
    module's name for a top-level file.

    Example::

        >>> sorted(_py_record_tops("pkg/__init__.py,sha256=x,1\nmod.py,,\npkg/data.json,,\n"))
        ['mod', 'pkg']
    """
    end = record.find(".py,")
    while end >= 0:
        yield record[record.rfind("\n", 0, end) + 1:end].partition("/")[0]
        end = record.find(".py,", end + 4)


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple:
    dirs = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(path)
    for path in (*getattr(site, "getsitepackages", lambda: [])(), site.getusersitepackages()):
        dirs.add(path)
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs if d)


def _files(module: types.ModuleType) -> list[str]:
    file = getattr(module, "__file__", None)
    if file:
        return [file]
    return list(getattr(module, "__path__", None) or ())  # a namespace package: its directories


def is_shipped_by_value(module: types.ModuleType) -> bool:
    """Whether functions and classes of ``module`` travel by value; see the module docstring."""
    name = module.__name__
    if name == "__main__":
        return True  # cloudpickle always ships __main__ by value
    with _lock:
        chosen = _override(name)
    if chosen is not None:
        return chosen
    top = name.partition(".")[0]
    if top in _ALWAYS_BY_REFERENCE or top in sys.builtin_module_names or top in sys.stdlib_module_names:
        return False
    files = _files(module)
    if not files:
        return False  # built-in, frozen or made at run time: nothing to ship
    for file in files:
        if file.endswith(_EXTENSION_SUFFIXES):
            return False  # compiled: it cannot travel by value
        real = os.path.realpath(file)
        if any(real.startswith(d) for d in _library_dirs()):
            return False
    # Last: the first call reads every installed distribution's list of files (a few ms), which
    # only modules outside the library directories need (editable installs, dist-info on PYTHONPATH).
    return top not in _installed_top_levels()


def shipped_modules() -> list[types.ModuleType]:
    """The imported modules whose code travels by value (``__main__`` aside), sorted by name."""
    return [module for name, module in sorted(list(sys.modules.items()), key=lambda item: item[0])
            if name != "__main__" and isinstance(module, types.ModuleType) and is_shipped_by_value(module)]


def source_digest(modules: Iterable[types.ModuleType]) -> str:
    """A digest of the source files of ``modules`` and of ``__main__``: it changes when any of
    the code that travels by value changes. Modules without a readable file add their name only."""
    digest = hashlib.sha256()
    main = sys.modules.get("__main__")
    for module in ([main] if main is not None else []) + list(modules):
        digest.update(module.__name__.encode() + b"\0")
        file = getattr(module, "__file__", None)
        if file and not file.endswith(_EXTENSION_SUFFIXES):
            try:
                with open(file, "rb") as f:
                    digest.update(f.read())
            except OSError:
                pass
    return digest.hexdigest()
