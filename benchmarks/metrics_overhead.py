"""What serving metrics costs the service benchmark's rows: ``python -m benchmarks.metrics_overhead``.

Runs workloads of ``benchmarks.run`` (ours only) twice in the same run: with metrics off (no
``--http-port``), and on (dispatcher and worker with ``--http-port 0``, and a scraper in this
process fetching both servers' ``/metrics`` every ``--scrape-interval`` seconds while the client
reads). The runs alternate off, on, on, off, off, on, ... on fresh processes, so a drift in the
machine's load hits both alike; each figure is the best of ``--repeats`` (every run's figure, and
the ratio of the medians, go to ``--json``).

Usage::

    python -m benchmarks.metrics_overhead [--workloads range,float_arrays,image_batches]
                                          [--modes parallel_epochs,distributed_epoch]
                                          [--repeats 3] [--quick] [--scrape-interval 1.0] [--json out.json]
    python -m benchmarks.metrics_overhead --scrape-cost 500    # CPU per scrape, in-process

Example::

    $ python -m benchmarks.metrics_overhead --quick --workloads range --modes parallel_epochs --repeats 1
    | workload                              | mode            |     off |      on | on / off | medians on / off | ...
    |---------------------------------------|-----------------|---------|---------|----------|------------------|----
    | 1. range(20000), int64 scalars [el/s] | parallel_epochs | 359,426 | 380,777 |    1.06x |            1.06x | ...
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import urllib.request
from typing import Optional

from benchmarks.cluster_processes import (BenchmarkError, ProcessGroup, await_result, interrupt_on_sigterm,
                                          positive_number, spawn_client, start_dispatcher_and_worker)
from benchmarks.run import _mode_list, _workload_list
from benchmarks.workloads import WORKLOADS

_HTTP_LINE = r"serves /metrics, /status.json and its status page on http://[^\s]+:(\d+)/$"
_METRIC = {"range": ("el/s", "elements_per_s"), "float_arrays": ("MB/s", "mb_per_s"),
           "image_batches": ("MB/s", "mb_per_s"), "float_arrays_tcp": ("MB/s", "mb_per_s")}


class Scraper:
    """Fetches each URL every ``interval_s`` on a thread, until stopped; counts scrapes and their time."""

    def __init__(self, urls: list[str], interval_s: float):
        self.urls = urls
        self.interval_s = interval_s
        self.scrapes = 0
        self.seconds = 0.0
        self.bytes = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-scraper", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for url in self.urls:
                started = time.perf_counter()
                try:
                    with urllib.request.urlopen(url, timeout=10) as response:
                        self.bytes += len(response.read())
                except OSError as exc:
                    self.errors.append(f"{url}: {exc}")
                    continue
                self.seconds += time.perf_counter() - started
                self.scrapes += 1
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "Scraper":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def run_once(workload: str, mode: str, n: int, metrics: bool, interval_s: float, timeout_s: float) -> dict:
    """One read on fresh processes (a dispatcher, one worker, a client); with ``metrics``, both servers serve
    HTTP and are scraped throughout."""
    flags = ["--http-port", "0"] if metrics else []
    with ProcessGroup() as group:
        service, dispatcher, worker = start_dispatcher_and_worker(group, sys.executable, flags, flags)
        urls = []
        if metrics:
            for proc in (dispatcher, worker):
                port = int(proc.wait_for_line(_HTTP_LINE, 30).group(1))
                urls.append(f"http://127.0.0.1:{port}/metrics")
        client = spawn_client(group, "ours", sys.executable, service,
                              ["--workers", "1", "--workload", workload, "--mode", mode, "--n", str(n)])
        scraper = Scraper(urls, interval_s)
        if metrics:
            with scraper:
                result = await_result(client, timeout_s)
        else:
            result = await_result(client, timeout_s)
    result.update(scrapes=scraper.scrapes, scrape_ms=scraper.seconds / scraper.scrapes * 1000 if scraper.scrapes
                  else None, scrape_errors=scraper.errors[:5], metrics=metrics)
    return result


def scrape_cost(scrapes: int) -> dict:
    """CPU per scrape, in this process (``time.process_time``, so other processes' load does not count): a
    dispatcher and a worker after a read of a named job whose pipeline records statistics, each scraped
    ``scrapes`` times through its collectors (``generate_latest``) and over HTTP; and the cost of the one
    counter update a worker makes per batch it hands out (``ProductionCounters.add``)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from dataservice import Dataset, DispatcherConfig, DispatchServer, Options, WorkerConfig, WorkerServer
    from dataservice.client.distribute import distribute
    from dataservice.data.experimental import StatsAggregator
    from dataservice.dispatcher.metrics import DispatcherMetrics
    from dataservice.worker.metrics import ProductionCounters, WorkerMetrics

    out: dict = {}
    dispatcher = DispatchServer(DispatcherConfig(http_port=0))
    worker = WorkerServer(WorkerConfig(dispatcher_address=f"localhost:{dispatcher.port}", http_port=0))
    try:
        options = Options()
        options.experimental_stats.aggregator = StatsAggregator()
        options.experimental_stats.latency_all_edges = True
        ds = Dataset.range(10_000).map(lambda x: x * 2).batch(32).with_options(options)
        sum(1 for _ in ds.apply(distribute("distributed_epoch", dispatcher.target, job_name="cost")))
        for name, collector, port in (("dispatcher", DispatcherMetrics(dispatcher.core), dispatcher.http_port),
                                      ("worker", WorkerMetrics(worker), worker.http_port)):
            registry = CollectorRegistry()
            registry.register(collector)
            text = generate_latest(registry)
            started = time.process_time()
            for _ in range(scrapes):
                generate_latest(registry)
            collect_ms = (time.process_time() - started) / scrapes * 1000
            started = time.process_time()
            for _ in range(scrapes):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                    response.read()
            http_ms = (time.process_time() - started) / scrapes * 1000  # server and urllib client, both here
            out[name] = {"series": text.count(b"\n") - text.count(b"\n#"), "bytes": len(text),
                         "collect_cpu_ms": collect_ms, "http_cpu_ms": http_ms}
    finally:
        worker.stop()
        dispatcher.stop()
    counters = ProductionCounters()
    calls = 200_000
    started = time.process_time()
    for _ in range(calls):
        counters.add(7, 128, 1 << 20)
    out["counter_add_ns"] = (time.process_time() - started) / calls * 1e9
    return out


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.metrics_overhead",
                                     description="The service benchmark's rows with metrics off and on, same run.")
    parser.add_argument("--workloads", type=_workload_list, default=["range", "float_arrays", "image_batches"],
                        metavar="LIST", help=f"of {', '.join(_METRIC)} (default: range,float_arrays,image_batches)")
    parser.add_argument("--modes", type=_mode_list, default=["parallel_epochs", "distributed_epoch"], metavar="LIST")
    parser.add_argument("--repeats", type=positive_number(int), default=3, help="runs per side, best kept (default 3)")
    parser.add_argument("--quick", action="store_true", help="the smaller datasets of benchmarks.run --quick")
    parser.add_argument("--scrape-interval", type=positive_number(float), default=1.0, metavar="SECONDS",
                        help="seconds between two scrapes of each server's /metrics (default 1)")
    parser.add_argument("--timeout", type=positive_number(float), default=600.0, metavar="SECONDS")
    parser.add_argument("--json", metavar="PATH", help="also write every run's results here")
    parser.add_argument("--scrape-cost", type=positive_number(int), metavar="N", default=None,
                        help="instead: the CPU time of N scrapes of a dispatcher's and a worker's /metrics, in "
                             "this process, and of the worker's per-batch counter update")
    args = parser.parse_args(argv)
    if args.scrape_cost:
        cost = scrape_cost(args.scrape_cost)
        for name in ("dispatcher", "worker"):
            c = cost[name]
            print(f"{name}: {c['series']} series, {c['bytes']:,} bytes; CPU per scrape: collectors "
                  f"{c['collect_cpu_ms']:.2f} ms, over HTTP (server + client) {c['http_cpu_ms']:.2f} ms")
        print(f"worker, per batch handed out: ProductionCounters.add {cost['counter_add_ns']:.0f} ns")
        return 0
    unknown = [w for w in args.workloads if w not in _METRIC]
    if unknown:
        parser.error(f"--workloads: {', '.join(unknown)} measure no throughput; choose from {', '.join(_METRIC)}")
    interrupt_on_sigterm()
    rows, runs = [], []
    started = time.monotonic()
    for key in args.workloads:
        unit, field = _METRIC[key]
        n = WORKLOADS[key].size(args.quick)
        for mode in args.modes:
            best: dict = {False: None, True: None}
            values: dict = {False: [], True: []}
            for attempt in range(args.repeats):
                # off, on, on, off, off, on, ...: a drift in the machine's load hits both sides alike.
                for metrics in ((False, True) if attempt % 2 == 0 else (True, False)):
                    try:
                        r = run_once(key, mode, n, metrics, args.scrape_interval, args.timeout)
                    except BenchmarkError as exc:
                        print(f"{key} {mode} metrics={'on' if metrics else 'off'}: FAILED: {exc}", file=sys.stderr)
                        continue
                    runs.append({"workload": key, "mode": mode, **r})
                    values[metrics].append(r[field])
                    side = "on " if metrics else "off"
                    print(f"{key} {mode} run {attempt + 1} metrics {side}: {r[field]:,.1f} {unit}"
                          + (f", {r['scrapes']} scrapes, {r['scrape_ms']:.1f} ms each" if metrics and r["scrapes"]
                             else ""), file=sys.stderr, flush=True)
                    if best[metrics] is None or r[field] > best[metrics][field]:
                        best[metrics] = r
            off, on = best[False], best[True]
            rows.append({"workload": f"{WORKLOADS[key].describe(args.quick)} [{unit}]", "mode": mode,
                         "off": off and off[field], "on": on and on[field],
                         "ratio": on[field] / off[field] if off and on and off[field] else None,
                         "scrapes": on and on["scrapes"], "scrape_ms": on and on["scrape_ms"],
                         "off_runs": sorted(values[False]), "on_runs": sorted(values[True]),
                         "median_ratio": statistics.median(values[True]) / statistics.median(values[False])
                         if values[True] and values[False] else None})
    headers = ["workload", "mode", "off", "on", "on / off", "medians on / off", "scrapes", "ms/scrape"]
    cells = [headers] + [[r["workload"], r["mode"], _fmt(r["off"]), _fmt(r["on"]),
                          "-" if r["ratio"] is None else f"{r['ratio']:.2f}x",
                          "-" if r["median_ratio"] is None else f"{r['median_ratio']:.2f}x", _fmt(r["scrapes"]),
                          "-" if r["scrape_ms"] is None else f"{r['scrape_ms']:.1f}"] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(headers))]
    for i, c in enumerate(cells):
        print("| " + " | ".join(v.ljust(w) if j < 2 else v.rjust(w) for j, (v, w) in enumerate(zip(c, widths))) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    print(f"best of {args.repeats} per side, alternating off/on (ABBA); scrape interval {args.scrape_interval:g} s; "
          f"total {time.monotonic() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            command = [sys.executable, "-m", "benchmarks.metrics_overhead", *(argv or sys.argv[1:])]
            json.dump({"command": " ".join(command), "rows": rows, "runs": runs}, f, indent=2)
    return 0 if all(r["ratio"] is not None for r in rows) else 1


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.1f}" if value < 1000 else f"{value:,.0f}"


if __name__ == "__main__":
    sys.exit(main())
