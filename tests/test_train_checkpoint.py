"""``client/train.py --checkpoint-dir``: model and data position saved together, atomically, and a killed
trainer resumed exactly.

``client/checkpoints.py`` on its own (complete or absent, the newest kept), then the example against a
cluster: in this process (a finished run resumes to nothing; a checkpoint of another configuration is
refused), and as real processes (slow): a CLI dispatcher and workers, a trainer subprocess killed with
SIGKILL right after a checkpoint, a worker added, the trainer run again. Its steps then read exactly
what an uninterrupted run's steps read (``--record-ids``): the same batches in the same order and the
same final weights with the deterministic order, every example once in the dynamic order. And the JAX
example (``client/train_jax.py --checkpoint-dir``), stopped twice and resumed: the same parameters.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from client import checkpoints, train
from tests.processes import REPO, subprocess_env

#: The longest a trainer subprocess may take on a loaded 2-core machine.
TRAIN_TIMEOUT_S = 60
#: Steps an epoch of the trainer subprocesses: 12,800 examples in batches of 64.
STEPS = 200


# --- client/checkpoints.py ----------------------------------------------------------------------------

def test_save_and_latest(tmp_path: Path) -> None:
    assert checkpoints.latest(str(tmp_path / "absent")) is None
    for step in (10, 20, 30):
        path = checkpoints.save(str(tmp_path), step, {"w": np.full((2, 3), step, np.float32)},
                                {"step": step, "data": {"position": [step]}})
        assert path == str(tmp_path / f"step-{step:08d}")
    assert checkpoints.steps(str(tmp_path)) == [20, 30]  # the newest two are kept
    latest = checkpoints.latest(str(tmp_path))
    assert (latest.step, latest.state) == (30, {"step": 30, "data": {"position": [30]}})
    np.testing.assert_array_equal(latest.arrays["w"], np.full((2, 3), 30, np.float32))
    assert latest.arrays["w"].dtype == np.float32


def test_a_half_written_checkpoint_is_no_checkpoint(tmp_path: Path) -> None:
    checkpoints.save(str(tmp_path), 5, {"w": np.zeros(1)}, {"step": 5})
    # What a writer killed mid-way leaves: a temporary directory, never a step-... one.
    half = tmp_path / ".tmp-killed"
    half.mkdir()
    (half / checkpoints.MODEL_FILE).write_bytes(b"PK\x03")
    assert checkpoints.steps(str(tmp_path)) == [5]
    assert checkpoints.latest(str(tmp_path)).step == 5
    checkpoints.save(str(tmp_path), 6, {"w": np.ones(1)}, {"step": 6})
    assert sorted(os.listdir(tmp_path)) == ["step-00000005", "step-00000006"]  # and the next save removes it


def test_saving_a_step_again_replaces_it(tmp_path: Path) -> None:
    checkpoints.save(str(tmp_path), 7, {"w": np.zeros(2)}, {"run": 1})
    checkpoints.save(str(tmp_path), 7, {"w": np.ones(2)}, {"run": 2})
    latest = checkpoints.latest(str(tmp_path))
    assert latest.state == {"run": 2} and latest.arrays["w"].tolist() == [1.0, 1.0]
    assert sorted(os.listdir(tmp_path)) == ["step-00000007"]


def test_a_state_that_is_not_json_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        checkpoints.save(str(tmp_path), 1, {"w": np.zeros(1)}, {"data": object()})
    assert os.listdir(tmp_path) == []


def test_read_record_keeps_the_later_record_of_a_step(tmp_path: Path) -> None:
    path = tmp_path / "ids.txt"
    # A run killed after its checkpoint at step 2 (its step 3 cut), then the run resumed from step 2.
    path.write_text("1 0: 0 1\n2 0: 2 3\n3 0: 4 5\n4 0: 6\n" "3 0: 4 5\n4 0: 6 7\n5 1: 0")
    assert train.read_record(str(path)) == {1: (0, [0, 1]), 2: (0, [2, 3]), 3: (0, [4, 5]), 4: (0, [6, 7])}


# --- the example's flags -------------------------------------------------------------------------------

def test_checkpoint_arguments() -> None:
    args = train.build_parser().parse_args([])
    assert (args.checkpoint_dir, args.checkpoint_every, args.deterministic, args.record_ids) == \
        (None, train.DEFAULT_CHECKPOINT_EVERY, None, None)
    args = train.build_parser().parse_args(["--checkpoint-dir", "/tmp/run", "--checkpoint-every", "25",
                                            "--no-deterministic", "--record-ids", "ids.txt"])
    assert (args.checkpoint_dir, args.checkpoint_every, args.deterministic, args.record_ids) == \
        ("/tmp/run", 25, False, "ids.txt")
    with pytest.raises(SystemExit):
        train.build_parser().parse_args(["--checkpoint-every", "0"])


def test_checkpoints_need_distributed_epoch(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        train.main(["--mode", "parallel_epochs", "--checkpoint-dir", str(tmp_path)])
    assert exc.value.code == 2
    assert "--checkpoint-dir: needs --mode distributed_epoch" in capsys.readouterr().err


# --- in this process, against a cluster ----------------------------------------------------------------

SMALL = {"num_examples": 640, "batch_size": 32, "progress": False}  # 20 steps


def test_a_finished_run_resumes_to_nothing(cluster, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    directory = str(tmp_path / "run")
    first = train.train(cluster.target, checkpoint_dir=directory, checkpoint_every=8, **SMALL)
    assert (first.step, first.elements, first.resumed_from_step) == (20, 640, None)
    assert checkpoints.steps(directory) == [16, 20]  # every 8 steps, and the end
    out = capsys.readouterr().out
    saved = re.findall(r"^checkpoint saved: \S+ \(step (\d+)(, the end: nothing left to read)?\)$", out, re.M)
    assert saved == [("8", ""), ("16", ""), ("20", ", the end: nothing left to read")]
    again = train.train(cluster.target, checkpoint_dir=directory, checkpoint_every=8, **SMALL)
    assert (again.step, again.elements, again.elements_before, again.resumed_from_step) == (20, 0, 640, 20)
    assert again.final_loss == first.final_loss
    assert re.search(r"^resumed from \S+step-00000020: step 20 \(the end of epoch 1/1\), 640 examples trained "
                     r"on before$", capsys.readouterr().out, re.M)
    # One more epoch is more training, from there.
    more = train.train(cluster.target, epochs=2, checkpoint_dir=directory, checkpoint_every=8, **SMALL)
    assert (more.step, more.elements, more.elements_before) == (40, 640, 640)


def test_a_checkpoint_of_another_training_is_refused(cluster, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    directory = str(tmp_path / "run")
    train.train(cluster.target, checkpoint_dir=directory, checkpoint_every=8, **SMALL)
    code = train.main(["--service", cluster.target, "--checkpoint-dir", directory, "--num-examples", "640",
                       "--batch-size", "64", "--no-progress"])
    assert code == 1
    err = capsys.readouterr().err
    assert "was written by another training: batch_size 32 (this run: 64)" in err, err
    assert "give another --checkpoint-dir" in err


# --- real processes: a trainer killed with SIGKILL and run again ------------------------------------------

def _trainer_args(service: str, directory: Path, record: Path, *extra: str) -> list[str]:
    return ["-m", "client.train", "--service", service, "--checkpoint-dir", str(directory), "--checkpoint-every",
            "20", "--num-examples", "12800", "--batch-size", "64", "--record-ids", str(record), "--no-progress",
            *extra]


@pytest.mark.slow
@pytest.mark.parametrize("order, epochs, kill_after_step", [
    ("deterministic", 1, 20),     # at the first checkpoint
    ("deterministic", 2, 220),    # in the second epoch (200 steps an epoch): a restored read, not the first
    ("dynamic", 1, 20),
])
def test_a_killed_trainer_resumes_exactly(procs, tmp_path: Path, order: str, epochs: int,
                                          kill_after_step: int) -> None:
    dispatcher = procs.dispatcher()
    procs.workers(dispatcher.port, 2)
    extra = ["--epochs", str(epochs)] + (["--no-deterministic"] if order == "dynamic" else [])

    # The uninterrupted run, in this process (the same steps, the same arithmetic).
    full_record = tmp_path / "full.txt"
    full = train.train(dispatcher.target, epochs=epochs, num_examples=12_800, batch_size=64, progress=False,
                       checkpoint_dir=str(tmp_path / "full"), checkpoint_every=20, record_ids=str(full_record),
                       deterministic=order == "deterministic", out=io.StringIO())
    assert full.step == STEPS * epochs

    directory, record = tmp_path / "run", tmp_path / "run.txt"
    first = procs.spawn(*_trainer_args(dispatcher.target, directory, record, *extra), name="trainer")
    first.wait_for_line(rf"^checkpoint saved: \S+ \(step {kill_after_step}\)$", timeout_s=TRAIN_TIMEOUT_S)
    first.kill9()
    assert first.popen.returncode == -signal.SIGKILL
    saved = checkpoints.steps(str(directory))
    assert saved and saved[-1] < STEPS * epochs, f"the trainer finished before it was killed: {saved}"
    killed_at = max(train.read_record(str(record)))

    procs.worker(dispatcher.port)  # the cluster the run resumes on has a worker more
    second = subprocess.run([sys.executable, *_trainer_args(dispatcher.target, directory, record, *extra)],
                            capture_output=True, text=True, env=subprocess_env(), cwd=REPO,
                            timeout=TRAIN_TIMEOUT_S)
    assert second.returncode == 0, second.stdout + second.stderr
    resumed = re.search(r"^resumed from \S+: step (\d+) \(epoch (\d)/\d, batch \d+\), ([\d,]+) examples", second.stdout,
                        re.M)
    assert resumed, second.stdout
    step = int(resumed.group(1))
    assert step == saved[-1] and step >= kill_after_step and int(resumed.group(2)) == 1 + (step - 1) // STEPS
    assert int(resumed.group(3).replace(",", "")) == step * 64
    assert killed_at >= step  # steps after the checkpoint were trained again, from it

    steps, expected = train.read_record(str(record)), train.read_record(str(full_record))
    assert sorted(steps) == list(range(1, STEPS * epochs + 1))
    for epoch in range(epochs):
        ids = sorted(i for e, batch in steps.values() if e == epoch for i in batch)
        assert ids == list(range(12_800)), f"epoch {epoch}: not every example exactly once"
    final = checkpoints.latest(str(directory))
    assert (final.step, final.state["elements"], final.state["data"]) == (STEPS * epochs, 12_800 * epochs, None)
    if order == "deterministic":
        assert steps == expected  # the same batches, at the same steps
        np.testing.assert_array_equal(final.arrays["weights"],
                                      checkpoints.latest(str(tmp_path / "full")).arrays["weights"])


# --- the JAX example: the data position saved beside the parameters -----------------------------------------

def test_jax_example_resumes_exactly(cluster, tmp_path: Path) -> None:
    pytest.importorskip("jax", reason="JAX is not installed: pip install -e '.[test]'")
    from client import train_jax

    data_dir, run = str(tmp_path / "data"), str(tmp_path / "run")
    common = {"data_dir": data_dir, "epochs": 2, "checkpoint_every": 20}
    full = train_jax.train(cluster.target, checkpoint_dir=str(tmp_path / "full"), out=io.StringIO(), **common)
    steps_per_epoch = full.step // 2
    assert steps_per_epoch > 60 and [e.examples for e in full.epochs] == [steps_per_epoch * 64] * 2

    # Two slices and the rest: stopped in the first epoch, then in the second, then to the end.
    out = io.StringIO()
    first = train_jax.train(cluster.target, checkpoint_dir=run, max_steps=30, out=out, **common)
    assert (first.step, first.epochs) == (30, [])
    assert f"stopped at step 30 (--max-steps); checkpoint saved: {run}/step-00000030" in out.getvalue()
    stop = steps_per_epoch + 10
    second = train_jax.train(cluster.target, checkpoint_dir=run, max_steps=stop, out=out, **common)
    assert (second.resumed_from_step, second.step, len(second.epochs)) == (30, stop, 1)
    assert f"resumed from {run}/step-00000030: step 30 (epoch 1/2, batch 30)" in out.getvalue()
    assert second.epochs[0] == dataclasses.replace(full.epochs[0], seconds=second.epochs[0].seconds,
                                                   stall_s=second.epochs[0].stall_s,
                                                   stall_fraction=second.epochs[0].stall_fraction)
    rest = train_jax.train(cluster.target, checkpoint_dir=run, out=out, **common)
    assert (rest.resumed_from_step, rest.step) == (stop, full.step)
    for name in full.params:  # the same batches in the same order: the same parameters, to the bit
        np.testing.assert_array_equal(np.asarray(rest.params[name]), np.asarray(full.params[name]), err_msg=name)
    assert (rest.epochs[0].examples, rest.epochs[0].loss, rest.test_accuracy) == \
        (full.epochs[1].examples, full.epochs[1].loss, full.test_accuracy)
    state = json.loads((Path(run) / f"step-{full.step:08d}" / checkpoints.STATE_FILE).read_text())
    assert state["epoch"] == 3 and state["data"] is None  # finished: a run started again has nothing to do
