"""Tests of the ``dataservice`` command, the example client and the deploy files.

The ``slow`` tests start real processes (``python -m dataservice ...``) and talk
to them over gRPC; the others call ``dataservice.cli.main`` in-process.

Example::

    $ python -m pytest tests/test_cli.py -m "not slow"
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

import dataservice as ds
from dataservice import cli
from tests.processes import (REPO, Proc, Processes, assert_clean_exit, free_port, poll_status, run_cli,
                             subprocess_env, wait_until)

THROUGHPUT_LINE = re.compile(r"read [\d,]+ elements \([\d,]+ batches\) in [\d.]+ s: [\d,]+ elements/s, [\d,.]+ MB/s")


# --- helpers -------------------------------------------------------------------------------

@pytest.fixture
def cli_env() -> dict:
    """The environment for subprocesses: this checkout's packages importable, output unbuffered."""
    return subprocess_env()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """Starts ``python -m <module> args...``; every process still running at the end is killed."""
    with Processes(tmp_path) as procs:
        def start(*args: str, module: str = "dataservice") -> Proc:
            return procs.spawn("-m", module, *args, name=args[0] if args else module)

        yield start


# --- help and argument errors (in-process) ---------------------------------------------------

FLAGS = {
    "dispatcher": ["--port", "--work-dir", "--fault-tolerant", "--job-gc-check-interval-ms", "--job-gc-timeout-ms",
                   "--worker-timeout-ms", "--client-timeout-ms", "--log-level"],
    "worker": ["--dispatcher", "--port", "--worker-address", "--processes", "--heartbeat-interval-ms",
               "--dispatcher-timeout-ms", "--log-level"],
    "status": ["--dispatcher", "--json", "--timeout-ms", "--wait-workers"],
    "local": ["--workers", "--port", "--work-dir", "--fault-tolerant", "--log-level"],
    "save-status": ["--dispatcher", "--wait", "--json", "--timeout-ms"],
    "datasets": ["list", "build"],  # its actions; their flags: test_datasets_actions_mention_their_flags
    "health": ["--service", "--timeout-ms", "--check-auth", "--auth-token-file", "--tls-ca"],
}
DATASETS_FLAGS = {
    "list": ["--data-dir", "--import", "--json"],
    "build": ["--data-dir", "--import", "--num-shards", "--max-examples-per-split"],
}


@pytest.mark.parametrize("command", sorted(FLAGS))
def test_help_mentions_every_flag(command: str, capsys: pytest.CaptureFixture) -> None:
    assert cli.main([command, "--help"]) == 0
    out = capsys.readouterr().out
    for flag in FLAGS[command]:
        assert flag in out, f"{command} --help does not mention {flag}"


@pytest.mark.parametrize("action", sorted(DATASETS_FLAGS))
def test_datasets_actions_mention_their_flags(action: str, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["datasets", action, "--help"]) == 0
    out = capsys.readouterr().out
    for flag in DATASETS_FLAGS[action]:
        assert flag in out, f"datasets {action} --help does not mention {flag}"


def _subcommands(parser) -> dict:
    return next((a.choices for a in parser._actions if a.choices and isinstance(a.choices, dict)), {})


def test_every_option_has_help() -> None:
    parser = cli.build_parser()
    subparsers = _subcommands(parser)
    assert set(subparsers) == set(FLAGS)
    assert set(_subcommands(subparsers["datasets"])) == set(DATASETS_FLAGS)
    pending = list(subparsers.items())
    while pending:
        name, sub = pending.pop()
        pending.extend((f"{name} {n}", s) for n, s in _subcommands(sub).items())
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                assert action.help and action.help.strip(), f"{name} {action.option_strings} has no help text"


def test_top_level_help_lists_the_commands(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in FLAGS:
        assert command in out


def test_version(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"dataservice {ds.__version__}\n"


@pytest.mark.parametrize("args, message", [
    (["worker", "--dispatcher", "not-an-address"], "malformed dispatcher address 'not-an-address'"),
    (["worker", "--dispatcher", "http://localhost:5050"], "unsupported protocol 'http'"),
    (["worker", "--dispatcher", "localhost:99999"], "out of range"),
    (["worker"], "the following arguments are required: --dispatcher"),
    (["status", "--dispatcher", "localhost"], "malformed dispatcher address"),
    (["dispatcher", "--fault-tolerant"], "--fault-tolerant requires --work-dir"),
    (["local", "--fault-tolerant"], "--fault-tolerant requires --work-dir"),
    (["dispatcher", "--port", "70000"], "argument --port: port must be in 0..65535"),
    (["dispatcher", "--port", "abc"], "argument --port: port must be an integer"),
    (["worker", "--dispatcher", "localhost:5050", "--port", "-1"], "argument --port"),
    (["dispatcher", "--worker-timeout-ms", "0"], "argument --worker-timeout-ms: expected a positive number"),
    (["worker", "--dispatcher", "localhost:5050", "--heartbeat-interval-ms", "x"], "--heartbeat-interval-ms"),
    (["local", "--workers", "0"], "argument --workers: expected a positive integer"),
    (["worker", "--dispatcher", "h:1", "--processes", "0"],
     "argument --processes: expected a positive integer or 'auto' (one process per core), got '0'"),
    (["worker", "--dispatcher", "h:1", "--processes", "-2"], "argument --processes: expected a positive integer"),
    (["worker", "--dispatcher", "h:1", "--processes", "foo"], "argument --processes: expected a positive integer"),
    (["worker", "--dispatcher", "h:1", "--processes", "2", "--worker-address", "w1:5051"],
     "--worker-address 'w1:5051' must contain %port% with --processes 2: each process listens on a port of its "
     "own, and clients tell the processes apart by it (e.g. w1:%port%)"),
    (["worker", "--dispatcher", "h:1", "--processes", "2", "--port", "65535"],
     "--port 65535 with --processes 2 needs the ports 65535..65536, beyond 65535"),
    (["worker", "--dispatcher", "h:1", "--processes", "3", "--port", "6000", "--data-transfer-port", "6002"],
     "the ports 6000..6002 and the data-transfer ports 6002..6004 overlap"),
    (["dispatcher", "--log-level", "LOUD"], "log level must be one of"),
    (["status", "--dispatcher", "localhost:5050", "--timeout-ms", "-5"], "argument --timeout-ms"),
    ([], "the following arguments are required: COMMAND"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_invalid_arguments_exit_2_with_a_clear_message(args: list[str], message: str,
                                                       capsys: pytest.CaptureFixture) -> None:
    assert cli.main(args) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert "Traceback" not in captured.err
    error_lines = [line for line in captured.err.splitlines() if "error:" in line]
    assert len(error_lines) == 1, captured.err


def test_configs_from_arguments() -> None:
    parser = cli.build_parser()
    config = cli.dispatcher_config(parser.parse_args(
        ["dispatcher", "--port", "0", "--work-dir", "/tmp/x", "--fault-tolerant", "--job-gc-timeout-ms", "1234"]))
    assert (config.port, config.work_dir, config.fault_tolerant_mode, config.job_gc_timeout_ms) == \
        (0, "/tmp/x", True, 1234)
    assert config.worker_timeout_ms == ds.DispatcherConfig().worker_timeout_ms  # unset flags keep the defaults
    worker = cli.worker_config(parser.parse_args(
        ["worker", "--dispatcher", "grpc://dispatcher:5050", "--worker-address", "w1:5051", "--port", "5051",
         "--heartbeat-interval-ms", "250"]))
    assert (worker.dispatcher_address, worker.worker_address, worker.port, worker.heartbeat_interval_ms) == \
        ("dispatcher:5050", "w1:5051", 5051, 250)
    assert parser.parse_args(["status", "--dispatcher", "h:1"]).timeout_ms == 5000
    assert parser.parse_args(["dispatcher"]).log_level == "INFO"
    assert parser.parse_args(["dispatcher", "--log-level", "debug"]).log_level == "DEBUG"


def test_processes_flag() -> None:
    from dataservice.worker.processes import available_cpus

    parser = cli.build_parser()
    assert parser.parse_args(["worker", "--dispatcher", "h:1"]).processes == 1
    assert parser.parse_args(["worker", "--dispatcher", "h:1", "--processes", "3"]).processes == 3
    assert parser.parse_args(["worker", "--dispatcher", "h:1", "--processes", "auto"]).processes == available_cpus()
    assert available_cpus() == len(os.sched_getaffinity(0))


def test_worker_processes_get_every_flag_but_their_ports() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(
        ["worker", "--dispatcher", "d:1", "--port", "7000", "--worker-address", "h:%port%", "--processes", "3",
         "--heartbeat-interval-ms", "250", "--dispatcher-timeout-ms", "900", "--data-transfer-protocol", "grpc",
         "--data-transfer-port", "7100", "--log-level", "DEBUG", "--host", "0.0.0.0", "--insecure",
         "--auth-token-file", "/run/secrets/token", "--tls-cert", "/tls/w.pem", "--tls-key", "/tls/w.key",
         "--tls-ca", "/tls/ca.pem", "--tls-client-ca", "/tls/client-ca.pem", "--memory-budget-bytes", "3000",
         "--data-idle-timeout-ms", "900", "--data-request-timeout-ms", "800", "--data-max-connections", "7",
         "--cross-trainer-cache-size-bytes", "500", "--worker-tags", "COLOCATED,zone-a", "--shared-batch-bytes", "0",
         "--http-port", "0"])  # with --processes N only 0 (free ports): each process serves its own
    defaults = parser.parse_args(["worker", "--dispatcher", "e:2"])
    worker = next(a for a in parser._actions if isinstance(a.choices, dict)).choices["worker"]
    dests = {a.dest for a in worker._actions if a.option_strings and a.dest != "help"}
    # Every flag is set above to a value other than its default: a flag added later must be added there too.
    assert {d for d in dests if getattr(args, d) == getattr(defaults, d)} == set()
    child = parser.parse_args(["worker", *cli.worker_process_flags(args)])
    per_process = {"port", "data_transfer_port", "processes", "memory_budget_bytes"}  # set by the supervisor
    assert child.memory_budget_bytes == 1000  # the processes share the worker's budget
    assert {d: getattr(child, d) for d in dests - per_process} == {d: getattr(args, d) for d in dests - per_process}
    assert not (per_process - {"memory_budget_bytes"}) & {
        a.lstrip("-").replace("-", "_") for a in cli.worker_process_flags(args)}


def test_status_formats_a_table() -> None:
    import io

    from dataservice.proto import dispatcher_pb2

    response = dispatcher_pb2.GetStatusResponse(
        workers=[dispatcher_pb2.WorkerStatus(address="w1:5051", last_heartbeat_unix=100.0, tasks=[4, 7],
                                             num_tasks=5)],
        datasets=[dispatcher_pb2.DatasetStatus(dataset_id=1, fingerprint="ab" * 32, num_splits=10, size_bytes=2048)],
        jobs=[dispatcher_pb2.JobStatus(job_id=2, job_name="train", dataset_id=1, processing_mode=2, finished=True,
                                       num_clients=3, iterations=[5], garbage_collected=False),
              dispatcher_pb2.JobStatus(job_id=3, job_name="sync", dataset_id=1, processing_mode=1, num_consumers=4,
                                       target_workers="ANY")],
        dispatcher_incarnation="0123456789abcdef",
        counts=dispatcher_pb2.StatusCounts(workers=1, datasets=1, jobs=250, jobs_finished=4000, jobs_pruned=3900),
        rpc_latency=[dispatcher_pb2.RpcLatency(method="GetSplit", calls=12, p50_ms=0.5, p99_ms=2.25, max_ms=3)])
    status = cli.status_as_dict(response, "grpc://localhost:5050", now=101.5)
    assert status["workers"] == [{"address": "w1:5051", "last_heartbeat_unix": 100.0, "last_heartbeat_s_ago": 1.5,
                                  "tasks": [4, 7], "num_tasks": 5, "tags": [], "host_id": ""}]
    assert status["counts"]["jobs_pruned"] == 3900 and status["rpc_latency_ms"]["GetSplit"]["p99"] == 2.25
    assert status["jobs"][0]["processing_mode"] == "distributed_epoch"
    assert [(j["num_consumers"], j["cross_trainer_cache"], j["target_workers"]) for j in status["jobs"]] == \
        [(0, False, "AUTO"), (4, False, "ANY")]
    json.dumps(status)  # plain data
    out = io.StringIO()
    cli.format_status(status, out)
    text = out.getvalue()
    for expected in ("w1:5051", "1.5 s ago", "4,7", "ID", "train", "distributed_epoch", "GARBAGE COLLECTED",
                     "2,048 B", "4,7 (+3)", "jobs: 250 (showing 2); 4000 finished", "3900 of them pruned",
                     "GetSplit", "2.25", "READS", "coordinated x4, ANY"):
        assert expected in text, text


# --- real processes --------------------------------------------------------------------------

@pytest.mark.slow
def test_status_of_a_dead_dispatcher_exits_2_quickly(cli_env: dict) -> None:
    port = free_port()  # nobody listens on it: a dead dispatcher
    start = time.monotonic()
    result = run_cli(cli_env, "status", "--dispatcher", f"localhost:{port}", "--timeout-ms", "500")
    elapsed = time.monotonic() - start
    assert result.returncode == 2, result
    assert elapsed < 10, f"status took {elapsed:.1f} s for a 500 ms timeout"
    assert f"cannot reach the dispatcher at localhost:{port} within 500 ms" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["worker", "--dispatcher", "nonsense"], "malformed dispatcher address"),
    (["dispatcher", "--fault-tolerant"], "--fault-tolerant requires --work-dir"),
    (["worker", "--dispatcher", "localhost:5050", "--processes", "0"], "argument --processes: expected a positive"),
])
def test_invalid_arguments_in_a_real_process(cli_env: dict, args: list[str], message: str) -> None:
    result = run_cli(cli_env, *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_dispatcher_worker_status_and_read(spawn: Callable[..., Proc], cli_env: dict) -> None:
    dispatcher = spawn("dispatcher", "--port", "0", "--log-level", "DEBUG")
    port = int(dispatcher.wait_for_line(r"^dispatcher listening on grpc://localhost:(\d+)$").group(1))

    worker = spawn("worker", "--dispatcher", f"localhost:{port}", "--port", "0", "--heartbeat-interval-ms", "200")
    match = worker.wait_for_line(rf"^worker listening on localhost:(\d+) \(dispatcher localhost:{port}\)$")
    worker_address = f"localhost:{match.group(1)}"

    status = poll_status(cli_env, port, lambda s: any(w["address"] == worker_address for w in s["workers"]),
                         f"worker {worker_address}")
    assert set(status) >= {"workers", "datasets", "jobs"}
    assert status["jobs"] == []

    # A second dispatcher on the same port: a clear error, not a traceback.
    clash = run_cli(cli_env, "dispatcher", "--port", str(port))
    assert clash.returncode == 1
    assert (f"dataservice dispatcher: error: cannot start: cannot bind 127.0.0.1:{port} (the dispatcher's gRPC port): "
            f"the port is in use") in clash.stderr
    assert "Traceback" not in clash.stderr

    dataset = ds.Dataset.range(10).apply(ds.distribute("parallel_epochs", f"grpc://localhost:{port}",
                                                       job_name="cli-test", timeout_ms=20_000))
    assert sorted(int(x) for x in dataset) == list(range(10))  # one worker: each element once

    status = poll_status(cli_env, port, lambda s: any(j["job_name"] == "cli-test" for j in s["jobs"]),
                         "job cli-test")
    job = next(j for j in status["jobs"] if j["job_name"] == "cli-test")
    assert job["processing_mode"] == "parallel_epochs"
    assert any(d["dataset_id"] == job["dataset_id"] for d in status["datasets"])

    table = run_cli(cli_env, "status", "--dispatcher", f"grpc://localhost:{port}")
    assert table.returncode == 0, table.stderr
    assert worker_address in table.stdout and "cli-test" in table.stdout and "parallel_epochs" in table.stdout

    assert_clean_exit(worker, signal.SIGTERM)
    assert_clean_exit(dispatcher, signal.SIGTERM)
    assert "DEBUG" in dispatcher.stderr or "INFO" in dispatcher.stderr  # --log-level reached logging


@pytest.mark.slow
def test_worker_stops_on_sigint_and_advertises_its_address(spawn: Callable[..., Proc], cli_env: dict) -> None:
    dispatcher = spawn("dispatcher", "--port", "0")
    port = int(dispatcher.wait_for_line(r"listening on grpc://localhost:(\d+)").group(1))
    worker = spawn("worker", "--dispatcher", f"grpc://localhost:{port}", "--worker-address", "127.0.0.1:%port%")
    match = worker.wait_for_line(r"^worker listening on localhost:(\d+) .*advertised to clients as (\S+)$")
    assert match.group(2) == f"127.0.0.1:{match.group(1)}"
    poll_status(cli_env, port, lambda s: any(w["address"] == match.group(2) for w in s["workers"]),
                "the advertised address")
    assert_clean_exit(worker, signal.SIGINT)
    assert_clean_exit(dispatcher, signal.SIGINT)


@pytest.mark.slow
def test_fault_tolerant_dispatcher_creates_its_work_dir(spawn: Callable[..., Proc], tmp_path: Path) -> None:
    work_dir = tmp_path / "journal" / "nested"
    dispatcher = spawn("dispatcher", "--port", "0", "--work-dir", str(work_dir), "--fault-tolerant")
    dispatcher.wait_for_line(r"^dispatcher listening on grpc://localhost:\d+$")
    assert work_dir.is_dir()
    assert_clean_exit(dispatcher, signal.SIGTERM)


@pytest.mark.slow
def test_listening_lines_show_the_host_given(spawn: Callable[..., Proc]) -> None:
    dispatcher = spawn("dispatcher", "--host", "127.0.0.2", "--port", "0")
    found = dispatcher.wait_for_line(r"^dispatcher listening on grpc://127\.0\.0\.2:(\d+)$")
    worker = spawn("worker", "--dispatcher", f"127.0.0.2:{found.group(1)}", "--host", "127.0.0.2",
                   "--worker-address", "127.0.0.2:%port%")
    worker.wait_for_line(r"^worker listening on 127\.0\.0\.2:\d+ \(dispatcher ")
    assert_clean_exit(worker, signal.SIGINT)
    assert_clean_exit(dispatcher, signal.SIGINT)


@pytest.mark.slow
def test_local_cluster_serves_and_stops_on_sigint(spawn: Callable[..., Proc], cli_env: dict) -> None:
    local = spawn("local", "--workers", "2", "--port", "0", "--log-level", "WARNING")
    service = local.wait_for_line(r"^local cluster: (grpc://localhost:(\d+)) with 2 workers$")
    status = poll_status(cli_env, int(service.group(2)), lambda s: len(s["workers"]) == 2, "two workers")
    assert len(status["workers"]) == 2
    dataset = ds.Dataset.range(20).apply(ds.distribute("distributed_epoch", service.group(1), timeout_ms=20_000))
    assert sorted(int(x) for x in dataset) == list(range(20))  # distributed_epoch: each element once
    assert_clean_exit(local, signal.SIGINT)


@pytest.mark.slow
def test_demo_runs_to_completion(cli_env: dict) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "client.demo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=cli_env, cwd=REPO)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, f"stdout: {out}\nstderr: {err}"
    assert re.search(r"local cluster: grpc://localhost:\d+ with 2 workers", out), out
    assert THROUGHPUT_LINE.search(out), out
    assert "cluster stopped (exit code 0)" in out
    accuracy = re.search(r"test accuracy (\d\.\d+) \(chance: 0\.333\)", out)
    assert accuracy and float(accuracy.group(1)) > 0.5, out  # shapes, through the service: well above chance
    assert "Traceback" not in err, err


# --- what a user sees when something is wrong (real processes) --------------------------------

#: A line of gRPC's C-core log: severity, month and day ("E1122 16:42:24.446824 7219 add_port.cc:83] ...").
GRPC_CORE_LOG_LINE = re.compile(r"^[EWI]\d{4} ", re.M)
HINT = "pass the dispatcher's address (the --port of `dataservice dispatcher`)"


def _env_without_grpc_settings(cli_env: dict) -> dict:
    """``cli_env`` as a user who never heard of gRPC's variables has it."""
    return {k: v for k, v in cli_env.items() if k not in ("GRPC_VERBOSITY", "GRPC_TRACE")}


@pytest.mark.slow
def test_version_in_a_real_process(cli_env: dict) -> None:
    result = run_cli(cli_env, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"dataservice {ds.__version__}\n"
    assert result.stderr == ""


@pytest.mark.slow
def test_a_taken_port_gives_one_line_and_no_grpc_log(cluster, cli_env: dict) -> None:
    result = run_cli(_env_without_grpc_settings(cli_env), "dispatcher", "--port", str(cluster.port))
    assert result.returncode == 1, result
    assert result.stderr == (f"dataservice dispatcher: error: cannot start: cannot bind 127.0.0.1:{cluster.port} (the "
                             f"dispatcher's gRPC port): the port is in use\n")
    assert not GRPC_CORE_LOG_LINE.search(result.stderr) and "absl" not in result.stderr
    assert result.stdout == ""


@pytest.mark.slow
def test_a_users_grpc_verbosity_is_kept(cluster, cli_env: dict) -> None:
    # Also shows that the test above would see gRPC's log line if we did not keep it away.
    env = {**_env_without_grpc_settings(cli_env), "GRPC_VERBOSITY": "ERROR"}
    result = run_cli(env, "dispatcher", "--port", str(cluster.port))
    assert result.returncode == 1, result
    assert re.search(r"^E\d{4} .*Failed to add port", result.stderr, re.M), result.stderr
    assert "dataservice dispatcher: error: cannot start: cannot bind" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("port_kind", ["gRPC", "data-transfer"])
def test_status_of_a_worker_says_it_is_not_the_dispatcher(cluster, cli_env: dict, port_kind: str) -> None:
    worker = cluster.workers[0]
    address = f"localhost:{worker.port}" if port_kind == "gRPC" else worker.data_address
    what = "a dataservice worker" if port_kind == "gRPC" else "a dataservice worker's data-transfer port"
    start = time.monotonic()
    # A long --timeout-ms: retrying the wrong address until then would show as slowness.
    result = run_cli(_env_without_grpc_settings(cli_env), "status", "--dispatcher", address, "--timeout-ms", "60000")
    elapsed = time.monotonic() - start
    assert result.returncode == 2, result
    assert result.stderr == f"dataservice status: error: {address} is {what}, not the dispatcher: {HINT}\n"
    assert result.stdout == ""
    assert elapsed < 30, f"status took {elapsed:.1f} s"  # a Python start-up or two, not the 60 s timeout


@pytest.mark.slow
def test_a_worker_pointed_at_a_worker_says_so(cluster, spawn: Callable[..., Proc]) -> None:
    wrong = f"localhost:{cluster.workers[0].port}"
    worker = spawn("worker", "--dispatcher", wrong, "--port", "0", "--heartbeat-interval-ms", "100")
    expected = f"heartbeat to dispatcher {wrong} failed: {wrong} is a dataservice worker, not the dispatcher: {HINT}"
    wait_until(lambda: expected in worker.stderr or worker.popen.poll() is not None, 30,
               f"the worker's warning {expected!r}")
    assert_clean_exit(worker, signal.SIGTERM)
    assert expected in worker.stderr
    assert not GRPC_CORE_LOG_LINE.search(worker.stderr), worker.stderr


# --- the example client ----------------------------------------------------------------------

def test_train_summary_and_progress_bar() -> None:
    import io

    from client.train import ProgressBar, TrainResult

    result = TrainResult(elements=12_800, batches=200, bytes=12_800 * 3080, seconds=1.25, final_loss=2.3)
    assert THROUGHPUT_LINE.fullmatch(result.summary()), result.summary()
    assert result.summary().startswith("read 12,800 elements (200 batches) in 1.25 s: 10,240 elements/s")

    out = io.StringIO()  # not a terminal: plain lines, no carriage returns
    bar = ProgressBar("epoch 1/1", total=4, out=out, width=8)
    for _ in range(4):
        bar.update(1, 64)
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[-1].startswith("epoch 1/1 [########] 4/4 batches")
    assert "\r" not in out.getvalue()


def test_train_pipeline_runs_locally() -> None:
    from client.train import make_dataset

    images, labels, ids = next(iter(make_dataset(num_examples=100, batch_size=64)))
    assert images.shape == (64, 32, 32, 3) and images.dtype.name == "uint8"
    assert labels.shape == (64,) and list(labels[:3]) == [0, 1, 2]
    assert ids.tolist() == list(range(64))


def test_train_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    from client import train

    monkeypatch.setenv("DATASERVICE_SERVICE", "grpc://elsewhere:6000")
    args = train.build_parser().parse_args([])
    assert (args.service, args.mode, args.epochs, args.steps) == ("grpc://elsewhere:6000", "distributed_epoch", 1,
                                                                  None)
    args = train.build_parser().parse_args(["--service", "grpc://h:1", "--mode", "parallel_epochs",
                                            "--epochs", "3", "--steps", "10"])
    assert (args.service, args.mode, args.epochs, args.steps) == ("grpc://h:1", "parallel_epochs", 3, 10)
    with pytest.raises(SystemExit):
        train.build_parser().parse_args(["--mode", "sideways"])


# --- deploy files ----------------------------------------------------------------------------

def _tiny_compose_commands(text: str) -> dict[str, dict[str, list[str]]]:
    """``{service: {"command": [...], "entrypoint": [...]}}`` from a compose file whose commands
    are one-line JSON-style lists: enough for our file when PyYAML is not installed."""
    services: dict[str, dict[str, list[str]]] = {}
    in_services, service = False, None
    for raw in text.splitlines():
        line = raw.split(" #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            in_services, service = line == "services:", None
        elif in_services and indent == 2 and line.endswith(":"):
            service = line.strip()[:-1]
            services[service] = {}
        elif in_services and service and indent == 4:
            key, _, value = line.strip().partition(":")
            if key in ("command", "entrypoint"):
                services[service][key] = json.loads(value.strip())
    return services


def _compose_commands() -> dict[str, dict[str, list[str]]]:
    text = (REPO / "docker-compose.yml").read_text()
    try:
        import yaml
    except ImportError:
        return _tiny_compose_commands(text)
    services = yaml.safe_load(text)["services"]
    return {name: {k: v for k, v in spec.items() if k in ("command", "entrypoint")} for name, spec in services.items()}


def test_tiny_compose_parser_agrees_with_yaml() -> None:
    yaml = pytest.importorskip("yaml")
    text = (REPO / "docker-compose.yml").read_text()
    expected = {name: {k: v for k, v in spec.items() if k in ("command", "entrypoint")}
                for name, spec in yaml.safe_load(text)["services"].items()}
    assert _tiny_compose_commands(text) == expected


def test_docker_compose_commands_parse(tmp_path, monkeypatch) -> None:
    from client import train

    # The compose secret, as the containers see it: servers listening on 0.0.0.0 need the token.
    secret = tmp_path / "dataservice_token"
    secret.write_text("a-test-token-for-the-compose-file\n")
    monkeypatch.setenv("DATASERVICE_AUTH_TOKEN_FILE", str(secret))
    monkeypatch.delenv("DATASERVICE_AUTH_TOKEN", raising=False)
    services = _compose_commands()
    assert set(services) == {"dispatcher", "worker1", "worker2", "client"}
    parser = cli.build_parser()
    parsed = {}
    for name, spec in services.items():
        # The image's ENTRYPOINT is ["dataservice"]; a service may override it.
        argv = list(spec.get("entrypoint") or ["dataservice"]) + list(spec.get("command") or [])
        assert all(isinstance(a, str) for a in argv), f"{name}: every argument must be a string: {argv}"
        if argv[0] == "dataservice":
            try:
                args = parser.parse_args(argv[1:])
            except SystemExit:
                pytest.fail(f"service {name}: {argv} does not parse")
            # Semantic checks too (e.g. --fault-tolerant needs --work-dir).
            if args.command == "dispatcher":
                cli.dispatcher_config(args)
            elif args.command == "worker":
                cli.worker_config(args)
        elif argv[:3] == ["python", "-m", "client.train"]:
            try:
                args = train.build_parser().parse_args(argv[3:])
            except SystemExit:
                pytest.fail(f"service {name}: {argv} does not parse")
        else:
            pytest.fail(f"service {name} runs neither dataservice nor client.train: {argv}")
        parsed[name] = args

    assert parsed["dispatcher"].command == "dispatcher"
    assert (parsed["dispatcher"].port, parsed["dispatcher"].work_dir, parsed["dispatcher"].fault_tolerant) == \
        (5050, "/data", True)
    for name in ("worker1", "worker2"):
        assert parsed[name].command == "worker"
        assert (parsed[name].dispatcher, parsed[name].port, parsed[name].worker_address) == \
            ("dispatcher:5050", 5051, f"{name}:5051")
        # A fixed data-transfer port, exposed on the compose network (test_docker_compose_health_and_ports).
        assert parsed[name].data_transfer_port == 5061
    assert parsed["client"].service == "grpc://dispatcher:5050"


def test_dockerfile_and_compose_basics() -> None:
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    # The official slim image by default; deploy/base-image.sh's where no registry can be reached.
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim\s*$", dockerfile, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}\s*$", dockerfile, re.M)
    # With the images extra (workers decode the catalogue's Image features with Pillow), at the locked versions;
    # pip's configuration only ever as a build secret.
    assert re.search(r"pip install -c requirements/lock\.txt '\.\[images\]'", dockerfile)
    assert "--mount=type=secret,id=pip.conf" in dockerfile and "COPY pip.conf" not in dockerfile
    assert re.search(r"^USER dataservice\s*$", dockerfile, re.M)
    assert re.search(r'^ENTRYPOINT \["dataservice"\]\s*$', dockerfile, re.M)
    # gRPC of the dispatcher and the workers, the workers' data transfer, and --http-port.
    assert re.search(r"^EXPOSE 5050 5051 5061 8080\s*$", dockerfile, re.M)
    compose = (REPO / "docker-compose.yml").read_text()
    assert "dockerfile: deploy/Dockerfile" in compose
    assert "dispatcher-data:/data" in compose  # the journal survives a restart of the container
    # Every member gets the cluster token from a compose secret, never from the image or the file itself.
    assert "DATASERVICE_AUTH_TOKEN_FILE: /run/secrets/dataservice_token" in compose
    assert re.search(r"^secrets:\n  dataservice_token:\n    file: \./deploy/auth_token$", compose, re.M)
    assert "deploy/auth_token" in (REPO / ".gitignore").read_text()


def _compose() -> dict:
    import yaml

    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_docker_compose_file_follows_the_compose_spec() -> None:
    """Valid under the Compose Specification's JSON schema (vendored: tests/fixtures/compose-spec.md), the
    rules Docker Compose v2 applies; the v1 file formats would reject the top-level ``name:``."""
    import jsonschema

    schema = json.loads((REPO / "tests" / "fixtures" / "compose-spec.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    compose = _compose()
    problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(compose)]
    assert problems == []
    assert compose["name"] == "dataservice" and "version" not in compose  # `version:` is obsolete in v2
    # The schema has teeth: a misspelt condition and an unknown healthcheck key are refused.
    broken = json.loads(json.dumps(compose))
    broken["services"]["worker1"]["depends_on"]["dispatcher"]["condition"] = "service_up"
    broken["services"]["dispatcher"]["healthcheck"]["intervall"] = "5s"
    assert len(list(validator.iter_errors(broken))) == 2


def _seconds(duration: str) -> float:
    """A compose duration such as "5s" or "1m30s", in seconds."""
    parts = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert parts and duration, f"not a duration this test reads: {duration!r}"
    return int(parts.group(1) or 0) * 60 + int(parts.group(2) or 0)


def test_docker_compose_health_and_ports(tmp_path, monkeypatch) -> None:
    from dataservice.service.dispatcher_client import DISPATCHER_SERVICE, WORKER_SERVICE

    secret = tmp_path / "dataservice_token"
    secret.write_text("a-test-token-for-the-compose-file\n")
    monkeypatch.setenv("DATASERVICE_AUTH_TOKEN_FILE", str(secret))
    services = _compose()["services"]
    parser = cli.build_parser()
    roles = {"dispatcher": DISPATCHER_SERVICE, "worker1": WORKER_SERVICE, "worker2": WORKER_SERVICE}
    for name, service_name in roles.items():
        spec = services[name]
        server = parser.parse_args(spec["command"])
        check = spec["healthcheck"]
        assert check["test"][:3] == ["CMD", "dataservice", "health"], name
        health = parser.parse_args(check["test"][2:])
        # The health command asks the server's own gRPC port, inside its container, for its service,
        # and checks the secret's token too; it gives up before compose's timeout kills it.
        assert health.address == f"127.0.0.1:{server.port}", name
        assert (health.service, health.check_auth) == (service_name, True), name
        assert health.timeout_ms / 1000 < _seconds(check["timeout"]), name
        if name.startswith("worker"):
            assert spec["depends_on"] == {"dispatcher": {"condition": "service_healthy"}}
            # Clients on the compose network dial the advertised gRPC port and the fixed data port.
            assert {str(server.port), str(server.data_transfer_port)} <= set(spec["expose"]), name
            assert server.worker_address == f"{name}:{server.port}"
    dispatcher = parser.parse_args(services["dispatcher"]["command"])
    # gRPC (token-protected) and the unauthenticated HTTP page.
    # Published on the host's loopback only: the compose network is the cluster's.
    assert services["dispatcher"]["ports"] == [f"127.0.0.1:5050:{dispatcher.port}",
                                               f"127.0.0.1:8080:{dispatcher.http_port}"]
    assert services["client"]["depends_on"] == {name: {"condition": "service_healthy"} for name in roles}
    assert "healthcheck" not in services["client"]  # it serves nothing; the image has no HEALTHCHECK either


def test_docker_compose_healthchecks_run_against_real_servers(tmp_path, monkeypatch, capsys) -> None:
    """Each service's healthcheck command, run against a real dispatcher and worker that require a token, with
    the token file the containers have: healthy; with a rotated file the server does not hold: unhealthy."""
    from tests.cluster import TestCluster

    token = "a-test-token-for-the-compose-file"
    secret = tmp_path / "dataservice_token"
    secret.write_text(token + "\n")
    monkeypatch.delenv("DATASERVICE_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("DATASERVICE_AUTH_TOKEN_FILE", str(secret))
    services = _compose()["services"]
    with TestCluster(num_workers=0, auth_token=token) as cluster:
        cluster.add_worker(auth_token=token)
        cluster.wait_for_workers(1)
        real_ports = {"dispatcher": cluster.port, "worker1": cluster.workers[0].port}
        for name, port in real_ports.items():
            argv = services[name]["healthcheck"]["test"][2:]
            argv = [f"127.0.0.1:{port}" if a.startswith("127.0.0.1:") else a for a in argv]
            assert cli.main(argv) == 0, capsys.readouterr().err
            assert "SERVING" in capsys.readouterr().out
        secret.write_text("a-rotated-token-the-servers-do-not-hold\n")
        assert cli.main(argv) == 1
        assert "refused this cluster token" in capsys.readouterr().err
