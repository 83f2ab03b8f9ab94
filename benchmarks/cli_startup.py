"""What the ``dataservice`` command's cheap commands cost: ``python -m benchmarks.cli_startup``.

Compose runs ``dataservice health`` in every container every few seconds, so its cost is paid by
the whole fleet (issue 28: at most 150 ms wall on the 2-core machine). This starts a real
dispatcher and a real worker (``dataservice dispatcher --port 0``, ``dataservice worker``), then
runs each command ``--runs`` times as a new process, the commands taking turns so that a noisy
neighbour hits them alike, and prints the median wall time and the median CPU time (user +
system, of the process and anything it waited for; more than the wall time where numpy is imported,
whose BLAS starts a thread per core) of each:

* ``python -c pass``: the interpreter's own start, the floor;
* ``--version``, ``health`` (of the dispatcher and of the worker) and ``status``, each as
  ``python -m dataservice`` and as the installed console script (``.venv/bin/dataservice``),
  which pyproject.toml's ``[project.scripts]`` points at ``dataservice.cli:main``.

``--tree NAME=DIR`` (repeatable) measures the ``dataservice`` package of another checkout, put first
on ``PYTHONPATH`` (e.g. one made with ``git archive <rev> | tar -x -C DIR``), beside this one: a
before/after table. The servers always come from this checkout. Python's bytecode cache is on, as in
an installed package (``pip install`` compiles it; ``PYTHONDONTWRITEBYTECODE`` is dropped from the
environment), and an untimed run of every command fills it first.

Example (2 cores, load average 0.5; rows cut here)::

    $ mkdir /tmp/before && git archive e24f70e dataservice | tar -x -C /tmp/before
    $ python -m benchmarks.cli_startup --tree before=/tmp/before --runs 9
    | command                                   | tree   | wall ms (median) | CPU ms (median) | wall ms (min) |
    | python -c pass                            |        |             20.1 |            19.0 |          18.7 |
    | dataservice --version                     | before |            266.7 |           368.3 |         237.4 |
    | dataservice --version                     | this   |             88.3 |            87.5 |          80.9 |
    | dataservice health (dispatcher)           | before |            280.8 |           379.7 |         263.1 |
    | dataservice health (dispatcher)           | this   |            114.1 |           112.9 |         110.5 |
    | dataservice status                        | before |            274.7 |           372.7 |         234.7 |
    | dataservice status                        | this   |            113.3 |           112.6 |         107.1 |
    ...
    health: at most 114.4 ms wall (median) here; budget 150 ms: within
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

from benchmarks.cluster_processes import REPO, BenchmarkError, ProcessGroup, start_dispatcher_and_worker

#: Issue 28's budget for ``dataservice health`` (median wall time on the 2-core machine).
HEALTH_BUDGET_MS = 150.0
#: The console script ``pip install`` puts beside the interpreter.
CONSOLE_SCRIPT = Path(sys.executable).parent / "dataservice"


def _commands(dispatcher: str, worker: str) -> list[tuple[str, list[str]]]:
    """(label, argv after the interpreter) of every measured command."""
    python_m = ["-m", "dataservice"]
    script = [str(CONSOLE_SCRIPT)]
    entries = [("python -m dataservice", python_m)] + ([("dataservice", script)] if CONSOLE_SCRIPT.exists() else [])
    commands = [("python -c pass", ["-c", "pass"])]
    for what, args in (("--version", ["--version"]),
                       ("health (dispatcher)", ["health", dispatcher, "--service", "dispatcher"]),
                       ("health (worker)", ["health", worker, "--service", "worker"]),
                       ("status", ["status", "--dispatcher", dispatcher])):
        for entry, argv in entries:
            commands.append((f"{entry} {what}", argv + args))
    return commands


def _env(tree: Optional[Path]) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("DATASERVICE_SERVICE", None)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (tree or REPO, env.get("PYTHONPATH")) if p)
    return env


def run_once(argv: Sequence[str], env: dict, cwd: str, timeout_s: float = 60.0) -> tuple[float, float]:
    """Runs ``python argv...`` in ``cwd`` to its end; returns (wall ms, CPU ms). A failed command raises.

    Example::

        >>> run_once(["-c", "pass"], dict(os.environ), "/tmp")
        (17.2, 15.0)
    """
    # The CPU of the reaped child: the difference of this process's children's times (the servers, also
    # children, are not reaped until the end).
    cpu_before = _children_cpu_ms()
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *argv], env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise BenchmarkError(f"{' '.join(argv)} took more than {timeout_s} s") from None
    wall_ms = (time.perf_counter() - start) * 1000
    if proc.returncode != 0:
        raise BenchmarkError(f"{' '.join(argv)} exited with {proc.returncode}: {err.decode(errors='replace')[-2000:]}")
    return wall_ms, _children_cpu_ms() - cpu_before


def _children_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # microseconds; os.times() has clock ticks only
    return (usage.ru_utime + usage.ru_stime) * 1000


def measure(trees: dict[str, Optional[Path]], runs: int, dispatcher: str, worker: str) -> list[dict]:
    """Median and minimum wall and CPU time of every command in every tree, the runs taking turns."""
    commands = _commands(dispatcher, worker)
    cases = [(label, argv, name) for label, argv in commands
             for name in (trees if not label.startswith("python -c") else [""])]
    envs = {name: _env(tree) for name, tree in trees.items()} | {"": _env(None)}
    # An empty working directory: `python -m` puts it first on sys.path, before PYTHONPATH's tree.
    cwd = tempfile.mkdtemp(prefix="cli-startup-")
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {(label, name): [] for label, _, name in cases}
    for label, argv, name in cases:  # untimed: fills the bytecode cache and the page cache
        run_once(argv, envs[name], cwd)
    for _ in range(runs):
        for label, argv, name in cases:
            samples[label, name].append(run_once(argv, envs[name], cwd))
    os.rmdir(cwd)
    rows = []
    for label, _, name in cases:
        walls = [wall for wall, _ in samples[label, name]]
        cpus = [cpu for _, cpu in samples[label, name]]
        rows.append({"command": label, "tree": name, "wall_ms_median": round(statistics.median(walls), 1),
                     "cpu_ms_median": round(statistics.median(cpus), 1), "wall_ms_min": round(min(walls), 1),
                     "runs": runs})
    return rows


def _table(rows: list[dict]) -> str:
    headers = ["command", "tree", "wall ms (median)", "CPU ms (median)", "wall ms (min)"]
    cells = [headers] + [[r["command"], r["tree"], f"{r['wall_ms_median']:.1f}", f"{r['cpu_ms_median']:.1f}",
                          f"{r['wall_ms_min']:.1f}"] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        lines.append("| " + " | ".join(c.ljust(w) if i < 2 else c.rjust(w)
                                       for i, (c, w) in enumerate(zip(row, widths))) + " |")
    return "\n".join(lines)


def _tree(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not (Path(path) / "dataservice" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"expected NAME=DIR, DIR holding a dataservice package, got {text!r}")
    return name, Path(path).resolve()


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="timed runs of each command (default: 9)")
    parser.add_argument("--tree", type=_tree, action="append", default=[], metavar="NAME=DIR",
                        help="also measure the dataservice package in DIR (repeatable), shown as NAME")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = parser.parse_args(argv)
    trees: dict[str, Optional[Path]] = dict(args.tree)
    trees["this"] = None
    load_before = os.getloadavg()
    with ProcessGroup() as group:
        service, _, worker_proc = start_dispatcher_and_worker(group, sys.executable)
        match = worker_proc.wait_for_line(r"^worker listening on [^:\s]+:(\d+)\b", 10)
        dispatcher = service.removeprefix("grpc://")
        rows = measure(trees, args.runs, dispatcher, f"localhost:{match.group(1)}")
    load_after = os.getloadavg()
    if args.json:
        print(json.dumps({"rows": rows, "loadavg_before": load_before, "loadavg_after": load_after}, indent=2))
        return 0
    print(f"dataservice CLI start-up: {args.runs} runs of each command, median; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after ({os.cpu_count()} cores)\n")
    print(_table(rows))
    health = [r for r in rows if "health" in r["command"] and r["tree"] == "this"]
    worst = max(r["wall_ms_median"] for r in health)
    print(f"\nhealth: at most {worst:.1f} ms wall (median) here; budget {HEALTH_BUDGET_MS:.0f} ms: "
          f"{'within' if worst <= HEALTH_BUDGET_MS else 'OVER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
