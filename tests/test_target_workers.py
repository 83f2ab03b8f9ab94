"""Worker tags and ``target_workers`` (issue 18): "ANY", "LOCAL" (in-process workers, read with no RPC and no
copy), "AUTO" with the "COLOCATED" tag (a reader on a host with such a worker reads its host's workers only).

Real dispatchers and workers on 127.0.0.1; in-process reads are on here (tests/conftest.py turns them off
for the other test modules, which test the network paths with in-process clusters)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from dataservice import Dataset, distribute, errors
from dataservice.cli import build_parser, format_status, status_as_dict
from dataservice.client.local_transport import local_stats
from dataservice.client.transports import received_bytes
from dataservice.dispatcher.state import DispatcherState
from dataservice.proto import state_pb2
from dataservice.service.config import WorkerConfig
from dataservice.service.dispatcher_client import DispatcherClient
from dataservice.service.host_identity import host_id
from dataservice.worker import local_workers
from tests import netns
from tests.cluster import TestCluster, run_with_deadline, wait_until
from tests.processes import run_cli, wait_for_workers

#: The longest any read of these tests may take.
READ_DEADLINE_S = 20.0


def _array_of(i) -> np.ndarray:
    """An array that records its own identity and its memory's address (the pipeline travels by value, so a
    registry here would not be the worker's). A copy, made while the original lives, has other ones."""
    array = np.full(1024, int(i), dtype=np.int64)
    array[1], array[2] = id(array), array.ctypes.data
    return array


def _fail_at_5(i):
    if int(i) == 5:
        raise ValueError("element 5 is bad")
    return i


def read_all(dataset, deadline_s: float = READ_DEADLINE_S) -> list:
    return run_with_deadline(lambda: list(dataset), deadline_s)


# --- worker tags ----------------------------------------------------------------------------------

@pytest.mark.parametrize("tags, why", [
    ("COLOCATED,zone-a", "not one string"),
    ([""], "non-empty"),
    ([" zone-a"], "without whitespace at either end"),
    (["zone\na"], "printable"),
    (["a,b"], "without commas"),
    ([7], "the tag 7"),
    (["x" * 65], "at most 64"),
    ([f"t{i}" for i in range(33)], "33 tags, more than 32"),
])
def test_worker_tags_are_checked_with_a_fix(tags, why):
    with pytest.raises(ValueError, match=why):
        WorkerConfig(dispatcher_address="localhost:1", worker_tags=tags)


def test_worker_tags_are_a_tuple_and_the_flag_splits_commas(capsys):
    assert WorkerConfig(dispatcher_address="localhost:1", worker_tags=["COLOCATED", "zone-a"]).worker_tags == \
        ("COLOCATED", "zone-a")
    args = build_parser().parse_args(["worker", "--dispatcher", "localhost:1", "--worker-tags", "COLOCATED,zone-a"])
    assert args.worker_tags == ("COLOCATED", "zone-a")
    # Any string tf.data takes but for what cannot travel as written: spaces inside a tag are kept.
    assert WorkerConfig(dispatcher_address="localhost:1", worker_tags=["Unused tag 1", "zône b"]).worker_tags == \
        ("Unused tag 1", "zône b")
    args = build_parser().parse_args(["worker", "--dispatcher", "localhost:1", "--worker-tags",
                                      "Unused tag 1, Unused tag 2"])
    assert args.worker_tags == ("Unused tag 1", "Unused tag 2")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "--dispatcher", "localhost:1", "--worker-tags", "a,,b"])
    assert "drop empty ones" in capsys.readouterr().err


def test_tags_and_host_survive_the_journal():
    state = DispatcherState()
    state.apply(state_pb2.Update(register_worker=state_pb2.RegisterWorkerUpdate(
        worker_address="w:1", worker_uid="u", worker_tags=["COLOCATED", "Unused tag 1"], host_id="node-7")))
    replayed = DispatcherState()
    for update in state.to_updates():
        replayed.apply(update)
    assert replayed.workers["w:1"].tags == ("COLOCATED", "Unused tag 1")
    assert replayed.workers["w:1"].host_id == "node-7"


def test_tags_show_in_get_status_the_cli_tables_and_status_json():
    with TestCluster(num_workers=0, http_port=0) as cluster:
        tagged = cluster.add_worker(worker_tags=["COLOCATED", "Unused tag 1"])
        cluster.add_worker()
        cluster.wait_for_workers(2)
        client = DispatcherClient(cluster.dispatcher_address)
        try:
            response = client.get_status()
        finally:
            client.close()
        by_address = {w.address: w for w in response.workers}
        assert list(by_address[tagged.address].tags) == ["COLOCATED", "Unused tag 1"]
        assert by_address[tagged.address].host_id == host_id()
        status = status_as_dict(response, cluster.target)
        assert {w["address"]: w["tags"] for w in status["workers"]}[tagged.address] == ["COLOCATED", "Unused tag 1"]
        out = io.StringIO()
        format_status(status, out)
        assert "TAGS" in out.getvalue() and "COLOCATED,Unused tag 1" in out.getvalue()
        with urllib.request.urlopen(f"http://127.0.0.1:{cluster.dispatcher.http_port}/status.json", timeout=5) as f:
            page = json.load(f)
        assert {w["address"]: w["tags"] for w in page["workers"]}[tagged.address] == ["COLOCATED", "Unused tag 1"]


@pytest.mark.slow
def test_a_worker_tagged_from_the_command_line_with_spaces_shows_in_dataservice_status(procs):
    # tf.data service's own tests tag workers "Unused tag 1": the flag keeps spaces inside a tag.
    dispatcher = procs.dispatcher()
    worker = procs.worker(dispatcher.port, "--worker-tags", "Unused tag 1, COLOCATED")
    wait_for_workers(dispatcher.port, [worker.address])
    status = procs.status(dispatcher.port)
    assert {w["address"]: w["tags"] for w in status["workers"]} == {worker.address: ["Unused tag 1", "COLOCATED"]}
    table = run_cli(procs.env, "status", "--dispatcher", dispatcher.address)
    assert table.returncode == 0, table.stderr
    assert "Unused tag 1,COLOCATED" in table.stdout
    # What cannot travel as written is refused before the worker starts, naming the tag.
    refused = run_cli(procs.env, "worker", "--dispatcher", dispatcher.address, "--worker-tags", "ok,b\tad")
    assert refused.returncode == 2 and "the tag 'b\\tad'" in refused.stderr, refused.stderr


# --- LOCAL ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("worker_protocol", ["tcp", "grpc"])
def test_local_reads_the_pipelines_own_objects_without_any_connection(worker_protocol):
    with TestCluster(num_workers=0) as cluster:
        worker = cluster.add_worker(data_transfer_protocol=worker_protocol)
        cluster.wait_for_workers(1)
        received, taken = received_bytes(), local_stats()["elements"]
        dataset = Dataset.range(40).map(_array_of).apply(
            distribute("parallel_epochs", cluster.target, target_workers="LOCAL"))
        iterator = iter(dataset)
        first = run_with_deadline(lambda: next(iterator), READ_DEADLINE_S)
        if worker_protocol == "tcp":
            assert worker._data_server.connections == 0  # no data-transfer connection, even while reading
        got = [first, *run_with_deadline(lambda: list(iterator), READ_DEADLINE_S)]
        assert sorted(int(a[0]) for a in got) == list(range(40))
        # No copy: the very arrays the pipeline made (their identity, their memory).
        assert all(id(a) == a[1] and a.ctypes.data == a[2] for a in got)
        assert received_bytes() == received  # no byte came over TCP, memory reads or gRPC
        assert local_stats()["elements"] - taken == 40
        assert worker.production.totals()[0] == 40  # the worker served them, through responses.take


def test_local_reports_a_pipeline_error_as_the_network_paths_do():
    with TestCluster(num_workers=1) as cluster:
        raised = {}
        for target, protocol in (("LOCAL", None), ("ANY", "tcp")):
            dataset = Dataset.range(10).map(_fail_at_5).apply(
                distribute("parallel_epochs", cluster.target, target_workers=target, data_transfer_protocol=protocol))
            with pytest.raises(ValueError) as info:  # the pipeline's own error type, with the worker's word
                read_all(dataset)
            raised[target] = info.value
        assert type(raised["LOCAL"]) is type(raised["ANY"])
        assert str(raised["LOCAL"]) == "element 5 is bad"
        assert "on worker" in " ".join(getattr(raised["LOCAL"], "__notes__", []))


def test_local_without_a_worker_of_this_dispatcher_in_this_process_fails_at_once():
    with TestCluster(num_workers=1) as other, TestCluster(num_workers=0) as cluster:
        dataset = Dataset.range(10).apply(distribute("parallel_epochs", cluster.target, target_workers="LOCAL"))
        started = time.monotonic()
        with pytest.raises(errors.InvalidRequestError) as info:
            read_all(dataset)
        assert time.monotonic() - started < 5
        message = str(info.value)
        assert f"no WorkerServer registered with dispatcher {cluster.dispatcher_address}" in message
        assert other.dispatcher_address in message  # what this process's worker serves instead
        assert "target_workers='ANY'" in message


@pytest.mark.slow
def test_local_with_only_remote_workers_fails_at_once_and_status_shows_their_tags(procs):
    dispatcher = procs.dispatcher()
    procs.worker(dispatcher.port, "--worker-tags", "COLOCATED,zone-a")
    status = procs.status(dispatcher.port)
    assert [w["tags"] for w in status["workers"]] == [["COLOCATED", "zone-a"]]
    text = subprocess.run([sys.executable, "-m", "dataservice", "status", "--dispatcher",
                           f"localhost:{dispatcher.port}"], capture_output=True, text=True, env=procs.env,
                          timeout=30)
    assert "COLOCATED,zone-a" in text.stdout, text.stderr
    dataset = Dataset.range(10).apply(distribute("parallel_epochs", f"localhost:{dispatcher.port}",
                                                 target_workers="LOCAL"))
    with pytest.raises(errors.InvalidRequestError, match="runs no WorkerServer registered with dispatcher"):
        read_all(dataset, deadline_s=5)
    # The same job read from any worker: the remote worker serves it.
    assert sorted(int(x) for x in read_all(Dataset.range(10).apply(
        distribute("parallel_epochs", f"localhost:{dispatcher.port}", target_workers="ANY")))) == list(range(10))


# --- AUTO and COLOCATED -------------------------------------------------------------------------------

def _two_workers(cluster: TestCluster, here: dict, elsewhere: dict) -> None:
    """A worker on this host and one that says it runs on another (``WorkerConfig.host_id``, the setting
    that also lets two network namespaces of one machine name their common host)."""
    cluster.add_worker(**here)
    cluster.add_worker(host_id="another-host", **elsewhere)
    cluster.wait_for_workers(2)


@pytest.mark.parametrize("mode", ["parallel_epochs", "distributed_epoch"])
def test_auto_with_a_colocated_worker_here_reads_this_host_only(mode):
    with TestCluster(num_workers=0) as cluster:
        _two_workers(cluster, here={"worker_tags": ["colocated"]}, elsewhere={})  # the tag in any case
        got = read_all(Dataset.range(10).apply(distribute(mode, cluster.target)))
        assert sorted(int(x) for x in got) == list(range(10))  # one worker's copy, and the read ended
        if mode == "parallel_epochs":
            anywhere = read_all(Dataset.range(10).apply(distribute(mode, cluster.target, target_workers="ANY")))
            assert sorted(int(x) for x in anywhere) == sorted(list(range(10)) * 2)


def test_auto_without_a_colocated_worker_here_reads_every_worker():
    with TestCluster(num_workers=0) as cluster:
        _two_workers(cluster, here={}, elsewhere={"worker_tags": ["COLOCATED"]})
        got = read_all(Dataset.range(10).apply(distribute("parallel_epochs", cluster.target)))
        assert sorted(int(x) for x in got) == sorted(list(range(10)) * 2)


@pytest.mark.slow
def test_another_network_namespace_is_another_host():
    why = netns.unavailable()
    if why:
        pytest.skip(why)
    code = "from dataservice.service.host_identity import host_id; print(host_id())"
    env = {k: v for k, v in os.environ.items() if k != "DATASERVICE_HOST_ID"}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    same = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=30)
    assert same.stdout.strip() == host_id()
    with netns.Network("10.78.0") as net:
        host = net.add_host("tw", 2)
        other = subprocess.run(["ip", "netns", "exec", host.namespace, sys.executable, "-c", code],
                               capture_output=True, text=True, env=env, timeout=30)
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() not in ("", host_id())


# --- shared jobs ------------------------------------------------------------------------------------

def test_readers_of_one_job_must_agree_on_target_workers():
    with TestCluster(num_workers=1) as cluster:
        local = iter(Dataset.range(10).apply(distribute("parallel_epochs", cluster.target, job_name="shared",
                                                        target_workers="LOCAL")))
        run_with_deadline(lambda: next(local), READ_DEADLINE_S)
        anywhere = Dataset.range(10).apply(distribute("parallel_epochs", cluster.target, job_name="shared",
                                                      target_workers="ANY"))
        with pytest.raises(errors.InvalidRequestError, match="target_workers='LOCAL'.*every reader of a job"):
            read_all(anywhere)
        rest = run_with_deadline(lambda: list(local), READ_DEADLINE_S)
        assert len(rest) == 9


def test_the_registry_follows_the_workers_life():
    with TestCluster(num_workers=1) as cluster:
        worker = cluster.workers[0]
        assert local_workers.find(worker.uid) is worker
        wait_until(lambda: worker.dispatcher_incarnation == cluster.dispatcher.core.incarnation, 5,
                   "the worker's first heartbeat")
        assert local_workers.serving(cluster.dispatcher_address, cluster.dispatcher.core.incarnation) == [worker]
        worker.stop()
        assert local_workers.find(worker.uid) is None


def test_local_does_not_go_with_coordinated_reads():
    with pytest.raises(ValueError, match="does not go with coordinated reads"):
        distribute("parallel_epochs", "localhost:1", job_name="j", consumer_index=0, num_consumers=2,
                   target_workers="LOCAL")
