"""How ``import dataservice`` imports grpc (``dataservice.grpc_startup``): gRPC's fork handlers off in
``dataservice dispatcher`` alone, whose fault-tolerant checkpoints are written by a forked child, and
the variables set only for the import. Each case is a fresh interpreter: grpc reads them once.

Example::

    $ python -m pytest tests/test_grpc_startup.py
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.processes import subprocess_env

#: Run with ``sys.argv`` as the case sets it, before dataservice (and so grpc) is imported.
PROBE = """
import json, os, sys
sys.argv = {argv!r}
import dataservice
from dataservice import grpc_startup
from dataservice.dispatcher import forked_writes
print(json.dumps({{"off": grpc_startup.FORK_HANDLERS_OFF, "fork": forked_writes.fork_available(),
                  "left": {{k: os.environ.get(k) for k in ("GRPC_ENABLE_FORK_SUPPORT", "GRPC_VERBOSITY")}}}}))
"""


def probe(argv: list[str], **env: str) -> dict:
    base = {k: v for k, v in subprocess_env().items() if k not in ("GRPC_ENABLE_FORK_SUPPORT", "GRPC_VERBOSITY")}
    done = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], env={**base, **env},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("argv", [["/usr/local/bin/dataservice", "dispatcher", "--port", "0"],
                                  ["-m", "dispatcher", "--port", "0"]],  # as ``python -m dataservice`` has it
                         ids=["console-script", "python-m"])
def test_the_dispatcher_command_imports_grpc_without_fork_handlers(argv):
    assert probe(argv) == {"off": True, "fork": True,
                           "left": {"GRPC_ENABLE_FORK_SUPPORT": None, "GRPC_VERBOSITY": None}}


@pytest.mark.parametrize("argv", [["/usr/local/bin/dataservice", "worker", "--dispatcher", "localhost:5050"],
                                  ["train.py", "dispatcher"], ["-c"]],
                         ids=["worker-command", "a-users-script", "python-c"])
def test_other_programs_keep_grpcs_default_and_write_checkpoints_under_the_lock(argv):
    assert probe(argv) == {"off": False, "fork": False,
                           "left": {"GRPC_ENABLE_FORK_SUPPORT": None, "GRPC_VERBOSITY": None}}


def test_a_users_setting_is_kept_and_decides():
    assert probe(["train.py"], GRPC_ENABLE_FORK_SUPPORT="false")["fork"] is True
    on = probe(["/usr/local/bin/dataservice", "dispatcher"], GRPC_ENABLE_FORK_SUPPORT="1")
    assert on == {"off": False, "fork": False, "left": {"GRPC_ENABLE_FORK_SUPPORT": "1", "GRPC_VERBOSITY": None}}
