"""What the ``dataservice`` command's cheap commands import: ``--version``, ``health`` and ``status``
import neither the pipeline library (numpy, cloudpickle, ``dataservice.data``) nor the servers nor the
client, so that a container healthcheck run every few seconds costs a tenth of a second, not half a
second (issue 28). ``import dataservice`` imports its public names on first use (PEP 562).

Each command runs for real in a process of its own, as ``python -m dataservice ...`` does it and as the
installed console script does (``runpy``), and that process writes its ``sys.modules`` on exit: everything
imported, by any means (``-X importtime`` misses modules that ``importlib.import_module`` imports, as the
packages' PEP 562 ``__getattr__`` does). Behaviour, not time: the figures are in
``benchmarks/cli_startup.py``.

Example::

    $ python -m pytest tests/test_cli_startup.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import dataservice
from tests.processes import REPO, subprocess_env

#: Modules (and packages, with everything under them) that the cheap commands must not import.
HEAVY = ("numpy", "cloudpickle", "dataservice.data", "dataservice.client", "dataservice.dispatcher",
         "dataservice.worker", "dataservice.catalogue.builders", "dataservice.service.cross_memory")
#: The console script ``pip install`` makes from pyproject.toml's ``[project.scripts]``.
CONSOLE_SCRIPT = Path(sys.executable).parent / "dataservice"
ENTRY_POINTS = ["module", pytest.param("script", marks=pytest.mark.skipif(
    not CONSOLE_SCRIPT.exists(), reason="the dataservice console script is not installed beside this Python"))]


def run_with_imports(entry: str, *args: str, code: str = "") -> tuple[subprocess.CompletedProcess, set[str]]:
    """Runs ``dataservice args...`` (as ``python -m dataservice``, as the console script, or ``code``) in a
    new process; returns the result and the names in its ``sys.modules`` at exit."""
    run = {"module": "runpy.run_module('dataservice', run_name='__main__', alter_sys=True)",
           "script": f"sys.argv[0] = {str(CONSOLE_SCRIPT)!r}; runpy.run_path(sys.argv[0], run_name='__main__')",
           "code": code}[entry]
    with tempfile.TemporaryDirectory() as tmp:
        listing = Path(tmp) / "modules.json"
        driver = (f"import atexit, json, runpy, sys\n"
                  f"def record():\n"
                  f"    with open({str(listing)!r}, 'w') as f:\n"
                  f"        json.dump(sorted(sys.modules), f)\n"
                  f"atexit.register(record)\n"
                  f"{run}\n")
        result = subprocess.run([sys.executable, "-c", driver, *args], capture_output=True, text=True,
                                env=subprocess_env(), cwd=REPO, timeout=60)
        imported = set(json.loads(listing.read_text())) if listing.exists() else set()
    assert imported, f"the process recorded no modules: {result}"
    return result, imported


#: Light modules under a heavy package: the dispatcher's RPC statistics, whose long-poll methods ``status`` marks
#: (the package's ``__init__`` is a docstring).
LIGHT = ("dataservice.dispatcher", "dataservice.dispatcher.rpc_stats")


def heavy_among(imported: set[str]) -> list[str]:
    return sorted(name for name in imported if name not in LIGHT
                  and any(name == h or name.startswith(h + ".") for h in HEAVY))


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_version_imports_no_pipeline_library_no_server_and_no_protobuf(entry: str) -> None:
    result, imported = run_with_imports(entry, "--version")
    assert (result.returncode, result.stdout, result.stderr) == (0, f"dataservice {dataservice.__version__}\n", "")
    assert heavy_among(imported) == []
    # The parser is built whole (every command's flags), but the health check's protobuf modules and the
    # catalogue's builders are imported only by the commands that use them.
    assert "dataservice.catalogue.command" in imported and "dataservice.service.health_probe" in imported
    assert not {name for name in imported if name.startswith(("google.protobuf", "grpc_health.v1"))}


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_health_imports_no_pipeline_library(cluster, entry: str) -> None:
    for address, service in ((f"localhost:{cluster.port}", "dispatcher"),
                             (f"localhost:{cluster.workers[0].port}", "worker")):
        result, imported = run_with_imports(entry, "health", address, "--service", service)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"grpc://{address}: SERVING"), result.stdout
        assert heavy_among(imported) == []
        assert "grpc_health.v1.health_pb2" in imported  # the check did run here


@pytest.mark.slow
def test_an_unhealthy_answer_imports_no_pipeline_library_either() -> None:
    # The failure path probes the port (endpoint_probe) to say what is there.
    result, imported = run_with_imports("module", "health", "localhost:1", "--timeout-ms", "2000")
    assert result.returncode == 1
    assert result.stderr.startswith("dataservice health: error: nothing listens at localhost:1"), result.stderr
    assert heavy_among(imported) == []


@pytest.mark.slow
def test_status_imports_no_pipeline_library(cluster) -> None:
    result, imported = run_with_imports("module", "status", "--dispatcher", f"localhost:{cluster.port}", "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert len(status["workers"]) == 2
    assert status["rpc_latency_ms"]["WorkerHeartbeat"]["long_poll"] is True
    assert heavy_among(imported) == []


@pytest.mark.slow
def test_import_dataservice_imports_its_public_names_on_first_use() -> None:
    code = ("import dataservice\n"
            "assert callable(dataservice.data.experimental.group_by_window)\n"  # subpackages too, as before
            "assert dataservice.catalogue.features.Image is dataservice.catalogue.Image\n"
            "from dataservice import Dataset, distribute\n"
            "from dataservice.data.dataset import Dataset as Home\n"
            "assert Dataset is Home and dataservice.Dataset is Home\n"
            "assert distribute is dataservice.client.distribute.distribute\n"
            "assert set(dataservice.__all__) <= set(dir(dataservice))\n"
            "print([int(x) for x in Dataset.range(3).map(lambda x: x * 2)])\n")
    result, imported = run_with_imports("code", code=code)
    assert (result.returncode, result.stdout, result.stderr) == (0, "[0, 2, 4]\n", "")
    assert "dataservice.data.dataset" in imported and "numpy" in imported  # by the names' first use


@pytest.mark.slow
def test_import_dataservice_alone_imports_no_pipeline_library() -> None:
    result, imported = run_with_imports("code", code="import dataservice, dataservice.catalogue.command")
    assert result.returncode == 0, result.stderr
    assert heavy_among(imported) == []


def test_every_public_name_is_its_home_modules_object() -> None:
    # Pickles name classes and functions by their defining module; the package only re-exports them.
    import importlib

    for name, home in dataservice._PUBLIC_HOMES.items():
        assert getattr(dataservice, name) is getattr(importlib.import_module(home), name), name
    assert set(dataservice._PUBLIC_HOMES) | {"catalogue", "errors"} == set(dataservice.__all__)
    from dataservice import catalogue

    for name, home in catalogue._PUBLIC_HOMES.items():
        assert getattr(catalogue, name) is getattr(importlib.import_module(f"dataservice.catalogue.{home}"), name)
    assert set(catalogue._PUBLIC_HOMES) == set(catalogue.__all__)
    with pytest.raises(AttributeError, match="no attribute 'Datasett'"):
        dataservice.Datasett  # noqa: B018


@pytest.mark.slow
def test_the_startup_benchmark_runs() -> None:
    # A smoke run of benchmarks/cli_startup.py (real dispatcher and worker, each command once); no figure is
    # checked: the figures are the benchmark's.
    result = subprocess.run([sys.executable, "-m", "benchmarks.cli_startup", "--runs", "1", "--json"],
                            capture_output=True, text=True, env=subprocess_env(), cwd=REPO, timeout=180)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["rows"]
    commands = {row["command"] for row in rows}
    assert {"python -c pass", "python -m dataservice --version", "python -m dataservice health (dispatcher)",
            "python -m dataservice health (worker)", "python -m dataservice status"} <= commands
    assert all(row["wall_ms_median"] > 0 and row["cpu_ms_median"] > 0 and row["runs"] == 1 for row in rows)
