"""Thousands of finished jobs leave the dispatcher's state small: finished iterations keep only a
stub, jobs nobody can read any more leave, and only the most recent finished jobs stay listed."""

from __future__ import annotations

import json
import os

from dataservice import Dataset, distribute
from dataservice.cli import status_as_dict
from dataservice.dispatcher.journal import CHECKPOINT_FILE, JOURNAL_FILE
from dataservice.service.dispatcher_client import DispatcherClient
from tests.cluster import TestCluster, wait_until
from tests.elements import ints

KEPT = 5


def _read(target: str, mode: str, job_name: str = "", n: int = 20) -> list[int]:
    return sorted(ints(Dataset.range(n).apply(distribute(mode, target, job_name=job_name or None,
                                                         timeout_ms=20_000))))


def _run_jobs(cluster: TestCluster, count: int) -> None:
    for i in range(count):
        kind = i % 3
        if kind == 0:
            assert _read(cluster.target, "parallel_epochs") == sorted(list(range(20)) * len(cluster.workers))
        elif kind == 1:
            assert _read(cluster.target, "distributed_epoch", job_name=f"named-{i}") == list(range(20))
        else:  # a named job read again: its second read finds its finished repetition 0 ... and a new one
            dataset = Dataset.range(20).apply(distribute("distributed_epoch", cluster.target, job_name=f"again-{i}",
                                                         timeout_ms=20_000))
            assert sorted(ints(dataset)) == list(range(20))
            assert sorted(ints(dataset)) == list(range(20))  # repetition 1 of the same job


def _state_sizes(cluster: TestCluster) -> dict:
    core = cluster.dispatcher.core
    with core._cond:
        s = core.state
        return dict(jobs=len(s.jobs), iterations=len(s.iterations), tasks=len(s.tasks), clients=len(s.clients),
                    pruned=s.jobs_pruned)


def test_finished_jobs_leave_the_state_and_the_status_stays_small(tmp_path):
    with TestCluster(num_workers=2, finished_jobs_kept=KEPT, fault_tolerant_mode=True, work_dir=str(tmp_path),
                     client_timeout_ms=2_000) as cluster:
        _run_jobs(cluster, 60)
        # Readers release their clients as they finish; the last tasks leave with them.
        wait_until(lambda: _state_sizes(cluster)["tasks"] == 0 and _state_sizes(cluster)["clients"] == 0, 10,
                   "the finished jobs' tasks and clients to leave the state")
        sizes = _state_sizes(cluster)
        # Anonymous jobs leave at once; of the 40 named ones, the KEPT most recent stay as stubs.
        assert sizes["jobs"] == KEPT and sizes["iterations"] <= 2 * KEPT, sizes
        assert sizes["pruned"] == 60 - KEPT
        wait_until(lambda: not any(w.task_ids for w in cluster.workers), 10, "workers to drop their tasks")

        client = DispatcherClient(cluster.dispatcher_address)
        try:
            status = client.get_status()
        finally:
            client.close()
        assert (status.counts.jobs, status.counts.jobs_finished, status.counts.jobs_pruned) == (KEPT, 60, 60 - KEPT)
        assert {r.method for r in status.rpc_latency} >= {"GetOrCreateIteration", "WorkerHeartbeat", "GetSplit"}
        assert len(json.dumps(status_as_dict(status, cluster.target))) < 8_000

        # The journal's checkpoint holds what is left, not the history.
        restarted = cluster.restart_dispatcher()
        with restarted.core._cond:
            assert len(restarted.core.state.jobs) == KEPT and restarted.core.state.jobs_pruned == 60 - KEPT
        size = sum(os.path.getsize(tmp_path / f) for f in (CHECKPOINT_FILE, JOURNAL_FILE) if (tmp_path / f).exists())
        assert size < 2_000_000, size
        # A kept job's name still says its repetition finished; a pruned job's name starts a new job.
        assert _read(cluster.target, "distributed_epoch", job_name="named-58") == []
        assert _read(cluster.target, "distributed_epoch", job_name="named-1") == list(range(20))
