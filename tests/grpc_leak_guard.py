"""A guard over the whole test suite: no gRPC exception reaches a user from our code.

Our client boundary translates every ``grpc.RpcError`` into one of our own errors (``raise ... from
exc``: ``dataservice/service/rpc.py``). A test that calls our API stands for the user, so the guard
watches the exceptions that cross from our code into test code and fails the test — even one that
caught the exception (``pytest.raises(Exception)``, ``except Exception``) — when such an exception
is a ``grpc.RpcError``, or chains to one (``__cause__``, else ``__context__``) with no exception of
ours in front of it. It says which test frame received it, from which of our frames, and the
exception. What it does not flag:

- a gRPC error from a stub the test calls itself (tests of our servers' status codes do that): the
  frame it comes from is grpc's, not ours;
- a ``grpc.RpcError`` a user function raised (a pipeline calling a gRPC service of its own): it was
  raised by a call from user code, not by a call our code made;
- our error in front of the gRPC one, which is how a translated error looks.

It watches the test function's thread and threads whose target is test code (our servers' threads
are left alone), through ``sys.settrace``: a tracer that only asks, for each frame of a test module,
to hear of its exceptions. It stands aside when a tracer is set already (a debugger, coverage).
``tests/conftest.py`` installs it for every test; ``tests/test_grpc_leak_guard.py`` tests the guard
itself.

A tracer costs a Python call per function call in the test's thread: about a third more time for a
test that runs a pipeline in its own thread. A module of such tests that never talks to a server says
so, ``pytestmark = pytest.mark.no_grpc``, and runs untraced; the guard checks the claim instead, at
no cost: such a test fails if it opens a gRPC channel (where a gRPC error could come from).

Example (what a test that received one reports)::

    a grpc.RpcError reached test code from dataservice code, untranslated:
      test_register in tests/test_x.py received _InactiveRpcError(...) from dataservice/service/dispatcher_client.py:107
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Optional

import grpc
import pytest

import dataservice

__all__ = ["leak_of", "pytest_runtest_call"]

_PACKAGE = os.path.dirname(os.path.abspath(dataservice.__file__)) + os.sep
_GRPC = os.path.dirname(os.path.abspath(grpc.__file__)) + os.sep
_TESTS = os.path.dirname(os.path.abspath(__file__)) + os.sep
_THIS = os.path.abspath(__file__)


def _ours(exc: BaseException) -> bool:
    return type(exc).__module__.partition(".")[0] == "dataservice"


def _next_in_chain(exc: BaseException) -> Optional[BaseException]:
    """What Python prints under ``exc``: its cause, else its context unless suppressed (``from None``)."""
    return exc.__cause__ if exc.__cause__ is not None or exc.__suppress_context__ else exc.__context__


def _grpc_caller(exc: BaseException) -> Optional[str]:
    """The file whose code called into grpc where ``exc`` was raised; None if grpc did not raise it."""
    caller = None
    tb = exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename.startswith(_GRPC):
            return caller
        caller = filename
        tb = tb.tb_next
    return None


def _raised_by_our_call(exc: BaseException) -> bool:
    """Whether the gRPC call behind ``exc`` was made by our code, not by a test's or a user function's: the
    frame that called into grpc is ours. An RpcError that grpc did not raise (a user function's own
    subclass, or a transformation's copy naming itself, ``raise_user_error``) is followed down its chain
    to the one grpc raised, if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        caller = _grpc_caller(exc) if isinstance(exc, grpc.RpcError) else None
        if caller is not None:
            return caller.startswith(_PACKAGE)
        exc = _next_in_chain(exc)
    return False


def leak_of(exc: BaseException) -> Optional[BaseException]:
    """The gRPC error ``exc`` is, or chains to with none of our exceptions in front, raised by a call our
    code made; None if there is none.

    Example::

        >>> leak_of(dataservice.errors.NotFoundError("no such job")) is None
        True
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if _ours(exc):
            return None
        if isinstance(exc, grpc.RpcError):
            return exc if _raised_by_our_call(exc) else None
        exc = _next_in_chain(exc)
    return None


def _shown(exc: BaseException) -> str:
    # A gRPC error built by hand (a copy of one, say) may not even have a repr.
    try:
        return repr(exc)
    except Exception:
        return f"{type(exc).__module__}.{type(exc).__qualname__} (no repr)"


class _Guard:
    """The tracer of one test call: collects what leaked into test frames."""

    def __init__(self, test_dirs: tuple) -> None:
        #: Where test code lives: tests/, and the directory of the test's own module.
        self._test_dirs = test_dirs
        self.leaks: list[str] = []
        self._lock = threading.Lock()

    def _frame_events(self, frame, event: str, arg):
        if event == "exception":
            exc, tb = arg[1], arg[2]
            source = tb.tb_next if tb is not None else None
            if source is not None and source.tb_frame.f_code.co_filename.startswith(_PACKAGE):
                leaked = leak_of(exc)
                if leaked is not None:
                    where = source.tb_frame.f_code
                    shown = os.path.relpath(where.co_filename, os.path.dirname(_PACKAGE.rstrip(os.sep)))
                    with self._lock:
                        self.leaks.append(f"{frame.f_code.co_name} in {os.path.relpath(frame.f_code.co_filename)} "
                                          f"received {_shown(exc)} from {shown}:{source.tb_lineno}"
                                          + (f" (chained to {_shown(leaked)})" if leaked is not exc else ""))
        return self._frame_events

    def calls(self, frame, event: str, arg):
        """The global tracer: test modules' frames report their exceptions (not their lines)."""
        filename = frame.f_code.co_filename
        if filename.startswith(self._test_dirs) and filename != _THIS:
            frame.f_trace_lines = False
            return self._frame_events
        return None

    def thread_start(self, frame, event: str, arg):
        """New threads: traced only when their target is test code."""
        target = getattr(threading.current_thread(), "_target", None)
        code = getattr(target, "__code__", None)
        if code is None or not code.co_filename.startswith(self._test_dirs):
            sys.settrace(None)
            return None
        sys.settrace(self.calls)
        return self.calls(frame, event, arg)


#: gRPC channels opened in this process so far (every client call goes through one).
_channels_opened = 0


def _counting(open_channel):
    def opened(*args, **kwargs):
        global _channels_opened
        _channels_opened += 1
        return open_channel(*args, **kwargs)

    return opened


grpc.insecure_channel = _counting(grpc.insecure_channel)
grpc.secure_channel = _counting(grpc.secure_channel)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Runs the test under the guard, and fails it if a gRPC error leaked into its code."""
    if item.get_closest_marker("no_grpc") is not None:
        opened = _channels_opened
        result = yield
        if _channels_opened != opened:
            raise AssertionError(f"{item.nodeid} is marked no_grpc (runs without the gRPC leak guard's tracer) "
                                 f"but opened {_channels_opened - opened} gRPC channel(s): remove the mark")
        return result
    if sys.gettrace() is not None:  # a debugger or coverage: do not take its place
        return (yield)
    guard = _Guard((_TESTS, os.path.join(os.path.abspath(os.path.dirname(str(item.path))), "")))
    failure: Optional[BaseException] = None
    sys.settrace(guard.calls)
    threading.settrace(guard.thread_start)
    try:
        result = yield
    except BaseException as exc:  # the test's own outcome (a failure, a skip), raised again below
        failure = exc
    finally:
        sys.settrace(None)
        threading.settrace(None)
    if guard.leaks:
        raise AssertionError("a grpc.RpcError reached test code from dataservice code, untranslated (the client "
                             "boundary must raise one of dataservice.errors, `raise ... from exc`):\n  "
                             + "\n  ".join(guard.leaks[:5])) from failure
    if failure is not None:
        raise failure
    return result
