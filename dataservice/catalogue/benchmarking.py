"""``benchmark(ds)``: how fast an input pipeline delivers, measured by iterating it.

Works on any iterable — a local Dataset, a distributed one, ``as_numpy(ds)``, a plain iterator —
and reports the time to the first batch (which includes opening files, starting workers, filling
buffers) apart from the steady rate after it. Pass ``batch_size`` when the iterable yields batches,
so that the rate is in examples, comparable across batch sizes.

Example::

    >>> ds = load("shapes", split="train").batch(32).prefetch(2)
    >>> first = benchmark(ds, batch_size=32)   # reads the files, fills the auto-cache
    >>> second = benchmark(ds, batch_size=32)  # reads from the cache: faster
    >>> second.examples_per_s > first.examples_per_s
    True
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import time
from typing import Any, Iterable, Optional, TextIO

__all__ = ["BenchmarkResult", "benchmark"]


@dataclasses.dataclass(frozen=True)
class BenchmarkResult:
    """The figures of one ``benchmark`` run. Rates are 0.0 when there was nothing to time."""

    num_iter: int                  # batches (or elements) iterated
    num_examples: int              # num_iter * batch_size
    batch_size: int
    first_batch_s: float           # from the start until the first batch arrived
    total_s: float                 # from the start until the last one did
    examples_per_s: float          # over the whole run, first batch included
    examples_per_s_after_first: float  # after the first batch, which warm-up dominates

    def report(self) -> str:
        return "\n".join([
            "************ Summary ************",
            f"Examples/sec (first included) {self.examples_per_s:,.2f} ex/sec "
            f"(total: {self.num_examples:,} ex, {self.total_s:.2f} sec)",
            f"Examples/sec (first only) {self.batch_size / self.first_batch_s if self.first_batch_s else 0.0:,.2f}"
            f" ex/sec (total: {self.batch_size} ex, {self.first_batch_s:.2f} sec)",
            f"Examples/sec (first excluded) {self.examples_per_s_after_first:,.2f} ex/sec "
            f"(total: {max(self.num_examples - self.batch_size, 0):,} ex, "
            f"{self.total_s - self.first_batch_s:.2f} sec)",
        ])


def benchmark(ds: Iterable, *, batch_size: Optional[int] = None, num_iter: Optional[int] = None,
              file: Optional[TextIO] = None) -> BenchmarkResult:
    """Iterates ``ds`` (``num_iter`` batches, or to the end), prints a short report and returns the figures.

    ``batch_size``: examples per element of ``ds`` (1 if None). ``file``: where the report goes
    (stdout by default).
    """
    if batch_size is None:
        batch_size = 1
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1 (the examples in one element of ds), got {batch_size!r}")
    if num_iter is not None and (not isinstance(num_iter, int) or isinstance(num_iter, bool) or num_iter < 1):
        raise ValueError(f"num_iter must be an int >= 1 or None (to the end), got {num_iter!r}")
    if not hasattr(ds, "__iter__"):
        raise TypeError(f"benchmark needs an iterable (a Dataset, as_numpy(ds), an iterator), got {ds!r}")
    start = time.perf_counter()
    first_at: Optional[float] = None
    count = 0
    it: Any = iter(ds)
    try:
        for _ in (itertools.islice(it, num_iter) if num_iter is not None else it):
            count += 1
            if first_at is None:
                first_at = time.perf_counter()
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    end = time.perf_counter()
    total = end - start
    first = (first_at - start) if first_at is not None else 0.0
    examples = count * batch_size
    after = total - first
    result = BenchmarkResult(
        num_iter=count, num_examples=examples, batch_size=batch_size, first_batch_s=first, total_s=total,
        examples_per_s=examples / total if total > 0 and count else 0.0,
        examples_per_s_after_first=(examples - batch_size) / after if after > 0 and count > 1 else 0.0)
    print(result.report(), file=file or sys.stdout)
    return result
