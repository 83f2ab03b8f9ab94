"""The dispatcher's Prometheus metrics and ``/status.json``, read from its state when asked.

``DispatcherMetrics`` is a ``prometheus_client`` collector: nothing is counted per RPC or per
split on its behalf; each scrape takes the core's lock once, reads the state (the same figures as
``GetStatus``), the RPC latencies (``rpc_stats``), the journal's fsync histogram (fault-tolerant
mode) and the clients' reports and scaling signal (``client_stats``, ``recommended_workers``).

Metrics (all ``dataservice_*``; gauges unless said):

- ``dataservice_workers_alive``, ``dataservice_workers_registered``; per worker
  ``dataservice_worker_busy_fraction{worker}`` (its producers' busy time, from its heartbeats).
- ``dataservice_datasets``; ``dataservice_jobs{state=running|finished}``, counter
  ``dataservice_jobs_finished_total`` (pruned ones included); ``dataservice_iterations{state}``;
  ``dataservice_tasks{state=running|finished|revoked}``; ``dataservice_clients``.
- ``dataservice_splits_handed_out`` (distributed_epoch splits the iterations in the state have leased out,
  reassignments not counted again), ``dataservice_splits_left`` (of unfinished distributed_epoch
  iterations with a finite number of splits: splits not yet delivered whole).
- ``dataservice_rpc_calls_total{method}`` (counter) and ``dataservice_rpc_latency_seconds{method,quantile}``
  (0.5, 0.99 and 1 = max over the most recent ``rpc_stats.RECENT_CALLS`` calls of the method).
- ``dataservice_journal_fsync_seconds`` (histogram; fault-tolerant mode: each batch's write + fsync),
  ``dataservice_journal_records_total`` (counter), ``dataservice_journal_checkpoint_fork_seconds``
  (histogram: how long each checkpoint's fork held the lock), ``dataservice_journal_checkpoints_total``
  (counter: checkpoints written by a child and in place).
- ``dataservice_client_stall_fraction{client_id,job_id}``, ``dataservice_client_stall_seconds``,
  ``dataservice_client_elements``, ``dataservice_client_bytes`` (each client's latest report).
- ``dataservice_recommended_workers``: the scaling signal's worker count (``scaling.recommend``).
- ``dataservice_saves{state=running|finished|failed}``; per running save
  ``dataservice_save_groups{save_id,state=total|committed|leased}``.
- ``dataservice_gc_full_collections_total`` (counter) and ``dataservice_gc_full_collection_seconds``
  (histogram): the process's full garbage collections and how long each stopped it (``collector_pauses``).

Example::

    >>> registry = CollectorRegistry()
    >>> collector = DispatcherMetrics(core)
    >>> registry.register(collector)
    >>> collector.status()["counts"]["workers"]
    2
"""

from __future__ import annotations

import itertools
import time
from typing import Iterator

import dataservice
from dataservice.dispatcher.collector_pauses import FULL_COLLECTIONS
from dataservice.dispatcher.core import STATUS_ITEMS, DispatcherCore
from dataservice.dispatcher.state import IterationState
from dataservice.proto import state_pb2
from dataservice.service.processing_modes import MODE_NAMES
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["DispatcherMetrics"]

_MODE = MODE_NAMES  # every processing mode's name, static sharding's too


class DispatcherMetrics(Collector):
    """A collector over ``core``; ``status()`` is the dispatcher's ``/status.json``. See the module docstring."""

    def __init__(self, core: DispatcherCore):
        self._core = core
        self._started = time.monotonic()

    # --- reading the state --------------------------------------------------------------------------
    def _snapshot(self) -> dict:
        """Everything both /metrics and /status.json need, read under the core's lock in one go."""
        core = self._core
        with core._cond:  # the core's lock: one consistent state (as GetStatus reads it)
            s = core.state
            lost = {a for a in s.workers if core._worker_lost(a)}
            workers = []
            for w in itertools.islice(s.workers.values(), STATUS_ITEMS):
                running = sum(1 for t in w.tasks if not s.tasks[t].finished)
                load = core.load_reports.worker_load(w.address)
                seen = core._worker_seen_unix.get(w.address, 0.0)
                workers.append({"address": w.address, "data_address": w.data_address, "alive": w.address not in lost,
                                "last_heartbeat_unix": seen or None, "running_tasks": running,
                                "busy_fraction": load.busy_fraction if load.busy_fraction >= 0 else None,
                                "tags": list(w.tags), "host_id": w.host_id})
            tasks = {"running": 0, "finished": 0, "revoked": 0}
            for t in s.tasks.values():
                tasks["revoked" if t.revoked else "finished" if t.finished else "running"] += 1
            iterations = {state.value: 0 for state in IterationState}
            for it in s.iterations.values():
                iterations[it.state.value] += 1
            handed_out = left = 0
            running_jobs, finished_jobs = [], []
            for job in s.jobs.values():
                its = [s.iterations[i] for i in job.iterations.values()]
                num_splits = s.datasets[job.dataset_id].num_splits
                rows = []
                for it in its:
                    row = {"iteration_id": it.iteration_id, "repetition": it.repetition, "state": it.state.value,
                           "clients": len(it.clients), "tasks": len(it.tasks)}
                    if job.processing_mode == state_pb2.DISTRIBUTED_EPOCH:
                        handed_out += it.next_split
                        row.update(splits=num_splits if num_splits >= 0 else None, splits_handed_out=it.next_split,
                                   splits_leased=len(it.leases), splits_done=len(it.done))
                        if num_splits >= 0 and not it.finished:
                            row["splits_left"] = max(0, num_splits - len(it.done))
                            left += row["splits_left"]
                    rows.append(row)
                done = bool(its) and all(i.finished for i in its)
                (finished_jobs if done else running_jobs).append(
                    {"job_id": job.job_id, "name": job.name, "dataset_id": job.dataset_id,
                     "mode": _MODE.get(job.processing_mode, str(job.processing_mode)), "finished": done,
                     "iterations": rows[-STATUS_ITEMS:]})
            saves = []
            save_states = {"running": 0, "finished": 0, "failed": 0}
            for save in s.saves.values():
                save_states["failed" if save.error else "finished" if save.finished else "running"] += 1
                saves.append({"save_id": save.save_id, "path": save.path, "dataset_id": save.dataset_id,
                              "groups": save.num_groups, "committed": len(save.committed), "leased": len(save.leases),
                              "elements": sum(c[1] for c in save.committed.values()),
                              "bytes": sum(c[2] for c in save.committed.values()),
                              "state": "failed" if save.error else "finished" if save.finished else "running",
                              "error": save.error})
            counts = {"workers": len(s.workers), "workers_alive": len(s.workers) - len(lost),
                      "datasets": len(s.datasets), "jobs": len(s.jobs), "jobs_running": len(running_jobs),
                      "jobs_finished": len(finished_jobs) + s.jobs_pruned, "jobs_pruned": s.jobs_pruned,
                      "iterations": len(s.iterations), "tasks": len(s.tasks), "clients": len(s.clients),
                      "splits_handed_out": handed_out, "splits_left": left}
            clients = core._client_reports()
        # Outside the lock: sorting 10,000 readers' reports, and what takes the lock (or its own) again.
        clients.sort(key=lambda c: c.client_id)
        recommendation = core.recommended_workers()
        journal = getattr(core.store, "journal", None)  # fault-tolerant mode only (JournaledStore)
        return {"workers": workers, "tasks": tasks, "iterations": iterations, "counts": counts,
                "jobs": running_jobs[:STATUS_ITEMS] + finished_jobs[::-1][:max(0, STATUS_ITEMS - len(running_jobs))],
                "saves": saves[-STATUS_ITEMS:], "save_states": save_states, "clients": clients,
                "recommendation": recommendation, "rpc": core.rpc_stats.summary(), "journal": journal}

    # --- /status.json ---------------------------------------------------------------------------------
    def status(self) -> dict:
        """The dispatcher's ``/status.json``: counts, workers, jobs with their iterations and splits,
        clients with their stall, saves, RPC latency and the recommended worker count (lists capped at
        ``STATUS_ITEMS``: running jobs first, then the most recently finished)."""
        snap = self._snapshot()
        journal = snap["journal"]
        rec = snap["recommendation"]
        return {
            "server": "dispatcher", "version": dataservice.__version__, "incarnation": self._core.incarnation,
            "now_unix": time.time(), "uptime_s": time.monotonic() - self._started,
            "counts": snap["counts"], "tasks": snap["tasks"], "iterations": snap["iterations"],
            "workers": snap["workers"], "jobs": snap["jobs"],
            "clients": [{"client_id": c.client_id, "job_id": c.job_id, "job_name": c.job_name,
                         "iteration_id": c.iteration_id, "elements": c.elements, "bytes": c.bytes,
                         "stall_s": c.stall_s, "elapsed_s": c.elapsed_s, "stall_fraction": c.stall_fraction,
                         "recent_stall_fraction": c.recent_stall_fraction, "last_report_unix": c.last_report_unix}
                        for c in snap["clients"][:STATUS_ITEMS]],
            "recommended_workers": {"count": rec.count, "current": rec.current, "reason": rec.reason},
            "saves": snap["saves"],
            "rpc_latency": [{"method": m.method, "calls": m.calls, "p50_ms": m.p50_ms, "p99_ms": m.p99_ms,
                             "max_ms": m.max_ms} for m in snap["rpc"]],
            "journal": None if journal is None else {
                "fsyncs": journal.fsyncs, "records": journal.records_written,
                "fsync_mean_ms": _mean_ms(journal.fsync_latency.snapshot())},
            "gc": _full_collections(),
        }

    # --- /metrics ---------------------------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        counts = snap["counts"]
        info = GaugeMetricFamily("dataservice_dispatcher_info", "This dispatcher: its version and incarnation",
                                 labels=["version", "incarnation"])
        info.add_metric([dataservice.__version__, self._core.incarnation], 1)
        yield info
        yield GaugeMetricFamily("dataservice_workers_alive", "Workers that heartbeat within worker_timeout_ms",
                                value=counts["workers_alive"])
        yield GaugeMetricFamily("dataservice_workers_registered", "Workers in the dispatcher's state, lost included",
                                value=counts["workers"])
        busy = GaugeMetricFamily("dataservice_worker_busy_fraction",
                                 "A worker's producers' busy time over the recent window (its heartbeats)",
                                 labels=["worker"])
        for w in snap["workers"]:
            if w["busy_fraction"] is not None:
                busy.add_metric([w["address"]], w["busy_fraction"])
        yield busy
        yield GaugeMetricFamily("dataservice_datasets", "Registered datasets", value=counts["datasets"])
        jobs = GaugeMetricFamily("dataservice_jobs", "Jobs in the state, by state", labels=["state"])
        jobs.add_metric(["running"], counts["jobs_running"])
        jobs.add_metric(["finished"], counts["jobs"] - counts["jobs_running"])
        yield jobs
        yield CounterMetricFamily("dataservice_jobs_finished", "Jobs finished, those pruned from the state included",
                                  value=counts["jobs_finished"])
        iterations = GaugeMetricFamily("dataservice_iterations", "Iterations in the state, by state", labels=["state"])
        for state, n in snap["iterations"].items():
            iterations.add_metric([state], n)
        yield iterations
        tasks = GaugeMetricFamily("dataservice_tasks", "Tasks in the state, by state", labels=["state"])
        for state, n in snap["tasks"].items():
            tasks.add_metric([state], n)
        yield tasks
        yield GaugeMetricFamily("dataservice_clients", "Readers of iterations", value=counts["clients"])
        yield GaugeMetricFamily("dataservice_splits_handed_out",
                                "distributed_epoch splits leased to tasks, over the iterations in the state",
                                value=counts["splits_handed_out"])
        yield GaugeMetricFamily("dataservice_splits_left",
                                "Splits of unfinished distributed_epoch iterations not yet delivered whole",
                                value=counts["splits_left"])
        calls = CounterMetricFamily("dataservice_rpc_calls", "RPCs answered, by method", labels=["method"])
        latency = GaugeMetricFamily("dataservice_rpc_latency_seconds",
                                    "RPC latency quantiles over each method's most recent calls (1 = max)",
                                    labels=["method", "quantile"])
        for m in snap["rpc"]:
            calls.add_metric([m.method], m.calls)
            for q, ms in (("0.5", m.p50_ms), ("0.99", m.p99_ms), ("1", m.max_ms)):
                latency.add_metric([m.method, q], ms / 1000)
        yield calls
        yield latency
        journal = snap["journal"]
        if journal is not None:
            h = journal.fsync_latency.snapshot()
            fsync = HistogramMetricFamily("dataservice_journal_fsync_seconds",
                                          "Journal batches: write + fsync time (fault-tolerant mode)")
            fsync.add_metric([], [(_le(b), n) for b, n in h.buckets], sum_value=h.sum_s)
            yield fsync
            yield CounterMetricFamily("dataservice_journal_records", "State updates made durable in the journal",
                                      value=journal.records_written)
            h = journal.checkpoint_fork_latency.snapshot()
            fork = HistogramMetricFamily("dataservice_journal_checkpoint_fork_seconds",
                                         "Journal checkpoints: how long forking the child that writes each held "
                                         "the dispatcher's lock (fault-tolerant mode)")
            fork.add_metric([], [(_le(b), n) for b, n in h.buckets], sum_value=h.sum_s)
            yield fork
            yield CounterMetricFamily("dataservice_journal_checkpoints",
                                      "Journal checkpoints written by a forked child and renamed into place",
                                      value=journal.background_checkpoints)
        stall = GaugeMetricFamily("dataservice_client_stall_fraction",
                                  "Share of a reader's time its consumer waited for data (its latest report)",
                                  labels=["client_id", "job_id"])
        stall_s = GaugeMetricFamily("dataservice_client_stall_seconds", "Seconds a reader's consumer waited for data",
                                    labels=["client_id", "job_id"])
        elements = GaugeMetricFamily("dataservice_client_elements", "Elements a reader has returned",
                                     labels=["client_id", "job_id"])
        nbytes = GaugeMetricFamily("dataservice_client_bytes", "Bytes a reader has returned",
                                   labels=["client_id", "job_id"])
        for c in snap["clients"]:
            labels = [str(c.client_id), str(c.job_id)]
            stall.add_metric(labels, c.stall_fraction)
            stall_s.add_metric(labels, c.stall_s)
            elements.add_metric(labels, c.elements)
            nbytes.add_metric(labels, c.bytes)
        yield from (stall, stall_s, elements, nbytes)
        yield GaugeMetricFamily("dataservice_recommended_workers",
                                "Workers the cluster should have, from client stall and worker busy time",
                                value=snap["recommendation"].count)
        saves = GaugeMetricFamily("dataservice_saves", "distributed_save runs in the state, by state", labels=["state"])
        groups = GaugeMetricFamily("dataservice_save_groups", "Groups of a running distributed_save, by state",
                                   labels=["save_id", "state"])
        for save in snap["saves"]:
            if save["state"] == "running":
                for state in ("groups", "committed", "leased"):
                    groups.add_metric([str(save["save_id"]), "total" if state == "groups" else state], save[state])
        for state, n in snap["save_states"].items():
            saves.add_metric([state], n)
        yield saves
        yield groups
        full = FULL_COLLECTIONS.snapshot()
        yield CounterMetricFamily("dataservice_gc_full_collections",
                                  "Full garbage collections of the dispatcher's process", value=full.pauses.count)
        pauses = HistogramMetricFamily("dataservice_gc_full_collection_seconds",
                                       "How long each full garbage collection stopped the dispatcher's process")
        pauses.add_metric([], [(_le(b), n) for b, n in full.pauses.buckets], sum_value=full.pauses.sum_s)
        yield pauses


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def _full_collections() -> dict:
    full = FULL_COLLECTIONS.snapshot()
    return {"full_collections": full.pauses.count, "full_collection_s": round(full.pauses.sum_s, 6),
            "recent": [{"ended_unix": at, "ms": round(seconds * 1000, 3), "collected": collected}
                       for at, seconds, collected in full.recent]}


def _mean_ms(h) -> float | None:
    return h.sum_s / h.count * 1000 if h.count else None
