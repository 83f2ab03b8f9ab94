"""Issue 27 with real processes: CLI dispatchers and workers (``python -m dataservice dispatcher|worker``)
and trainer subprocesses (tests/resumable_trainer.py), killed with SIGKILL.

- The deterministic order is the same with 1 and 3 worker processes (random per-element delays) for map,
  filter, batch and a seeded shuffle spanning several splits, and the local order for map and filter.
- The deterministic order is the local order although a worker is killed -9 mid-epoch.
- A trainer saves its state at step k to a file and is killed -9; a worker joins; a new trainer restores the
  state: head + tail is the uninterrupted run (deterministic) or the epoch exactly once (dynamic).
- The same across a fault-tolerant dispatcher killed -9 and restarted on its journal, before the restore and
  in the middle of the restored read.
- A restore at ~80% of the epoch on a fresh cluster calls the map (counted by the workers in a file) for the
  rest of the epoch and one group's prefix, not the whole epoch.
- Elastic readers: 2 trainers save at one step and are killed -9; 3 trainers restore their states on a
  grown cluster; every element once across the two runs, each trainer its every third element.

Every wait has a deadline; every process is killed at the end (the ``procs`` fixture).
"""

from __future__ import annotations

import collections
import functools
import json
import time
from pathlib import Path

import numpy as np
import pytest

from dataservice import Dataset, distribute
from tests import resumable_trainer as trainer
from tests.processes import BackgroundReader, Proc, Processes, Server, wait_for_workers, wait_until

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")]

#: How long a trainer may take to save its state, or to read the rest of the epoch.
TRAINER_TIMEOUT_S = 30.0


@functools.lru_cache(maxsize=1)
def _local_run() -> tuple:
    return tuple(int(x) for x in trainer.source())


def local_run() -> list[int]:
    """The uninterrupted run of a deterministic read of the trainer's pipeline: its local order (run once:
    its map takes a millisecond per element)."""
    return list(_local_run())


def start_trainer(procs: Processes, dispatcher: Server, out: Path, *flags: str) -> Proc:
    return procs.spawn("-m", "tests.resumable_trainer", "--dispatcher", dispatcher.target, "--out", str(out),
                       *flags, name="trainer")


def save_then_kill(procs: Processes, dispatcher: Server, tmp_path: Path, save_at: int,
                   deterministic: bool) -> tuple[list[int], dict]:
    """A trainer takes ``save_at`` elements, saves its state and is killed -9: what it took, and the state."""
    out, state_file = tmp_path / "head.txt", tmp_path / "state.json"
    first = start_trainer(procs, dispatcher, out, *(["--deterministic"] if deterministic else []),
                          "--save-at", str(save_at), "--state", str(state_file), "--then", "block")
    first.wait_for_line(rf"^saved {save_at}$", TRAINER_TIMEOUT_S)
    first.kill9()
    head = trainer.read_lines(str(out))
    assert len(head) == save_at, f"the first trainer wrote {len(head)} elements, not {save_at}"
    return head, json.loads(state_file.read_text())


def restore(procs: Processes, dispatcher: Server, tmp_path: Path, deterministic: bool, name: str = "tail") -> Proc:
    return start_trainer(procs, dispatcher, tmp_path / f"{name}.txt", *(["--deterministic"] if deterministic else []),
                         "--load", str(tmp_path / "state.json"), "--then", "continue")


def finish(proc: Proc, out: Path) -> list[int]:
    """The elements a restored trainer wrote, once it printed ``done``."""
    done = proc.wait_for_line(r"^done (\d+)$", TRAINER_TIMEOUT_S)
    tail = trainer.read_lines(str(out))
    assert int(done.group(1)) == len(tail)
    assert proc.popen.wait(timeout=10) == 0, proc.stderr[-3000:]
    return tail


def assert_same_sequence(got: list[int], want: list[int], what: str) -> None:
    if got != want:
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        raise AssertionError(f"{what}: {len(got)} elements vs {len(want)}; first difference at index {first}: "
                             f"{got[first:first + 5]} vs {want[first:first + 5]}")


def assert_exactly_once(got: list[int], want: list[int], what: str) -> None:
    have, need = collections.Counter(got), collections.Counter(want)
    assert have == need, (f"{what}: not exactly once: {len(got)} elements vs {len(want)}; repeated "
                          f"{sorted((have - need).elements())[:5]}, lost {sorted((need - have).elements())[:5]}")


# --- the order is the same with 1 and 3 worker processes -------------------------------------------------

ORDERED_PIPELINES = {
    "map": lambda: Dataset.range(3_000).map(trainer.jittered).map(lambda x: x * 3),
    "filter": lambda: Dataset.range(3_000).map(trainer.jittered).filter(trainer.keep),
    "batch": lambda: Dataset.range(3_000).map(trainer.jittered).batch(7),
    # 4 groups of 3 splits: the buffer (600) spans several splits; seeded, so keyed on the group.
    "seeded shuffle": lambda: Dataset.range(3_000).shuffle(600, seed=1).map(trainer.jittered),
}


def test_the_deterministic_order_is_the_same_with_one_and_three_worker_processes(procs: Processes):
    dispatcher = procs.dispatcher()
    workers = [procs.worker(dispatcher.port)]
    wait_for_workers(dispatcher.port, [w.address for w in workers])

    def read(name: str) -> list:
        ds = ORDERED_PIPELINES[name]().apply(distribute("distributed_epoch", dispatcher.target, deterministic=True,
                                                         timeout_ms=30_000))
        return [np.asarray(x).tolist() for x in ds]

    assert ORDERED_PIPELINES["seeded shuffle"]().split_groups().num_groups > 1
    with_one = {name: read(name) for name in ORDERED_PIPELINES}
    workers += procs.workers(dispatcher.port, 2)
    wait_for_workers(dispatcher.port, [w.address for w in workers])
    for name in ORDERED_PIPELINES:
        assert_same_sequence(read(name), with_one[name], f"{name}: 3 workers against 1")
    for name in ("map", "filter"):  # per-element pipelines: the local order itself
        assert_same_sequence(with_one[name], [np.asarray(x).tolist() for x in ORDERED_PIPELINES[name]()],
                             f"{name}: 1 worker against the local order")


# --- (a) the order under a worker's kill -9 ---------------------------------------------------------

def test_deterministic_order_survives_a_worker_killed_mid_epoch(procs: Processes):
    dispatcher = procs.dispatcher()
    workers = procs.workers(dispatcher.port, 3)
    wait_for_workers(dispatcher.port, [w.address for w in workers])
    pipeline = Dataset.range(trainer.NUM_ELEMENTS).filter(trainer.keep).map(trainer.with_pid)
    local = [int(x) for x, _ in pipeline]
    reader = BackgroundReader(pipeline.apply(distribute("distributed_epoch", dispatcher.target, deterministic=True,
                                                        max_outstanding_requests=64, timeout_ms=30_000)),
                              convert=lambda e: (int(e[0]), int(e[1])))
    reader.wait_for(len(local) // 4, TRAINER_TIMEOUT_S, "before the kill")
    # The worker that made the last element taken: it is producing now, or holds a group ahead.
    victim_pid = reader.items[-1][1]
    victim = next(w for w in workers if w.proc.pid == victim_pid)
    victim.proc.kill9()
    killed_at = reader.count
    items = reader.join(TRAINER_TIMEOUT_S)
    assert_same_sequence([x for x, _ in items], local, "deterministic read with a worker killed -9")
    assert killed_at < len(local), "the read ended before the kill"
    assert {pid for _, pid in items[killed_at:]} - {victim_pid}, "no other worker produced after the kill"


# --- (b), (c) a trainer killed after saving, restored on a cluster with a worker added -----------------

@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "dynamic"])
def test_trainer_killed_after_saving_resumes_on_a_grown_cluster(procs: Processes, tmp_path: Path,
                                                                 deterministic: bool):
    dispatcher = procs.dispatcher("--client-timeout-ms", "3000")
    workers = procs.workers(dispatcher.port, 2)
    wait_for_workers(dispatcher.port, [w.address for w in workers])
    full = local_run()
    head, state = save_then_kill(procs, dispatcher, tmp_path, 1_500, deterministic)
    if deterministic:
        assert len(json.dumps(state)) <= 4096
    added = procs.worker(dispatcher.port)
    wait_for_workers(dispatcher.port, [added.address])
    tail = finish(restore(procs, dispatcher, tmp_path, deterministic), tmp_path / "tail.txt")
    if deterministic:
        assert_same_sequence(head, full[:len(head)], "the first trainer's elements")
        assert_same_sequence(head + tail, full, "head + tail")
    else:
        assert_exactly_once(head + tail, full, "head + tail")


# --- (d) a fault-tolerant dispatcher killed -9 and restarted -----------------------------------------

def test_restore_across_fault_tolerant_dispatcher_restarts(procs: Processes, tmp_path: Path):
    journal = tmp_path / "journal"
    dispatcher = procs.dispatcher("--client-timeout-ms", "3000", work_dir=journal)
    workers = procs.workers(dispatcher.port, 2)
    wait_for_workers(dispatcher.port, [w.address for w in workers])
    full = local_run()
    head, _ = save_then_kill(procs, dispatcher, tmp_path, 1_000, deterministic=True)

    # Killed between the save and the restore: the restored read starts on the recovered dispatcher.
    dispatcher.proc.kill9()
    dispatcher = procs.dispatcher("--client-timeout-ms", "3000", port=dispatcher.port, work_dir=journal)
    wait_for_workers(dispatcher.port, [w.address for w in workers])
    second = restore(procs, dispatcher, tmp_path, deterministic=True)
    out = tmp_path / "tail.txt"
    wait_until(lambda: len(trainer.read_lines(str(out))) >= 300 or second.popen.poll() is not None,
               TRAINER_TIMEOUT_S, "the restored trainer to take 300 elements", interval_s=0.02)
    # Killed in the middle of the restored read: the restored job (and where it started) is in the journal.
    dispatcher.proc.kill9()
    taken_before_restart = len(trainer.read_lines(str(out)))
    dispatcher = procs.dispatcher("--client-timeout-ms", "3000", port=dispatcher.port, work_dir=journal)
    tail = finish(second, out)
    assert taken_before_restart < len(tail), "the restored read ended before the second restart"
    assert_same_sequence(head + tail, full, "head + tail across two dispatcher restarts")


# --- no replay: map calls counted on the workers -----------------------------------------------------

def test_a_restore_at_80_percent_calls_the_map_for_the_rest_only(procs: Processes, tmp_path: Path):
    full = local_run()
    first = procs.dispatcher()
    workers = procs.workers(first.port, 2)
    wait_for_workers(first.port, [w.address for w in workers])
    cut = len(full) * 8 // 10
    head, state = save_then_kill(procs, first, tmp_path, cut, deterministic=True)

    # The restore reads another cluster (the trainer restarted elsewhere): only its workers count calls, so
    # nothing of the saved read's tasks is counted.
    calls_file = tmp_path / "calls"
    procs.env = {**procs.env, trainer.CALLS_FILE_ENV: str(calls_file)}
    second = procs.dispatcher()
    fresh = procs.workers(second.port, 2)
    wait_for_workers(second.port, [w.address for w in fresh])
    started = time.monotonic()
    tail = finish(restore(procs, second, tmp_path, deterministic=True), tmp_path / "tail.txt")
    elapsed = time.monotonic() - started
    assert_same_sequence(head + tail, full, "head + tail")
    calls = calls_file.stat().st_size if calls_file.exists() else 0
    # The map runs before the filter, on the inputs range(NUM_ELEMENTS): the head took the inputs up to its
    # last element; the group it stopped in may be run again up to there, and nothing before that group.
    remaining_inputs = trainer.NUM_ELEMENTS - (head[-1] + 1)
    bound = remaining_inputs + trainer.GROUP_ELEMENTS + 16
    assert len(tail) <= calls <= bound, (
        f"the restore called the map {calls} times for {remaining_inputs} remaining inputs (bound {bound}; the "
        f"epoch: {trainer.NUM_ELEMENTS}), restored in {elapsed:.1f} s")


# --- elastic readers: 2 trainers save, 3 restore -----------------------------------------------------------

def test_two_trainers_killed_after_saving_resume_as_three_every_element_once(procs: Processes, tmp_path: Path):
    dispatcher = procs.dispatcher("--client-timeout-ms", "3000")
    workers = procs.workers(dispatcher.port, 2)
    wait_for_workers(dispatcher.port, [w.address for w in workers])
    full = local_run()
    step = 600
    ranks = [start_trainer(procs, dispatcher, tmp_path / f"head{i}.txt", "--deterministic", "--job-name", "train",
                           "--num-readers", "2", "--reader-index", str(i), "--save-at", str(step),
                           "--state", str(tmp_path / f"state{i}.json"), "--then", "block") for i in range(2)]
    for rank in ranks:
        rank.wait_for_line(rf"^saved {step}$", TRAINER_TIMEOUT_S)
    for rank in ranks:
        rank.kill9()
    heads = [trainer.read_lines(str(tmp_path / f"head{i}.txt")) for i in range(2)]
    for i, head in enumerate(heads):
        assert_same_sequence(head, full[i::2][:step], f"rank {i} of 2")
    states = [json.loads((tmp_path / f"state{i}.json").read_text()) for i in range(2)]
    assert {s["position"]["position"] for s in states} == {2 * step}

    added = procs.worker(dispatcher.port)
    wait_for_workers(dispatcher.port, [added.address])
    ranks = [start_trainer(procs, dispatcher, tmp_path / f"tail{i}.txt", "--deterministic", "--job-name", "train",
                           "--num-readers", "3", "--reader-index", str(i),
                           "--load", str(tmp_path / f"state{i % 2}.json"), "--then", "continue") for i in range(3)]
    tails = [finish(rank, tmp_path / f"tail{i}.txt") for i, rank in enumerate(ranks)]
    rest = full[2 * step:]
    for i, tail in enumerate(tails):
        assert_same_sequence(tail, rest[i::3][:len(rest) // 3], f"rank {i} of 3")
    whole_rounds = full[:2 * step + 3 * (len(rest) // 3)]
    assert_exactly_once([x for part in heads + tails for x in part], whole_rounds, "2 ranks, then 3")
