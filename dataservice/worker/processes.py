"""Several worker processes on one host under one supervisor: ``dataservice worker --processes N``.

A pure-Python pipeline runs on one core per process (the GIL), so a host with N
cores serves a CPU-bound pipeline up to N times faster with N worker processes.
``WorkerProcesses.run`` is the supervisor. It starts N ordinary workers
(``python -m dataservice worker ... --processes 1``, see ``worker_command``), each
registering with the dispatcher as a worker of its own — in ``parallel_epochs``
each one produces the whole dataset — passes their "worker listening on ..."
lines through to its stdout, prints one summary line (the ports and pids, in process
order), and then:

* **ports**: with ``port=0`` each process picks a free port; with ``port=P`` they
  get P, P+1, ..., P+N-1 (the same for a non-zero ``data_transfer_port``);
* **a process that cannot start** (it exits before its listening line, or prints
  none within ``start_timeout_s``) fails the start: the others are stopped and
  ``run`` raises ``WorkerProcessesError``. The process's own error is already on
  stderr, which the processes share with the supervisor;
* **a process that dies later** (exits, or is killed) is restarted on the port it
  had, after a backoff (``restart_backoff_s``, doubling), with a warning; the
  dispatcher sees a worker restarted on the same address. One that dies more than
  ``max_restarts`` times within ``restart_window_s`` makes the supervisor give up:
  it stops the others and ``run`` raises ``WorkerProcessesError``;
* **stopping**: when the ``stop`` event is set (the CLI sets it on SIGTERM or
  SIGINT) every process gets SIGTERM, and SIGKILL if it still runs ``stop_grace_s``
  later; ``run`` returns once all are reaped;
* **a supervisor that is killed** leaves no orphans: each process calls
  ``follow_supervisor`` as it starts, which on Linux asks the kernel for a SIGTERM
  when the supervisor dies (``PR_SET_PDEATHSIG``) and elsewhere polls ``getppid``.

The processes run in a process group of their own, so a Ctrl-C in a terminal
reaches only the supervisor, which stops them with one SIGTERM each.

Example::

    >>> stop = threading.Event()             # set it (from a signal handler) to stop them
    >>> group = WorkerProcesses(worker_command(["--dispatcher", "localhost:5050"]), num_processes=2,
    ...                         port=5051, dispatcher_address="localhost:5050")
    >>> group.run(stop)
    worker listening on localhost:5051 (dispatcher localhost:5050)
    worker listening on localhost:5052 (dispatcher localhost:5050)
    2 worker processes started (dispatcher localhost:5050; ports 5051, 5052; pids 4121, 4122)
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Optional, Sequence, TextIO

__all__ = ["WorkerProcesses", "WorkerProcessesError", "worker_command", "available_cpus", "follow_supervisor",
           "SUPERVISOR_PID_ENV", "LISTENING_LINE"]

log = logging.getLogger("dataservice.worker.processes")

#: The line a worker prints once it listens (``dataservice.cli``); group 1 is the port.
LISTENING_LINE = re.compile(r"^worker listening on [^\s:]+:(\d+)\b")
#: Set by the supervisor in each process's environment: the supervisor's pid (see ``follow_supervisor``).
SUPERVISOR_PID_ENV = "DATASERVICE_SUPERVISOR_PID"
#: How often the supervisor looks at its processes (a death is noticed within this).
POLL_INTERVAL_S = 0.05
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


#: A process group of their own (in the supervisor's session): a terminal's Ctrl-C reaches only the
#: supervisor, which stops them with one SIGTERM each. Not a session of their own (``setsid``): with
#: Linux's autogroup scheduling that would also give them one share of the CPU between them.
#: (Python 3.10 has no safe way to do it; there Ctrl-C reaches them too, and stops them all the same.)
_OWN_PROCESS_GROUP: dict = {"process_group": 0} if sys.version_info >= (3, 11) else {}


class WorkerProcessesError(RuntimeError):
    """A worker process could not start, or kept dying; every process has been stopped."""


def available_cpus() -> int:
    """The cores this process may run on (its affinity mask), else the machine's core count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def worker_command(flags: Sequence[str], python: str = sys.executable) -> list[str]:
    """The command of one worker process: ``python -m dataservice worker FLAGS --processes 1``.

    ``flags`` are the worker's flags other than ``--port`` and ``--data-transfer-port``,
    which ``WorkerProcesses`` appends for each process.
    """
    return [python, "-m", "dataservice", "worker", *flags, "--processes", "1"]


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class _Incarnation:
    """One run of a worker process: its Popen and, once it printed its listening line, its port."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.reader: Optional[threading.Thread] = None  # passes its stdout through
        self.started_at = time.monotonic()
        self.listening = threading.Event()
        self.port: Optional[int] = None
        self.reported = False  # whether the supervisor has seen it listening

    def exit_code(self) -> Optional[int]:
        """The exit code once it has exited (after its last stdout line has been read), else None."""
        code = self.popen.poll()
        if code is not None and self.reader is not None:
            self.reader.join(timeout=1.0)  # a listening line printed just before the exit still counts
        return code


class _Slot:
    """Worker process number ``index``: its ports and its restart history."""

    def __init__(self, index: int, port: int, data_transfer_port: int):
        self.index = index
        self.port = port  # 0 until the first run says which port it picked; then kept for restarts
        self.data_transfer_port = data_transfer_port
        self.run: Optional[_Incarnation] = None
        self.deaths: collections.deque[float] = collections.deque()
        self.restart_at = 0.0

    def describe(self) -> str:
        where = f"port {self.port}" if self.port else "port not yet known"
        pid = f"pid {self.run.popen.pid}, " if self.run is not None else ""
        return f"worker process {self.index} ({pid}{where})"


class WorkerProcesses:
    """Starts, supervises, restarts and stops ``num_processes`` worker processes; see the module docstring.

    ``command`` is a worker's command without its ports (``worker_command``); process
    ``i`` runs ``command + ["--port", P_i, "--data-transfer-port", D_i]``.
    """

    def __init__(self, command: Sequence[str], num_processes: int, port: int = 0, data_transfer_port: int = 0,
                 dispatcher_address: Optional[str] = None, out: Optional[TextIO] = None,
                 start_timeout_s: float = 60.0, stop_grace_s: float = 10.0, max_restarts: int = 5,
                 restart_window_s: float = 60.0, restart_backoff_s: float = 0.25, max_backoff_s: float = 10.0):
        if num_processes < 1:
            raise ValueError(f"num_processes must be >= 1, got {num_processes}")
        for name, first in (("port", port), ("data_transfer_port", data_transfer_port)):
            if first and first + num_processes - 1 > 65535:
                raise ValueError(f"{name} {first} with {num_processes} processes needs ports up to "
                                 f"{first + num_processes - 1}, beyond 65535")
        self._command = list(command)
        self._slots = [_Slot(i, port + i if port else 0, data_transfer_port + i if data_transfer_port else 0)
                       for i in range(num_processes)]
        self._dispatcher_address = dispatcher_address
        self._out = out
        self._out_lock = threading.Lock()
        self.start_timeout_s = start_timeout_s
        self.stop_grace_s = stop_grace_s
        self.max_restarts = max_restarts
        self.restart_window_s = restart_window_s
        self.restart_backoff_s = restart_backoff_s
        self.max_backoff_s = max_backoff_s

    @property
    def pids(self) -> list[int]:
        """The pids of the processes running now (in process order)."""
        return [s.run.popen.pid for s in self._slots if s.run is not None and s.run.popen.poll() is None]

    @property
    def ports(self) -> list[int]:
        """Each process's port (0 for one that has not said yet)."""
        return [s.port for s in self._slots]

    # --- the supervisor ---------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Starts the processes, restarts those that die, and stops them all once ``stop`` is set.

        Must run on a thread that lives as long as the processes (in the CLI, the main
        thread): on Linux a process is sent SIGTERM when the thread that started it ends.
        Raises ``WorkerProcessesError`` (after stopping every process) when one cannot
        start or keeps dying.
        """
        try:
            for slot in self._slots:
                self._spawn(slot)
            if not self._await_start(stop):
                return
            n = len(self._slots)
            where = f"dispatcher {self._dispatcher_address}; " if self._dispatcher_address else ""
            self._write(f"{n} worker process{'es' if n != 1 else ''} started ({where}"
                        f"ports {', '.join(map(str, self.ports))}; pids {', '.join(map(str, self.pids))})\n")
            self._supervise(stop)
        finally:
            self._stop_all()

    def _await_start(self, stop: threading.Event) -> bool:
        """Waits until every process listens (True) or ``stop`` is set (False)."""
        deadline = time.monotonic() + self.start_timeout_s
        while not stop.is_set():
            waiting = []
            for slot in self._slots:
                run = slot.run
                code = run.exit_code()
                if not run.listening.is_set():
                    if code is not None:
                        raise WorkerProcessesError(f"cannot start: {slot.describe()} {_describe_exit(code)} "
                                                   f"before it started listening")
                    waiting.append(slot)
                elif not run.reported:
                    self._listening(slot)
            if not waiting:
                return True
            if time.monotonic() > deadline:
                raise WorkerProcessesError(
                    f"cannot start: {', '.join(s.describe() for s in waiting)} did not start listening within "
                    f"{self.start_timeout_s:g} s")
            stop.wait(POLL_INTERVAL_S)
        return False

    def _supervise(self, stop: threading.Event) -> None:
        while not stop.wait(POLL_INTERVAL_S):
            now = time.monotonic()
            for slot in self._slots:
                run = slot.run
                if run is None:
                    if now >= slot.restart_at:
                        self._spawn(slot)
                    continue
                code = run.exit_code()
                if code is None:
                    if run.listening.is_set():
                        if not run.reported:
                            self._listening(slot)
                        continue
                    if now - run.started_at <= self.start_timeout_s:
                        continue
                    log.warning("%s did not start listening within %g s; killing it", slot.describe(),
                                self.start_timeout_s)
                    run.popen.kill()
                    code = run.popen.wait()
                self._died(slot, code, now)

    def _listening(self, slot: _Slot) -> None:
        run = slot.run
        run.reported = True
        if slot.deaths:
            log.info("worker process %d restarted: pid %d listening on port %s", slot.index, run.popen.pid, run.port)
        if run.port is not None and not slot.port:
            slot.port = run.port

    def _died(self, slot: _Slot, code: int, now: float) -> None:
        what = f"{slot.describe()} {_describe_exit(code)}"
        slot.run = None
        slot.deaths.append(now)
        while slot.deaths and slot.deaths[0] < now - self.restart_window_s:
            slot.deaths.popleft()
        if len(slot.deaths) > self.max_restarts:
            raise WorkerProcessesError(f"{what}: it died {len(slot.deaths)} times within "
                                       f"{self.restart_window_s:g} s; giving up")
        delay = min(self.restart_backoff_s * 2 ** (len(slot.deaths) - 1), self.max_backoff_s)
        port = f"port {slot.port}" if slot.port else "a free port"
        log.warning("%s; restarting it on %s in %.2f s", what, port, delay)
        slot.restart_at = now + delay

    # --- processes ----------------------------------------------------------------------
    def _spawn(self, slot: _Slot) -> None:
        command = self._command + ["--port", str(slot.port), "--data-transfer-port", str(slot.data_transfer_port)]
        env = dict(os.environ)
        env[SUPERVISOR_PID_ENV] = str(os.getpid())
        try:
            # stderr is shared: the processes' logs and errors go where the supervisor's go.
            popen = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                                     env=env, **_OWN_PROCESS_GROUP)
        except OSError as exc:
            raise WorkerProcessesError(f"cannot start worker process {slot.index} ({' '.join(command)}): "
                                       f"{exc}") from exc
        run = _Incarnation(popen)
        run.reader = threading.Thread(target=self._pump, args=(run,), daemon=True,
                                      name=f"dataservice-worker-process-{slot.index}")
        run.reader.start()
        slot.run = run

    def _pump(self, run: _Incarnation) -> None:
        """Passes the process's stdout through; notes its port from its listening line."""
        try:
            for line in run.popen.stdout:
                self._write(line)
                if not run.listening.is_set() and (match := LISTENING_LINE.match(line)):
                    run.port = int(match.group(1))
                    run.listening.set()
        except (OSError, ValueError):
            pass
        finally:
            try:
                run.popen.stdout.close()
            except OSError:
                pass

    def _write(self, text: str) -> None:
        with self._out_lock:
            out = self._out if self._out is not None else sys.stdout
            try:
                out.write(text)
                out.flush()
            except (OSError, ValueError):  # nobody reads our stdout any more; keep supervising
                pass

    def _stop_all(self) -> None:
        """SIGTERM to every running process; SIGKILL to those still running ``stop_grace_s`` later."""
        runs = [s.run for s in self._slots if s.run is not None]
        for slot in self._slots:
            slot.run = None
        for run in runs:
            if run.popen.poll() is None:
                try:
                    run.popen.send_signal(signal.SIGTERM)
                except OSError:
                    pass
        deadline = time.monotonic() + self.stop_grace_s
        for run in runs:
            try:
                run.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker process pid %d did not stop within %g s of SIGTERM; killing it",
                            run.popen.pid, self.stop_grace_s)
                run.popen.kill()
                run.popen.wait()
        for run in runs:
            if run.reader is not None:
                run.reader.join(timeout=1.0)  # pass through what they printed last


# --- in each worker process ---------------------------------------------------------------

def follow_supervisor() -> bool:
    """In a worker process started by ``WorkerProcesses``: stop when the supervisor dies.

    Returns whether this process has a supervisor; does nothing if not. Otherwise the process gets
    SIGTERM — which the CLI turns into a clean shutdown — when its supervisor dies,
    even by SIGKILL: on Linux through ``prctl(PR_SET_PDEATHSIG)``, elsewhere by a
    thread that polls ``os.getppid()`` every second.
    """
    text = os.environ.pop(SUPERVISOR_PID_ENV, None)  # not inherited by what the pipelines start
    if not text:
        return False
    try:
        supervisor = int(text)
    except ValueError:
        return False
    if _set_parent_death_signal(signal.SIGTERM):
        if os.getppid() != supervisor:  # it died before the prctl call
            os.kill(os.getpid(), signal.SIGTERM)
    else:
        threading.Thread(target=_watch_parent, args=(supervisor,), name="dataservice-supervisor-watch",
                         daemon=True).start()
    return True


def _set_parent_death_signal(signum: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(supervisor: int, interval_s: float = 1.0) -> None:
    while os.getppid() == supervisor:
        time.sleep(interval_s)
    log.warning("the supervisor (pid %d) is gone; stopping", supervisor)
    os.kill(os.getpid(), signal.SIGTERM)
