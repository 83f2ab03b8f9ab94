"""One dispatcher under a simulated fleet: ``python -m benchmarks.fleet --workers N --readers M --jobs J``.

Starts a real dispatcher process (``python -m dataservice dispatcher``), then N simulated workers and M
simulated readers that speak the real protocol over ``grpc.aio`` from a few simulator processes (one
asyncio loop each) and do no data work: the dispatcher is what is under test.

- A simulated worker heartbeats as ``worker/server.py`` does: a WorkerHeartbeat long poll waiting the
  default interval (``WorkerConfig.heartbeat_interval_ms``), the tasks it holds listed (or, with
  the default ``--task-lists delta``, only their changes since the last answered heartbeat, with a full
  list to resynchronise: ``WorkerHeartbeatRequest.tasks_delta``), the half-interval pause when
  answered early with nothing, the short settle pause after news. Each of its distributed_epoch tasks
  takes ``--split-interval-ms`` to produce a split, and asks for the next with GetSplit (``max_splits`` as
  the real worker's, ``--max-splits``: a large fleet's answer leases several, which then take as long each).
- A simulated reader joins one of J shared distributed_epoch jobs (GetOrCreateJob, GetOrCreateIteration),
  then sends ClientHeartbeat at the client's interval, reporting the splits delivered since its last one,
  each whole with its total, as ``client/reader.py`` does: the splits its job's simulated workers in the same
  process produced (so the dispatcher's leases are the splits in flight, as with real readers).
- Beside them, 2 real workers (``dataservice worker``) and one real reader (``distribute`` over
  ``range(20000)``, distributed_epoch): the read must deliver every element exactly once; its speed is
  compared with the same read on the dispatcher before the fleet starts.

Measured over ``--duration-s`` after ``--warmup-s``: the dispatcher's CPU (fraction of a core, from
/proc/<pid>/stat), RSS and peak RSS, per-method p50/p99 latency as the simulated clients see it, heartbeat
lateness (a worker heartbeat answered without news: answer time minus the wait it asked; a client
heartbeat: its latency), heartbeats later than their interval, CPU per answered call, journal fsyncs/s
(``--fault-tolerant``: the dispatcher's /status.json journal counter, read before the real read starts and
after the window, so that no status read lands in the window's first second), workers and readers lost, and
how many simulated workers heard of the real read's job before it ended, and when.
``--dispatcher-src DIR`` runs the dispatcher, the real workers and the real reader from another source
tree (an older commit), so the same simulator measures before and after. ``--table`` runs
N in {100, 500, 2000} x M in {1000, 10000} and fits how each cost grows in N and in M.

Example::

    $ python -m benchmarks.fleet --workers 100 --readers 100 --jobs 1 --dispatcher-src /tmp/fleet_before
    fleet: 100 workers, 100 readers, 1 jobs, 20 s after 10 s warm-up; task lists full (load 15.47 before, ...)
      dispatcher: 0.30 core, 0.60 ms CPU/call over 496 calls/s, RSS 74 MB (peak 75 MB)
      ClientHeartbeat           100.3/s  p50      4.8 ms  p99    141.1 ms  max    207.8 ms
      GetSplit                  197.2/s  p50      1.7 ms  p99    158.6 ms  max    206.5 ms
      WorkerHeartbeat           197.2/s  p50      4.9 ms  p99   1005.4 ms  max   1059.8 ms
      worker heartbeats late: p50 0.0 ms, p99 5.4 ms; 0 late > 100 ms, 0 > interval; 3539 answered early ...
      real read of 20000: idle 157312/s, beside the fleet 27829/s; exactly once: True
      simulator: 0.07, 0.07 core per process, 0.29 ms CPU/call, loop lag p99 24.9 ms
    $ python -m benchmarks.fleet --table --json /tmp/fleet.json            # 6 runs, about 5 minutes

A simulated call costs the simulator about 0.25 ms of CPU: on 2 cores it drives about 4,000 calls/s
beside the dispatcher, so the largest rows of the table (2,000 workers, 10,000 readers: ~20,000 calls/s at
the defaults) are beyond this machine; each report says when its simulators lagged (``SATURATED``).
``--pin`` gives the dispatcher a CPU of its own and the rest the other: its calls then queue behind its own
work only, as on a host of its own, while the simulators may still lag on theirs.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import operator
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

from benchmarks.cluster_processes import REPO, process_cpu_s

#: The table's sizes (issue 28).
TABLE_WORKERS = (100, 500, 2000)
TABLE_READERS = (1000, 10000)
#: The real read beside the fleet.
REAL_READ_ELEMENTS = 20_000
REAL_WORKERS = 2
#: The real workers' tags. The real read's job has a task on every worker, simulated ones included, which
#: never serve it: a reader trying 2,000 addresses that answer nothing read 400-500 elements/s beside the fleet,
#: a measure of the simulator. Tagged COLOCATED, the real workers are the only ones this host's reader reads
#: (``distribute(target_workers="AUTO")``), as on a fleet where each trainer reads the workers beside it; the
#: job still puts its task on every simulated worker, so the dispatcher's load is the same.
REAL_WORKER_TAGS = "COLOCATED"
#: Elements in a simulated split: a reader reports each split it was delivered whole, with this total.
SPLIT_ELEMENTS = 4096
#: The most splits a reader reports delivered in one heartbeat (the rest wait for its next).
MAX_SPLITS_PER_BEAT = 64
#: The longest interval a reader accepts from the dispatcher (client/reader.py's MAX_CLIENT_HEARTBEAT_INTERVAL_S).
MAX_CLIENT_INTERVAL_S = 15.0
#: A heartbeat later than this past its due time counts as late (the issue's target).
LATE_S = 0.100
#: A simulator loop lag worth naming in the report, per second of the window (a reader's answer waits that long unread).
SIM_LAG_NOTED_MS = 50.0
START_TIMEOUT_S = 120.0
#: The real read's process starts this long before the window, and waits for it once imported.
REAL_READ_LEAD_S = 5.0
#: The real workers and reader run at a lower priority than the simulators: the simulated fleet stands for
#: thousands of hosts of their own, and a simulator kept off its CPU by the real read leaves the dispatcher's
#: answers unread (its loop lagged 84-276 ms in the read's second), which would count against the dispatcher.
#: The real read gets the CPU the simulators leave. Each child has a session of its own, and where Linux
#: groups the scheduling by session (``sched_autogroup``) a process's nice value counts only inside its
#: session: the session's own (``/proc/<pid>/autogroup``) is lowered as well.
GUEST_NICE = 10
_LISTENING = r"dispatcher listening on grpc://[^:\s]+:(\d+)"
_HTTP = r"dispatcher serves /metrics.* on http://[^:\s]+:(\d+)/"


class FleetError(RuntimeError):
    """A process failed to start, missed a deadline, or the simulator could not run."""


# --------------------------------------------------------------------------------------------------
# Processes
class _Child:
    """A subprocess in a session of its own (so its whole group is killed), output in a log file."""

    def __init__(self, args: Sequence[str], env: dict, cwd: str, log_path: Path, name: str, guest: bool = False):
        """``guest``: at GUEST_NICE, below the simulators."""
        self.name, self.log_path, self.args = name, log_path, list(args)
        self._log = open(log_path, "wb")
        if guest and shutil.which("nice"):
            self.args = ["nice", "-n", str(GUEST_NICE), *self.args]
        self.popen = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                      env=env, cwd=cwd, start_new_session=True)
        if guest:
            try:  # the new session's scheduling group (it exists once Popen returns: setsid ran before exec)
                with open(f"/proc/{self.popen.pid}/autogroup", "w") as f:
                    f.write(str(GUEST_NICE))
            except OSError:
                pass  # no autogroups here (or not Linux): the process's nice value is what counts

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match:
        deadline = time.monotonic() + timeout_s
        while True:
            match = re.search(pattern, self.output(), re.M)
            if match:
                return match
            if self.popen.poll() is not None or time.monotonic() > deadline:
                state = "exited" if self.popen.poll() is not None else f"silent for {timeout_s:.0f} s"
                raise FleetError(f"{self.name} {state} before printing {pattern!r}: {' '.join(self.args)}\n"
                                 f"{self.output()[-3000:]}")
            time.sleep(0.05)

    def wait(self, timeout_s: float) -> int:
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise FleetError(f"{self.name} still running after {timeout_s:.0f} s:\n{self.output()[-3000:]}") from exc

    def stop(self, grace_s: float = 2.0) -> None:
        """SIGTERM to its process group, SIGKILL after ``grace_s``."""
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            if self.popen.poll() is not None:
                break
            try:
                os.killpg(self.popen.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                self.popen.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
        self._log.close()


def _env(src: str, token: Optional[str]) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = src
    env["PYTHONUNBUFFERED"] = "1"
    for name in ("DATASERVICE_SERVICE", "DATASERVICE_AUTH_TOKEN", "DATASERVICE_AUTH_TOKEN_FILE"):
        env.pop(name, None)
    if token:
        env["DATASERVICE_AUTH_TOKEN"] = token
    return env


def _proc_fields(pid: int) -> dict:
    """VmRSS, VmHWM (bytes) and write syscalls of ``pid``; missing ones absent."""
    out: dict = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("syscw:"):
                out["syscw"] = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return out


def _status_json(http_port: Optional[int]) -> Optional[dict]:
    if http_port is None:
        return None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/status.json", timeout=10) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


def _await_workers(http_port: Optional[int], count: int, timeout_s: float) -> None:
    """Until the dispatcher knows ``count`` workers: a read started before they register would wait on them."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = _status_json(http_port)
        known = ((status or {}).get("counts") or {}).get("workers", 0)
        if known >= count:
            return
        if time.monotonic() > deadline:
            raise FleetError(f"the dispatcher knows {known} workers after {timeout_s:.0f} s, expected {count}")
        time.sleep(0.05)


def _journal_fsyncs(status: Optional[dict]) -> Optional[int]:
    journal = (status or {}).get("journal")
    return journal.get("fsyncs") if isinstance(journal, dict) else None


# Run with the dispatcher's source tree on the path: the real client registering the simulated jobs'
# datasets, and the real reader (exactly-once check).
_HELPER = r"""
import json, sys, time
from dataservice import Dataset, distribute
from dataservice.client.distribute import register_dataset
mode, service = sys.argv[1], sys.argv[2]
if mode == "register":
    ids = [register_dataset(service, Dataset.range(10**9 + j)) for j in range(int(sys.argv[3]))]
    print("RESULT " + json.dumps(ids), flush=True)
else:
    n = int(sys.argv[3])
    dataset = Dataset.range(n).apply(distribute("distributed_epoch", service, timeout_ms=120_000))
    if len(sys.argv) > 4:  # started early: imported, it waits for its start time
        time.sleep(max(0.0, float(sys.argv[4]) - time.time()))
    started, started_unix = time.monotonic(), time.time()
    got = [int(x) for x in dataset]
    seconds = time.monotonic() - started
    print("RESULT " + json.dumps({"elements": len(got), "exactly_once": sorted(got) == list(range(n)),
                                  "started_unix": started_unix,
                                  "seconds": seconds, "elements_per_s": len(got) / seconds}), flush=True)
"""


def _run_helper(args: list, env: dict, src: str, log_dir: Path, name: str, timeout_s: float) -> Any:
    child = _Child([sys.executable, "-c", _HELPER, *map(str, args)], env, src, log_dir / f"{name}.log", name,
                   guest=True)
    try:
        child.wait(timeout_s)
        match = re.search(r"^RESULT (.*)$", child.output(), re.M)
        if child.popen.returncode != 0 or not match:
            raise FleetError(f"{name} failed (exit {child.popen.returncode}):\n{child.output()[-3000:]}")
        return json.loads(match.group(1))
    finally:
        child.stop()


# --------------------------------------------------------------------------------------------------
# The simulator (one process per shard, one asyncio loop)
class _Recorder:
    """Latencies per method of calls that started inside the measured window."""

    def __init__(self, window: tuple[float, float]):
        self.window = window
        self.latency: dict[str, list] = {}
        self.answered: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.worker_late: list = []       # no-news WorkerHeartbeat: answer time minus the wait asked
        # Heartbeats more than LATE_S late (workers) or slow (readers), by second of the window they were sent in:
        # whether the tail is spread out or comes in bursts (a job's tasks made on every worker at once).
        self.late_by_second: dict[str, dict[int, int]] = {"worker": {}, "client": {}}
        self.early_answers = 0            # no-news WorkerHeartbeat answered before its wait (no slot)
        self.worker_gaps: list = []       # time between two heartbeats of one worker reaching us
        self.client_gaps: list = []       # time between two heartbeats of one reader starting
        self.lost: dict[str, int] = {"readers": 0}  # readers told they are unknown (released as silent)
        self.rejoined = 0  # readers that released their read and joined again (--rejoin-per-s)
        # When simulated workers heard of a task of the real read's job, seconds from the window's start: how far
        # the dispatcher's paced fan-out got before the read ended (a worker not told by then is never told).
        self.new_job_heard: list = []
        # WorkerHeartbeats sent inside the window by kind (full list, delta), and answers asking a resync.
        self.task_lists: dict[str, int] = {"full": 0, "delta": 0, "resync_asked": 0}
        # Started before the window opened (registered / joined their job), and never started at all.
        self.ready: dict[str, int] = {"workers": 0, "readers": 0, "workers_late": 0, "readers_late": 0,
                                      "readers_failed": 0}

    def started(self, kind: str) -> None:
        self.ready[kind if time.monotonic() < self.window[0] else kind + "_late"] += 1

    def inside(self, started: float) -> bool:
        return self.window[0] <= started < self.window[1]

    def late_at(self, kind: str, started: float) -> None:
        second = int(started - self.window[0])
        self.late_by_second[kind][second] = self.late_by_second[kind].get(second, 0) + 1

    def call(self, method: str, started: float, ended: float) -> None:
        if self.inside(started):
            self.latency.setdefault(method, []).append(ended - started)
            if method == "ClientHeartbeat" and ended - started > LATE_S:
                self.late_at("client", started)
        if self.inside(ended):  # the dispatcher's CPU in the window went to the calls answered in it
            self.answered[method] = self.answered.get(method, 0) + 1

    def error(self, method: str, code: str) -> None:
        key = f"{method}:{code}"
        self.errors[key] = self.errors.get(key, 0) + 1


class _Sim:
    def __init__(self, spec: dict):
        import grpc
        from dataservice.proto import dispatcher_pb2, state_pb2
        self.grpc, self.pb, self.state_pb2 = grpc, dispatcher_pb2, state_pb2
        self.spec = spec
        t0 = spec["t0_unix"] - time.time() + time.monotonic()  # the parent's clock in ours
        self.t0 = t0
        self.window = (t0 + spec["warmup_s"], t0 + spec["warmup_s"] + spec["duration_s"])
        self.end = self.window[1] + 0.2
        self.rec = _Recorder(self.window)
        self.metadata = None
        if spec.get("token"):
            from dataservice.service.auth import ClusterAuth, credential_metadata
            self.metadata = tuple(credential_metadata(ClusterAuth(spec["token"])))
        self.channels: list = []
        self.stubs: list = []
        self.delta = spec["task_lists"] == "delta"
        # GetSplitRequest.max_splits, where the simulator's protocol (the tree under test) has it.
        has_field = "max_splits" in dispatcher_pb2.GetSplitRequest.DESCRIPTOR.fields_by_name
        self._max_splits = {"max_splits": spec.get("max_splits", 1)} if has_field else {}
        self.loop_lag: list = []
        # The worst lag of this loop in each second of the window: a burst of slow answers in a second when the
        # simulators' CPU was taken (the real read starts at 0 s, beside them) is the simulator's, not the
        # dispatcher's.
        self.lag_by_second: dict[int, float] = {}
        # Splits this process's workers leased, per job, not yet reported delivered by its readers: a split a
        # worker produced reaches a reader, which reports it (so the dispatcher's leases stay the splits in
        # flight, as with real readers; readers reporting splits no worker leased left every lease open).
        self.delivered: dict = collections.defaultdict(collections.deque)
        # The jobs this process has readers of (with fewer readers than processes, some have none: the splits of
        # such a job stay leased, as when nobody reads them).
        self.read_jobs = {r % len(spec["dataset_ids"]) for r in spec["reader_ids"]}

    async def _call(self, index: int, method: str, request, timeout: float):
        started = time.monotonic()
        try:
            response = await getattr(self.stubs[index % len(self.stubs)], method)(
                request, timeout=timeout, metadata=self.metadata)
        except self.grpc.aio.AioRpcError as exc:
            if self.rec.inside(started):
                # Calls still in flight when the run ends are cancelled by us (closing the channels).
                ours = exc.code() == self.grpc.StatusCode.CANCELLED and time.monotonic() >= self.end
                self.rec.error(method, "UNANSWERED_AT_END" if ours else exc.code().name)
            raise
        except asyncio.CancelledError:
            if self.rec.inside(started):  # still unanswered when the run ended
                self.rec.error(method, "UNANSWERED_AT_END")
            raise
        self.rec.call(method, started, time.monotonic())
        return response

    def _bounded(self, timeout_s: float) -> float:
        """A call's deadline: ``timeout_s``, but no later than shortly after the run ends."""
        return max(1.0, min(timeout_s, self.end + 5 - time.monotonic()))

    async def _sleep_until(self, when: float) -> None:
        await asyncio.sleep(max(0.0, when - time.monotonic()))

    # --- workers ---
    async def worker(self, i: int) -> None:
        pb = self.pb
        address = f"sim-w{i}:1"
        uid = uuid.uuid4().hex
        interval_ms = self.spec["worker_interval_ms"]
        tasks: dict[int, Any] = {}
        finished: set = set()
        splitters: dict[int, asyncio.Task] = {}
        wait_ms = 0
        incarnation = ""
        seq = answered_seq = 0
        reported: set = set()
        need_full = True
        last_answer = None
        backoff = 0.1
        await self._sleep_until(self.t0 + random.uniform(0, self.spec["ramp_s"]))
        while time.monotonic() < self.end:
            current = sorted(tasks)
            seq += 1
            request = pb.WorkerHeartbeatRequest(worker_address=address, worker_uid=uid, wait_ms=wait_ms,
                                                finished_tasks=sorted(finished), data_address=address,
                                                load=pb.WorkerLoadReport(interval_us=interval_ms * 1000))
            if self.delta:
                request.heartbeat_seq = seq
                if need_full:
                    request.current_tasks.extend(current)
                else:
                    request.tasks_delta = True
                    request.base_seq = answered_seq
                    now = set(current)
                    request.added_tasks.extend(sorted(now - reported))
                    request.removed_tasks.extend(sorted(reported - now))
            else:
                request.current_tasks.extend(current)
            sent = time.monotonic()
            if self.rec.inside(sent):
                self.rec.task_lists["delta" if getattr(request, "tasks_delta", False) else "full"] += 1
            try:
                response = await self._call(i, "WorkerHeartbeat", request,
                                            timeout=self._bounded(interval_ms / 1000 + 30))
            except self.grpc.aio.AioRpcError:
                need_full = True
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.1
            answered = time.monotonic()
            if last_answer is None:
                self.rec.started("workers")
            if last_answer is not None and self.rec.inside(sent):
                self.rec.worker_gaps.append(sent - last_answer)
            last_answer = answered
            answered_seq, reported, need_full = seq, set(current), False
            if self.delta and response.resync_tasks:
                need_full = True
                if self.rec.inside(sent):
                    self.rec.task_lists["resync_asked"] += 1
            if response.dispatcher_incarnation != incarnation:
                if incarnation:
                    need_full = True
                incarnation = response.dispatcher_incarnation
            for task in response.new_tasks:
                if task.task_id not in tasks:
                    tasks[task.task_id] = task
                    if task.dataset_id not in self.spec["dataset_ids"] and self.rec.inside(answered):
                        self.rec.new_job_heard.append(answered - self.rec.window[0])
                    # The fleet's own jobs only: a split of the real read leased here would never be served.
                    if task.processing_mode == self.state_pb2.DISTRIBUTED_EPOCH \
                            and task.dataset_id in self.spec["dataset_ids"]:
                        splitters[task.task_id] = asyncio.ensure_future(self.split_loop(i, task, tasks, finished))
            for task_id in response.tasks_to_delete:
                tasks.pop(task_id, None)
                finished.discard(task_id)
                splitter = splitters.pop(task_id, None)
                if splitter is not None:
                    splitter.cancel()
            news = bool(response.new_tasks or response.tasks_to_delete)
            asked = wait_ms / 1000
            wait_ms = interval_ms
            if news:
                await asyncio.sleep(0.02)
            else:
                if asked > 0 and self.rec.inside(sent):
                    # What the dispatcher meant to wait: the asked wait, or longer for a large fleet.
                    late = (answered - sent) - max(asked, getattr(response, "poll_wait_ms", 0) / 1000)
                    if late < -0.05:
                        self.rec.early_answers += 1
                    self.rec.worker_late.append(max(0.0, late))
                    if late > LATE_S:
                        self.rec.late_at("worker", sent)
                await asyncio.sleep(max(0.0, asked / 2 - (answered - sent)))
        for splitter in splitters.values():
            splitter.cancel()

    async def split_loop(self, i: int, task, tasks: dict, finished: set) -> None:
        period = self.spec["split_interval_s"]
        request_id = 0
        backoff = 0.1
        await asyncio.sleep(random.uniform(0, period))
        while time.monotonic() < self.end and task.task_id in tasks:
            request_id += 1
            try:
                response = await self._call(i, "GetSplit", self.pb.GetSplitRequest(
                    iteration_id=task.iteration_id, task_id=task.task_id, request_id=request_id,
                    **self._max_splits), timeout=30)
            except self.grpc.aio.AioRpcError as exc:
                if exc.code() in (self.grpc.StatusCode.NOT_FOUND, self.grpc.StatusCode.CANCELLED):
                    return  # the task is gone, or we cancelled the call (task deleted)
                request_id -= 1  # a retry repeats the request id
                # Backs off as the real client's call_with_retry does: a retry storm would be the simulator's load.
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.1
            if response.end_of_splits:
                finished.add(task.task_id)
                return
            if not response.wait:
                more = list(getattr(response, "more_splits", ()))  # an older dispatcher leases one
                leased = 1 + len(more)
                await asyncio.sleep(leased * period * random.uniform(0.8, 1.2))
                # Produced: its readers get them now (and report them at their next heartbeat).
                job = self.spec["dataset_ids"].index(task.dataset_id)
                if job in self.read_jobs:
                    self.delivered[job].extend([response.split_index] + [m.split_index for m in more])

    # --- readers ---
    async def _join(self, r: int, job: int):
        """GetOrCreateJob + GetOrCreateIteration, as ``distribute`` starts a read: the iteration's answer."""
        pb, spb = self.pb, self.state_pb2
        job_id = (await self._call(r, "GetOrCreateJob", pb.GetOrCreateJobRequest(
            dataset_id=self.spec["dataset_ids"][job], processing_mode=spb.DISTRIBUTED_EPOCH,
            job_name=f"fleet-{job}"), timeout=self._bounded(60))).job_id
        return await self._call(r, "GetOrCreateIteration", pb.GetOrCreateIterationRequest(
            job_id=job_id, request_token=os.urandom(16)), timeout=self._bounded(60))

    async def _rejoin(self, r: int, job: int, it):
        """A trainer that restarts: its read released (ReleaseIterationClient), then joined again. The
        old read's unreported splits are dropped: the dispatcher gives them to the job's other readers."""
        pb = self.pb
        try:
            await self._call(r, "ReleaseIterationClient", pb.ReleaseIterationClientRequest(
                client_id=it.client_id, read_key=it.read_key), timeout=self._bounded(60))
            fresh = await self._join(r, job)
        except self.grpc.aio.AioRpcError as exc:
            self.rec.error("reader rejoin", exc.code().name)
            return it
        self.rec.rejoined += 1
        return fresh

    async def reader(self, r: int) -> None:
        pb, spb = self.pb, self.state_pb2
        job = r % len(self.spec["dataset_ids"])
        await self._sleep_until(self.t0 + random.uniform(0, self.spec["ramp_s"]))
        try:
            it = await self._join(r, job)
        except self.grpc.aio.AioRpcError as exc:
            self.rec.ready["readers_failed"] += 1
            self.rec.error("reader start", exc.code().name)
            return
        self.rec.started("readers")
        # Each reader restarts with the same chance per second, so that the fleet's readers restart
        # ``--rejoin-per-s`` times a second in all, in the measured window.
        rejoin_per_reader_s = self.spec.get("rejoin_per_s", 0.0) / max(1, self.spec["readers"])
        interval = self.spec["client_interval_s"]
        # As client/reader.py does: the version of the task list it has (the dispatcher then leaves an
        # unchanged list out), and the interval the dispatcher asks for (stretched for a large fleet).
        known_version = 0
        versioned = "known_tasks_version" in pb.ClientHeartbeatRequest.DESCRIPTOR.fields_by_name
        elements = 0
        first = time.monotonic()
        last_start = None
        delivered = self.delivered[job]
        while time.monotonic() < self.end:
            # As client/reader.py reports: the splits delivered since the last heartbeat, each whole, with its
            # total (the split's end). The job's readers in this process share what its workers produced.
            splits = [delivered.popleft() for _ in range(min(MAX_SPLITS_PER_BEAT, len(delivered)))]
            elements += SPLIT_ELEMENTS * len(splits)
            request = pb.ClientHeartbeatRequest(
                client_id=it.client_id, read_key=it.read_key,
                progress=[spb.SplitProgress(stream_id=0, split_index=split, ranges=[0, SPLIT_ELEMENTS],
                                            total=SPLIT_ELEMENTS) for split in splits],
                stats=pb.ReaderStatsReport(elements=elements, bytes=elements * 8, stall_us=0,
                                           elapsed_us=int((time.monotonic() - first) * 1e6)))
            if versioned:
                request.known_tasks_version = known_version
            started = time.monotonic()
            if last_start is not None and self.rec.inside(started):
                self.rec.client_gaps.append(started - last_start)
            last_start = started
            try:
                response = await self._call(r, "ClientHeartbeat", request, timeout=self._bounded(60))
            except self.grpc.aio.AioRpcError as exc:
                if exc.code() == self.grpc.StatusCode.NOT_FOUND:
                    if self.rec.inside(started):
                        self.rec.lost["readers"] += 1
                    return
                delivered.extendleft(reversed(splits))  # not reported: the next heartbeat reports them
                await asyncio.sleep(interval)
                continue
            if versioned and not response.tasks_unchanged:
                known_version = response.tasks_version
            steady = min(MAX_CLIENT_INTERVAL_S, (response.heartbeat_interval_ms or 1000) / 1000)
            await self._sleep_until(started + steady)
            if rejoin_per_reader_s and self.rec.inside(time.monotonic()) and \
                    random.random() < rejoin_per_reader_s * steady:
                it = await self._rejoin(r, job, it)
                known_version = 0

    async def status_poller(self) -> None:
        """GetStatus once a second, as a dashboard or ``dataservice status`` would: its latency under the fleet."""
        while time.monotonic() < self.end:
            try:
                await self._call(0, "GetStatus", self.pb.GetStatusRequest(max_items=100), timeout=self._bounded(30))
            except self.grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(1.0)

    async def lag_probe(self) -> None:
        """How late this loop wakes: a busy simulator would make the dispatcher look slow."""
        while time.monotonic() < self.end:
            before = time.monotonic()
            await asyncio.sleep(0.05)
            if self.rec.inside(before):
                lag = time.monotonic() - before - 0.05
                self.loop_lag.append(lag)
                second = int(before - self.rec.window[0])
                self.lag_by_second[second] = max(lag, self.lag_by_second.get(second, 0.0))

    async def run(self) -> dict:
        cpu0 = time.process_time()
        from dataservice.proto import dispatcher_pb2_grpc
        # Channels belong to the loop that makes them; several connections spread the calls.
        options = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", 64 << 20)]
        self.channels = [self.grpc.aio.insecure_channel(self.spec["address"], options=options + [("fleet.channel", i)])
                         for i in range(self.spec["channels"])]
        self.stubs = [dispatcher_pb2_grpc.DispatcherStub(c) for c in self.channels]
        jobs = [self.worker(i) for i in self.spec["worker_ids"]] + [self.reader(r) for r in self.spec["reader_ids"]]
        jobs.append(self.lag_probe())
        if self.spec["status_poller"]:
            jobs.append(self.status_poller())
        cpu_window: list = []

        async def cpu_sampler():
            await self._sleep_until(self.window[0])
            cpu_window.append(time.process_time())
            await self._sleep_until(self.window[1])
            cpu_window.append(time.process_time())

        jobs.append(cpu_sampler())
        try:
            await asyncio.wait_for(asyncio.gather(*jobs), timeout=self.end - time.monotonic() + 10)
        except asyncio.TimeoutError:
            pass  # calls still in flight after the end are cancelled: every run is bounded
        for channel in self.channels:
            await channel.close()
        r = self.rec
        return {"latency": r.latency, "answered": r.answered, "errors": r.errors, "worker_late": r.worker_late,
                "late_by_second": r.late_by_second, "early_answers": r.early_answers, "worker_gaps": r.worker_gaps,
                "client_gaps": r.client_gaps,
                "lost": r.lost, "ready": r.ready, "task_lists": r.task_lists, "loop_lag": self.loop_lag,
                "lag_by_second": self.lag_by_second, "rejoined": r.rejoined, "new_job_heard": r.new_job_heard,
                "cpu_s": (cpu_window[1] - cpu_window[0]) if len(cpu_window) == 2 else None,
                "cpu_total_s": time.process_time() - cpu0}


def _sim_main(spec_path: str, out_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    random.seed(spec["seed"])
    from dataservice.dispatcher.collector_pauses import FULL_COLLECTIONS, reduce_full_collections
    # A simulator holds thousands of workers' and readers' state, as the dispatcher does: with the default
    # thresholds a full collection came every few seconds and held its loop 50-100 ms, and every answer that
    # came meanwhile looked that much slower. The dispatcher's own setting, and its pauses reported.
    reduce_full_collections()
    FULL_COLLECTIONS.install()
    result = asyncio.run(_Sim(spec).run())
    start, end = spec["t0_unix"] + spec["warmup_s"], spec["t0_unix"] + spec["warmup_s"] + spec["duration_s"]
    result["full_collections_ms"] = [1000 * seconds for ended, seconds, _ in FULL_COLLECTIONS.snapshot().recent
                                     if start <= ended <= end]
    Path(out_path).write_text(json.dumps(result))
    return 0


# --------------------------------------------------------------------------------------------------
# One measurement
def _pct(values: list, q: float) -> Optional[float]:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _delta_supported() -> bool:
    from dataservice.proto import dispatcher_pb2
    fields = dispatcher_pb2.WorkerHeartbeatRequest.DESCRIPTOR.fields_by_name
    return all(f in fields for f in ("tasks_delta", "heartbeat_seq", "base_seq", "added_tasks", "removed_tasks")) \
        and "resync_tasks" in dispatcher_pb2.WorkerHeartbeatResponse.DESCRIPTOR.fields_by_name


def _defaults() -> tuple[int, float]:
    """The product's default intervals: a worker's heartbeat (ms) and a reader's (s)."""
    from dataservice.client.reader import CLIENT_HEARTBEAT_INTERVAL_S
    from dataservice.service.config import WorkerConfig
    return WorkerConfig(dispatcher_address="localhost:1").heartbeat_interval_ms, CLIENT_HEARTBEAT_INTERVAL_S


def run_once(args: argparse.Namespace, workers: int, readers: int, log=print) -> dict:
    """Starts a dispatcher, the real workers and the fleet; measures; kills them all. Returns the report."""
    if args.task_lists == "delta" and not _delta_supported():
        raise FleetError("--task-lists delta: this tree's dispatcher_pb2 has no WorkerHeartbeat delta fields "
                         "(tasks_delta, heartbeat_seq, base_seq, added_tasks, removed_tasks, resync_tasks); "
                         "compile protos/dataservice/proto/dispatcher.proto with them first, or use --task-lists full")
    worker_interval_ms, client_interval_s = _defaults()
    warmup_s = args.warmup_s if args.warmup_s is not None else 10.0 + readers / 1000
    src = str(Path(args.dispatcher_src).resolve()) if args.dispatcher_src else str(REPO)
    token = uuid.uuid4().hex + uuid.uuid4().hex if args.token else None
    env = _env(src, token)
    work = Path(tempfile.mkdtemp(prefix="fleet-"))
    children: list[_Child] = []
    report: dict = {"workers": workers, "readers": readers, "jobs": args.jobs, "duration_s": args.duration_s,
                    "warmup_s": warmup_s, "fault_tolerant": args.fault_tolerant, "token": args.token,
                    "task_lists": args.task_lists, "dispatcher_src": src, "sim_procs": args.sim_procs,
                    "split_interval_ms": args.split_interval_ms, "worker_interval_ms": worker_interval_ms,
                    "client_interval_s": client_interval_s, "load_before": os.getloadavg()[0]}
    try:
        command = [sys.executable, "-m", "dataservice", "dispatcher", "--port", "0", "--http-port", "0",
                   "--log-level", "WARNING"]
        if args.fault_tolerant:
            command += ["--fault-tolerant", "--work-dir", str(work / "journal")]
        if args.worker_timeout_ms is not None:
            command += ["--worker-timeout-ms", str(args.worker_timeout_ms)]
        dispatcher = _Child(command, env, src, work / "dispatcher.log", "dispatcher")
        children.append(dispatcher)
        port = int(dispatcher.wait_for(_LISTENING, START_TIMEOUT_S).group(1))
        if args.pin:
            report["pinned"] = pin_apart(dispatcher.pid)
        http = dispatcher.wait_for(_HTTP, 10).group(1) if re.search(r"http://", dispatcher.output()) else None
        http_port = int(http) if http else None
        service = f"grpc://localhost:{port}"
        for w in range(REAL_WORKERS):
            # COLOCATED: the real reader, on this host, reads these two only (target_workers AUTO), not the
            # simulated workers, which have a task of its job each but serve nothing (see REAL_WORKER_TAGS).
            child = _Child([sys.executable, "-m", "dataservice", "worker", "--dispatcher", f"localhost:{port}",
                            "--port", "0", "--log-level", "WARNING", "--worker-tags", REAL_WORKER_TAGS],
                           env, src, work / f"worker{w}.log", f"worker{w}", guest=True)
            children.append(child)
        worker_addresses = [child.wait_for(r"worker listening on (\S+)", START_TIMEOUT_S).group(1)
                            for child in children[1:]]
        _await_workers(http_port, REAL_WORKERS, START_TIMEOUT_S)
        idle = _run_helper(["read", service, REAL_READ_ELEMENTS], env, src, work, "idle-read", 300)
        log(f"  idle read: {idle['elements']} elements, {idle['elements_per_s']:.0f}/s, "
            f"exactly once: {idle['exactly_once']}")
        dataset_ids = _run_helper(["register", service, args.jobs], env, src, work, "register", 120)

        # The fleet: readers spread over the jobs, workers and readers over the simulator processes.
        t0 = time.time() + 3.0  # the simulators' imports
        sims = []
        for s in range(args.sim_procs):
            spec = {"address": f"localhost:{port}", "token": token, "t0_unix": t0, "warmup_s": warmup_s,
                    "duration_s": args.duration_s, "ramp_s": min(warmup_s * 0.6, 5.0),
                    "worker_ids": list(range(s, workers, args.sim_procs)),
                    "reader_ids": list(range(s, readers, args.sim_procs)), "dataset_ids": dataset_ids,
                    "worker_interval_ms": worker_interval_ms,
                    "client_interval_s": client_interval_s, "split_interval_s": args.split_interval_ms / 1000,
                    "max_splits": args.max_splits,
                    "task_lists": args.task_lists, "channels": args.channels, "seed": args.seed * 1000 + s,
                    "status_poller": s == 0, "readers": readers, "rejoin_per_s": args.rejoin_per_s}
            spec_path, out_path = work / f"sim{s}.json", work / f"sim{s}.out.json"
            spec_path.write_text(json.dumps(spec))
            child = _Child([sys.executable, "-m", "benchmarks.fleet", "--_sim", str(spec_path), str(out_path)],
                           _env(str(REPO), None), str(REPO), work / f"sim{s}.log", f"simulator {s}")
            children.append(child)
            sims.append((child, out_path))

        window_start = report["window_start_unix"] = t0 + warmup_s
        # The real read, beside the fleet, inside the window (on a thread: the window ends on time). Its process
        # starts before the window and waits for it: its imports (0.6 s of CPU) would otherwise take the
        # simulators' CPU in the window's first second, and their answers would wait unread.
        loaded: dict = {}

        def real_read() -> None:
            try:
                loaded.update(_run_helper(["read", service, REAL_READ_ELEMENTS, window_start], env, src, work,
                                          "loaded-read", max(120.0, args.duration_s + 60)))
            except FleetError as exc:
                loaded["error"] = str(exc)

        reader = threading.Thread(target=real_read, name="fleet-real-read", daemon=True)
        time.sleep(max(0.0, window_start - REAL_READ_LEAD_S - time.time()))
        # The journal's counter is read now, not at the window's start: a /status.json walks every worker, task
        # and reader (at 2,000 x 10,000: 6-13 ms in-process on an idle machine; GetStatus, much the same work,
        # takes 25-36 ms beside the fleet), on the dispatcher's GIL, in the same tenth of a second as the real
        # read's new job (60 ms). It came in fault-tolerant runs only.
        fsyncs0 = _journal_fsyncs(_status_json(http_port)) if args.fault_tolerant else None
        fsyncs_since = time.monotonic()
        reader.start()
        time.sleep(max(0.0, window_start - time.time()))
        cpu0, io0 = process_cpu_s(dispatcher.pid, children=True), _proc_fields(dispatcher.pid)
        measured0 = time.monotonic()
        cpu_by_second: list = []
        sampler = threading.Thread(target=_sample_cpu, args=(dispatcher.pid, window_start, args.duration_s,
                                                             cpu_by_second), name="fleet-cpu", daemon=True)
        sampler.start()
        detection: dict = {}
        if args.kill_worker:
            # Failure detection under the fleet: a real worker is killed (-9) early in the window; how long until
            # the dispatcher revokes its tasks for want of a heartbeat (worker_timeout_ms: 10 s by default)?
            time.sleep(max(0.0, window_start + min(2.0, args.duration_s / 4) - time.time()))
            victim, address = children[REAL_WORKERS], worker_addresses[-1]  # the last real worker
            killed = time.monotonic()
            report["kill_at_s"] = time.time() - window_start
            os.killpg(victim.popen.pid, signal.SIGKILL)
            pattern = re.compile(rf"revoked task \d+ on worker {re.escape(address)} \(no heartbeat")
            deadline = window_start + args.duration_s
            while time.time() < deadline and "seconds" not in detection:
                if pattern.search(dispatcher.output()):
                    detection["seconds"] = time.monotonic() - killed
                else:
                    time.sleep(0.05)
        time.sleep(max(0.0, window_start + args.duration_s - time.time()))
        cpu1, io1 = process_cpu_s(dispatcher.pid, children=True), _proc_fields(dispatcher.pid)
        seconds = time.monotonic() - measured0
        sampler.join(5.0)
        status = _status_json(http_port)
        fsyncs1 = _journal_fsyncs(status) if args.fault_tolerant else None
        fsync_seconds = time.monotonic() - fsyncs_since
        dispatcher_log = dispatcher.output()  # before the fleet stops: its end is no loss
        reader.join(max(120.0, args.duration_s + 60) + 15)
        if "error" in loaded or not loaded:
            # A finding, not a benchmark failure: the dispatcher under this fleet broke a real read.
            error = loaded.get("error", "no answer")
            loaded = {"error": error[-1500:], "elements": 0, "exactly_once": False, "seconds": None,
                      "elements_per_s": 0.0}
            log(f"  the real read beside the fleet FAILED: {error.strip().splitlines()[-1]}")
        else:
            loaded["within_window"] = loaded["seconds"] <= args.duration_s
        for child, _ in sims:
            child.wait(args.duration_s + 120)
        shards = []
        for child, out_path in sims:
            if child.popen.returncode != 0 or not out_path.exists():
                raise FleetError(f"{child.name} failed (exit {child.popen.returncode}):\n{child.output()[-3000:]}")
            shards.append(json.loads(out_path.read_text()))
        report.update(_summarize(shards, seconds, cpu0, cpu1, io0, io1, (fsyncs0, fsyncs1, fsync_seconds), status,
                                 dispatcher_log, client_interval_s, worker_interval_ms))
        report["real_read"] = {"idle": idle, "loaded": loaded}
        report["cpu_by_second"] = cpu_by_second
        report["full_collections"] = _full_collections(status, window_start, window_start + args.duration_s)
        report["kill_worker"] = args.kill_worker
        report["failure_detection_s"] = detection.get("seconds")
        report["load_after"] = os.getloadavg()[0]
        return report
    finally:
        for child in reversed(children):
            child.stop()
        report["pids"] = [child.pid for child in children]
        if not args.keep_logs:
            import shutil
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"  logs kept in {work}")


def _full_collections(status: Optional[dict], start_unix: float, end_unix: float) -> Optional[dict]:
    """The dispatcher's full garbage collections: how many since it started, and those that ended inside the
    window as ``[second of the window, pause ms]`` (its /status.json keeps the latest 16); None from a
    dispatcher that does not time them."""
    gc = (status or {}).get("gc")
    if not isinstance(gc, dict):
        return None
    return {"since_start": gc.get("full_collections", 0),
            "in_window": [[round(c["ended_unix"] - start_unix, 1), c["ms"]] for c in gc.get("recent", [])
                          if start_unix <= c["ended_unix"] <= end_unix]}


def _sample_cpu(pid: int, window_start: float, duration_s: float, out: list) -> None:
    """The dispatcher's CPU in each whole second of the window, a fraction of a core (its checkpoint writers
    counted in the second they were reaped): a burst, e.g. a new job's fan-out, shows as the seconds it fills."""
    previous = None
    for second in range(int(duration_s) + 1):
        time.sleep(max(0.0, window_start + second - time.time()))
        now = process_cpu_s(pid, children=True)
        if now is None:
            return
        if previous is not None:
            out.append(round(now - previous, 3))
        previous = now


def _declared_lost(dispatcher_log: str) -> tuple[int, int]:
    """Simulated workers the dispatcher declared lost (it revoked a task of theirs for want of a heartbeat)
    and clients it released as silent, from its warnings."""
    workers = set(re.findall(r"revoked task \d+ on worker (sim-w\d+:1) \(no heartbeat", dispatcher_log))
    clients = set(re.findall(r"client (\d+) silent for \d+ ms", dispatcher_log))
    return len(workers), len(clients)


def _per_second(tables: Iterable[dict], combine: Callable) -> dict[int, Any]:
    """The shards' tables by second of the window (JSON keys: strings) merged into one, each second's values
    put together with ``combine``."""
    out: dict[int, Any] = {}
    for table in tables:
        for second, value in table.items():
            second = int(second)
            out[second] = combine(out[second], value) if second in out else value
    return dict(sorted(out.items()))


def _lag_by_second(shards: list) -> dict[int, float]:
    """The simulators' worst loop lag in each second of the window (ms), over the shards."""
    worst = _per_second((shard.get("lag_by_second", {}) for shard in shards), max)
    return {second: 1000 * lag for second, lag in worst.items()}


def _by_second(shards: list, kind: str) -> dict[int, int]:
    """Heartbeats of ``kind`` late by over LATE_S, per second of the window, summed over the shards."""
    return _per_second((shard.get("late_by_second", {}).get(kind, {}) for shard in shards), operator.add)


def _new_job_heard(shards: list) -> dict:
    """How many simulated workers heard of the real read's job in the window, and when half of them and
    the last one had (seconds after the window's start; the job is made at about 0.1 s)."""
    heard = sorted(t for s in shards for t in s.get("new_job_heard", ()))
    return {"workers": len(heard), "half_s": _pct(heard, 0.5), "last_s": heard[-1] if heard else None}


def _summarize(shards: list, seconds: float, cpu0, cpu1, io0: dict, io1: dict, fsyncs: tuple, status,
               dispatcher_log: str, client_interval_s: float, worker_interval_ms: int) -> dict:
    """The report of one run. ``fsyncs``: the journal's fsync counter at two reads and the seconds between
    them (read outside the window: ``run_once``), or Nones."""
    fsyncs0, fsyncs1, fsync_seconds = fsyncs
    latency: dict = {}
    errors: dict = {}
    for shard in shards:
        for method, values in shard["latency"].items():
            latency.setdefault(method, []).extend(values)
        for key, count in shard["errors"].items():
            errors[key] = errors.get(key, 0) + count
    merged = {k: [v for s in shards for v in s[k]] for k in ("worker_late", "worker_gaps", "client_gaps", "loop_lag")}
    answered: dict = {}
    for shard in shards:
        for method, count in shard["answered"].items():
            answered[method] = answered.get(method, 0) + count
    calls = sum(answered.values())
    cpu = (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None
    client_lat = latency.get("ClientHeartbeat", [])
    counts = (status or {}).get("counts") or {}
    lost_workers, lost_clients = _declared_lost(dispatcher_log)
    out = {
        "measured_s": seconds,
        "dispatcher": {
            "cpu_core": cpu / seconds if cpu is not None else None,
            "cpu_ms_per_call": 1000 * cpu / calls if cpu is not None and calls else None,
            "rss_mb": io1.get("VmRSS", 0) / 1e6, "peak_rss_mb": io1.get("VmHWM", 0) / 1e6,
            "write_syscalls_per_s": (io1["syscw"] - io0["syscw"]) / seconds if "syscw" in io0 and "syscw" in io1
            else None,
            "journal_fsyncs_per_s": (fsyncs1 - fsyncs0) / fsync_seconds
            if fsyncs0 is not None and fsyncs1 is not None and fsync_seconds else None,
        },
        "calls_per_s": calls / seconds,  # answered in the window
        "methods": {m: {"calls": len(v), "answered_per_s": answered.get(m, 0) / seconds, "p50_ms": 1000 * _pct(v, 0.5),
                        "p99_ms": 1000 * _pct(v, 0.99), "max_ms": 1000 * max(v)} for m, v in sorted(latency.items())},
        "errors": errors,
        "worker_heartbeat": {
            "late_p50_ms": _ms(_pct(merged["worker_late"], 0.5)), "late_p99_ms": _ms(_pct(merged["worker_late"], 0.99)),
            "late_over_100ms": sum(1 for v in merged["worker_late"] if v > LATE_S),
            "late_over_interval": sum(1 for v in merged["worker_late"] if v > worker_interval_ms / 1000),
            "answered_early_no_news": sum(s["early_answers"] for s in shards),
            "gap_p99_ms": _ms(_pct(merged["worker_gaps"], 0.99)),
            "gap_max_ms": _ms(max(merged["worker_gaps"], default=None)),
        },
        "client_heartbeat": {
            "latency_p50_ms": _ms(_pct(client_lat, 0.5)), "latency_p99_ms": _ms(_pct(client_lat, 0.99)),
            "late_over_100ms": sum(1 for v in client_lat if v > LATE_S),
            "late_over_interval": sum(1 for v in client_lat if v > client_interval_s),
            "gap_p99_ms": _ms(_pct(merged["client_gaps"], 0.99)),
        },
        "ready": {k: sum(s["ready"][k] for s in shards) for k in shards[0]["ready"]},
        "late_by_second": {kind: _by_second(shards, kind) for kind in ("worker", "client")},
        "rejoined": sum(s.get("rejoined", 0) for s in shards),
        "new_job_heard": _new_job_heard(shards),
        "worker_task_lists": {k: sum(s["task_lists"][k] for s in shards) for k in shards[0]["task_lists"]},
        "lost": {"workers_declared_lost": lost_workers, "clients_released": lost_clients,
                 "readers_unknown": sum(s["lost"]["readers"] for s in shards), "status_counts": counts},
        "simulator": {
            "cpu_core_per_proc": [s["cpu_s"] / seconds if s["cpu_s"] is not None else None for s in shards],
            "loop_lag_p99_ms": _ms(_pct(merged["loop_lag"], 0.99)),
            "loop_lag_max_ms": _ms(max(merged["loop_lag"], default=None)),
            "lag_by_second_ms": _lag_by_second(shards),
            "full_collections_ms": [ms for s in shards for ms in s.get("full_collections_ms", [])],
        },
    }
    lag = out["simulator"]["loop_lag_p99_ms"] or 0
    sim_cpu = [s["cpu_s"] for s in shards if s["cpu_s"] is not None]
    # What one call costs the simulator: with the dispatcher's share, it bounds the fleet this machine can drive.
    out["simulator"]["cpu_ms_per_call"] = 1000 * sum(sim_cpu) / calls if calls and sim_cpu else None
    out["simulator"]["saturated"] = lag > 100 or any((c or 0) > 0.9 for c in out["simulator"]["cpu_core_per_proc"])
    return out


def _ms(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else 1000 * seconds


#: This process's CPUs as it started (``pin_apart`` narrows them for the run's children).
_ALL_CPUS = sorted(os.sched_getaffinity(0))


def pin_apart(dispatcher_pid: int) -> dict:
    """``--pin``: every thread of the dispatcher on the first CPU, this process (and so every child it starts
    after: real workers, the real reader, the simulators) on the others. The threads the dispatcher starts
    later inherit its CPU from the thread that starts them."""
    cpus = _ALL_CPUS
    if len(cpus) < 2:
        raise FleetError("--pin needs at least 2 CPUs")
    for task in os.listdir(f"/proc/{dispatcher_pid}/task"):
        os.sched_setaffinity(int(task), {cpus[0]})
    os.sched_setaffinity(0, set(cpus[1:]))
    return {"dispatcher": [cpus[0]], "others": cpus[1:]}


def _f(value: Optional[float], spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def print_report(r: dict, out=print) -> None:
    d = r["dispatcher"]
    out(f"fleet: {r['workers']} workers, {r['readers']} readers, {r['jobs']} jobs, {r['measured_s']:.0f} s after "
        f"{r['warmup_s']:.0f} s warm-up; task lists {r['task_lists']}"
        f"{', fault-tolerant' if r['fault_tolerant'] else ''}{', token' if r['token'] else ''}"
        f"{', dispatcher pinned to a CPU of its own' if r.get('pinned') else ''} "
        f"(load {r['load_before']:.2f} before, {r['load_after']:.2f} after)")
    out(f"  dispatcher: {_f(d['cpu_core'], '.2f')} core, {_f(d['cpu_ms_per_call'], '.2f')} ms CPU/call over "
        f"{r['calls_per_s']:.0f} calls/s, RSS {d['rss_mb']:.0f} MB (peak {d['peak_rss_mb']:.0f} MB)"
        + (f", journal fsyncs {_f(d['journal_fsyncs_per_s'])}/s" if r["fault_tolerant"] else ""))
    for method, m in r["methods"].items():
        out(f"  {method:<22} {m['answered_per_s']:8.1f}/s  p50 {m['p50_ms']:8.1f} ms  p99 {m['p99_ms']:8.1f} ms  "
            f"max {m['max_ms']:8.1f} ms")
    w, c = r["worker_heartbeat"], r["client_heartbeat"]
    if r["task_lists"] == "delta":
        t = r["worker_task_lists"]
        out(f"  worker task lists: {t['delta']} deltas, {t['full']} full lists, {t['resync_asked']} resyncs asked")
    out(f"  worker heartbeats late: p50 {_f(w['late_p50_ms'])} ms, p99 {_f(w['late_p99_ms'])} ms; "
        f"{w['late_over_100ms']} late > 100 ms, {w['late_over_interval']} > interval; "
        f"{w['answered_early_no_news']} answered early without news")
    out(f"  client heartbeats: p50 {_f(c['latency_p50_ms'])} ms, p99 {_f(c['latency_p99_ms'])} ms; "
        f"{c['late_over_100ms']} > 100 ms, {c['late_over_interval']} > interval")
    lost = r["lost"]
    ready = r["ready"]
    out(f"  started before the window: {ready['workers']} workers, {ready['readers']} readers; late: "
        f"{ready['workers_late']} workers, {ready['readers_late']} readers; readers that failed to start: "
        f"{ready['readers_failed']}" + (f"; restarted in the window: {r['rejoined']} readers" if r.get("rejoined") else ""))
    out(f"  declared lost: {lost['workers_declared_lost']} workers, {lost['clients_released']} readers released "
        f"({lost['readers_unknown']} told they are unknown); errors {r['errors'] or 'none'}")
    if r.get("kill_worker"):
        seconds = r.get("failure_detection_s")
        out("  a real worker killed (-9) in the window: "
            + (f"declared lost after {seconds:.1f} s" if seconds is not None else "NOT declared lost within the window"))
    late = r.get("late_by_second") or {}
    seconds_late = sorted(set(late.get("worker", {})) | set(late.get("client", {})))
    if seconds_late:
        # The real read's job starts at 0 s (a task on every worker); the real worker is killed at kill_at_s.
        out("  over 100 ms late, by second of the window (worker heartbeats/reader heartbeats; the real read starts "
            f"at 0 s{', a worker is killed at %.0f s' % r['kill_at_s'] if r.get('kill_at_s') is not None else ''}): "
            + ", ".join(f"{t}: {late.get('worker', {}).get(t, 0)}/{late.get('client', {}).get(t, 0)}"
                        for t in seconds_late))
    heard = r.get("new_job_heard")
    if heard and heard["workers"]:
        out(f"  the real read's job reached {heard['workers']} simulated workers: half by {heard['half_s']:.1f} s, "
            f"the last at {heard['last_s']:.1f} s")
    full = r.get("full_collections")
    if full is not None:
        # Each stops the whole dispatcher: every call in flight, and every poll due, waits that long.
        out("  the dispatcher's full garbage collections in the window: "
            + (", ".join(f"at {at:.1f} s, {ms:.0f} ms" for at, ms in full["in_window"]) or "none")
            + f" ({full['since_start']} since it started)")
    if r.get("cpu_by_second"):
        out("  dispatcher CPU by second of the window (core): "
            + " ".join(f"{c:.2f}" for c in r["cpu_by_second"]))
    real = r["real_read"]
    once = real["idle"]["exactly_once"] and real["loaded"]["exactly_once"]
    out(f"  real read of {REAL_READ_ELEMENTS}: idle {real['idle']['elements_per_s']:.0f}/s, beside the fleet "
        f"{real['loaded']['elements_per_s']:.0f}/s; exactly once: {once}")
    s = r["simulator"]
    out(f"  simulator: {', '.join(_f(c, '.2f') for c in s['cpu_core_per_proc'])} core per process, "
        f"{_f(s['cpu_ms_per_call'], '.2f')} ms CPU/call, loop lag p99 "
        f"{_f(s['loop_lag_p99_ms'])} ms{' -- SATURATED: latencies include the simulator' if s['saturated'] else ''}")
    if s.get("full_collections_ms"):
        out(f"  simulator full collections in the window: {len(s['full_collections_ms'])}, "
            f"longest {max(s['full_collections_ms']):.0f} ms")
    lagged = {t: ms for t, ms in (s.get("lag_by_second_ms") or {}).items() if ms > SIM_LAG_NOTED_MS}
    if lagged:
        # A reader's answer waits in its simulator's socket while that loop is held: those seconds' slow answers
        # may be the simulator's, not the dispatcher's.
        out(f"  simulator loop lag over {SIM_LAG_NOTED_MS:.0f} ms, worst by second of the window: "
            + ", ".join(f"{t}: {ms:.0f} ms" for t, ms in lagged.items()))


# --------------------------------------------------------------------------------------------------
# The table
_COSTS = {
    "cpu_core": lambda r: r["dispatcher"]["cpu_core"],
    "cpu_ms_per_call": lambda r: r["dispatcher"]["cpu_ms_per_call"],
    "rss_mb": lambda r: r["dispatcher"]["rss_mb"],
    "wh_late_p99_ms": lambda r: r["worker_heartbeat"]["late_p99_ms"],
    "ch_p99_ms": lambda r: r["client_heartbeat"]["latency_p99_ms"],
    "getsplit_p99_ms": lambda r: r["methods"].get("GetSplit", {}).get("p99_ms"),
}


def _slope(points: list) -> Optional[float]:
    """Least-squares slope of log(cost) against log(size)."""
    pts = [(math.log(x), math.log(y)) for x, y in points if y is not None and y > 0]
    if len(pts) < 2 or len({p[0] for p in pts}) < 2:
        return None
    mx, my = statistics.fmean(p[0] for p in pts), statistics.fmean(p[1] for p in pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den


def growth(rows: list) -> dict:
    """Per cost, the exponent of a log-log fit in N (readers fixed, averaged over M) and in M."""
    out = {}
    for name, get in _COSTS.items():
        in_n = [s for m in {r["readers"] for r in rows}
                if (s := _slope([(r["workers"], get(r)) for r in rows if r["readers"] == m])) is not None]
        in_m = [s for n in {r["workers"] for r in rows}
                if (s := _slope([(r["readers"], get(r)) for r in rows if r["workers"] == n])) is not None]
        out[name] = {"exponent_n": statistics.fmean(in_n) if in_n else None,
                     "exponent_m": statistics.fmean(in_m) if in_m else None}
    return out


def print_table(rows: list, fits: dict, out=print) -> None:
    header = (f"{'N':>5} {'M':>6} {'core':>5} {'ms/call':>7} {'calls/s':>7} {'RSS MB':>6} {'WH p99':>7} "
              f"{'WH late p50/p99 ms':>19} "
              f"{'CH p50/p99 ms':>15} {'GetSplit p99':>12} {'GOCI p99':>8} {'lost w/r':>8} {'real/idle el/s':>15} "
              f"{'1x':>3} {'sim':>4}")
    out(header)
    for r in rows:
        d, w, c = r["dispatcher"], r["worker_heartbeat"], r["client_heartbeat"]
        real = r["real_read"]
        ok = real["idle"]["exactly_once"] and real["loaded"]["exactly_once"]
        out(f"{r['workers']:>5} {r['readers']:>6} {_f(d['cpu_core'], '.2f'):>5} {_f(d['cpu_ms_per_call'], '.2f'):>7} "
            f"{r['calls_per_s']:>7.0f} {d['rss_mb']:>6.0f} "
            f"{_f(r['methods'].get('WorkerHeartbeat', {}).get('p99_ms'), '.0f'):>7} "
            f"{_f(w['late_p50_ms'], '.0f') + '/' + _f(w['late_p99_ms'], '.0f'):>19} "
            f"{_f(c['latency_p50_ms'], '.0f') + '/' + _f(c['latency_p99_ms'], '.0f'):>15} "
            f"{_f(r['methods'].get('GetSplit', {}).get('p99_ms'), '.0f'):>12} "
            f"{_f(r['methods'].get('GetOrCreateIteration', {}).get('p99_ms'), '.0f'):>8} "
            f"{str(r['lost']['workers_declared_lost']) + '/' + str(r['lost']['clients_released']):>8} "
            f"{real['loaded']['elements_per_s']:>7.0f}/{real['idle']['elements_per_s']:<7.0f} "
            f"{'ok' if ok else 'NO':>3} {'SAT' if r['simulator']['saturated'] else 'ok':>4}")
    out("growth (exponent of a log-log fit; 1 = linear): " + "; ".join(
        f"{name} N^{_f(f['exponent_n'], '.2f')} M^{_f(f['exponent_m'], '.2f')}" for name, f in fits.items()))
    out("core: the dispatcher's CPU over the window; ms/call: its CPU per call answered in the window; WH p99: "
        "WorkerHeartbeat latency (a long poll: ~1000 ms when idle); "
        "WH late: a no-news worker heartbeat's answer minus the wait it asked; CH: client heartbeat latency; "
        "GOCI: GetOrCreateIteration; lost w/r: workers the dispatcher declared lost / readers it released as silent; "
        "1x: the real reads delivered each element exactly once; sim SAT: a simulator process was saturated "
        "(loop lag p99 > 100 ms or > 0.9 core; on a loaded machine the lag is other processes'), so latencies "
        "include it")


# --------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=100, metavar="N", help="simulated workers (default 100)")
    parser.add_argument("--readers", type=int, default=1000, metavar="M", help="simulated readers (default 1000)")
    parser.add_argument("--jobs", type=int, default=2, metavar="J", help="shared distributed_epoch jobs (default 2)")
    parser.add_argument("--duration-s", type=float, default=20.0, help="measured window (default 20)")
    parser.add_argument("--warmup-s", type=float, default=None,
                        help="before the window (default 10 s, plus 1 s per 1,000 readers: ten thousand readers "
                             "joining within 5 s is a burst the window should not measure)")
    parser.add_argument("--fault-tolerant", action="store_true", help="the dispatcher journals (--fault-tolerant)")
    parser.add_argument("--token", action="store_true", help="a cluster auth token: every call carries it")
    parser.add_argument("--task-lists", choices=("full", "delta"), default=None,
                        help="WorkerHeartbeat task lists: delta (what a worker sends; the default when this tree's "
                             "protocol has it) or full (what workers sent before)")
    parser.add_argument("--split-interval-ms", type=int, default=2000,
                        help="each simulated task leases a split this often (default 2000: a 4,096-element split "
                             "at about 2,000 elements/s, an image pipeline's pace per worker)")
    parser.add_argument("--max-splits", type=int, default=8,
                        help="splits a simulated task takes in one GetSplit answer, as the real worker's "
                             "MAX_SPLITS_PER_REQUEST (default 8; an older tree's protocol has no such field: one)")
    parser.add_argument("--dispatcher-src", metavar="DIR", default=None,
                        help="run the dispatcher, real workers and real reader from this source tree")
    parser.add_argument("--sim-procs", type=int, default=2, help="simulator processes (default 2)")
    parser.add_argument("--rejoin-per-s", type=float, default=0.0, metavar="R",
                        help="readers restarting in the window, a second in all: each releases its read and "
                             "joins again (GetOrCreateJob, GetOrCreateIteration), so their latency is measured "
                             "beside a running fleet (default 0: every reader joins once, in the warm-up)")
    parser.add_argument("--channels", type=int, default=4, help="gRPC connections per simulator process")
    parser.add_argument("--table", action="store_true",
                        help=f"run N in {TABLE_WORKERS} x M in {TABLE_READERS} and fit the growth")
    parser.add_argument("--json", metavar="PATH", default=None, help="write the report(s) as JSON")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument("--worker-timeout-ms", type=int, default=None,
                        help="the dispatcher's worker_timeout_ms (default: its own, 10 s)")
    parser.add_argument("--pin", action="store_true",
                        help="the dispatcher alone on the first CPU, everything else on the others: its calls then "
                             "queue behind its own work only (on 2 cores the simulators, real workers and reader share "
                             "the other CPU, and lag more)")
    parser.add_argument("--no-kill-worker", dest="kill_worker", action="store_false",
                        help="do not kill a real worker in the window (by default one is killed, and the time until "
                             "the dispatcher declares it lost is reported)")
    parser.add_argument("--_sim", nargs=2, metavar=("SPEC", "OUT"), default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: Optional[list] = None) -> int:
    args = build_parser().parse_args(argv)
    if args._sim:
        return _sim_main(*args._sim)
    if args.task_lists is None:
        args.task_lists = "delta" if _delta_supported() else "full"
    if args.task_lists == "delta" and not _delta_supported():
        print("fleet: --task-lists delta: this tree's dispatcher_pb2 has no WorkerHeartbeat delta fields "
              "(WorkerHeartbeatRequest.tasks_delta); use --task-lists full", file=sys.stderr)
        return 2

    def terminated(*_) -> None:
        # Once: a second SIGTERM (timeout(1) forwards its own) must not cut short the finally that kills the children.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.exit(143)

    signal.signal(signal.SIGTERM, terminated)
    if not args.table:
        report = run_once(args, args.workers, args.readers)
        print_report(report)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))
        ok = report["real_read"]["idle"]["exactly_once"] and report["real_read"]["loaded"]["exactly_once"]
        return 0 if ok else 1
    rows = []
    for n in TABLE_WORKERS:
        for m in TABLE_READERS:
            print(f"--- N={n} M={m}", flush=True)
            rows.append(run_once(args, n, m))
            print_report(rows[-1])
            if args.json:
                Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))
    fits = growth(rows)
    print()
    print_table(rows, fits)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "growth": fits}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
