"""What goes wrong, and what the user sees: bad arguments, unknown ids, unreachable
dispatchers, user functions raising on workers, unsplittable pipelines, garbage on
the ports."""

from __future__ import annotations

import re
import socket
import threading
import time

import grpc
import pytest

from dataservice import Dataset, distribute, errors, from_dataset_id, register_dataset
from tests.cluster import TestCluster, free_port, run_with_deadline
from tests.elements import ints

# A background thread (fetcher, heartbeat, task) dying of an exception fails the test.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


# --- bad arguments: ValueError naming the argument, at call time ------------------------------

@pytest.mark.parametrize("make", [
    lambda mode: distribute(mode, "grpc://localhost:5050"),
    lambda mode: from_dataset_id(mode, "grpc://localhost:5050", 1),
])
@pytest.mark.parametrize("mode", ["parallel", "DISTRIBUTED_EPOCH", "", None, 1])
def test_wrong_processing_mode_is_a_value_error(make, mode):
    with pytest.raises(ValueError, match="processing_mode"):
        make(mode)


@pytest.mark.parametrize("make", [
    lambda service: distribute("parallel_epochs", service),
    lambda service: from_dataset_id("parallel_epochs", service, 1),
    lambda service: register_dataset(service, Dataset.range(3)),
])
@pytest.mark.parametrize("service", ["localhost", "grpc//localhost:5050", "http://localhost:5050",
                                     "localhost:99999", "grpc://:5050", "", None])
def test_malformed_service_address_is_a_value_error(make, service):
    with pytest.raises(ValueError, match="address"):
        make(service)


@pytest.mark.parametrize("make", [
    lambda n: distribute("parallel_epochs", "grpc://localhost:5050", max_outstanding_requests=n),
    lambda n: from_dataset_id("parallel_epochs", "grpc://localhost:5050", 1, max_outstanding_requests=n),
])
@pytest.mark.parametrize("value", [0, -1, 2.5, True, "4"])
def test_bad_max_outstanding_requests_is_a_value_error(make, value):
    with pytest.raises(ValueError, match="max_outstanding_requests"):
        make(value)


@pytest.mark.parametrize("make", [
    lambda p: distribute("parallel_epochs", "grpc://localhost:5050", data_transfer_protocol=p),
    lambda p: from_dataset_id("parallel_epochs", "grpc://localhost:5050", 1, data_transfer_protocol=p),
])
@pytest.mark.parametrize("value", ["udp", "TCP", "", 1])
def test_bad_data_transfer_protocol_is_a_value_error(make, value):
    with pytest.raises(ValueError, match="data_transfer_protocol must be None .* 'tcp' or 'grpc'"):
        make(value)


@pytest.mark.parametrize("make", [
    lambda t: distribute("parallel_epochs", "grpc://localhost:5050", timeout_ms=t),
    lambda t: from_dataset_id("parallel_epochs", "grpc://localhost:5050", 1, timeout_ms=t),
    lambda t: register_dataset("grpc://localhost:5050", Dataset.range(3), timeout_ms=t),
])
@pytest.mark.parametrize("value", [0, -500, "500", None])
def test_bad_timeout_is_a_value_error(make, value):
    with pytest.raises(ValueError, match="timeout_ms"):
        make(value)


def test_bad_dataset_id_is_a_value_error():
    for bad in (0, -3, "01", None):  # "1" is dataset 1: ids pass as strings too, as in tf.data service
        with pytest.raises(ValueError, match="dataset_id"):
            from_dataset_id("parallel_epochs", "grpc://localhost:5050", bad)


# --- unknown ids --------------------------------------------------------------------------

def test_unknown_dataset_id_is_not_found(cluster):
    dataset = from_dataset_id("parallel_epochs", cluster.target, 987_654)
    with pytest.raises(errors.NotFoundError, match="987654"):
        list(dataset)


# --- an unreachable dispatcher: ServiceUnavailableError quickly, never a hang ----------------

def _assert_unavailable_quickly(fn, limit_s: float = 5.0):
    start = time.monotonic()
    with pytest.raises(errors.ServiceUnavailableError) as info:
        fn()
    assert time.monotonic() - start < limit_s
    assert not isinstance(info.value, grpc.RpcError)
    return info.value


def test_dead_dispatcher_port_is_service_unavailable():
    port = free_port()
    dataset = Dataset.range(3).apply(distribute("parallel_epochs", f"grpc://localhost:{port}", timeout_ms=500))
    exc = _assert_unavailable_quickly(lambda: list(dataset))
    assert str(port) in str(exc)
    _assert_unavailable_quickly(lambda: register_dataset(f"localhost:{port}", Dataset.range(3), timeout_ms=500))
    _assert_unavailable_quickly(lambda: list(from_dataset_id("parallel_epochs", f"localhost:{port}", 1,
                                                             timeout_ms=500)))


def test_silent_dispatcher_port_is_service_unavailable():
    # Something accepts connections on the port but never speaks gRPC.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]
        _assert_unavailable_quickly(
            lambda: register_dataset(f"127.0.0.1:{port}", Dataset.range(3), timeout_ms=500))


# --- user errors on workers ----------------------------------------------------------------

class CustomPipelineError(Exception):
    pass


def test_user_function_error_reaches_the_client_with_type_message_and_worker():
    with TestCluster(num_workers=1) as one:
        worker_address = one.workers[0].address

        def explode(x):
            return 1 // (int(x) - 3)  # ZeroDivisionError at x == 3

        dataset = Dataset.range(10).map(explode).apply(distribute("parallel_epochs", one.target))
        with pytest.raises(ZeroDivisionError) as info:
            list(dataset)
        # The original exception, not mangled: its own arguments and message.
        assert info.value.args == ("integer division or modulo by zero",)
        remote = info.value.__cause__
        assert isinstance(remote, errors.RemoteUserError)
        assert remote.remote_type == "builtins.ZeroDivisionError"
        assert remote.worker_address == worker_address
        # The worker's traceback: the user's file, line and function, and where it ran.
        assert f'test_service_errors.py", line {explode.__code__.co_firstlineno + 1}, in explode' \
            in remote.remote_traceback
        assert "return 1 // (int(x) - 3)" in remote.remote_traceback
        assert re.search(rf"raised in Dataset\.map\(\S*explode\) on worker {worker_address}", str(remote))
        assert remote.remote_traceback in str(remote)

        # The worker carries on: another job on it reads fine.
        assert ints(Dataset.range(10).apply(distribute("parallel_epochs", one.target))) == list(range(10))


def test_user_error_of_a_type_the_client_has_is_raised_as_that_type():
    with TestCluster(num_workers=1) as one:
        def fail(x):
            if x == 2:
                raise CustomPipelineError("bad record", 2)
            return x

        dataset = Dataset.range(5).map(fail).apply(distribute("distributed_epoch", one.target))
        with pytest.raises(CustomPipelineError) as info:
            list(dataset)
        assert info.value.args == ("bad record", 2)
        assert isinstance(info.value.__cause__, errors.RemoteUserError)


def test_user_error_of_a_type_the_client_cannot_import_is_remote_user_error():
    class LocalPipelineError(Exception):
        """Defined in a function: the client cannot look it up by name."""

    with TestCluster(num_workers=1) as one:
        def fail(x):
            if x == 2:
                raise LocalPipelineError("bad record 2")
            return x

        dataset = Dataset.range(5).map(fail).apply(distribute("distributed_epoch", one.target))
        with pytest.raises(errors.RemoteUserError, match="bad record 2") as info:
            list(dataset)
        assert info.value.remote_type.endswith("LocalPipelineError")
        assert info.value.worker_address == one.workers[0].address


def _fail_on_load():
    raise ModuleNotFoundError("No module named 'only_on_the_client'", name="only_on_the_client")


class _OnlyOnTheClient:
    """Pickles fine, but fails to unpickle: like a pipeline that needs a module workers lack."""

    def __reduce__(self):
        return (_fail_on_load, ())


def test_pipeline_a_worker_cannot_load_fails_at_once_naming_the_worker(caplog):
    with TestCluster(num_workers=1) as one:
        needed = _OnlyOnTheClient()
        dataset = Dataset.range(3).map(lambda x: (needed, x)[1]).apply(distribute("parallel_epochs", one.target))
        start = time.monotonic()
        with pytest.raises(errors.MissingModuleError, match="only_on_the_client") as info:
            list(dataset)
        assert time.monotonic() - start < 3
        assert one.workers[0].address in str(info.value) and "install it on the workers" in str(info.value)
        assert info.value.module == "only_on_the_client" and info.value.worker_address == one.workers[0].address
        # The worker is fine, and did not keep retrying the load: it serves the next job.
        assert ints(Dataset.range(4).apply(distribute("parallel_epochs", one.target))) == [0, 1, 2, 3]
    load_failures = [r for r in caplog.records if "cannot load the pipeline" in r.getMessage()]
    assert len(load_failures) == 1


def test_unencodable_element_is_reported_not_hung(cluster):
    # A generator has no wire form and cannot be pickled: the worker reports it like a user error.
    dataset = Dataset.range(2).map(lambda x: (i for i in range(3))).apply(distribute("parallel_epochs", cluster.target))
    with pytest.raises(TypeError, match="generator") as info:
        list(dataset)
    assert isinstance(info.value.__cause__, errors.RemoteUserError)


def make_record(x):
    return {"id": x, "lock": threading.Lock()}


def make_nested(x):
    return (x, {"meta": threading.Lock(), "ok": b"fine"})


@pytest.mark.parametrize("pipeline, function, path", [
    (lambda ds: ds.map(make_record), "make_record", "['lock']"),
    # The transformations after the map pass its elements on: the map made them.
    (lambda ds: ds.map(make_nested).prefetch(2).take(5), "make_nested", "[1]['meta']"),
], ids=["dict", "nested-then-prefetch"])
def test_unserializable_element_names_its_transformation_function_and_component(cluster, pipeline, function, path):
    dataset = pipeline(Dataset.range(3)).apply(distribute("parallel_epochs", cluster.target))
    with pytest.raises(errors.ElementSerializationError) as info:
        run_with_deadline(lambda: list(dataset), 30)
    error = info.value
    assert re.fullmatch(rf"Dataset\.map\(\S*{function}\)", error.where), error.where
    assert (error.path, error.component_type) == (path, "_thread.lock")
    assert f"{error.where} produced an element that cannot be serialized: its component {path} is a " \
           f"_thread.lock (TypeError: cannot pickle '_thread.lock' object)" in str(error)
    assert isinstance(error, TypeError)
    remote = error.__cause__
    assert isinstance(remote, errors.RemoteUserError)
    assert f"(raised in {error.where} on worker " in str(remote)
    assert "wire.py" not in str(remote)  # what and where, not the encoder's frames


# --- unsplittable pipelines ----------------------------------------------------------------

def _gen():
    yield from range(3)


def test_distributed_epoch_over_from_generator_is_not_splittable(cluster):
    with pytest.raises(errors.NotSplittableError, match="from_generator"):
        Dataset.from_generator(_gen).apply(distribute("distributed_epoch", cluster.target))
    # Registered first and read by id: the dispatcher refuses the job.
    dataset_id = register_dataset(cluster.target, Dataset.from_generator(_gen))
    with pytest.raises(errors.NotSplittableError):
        list(from_dataset_id("distributed_epoch", cluster.target, dataset_id))
    # parallel_epochs is fine.
    assert sorted(ints(from_dataset_id("parallel_epochs", cluster.target, dataset_id))) == [0, 0, 1, 1, 2, 2]


# --- garbage on the ports ------------------------------------------------------------------

_GARBAGE = [
    b"\x00\xff" * 4096,
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    # An HTTP/2 preface, then a frame header claiming a huge frame, then noise.
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff\xff\xff\x00\x00\x00\x00\x00\x01" + bytes(range(256)) * 16,
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",  # then silence, connection left open below
]


def _send_garbage(port: int) -> list[socket.socket]:
    """Sends every garbage payload on its own connection; returns the connections left open."""
    held = []
    for payload in _GARBAGE:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        try:
            s.sendall(payload)
        except OSError:  # the server may hang up mid-send: that is fine
            pass
        held.append(s)
    return held


def test_garbage_on_dispatcher_and_worker_ports_does_not_take_them_down(cluster):
    held = []
    try:
        held += _send_garbage(cluster.port)
        for worker in cluster.workers:
            held += _send_garbage(worker.port)
        # While the garbage connections are still open, a normal read works.
        dataset = Dataset.range(20).apply(distribute("parallel_epochs", cluster.target))
        assert sorted(ints(dataset)) == sorted(list(range(20)) * 2)
    finally:
        for s in held:
            s.close()
    dataset = Dataset.range(20).apply(distribute("distributed_epoch", cluster.target))
    assert sorted(ints(dataset)) == list(range(20))


def test_concurrent_garbage_while_reading(cluster):
    stop = threading.Event()

    def spam():
        while not stop.is_set():
            for port in [cluster.port] + [w.port for w in cluster.workers]:
                for s in _send_garbage(port):
                    s.close()

    spammer = threading.Thread(target=spam, daemon=True)
    spammer.start()
    try:
        dataset = Dataset.range(1_000).apply(distribute("distributed_epoch", cluster.target,
                                                        max_outstanding_requests=16))
        assert sorted(ints(dataset)) == list(range(1_000))
    finally:
        stop.set()
        spammer.join(10)
