"""The peers' side of ``benchmarks.resumable_reads``, and the per-element work both sides run.

Runs under an interpreter that has torch, torchdata and Grain (not dependencies of dataservice: a venv of
their own, say ``/work/peervenv``); it imports nothing of dataservice, so the same ``work`` function runs
on our workers and in the peers' loaders. ``benchmarks.resumable_reads`` starts it as
``<peer-python> -m benchmarks.resumable_reads_peers '<json config>'`` after its own measurements (so the
two never share the CPUs) and reads the JSON it prints last.

For each peer, over the same elements (``work(i)`` for ``i`` in ``range(n)``) and with 2 worker processes
where the peer has them, the median of ``repeats`` runs of:

- fresh: from ``iter(loader)`` to the first batch;
- the state at ``restore_at`` of the epoch: its size (pickled; and as JSON when it is JSON);
- restore: from ``load_state_dict`` / ``set_state`` on a new loader to the first batch, checked equal to the
  batch the saved iterator yielded next; then the rest of the epoch, counting the ``work`` calls the restored
  read made (``BENCH_COUNT_DIR``) against the elements that remained.

Peers: torchdata ``StatefulDataLoader(num_workers=2)`` over a map-style Dataset, over a plain
IterableDataset (which it replays on restore) and over an IterableDataset with ``state_dict``; Grain's
``DataLoader(worker_count=2)`` and a ``MapDataset`` iterator in the process. Each peer reads batches of
``batch`` elements, as they are used; a peer that cannot be imported is reported with the reason.

Example::

    $ /work/peervenv/bin/python -m benchmarks.resumable_reads_peers '{"n": 4096, "iters": 50, "floats": 1024,
          "restore_at": 0.8, "repeats": 1, "batch": 32}'
    {"versions": {...}, "peers": [{"name": "torchdata StatefulDataLoader ...", "state_bytes": ..., ...}, ...]}
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from typing import Any, Optional

import numpy as np

__all__ = ["work", "time_work", "count_calls", "main"]

#: Set in a process's environment: that process takes this many times as long per element (a slow worker)...
SLOWDOWN_ENV = "BENCH_SLOWDOWN"
#: ... by repeating its work ("work", the default: on a shared host it also takes CPU from the others), or by
#: sleeping as long again after it ("sleep": a slower host, which takes no CPU from this one's processes).
SLOW_BY_ENV = "BENCH_SLOW_BY"
#: Set in a process's environment: a directory where the process appends the index of each ``work`` call.
COUNT_DIR_ENV = "BENCH_COUNT_DIR"

#: A slow worker that sleeps sleeps at least this long at a time.
SLEEP_CHUNK_S = 0.002

#: This process's settings, read once: "process" (pid, slowdown, count fd or None, sleeps), and the sleep owed.
#: One dict, changed in place and never rebound: the pipeline's fingerprint digests the plain values (None,
#: numbers) of the globals a function names, so a global that went from None to a tuple, or a float that
#: grew, would make a worker's recorded group state "of another pipeline" to a worker that has not run yet.
_STATE: dict = {"process": (), "owed": 0.0}


def _this_process() -> tuple:
    process = _STATE["process"]
    if not process or process[0] != os.getpid():  # a forked child counts in a file of its own
        directory = os.environ.get(COUNT_DIR_ENV)
        fd = None
        if directory:
            fd = os.open(os.path.join(directory, f"calls-{os.getpid()}.txt"),
                         os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        process = _STATE["process"] = (os.getpid(), max(1, int(os.environ.get(SLOWDOWN_ENV, "1"))), fd,
                                       os.environ.get(SLOW_BY_ENV, "work") == "sleep")
    return process


def work(x: Any, iters: int, floats: int) -> tuple:
    """``(x, a float32 array of floats)`` after ``iters`` rounds of numpy work (``BENCH_SLOWDOWN`` times as long
    where that is set, see ``SLOW_BY_ENV``); appends ``x`` to this process's count file where ``BENCH_COUNT_DIR``
    is set.

    Example::

        >>> index, array = work(3, iters=50, floats=1024)   # about 100 us of numpy, 4 KiB
    """
    _, slowdown, fd, sleeps = _this_process()
    x = int(x)
    started = time.perf_counter()
    a = np.full(floats, x % 1000, np.float32)
    for _ in range(iters * (1 if sleeps else slowdown)):
        a = np.sqrt(a * a + 1.0)
    if sleeps and slowdown > 1:
        # The sleep owed is paid in chunks, each overshoot counted against the next: a sleep of 100 us
        # takes 150-200, so sleeping per element would slow the worker by more than asked.
        _STATE["owed"] += (time.perf_counter() - started) * (slowdown - 1)
        if _STATE["owed"] >= SLEEP_CHUNK_S:
            slept = time.perf_counter()
            time.sleep(_STATE["owed"])
            _STATE["owed"] -= time.perf_counter() - slept
    if fd is not None:
        os.write(fd, b"%d\n" % x)  # O_APPEND: one atomic write a call
    return np.int64(x), a


def time_work(iters: int, floats: int, count: int = 200, rounds: int = 5) -> float:
    """Microseconds per ``work`` call in this process (its ``BENCH_SLOWDOWN`` included): the least of ``rounds``
    rounds of ``count`` calls, the figure least disturbed by other processes on the machine."""
    for i in range(20):
        work(i, iters, floats)
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for i in range(count):
            work(i, iters, floats)
        times.append((time.perf_counter() - started) / count * 1e6)
    return min(times)


def count_calls(directory: str, since: Optional[dict] = None) -> tuple[list[int], dict]:
    """The indices ``work`` was called with in the count files of ``directory`` after the offsets ``since``
    (from an earlier call; None: from the start), and the offsets now."""
    offsets: dict = {}
    calls: list[int] = []
    for name in sorted(os.listdir(directory)):
        if not name.startswith("calls-"):
            continue
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line being written is read next time
        start = (since or {}).get(name, 0)
        calls.extend(int(v) for v in data[start:end].split())
        offsets[name] = end
    return calls, offsets


# --- the peers ----------------------------------------------------------------------------------------------

def _indices(batch: Any) -> list[int]:
    """The element indices of a batch (a collated torch batch, a Grain batch: (indices, arrays))."""
    first = batch[0]
    return [int(v) for v in (first.tolist() if hasattr(first, "tolist") else first)]


class _Peer:
    """One peer: ``make()`` a loader, ``iterate(loader)``, ``save(loader, it)`` its state, ``restore(loader,
    state)`` into a new loader before iterating it; ``close(loader, it)`` frees its workers."""

    name = ""
    how = ""

    def make(self) -> Any:
        raise NotImplementedError

    def iterate(self, loader: Any) -> Any:
        return iter(loader)

    def save(self, loader: Any, it: Any) -> Any:
        raise NotImplementedError

    def restore(self, loader: Any, state: Any) -> None:
        raise NotImplementedError

    def close(self, loader: Any, it: Any) -> None:
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


def _torch_peers(cfg: dict) -> list[_Peer]:
    import torch
    from torch.utils.data import Dataset, IterableDataset, get_worker_info
    from torchdata.stateful_dataloader import StatefulDataLoader

    n, iters, floats, batch = cfg["n"], cfg["iters"], cfg["floats"], cfg["batch"]

    class MapStyle(Dataset):
        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> tuple:
            return work(i, iters, floats)

    class Plain(IterableDataset):
        """Each of the loader's workers reads every num_workers-th element; no state of its own."""

        def __iter__(self):
            info = get_worker_info()
            start, step = (0, 1) if info is None else (info.id, info.num_workers)
            for i in range(start, n, step):
                yield work(i, iters, floats)

    class WithState(IterableDataset):
        """The same with ``state_dict``: the next index of this worker, so a restore seeks."""

        def __init__(self):
            self.next_index: Optional[int] = None

        def __iter__(self):
            info = get_worker_info()
            start, step = (0, 1) if info is None else (info.id, info.num_workers)
            i = start if self.next_index is None else self.next_index
            self.next_index = None
            while i < n:
                self.next_index = i + step
                yield work(i, iters, floats)
                i += step

        def state_dict(self) -> dict:
            return {"next_index": self.next_index}

        def load_state_dict(self, state: dict) -> None:
            self.next_index = state["next_index"]

    class Torch(_Peer):
        def __init__(self, dataset_class: type, name: str, how: str):
            self.dataset_class, self.name, self.how = dataset_class, name, how

        def make(self) -> Any:
            return StatefulDataLoader(self.dataset_class(), batch_size=batch, num_workers=2)

        def save(self, loader: Any, it: Any) -> Any:
            return loader.state_dict()

        def restore(self, loader: Any, state: Any) -> None:
            loader.load_state_dict(state)

    torch.set_num_threads(1)  # the work is numpy's; 2 loader workers on 2 cores
    label = "torchdata StatefulDataLoader(num_workers=2)"
    return [Torch(MapStyle, f"{label}, map-style Dataset",
                  "its sampler skips the consumed indices; workers start anew"),
            Torch(Plain, f"{label}, IterableDataset",
                  "no state in the dataset: it replays (re-reads and drops) every consumed batch"),
            Torch(WithState, f"{label}, IterableDataset with state_dict",
                  "each worker's dataset seeks to its saved index")]


def _grain_peers(cfg: dict) -> list[_Peer]:
    import grain

    n, iters, floats, batch = cfg["n"], cfg["iters"], cfg["floats"], cfg["batch"]

    class Source:
        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> int:
            return i

        def __repr__(self) -> str:  # what Grain checks a restored state against
            return f"Source(range({n}))"

    class Work(grain.transforms.Map):
        def map(self, i: int) -> tuple:
            return work(i, iters, floats)

    class Loader(_Peer):
        name = "Grain DataLoader(worker_count=2)"
        how = "the sampler's index: each worker starts at its next record"

        def make(self) -> Any:
            sampler = grain.samplers.IndexSampler(num_records=n, shard_options=grain.sharding.NoSharding(),
                                                  shuffle=False, num_epochs=1)
            return grain.DataLoader(data_source=Source(), sampler=sampler,
                                    operations=[Work(), grain.transforms.Batch(batch_size=batch)], worker_count=2)

        def iterate(self, loader: Any) -> Any:
            it = iter(loader)
            if getattr(self, "_state", None) is not None:
                it.set_state(self._state)
                self._state = None
            return it

        def save(self, loader: Any, it: Any) -> Any:
            return it.get_state()

        def restore(self, loader: Any, state: Any) -> None:
            self._state = state  # set on the iterator, which iterate() makes

        def close(self, loader: Any, it: Any) -> None:
            stop = getattr(it, "__del__", None)
            if stop is not None:
                stop()

    class InProcess(Loader):
        name = "Grain MapDataset.to_iter_dataset() iterator (in this process)"
        how = "the next index: a seek"

        def make(self) -> Any:
            return (grain.MapDataset.range(n).map(lambda i: work(i, iters, floats)).batch(batch)
                    .to_iter_dataset())

        def close(self, loader: Any, it: Any) -> None:
            pass

    return [Loader(), InProcess()]


def _median(values: list) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def measure(peer: _Peer, cfg: dict, count_dir: str) -> dict:
    """The medians of ``cfg["repeats"]`` runs: fresh and restored first-batch times, the state's size, and the
    work calls of the restored read against the elements that remained."""
    n, batch = cfg["n"], cfg["batch"]
    batches = -(-n // batch)
    save_after = int(batches * cfg["restore_at"])
    runs = []
    for _ in range(cfg["repeats"]):
        loader = peer.make()
        started = time.perf_counter()
        it = peer.iterate(loader)
        next(it)
        fresh_s = time.perf_counter() - started
        for _ in range(save_after - 1):
            next(it)
        state = peer.save(loader, it)
        expected = _indices(next(it))
        peer.close(loader, it)
        del it, loader

        import pickle

        pickled = len(pickle.dumps(state))
        if isinstance(state, (bytes, str)):
            as_json = len(state) if _is_json(state) else None
        else:
            try:
                as_json = len(json.dumps(state))
            except (TypeError, ValueError):
                as_json = None
        _, mark = count_calls(count_dir)
        loader = peer.make()
        started = time.perf_counter()
        peer.restore(loader, state)
        it = peer.iterate(loader)
        first = _indices(next(it))
        restore_s = time.perf_counter() - started
        if first != expected:
            raise RuntimeError(f"{peer.name}: the restored first batch is {first[:4]}..., expected {expected[:4]}...")
        rest = len(first) + sum(len(_indices(b)) for b in it)
        peer.close(loader, it)
        del it, loader
        calls, _ = count_calls(count_dir, mark)
        remaining = n - save_after * batch
        if rest != remaining:
            raise RuntimeError(f"{peer.name}: the restored read gave {rest} elements, expected {remaining}")
        runs.append({"fresh_s": fresh_s, "restore_s": restore_s, "state_pickle_bytes": pickled,
                     "state_json_bytes": as_json, "calls_after_restore": len(calls), "remaining": remaining})
    return {"name": peer.name, "how": peer.how, "runs": runs,
            **{key: _median([r[key] for r in runs]) for key in
               ("fresh_s", "restore_s", "state_pickle_bytes", "state_json_bytes", "calls_after_restore")},
            "remaining": runs[0]["remaining"]}


def _is_json(text: Any) -> bool:
    try:
        json.loads(text)
        return True
    except (TypeError, ValueError):
        return False


def _version(module: str) -> Optional[str]:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # noqa: BLE001 - any failure: not installed
        return None


def main(argv: Optional[list] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg = json.loads(argv[0])
    count_dir = tempfile.mkdtemp(prefix="resumable-reads-peers-")
    os.environ[COUNT_DIR_ENV] = count_dir  # the loaders' worker processes inherit it
    os.environ.pop(SLOWDOWN_ENV, None)
    started = time.perf_counter()
    for i in range(200):
        work(i, cfg["iters"], cfg["floats"])
    work_us = (time.perf_counter() - started) / 200 * 1e6
    out: dict = {"versions": {m: _version(m) for m in ("torch", "torchdata", "grain", "numpy")},
                 "python": sys.version.split()[0], "work_us": work_us, "peers": [], "errors": []}
    try:
        for family, make in (("torchdata", _torch_peers), ("grain", _grain_peers)):
            try:
                peers = make(cfg)
            except Exception as exc:  # noqa: BLE001 - an import failure is a result: the peer is not there
                out["errors"].append({"peer": family, "error": f"{type(exc).__name__}: {exc}"})
                continue
            for peer in peers:
                try:
                    out["peers"].append(measure(peer, cfg, count_dir))
                except Exception as exc:  # noqa: BLE001 - reported beside the others
                    out["errors"].append({"peer": peer.name, "error": f"{type(exc).__name__}: {exc}",
                                          "traceback": traceback.format_exc()[-2000:]})
                print(f"peer done: {peer.name}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(count_dir, ignore_errors=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
