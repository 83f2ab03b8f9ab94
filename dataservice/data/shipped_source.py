"""The file names and source lines of code shipped by value, for tracebacks on the workers.

A worker runs the user's functions without their files. For its traceback to say
``File "/home/me/project/augment.py", line 5, in parse`` and show that line, two
things must travel with the pipeline:

- each code object's ``co_filename``. cloudpickle does not promise to keep it:
  3.1.3 replaces it with ``"<dynamic-code>"`` so that its bytes do not depend on
  where a file lies. :func:`reduce_code` pickles every code object with its real
  file name, whatever cloudpickle does with the rest (the name is put back after
  cloudpickle rebuilt the code, with the public ``CodeType.replace``);
- the source text of those files: :func:`sources_of` reads it on the client
  (through ``linecache``, so a notebook cell's source counts), and
  :func:`register_sources` hands it to ``linecache`` on the worker through
  ``linecache.lazycache``, its public hook for source without a file. A file the
  worker does have at that path is read from its disk, as Python always does.

Example::

    >>> reduce_code(parse.__code__)[1][1]                     # in a pickler's reducer_override
    '/home/me/project/augment.py'
    >>> sources = sources_of([parse.__code__.co_filename])   # {'/home/me/project/augment.py': '...'}
    >>> register_sources(sources)                            # on the worker, before the first traceback
"""

from __future__ import annotations

import linecache
import threading
import types
from typing import Any, Iterable, Mapping

__all__ = ["reduce_code", "sources_of", "register_sources", "MAX_SOURCE_FILE_BYTES"]

#: Files larger than this travel without their text (their frames still name file and line, and the
#: reading client fills in lines from its own copy): a generated module of megabytes is not worth it.
MAX_SOURCE_FILE_BYTES = 1024 * 1024

#: What the code object inside the pickle is called until :func:`_code_at` restores its name. A fixed
#: string, so that the bytes (and the dataset id) stay deterministic; never a real file's name.
_PLACEHOLDER = "<dataservice:co_filename>"

_lock = threading.Lock()
#: The text this process registered per file name, so a changed file shipped again replaces it.
_registered: dict[str, str] = {}


def _code_at(code: types.CodeType, filename: str) -> types.CodeType:
    """``code`` as it was pickled, under its own file name again (run on the loading side)."""
    return code.replace(co_filename=filename)


def reduce_code(code: types.CodeType) -> Any:
    """A pickle reduction of ``code`` that keeps its file name; for a ``reducer_override``.

    The code object inside carries a placeholder name, and comes back here: then NotImplemented
    lets cloudpickle reduce it as it always does.
    """
    if code.co_filename == _PLACEHOLDER:
        return NotImplemented
    return _code_at, (code.replace(co_filename=_PLACEHOLDER), code.co_filename)


def sources_of(filenames: Iterable[str]) -> dict[str, str]:
    """The source text of each file that this process can read (from disk, or a notebook's cells through
    ``linecache``), for the files no larger than ``MAX_SOURCE_FILE_BYTES``; sorted by name."""
    sources = {}
    for filename in sorted(set(filenames)):
        if not filename or filename.startswith("<"):
            continue  # "<stdin>", "<string>": nothing to read
        text = "".join(linecache.getlines(filename))
        if text and len(text.encode("utf-8", "surrogatepass")) <= MAX_SOURCE_FILE_BYTES:
            sources[filename] = text
    return sources


class _ShippedSource:
    """A loader in the sense ``linecache.lazycache`` asks for: it has ``get_source``."""

    def __init__(self, text: str):
        self._text = text

    def get_source(self, name: str) -> str:
        return self._text


def register_sources(sources: Mapping[str, str]) -> None:
    """Makes ``linecache`` (and so ``traceback``) find the source of these files in this process, where it
    cannot read them from disk. A file registered before with other text gets the new text."""
    with _lock:
        for filename, text in sources.items():
            if filename in _registered and _registered[filename] != text:
                linecache.cache.pop(filename, None)  # what the older text made of it
            if filename in linecache.cache:
                continue  # registered already, or read from this machine's own file
            # Module globals as lazycache reads them: a name, and a loader with get_source.
            if linecache.lazycache(filename, {"__name__": "__dataservice_shipped__",
                                              "__loader__": _ShippedSource(text)}):
                _registered[filename] = text
