"""Bad input is INVALID_ARGUMENT (issue 11): a bounded, seeded fuzz of every RPC of a real
dispatcher and a real worker.

Each method gets random byte strings (most of which are no valid protobuf at all) and valid
protobufs of its request type with absurd values (int64 extremes, negative ids, 10 MB strings
and blobs, task lists past the bounds, random unicode, ranges out of order), mixed with the ids
of real datasets, jobs, iterations, clients and tasks so that some reach deep into the core.
The requests go over the wire as raw bytes, on channels with no serializer. No answer may be
INTERNAL or UNKNOWN, none may take longer than its deadline, nothing may log a traceback, the
refusals may log a couple of lines per method at most, and afterwards the cluster serves a
read correctly.

Fake workers: an absurd WorkerHeartbeat may carry a plausible address (a dead port on
127.0.0.1) and register a worker that never serves. Rather than keep such heartbeats out
of the fuzz, the check afterwards waits until the dispatcher has lost them (worker_timeout_ms
without a heartbeat), as it would any dead worker, and reads a fresh job: a new iteration gets
tasks on live workers only, so the read must return every element exactly once.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import random
import time
from concurrent import futures
from typing import Optional

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor

import dataservice as ds
from dataservice.data.serialization import serialize_dataset
from dataservice.proto import dispatcher_pb2, state_pb2, worker_pb2
from dataservice.service.auth import NONCE_KEY, TOKEN_ENV, TOKEN_FILE_ENV, ClusterAuth, new_nonce, task_read_key
from dataservice.service.dispatcher_client import DispatcherClient
from dataservice.service.rpc import make_channel
from tests.cluster import TestCluster, free_port, run_with_deadline, wait_until

TOKEN = "rpc-fuzz-test-cluster-token-0123456789abcdef"
SEED = 20240611
RANDOM_BYTES_PER_METHOD = 30
ABSURD_PER_METHOD = 20
WORKER_TIMEOUT_MS = 1_000

ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
           grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS}
#: Long polls end well within these: the dispatcher's within worker_timeout_ms / 2 (WorkerHeartbeat) or
#: 1 s (GetSplit); a worker waits up to 5 s for a task it has not heard of, then 5 s for an element.
DISPATCHER_DEADLINE_S = 8.0
WORKER_DEADLINE_S = 15.0

DISPATCHER = dispatcher_pb2.DESCRIPTOR.services_by_name["Dispatcher"]
WORKER = worker_pb2.DESCRIPTOR.services_by_name["Worker"]

F = FieldDescriptor
INT64_EDGES = [-2 ** 63, 2 ** 63 - 1, -1, 0, 2 ** 31, -2 ** 31, 2 ** 53 + 1]
#: The most bytes the items of one repeated message field add up to (a request stays under gRPC's 64 MiB).
REPEATED_MESSAGES_BYTES = 24 * 1024 * 1024
INT32_EDGES = [-2 ** 31, 2 ** 31 - 1, -1]
UINT64_EDGES = [0, 2 ** 64 - 1, 2 ** 63, 10 ** 13 + 1]
TEN_MB = 10 * 1024 * 1024


class Fuzzer:
    """Random requests. ``rng`` makes them reproducible; ``real`` (field name -> values: ids, read keys
    of the real objects) and plausible values let some requests through the checks, deep into the core."""

    def __init__(self, rng: random.Random, real: dict[str, list], dead_address: str):
        self.rng = rng
        self.real = real
        self.dead_address = dead_address

    def random_bytes(self) -> bytes:
        # Short strings are the ones that sometimes parse; long ones exercise the parser's refusals.
        n = self.rng.choice([self.rng.randint(0, 16), self.rng.randint(0, 4096)])
        return self.rng.randbytes(n)

    def absurd(self, descriptor, depth: int = 0, rate: Optional[float] = None):
        """A message of type ``descriptor``, each field left at its default, plausible, or (at ``rate``) absurd.
        A request with a single absurd field among plausible ones reaches its check; with none, the core."""
        if rate is None:
            rate = self.rng.choice([0.05, 0.2, 0.5])
        message = message_factory.GetMessageClass(descriptor)()
        for field in descriptor.fields:
            draw = self.rng.random()
            if draw < 0.15:
                continue
            plausible = draw >= 0.15 + rate
            if field.is_repeated:
                self._repeated(message, field, depth, plausible, rate)
            elif field.type == F.TYPE_MESSAGE:
                getattr(message, field.name).CopyFrom(self.absurd(field.message_type, depth + 1, rate))
            else:
                setattr(message, field.name, self._plausible(field) if plausible else self._absurd(field))
        return message

    def _plausible(self, field):
        rng = self.rng
        real = self.real.get(field.name)
        if real and rng.random() < 0.7:
            return rng.choice(real)
        if field.type in (F.TYPE_INT64, F.TYPE_INT32):
            return rng.randint(0, 100)
        if field.type == F.TYPE_UINT64:  # rates (GetElements.receive_bytes_per_s): bytes/s
            return rng.choice([0, rng.randint(1, 10 ** 10)])
        if field.type == F.TYPE_ENUM:
            return rng.choice([1, 2])
        if field.type == F.TYPE_BOOL:
            return rng.random() < 0.5
        if field.type == F.TYPE_STRING:
            return self.dead_address if "address" in field.name else f"fuzz-{rng.randint(0, 3)}"
        if field.type == F.TYPE_BYTES:
            return rng.randbytes(rng.choice([16, 32]))
        raise AssertionError(f"no plausible values for {field.full_name} of type {field.type}")

    def _absurd(self, field):
        rng = self.rng
        if field.type == F.TYPE_INT64:
            return rng.choice(INT64_EDGES + [rng.randint(-2 ** 63, 2 ** 63 - 1)])
        if field.type == F.TYPE_INT32:
            return rng.choice(INT32_EDGES)
        if field.type == F.TYPE_UINT64:
            return rng.choice(UINT64_EDGES + [rng.randint(0, 2 ** 64 - 1)])
        if field.type == F.TYPE_ENUM:
            return rng.choice([-1, 0, 3, 2 ** 31 - 1, -2 ** 31])  # proto3 enums take unknown values
        if field.type == F.TYPE_BOOL:
            return rng.random() < 0.5
        if field.type == F.TYPE_STRING:
            return rng.choice([
                "x" * TEN_MB, self._unicode(rng.randint(1, 300)), "\x00\n\x7f", "localhost:0", "[::1]:70000",
                "a" * 300 + ":1", ":", "host:-1", ""])
        if field.type == F.TYPE_BYTES:
            return rng.choice([rng.randbytes(1024) * (TEN_MB // 1024), rng.randbytes(65), b""])
        raise AssertionError(f"no absurd values for {field.full_name} of type {field.type}")

    def _unicode(self, n: int) -> str:
        # Any code point but the surrogates, which have no UTF-8 form.
        points = (self.rng.choice([self.rng.randint(0, 0xD7FF), self.rng.randint(0xE000, 0x10FFFF)]) for _ in range(n))
        return "".join(map(chr, points))

    def _repeated(self, message, field, depth: int, plausible: bool, rate: float) -> None:
        rng = self.rng
        target = getattr(message, field.name)
        if field.type == F.TYPE_MESSAGE:
            if depth < 2:
                size = 0
                for _ in range(rng.choice([1, 3]) if plausible else 50):
                    item = self.absurd(field.message_type, depth + 1, rate)
                    size += item.ByteSize()
                    if size > REPEATED_MESSAGES_BYTES:  # 50 items of 10 MB blobs: more than a message may be
                        break
                    target.add().CopyFrom(item)
            return
        if field.type == F.TYPE_STRING:  # labels (WorkerHeartbeat.worker_tags)
            target.extend(rng.sample(["COLOCATED", "zone-a", "fuzz-1"], rng.randint(1, 2)) if plausible else
                          rng.choice([["x" * TEN_MB], ["a,b"], ["has space"], [""], [f"t{k}" for k in range(100)],
                                      ["y" * 65], [self._unicode(rng.randint(1, 30))], ["\x00"]]))
            return
        if field.type == F.TYPE_UINT64:  # ids (GetElementsRequest.returned_segments): never lent ones, many
            target.extend([rng.randint(1, 5)] if plausible else
                          rng.choice([UINT64_EDGES, [rng.randint(0, 2 ** 64 - 1) for _ in range(1000)], [1] * 150_000]))
            return
        if field.type != F.TYPE_INT64:
            raise AssertionError(f"no values for {field.full_name} of type {field.type}")
        if field.name == "ranges":
            # Now and then a huge list (300,000 ranges, 3.6 MB); mostly small ones, often breaking the rules.
            n = 300_000 if rng.random() < 0.05 else 10
            target.extend(rng.choice([[0, 5, 10, 20], [v for k in range(n, 0, -1) for v in (2 * k, 2 * k + 1)]])
                          if plausible else
                          rng.choice([[5, 3], [-1, 4], [0, 1, 2], [2 ** 63 - 2, 2 ** 63 - 1, 0, 10],
                                      range(2 * n, 0, -1)]))
            return
        if plausible:
            target.extend(rng.sample(self.real.get("task_id", [1]), 1) + [rng.randint(1, 100)])
            return
        values = INT64_EDGES + self.real.get("task_id", [1])
        size = rng.choice([2, 100, 150_000])
        rng.shuffle(values)
        target.extend((values * (size // len(values) + 1))[:size])


def call_raw(channel: grpc.Channel, service, method, body: bytes, metadata, deadline_s: float
             ) -> tuple[grpc.StatusCode, str, float]:
    """One call with ``body`` as the request's bytes: its status code, details and duration."""
    path = f"/{service.full_name}/{method.name}"
    start = time.monotonic()
    try:
        if method.server_streaming:
            for _ in channel.unary_stream(path)(body, timeout=deadline_s, metadata=metadata):
                pass
        else:
            channel.unary_unary(path)(body, timeout=deadline_s, metadata=metadata)
        return grpc.StatusCode.OK, "", time.monotonic() - start
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or "", time.monotonic() - start


def real_objects(cluster: TestCluster, auth: Optional[ClusterAuth]) -> dict[str, list]:
    """A registered dataset, a job and its iteration with a client: ids and keys the fuzz aims at."""
    client = DispatcherClient(cluster.dispatcher_address, timeout_ms=10_000, auth=auth)
    try:
        dataset_id = client.register_dataset(serialize_dataset(ds.Dataset.range(20)), 1)
        job_id = client.get_or_create_job(dataset_id, state_pb2.PARALLEL_EPOCHS, "fuzz-target")
        iteration = client.get_or_create_iteration(job_id, 0)
        tasks = wait_until(lambda: [t for w in client.get_status().workers for t in w.tasks], 10, "a task")
    finally:
        client.close()
    return {"dataset_id": [dataset_id], "job_id": [job_id], "iteration_id": [iteration.iteration_id],
            "client_id": [iteration.client_id], "task_id": tasks, "stream_id": tasks, "split_index": [0, 1],
            "read_key": [iteration.read_key] + [task_read_key(iteration.read_key, t) for t in tasks],
            # Issue 18's read options: names that pass the checks, so that some requests go deeper.
            "compression": ["", "AUTO", "LZ4", "ZSTD"], "target_workers": ["", "AUTO", "ANY", "LOCAL"],
            "host_id": ["node-7", "c1f0d5a93b7e2a44"]}


@dataclasses.dataclass(frozen=True)
class Case:
    """One call of the fuzz; its request is built from ``seed`` when it is sent (10 MB fields: not all at once)."""

    service: object
    method: object
    absurd: bool
    seed: int
    ask_proof: bool   # send a nonce: with a token the interceptor then wraps our handler

    def request(self, real: dict, dead_address: str):
        """The request: random bytes, or an absurd message of the method's request type."""
        fuzzer = Fuzzer(random.Random(self.seed), real, dead_address)
        return fuzzer.absurd(self.method.input_type) if self.absurd else fuzzer.random_bytes()

    def describe(self, real: dict, dead_address: str) -> str:
        request = self.request(real, dead_address)
        if not self.absurd:
            return f"random bytes (seed {self.seed}, {len(request)} bytes)"
        return f"absurd request (seed {self.seed}, {request.ByteSize():,} bytes): {_fields(request)}"


def _fields(message) -> str:
    """A message's fields in brief: long values by their size (str() of a 10 MB field takes seconds)."""
    parts = []
    for field, value in message.ListFields():
        if field.is_repeated:
            first = _fields(value[0]) if field.type == F.TYPE_MESSAGE else repr(list(value[:4]))
            parts.append(f"{field.name}=[{len(value):,} items, first {first}]")
        elif field.type == F.TYPE_MESSAGE:
            parts.append(f"{field.name}={{{_fields(value)}}}")
        elif isinstance(value, (str, bytes)) and len(value) > 40:
            parts.append(f"{field.name}=<{len(value):,} {'characters' if isinstance(value, str) else 'bytes'}>")
        else:
            parts.append(f"{field.name}={value!r}")
    return " ".join(parts)


def fuzz_cases(rng: random.Random) -> list[Case]:
    cases = [Case(service, method, absurd, rng.getrandbits(64), rng.random() < 0.5)
             for service in (DISPATCHER, WORKER) for method in service.methods
             for absurd, count in ((False, RANDOM_BYTES_PER_METHOD), (True, ABSURD_PER_METHOD))
             for _ in range(count)]
    rng.shuffle(cases)
    return cases


@pytest.mark.parametrize("with_token", [False, True], ids=["no-token", "token"])
def test_fuzzed_requests_are_refused_cleanly_and_the_cluster_still_serves(with_token, monkeypatch, caplog):
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    if with_token:
        monkeypatch.setenv(TOKEN_ENV, TOKEN)
    else:
        monkeypatch.delenv(TOKEN_ENV, raising=False)
    auth = ClusterAuth(TOKEN) if with_token else None
    caplog.set_level(logging.WARNING)
    with TestCluster(num_workers=1, worker_timeout_ms=WORKER_TIMEOUT_MS) as cluster:
        real = real_objects(cluster, auth)
        dead_address = f"127.0.0.1:{free_port()}"
        channels = {DISPATCHER: make_channel(cluster.dispatcher_address, auth),
                    WORKER: make_channel(cluster.workers[0].address, auth)}
        deadlines = {DISPATCHER: DISPATCHER_DEADLINE_S, WORKER: WORKER_DEADLINE_S}

        def run(case: Case):
            request = case.request(real, dead_address)
            body = request if isinstance(request, bytes) else request.SerializeToString()
            metadata = ((NONCE_KEY, new_nonce().hex()),) if with_token and case.ask_proof else None
            return case, call_raw(channels[case.service], case.service, case.method, body, metadata,
                                  deadlines[case.service])

        try:
            with futures.ThreadPoolExecutor(8) as pool:
                results = run_with_deadline(lambda: list(pool.map(run, fuzz_cases(random.Random(SEED + with_token)))),
                                            120)
        finally:
            for channel in channels.values():
                channel.close()

        bad = [f"{case.method.name} {case.describe(real, dead_address)}: {code.name} after {took:.1f} s: "
               f"{details[:300]}" for case, (code, details, took) in results if code not in ALLOWED]
        assert not bad, f"{len(bad)} of {len(results)} calls answered badly:\n" + "\n".join(bad[:10])
        codes = collections.Counter(code.name for _, (code, _, _) in results)
        assert codes["INVALID_ARGUMENT"] > len(results) // 2, codes  # the refusals were the answer, not luck

        tracebacks = [r for r in caplog.records if r.exc_info]
        assert not tracebacks, f"logged with a traceback: {tracebacks[0].name}: {tracebacks[0].getMessage()[:500]}"
        per_method = collections.Counter(m.name for service in (DISPATCHER, WORKER) for m in service.methods
                                         for r in caplog.records if r.getMessage().startswith(m.name))
        assert per_method and max(per_method.values()) <= 2, per_method

        _serves_a_fresh_read(cluster)


def _serves_a_fresh_read(cluster: TestCluster) -> None:
    client = DispatcherClient.from_environment(cluster.dispatcher_address, timeout_ms=10_000)
    try:
        def fakes_lost() -> bool:
            # The dispatcher's test (silent for worker_timeout_ms), by the wall clock of its status, which
            # shows when a heartbeat came, not when its long poll (up to worker_timeout_ms / 2) ended.
            live = {w.address for w in cluster.workers}
            now = time.time()
            return all(now - w.last_heartbeat_unix > 1.5 * WORKER_TIMEOUT_MS / 1000 + 0.2
                       for w in client.get_status().workers if w.address not in live)

        wait_until(fakes_lost, 10, "the fuzz's fake workers to be lost", interval_s=0.1)
    finally:
        client.close()
    dataset = ds.Dataset.range(200).apply(ds.distribute("parallel_epochs", cluster.target, job_name="after-fuzz",
                                                        timeout_ms=20_000))
    assert sorted(run_with_deadline(lambda: [int(x) for x in dataset], 30)) == list(range(200))
