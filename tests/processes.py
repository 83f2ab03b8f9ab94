"""Real dispatcher, worker and client processes for the tests that need them (tests/test_kill9.py,
tests/test_cli.py, tests/test_worker_processes.py).

``Processes`` starts ``python -m dataservice ...`` (or any Python snippet) as
subprocesses with this checkout importable, collects their stdout lines on a
thread (so no read blocks past a deadline), writes their stderr to files, and
kills every one it started when closed. Ports come from the "listening" line
each server prints when started with ``--port 0``.

Example::

    >>> with Processes(tmp_path) as procs:
    ...     dispatcher = procs.dispatcher()
    ...     worker = procs.worker(dispatcher.port)
    ...     group = procs.worker_processes(dispatcher.port, 2)   # dataservice worker --processes 2
    ...     dispatcher.proc.send(signal.SIGKILL)
    ...     dispatcher = procs.dispatcher(port=dispatcher.port)     # same port
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
#: A loaded machine starts a Python process with grpc and numpy in a second or two.
START_TIMEOUT_S = 30.0
#: How long a server gets to exit after SIGTERM or SIGINT.
STOP_TIMEOUT_S = 15.0

#: Short timeouts so that losses are noticed within a second or so.
DISPATCHER_FLAGS = ("--worker-timeout-ms", "1000", "--job-gc-check-interval-ms", "200")
from tests.cluster import free_port, wait_until  # noqa: E402,F401  (shared helpers, re-exported)

WORKER_FLAGS = ("--heartbeat-interval-ms", "100", "--dispatcher-timeout-ms", "30000")


def sockets_on(port: int) -> str:
    """What ``ss`` says about sockets using ``port`` (for the message of a failed bind)."""
    if not port:
        return ""
    try:
        out = subprocess.run(["ss", "-tanp"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"(ss failed: {exc})"
    lines = [line for line in out.splitlines() if re.search(rf":{port}\b", line)]
    return f"sockets on port {port}:\n" + ("\n".join(lines) or "(none)")


def subprocess_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("DATASERVICE_SERVICE", None)
    return env


# --- pipeline functions (pickled by reference: workers import this module) -------------------

def slow_identity(x):
    """Slow enough (~25 µs) that a read of tens of thousands of elements is mid-way when a kill comes."""
    total = 0
    for i in range(1000):
        total += i
    return x


def tag_with_pid(x):
    """``(x, pid of the worker that produced it)``: which worker each element came from."""
    slow_identity(x)
    return x, os.getpid()


#: A client that reads a parallel_epochs job named argv[2] from dispatcher argv[1] without end,
#: printing "read N" every 100 elements (for tests that kill it mid-read).
ENDLESS_READER_SCRIPT = """
import sys
import dataservice as ds

dataset = ds.Dataset.range(100_000_000).apply(
    ds.distribute("parallel_epochs", sys.argv[1], job_name=sys.argv[2], max_outstanding_requests=64,
                  timeout_ms=30_000))
for i, _ in enumerate(dataset, 1):
    if i % 100 == 0:
        print(f"read {i}", flush=True)
"""


# --- processes ----------------------------------------------------------------------------------

class Proc:
    """A subprocess: stdout lines collected by a thread, stderr in a file."""

    def __init__(self, args: list[str], env: dict, stderr_path: Path, cwd: Optional[Path] = None):
        self.args = args
        self.stderr_path = stderr_path
        self._stderr = open(stderr_path, "w")
        self.popen = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=env,
                                      cwd=cwd or REPO)
        self.lines: list[str] = []
        self._queue: "queue.Queue[Optional[str]]" = queue.Queue()
        self._eof = False
        threading.Thread(target=self._pump, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _pump(self) -> None:
        for line in self.popen.stdout:
            self._queue.put(line)
        self._queue.put(None)

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stderr_size(self) -> int:
        return self.stderr_path.stat().st_size

    def stderr_since(self, offset: int) -> str:
        with open(self.stderr_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def _drain(self, timeout_s: float) -> Optional[str]:
        """The next stdout line, None at EOF, "" when none came within ``timeout_s``."""
        if self._eof:
            return None
        try:
            line = self._queue.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return ""
        if line is None:
            self._eof = True
            return None
        self.lines.append(line)
        return line

    def wait_for_line(self, pattern: str, timeout_s: float = START_TIMEOUT_S, start: int = 0) -> re.Match:
        """The first stdout line (from line ``start`` on) matching ``pattern``; AssertionError at the
        deadline or when the process exits first."""
        regex = re.compile(pattern)
        checked = start
        deadline = time.monotonic() + timeout_s
        while True:
            for line in self.lines[checked:]:
                if match := regex.search(line):
                    return match
            checked = max(checked, len(self.lines))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"{self.args} printed no line matching /{pattern}/ within {timeout_s} s; "
                                     f"stdout: {''.join(self.lines[-20:])!r}; stderr: {self.stderr[-4000:]}")
            if self._drain(remaining) is None:
                for line in self.lines[checked:]:
                    if match := regex.search(line):
                        return match
                raise AssertionError(f"{self.args} exited with code {self.popen.wait()} before printing "
                                     f"/{pattern}/; stdout: {''.join(self.lines[-20:])!r}; "
                                     f"stderr: {self.stderr[-4000:]}")

    def poll_lines(self) -> list[str]:
        """Every stdout line so far (collects what arrived without waiting)."""
        while self._drain(0) not in (None, ""):
            pass
        return self.lines

    def send(self, sig: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def stop(self, sig: int, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """Sends ``sig`` and returns the exit code; AssertionError (after SIGKILL) when the process
        does not exit within ``timeout_s``."""
        self.send(sig)
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill9()
            raise AssertionError(f"{self.args} did not exit within {timeout_s} s of {signal.Signals(sig).name}; "
                                 f"stderr: {self.stderr[-4000:]}") from None

    def kill9(self, timeout_s: float = 10.0) -> None:
        """SIGKILL and reap (a killed process releases its ports only once it is gone)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=timeout_s)

    def cleanup(self) -> None:
        try:
            if self.popen.poll() is None:
                # A SIGSTOPped process dies of SIGKILL too; SIGCONT first anyway, for tidiness.
                self.popen.send_signal(signal.SIGCONT)
                self.popen.kill()
            self.popen.wait(timeout=10)
        finally:
            self._stderr.close()


@dataclasses.dataclass
class Server:
    proc: Proc
    port: int

    @property
    def address(self) -> str:
        return f"localhost:{self.port}"

    @property
    def target(self) -> str:
        return f"grpc://localhost:{self.port}"


class Processes:
    """Starts dispatchers, workers and client scripts; ``close`` kills every one still running."""

    def __init__(self, tmp_dir: Path):
        self.tmp_dir = Path(tmp_dir)
        self.env = subprocess_env()
        self.procs: list[Proc] = []

    def spawn(self, *args: str, name: str = "proc", cwd: Optional[Path] = None, env: Optional[dict] = None) -> Proc:
        path = self.tmp_dir / f"{len(self.procs):02d}-{name}.stderr"
        proc = Proc([sys.executable, *args], env or self.env, path, cwd)
        self.procs.append(proc)
        return proc

    def dispatcher(self, *flags: str, port: int = 0, work_dir: Optional[Path] = None,
                   wait: bool = True, defaults: bool = False) -> Server:
        """``defaults=True``: without DISPATCHER_FLAGS, so the dispatcher runs with its own timeouts."""
        args = ["-m", "dataservice", "dispatcher", "--port", str(port), *(() if defaults else DISPATCHER_FLAGS),
                *flags]
        if work_dir is not None:
            args += ["--fault-tolerant", "--work-dir", str(work_dir)]
        proc = self.spawn(*args, name="dispatcher")
        if not wait:
            return Server(proc, port)
        return self.await_dispatcher(Server(proc, port))

    def await_dispatcher(self, server: Server) -> Server:
        return self._await_listening(server, r"^dispatcher listening on grpc://localhost:(\d+)(?: \(TLS[^)]*\))?$")

    @staticmethod
    def _await_listening(server: Server, pattern: str) -> Server:
        """Waits for the server's "listening" line (group 1: its port); says what holds the port if none comes."""
        try:
            match = server.proc.wait_for_line(pattern)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{sockets_on(server.port)}") from None
        server.port = int(match.group(1))
        return server

    def worker(self, dispatcher_port: int, *flags: str, port: int = 0, wait: bool = True,
               defaults: bool = False) -> Server:
        """``defaults=True``: without WORKER_FLAGS, so the worker heartbeats at its own interval."""
        # The advertised address keeps the bound port, so a worker restarted with --port P has
        # the same address as before.
        proc = self.spawn("-m", "dataservice", "worker", "--dispatcher", f"localhost:{dispatcher_port}",
                          "--port", str(port), "--worker-address", "localhost:%port%",
                          *(() if defaults else WORKER_FLAGS), *flags, name="worker")
        server = Server(proc, port)
        return self.await_worker(server) if wait else server

    def await_worker(self, server: Server) -> Server:
        return self._await_listening(server, r"^worker listening on localhost:(\d+) ")

    def workers(self, dispatcher_port: int, n: int, defaults: bool = False) -> list[Server]:
        """``n`` workers started at once (their start-ups overlap)."""
        servers = [self.worker(dispatcher_port, wait=False, defaults=defaults) for _ in range(n)]
        return [self.await_worker(s) for s in servers]

    def worker_processes(self, dispatcher_port: int, num_processes: int, *flags: str, port: int = 0,
                         wait: bool = True) -> "WorkerProcessGroup":
        """``dataservice worker --processes N``: a supervisor and its N worker processes."""
        proc = self.spawn("-m", "dataservice", "worker", "--dispatcher", f"localhost:{dispatcher_port}",
                          "--port", str(port), "--processes", str(num_processes), *WORKER_FLAGS, *flags,
                          name="supervisor")
        group = WorkerProcessGroup(proc, num_processes)
        if wait:
            group.await_start()
        return group

    def python(self, code: str, *args: str, name: str = "client") -> Proc:
        """``python -c code args...``."""
        return self.spawn("-c", code, *args, name=name)

    def status(self, dispatcher_port: int, timeout_s: float = 30.0, token_file: Optional[str] = None) -> dict:
        """``python -m dataservice status --json`` (with ``--auth-token-file``, for a cluster with a token)."""
        auth = ["--auth-token-file", token_file] if token_file else []
        result = subprocess.run([sys.executable, "-m", "dataservice", "status", "--dispatcher",
                                 f"localhost:{dispatcher_port}", "--json", *auth], capture_output=True, text=True,
                                env=self.env, cwd=REPO, timeout=timeout_s)
        assert result.returncode == 0, f"status failed ({result.returncode}): {result.stderr}"
        return json.loads(result.stdout)

    def close(self) -> None:
        for proc in reversed(self.procs):
            try:
                proc.cleanup()
            except Exception:  # clean up the others regardless
                pass

    def __enter__(self) -> "Processes":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclasses.dataclass
class WorkerProcessGroup:
    """A ``dataservice worker --processes N`` supervisor; ``await_start`` fills in the ports and pids
    (in process order) from its summary line."""

    proc: Proc
    num_processes: int
    ports: list[int] = dataclasses.field(default_factory=list)
    pids: list[int] = dataclasses.field(default_factory=list)

    @property
    def addresses(self) -> list[str]:
        return [f"localhost:{port}" for port in self.ports]

    def await_start(self, timeout_s: float = START_TIMEOUT_S) -> "WorkerProcessGroup":
        summary = self.proc.wait_for_line(rf"^{self.num_processes} worker processes started \(dispatcher \S+; "
                                          rf"ports ([\d, ]+); pids ([\d, ]+)\)$", timeout_s)
        self.ports = [int(p) for p in summary.group(1).split(", ")]
        self.pids = [int(p) for p in summary.group(2).split(", ")]
        listening = {int(m.group(1)) for line in self.proc.lines
                     if (m := re.match(r"^worker listening on localhost:(\d+) ", line))}
        assert listening == set(self.ports) and len(self.ports) == self.num_processes, self.proc.lines
        return self


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (Linux: /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def child_pids(pid: int) -> set[int]:
    """The live children of process ``pid`` (Linux: /proc)."""
    children = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            children.add(int(entry))
    return children


def run_cli(env: dict, *args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess:
    """``python -m dataservice args...`` to completion."""
    return subprocess.run([sys.executable, "-m", "dataservice", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=timeout_s)


def poll_status(env: dict, port: int, predicate: Callable[[dict], bool], what: str, timeout_s: float = 20.0) -> dict:
    """Runs ``dataservice status --json`` until ``predicate`` holds; each run takes long enough
    that no sleep is needed between them."""
    deadline = time.monotonic() + timeout_s
    status: dict = {}
    while time.monotonic() < deadline:
        result = run_cli(env, "status", "--dispatcher", f"localhost:{port}", "--json")
        assert result.returncode == 0, result.stderr
        status = json.loads(result.stdout)
        if predicate(status):
            return status
    raise AssertionError(f"status never showed {what} within {timeout_s} s; last: {status}")


def assert_clean_exit(proc: Proc, sig: int) -> None:
    """``sig`` makes ``proc`` exit with code 0, without a traceback."""
    code = proc.stop(sig)
    assert code == 0, f"{proc.args} exited with {code} on {signal.Signals(sig).name}: {proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr


def registered_workers(dispatcher_port: int, timeout_s: float = 5.0) -> set[str]:
    """The worker addresses the dispatcher knows (in-process GetStatus: cheaper than the CLI)."""
    from dataservice.service.dispatcher_client import DispatcherClient

    client = DispatcherClient(f"localhost:{dispatcher_port}", timeout_ms=int(timeout_s * 1000))
    try:
        return {w.address for w in client.get_status(timeout_s=timeout_s).workers}
    finally:
        client.close()


def wait_for_workers(dispatcher_port: int, addresses: Iterable[str], timeout_s: float = 20.0) -> None:
    wanted = set(addresses)
    wait_until(lambda: wanted <= registered_workers(dispatcher_port), timeout_s,
               f"workers {sorted(wanted)} to register with the dispatcher on port {dispatcher_port}",
               interval_s=0.05)


def wait_for_client_threads(timeout_s: float = 5.0) -> list[str]:
    """Waits (up to ``timeout_s``) for this process's reader threads (heartbeat, fetchers) to end, so
    that an exception in one is reported in the test that started it; the names of those still alive."""
    def alive() -> list[str]:
        return [t.name for t in threading.enumerate()
                if t.name.startswith(("dataservice-client-heartbeat", "dataservice-fetch"))]
    deadline = time.monotonic() + timeout_s
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive()


class BackgroundReader:
    """Iterates a dataset on a daemon thread, keeping every element (converted by ``convert``).

    ``count`` is how many were read so far; ``wait_for(k)`` waits until k were; ``join``
    waits for the end and raises what the iteration raised.
    """

    def __init__(self, dataset, convert: Callable[[Any], Any] = int, name: str = "reader"):
        self.items: list = []
        self.error: Optional[BaseException] = None
        self.started = threading.Event()
        self.done = threading.Event()
        self._dataset = dataset
        self._convert = convert
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            iterator = iter(self._dataset)
            self.started.set()
            for element in iterator:
                self.items.append(self._convert(element))
        except BaseException as exc:  # the test thread looks at it
            self.error = exc
        finally:
            self.started.set()
            self.done.set()

    @property
    def count(self) -> int:
        return len(self.items)

    def wait_for(self, k: int, timeout_s: float, what: str = "") -> None:
        def enough() -> bool:
            if self.done.is_set() and self.count < k:
                raise AssertionError(f"the reader ended after {self.count} elements, before {k}"
                                     f"{' (' + what + ')' if what else ''}: {self.error!r}")
            return self.count >= k
        wait_until(enough, timeout_s, f"the reader to read {k} elements (it read {self.count}) {what}".strip())

    def join(self, timeout_s: float) -> list:
        """Every element, once the iteration ends; raises the iteration's exception."""
        if not self.done.wait(timeout_s):
            raise AssertionError(f"the reader did not finish within {timeout_s} s (read {self.count} elements)")
        if self.error is not None:
            raise self.error
        return self.items


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    """A ``Processes`` whose every process is killed after the test; registered in tests/conftest.py."""
    processes = Processes(tmp_path)
    try:
        yield processes
    finally:
        processes.close()
        # Readers end their threads once the read ends or fails: one left running, or an exception in
        # one, is reported here, in the test that caused it, rather than in a later one.
        leftover = wait_for_client_threads()
        assert leftover == [], f"reader threads still running after the test: {leftover}"
        for proc in processes.procs:  # shown by pytest when the test failed
            print(f"===== {' '.join(proc.args[1:])} (exit {proc.popen.returncode})\n"
                  f"stdout: {''.join(proc.lines[-10:])}\nstderr (tail): {proc.stderr[-3000:]}")


# --- record files read across splits (tests/test_split_groups.py; pickled by reference) ----------

#: A record's value is ``file * RECORD_FILE_STRIDE + index``: which file and which record.
RECORD_FILE_STRIDE = 1_000_000


def write_record_files(directory: Path, num_files: int, records_per_file: int) -> str:
    """``num_files`` TFRecord files ``part-NN.tfrecord`` of ``records_per_file`` records each, written by
    our TFRecordWriter; record k of file f is ``b"f:k"``. Returns the glob pattern matching them."""
    from dataservice import TFRecordWriter

    for f in range(num_files):
        with TFRecordWriter(Path(directory) / f"part-{f:02d}.tfrecord") as writer:
            for k in range(records_per_file):
                writer.write(f"{f}:{k}".encode())
    return str(Path(directory) / "part-*.tfrecord")


def decode_record(record: bytes) -> int:
    """``b"f:k"`` as ``f * RECORD_FILE_STRIDE + k``."""
    f, k = record.split(b":")
    return int(f) * RECORD_FILE_STRIDE + int(k)


def slow_decode_record(record: bytes) -> int:
    """``decode_record``, as slow as ``slow_identity``: a read is mid-way when a kill comes."""
    return slow_identity(decode_record(record))


def interleaved_shuffled_records(pattern: str, cycle_length: int = 4, buffer_size: int = 2_000, seed: int = 7,
                                 slow: bool = True):
    """The files matching ``pattern`` interleaved ``cycle_length`` at a time, decoded and shuffled with a
    seed: in distributed_epoch a worker runs it over a group of files (Dataset.split_groups)."""
    from dataservice import Dataset, TFRecordDataset

    return (Dataset.list_files(pattern)
            .interleave(TFRecordDataset, cycle_length=cycle_length)
            .map(slow_decode_record if slow else decode_record)
            .shuffle(buffer_size, seed=seed))
