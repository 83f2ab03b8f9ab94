"""The guard of tests/grpc_leak_guard.py, tested on its own: a pytest run (a real subprocess) of test
functions that receive gRPC errors in every way that matters, with the guard as its only plugin. It
must fail exactly the tests that a gRPC error reached untranslated from our code — caught or not, on
the test's thread or one it started — and pass the others."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ElementTree

import pytest


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

INNER = '''
import threading

import grpc
import pytest

import dataservice as ds
from dataservice import errors
from dataservice.proto import dispatcher_pb2, dispatcher_pb2_grpc
from dataservice.service import dispatcher_client
from dataservice.service.rpc import make_channel
from tests.cluster import free_port


def untranslated(monkeypatch):
    """Our dispatcher client with its translation bypassed, as a bug would: each call straight to the stub."""
    monkeypatch.setattr(dispatcher_client, "call_with_retry", lambda fn, what, timeout_s, *a, **k: fn(timeout_s))


def register_unreachable(timeout_ms=2_000):
    return ds.register_dataset(f"localhost:{free_port()}", ds.Dataset.range(3), timeout_ms=timeout_ms)


# --- to be failed by the guard -------------------------------------------------------------------------
def test_leak_caught_by_a_broad_raises(monkeypatch):
    untranslated(monkeypatch)
    with pytest.raises(Exception):
        register_unreachable()


def test_leak_caught_by_except(monkeypatch):
    untranslated(monkeypatch)
    try:
        register_unreachable()
    except Exception:
        pass


def test_leak_not_caught(monkeypatch):
    untranslated(monkeypatch)
    register_unreachable()


def test_leak_on_a_thread_of_the_test(monkeypatch):
    untranslated(monkeypatch)
    caught = []

    def reader():
        try:
            register_unreachable()
        except Exception as exc:
            caught.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    thread.join(30)
    assert caught


def test_leak_through_a_transformation(monkeypatch):
    untranslated(monkeypatch)
    dataset = ds.Dataset.range(1).interleave(
        lambda _: ds.from_dataset_id("parallel_epochs", f"localhost:{free_port()}", 5, timeout_ms=2_000))
    with pytest.raises(Exception):
        list(dataset)


def test_leak_copied_by_a_transformation(monkeypatch):
    # Read inside a user function: map re-raises a copy of the error naming itself (raise_user_error).
    untranslated(monkeypatch)
    dataset = ds.Dataset.range(1).map(
        lambda _: list(ds.from_dataset_id("parallel_epochs", f"localhost:{free_port()}", 5, timeout_ms=2_000)))
    with pytest.raises(Exception):
        list(dataset)


# --- to be passed -------------------------------------------------------------------------------------
def test_a_stub_the_test_calls_itself():
    channel = make_channel(f"localhost:{free_port()}")
    try:
        with pytest.raises(grpc.RpcError) as info:
            dispatcher_pb2_grpc.DispatcherStub(channel).GetStatus(dispatcher_pb2.GetStatusRequest(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        channel.close()


class ServiceDown(grpc.RpcError):
    """A user pipeline's own gRPC error (say, from a feature service it calls)."""


def test_a_user_functions_own_grpc_error():
    def lookup(x):
        raise ServiceDown(f"feature service down for {x}")

    with pytest.raises(ServiceDown, match="feature service down for 0"):
        list(ds.Dataset.range(3).map(lookup))


def test_a_translated_error():
    with pytest.raises(errors.ServiceUnavailableError) as info:
        register_unreachable(timeout_ms=300)
    assert isinstance(info.value.__cause__, grpc.RpcError)  # chained behind ours: that is the translation


# --- no_grpc: untraced, and checked to open no channel ----------------------------------------------------
@pytest.mark.no_grpc
def test_no_grpc_keeps_its_word():
    assert [int(x) for x in ds.Dataset.range(3).map(lambda x: x + 1)] == [1, 2, 3]


@pytest.mark.no_grpc
def test_no_grpc_but_opens_a_channel():
    with pytest.raises(errors.ServiceUnavailableError):
        register_unreachable(timeout_ms=300)
'''

FAILED = {"test_leak_caught_by_a_broad_raises", "test_leak_caught_by_except", "test_leak_not_caught",
          "test_leak_on_a_thread_of_the_test", "test_leak_through_a_transformation",
          "test_leak_copied_by_a_transformation"}
PASSED = {"test_a_stub_the_test_calls_itself", "test_a_user_functions_own_grpc_error", "test_a_translated_error",
          "test_no_grpc_keeps_its_word"}
BROKEN_PROMISE = "test_no_grpc_but_opens_a_channel"


@pytest.mark.slow
def test_the_guard_fails_exactly_the_tests_a_grpc_error_leaked_into(tmp_path):
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER))
    report = tmp_path / "report.xml"
    env = {**os.environ, "PYTHONPATH": ROOT}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.grpc_leak_guard",
                          f"--junitxml={report}", "test_inner.py"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=240)
    assert report.exists(), run.stdout + run.stderr
    outcomes = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        failure = case.find("failure")
        outcomes[case.get("name")] = failure.get("message", "") + (failure.text or "") if failure is not None else None
    assert set(outcomes) == FAILED | PASSED | {BROKEN_PROMISE}, run.stdout
    assert "is marked no_grpc (runs without the gRPC leak guard's tracer) but opened 1 gRPC channel(s)" in \
        (outcomes[BROKEN_PROMISE] or ""), outcomes[BROKEN_PROMISE]
    assert {name for name, failure in outcomes.items() if failure is None} == PASSED, run.stdout
    for name in FAILED:
        assert "a grpc.RpcError reached test code from dataservice code, untranslated" in outcomes[name], \
            (name, outcomes[name])
        # It says which frame received what, from which of our files.
        assert "received" in outcomes[name] and "_InactiveRpcError" in outcomes[name] and \
            "dataservice/" in outcomes[name], (name, outcomes[name])
    assert run.returncode == 1

