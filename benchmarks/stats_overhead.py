"""What pipeline statistics cost: ``python -m benchmarks.stats_overhead``.

Runs ``range(N).map(x + 1)`` (and the same with ``.batch(256)``) with statistics off, with an
aggregator set but nothing to record, with one ``latency_stats`` or ``bytes_produced_stats`` at the
end, and with ``latency_all_edges`` (every node timed), and reports nanoseconds per element (the
best of ``--repeats`` runs, the configurations taking turns so that a noisy neighbour hits them
alike) and the difference from statistics off. It checks that each run recorded exactly N elements.

Example::

    $ python -m benchmarks.stats_overhead --elements 1000000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Callable, Optional

from dataservice.data import Dataset, Options
from dataservice.data.experimental import StatsAggregator, bytes_produced_stats, latency_stats


def _options(aggregator: Optional[StatsAggregator], all_edges: bool = False) -> Options:
    options = Options()
    options.experimental_stats.aggregator = aggregator
    options.experimental_stats.latency_all_edges = all_edges or None
    return options


def _configurations(n: int, batch: bool) -> list[tuple[str, Callable[[], tuple[Dataset, Optional[StatsAggregator]]]]]:
    def base() -> Dataset:
        return Dataset.range(n).map(lambda x: x + 1)

    def finish(ds: Dataset) -> Dataset:
        return ds.batch(256) if batch else ds

    def off():
        return finish(base()), None

    def aggregator_only():
        aggregator = StatsAggregator()
        return finish(base()).with_options(_options(aggregator)), aggregator

    def one_latency():
        aggregator = StatsAggregator()
        return finish(base().apply(latency_stats("map"))).with_options(_options(aggregator)), aggregator

    def one_bytes():
        aggregator = StatsAggregator()
        return finish(base().apply(bytes_produced_stats("map"))).with_options(_options(aggregator)), aggregator

    def all_edges():
        aggregator = StatsAggregator()
        return finish(base()).with_options(_options(aggregator, all_edges=True)), aggregator

    return [("stats off", off), ("aggregator, nothing to record", aggregator_only),
            ("latency_stats after map", one_latency), ("bytes_produced_stats after map", one_bytes),
            ("latency_all_edges", all_edges)]


def _run_once(make: Callable, n: int, batch: bool) -> float:
    ds, aggregator = make()
    start = time.perf_counter()
    count = 0
    if batch:
        for element in ds:
            count += len(element)
    else:
        for _ in ds:
            count += 1
    elapsed = time.perf_counter() - start
    if count != n:
        raise AssertionError(f"iterated {count} elements, expected {n}")
    if aggregator is not None:
        summary = aggregator.get_summary()
        recorded = [s.count for s in (*summary.latency.values(), *summary.bytes_produced.values())
                    if "Batch" not in s.name]
        if any(c != n for c in recorded):
            raise AssertionError(f"recorded {recorded} elements per statistic, expected {n}")
    return elapsed


def run(elements: int = 1_000_000, repeats: int = 3) -> list[dict]:
    rows = []
    for batch in (False, True):
        configurations = _configurations(elements, batch)
        best = {name: float("inf") for name, _ in configurations}
        for _ in range(repeats):
            for name, make in configurations:
                best[name] = min(best[name], _run_once(make, elements, batch))
        workload = f"range({elements}).map(x+1)" + (".batch(256)" if batch else "")
        off = best["stats off"] / elements * 1e9
        for name, _ in configurations:
            ns = best[name] / elements * 1e9
            rows.append({"workload": workload, "stats": name, "ns_per_element": ns, "overhead_ns": ns - off,
                         "relative": ns / off})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    rows = run(args.elements, args.repeats)
    print(f"{'workload':<34} {'stats':<32} {'ns/element':>11} {'+ns':>7} {'x off':>6}")
    for row in rows:
        print(f"{row['workload']:<34} {row['stats']:<32} {row['ns_per_element']:>11.0f} "
              f"{row['overhead_ns']:>+7.0f} {row['relative']:>6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
