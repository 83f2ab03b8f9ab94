"""A task's failure, from the worker that saw it to the client that reads the task.

The worker describes the exception in the header of its answer
(:func:`failure_header`): what kind of failure it is (the user's function
raised, the pipeline needs a module the worker lacks, the versions differ),
the exception's type, message and original arguments, and the frames of its
traceback — the user's frames, not dataservice's. The client turns that back
into an exception (:func:`remote_failure`):

- a user function's exception is raised as its own type with its own
  arguments when the client has that type (``except KeyError`` works, and
  ``str()`` is the original message), chained from ``errors.RemoteUserError``
  whose message is the worker's traceback — file, line and function of the
  user's code, with source lines filled in from the client's files when the
  worker has none (code shipped by value);
- a missing module becomes ``errors.MissingModuleError`` naming the module,
  the package that provides it here, the worker and the fix;
- a version mismatch becomes ``errors.VersionSkewError`` naming both sides.

Example::

    >>> header = failure_header(KeyError("bad record 500"), "worker-1:5051")
    >>> raise remote_failure(header)
    Traceback (most recent call last):
    ...
    KeyError: 'bad record 500'
"""

from __future__ import annotations

import linecache
import logging
import os
import pickle
import sys
import traceback
from typing import Optional

import cloudpickle

from dataservice import errors
from dataservice.data.environment import describe_versions, distribution_of, versions
from dataservice.proto import worker_pb2

__all__ = ["failure_header", "remote_failure", "format_failure", "original_exception"]

log = logging.getLogger("dataservice.client")

_PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")


def original_exception(exc: BaseException) -> BaseException:
    """The exception the user's code raised. A transformation re-raises it as a copy whose message
    names the transformation (``raise_user_error``), chained from the original: the client gets the
    original's message and traceback, and the transformation's name separately."""
    where = getattr(exc, "_dataservice_where", None)
    cause = exc.__cause__
    if where is not None and cause is not None and type(cause) is type(exc):
        return cause
    return exc


def _frames(exc: BaseException) -> list[worker_pb2.TracebackFrame]:
    summary = traceback.extract_tb(exc.__traceback__)
    # The user's frames tell what went wrong; ours (the task runner, the dataset iterators) are
    # the same every time. Kept only when nothing else is left: then the fault is ours.
    theirs = [f for f in summary if not os.path.abspath(f.filename).startswith(_PACKAGE_DIR)]
    return [worker_pb2.TracebackFrame(filename=f.filename, lineno=f.lineno or 0, name=f.name, line=f.line or "")
            for f in (theirs or summary)]


def _type_name(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def failure_header(exc: BaseException, worker_address: str) -> worker_pb2.ElementChunk:
    """The answer header that reports ``exc`` to a reader; see the module docstring."""
    header = worker_pb2.ElementChunk(end_of_sequence=True, worker_address=worker_address)
    if isinstance(exc, errors.MissingModuleError):
        header.error_kind = worker_pb2.MISSING_MODULE
        header.missing_module = exc.module
    elif isinstance(exc, errors.VersionSkewError):
        header.error_kind = worker_pb2.VERSION_SKEW
        header.worker_versions.update(exc.worker_versions)
        header.pipeline_versions.update(exc.client_versions)
    elif isinstance(exc, errors.WorkerEnvironmentError):
        header.error_kind = worker_pb2.PIPELINE_LOAD
    else:
        header.error_kind = worker_pb2.USER_FUNCTION
        header.error_where = getattr(exc, "_dataservice_where", None) or ""
        exc = original_exception(exc)
        header.traceback.extend(_frames(exc))
        try:
            header.error_state = cloudpickle.dumps((exc.args, dict(vars(exc))))
        except Exception:  # arguments that do not pickle: the message alone still travels
            pass
    header.error_type = _type_name(type(exc))
    header.error_message = str(exc)
    return header


def format_failure(header: worker_pb2.ElementChunk) -> str:
    """The worker's traceback, formatted as Python does; source lines come from this process's files
    when the worker sent none."""
    lines = [f"Traceback on worker {header.worker_address or '?'} (most recent call last):\n"] if header.traceback \
        else []
    for frame in header.traceback:
        lines.append(f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}\n')
        source = frame.line or linecache.getline(frame.filename, frame.lineno).strip()
        if source:
            lines.append(f"    {source}\n")
    short = header.error_type.rsplit(".", 1)[-1] if header.error_type.startswith("builtins.") else header.error_type
    lines.append(f"{short}: {header.error_message}" if header.error_message else short)
    return "".join(lines)


def _local_type(name: str) -> Optional[type]:
    """The exception class called ``module.qualname`` in this process, if it is loaded here."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:i]))
        if module is None:
            continue
        found = module
        for attr in parts[i:]:
            found = getattr(found, attr, None)
        if isinstance(found, type) and issubclass(found, Exception):
            return found
        return None
    return None


def _rebuild(header: worker_pb2.ElementChunk) -> Optional[BaseException]:
    kind = _local_type(header.error_type)
    if kind is None:
        return None
    args, attrs = (header.error_message,), {}
    if header.error_state:
        try:
            args, attrs = pickle.loads(header.error_state)
        except Exception:
            pass
    try:
        exc = kind(*args)
        exc.__dict__.update(attrs)
    except Exception:
        return None
    return exc if type(exc) is kind else None


def _missing_module(header: worker_pb2.ElementChunk, where: str) -> errors.MissingModuleError:
    module = header.missing_module
    distribution, version = distribution_of(module) if module else ("", "")
    if distribution:
        pin = f"{distribution}=={version}" if version else distribution
        message = (f"the pipeline needs module {module!r}, from the package {distribution} "
                   f"{version or ''}".rstrip() + f" installed on this client, but worker {where} does not have it: "
                   f"install it on the workers (pip install '{pin}')")
    else:
        local = sys.modules.get(module.partition(".")[0]) if module else None
        file = getattr(local, "__file__", None)
        if file:
            message = (f"the pipeline needs module {module!r} ({file}), which worker {where} cannot import: it "
                       f"is shipped by reference. If it is your own code, ship it with the pipeline: "
                       f"dataservice.ship_by_value({module.partition('.')[0]!r}); if it is a package, install "
                       f"it on the workers")
        else:
            message = (f"the pipeline needs module {module!r}, which worker {where} cannot import: install it on "
                       f"the workers")
    return errors.MissingModuleError(message, worker_address=where, module=module, distribution=distribution)


def remote_failure(header: worker_pb2.ElementChunk) -> BaseException:
    """The exception to raise in the client for a failure a worker reported; see the module docstring."""
    where = header.worker_address or "a worker"
    if header.error_kind == worker_pb2.MISSING_MODULE:
        return _missing_module(header, where)
    if header.error_kind == worker_pb2.VERSION_SKEW:
        client, worker = dict(header.pipeline_versions) or versions(), dict(header.worker_versions)
        return errors.VersionSkewError(
            f"worker {where} cannot load the pipeline: it was serialized with {describe_versions(client)} and "
            f"the worker has {describe_versions(worker)} ({header.error_message}). Run the same Python minor "
            f"version, cloudpickle, numpy major version and dataservice on the clients and the workers",
            worker_address=where, client_versions=client, worker_versions=worker)
    if header.error_kind == worker_pb2.PIPELINE_LOAD:
        return errors.WorkerEnvironmentError(f"worker {where} cannot load the pipeline: {header.error_message}",
                                             worker_address=where)
    context = f" in {header.error_where}" if header.error_where else ""
    summary = f"{header.error_type.rsplit('.', 1)[-1]}: {header.error_message}" if header.error_message \
        else header.error_type.rsplit('.', 1)[-1]
    text = format_failure(header)
    remote = errors.RemoteUserError(f"{summary} (raised{context} on worker {where})\n\n{text}",
                                    remote_type=header.error_type, worker_address=where, remote_traceback=text)
    local = _rebuild(header)
    if local is None:
        return remote
    local.__cause__ = remote
    if hasattr(local, "add_note"):  # Python >= 3.11
        local.add_note(f"raised{context} on worker {where}; the worker's traceback is shown above")
    return local
