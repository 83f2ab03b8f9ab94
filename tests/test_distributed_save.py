"""distributed_save through the service: workers write chunks in parallel, the dispatcher commits the
first chunk of each group; a killed worker or a restarted fault-tolerant dispatcher still gives every
element exactly once. In-process clusters (tests/cluster.py) and, for kill -9, real processes."""

from __future__ import annotations

import collections
import inspect
import os
import threading

import numpy as np
import pytest

import dataservice as ds
from dataservice import Dataset, errors
from dataservice.dispatcher import saves
from dataservice.proto import dispatcher_pb2
from tests.cluster import TestCluster, run_with_deadline, wait_until
from tests.processes import Processes, slow_identity, wait_for_workers

TIMEOUT_S = 60.0


def done(path) -> bool:
    return os.path.exists(os.path.join(path, saves.DONE_FILE)) or os.path.exists(os.path.join(path, saves.ERROR_FILE))


def assert_exactly_once(values, n: int) -> None:
    counts = collections.Counter(int(v) for v in values)
    missing = [i for i in range(n) if counts[i] != 1]
    assert not missing and len(counts) == n, f"{len(missing)} of range({n}) not exactly once (first {missing[:10]})"


def chunk_writers(cluster: TestCluster, save_id: int) -> collections.Counter:
    return collections.Counter(e["worker"] for kind, e in cluster.dispatcher.core.events
                               if kind == "commit_save_chunk" and e["save_id"] == save_id)


def test_two_workers_save_every_element_exactly_once(tmp_path):
    with TestCluster(num_workers=2) as cluster:
        path = str(tmp_path / "save")
        dataset = Dataset.range(30_000).map(lambda x: x * 2)
        ds.distributed_save(dataset, path, cluster.target)  # returns at once
        wait_until(lambda: done(path), TIMEOUT_S, "DONE")
        assert os.path.exists(os.path.join(path, saves.DONE_FILE))
        loaded = ds.load(path)
        assert loaded.cardinality() == 30_000
        assert sorted(int(x) for x in run_with_deadline(lambda: list(loaded), TIMEOUT_S)) == \
            [2 * i for i in range(30_000)]
        num_groups = dataset.split_groups().num_groups
        assert sorted(os.listdir(os.path.join(path, "chunks"))) == sorted(f"chunk_{g}" for g in range(num_groups))
        assert os.listdir(os.path.join(path, "uncommitted")) == []
        save_id = cluster.dispatcher.core.get_save_status(dispatcher_pb2.GetSaveStatusRequest(path=path)).save_id
        assert len(chunk_writers(cluster, save_id)) == 2, "both workers wrote chunks"


def test_elements_of_every_kind_round_trip_with_the_spec(tmp_path):
    with TestCluster(num_workers=2) as cluster:
        path = str(tmp_path / "kinds")
        dataset = Dataset.range(50).map(lambda x: {"a": np.full((2, 3), x, np.float32), "b": (x, b"x")})
        ds.distributed_save(dataset, path, cluster.target, compression="GZIP")
        wait_until(lambda: done(path), TIMEOUT_S, "DONE")
        loaded = ds.load(path)
        assert loaded.element_spec == ds.load(path).element_spec
        got = sorted(run_with_deadline(lambda: list(loaded), TIMEOUT_S), key=lambda e: int(e["b"][0]))
        assert [int(e["b"][0]) for e in got] == list(range(50))
        assert got[7]["a"].dtype == np.float32 and got[7]["a"].shape == (2, 3) and got[7]["b"][1] == b"x"


def test_load_with_wait_reads_while_the_save_is_written(tmp_path):
    with TestCluster(num_workers=2) as cluster:
        path = str(tmp_path / "growing")
        ds.distributed_save(Dataset.range(30_000).map(slow_identity), path, cluster.target)
        loaded = ds.load(path, wait=True)
        assert not os.path.exists(os.path.join(path, saves.DONE_FILE)), "read starts before the save ends"
        values = run_with_deadline(lambda: list(loaded), TIMEOUT_S)
        assert os.path.exists(os.path.join(path, saves.DONE_FILE))
        assert_exactly_once(values, 30_000)


def test_dataset_load_takes_wait_with_tf_datas_signature(tmp_path):
    # tf.data: Dataset.load(path, element_spec=None, compression=None, reader_func=None, wait=False).
    for load in (Dataset.load, ds.load):
        assert [(p.name, p.default) for p in inspect.signature(load).parameters.values()] == [
            ("path", inspect.Parameter.empty), ("element_spec", None), ("compression", None),
            ("reader_func", None), ("wait", False)]
    with TestCluster(num_workers=2) as cluster:
        path = str(tmp_path / "growing")
        ds.distributed_save(Dataset.range(30_000).map(slow_identity), path, cluster.target)
        with pytest.raises(FileNotFoundError, match="not done yet: pass wait=True"):
            Dataset.load(path)
        loaded = Dataset.load(path, None, None, None, True)  # positionally, as tf.data's
        assert not os.path.exists(os.path.join(path, saves.DONE_FILE)), "read starts before the save ends"
        assert_exactly_once(run_with_deadline(lambda: list(loaded), TIMEOUT_S), 30_000)
        assert os.path.exists(os.path.join(path, saves.DONE_FILE))
        # Once the save is done, wait=True reads it as a finished save.
        assert Dataset.load(path, wait=True).cardinality() == 30_000


def test_a_failing_pipeline_writes_error_with_its_reason(tmp_path):
    def fail_at_7(x):
        if x == 7:
            raise ValueError("element seven is cursed")
        return x

    with TestCluster(num_workers=2) as cluster:
        path = str(tmp_path / "failing")
        ds.distributed_save(Dataset.range(100).map(fail_at_7), path, cluster.target)
        with pytest.raises(errors.PipelineError, match="element seven is cursed"):
            run_with_deadline(lambda: list(ds.load(path, wait=True)), TIMEOUT_S)
        with open(os.path.join(path, saves.ERROR_FILE)) as f:
            assert "ValueError: element seven is cursed" in f.read()
        assert not os.path.exists(os.path.join(path, saves.DONE_FILE))
        with pytest.raises(errors.PipelineError, match="cursed"):
            ds.load(path)


def test_bad_arguments_raise_clear_errors(tmp_path):
    with TestCluster(num_workers=1) as cluster:
        with pytest.raises(TypeError, match="expects a Dataset"):
            ds.distributed_save([1, 2], str(tmp_path / "a"), cluster.target)
        with pytest.raises(ValueError, match="compression must be one of"):
            ds.distributed_save(Dataset.range(3), str(tmp_path / "a"), cluster.target, compression="BROTLI")
        with pytest.raises(ValueError, match="infinite"):
            ds.distributed_save(Dataset.range(3).repeat(), str(tmp_path / "a"), cluster.target)
        with pytest.raises(TypeError, match="path"):
            ds.distributed_save(Dataset.range(3), None, cluster.target)
        occupied = tmp_path / "occupied"
        occupied.mkdir()
        (occupied / "data.txt").write_text("mine")
        with pytest.raises(errors.AlreadyExistsError, match="not empty"):
            ds.distributed_save(Dataset.range(3), str(occupied), cluster.target)
        read_only = tmp_path / "read-only"
        read_only.mkdir()
        read_only.chmod(0o500)
        try:
            if not os.access(read_only, os.W_OK):  # root writes anywhere
                with pytest.raises(errors.InvalidRequestError, match="cannot write to"):
                    ds.distributed_save(Dataset.range(3), str(read_only / "s"), cluster.target)
        finally:
            read_only.chmod(0o700)
        with pytest.raises(FileNotFoundError, match="not done yet"):
            path = str(tmp_path / "slow")
            ds.distributed_save(Dataset.range(30_000).map(slow_identity), path, cluster.target)
            ds.load(path)


def test_a_fault_tolerant_dispatcher_restarted_mid_save_carries_on(tmp_path):
    work_dir = tmp_path / "journal"
    with TestCluster(num_workers=2, fault_tolerant_mode=True, work_dir=str(work_dir)) as cluster:
        path = str(tmp_path / "restarted")
        ds.distributed_save(Dataset.range(30_000).map(slow_identity), path, cluster.target)
        chunks = os.path.join(path, "chunks")
        wait_until(lambda: len(os.listdir(chunks)) >= 3, TIMEOUT_S, "a few chunks committed")
        assert not done(path)
        cluster.restart_dispatcher()
        wait_until(lambda: done(path), TIMEOUT_S, "DONE after the restart")
        assert os.path.exists(os.path.join(path, saves.DONE_FILE))
        assert_exactly_once(run_with_deadline(lambda: list(ds.load(path)), TIMEOUT_S), 30_000)


@pytest.mark.slow
def test_a_worker_killed_mid_save_leaves_every_element_exactly_once(tmp_path):
    with Processes(tmp_path) as procs:
        dispatcher = procs.dispatcher()
        workers = procs.workers(dispatcher.port, 2)
        wait_for_workers(dispatcher.port, [w.address for w in workers])
        path = str(tmp_path / "killed")
        n = 60_000
        ds.distributed_save(Dataset.range(n).map(slow_identity), path, dispatcher.target)
        chunks = os.path.join(path, "chunks")
        wait_until(lambda: len(os.listdir(chunks)) >= 4, TIMEOUT_S, "a few chunks committed")
        assert not done(path), "the save ended before the kill: make the pipeline slower"
        workers[0].proc.kill9()
        wait_until(lambda: done(path), TIMEOUT_S, "DONE after the kill")
        assert os.path.exists(os.path.join(path, saves.DONE_FILE)), open(os.path.join(path, saves.ERROR_FILE)).read()
        assert_exactly_once(run_with_deadline(lambda: list(ds.load(path)), TIMEOUT_S), n)


def test_load_with_wait_and_a_concurrent_reader_thread_each_see_every_element(tmp_path):
    with TestCluster(num_workers=2) as cluster:
        path = str(tmp_path / "two-readers")
        ds.distributed_save(Dataset.range(10_000).map(slow_identity), path, cluster.target)
        results: list = []
        thread = threading.Thread(target=lambda: results.append(list(ds.load(path, wait=True))), daemon=True)
        thread.start()
        mine = run_with_deadline(lambda: list(ds.load(path, wait=True)), TIMEOUT_S)
        thread.join(TIMEOUT_S)
        assert_exactly_once(mine, 10_000)
        assert_exactly_once(results[0], 10_000)


def test_save_status_cli_shows_progress_from_the_dispatcher_or_the_directory(tmp_path, capsys):
    import json

    from dataservice.cli import main

    with TestCluster(num_workers=2) as cluster:
        path = str(tmp_path / "status")
        ds.distributed_save(Dataset.range(20_000).map(slow_identity), path, cluster.target)
        assert run_with_deadline(lambda: main(["save-status", path, "--dispatcher", cluster.dispatcher_address,
                                               "--wait", "--json"]), TIMEOUT_S) == 0
        progress = json.loads(capsys.readouterr().out)
        num_groups = Dataset.range(20_000).split_groups().num_groups
        assert progress["state"] == "done"
        assert progress["groups_committed"] == progress["num_groups"] == num_groups
        assert progress["num_elements"] == 20_000
        assert main(["save-status", path]) == 0  # the directory alone
        out = capsys.readouterr().out
        assert f"chunks: {num_groups} of {num_groups} committed" in out
        assert "elements: 20,000" in out and ": done" in out
        failing = str(tmp_path / "failing")
        ds.distributed_save(Dataset.range(10).map(lambda x: 1 // int(x - x)), failing, cluster.target)
        assert run_with_deadline(lambda: main(["save-status", failing, "--wait"]), TIMEOUT_S) == 1
        assert "error: group 0 on worker" in capsys.readouterr().out
        assert main(["save-status", str(tmp_path / "nothing")]) == 2
        assert "no distributed save here" in capsys.readouterr().err
