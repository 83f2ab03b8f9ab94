"""How ``import dataservice`` imports grpc: quietly, and in a dispatcher without gRPC's fork handlers.

grpcio reads its settings from the environment once, when ``grpc`` is first imported (measured
with 1.85: setting them later changes nothing), so ``dataservice/__init__.py`` calls
``import_grpc()`` before anything of ours imports grpc. Each variable is set only for that
import and removed again, so programs this process starts get gRPC's defaults, and a variable
the user set is left as it is. If grpc was imported before dataservice, gRPC's own defaults apply.

- ``GRPC_VERBOSITY=NONE`` keeps gRPC's C-core log lines (``E1122 ... add_port.cc:83] Failed to add
  port``, fork-handler notices, absl's "All log messages before absl::InitializeLog()") off users'
  terminals: every failure they describe reaches the user as one of our exceptions, with a
  message of its own. Not set when the user set ``GRPC_VERBOSITY`` or ``GRPC_TRACE``.
- ``GRPC_ENABLE_FORK_SUPPORT=0``, in the ``dataservice dispatcher`` command only. gRPC's fork
  support (on by default in grpcio 1.85's core) restarts gRPC's threads in a forked child; the
  fault-tolerant dispatcher forks a child that writes its checkpoint and never uses gRPC
  (``dispatcher.forked_writes``), and those threads crashed it (SIGSEGV in 19 of 39 children,
  measured). Other processes keep the default: a user's forked DataLoader workers may open
  channels of their own.

``FORK_HANDLERS_OFF`` says whether gRPC was imported with its fork handlers off: only then may a
process with gRPC servers fork a child that runs Python.

Example::

    $ GRPC_ENABLE_FORK_SUPPORT=0 python my_dispatcher.py   # an embedded DispatchServer that forks its checkpoints
"""

from __future__ import annotations

import os
import sys

__all__ = ["FORK_HANDLERS_OFF", "import_grpc"]

#: gRPC was imported (by ``import_grpc``) with ``GRPC_ENABLE_FORK_SUPPORT`` false.
FORK_HANDLERS_OFF = False

# The values gRPC's core reads as false (absl::SimpleAtob).
_FALSE = frozenset({"0", "false", "f", "no", "n"})


def _runs_the_dispatcher_command() -> bool:
    """Whether this process is ``dataservice dispatcher`` or ``python -m dataservice dispatcher``
    (while ``-m`` imports the package, ``sys.argv[0]`` is "-m")."""
    argv = sys.argv
    return len(argv) >= 2 and argv[1] == "dispatcher" and (
        argv[0] == "-m" or os.path.basename(argv[0]) in ("dataservice", "__main__.py"))


def import_grpc() -> None:
    """Imports grpc with the settings above (see the module docstring); a no-op once grpc is imported."""
    global FORK_HANDLERS_OFF
    if "grpc" in sys.modules:
        return
    settings = {}
    if "GRPC_VERBOSITY" not in os.environ and "GRPC_TRACE" not in os.environ:
        settings["GRPC_VERBOSITY"] = "NONE"
    if "GRPC_ENABLE_FORK_SUPPORT" not in os.environ and _runs_the_dispatcher_command():
        settings["GRPC_ENABLE_FORK_SUPPORT"] = "0"
    os.environ.update(settings)
    try:
        import grpc  # noqa: F401
        FORK_HANDLERS_OFF = os.environ.get("GRPC_ENABLE_FORK_SUPPORT", "").strip().lower() in _FALSE
    finally:
        for name in settings:
            os.environ.pop(name, None)
