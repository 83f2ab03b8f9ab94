"""Writing a file from a forked copy of the dispatcher, so the lock is held only for the fork.

A checkpoint must show the state at one sequence number, and the state changes under the
dispatcher's lock. Building it takes about 0.1 s at 2,000 workers and 10,000 readers; the
journal used to do that under the lock, and every RPC waited. ``fork()`` gives a child whose
memory is the parent's at that instant (copy-on-write, as Redis's BGSAVE does), so the
child can build and write the checkpoint at leisure while the parent goes on. The lock is
held for the fork itself: 6-13 ms for a dispatcher of 190 MB (2,000 workers, 10,000 readers),
which copies its page tables. The parent's pages are copied as it writes them while the child
runs: about 18,000 minor faults per checkpoint there.

The child closes every file descriptor but the standard streams and its error pipe, then runs
nothing but ``write`` and ``os._exit``: no gRPC, no logging, no locks other
threads of the parent might have held at the fork, no atexit handlers, no garbage collection
(which would touch, and so copy, every page). Its signal handlers are reset to the defaults,
so that a SIGTERM meant for the parent's group stops it without waking the parent's event loop.
It runs at the lowest priority (nice 19), on the CPUs it inherited: where the dispatcher has one
CPU, the child gets what the RPCs leave. It reports a failure as text on a pipe.

gRPC's fork handlers must be off (``GRPC_ENABLE_FORK_SUPPORT=0`` when grpc was imported, which
``dataservice dispatcher`` sets: ``dataservice.grpc_startup``): with them on, gRPC restarts its
threads in the child, and they crashed it. Where they are on, or ``os.fork`` does not exist,
``fork_available()`` is False and the journal writes its checkpoints under the lock, as before.

Example::

    >>> child = ForkedWrite.start(lambda: write_file(path, state.to_updates()))
    >>> error = child.wait()      # None once the child wrote it; else what went wrong
"""

from __future__ import annotations

import gc
import os
import signal
import warnings
from typing import Callable, Optional

from dataservice import grpc_startup

__all__ = ["ForkedWrite", "fork_available"]

# A child's error text is cut to this: enough for an OSError and its path.
_MAX_ERROR_BYTES = 4096


def fork_available() -> bool:
    """Whether a child may be forked: the platform can fork (Linux and macOS can; Windows cannot),
    and gRPC was imported with its fork handlers off (see the module docstring)."""
    return hasattr(os, "fork") and grpc_startup.FORK_HANDLERS_OFF


class ForkedWrite:
    """A child process running one write; ``wait`` reaps it. See the module docstring."""

    def __init__(self, pid: int, error_fd: int):
        self.pid = pid
        self._error_fd = error_fd
        self._result: Optional[tuple[Optional[str]]] = None

    @classmethod
    def start(cls, write: Callable[[], None]) -> "ForkedWrite":
        """Forks; the child calls ``write()`` and exits. OSError if the fork failed (no memory,
        too many processes): the caller writes in-process instead."""
        read_fd, write_fd = os.pipe()
        try:
            with warnings.catch_warnings():
                # Python 3.12+ (and JAX, when a program imported it) warn that fork() in a threaded process
                # may deadlock the child: this child takes no lock another thread could hold, and runs no
                # JAX (see the module docstring).
                warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks", category=DeprecationWarning)
                warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
                pid = os.fork()
        except OSError:
            os.close(read_fd)
            os.close(write_fd)
            raise
        if pid == 0:  # the child
            _run_child(write, write_fd)  # never returns
        os.close(write_fd)
        return cls(pid, read_fd)

    def wait(self) -> Optional[str]:
        """Blocks until the child exits; None if its write succeeded, else what went wrong. Idempotent."""
        if self._result is None:
            chunks = []
            try:
                while True:  # until the child's end of the pipe closes: it exited
                    chunk = os.read(self._error_fd, _MAX_ERROR_BYTES)
                    if not chunk:
                        break
                    chunks.append(chunk)
            finally:
                os.close(self._error_fd)
            _, status = os.waitpid(self.pid, 0)
            error = b"".join(chunks).decode("utf-8", "replace")
            if os.WIFSIGNALED(status):
                error = error or f"the checkpoint's child process was killed by signal {os.WTERMSIG(status)}"
            elif os.WEXITSTATUS(status) != 0:
                error = error or f"the checkpoint's child process exited with status {os.WEXITSTATUS(status)}"
            self._result = (error or None,)
        return self._result[0]

    def kill(self) -> None:
        """Stops the child now (a journal that failed or closes does not want its checkpoint)."""
        if self._result is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):
        return 65536


def _run_child(write: Callable[[], None], error_fd: int) -> None:
    code = 1
    try:
        gc.disable()
        # Only standard streams and the error pipe stay open: a copy of the listening sockets in the
        # child would keep the port (SO_REUSEPORT: and take its connections) if the parent died first.
        os.closerange(3, error_fd)
        os.closerange(error_fd + 1, _max_fd())
        try:
            signal.set_wakeup_fd(-1)  # the parent's event loop listens on that socket
        except (ValueError, OSError):
            pass
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        try:
            # Background work: on a dispatcher with one CPU (pinned, or a container's quota) the child
            # would otherwise take half of it from the RPCs while it runs.
            os.nice(19)
        except OSError:
            pass
        write()
        code = 0
    except BaseException as exc:  # noqa: BLE001 - everything is reported, nothing may escape the child
        try:
            os.write(error_fd, f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")[:_MAX_ERROR_BYTES])
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)
