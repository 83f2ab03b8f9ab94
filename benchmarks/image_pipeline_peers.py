"""The image pipeline of ``benchmarks.image_pipeline``: the images, the per-image work, the CPU count of a
process tree, and the peers' side (torch DataLoader, SPDL, Grain).

Imports nothing of dataservice, so the very same ``transform`` runs on our workers and in the peers'
loaders; it needs numpy and Pillow (a benchmark-only need, never a dependency of dataservice). The peers
run under an interpreter that has torch, SPDL and Grain (``/work/peervenv``); ``benchmarks.image_pipeline``
starts it as ``<peer-python> -m benchmarks.image_pipeline_peers '<json config>'`` after its own
measurements (so the two never share the CPUs) and reads the JSON it prints last.

The work per image, as the issue gives it: read the JPEG file, decode it with Pillow, random-resized crop
to 224x224 (scale 0.08-1, ratio 3/4-4/3, bilinear), random horizontal flip, normalize to float32 CHW with
the ImageNet mean and std; 32 images make a batch ``(indices int64[32], images float32[32, 3, 224, 224])``.
The random choices come from ``(seed, epoch, index)``, so every system does the same work.

Example::

    $ /work/peervenv/bin/python -m benchmarks.image_pipeline_peers '{"dir": "/tmp/images", "n": 2000,
          "batch": 32, "workers": 2, "repeats": 3, "seed": 0}'
    {"versions": {...}, "systems": [{"name": "torch DataLoader(num_workers=2), persistent workers",
     "images_per_s": ..., "cpu_s_per_1000": ..., ...}, ...]}
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import numpy as np

__all__ = ["IMAGE_SIZE", "CROP", "make_images", "image_paths", "transform", "collate", "tree_cpu_s",
           "measure_epochs", "plain_loop", "plain_loops_side_by_side", "main"]

#: The source images (width, height) and the crop the pipeline makes of each.
IMAGE_SIZE = (320, 240)
CROP = 224
MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 1, 3) * 255
STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 1, 3) * 255
JPEG_QUALITY = 90
#: The longest a side-by-side loop's process may take over its share of an epoch.
SHARD_TIMEOUT_S = 600.0


def image_paths(directory: str, n: int) -> list[str]:
    """The paths of the ``n`` images ``make_images`` writes in ``directory``, in order.

    Example::

        >>> image_paths("/tmp/images", 2)
        ['/tmp/images/000000.jpg', '/tmp/images/000001.jpg']
    """
    return [os.path.join(directory, f"{i:06d}.jpg") for i in range(n)]


def make_images(directory: str, n: int, seed: int = 0) -> list[str]:
    """Writes ``n`` JPEGs of 320x240 into ``directory`` once (kept as a cache: an image already there is not
    made again); the paths. Deterministic: image ``i`` depends on ``(seed, i)`` only. Each is a smooth random
    field (a 40x30 random image scaled up) with fine noise on it, so it compresses and decodes like a photo
    rather than like pure noise.

    Example::

        >>> paths = make_images("/tmp/images", 2000)   # about 25 KB each, some seconds the first time
    """
    from PIL import Image

    os.makedirs(directory, exist_ok=True)
    paths = image_paths(directory, n)
    w, h = IMAGE_SIZE
    for i, path in enumerate(paths):
        if os.path.exists(path):
            continue
        rng = np.random.default_rng([seed, i])
        coarse = Image.fromarray(rng.integers(0, 256, (h // 8, w // 8, 3), dtype=np.uint8))
        smooth = np.asarray(coarse.resize((w, h), Image.BICUBIC), dtype=np.int16)
        noisy = np.clip(smooth + rng.integers(-12, 13, (h, w, 3)), 0, 255).astype(np.uint8)
        tmp = f"{path}.tmp{os.getpid()}"
        Image.fromarray(noisy).save(tmp, "JPEG", quality=JPEG_QUALITY)
        os.replace(tmp, path)  # a reader never sees half an image, nor do two makers clash
    return paths


def _crop_box(rng: np.random.Generator, w: int, h: int) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop box (scale 0.08-1, ratio 3/4-4/3; 10 tries, then the centre)."""
    area = w * h
    log_ratio = (math.log(3 / 4), math.log(4 / 3))
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        ratio = math.exp(rng.uniform(*log_ratio))
        cw, ch = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < cw <= w and 0 < ch <= h:
            x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            return x, y, x + cw, y + ch
    side = min(w, h)
    x, y = (w - side) // 2, (h - side) // 2
    return x, y, x + side, y + side


def transform(path: str, index: int, seed: int = 0, epoch: int = 0) -> tuple:
    """``(index, float32[3, 224, 224])``: the JPEG at ``path`` decoded, random-resized cropped to 224, flipped at
    random, normalized (ImageNet mean and std) to CHW. The random choices come from ``(seed, epoch, index)``.

    Example::

        >>> i, image = transform("/tmp/images/000007.jpg", 7)
        >>> image.shape, image.dtype
        ((3, 224, 224), dtype('float32'))
    """
    from PIL import Image

    index = int(index)
    rng = np.random.default_rng([seed, epoch, index])
    with Image.open(path) as im:
        im = im.convert("RGB")
        box = _crop_box(rng, *im.size)
        im = im.resize((CROP, CROP), Image.BILINEAR, box=box)
    a = np.asarray(im, dtype=np.float32)
    if rng.random() < 0.5:
        a = a[:, ::-1]
    a = (a - MEAN) / STD
    return np.int64(index), np.ascontiguousarray(a.transpose(2, 0, 1))


def collate(items: list) -> tuple:
    """A batch of ``transform`` results: ``(int64[b], float32[b, 3, 224, 224])``.

    Example::

        >>> indices, images = collate([transform(p, i) for i, p in enumerate(paths[:32])])
    """
    return np.array([i for i, _ in items], np.int64), np.stack([a for _, a in items])


# --- the CPU of a process tree ------------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> Optional[tuple[int, int]]:
    """(parent pid, utime + stime + cutime + cstime in ticks) of ``pid``, from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])


def tree_cpu_s(root: Optional[int] = None) -> float:
    """CPU seconds (user + system) used so far by process ``root`` (default: this one) and every descendant,
    the exited ones included: the sum over the live tree of each process's own time and its reaped
    children's (``cutime``, ``cstime``). A descendant that exited and was reaped counts in its reaper's
    ``cutime``, so the difference of two calls is the tree's CPU between them, exact to a clock tick; only a
    process re-parented away from the tree (an orphan) would be lost, and none of the systems here makes one.

    Example::

        >>> before = tree_cpu_s(); run_epoch(); used = tree_cpu_s() - before
    """
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = _stat(int(name))
        if stat is not None:
            children.setdefault(stat[0], []).append(int(name))
            ticks[int(name)] = stat[1]
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total / _TICK


def measure_epochs(run_epoch: Callable[[int], int], n: int, repeats: int, warmup: int = 1,
                   log: Callable[[str], None] = lambda m: None, name: str = "") -> dict:
    """``warmup`` untimed epochs, then ``repeats`` timed ones of ``run_epoch(epoch)`` (it returns the images it
    read, checked against ``n``): the medians of images/s and CPU-seconds per 1,000 images of this
    process's whole tree, and every run.

    Example::

        >>> measure_epochs(plain_loop(paths, 32, 0), len(paths), repeats=3)["images_per_s"]
        797.1
    """
    runs = []
    for epoch in range(warmup + repeats):
        cpu0, t0 = tree_cpu_s(), time.perf_counter()
        count = run_epoch(epoch)
        seconds, cpu = time.perf_counter() - t0, tree_cpu_s() - cpu0
        if count != n:
            raise RuntimeError(f"{name}: epoch {epoch} gave {count} images, expected {n}")
        if epoch >= warmup:
            runs.append({"seconds": seconds, "images_per_s": n / seconds, "cpu_s_per_1000": cpu / n * 1000,
                         "load": os.getloadavg()[0]})
            log(f"{name}: {n / seconds:,.0f} images/s, {cpu / n * 1000:.2f} CPU-s per 1,000 images; load "
                f"average {os.getloadavg()[0]:.2f}")
    return {"name": name, "runs": runs,
            "images_per_s": statistics.median(r["images_per_s"] for r in runs),
            "cpu_s_per_1000": statistics.median(r["cpu_s_per_1000"] for r in runs)}


def count_batches(batches: Iterable, batch: int, n: int) -> int:
    """The images in ``batches``, each batch ``(indices, images)`` checked for its shape (``n``: the images
    expected in all, for the message of a caller that compares).

    Example::

        >>> count_batches(DataLoader(dataset, batch_size=32), 32, 2000)
        2000
    """
    count = 0
    for indices, images in batches:
        if tuple(images.shape[1:]) != (3, CROP, CROP) or len(indices) != len(images) or len(images) > batch:
            raise RuntimeError(f"a batch of shape {tuple(images.shape)} and {len(indices)} indices")
        count += len(images)
    return count


def plain_loop(paths: list[str], batch: int, seed: int) -> Callable[[int], int]:
    """One process, no loader: the reference every loader is compared with. ``run(epoch)`` reads one epoch.

    Example::

        >>> run = plain_loop(paths, 32, seed=0); run(0)
        2000
    """
    def run(epoch: int) -> int:
        n = len(paths)
        return count_batches((collate([transform(paths[i], i, seed, epoch) for i in range(s, min(n, s + batch))])
                              for s in range(0, n, batch)), batch, n)
    return run


def _plain_shard(paths: list[str], batch: int, seed: int, epoch: int, shard: int, shards: int, out: Any) -> None:
    n = len(paths)
    out.put(count_batches((collate([transform(paths[i], i, seed, epoch) for i in range(s, min(n, s + batch))])
                           for s in range(shard * batch, n, shards * batch)), batch, n))


def plain_loops_side_by_side(paths: list[str], batch: int, seed: int, workers: int) -> Callable[[int], int]:
    """``workers`` forked processes, each the plain loop over every ``workers``-th batch, and nothing between
    them and this process but a count: what ``workers`` cores give with no loader at all, the limit of every
    system here (on a VM two busy cores may run slower each than one alone).

    Example::

        >>> plain_loops_side_by_side(paths, 32, seed=0, workers=2)(0)
        2000
    """
    import multiprocessing

    context = multiprocessing.get_context("fork")

    def run(epoch: int) -> int:
        out = context.Queue()
        procs = [context.Process(target=_plain_shard, args=(paths, batch, seed, epoch, k, workers, out))
                 for k in range(workers)]
        for proc in procs:
            proc.start()
        counts = [out.get(timeout=SHARD_TIMEOUT_S) for _ in procs]  # a crashed child raises queue.Empty
        for proc in procs:
            proc.join()
        return sum(counts)
    return run


# --- the peers ---------------------------------------------------------------------------------------------

def _torch_systems(cfg: dict, paths: list[str]) -> list[tuple[str, Callable[[], Callable[[int], int]]]]:
    import torch
    from torch.utils.data import DataLoader, Dataset

    batch, workers, seed = cfg["batch"], cfg["workers"], cfg["seed"]
    torch.set_num_threads(1)

    class Images(Dataset):
        def __init__(self):
            self.epoch = 0

        def __len__(self) -> int:
            return len(paths)

        def __getitem__(self, i: int) -> tuple:
            return transform(paths[i], i, seed, self.epoch)

    def loader_system(persistent: bool) -> Callable[[], Callable[[int], int]]:
        def setup() -> Callable[[int], int]:
            dataset = Images()
            # torch's default collate: the same stack as ``collate``, but in a worker it stacks straight into a
            # shared-memory tensor, which the main process maps (no copy on the way): torch at its best.
            loader = DataLoader(dataset, batch_size=batch, num_workers=workers, persistent_workers=persistent)

            def run(epoch: int) -> int:
                dataset.epoch = epoch  # seen by fresh workers only; the same work either way
                return count_batches(loader, batch, len(paths))
            return run
        return setup

    return [(f"torch DataLoader(num_workers={workers}), persistent workers", loader_system(True)),
            (f"torch DataLoader(num_workers={workers})", loader_system(False))]


def _spdl_systems(cfg: dict, paths: list[str]) -> list[tuple[str, Callable[[], Callable[[int], int]]]]:
    from spdl.pipeline import PipelineBuilder

    batch, workers, seed = cfg["batch"], cfg["workers"], cfg["seed"]

    def setup() -> Callable[[int], int]:
        def run(epoch: int) -> int:
            pipeline = (PipelineBuilder()
                        .add_source(range(len(paths)))
                        .pipe(lambda i: transform(paths[i], i, seed, epoch), concurrency=workers)
                        .aggregate(batch)
                        .pipe(collate)
                        .add_sink(4)
                        .build(num_threads=workers))
            with pipeline.auto_stop():
                return count_batches(pipeline.get_iterator(timeout=600), batch, len(paths))
        return run

    return [(f"SPDL, {workers} threads", setup)]


def _grain_systems(cfg: dict, paths: list[str]) -> list[tuple[str, Callable[[], Callable[[int], int]]]]:
    import grain

    batch, workers, seed = cfg["batch"], cfg["workers"], cfg["seed"]

    def setup() -> Callable[[int], int]:
        def run(epoch: int) -> int:
            dataset = (grain.MapDataset.range(len(paths))
                       .map(lambda i: transform(paths[i], i, seed, epoch))
                       .batch(batch, batch_fn=collate)
                       .to_iter_dataset()
                       .mp_prefetch(grain.multiprocessing.MultiprocessingOptions(num_workers=workers)))
            it = iter(dataset)
            try:
                return count_batches(it, batch, len(paths))
            finally:
                close = getattr(it, "close", None) or getattr(it, "__del__", None)
                if close is not None:
                    close()
        return run

    # An iterator per epoch, Grain's default read options (each worker reads ahead with 16 threads and a buffer
    # of 500 elements). Not one iterator over endless epochs: its workers would read hundreds of batches
    # ahead, so an epoch's CPU would count work for later ones.
    return [(f"Grain mp_prefetch(num_workers={workers}), an iterator per epoch", setup)]


def _version(module: str) -> Optional[str]:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # noqa: BLE001 - any failure: not installed
        return None


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: Optional[list] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg = json.loads(argv[0])
    paths = image_paths(cfg["dir"], cfg["n"])
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise SystemExit(f"{len(missing)} images missing in {cfg['dir']} (make them with benchmarks.image_pipeline)")
    wanted = cfg.get("systems") or ["plain", "torch", "spdl", "grain"]
    out: dict = {"versions": {m: _version(m) for m in ("torch", "spdl", "grain", "numpy", "pillow")},
                 "python": sys.version.split()[0], "systems": [], "errors": []}
    families = {"plain": lambda c, p: [("plain loop, 1 process (peer venv)", lambda: plain_loop(p, c["batch"],
                                                                                                 c["seed"]))],
                "torch": _torch_systems, "spdl": _spdl_systems, "grain": _grain_systems}
    for family in wanted:
        try:
            systems = families[family](cfg, paths)
        except Exception as exc:  # noqa: BLE001 - an import failure is a result: the peer is not there
            out["errors"].append({"system": family, "error": f"{type(exc).__name__}: {exc}"})
            continue
        for name, setup in systems:
            run = None
            try:
                run = setup()
                out["systems"].append(measure_epochs(run, cfg["n"], cfg["repeats"], log=log, name=name))
            except Exception as exc:  # noqa: BLE001 - reported beside the others
                out["errors"].append({"system": name, "error": f"{type(exc).__name__}: {exc}",
                                      "traceback": traceback.format_exc()[-2000:]})
            finally:
                close = getattr(run, "close", None)
                if close is not None:
                    close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
