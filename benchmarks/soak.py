"""Soak benchmark: thousands of short jobs, one after another, against one long-lived cluster.

``python -m benchmarks.soak`` starts a real dispatcher and a real worker as
subprocesses (``dataservice dispatcher --port 0`` and ``dataservice worker``,
through ``benchmarks.cluster_processes``), then reads ``--jobs`` short jobs in
this process through the public client API (``distribute``), one after
another, and checks every element. The mix, drawn with ``--seed``:

* 40% anonymous ``parallel_epochs`` reads of ``Dataset.range(50)``;
* 20% named ``parallel_epochs`` reads of ``Dataset.range(50)``, each under a new ``job_name``;
* 10% named reads under a name read before: 0 elements while the dispatcher keeps the
  finished job (as in tf.data service), all 50 once it garbage-collected the job or
  pruned it from its state (``--finished-jobs-kept``);
* 30% anonymous ``distributed_epoch`` reads of ``Dataset.range(1024)`` (4 splits).

After ``--warmup`` jobs (20; imports, connections and first registrations, not
counted), every ``--report-every`` jobs it prints one row: the time per job, the
dispatcher's RPC latencies (``GetStatusResponse.rpc_latency``: p50/p99 of its most recent calls,
at most 1,024 per method), the size of ``dataservice status --json`` (and of the
GetStatus reply), what the dispatcher holds (``GetStatusResponse.counts``), and the
RSS and thread count of the dispatcher, the worker and this client process. At the
end it compares the first interval with the last: a service that degrades with the
number of jobs it has seen shows ratios well above 1.

Every read has a timeout (``--read-timeout``, distribute's ``timeout_ms``), and the run
stops with an error (exit code 1, naming the job, with the servers' stderr tails) if a read
fails or reads wrong elements, a server exits, a read outlives its timeout, or no job
finishes within 60 s. The cluster token of the environment
(``DATASERVICE_AUTH_TOKEN[_FILE]``) reaches every process; ``--with-token`` makes up a
random one.

Example (2 cores; columns cut here)::

    $ python -m benchmarks.soak
    dataservice soak: 3,000 short jobs, one after another, against one dispatcher and one worker ...
    |  jobs |      s | ms/job | job p99 | WorkerHeartbeat p50/p99 | GetSplit p50/p99 | ... | dispatcher MB/thr | ...
    |   250 |    9.8 |   39.2 |    70.1 |             23.05/58.26 |      0.055/18.52 | ... |           60.2/13 | ...
    ...
    | 3,000 |  132.5 |   51.6 |   152.8 |             23.95/84.67 |      0.071/18.56 | ... |           61.2/13 | ...

    | metric                        | first interval (jobs 1-250) | last interval (jobs 2,751-3,000) | last/first |
    | time per job [ms]             |                        39.2 |                             51.6 |      1.32x |
    ...
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import queue
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from benchmarks.cluster_processes import (REPO, START_TIMEOUT_S, BenchmarkError, Proc, ProcessGroup, process_stats,
                                          interrupt_on_sigterm, positive_number, start_dispatcher_and_worker,
                                          subprocess_env)

__all__ = ["main", "build_parser", "JOB_KINDS", "STALL_TIMEOUT_S", "process_stats", "Interval"]

#: The run stops with an error if no job finishes for this long.
STALL_TIMEOUT_S = 60.0
DEFAULT_JOBS = 3000
DEFAULT_REPORT_EVERY = 250
DEFAULT_READ_TIMEOUT_S = 30.0
DEFAULT_WARMUP = 20
#: The dispatcher's RPCs each row reports.
METHODS = ("WorkerHeartbeat", "GetSplit", "ClientHeartbeat", "GetOrCreateIteration")
SHORT_RANGE = 50
#: 4 splits of 256 elements (``Dataset.range`` cuts chunks of at least 256).
SPLIT_RANGE = 1024
#: Each kind of job and its share of the mix.
JOB_KINDS = {
    "anonymous": 0.4,    # parallel_epochs, range(50)
    "named": 0.2,        # parallel_epochs, range(50), a new job_name
    "named_again": 0.1,  # a job_name read before
    "distributed": 0.3,  # distributed_epoch, range(1024), anonymous
}
MB = 1e6
#: The warning a reader logs for a name whose job was already read to its end: expected here, so counted.
_READ_BY_OTHERS_WARNING = "job %r: its iteration %d had already been read to its end"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- process figures -------------------------------------------------------------------------------

def _dir_bytes(path: Optional[Path]) -> Optional[int]:
    if path is None:
        return None
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:  # a journal segment removed while we walk
                pass
    return total


# --- the jobs ----------------------------------------------------------------------------------------

@dataclass
class JobResult:
    index: int
    kind: str
    job_name: Optional[str]
    elements: int
    seconds: float


@dataclass
class JobFailure:
    """The read that ended the run (``what``: which job, since when) and its exception."""
    what: str
    error: BaseException


class JobCheckError(AssertionError):
    """A job read other elements than its dataset holds."""


class JobRunner:
    """Reads the jobs one after another on a daemon thread; results (or the exception that ended the run)
    go to ``results``. ``current`` is the job being read and since when (for the hang guard)."""

    def __init__(self, service: str, jobs: int, seed: int, read_timeout_s: float):
        from dataservice import Dataset

        self.service = service
        self.jobs = jobs
        self.read_timeout_ms = max(1, int(read_timeout_s * 1000))
        self.rng = random.Random(seed)
        # One pipeline object per dataset: every read registers the same definition, so the dispatcher
        # keeps one dataset of each (same fingerprint) however many jobs read it.
        self.short = Dataset.range(SHORT_RANGE)
        self.split = Dataset.range(SPLIT_RANGE)
        self.names: list[str] = []
        self.results: "queue.Queue[Any]" = queue.Queue()
        self.current: Optional[tuple[int, str, Optional[str], float]] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-jobs", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """No new job after the one being read."""
        self._stop.set()

    def _pick(self) -> str:
        kind = self.rng.choices(list(JOB_KINDS), weights=list(JOB_KINDS.values()))[0]
        return "named" if kind == "named_again" and not self.names else kind

    def _run(self) -> None:
        try:
            for index in range(self.jobs):
                if self._stop.is_set():
                    return
                self.results.put(self.read_one(index, self._pick()))
        except BaseException as exc:  # reported by the main thread, which ends the run
            self.results.put(JobFailure(_describe_current(self, time.monotonic()), exc))
            return
        self.current = None

    def read_one(self, index: int, kind: str) -> JobResult:
        from dataservice import distribute

        name: Optional[str] = None
        if kind == "named":
            name = f"soak-{index}"
            self.names.append(name)
        elif kind == "named_again":
            name = self.rng.choice(self.names)
        started = time.monotonic()
        self.current = (index, kind, name, started)
        if kind == "distributed":
            dataset, mode, expected = self.split, "distributed_epoch", list(range(SPLIT_RANGE))
        else:
            dataset, mode, expected = self.short, "parallel_epochs", list(range(SHORT_RANGE))
        read = dataset.apply(distribute(mode, self.service, job_name=name, timeout_ms=self.read_timeout_ms))
        got = sorted(int(x) for x in read)
        seconds = time.monotonic() - started
        if got != expected and not (kind == "named_again" and not got):
            shown = got if len(got) <= 12 else got[:6] + ["..."] + got[-6:]
            raise JobCheckError(f"job #{index + 1} ({kind}, {mode}, job_name={name!r}) read {len(got)} elements "
                                f"{shown}, expected {len(expected)}" + (" (or 0)" if kind == "named_again" else ""))
        return JobResult(index, kind, name, len(got), seconds)


class _CountReadByOthers(logging.Filter):
    """Swallows and counts the reader's warning about a name already read to its end: this benchmark
    reads such names on purpose. Every other record passes."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(_READ_BY_OTHERS_WARNING):
            self.count += 1
            return False
        return True


# --- one report row ------------------------------------------------------------------------------------

@dataclass
class Interval:
    jobs_done: int
    jobs: int            # in this interval
    elapsed_s: float     # since the first job started
    seconds: float       # this interval's wall time
    ms_per_job: float
    job_p50_ms: float
    job_p99_ms: float
    latency: dict        # method -> {calls, p50_ms, p99_ms, max_ms}
    counts: dict
    status_json_bytes: int
    status_reply_bytes: int
    dispatcher_rss_mb: Optional[float]
    dispatcher_threads: Optional[int]
    worker_rss_mb: Optional[float]
    worker_threads: Optional[int]
    client_rss_mb: Optional[float]
    client_threads: Optional[int]
    journal_bytes: Optional[int]
    kinds: dict = field(default_factory=dict)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def status_json_bytes(response: Any, service: str) -> int:
    """The bytes ``dataservice status --json`` prints for ``response`` (same function, same formatting)."""
    from dataservice.cli import status_as_dict

    return len((json.dumps(status_as_dict(response, service), indent=2) + "\n").encode())


def _counts(response: Any) -> dict:
    c = response.counts
    return {name: getattr(c, name) for name in ("workers", "datasets", "jobs", "iterations", "tasks", "clients",
                                                "jobs_finished", "jobs_pruned")}


def _latency(response: Any) -> dict:
    return {m.method: {"calls": m.calls, "p50_ms": m.p50_ms, "p99_ms": m.p99_ms, "max_ms": m.max_ms}
            for m in response.rpc_latency}


def _measure(response: Any, service: str, done: int, times: list[float], elapsed_s: float, seconds: float,
             pids: tuple[int, int], work_dir: Optional[Path], kinds: dict) -> Interval:
    """One row: the interval's job times, the dispatcher's status, and the processes' figures now."""
    d_rss, d_thr = process_stats(pids[0])
    w_rss, w_thr = process_stats(pids[1])
    c_rss, c_thr = process_stats(os.getpid())
    return Interval(
        jobs_done=done, jobs=len(times), elapsed_s=elapsed_s, seconds=seconds,
        ms_per_job=seconds / len(times) * 1e3, job_p50_ms=_percentile(times, 0.5) * 1e3,
        job_p99_ms=_percentile(times, 0.99) * 1e3, latency=_latency(response), counts=_counts(response),
        status_json_bytes=status_json_bytes(response, service), status_reply_bytes=response.ByteSize(),
        dispatcher_rss_mb=d_rss, dispatcher_threads=d_thr, worker_rss_mb=w_rss, worker_threads=w_thr,
        client_rss_mb=c_rss, client_threads=c_thr, journal_bytes=_dir_bytes(work_dir), kinds=dict(kinds))


COLUMNS = ["jobs", "s", "ms/job", "job p99", *(f"{m} p50/p99" for m in METHODS), "status B (reply B)",
           "dispatcher MB/thr", "worker MB/thr", "client MB/thr", "state jobs/iters/tasks/clients",
           "finished/pruned"]


def _ms(value: float) -> str:
    """Milliseconds with about three significant digits: RPCs take from microseconds to seconds."""
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _pair(a: Optional[float], b: Optional[float]) -> str:
    return "-" if a is None or b is None else f"{_ms(a)}/{_ms(b)}"


def _mb_threads(rss: Optional[float], threads: Optional[int]) -> str:
    return "-" if rss is None else f"{rss:.1f}/{threads}"


def row_cells(iv: Interval, with_journal: bool) -> list[str]:
    cells = [f"{iv.jobs_done:,}", f"{iv.elapsed_s:.1f}", f"{iv.ms_per_job:.1f}", f"{iv.job_p99_ms:.1f}"]
    for method in METHODS:
        m = iv.latency.get(method)
        cells.append(_pair(m["p50_ms"], m["p99_ms"]) if m else "-")
    cells.append(f"{iv.status_json_bytes:,} ({iv.status_reply_bytes:,})")
    cells.append(_mb_threads(iv.dispatcher_rss_mb, iv.dispatcher_threads))
    cells.append(_mb_threads(iv.worker_rss_mb, iv.worker_threads))
    cells.append(_mb_threads(iv.client_rss_mb, iv.client_threads))
    c = iv.counts
    cells.append(f"{c['jobs']}/{c['iterations']}/{c['tasks']}/{c['clients']}")
    cells.append(f"{c['jobs_finished']}/{c['jobs_pruned']}")
    if with_journal:
        cells.append(f"{iv.journal_bytes / MB:.2f}" if iv.journal_bytes is not None else "-")
    return cells


class Table:
    """A markdown table printed row by row: widths fixed by the header and a sample row."""

    def __init__(self, headers: list[str], sample: list[str]):
        self.widths = [max(len(h), len(s)) for h, s in zip(headers, sample)]
        self.headers = headers

    def line(self, cells: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) for c, w in zip(cells, self.widths)) + " |"

    def header(self) -> str:
        return self.line(self.headers) + "\n|" + "|".join("-" * (w + 2) for w in self.widths) + "|"


# --- the cluster ---------------------------------------------------------------------------------------

def start_servers(group: ProcessGroup, python: str, work_dir: Optional[Path]) -> tuple[str, Proc, Proc]:
    """A dispatcher (fault-tolerant with a journal in ``work_dir`` if given) and one worker; returns the
    service address and both processes once the worker is up."""
    flags = ["--fault-tolerant", "--work-dir", str(work_dir)] if work_dir is not None else []
    return start_dispatcher_and_worker(group, python, dispatcher_args=flags)


def _wait_for_worker(status: Callable[[], Any], timeout_s: float = START_TIMEOUT_S) -> None:
    """Until the dispatcher lists the worker (it registers before it prints its line; this checks)."""
    deadline = time.monotonic() + timeout_s
    while not status().workers:
        if time.monotonic() > deadline:
            raise BenchmarkError(f"the dispatcher listed no worker within {timeout_s:.0f} s of the worker starting")
        time.sleep(0.05)


def _cli_status_bytes(service: str, timeout_s: float = START_TIMEOUT_S) -> str:
    """``dataservice status --json`` run for real, once: its output size, or why it failed."""
    args = [sys.executable, "-m", "dataservice", "status", "--dispatcher", service.removeprefix("grpc://"), "--json"]
    try:
        result = subprocess.run(args, capture_output=True, timeout=timeout_s, cwd=REPO, env=subprocess_env("ours"))
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout_s:.0f} s"
    if result.returncode != 0:
        return f"exit code {result.returncode}: {result.stderr.decode(errors='replace').strip()[-300:]}"
    return f"{len(result.stdout):,} bytes"


# --- the run --------------------------------------------------------------------------------------------

class SoakFailure(RuntimeError):
    """The run stopped: a read failed or hung, a check failed, or a server died."""


def _describe_current(runner: JobRunner, now: float) -> str:
    current = runner.current
    if current is None:
        return "no job being read"
    index, kind, name, started = current
    return f"job #{index + 1} ({kind}{f', job_name={name!r}' if name else ''}), reading for {now - started:.1f} s"


def _server_tails(servers: dict[str, Proc]) -> str:
    parts = []
    for role, proc in servers.items():
        code = proc.popen.poll()
        state = "running" if code is None else f"exited with code {code}"
        tail = proc.stderr_tail(1500).strip()
        parts.append(f"{role} (pid {proc.pid}, {state}) stderr tail:\n" +
                     ("\n".join("    " + line for line in tail.splitlines()) if tail else "    (empty)"))
    return "\n".join(parts)


def _header(args: argparse.Namespace, dispatcher_pid: int, worker_pid: int, with_journal: bool,
            startup_s: float) -> list[str]:
    """What the run measures, on which machine, and what each column means."""
    return [
        f"dataservice soak: {args.jobs:,} short jobs, one after another, against one dispatcher and one worker "
        f"(separate processes{', dispatcher --fault-tolerant' if args.fault_tolerant else ''}"
        f"{', with a cluster token' if os.environ.get('DATASERVICE_AUTH_TOKEN') else ''}); "
        f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()} "
        f"{platform.release()}; seed {args.seed}",
        f"jobs: {', '.join(f'{int(share * 100)}% {kind}' for kind, share in JOB_KINDS.items())} "
        f"(anonymous/named: parallel_epochs range({SHORT_RANGE}); named_again: a name read before; "
        f"distributed: distributed_epoch range({SPLIT_RANGE}), 4 splits); every element checked",
        f"a row every {args.report_every:,} jobs: ms/job = the interval's wall time / its jobs; job p99 = "
        f"of its jobs' times; <RPC> p50/p99 = the dispatcher's latency in ms over its most recent calls "
        f"(up to 1,024 per method, so not only this interval's; WorkerHeartbeat is a long poll); status B = "
        f"bytes of `dataservice status --json` (reply B: the GetStatus reply); MB/thr = VmRSS (MB) / threads of "
        f"the dispatcher (pid {dispatcher_pid}), the worker (pid {worker_pid}) and this client (pid "
        f"{os.getpid()}); state = what the dispatcher holds (GetStatusResponse.counts)" +
        ("; journal MB = the --work-dir's size" if with_journal else "") +
        f"; the rows start after {args.warmup} warm-up jobs; cluster up in {startup_s:.1f} s",
    ]


def run(args: argparse.Namespace, out: Callable[[str], None] = print) -> dict:
    """The soak run; returns its report (the intervals and the totals). Raises SoakFailure or BenchmarkError."""
    from dataservice.service.dispatcher_client import DispatcherClient

    if args.with_token:
        # Set before any process starts: subprocess_env copies it to the servers, and distribute
        # and DispatcherClient.from_environment read it here.
        os.environ["DATASERVICE_AUTH_TOKEN"] = secrets.token_urlsafe(32)
        os.environ.pop("DATASERVICE_AUTH_TOKEN_FILE", None)
    counter = _CountReadByOthers()
    logging.getLogger("dataservice.client").addFilter(counter)

    work_root = Path(tempfile.mkdtemp(prefix="dataservice-soak-")) if args.fault_tolerant else None
    work_dir = work_root / "journal" if work_root is not None else None
    group = ProcessGroup(keep_logs=args.keep_logs)
    status_client = None
    runner: Optional[JobRunner] = None
    try:
        started_at = time.monotonic()
        service, dispatcher, worker = start_servers(group, sys.executable, work_dir)
        servers = {"dispatcher": dispatcher, "worker": worker}
        status_client = DispatcherClient.from_environment(service, timeout_ms=int(args.status_timeout * 1000))

        def status():
            return status_client.get_status(timeout_s=args.status_timeout)

        _wait_for_worker(status)
        startup_s = time.monotonic() - started_at
        for line in _header(args, dispatcher.pid, worker.pid, work_dir is not None, startup_s):
            out(line)
        out("")

        headers = COLUMNS + (["journal MB"] if work_dir is not None else [])
        sample = ["3,000", "1000.0", "100.0", "1000.0"] + ["10.00/100.00"] * len(METHODS) + \
                 ["100,000 (10,000)", "100.0/20", "100.0/20", "100.0/20", "100/100/100/100", "3000/3000"] + \
                 (["10.00"] if work_dir is not None else [])
        table = Table(headers, sample)
        runner = JobRunner(service, args.warmup + args.jobs, args.seed, args.read_timeout)
        intervals: list[Interval] = []
        times: list[float] = []
        kinds_done: dict[str, int] = {kind: 0 for kind in JOB_KINDS}
        kind_seconds: dict[str, float] = {kind: 0.0 for kind in JOB_KINDS}
        warm = 0
        warmup_s = 0.0
        warmup_warnings = 0
        interval_kinds: dict[str, int] = {}
        named_again_empty = 0
        done = 0
        run_started = interval_started = last_finish = time.monotonic()
        runner.start()
        if not args.warmup:
            out(table.header())
        while done < args.jobs:
            try:
                item = runner.results.get(timeout=0.5)
            except queue.Empty:
                item = None
            now = time.monotonic()
            if isinstance(item, JobFailure):
                raise SoakFailure(f"{item.what} failed, after {done:,} jobs: "
                                  f"{type(item.error).__name__}: {item.error}\n" + _server_tails(servers)
                                  ) from item.error
            for role, proc in servers.items():
                if proc.popen.poll() is not None:
                    raise SoakFailure(f"the {role} exited (code {proc.popen.returncode}) after {done:,} jobs\n"
                                      + _server_tails(servers))
            if item is None:
                current = runner.current
                if current is not None and now - current[3] > args.read_timeout + 5.0:
                    # The read's own timeout_ms should have ended it: it hangs.
                    raise SoakFailure(f"{_describe_current(runner, now)}: no end after --read-timeout "
                                      f"{args.read_timeout:g} s\n" + _server_tails(servers))
                if now - last_finish > STALL_TIMEOUT_S:
                    raise SoakFailure(f"no job finished in {STALL_TIMEOUT_S:.0f} s ({done:,} done; "
                                      f"{_describe_current(runner, now)})\n" + _server_tails(servers))
                continue
            last_finish = now
            if warm < args.warmup:
                # Imports, connections and the first registrations are not what a soak measures.
                warm += 1
                if warm == args.warmup:
                    warmup_s = now - run_started
                    warmup_warnings = counter.count
                    out(table.header())
                    run_started = interval_started = time.monotonic()
                continue
            done += 1
            times.append(item.seconds)
            kinds_done[item.kind] += 1
            kind_seconds[item.kind] += item.seconds
            interval_kinds[item.kind] = interval_kinds.get(item.kind, 0) + 1
            if item.kind == "named_again" and item.elements == 0:
                named_again_empty += 1
            if done % args.report_every and done < args.jobs:
                continue
            iv = _measure(status(), service, done, times, now - run_started, now - interval_started,
                          (dispatcher.pid, worker.pid), work_dir, interval_kinds)
            intervals.append(iv)
            out(table.line(row_cells(iv, work_dir is not None)))
            times.clear()
            interval_kinds.clear()
            # The status call and the bookkeeping above are not the next interval's.
            interval_started = time.monotonic()
        total_s = time.monotonic() - run_started
        final = status()
        cli_bytes = _cli_status_bytes(service)
        report = {
            "command": " ".join(["python", "-m", "benchmarks.soak", *args.argv]),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
            "jobs": done, "total_s": total_s, "startup_s": startup_s, "kinds": kinds_done,
            "mean_ms_by_kind": {k: kind_seconds[k] / n * 1e3 for k, n in kinds_done.items() if n},
            "warmup_jobs": args.warmup, "warmup_s": warmup_s,
            "named_again_empty": named_again_empty, "read_by_others_warnings": counter.count - warmup_warnings,
            "final_counts": _counts(final), "final_latency": _latency(final), "cli_status_json": cli_bytes,
            "intervals": [asdict(iv) for iv in intervals], "fault_tolerant": args.fault_tolerant,
        }
        _print_summary(report, intervals, out)
        return report
    finally:
        if runner is not None:
            runner.stop()  # no new job against servers about to stop
        if status_client is not None:
            status_client.close()
        group.close()
        if work_root is not None:
            if args.keep_logs:
                log(f"journal kept in {work_dir}")
            else:
                shutil.rmtree(work_root, ignore_errors=True)
        if args.keep_logs:
            log(f"server stderr kept in {group.log_dir}")


def _ratio(first: Optional[float], last: Optional[float]) -> str:
    if first is None or last is None or first == 0:
        return "-"
    return f"{last / first:.2f}x"


def _print_summary(report: dict, intervals: list[Interval], out: Callable[[str], None]) -> None:
    first, last = intervals[0], intervals[-1]

    def lat(iv: Interval, method: str) -> Optional[float]:
        m = iv.latency.get(method)
        return m["p50_ms"] if m else None

    rows: list[tuple[str, Optional[float], Optional[float], Any]] = [
        ("time per job [ms]", first.ms_per_job, last.ms_per_job, "{:.1f}"),
        ("job p99 [ms]", first.job_p99_ms, last.job_p99_ms, "{:.1f}"),
        *((f"{method} p50 [ms]", lat(first, method), lat(last, method), _ms) for method in METHODS),
        ("status --json [bytes]", first.status_json_bytes, last.status_json_bytes, "{:,.0f}"),
        ("dispatcher RSS [MB]", first.dispatcher_rss_mb, last.dispatcher_rss_mb, "{:.1f}"),
        ("dispatcher threads", first.dispatcher_threads, last.dispatcher_threads, "{:.0f}"),
        ("worker RSS [MB]", first.worker_rss_mb, last.worker_rss_mb, "{:.1f}"),
        ("worker threads", first.worker_threads, last.worker_threads, "{:.0f}"),
        ("client RSS [MB]", first.client_rss_mb, last.client_rss_mb, "{:.1f}"),
        ("client threads", first.client_threads, last.client_threads, "{:.0f}"),
    ]
    if first.journal_bytes is not None:
        rows.append(("journal [MB]", first.journal_bytes / MB, last.journal_bytes / MB, "{:.2f}"))
    head_first = f"first interval (jobs 1-{first.jobs_done:,})"
    head_last = f"last interval (jobs {last.jobs_done - last.jobs + 1:,}-{last.jobs_done:,})"
    cells = [["metric", head_first, head_last, "last/first"]]
    for label, a, b, fmt in rows:
        show = fmt if callable(fmt) else fmt.format
        cells.append([label, "-" if a is None else show(a), "-" if b is None else show(b), _ratio(a, b)])
    widths = [max(len(r[i]) for r in cells) for i in range(4)]

    def line(r: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) \
            + " |"

    out("")
    out(line(cells[0]))
    out("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells[1:]:
        out(line(r))
    out("")
    kinds = ", ".join(f"{n:,} {k}" for k, n in report["kinds"].items())
    out(f"{report['jobs']:,} jobs in {report['total_s']:.1f} s ({kinds}), after {report['warmup_jobs']} warm-up "
        f"jobs in {report['warmup_s']:.1f} s; {report['named_again_empty']:,} of the named_again reads got 0 "
        f"elements (the finished job still held; warnings counted: {report['read_by_others_warnings']:,})")
    means = ", ".join(f"{k} {ms:.1f}" for k, ms in report["mean_ms_by_kind"].items())
    out(f"mean time per job by kind [ms]: {means}")
    c = report["final_counts"]
    out(f"dispatcher at the end: {c['workers']} worker(s), {c['datasets']} dataset(s), {c['jobs']} job(s), "
        f"{c['iterations']} iteration(s), {c['tasks']} task(s), {c['clients']} client(s); "
        f"{c['jobs_finished']:,} jobs finished, {c['jobs_pruned']:,} pruned; `dataservice status --json`: "
        f"{report['cli_status_json']}")
    if not report["final_latency"]:
        out("note: the dispatcher reported no rpc_latency (GetStatusResponse.rpc_latency is empty): its RPC "
            "columns show '-'")
    if not any(report["final_counts"].values()):
        out("note: the dispatcher reported every count as 0 (GetStatusResponse.counts is not filled in)")


# --- the command line ------------------------------------------------------------------------------------

def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.soak",
        description="Soak: thousands of short jobs one after another against a real dispatcher and worker; "
                    "prints per interval the time per job, the dispatcher's RPC latencies, the status size, "
                    "and the servers' RSS and threads, then the first interval against the last.")
    parser.add_argument("--jobs", type=positive_number(int), default=DEFAULT_JOBS,
                        help=f"jobs to read (default: {DEFAULT_JOBS})")
    parser.add_argument("--report-every", type=positive_number(int), default=DEFAULT_REPORT_EVERY, metavar="N",
                        help=f"print a row every N jobs (default: {DEFAULT_REPORT_EVERY})")
    parser.add_argument("--fault-tolerant", action="store_true",
                        help="run the dispatcher with --fault-tolerant and a --work-dir in a temporary directory")
    parser.add_argument("--warmup", type=_non_negative_int, default=DEFAULT_WARMUP, metavar="N",
                        help=f"jobs read before the first row starts, not counted in --jobs (default: "
                             f"{DEFAULT_WARMUP})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the job mix (default: 0)")
    parser.add_argument("--read-timeout", type=positive_number(float), default=DEFAULT_READ_TIMEOUT_S, metavar="SECONDS",
                        help=f"each read's timeout (distribute's timeout_ms; the run stops if a read lasts 5 s "
                             f"longer) (default: {DEFAULT_READ_TIMEOUT_S:g})")
    parser.add_argument("--status-timeout", type=positive_number(float), default=10.0, metavar="SECONDS",
                        help="timeout of each GetStatus call (default: 10)")
    parser.add_argument("--with-token", action="store_true",
                        help="make up a random cluster token for this run (default: the environment's, if any)")
    parser.add_argument("--json", metavar="PATH", help="also write the intervals and totals as JSON here")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep the servers' stderr files (and the journal with --fault-tolerant)")
    return parser


def main(argv: Optional[list] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    interrupt_on_sigterm()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    try:
        report = run(args, out=lambda line: print(line, flush=True))
    except (SoakFailure, BenchmarkError) as exc:
        log(f"python -m benchmarks.soak: error: {exc}")
        sys.stdout.flush()
        # A hung read leaves its thread blocked in the client library: exit without waiting on it.
        os._exit(1)
    except KeyboardInterrupt:
        log("python -m benchmarks.soak: interrupted")
        sys.stdout.flush()
        os._exit(130)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
