"""Every ```python block of README.md and of the documentation site (docs/**/*.md) runs as pasted.

Each block is written to a file in a fresh temporary directory and run there with
``sys.executable`` in a process of its own (``PYTHONPATH`` = this checkout, a timeout of
60 s); it must exit with code 0 and print no Python traceback on stderr. A worker's log
line about a user function that failed (``task ... failed: Traceback on worker ...``) is
output the README shows on purpose and is allowed; ``Traceback (most recent call last)``
and ``Exception ignored`` are not.

Blocks come in four kinds, told apart by their text:

- **standalone** blocks (most): run as they are;
- **cluster** blocks mention ``localhost:5050``, the cluster the README tells readers to
  start with ``dataservice local --port 5050 --workers 2``. The test starts
  ``python -m dataservice local --port 0 --workers 2`` once, from ``/`` (so its workers
  have no copy of any snippet's files), reads its port from the line it prints
  (``local cluster: grpc://localhost:PORT with 2 workers``) and replaces every
  ``localhost:5050`` in the block's text with ``localhost:PORT`` before running it;
- **file** blocks start with ``# file: PATH``: the files of the example project. They are
  all written into one project directory (with an empty ``__init__.py`` in each package
  directory, as the README's layout shows); those whose first line also says
  ``run: python PATH`` are then run from that directory, twice, and must print the same
  dataset id (their first output line) both times;
- **process** blocks start with ``# process 1`` / ``# process 2``: process 1 is started,
  the dataset id it prints first is passed to process 2 as ``sys.argv[1]``, as the README
  says, and the two must together read every element once.

A top-level ``print(...)`` whose comment starts like a value (``# [1, 2]``, ``# True 49``)
must print exactly that line.

Example::

    $ python -m pytest tests/test_readme.py
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Optional

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
#: The pages of the documentation site (mkdocs.yml), whose blocks run as the README's do.
DOCS = REPO / "docs"
#: The longest one snippet may run.
SNIPPET_TIMEOUT_S = 60.0
#: The longest the local cluster may take to print where it listens.
START_TIMEOUT_S = 30.0
README_PORT = "localhost:5050"

# A block may be indented (inside a list item): its lines are dedented by the fence's indentation.
_BLOCK = re.compile(r"^( *)```python\n(.*?)^\1```", re.M | re.S)
_FILE_HEADER = re.compile(r"^# file: (\S+)(?:.*\brun: python (\S+))?")
_CLUSTER_LINE = re.compile(r"^local cluster: grpc://localhost:(\d+) with \d+ workers?$")
_PRINT_WITH_VALUE = re.compile(r"^print\(.*\)\s+# ((?:[\[(\d'\"]|True\b|False\b|None\b).*)$")
_PYTHON_TRACEBACK = re.compile(r"^(Traceback \(most recent call last\)|Exception ignored)", re.M)


def _blocks(path: Path = README) -> list[str]:
    return [textwrap.dedent(body) if indent else body for indent, body in _BLOCK.findall(path.read_text())]


def _pages() -> list[Path]:
    """README.md and the site's pages."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def _runnable() -> list[tuple[str, int]]:
    """``(page, index)`` of every standalone and cluster block of every page."""
    return [(str(page.relative_to(REPO)), i) for page in _pages() for i, b in enumerate(_blocks(page))
            if _kind(b) in ("standalone", "cluster")]


def _kind(block: str) -> str:
    first = block.splitlines()[0] if block.strip() else ""
    if _FILE_HEADER.match(first):
        return "file"
    if first.startswith(("# process 1", "# process 2")):
        return "process"
    if README_PORT in block:
        return "cluster"
    return "standalone"


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRPC_VERBOSITY", "GRPC_TRACE")}
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _expected_lines(block: str) -> list[str]:
    return [m.group(1).strip() for m in map(_PRINT_WITH_VALUE.match, block.splitlines()) if m]


def _check(result: subprocess.CompletedProcess, block: str, what: str) -> None:
    details = f"{what} failed (exit code {result.returncode}).\n--- block ---\n{block}\n" \
              f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    assert result.returncode == 0, details
    assert not _PYTHON_TRACEBACK.search(result.stderr), details
    lines = [line.strip() for line in result.stdout.splitlines()]
    for expected in _expected_lines(block):
        assert expected in lines, f"the page says this prints {expected!r}\n{details}"


def _run(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    # The catalogue's blocks prepare datasets: into the test's directory, not the user's ~/tensorflow_datasets.
    env = dict(_env(), DATASERVICE_DATA_DIR=str(cwd / "datasets"))
    return subprocess.run([sys.executable, script.name, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=SNIPPET_TIMEOUT_S)


def _for_cluster(block: str, port: int) -> str:
    return block.replace(README_PORT, f"localhost:{port}")


class _Lines:
    """A process's stdout lines, collected on a thread so that waiting for one has a deadline."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, args=(proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next(self, timeout_s: float) -> Optional[str]:
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            return None
        return line

    def rest(self) -> list[str]:
        out = []
        while True:
            line = self.lines.get(timeout=SNIPPET_TIMEOUT_S)
            if line is None:
                return out
            out.append(line)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def cluster_port(tmp_path_factory):
    """``dataservice local --port 0 --workers 2``, started from ``/``; yields its port."""
    log = tmp_path_factory.mktemp("cluster") / "stderr.txt"
    with open(log, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "dataservice", "local", "--port", "0", "--workers", "2"],
                                cwd="/", env=_env(), stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        lines = _Lines(proc)
        line = lines.next(START_TIMEOUT_S)
        match = _CLUSTER_LINE.match(line or "")
        assert match, f"the local cluster printed {line!r}; stderr:\n{log.read_text()}"
        yield int(match.group(1))
    finally:
        _stop(proc)


def _every_block() -> list[str]:
    """The blocks of every page, README.md first."""
    return [b for page in _pages() for b in _blocks(page)]


def test_the_pages_have_every_kind_of_block():
    kinds = [_kind(b) for b in _every_block()]
    assert kinds.count("standalone") >= 4
    assert kinds.count("process") == 2
    assert kinds.count("file") >= 2
    assert any(_FILE_HEADER.match(b).group(2) for b in _every_block() if _kind(b) == "file")
    assert [_kind(b) for b in _blocks()].count("standalone") >= 1  # the README's own example


def test_the_site_has_runnable_blocks():
    assert any(page.startswith("docs/") for page, _ in _runnable())


@pytest.mark.parametrize("page,index", _runnable(), ids=[f"{p}:{i}" for p, i in _runnable()])
def test_a_block_runs_as_pasted(page, index, tmp_path, request):
    block = _blocks(REPO / page)[index]
    if _kind(block) == "cluster":
        block = _for_cluster(block, request.getfixturevalue("cluster_port"))
    script = tmp_path / "snippet.py"
    script.write_text(block)
    result = _run(script, cwd=tmp_path)
    if _aborted_in_gloo_teardown(result, block):
        # torch can abort the process in C++ at interpreter exit (the gloo backend's teardown), after
        # destroy_process_group and after the block's work and output are done (pytorch/pytorch#179291
        # discusses such an abort): seen once in many CI runs.
        # Run once more; the second run is checked as strictly as the first.
        result = _run(script, cwd=tmp_path)
    _check(result, block, f"{page} block {index}")


def _aborted_in_gloo_teardown(result: subprocess.CompletedProcess, block: str) -> bool:
    """The process was aborted (SIGABRT) by C++'s std::terminate and nothing else was wrong: a block using
    torch.distributed, every line it says it prints printed, no Python traceback."""
    lines = [line.strip() for line in result.stdout.splitlines()]
    return (result.returncode == -signal.SIGABRT and "torch.distributed" in block
            and result.stderr.strip() == "terminate called without an active exception"
            and bool(lines) and all(expected in lines for expected in _expected_lines(block)))


def test_the_example_project_runs_on_workers_that_lack_its_files(tmp_path, cluster_port):
    project = tmp_path / "project"
    scripts = []
    for block in (b for b in _every_block() if _kind(b) == "file"):
        name, run = _FILE_HEADER.match(block.splitlines()[0]).groups()
        path = project / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_for_cluster(block, cluster_port))
        for package in path.relative_to(project).parents:
            if package != Path("."):
                (project / package / "__init__.py").touch()
        if run:
            scripts.append((project / run, block))
    assert scripts
    for script, block in scripts:
        first, again = (_run(script, cwd=project) for _ in range(2))
        _check(first, block, f"{script.name} (first run)")
        _check(again, block, f"{script.name} (second run)")
        dataset_id = first.stdout.split()[0]
        assert dataset_id.isdigit(), first.stdout
        assert again.stdout.split()[0] == dataset_id  # the same code, another process: the same id


def test_process_2_reads_with_the_dataset_id_process_1_prints(tmp_path, cluster_port):
    blocks = {b.splitlines()[0][:11]: _for_cluster(b, cluster_port) for b in _every_block() if _kind(b) == "process"}
    one, two = tmp_path / "process1.py", tmp_path / "process2.py"
    one.write_text(blocks["# process 1"])
    two.write_text(blocks["# process 2"])
    stderr_file = tmp_path / "process1.stderr"
    with open(stderr_file, "w") as stderr:
        proc = subprocess.Popen([sys.executable, one.name], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                                stderr=stderr, text=True)
    try:
        lines = _Lines(proc)
        dataset_id = lines.next(SNIPPET_TIMEOUT_S)
        assert dataset_id and dataset_id.isdigit(), f"process 1 printed {dataset_id!r} first"
        second = _run(two, dataset_id, cwd=tmp_path)  # started as soon as the id is known
        rest = lines.rest()
        proc.wait(timeout=SNIPPET_TIMEOUT_S)
        first = subprocess.CompletedProcess(proc.args, proc.returncode, "\n".join([dataset_id, *rest]),
                                            stderr_file.read_text())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _check(first, blocks["# process 1"], "process 1")
    _check(second, blocks["# process 2"], "process 2")
    counts = [int(m.group(1)) for out in (first.stdout, second.stdout)
              for m in [re.search(r"read (\d+) elements", out)] if m]
    assert len(counts) == 2, (first.stdout, second.stdout)
    assert sum(counts) == 1_000_000, counts  # together: every element once


# --- the cluster in three terminals ------------------------------------------------------------------------

_SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.M | re.S)
_LISTENING = re.compile(r"^(dispatcher|worker) listening on ")


#: The quickstarts: their cluster "in three terminals" is run as written (other pages' ```sh blocks show
#: synopses with placeholders, certificates and hosts of a real deployment).
QUICKSTARTS = (README, DOCS / "get-started.md")


def _terminal_blocks() -> list[tuple[str, list[str]]]:
    """``(page, commands)`` of each quickstart's ```sh block that starts a cluster by hand."""
    found = []
    for page in QUICKSTARTS:
        for block in _SH_BLOCK.findall(page.read_text()):
            commands = [line.split("#")[0].split() for line in block.splitlines() if line.strip().startswith("dataservice")]
            if any(c[:2] == ["dataservice", "dispatcher"] for c in commands):
                found.append((str(page.relative_to(REPO)), commands))
    return found


@pytest.mark.parametrize("page,commands", _terminal_blocks(), ids=[p for p, _ in _terminal_blocks()])
def test_the_cluster_commands_start_a_cluster_the_pages_example_reads(page, commands, tmp_path):
    """The page's terminal commands as written, but for their ports (0: any free one, the dispatcher's read from
    what it prints); then the page's first cluster block reads from that cluster."""
    procs = []
    try:
        port = None
        for command in commands:
            argv = [a.replace("localhost:5050", f"localhost:{port}") for a in command[1:]]
            argv = ["0" if previous == "--port" else a for previous, a in zip([""] + argv, argv)]
            proc = subprocess.Popen([sys.executable, "-m", "dataservice", *argv], cwd=tmp_path, env=_env(),
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            procs.append(proc)
            line = _Lines(proc).next(START_TIMEOUT_S) or ""
            assert _LISTENING.match(line), f"`{' '.join(command)}` printed {line!r}"
            if command[1] == "dispatcher":
                port = int(re.search(r":(\d+)\s*$", line).group(1))
        block = next(b for b in _blocks(REPO / page) if _kind(b) == "cluster")
        script = tmp_path / "read.py"
        script.write_text(_for_cluster(block, port))
        _check(_run(script, cwd=tmp_path), block, f"{page}'s cluster block, on the cluster of its terminals")
    finally:
        for proc in procs:
            _stop(proc)


def test_only_torchs_abort_at_exit_after_a_complete_run_is_run_again():
    block = "import torch.distributed as dist\nprint('done')\n"
    aborted = subprocess.CompletedProcess([], -signal.SIGABRT, "done\n",
                                          "terminate called without an active exception\n")
    assert _aborted_in_gloo_teardown(aborted, block)
    for other in (subprocess.CompletedProcess([], 1, "done\n", "terminate called without an active exception\n"),
                  subprocess.CompletedProcess([], -signal.SIGABRT, "", "terminate called without an active exception\n"),
                  subprocess.CompletedProcess([], -signal.SIGABRT, "done\n", "Traceback (most recent call last):\n")):
        assert not _aborted_in_gloo_teardown(other, block)
    assert not _aborted_in_gloo_teardown(aborted, "print('done')\n")  # no torch.distributed: a real failure
