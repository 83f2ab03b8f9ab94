"""A call in flight when the dispatcher stops is answered by the dispatcher that comes back. A stopping
server cancels what it has not answered (CANCELLED: a fault-tolerant dispatcher's heartbeat waiting for its
fsync, say), and the client, which did not cancel the call itself, retries it as it retries an unreachable
dispatcher, until its timeout. A closed client's call still ends at once.

The server that cancels is a real gRPC server on 127.0.0.1 answering the dispatcher's GetStatus as a
stopping one does; the rest run against a real cluster.

Example::

    >>> client.worker_heartbeat(long_poll)   # the dispatcher restarts meanwhile: answered by the new one
"""

from __future__ import annotations

import threading
from concurrent import futures

import grpc

from dataservice import errors
from dataservice.proto import dispatcher_pb2 as pb
from dataservice.service.dispatcher_client import DispatcherClient
from tests.cluster import TestCluster, wait_until


class CancellingServer:
    """A gRPC server with the dispatcher's GetStatus that cancels its first ``cancels`` calls, then answers."""

    def __init__(self, cancels: int):
        self.calls = 0
        self._cancels = cancels
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.unary_unary_rpc_method_handler(self._get_status,
                                                      request_deserializer=pb.GetStatusRequest.FromString,
                                                      response_serializer=pb.GetStatusResponse.SerializeToString)
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("dataservice.Dispatcher", {"GetStatus": handler}),))
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    def _get_status(self, request, context):
        self.calls += 1
        if self.calls <= self._cancels:
            context.abort(grpc.StatusCode.CANCELLED, "the server is stopping")
        return pb.GetStatusResponse(dispatcher_incarnation="back")

    def __enter__(self) -> "CancellingServer":
        self._server.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.stop(0)


def test_a_call_the_server_cancelled_is_tried_again():
    with CancellingServer(cancels=2) as server:
        client = DispatcherClient(f"127.0.0.1:{server.port}", timeout_ms=20_000)
        try:
            assert client.get_status().dispatcher_incarnation == "back"
            assert server.calls == 3
        finally:
            client.close()


def test_a_call_cancelled_until_the_timeout_fails_with_our_error():
    with CancellingServer(cancels=10**9) as server:
        client = DispatcherClient(f"127.0.0.1:{server.port}", timeout_ms=1_000)
        try:
            try:
                client.get_status()
            except errors.DataServiceError as exc:
                assert "CANCELLED" in str(exc) or "stopping" in str(exc), exc
            else:
                raise AssertionError("a call cancelled every time succeeded")
            assert server.calls > 1
        finally:
            client.close()

ADDRESS = "127.0.0.1:1"


def _long_poll_in_flight(cluster: TestCluster, client: DispatcherClient) -> dict:
    client.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address=ADDRESS, worker_uid="u"))  # registers
    outcome: dict = {}

    def poll() -> None:
        try:
            outcome["response"] = client.worker_heartbeat(
                pb.WorkerHeartbeatRequest(worker_address=ADDRESS, worker_uid="u", wait_ms=60_000))
        except BaseException as exc:  # handed to the test's thread
            outcome["error"] = exc

    outcome["thread"] = threading.Thread(target=poll, daemon=True)
    outcome["thread"].start()
    wait_until(lambda: cluster.dispatcher.core.wakeups.waiting(), 10, "the long poll held by the dispatcher")
    return outcome


def test_a_long_poll_cut_by_a_restart_is_answered_by_the_new_dispatcher(tmp_path):
    with TestCluster(num_workers=0, fault_tolerant_mode=True, work_dir=str(tmp_path)) as cluster:
        client = DispatcherClient(cluster.dispatcher_address, timeout_ms=30_000)
        try:
            outcome = _long_poll_in_flight(cluster, client)
            old = cluster.dispatcher.core.incarnation
            cluster.restart_dispatcher()  # held past the stop's grace: cancelled by the stopping server
            outcome["thread"].join(30)
            assert not outcome["thread"].is_alive()
            assert "error" not in outcome, outcome.get("error")
            assert outcome["response"].dispatcher_incarnation not in ("", old)
        finally:
            client.close()


def test_a_closed_clients_call_in_flight_still_ends_at_once(tmp_path):
    with TestCluster(num_workers=0) as cluster:
        client = DispatcherClient(cluster.dispatcher_address, timeout_ms=30_000)
        outcome = _long_poll_in_flight(cluster, client)
        client.close()
        outcome["thread"].join(10)
        assert not outcome["thread"].is_alive()
        assert isinstance(outcome.get("error"), errors.DataServiceError), outcome
