"""A trainer process for tests/test_resumable_reads_processes.py: it reads a distributed_epoch read, writes
every element it takes to a file (one line each, flushed), saves its iterator's state to a file at step k
(atomically: a killed trainer leaves the old state or the new one, never half of one), then blocks until
killed (``--then block``) or reads on to the end (``--then continue``).

Run as a module, so that the pipeline's functions are this module's (``tests.resumable_trainer.slow``) in
every trainer and in the test that computes the uninterrupted run::

    python -m tests.resumable_trainer --dispatcher grpc://localhost:5050 --out out1.txt \\
        --deterministic --save-at 1500 --state state.json --then block
    python -m tests.resumable_trainer --dispatcher grpc://localhost:5050 --out out2.txt \\
        --deterministic --load state.json --then continue

It prints ``saved K`` once the state file is in place, and ``done N`` (N: elements taken by this process)
at the end of the read.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from typing import Any, Optional

from dataservice import Dataset, distribute

#: Elements of the read: 16 splits of 256, 16 split groups.
NUM_ELEMENTS = 4_096
GROUP_ELEMENTS = 256
#: The environment variable naming the file ``slow`` appends a byte to per call (on the workers).
CALLS_FILE_ENV = "DATASERVICE_TEST_MAP_CALLS_FILE"
#: The longest a blocked trainer waits to be killed before it exits by itself (no process outlives a test).
BLOCK_LIMIT_S = 120.0


def count_call() -> None:
    """Appends a byte to the file $DATASERVICE_TEST_MAP_CALLS_FILE when that is set (where it runs: a worker).
    A file, not a counter object: a pipeline travels to the workers by value (tests/ is not installed), so a
    module-level object would be the workers' copy, not the test's."""
    path = os.environ.get(CALLS_FILE_ENV)
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, b".")
        finally:
            os.close(fd)


def slow(x: Any, delay_s: float = 0.001) -> Any:
    """``x`` after ``delay_s``: a read of a few thousand elements lasts long enough for kills mid-way. Counts
    its calls (``count_call``)."""
    count_call()
    time.sleep(delay_s)
    return x


def jittered(x: Any) -> Any:
    """``x`` after a random 0-1 ms: workers finish their groups in another order each run."""
    time.sleep(random.random() * 0.001)
    return x


def keep(x: Any) -> bool:
    """Drops every 7th element: a filter, so that a group's offsets are not its input positions."""
    return x % 7 != 3


def with_pid(x: Any) -> tuple:
    """``(x, pid of the process that made it)``: which worker produced each element."""
    return slow(x), os.getpid()


def source(n: int = NUM_ELEMENTS) -> Dataset:
    """The pipeline the workers run (the uninterrupted run's order is ``list(source())``)."""
    return Dataset.range(n).map(slow).filter(keep)


def pipeline(target: str, deterministic: bool, n: int = NUM_ELEMENTS, job_name: Optional[str] = None,
             num_readers: Optional[int] = None, reader_index: Optional[int] = None) -> Dataset:
    """The trainer's pipeline: ``source`` read from the service (elastic readers: ``num_readers``)."""
    return source(n).apply(distribute("distributed_epoch", target, deterministic=deterministic, job_name=job_name,
                                       max_outstanding_requests=64, timeout_ms=30_000, num_readers=num_readers,
                                       reader_index=reader_index))


def read_lines(path: str) -> list[int]:
    """The elements a trainer wrote to ``path`` (a partial last line, from a kill mid-write, left out)."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return []
    return [int(line) for line in text.split("\n")[:-1]]


def save_atomically(path: str, state: dict) -> None:
    temporary = f"{path}.tmp"
    with open(temporary, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dispatcher", required=True)
    parser.add_argument("--out", required=True, help="file the elements taken are appended to, one a line")
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument("--num-elements", type=int, default=NUM_ELEMENTS)
    parser.add_argument("--load", help="state file to restore before the first element")
    parser.add_argument("--state", help="state file written at --save-at")
    parser.add_argument("--save-at", type=int, help="take this many elements, then save the state")
    parser.add_argument("--then", choices=["block", "continue"], default="continue")
    parser.add_argument("--job-name")
    parser.add_argument("--num-readers", type=int, help="elastic readers: this trainer is --reader-index of these")
    parser.add_argument("--reader-index", type=int)
    args = parser.parse_args(argv)

    it = iter(pipeline(args.dispatcher, args.deterministic, args.num_elements, args.job_name, args.num_readers,
                       args.reader_index))
    if args.load:
        with open(args.load) as f:
            it.load_state_dict(json.load(f))
    taken = 0
    with open(args.out, "a") as out:
        def take_one() -> bool:
            nonlocal taken
            try:
                x = next(it)
            except StopIteration:
                return False
            out.write(f"{int(x)}\n")
            out.flush()  # a kill -9 loses nothing written so far
            taken += 1
            return True

        if args.save_at is not None:
            while taken < args.save_at and take_one():
                pass
            save_atomically(args.state, it.state_dict())
            print(f"saved {taken}", flush=True)
            if args.then == "block":
                threading.Event().wait(BLOCK_LIMIT_S)  # until killed
                print("not killed: exiting by myself", file=sys.stderr, flush=True)
                return 3
        while take_one():
            pass
    it.close()
    print(f"done {taken}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
