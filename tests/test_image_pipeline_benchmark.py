"""Smoke test of ``python -m benchmarks.image_pipeline``, our side only (no peers): a tiny run with a real
dispatcher and ``worker --processes 2`` prints its table, every epoch checked for its image count and batch
shapes; and the pieces it rests on (the images, the transform, the CPU count of a process tree). No figure is
asserted: performance is the benchmark's to measure, not a test's.

Pillow is a benchmark-only need (never a dependency of dataservice): without it these tests skip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL", reason="Pillow is not installed: the image-pipeline benchmark needs it (pip install pillow)")

from benchmarks.image_pipeline_peers import (CROP, IMAGE_SIZE, collate, make_images, plain_loop,  # noqa: E402
                                             plain_loops_side_by_side, transform, tree_cpu_s)

REPO = Path(__file__).resolve().parents[1]


def test_images_are_made_once_and_deterministically(tmp_path):
    from PIL import Image

    paths = make_images(str(tmp_path / "a"), 3, seed=5)
    again = make_images(str(tmp_path / "b"), 3, seed=5)
    assert [Path(p).read_bytes() for p in paths] == [Path(p).read_bytes() for p in again]
    with Image.open(paths[0]) as im:
        assert (im.format, im.size) == ("JPEG", IMAGE_SIZE)
    mtime = os.stat(paths[1]).st_mtime_ns
    assert make_images(str(tmp_path / "a"), 3, seed=5) == paths
    assert os.stat(paths[1]).st_mtime_ns == mtime  # the cache is kept


def test_transform_crops_flips_and_normalizes_deterministically(tmp_path):
    (path,) = make_images(str(tmp_path), 1)
    index, image = transform(path, 0, seed=1, epoch=2)
    assert index == 0 and image.shape == (3, CROP, CROP) and image.dtype == np.float32
    assert image.flags.c_contiguous
    assert -3 < float(image.mean()) < 3  # normalized, not 0..255
    np.testing.assert_array_equal(image, transform(path, 0, seed=1, epoch=2)[1])
    others = [transform(path, 0, seed=1, epoch=e)[1] for e in range(3, 8)]
    assert any(not np.array_equal(image, other) for other in others)  # another epoch, other crops
    indices, batch = collate([transform(path, 0), transform(path, 0)])
    assert indices.tolist() == [0, 0] and batch.shape == (2, 3, CROP, CROP)


def test_plain_loops_alone_and_side_by_side_read_every_image(tmp_path):
    paths = make_images(str(tmp_path), 10)
    assert plain_loop(paths, 4, 0)(0) == 10
    assert plain_loops_side_by_side(paths, 4, 0, 2)(0) == 10


def test_tree_cpu_counts_children_running_and_exited():
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    before = tree_cpu_s()
    running = subprocess.Popen([sys.executable, "-c", burn + "print('burnt', flush=True)\ninput()"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert running.stdout.readline().strip() == "burnt"
        assert tree_cpu_s() - before >= 0.28  # a live child counts (clock ticks: 10 ms)
    finally:
        running.communicate("\n", timeout=30)
    subprocess.run([sys.executable, "-c", burn], check=True, timeout=30)
    assert tree_cpu_s() - before >= 0.58  # both, exited and reaped: in this process's cutime


@pytest.mark.slow
def test_image_pipeline_benchmark_small_run(tmp_path):
    out = tmp_path / "report.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    result = subprocess.run([sys.executable, "-m", "benchmarks.image_pipeline", "--images", "48", "--batch", "16",
                             "--repeats", "1", "--warmup", "1", "--no-peers", "--cache-dir", str(tmp_path / "cache"),
                             "--timeout", "100", "--json", str(out)],
                            capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    lines = result.stdout.splitlines()
    for label in ("| plain loop, 1 process |", "| plain loops side by side, no loader, 2 processes |",
                  "| dataservice, `worker --processes 2` |"):
        assert any(line.startswith(label) for line in lines), f"no row {label!r}:\n{result.stdout}"
    assert any(line.startswith("dataservice CPU per image / plain loop's:") for line in lines)
    report = json.loads(out.read_text())
    assert [s["name"] for s in report["systems"]] == ["plain loop, 1 process",
                                                      "plain loops side by side, no loader, 2 processes",
                                                      "dataservice, `worker --processes 2`"]
    for system in report["systems"]:
        assert len(system["runs"]) == 1 and system["images_per_s"] > 0 and system["cpu_s_per_1000"] > 0
    assert len(list((tmp_path / "cache").glob("images-320x240-seed0/*.jpg"))) == 48
