"""Dispatcher, worker and client processes for the service benchmarks (``benchmarks.run``).

Every server and client is a separate OS process. ``ProcessGroup`` starts them,
collects their stdout lines on a thread (so no wait blocks past its deadline),
writes their stderr to files, and kills every process it started when closed,
so a failed or interrupted measurement leaves nothing running.

Two kinds of cluster share one protocol:

* ``ours``: ``python -m dataservice dispatcher --port 0`` and one
  ``python -m dataservice worker --dispatcher localhost:P --port 0 --processes N`` for N
  workers (a supervisor and N worker processes, as one would run them on a host);
* ``tf``: ``<tf-python> -m benchmarks.tf_service dispatcher|worker ...``, TensorFlow's
  C++ ``DispatchServer``/``WorkerServer``.

Each server prints a "listening" line carrying its port. A client
(``-m benchmarks.workloads client`` or ``-m benchmarks.tf_service client``)
prints ``READY`` once its imports are done, waits for ``GO`` on stdin (sent
once the workers are up), measures, and prints ``RESULT <json>``.

Example::

    >>> with ProcessGroup() as group:       # a fresh cluster of 2 workers and a client; all killed after
    ...     result = run_client(group, "ours", sys.executable, 2,
    ...                         ["--workload", "range", "--mode", "parallel_epochs", "--n", "1000"], timeout_s=60)
    >>> result["elements"], result["elements_per_s"]
    (2000, 251234.5)
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

__all__ = ["BenchmarkError", "Proc", "ProcessGroup", "start_cluster", "start_dispatcher_and_worker", "run_client",
           "process_stats", "process_cpu_s", "CLIENT_MODULES", "REPO", "START_TIMEOUT_S"]

REPO = Path(__file__).resolve().parents[1]
#: Starting a Python process that imports grpc and numpy (or TensorFlow) on a loaded machine.
START_TIMEOUT_S = 120.0
#: A stopped process gets this long after SIGTERM before SIGKILL (a benchmark needs no clean shutdown).
STOP_GRACE_S = 1.0

#: The line each server prints once it listens; a dispatcher's carries its port.
_SERVER_LINES = {
    ("ours", "dispatcher"): r"^dispatcher listening on grpc://[^:\s]+:(\d+)\s*$",
    ("ours", "worker"): r"^worker listening on [^:\s]+:\d+\b",
    ("tf", "dispatcher"): r"^tf dispatcher listening on grpc://[^:\s]+:(\d+)\s*$",
    ("tf", "worker"): r"^tf worker listening on [^:\s]+:\d+\b",
}
#: The module of each side's benchmark client (``client`` and ``calibrate`` commands).
CLIENT_MODULES = {"ours": "benchmarks.workloads", "tf": "benchmarks.tf_service"}


class BenchmarkError(RuntimeError):
    """A process failed to start, exited early, missed a deadline, or reported an error."""


def subprocess_env(kind: str) -> dict:
    """The environment of a benchmark process: this checkout importable, unbuffered output, quiet TF."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("DATASERVICE_SERVICE", None)
    if kind == "tf":
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


class Proc:
    """A subprocess: stdout lines collected by a thread, stderr in a file, stdin a pipe."""

    def __init__(self, args: Sequence[str], env: dict, stderr_path: Path, name: str):
        self.args = list(args)
        self.name = name
        self.stderr_path = stderr_path
        self._stderr = open(stderr_path, "wb")
        try:
            self.popen = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=self._stderr, env=env, cwd=REPO, text=True, bufsize=1)
        except OSError as exc:
            self._stderr.close()
            raise BenchmarkError(f"cannot start {name} ({' '.join(self.args)}): {exc}") from exc
        self.lines: list[str] = []
        self._queue: "queue.Queue[Optional[str]]" = queue.Queue()
        self._eof = False
        threading.Thread(target=self._pump, name=f"bench-stdout-{name}", daemon=True).start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _pump(self) -> None:
        try:
            for line in self.popen.stdout:
                self._queue.put(line.rstrip("\n"))
        except (OSError, ValueError):
            pass
        finally:
            self._queue.put(None)

    def stderr_tail(self, chars: int = 3000) -> str:
        try:
            self._stderr.flush()
            text = self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-chars:]

    def _describe_failure(self, what: str) -> str:
        code = self.popen.poll()
        state = "still running" if code is None else f"exit code {code}"
        stdout = "\n".join(self.lines[-10:])
        return (f"{self.name} (pid {self.pid}, {state}) {what}\n  command: {' '.join(self.args)}\n"
                f"  last stdout lines: {stdout!r}\n  stderr tail ({self.stderr_path}; kept with --keep-logs):\n"
                + "\n".join("    " + line for line in self.stderr_tail().splitlines()))

    def wait_for_line(self, pattern: str, timeout_s: float) -> re.Match:
        """The first stdout line matching ``pattern``; BenchmarkError at the deadline or if the process exits."""
        regex = re.compile(pattern)
        checked = 0
        deadline = time.monotonic() + timeout_s
        while True:
            for line in self.lines[checked:]:
                if match := regex.search(line):
                    return match
            checked = len(self.lines)
            if self._eof:
                self.popen.wait(timeout=STOP_GRACE_S)
                raise BenchmarkError(self._describe_failure(f"exited before printing a line matching /{pattern}/"))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BenchmarkError(self._describe_failure(
                    f"printed no line matching /{pattern}/ within {timeout_s:g} s"))
            try:
                line = self._queue.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                continue
            if line is None:
                self._eof = True
            else:
                self.lines.append(line)

    def send_line(self, text: str) -> None:
        try:
            self.popen.stdin.write(text + "\n")
            self.popen.stdin.flush()
        except (BrokenPipeError, OSError, ValueError) as exc:
            raise BenchmarkError(self._describe_failure(f"cannot be sent {text!r} ({exc})")) from exc

    def terminate(self) -> None:
        """SIGTERM, without waiting."""
        try:
            if self.popen.poll() is None:
                self.popen.send_signal(signal.SIGTERM)
        except OSError:
            pass

    def stop(self, grace_s: float = STOP_GRACE_S) -> Optional[int]:
        """SIGTERM, then SIGKILL after ``grace_s``; reaps the process and returns its exit code."""
        try:
            if self.popen.poll() is None:
                self.popen.send_signal(signal.SIGTERM)
                try:
                    self.popen.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    self.popen.kill()
                    self.popen.wait(timeout=10)
            return self.popen.returncode
        except (OSError, subprocess.TimeoutExpired):
            return None
        finally:
            for stream in (self.popen.stdin, self._stderr):
                try:
                    stream.close()
                except (OSError, ValueError, BrokenPipeError):
                    pass


class ProcessGroup:
    """Starts processes; ``close`` (or leaving the ``with`` block) stops every one still running.

    Stderr files go to a temporary directory, removed on close unless ``keep_logs``.
    """

    def __init__(self, keep_logs: bool = False):
        self.log_dir = Path(tempfile.mkdtemp(prefix="dataservice-bench-"))
        self.keep_logs = keep_logs
        self.procs: list[Proc] = []

    def spawn(self, args: Sequence[str], kind: str, name: str) -> Proc:
        path = self.log_dir / f"{len(self.procs):02d}-{kind}-{name}.stderr"
        proc = Proc(args, subprocess_env(kind), path, f"{kind} {name}")
        self.procs.append(proc)
        return proc

    def close(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to every process still running (clients first, then workers, then the dispatcher),
        one shared ``grace_s`` for all of them to exit, then SIGKILL for the rest."""
        procs = list(reversed(self.procs))
        self.procs.clear()
        for proc in procs:
            proc.terminate()
        deadline = time.monotonic() + grace_s
        for proc in procs:
            proc.stop(grace_s=max(0.0, deadline - time.monotonic()))
        if not self.keep_logs:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> "ProcessGroup":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _server_args(kind: str, python: str, role: str, dispatcher_port: Optional[int] = None,
                 processes: int = 1) -> list[str]:
    module = ["-m", "dataservice"] if kind == "ours" else ["-m", "benchmarks.tf_service"]
    args = [python, *module, role, "--port", "0"]
    if role == "worker":
        args += ["--dispatcher", f"localhost:{dispatcher_port}"]
    if kind == "ours":
        args += ["--log-level", "WARNING"]
    if processes > 1:
        args += ["--processes", str(processes)]
    return args


def _start_workers(group: ProcessGroup, kind: str, python: str, dispatcher_port: int,
                   num_workers: int) -> list[tuple[Proc, str]]:
    """Spawns the workers: ours as one ``worker --processes N`` command, tf.data's one process each.
    Returns (process, the line it prints once its workers are up) pairs: a supervisor prints one
    "listening" line per worker process, then a summary line once all of them listen."""
    if kind == "ours" and num_workers > 1:
        supervisor = group.spawn(_server_args(kind, python, "worker", dispatcher_port, processes=num_workers),
                                 kind, f"workers-x{num_workers}")
        return [(supervisor, rf"^{num_workers} worker processes started\b")]
    return [(group.spawn(_server_args(kind, python, "worker", dispatcher_port), kind, f"worker{i}"),
             _SERVER_LINES[kind, "worker"]) for i in range(num_workers)]


def start_cluster(group: ProcessGroup, kind: str, python: str, num_workers: int,
                  timeout_s: float = START_TIMEOUT_S, client_args: Optional[Sequence[str]] = None
                  ) -> tuple[str, Optional[Proc]]:
    """Starts a dispatcher, then ``num_workers`` workers, and (if ``client_args``) the client, whose
    imports overlap the workers' start-up. Returns the service address (``grpc://localhost:P``) and the
    client once every worker is up."""
    if (kind, "dispatcher") not in _SERVER_LINES:
        raise ValueError(f"kind must be 'ours' or 'tf', got {kind!r}")
    dispatcher = group.spawn(_server_args(kind, python, "dispatcher"), kind, "dispatcher")
    port = int(dispatcher.wait_for_line(_SERVER_LINES[kind, "dispatcher"], timeout_s).group(1))
    service = f"grpc://localhost:{port}"
    workers = _start_workers(group, kind, python, port, num_workers)
    client = None
    if client_args is not None:
        client = spawn_client(group, kind, python, service, client_args)
    for proc, started_line in workers:
        proc.wait_for_line(started_line, timeout_s)
    return service, client


def start_dispatcher_and_worker(group: ProcessGroup, python: str, dispatcher_args: Sequence[str] = (),
                                worker_args: Sequence[str] = (), timeout_s: float = START_TIMEOUT_S
                                ) -> tuple[str, Proc, Proc]:
    """Our dispatcher and one worker process, each given its extra command-line flags (say
    ``["--fault-tolerant", "--work-dir", d]``, ``["--memory-budget-bytes", "67108864"]``). Returns the
    service address (``grpc://localhost:P``) and both processes once the worker listens."""
    dispatcher = group.spawn(_server_args("ours", python, "dispatcher") + list(dispatcher_args), "ours", "dispatcher")
    port = int(dispatcher.wait_for_line(_SERVER_LINES["ours", "dispatcher"], timeout_s).group(1))
    worker = group.spawn(_server_args("ours", python, "worker", port) + list(worker_args), "ours", "worker")
    worker.wait_for_line(_SERVER_LINES["ours", "worker"], timeout_s)
    return f"grpc://localhost:{port}", dispatcher, worker


def process_stats(pid: int) -> tuple[Optional[float], Optional[int]]:
    """RSS (MB, 10**6 bytes) and thread count of process ``pid`` from /proc/<pid>/status; (None, None) where
    there is none."""
    rss = threads = None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024 / 1e6
                elif line.startswith("Threads:"):
                    threads = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return rss, threads


def process_cpu_s(pid: int, children: bool = False) -> Optional[float]:
    """CPU seconds (user + system) process ``pid`` has used, from /proc/<pid>/stat; None where there is none.
    ``children``: plus what its exited (and reaped) children used, e.g. the fault-tolerant dispatcher's
    checkpoint writers."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name may hold spaces and parentheses: the fields start after the last ")".
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if children else 0)
        return ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def spawn_client(group: ProcessGroup, kind: str, python: str, service: str, client_args: Sequence[str]) -> Proc:
    return group.spawn([python, "-m", CLIENT_MODULES[kind], "client", "--service", service, *client_args],
                       kind, "client")


def await_result(client: Proc, timeout_s: float) -> dict:
    """Waits for the client's ``READY``, sends ``GO``, and returns its ``RESULT`` JSON."""
    client.wait_for_line(r"^READY$", START_TIMEOUT_S)
    client.send_line("GO")
    match = client.wait_for_line(r"^(RESULT|ERROR) (.*)$", timeout_s)
    payload = json.loads(match.group(2))
    if match.group(1) == "ERROR":
        raise BenchmarkError(f"{client.name} failed: {payload.get('error')}\n{payload.get('traceback', '')}")
    return payload


def run_client(group: ProcessGroup, kind: str, python: str, num_workers: int, client_args: Sequence[str],
               timeout_s: float) -> dict:
    """One measurement: a fresh cluster of ``num_workers`` workers and a fresh client; the client's result."""
    _service, client = start_cluster(group, kind, python, num_workers, client_args=[
        "--workers", str(num_workers), *client_args])
    return await_result(client, timeout_s)


def tensorflow_works(python: str, timeout_s: float = START_TIMEOUT_S) -> tuple[bool, str]:
    """Whether ``python -c "import tensorflow"`` succeeds, and its version or the error."""
    try:
        result = subprocess.run([python, "-c", "import tensorflow as tf; print(tf.__version__)"],
                                capture_output=True, text=True, timeout=timeout_s, env=subprocess_env("tf"))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    if result.returncode != 0:
        return False, (result.stderr.strip().splitlines() or ["import failed"])[-1]
    return True, result.stdout.strip().splitlines()[-1]


if __name__ == "__main__":  # pragma: no cover - a manual check: start and stop one cluster of ours
    with ProcessGroup() as g:
        service, _ = start_cluster(g, "ours", sys.executable, 2)
        print(f"2 workers up; dispatcher at {service}")


def interrupt_on_sigterm() -> None:
    """SIGTERM raises KeyboardInterrupt, so the processes a benchmark started are stopped on the way out."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        pass


def interrupt_after(timeout_s: float) -> None:
    """SIGTERM, and ``timeout_s`` passing (SIGALRM), raise KeyboardInterrupt in the main thread, so a benchmark
    stops the processes it started on the way out; ``signal.alarm(0)`` cancels the timeout.

    Example::

        >>> interrupt_after(args.timeout)
        >>> try:
        ...     run()
        ... finally:
        ...     signal.alarm(0)
    """
    interrupt_on_sigterm()

    def on_alarm(signum, frame):
        raise KeyboardInterrupt(f"the run took over --timeout {timeout_s:.0f} s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(timeout_s))


def add_run_arguments(parser: argparse.ArgumentParser, timeout_s: float = 900.0) -> None:
    """The flags every long benchmark run has: ``--timeout`` (see ``interrupt_after``), ``--json`` and
    ``--keep-logs``."""
    parser.add_argument("--timeout", type=positive_number(float), default=timeout_s,
                        help=f"give up on the whole run after this long (default {timeout_s:.0f} s)")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--keep-logs", action="store_true")


def positive_number(kind: Callable[[str], float]) -> Callable[[str], float]:
    """An argparse type: ``kind(text)`` (int, float), refused unless positive."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return value

    return parse
