"""What one unary gRPC call costs in CPU, on each side, at the rates a small cluster calls at.

A read of the image pipeline (``benchmarks.image_pipeline``) makes about 75 dispatcher calls per 2,000
images: reader heartbeats, GetSplits, worker heartbeats, the epoch's start. That is some 30 calls a
second, and at that pace a call costs far more CPU than at a thousand a second: each one wakes gRPC's
threads in both processes from sleep. This benchmark measures that cost apart from any work of ours:

- ``bare``: a ``grpc.aio`` server in a child process holding only gRPC's health service;
- ``dispatcher``: a real ``dataservice dispatcher`` (no worker), answering the same health check through
  its own server (interceptors, timing, the event loop in its own thread).

A client in this process calls ``grpc.health.v1.Health/Check`` at each ``--rates`` (calls a second, paced to
a schedule; 0: back to back) for ``--seconds``. The server's CPU (``/proc/<pid>/stat``) and the client's
(``time.process_time``) are read around each window; the server's idle CPU, measured first over a window
with no call, is taken out of its figure. ``--cpus 0`` runs every process on CPU 0: on a VM, a thread woken
on the other CPU costs more than one woken beside its waker.

Usage::

    .venv/bin/python -m benchmarks.grpc_call_cost                       # both servers, 30 and 300 calls/s, max
    .venv/bin/python -m benchmarks.grpc_call_cost --servers bare --rates 30 --cpus 0

Example output::

    | server | calls/s | server CPU per call | client CPU per call | server idle |
    |---|---:|---:|---:|---:|
    | bare grpc.aio | 28 | 1.00 ms | 1.01 ms | 4.0 ms/s |
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Optional, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from benchmarks.cluster_processes import ProcessGroup, process_cpu_s, start_cluster

__all__ = ["measure_calls", "SERVERS"]

#: What --servers may name, and how the table calls each.
SERVERS = {"bare": "bare grpc.aio", "dispatcher": "dataservice dispatcher"}
_BARE_LINE = r"^bare grpc\.aio listening on port (\d+)$"


def _serve_bare() -> None:
    """The child of ``--servers bare``: a grpc.aio server with gRPC's health service only, until killed."""

    async def serve() -> None:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(f"bare grpc.aio listening on port {port}", flush=True)
        await server.wait_for_termination()

    asyncio.run(serve())


def _server_cpu_s(pid: int) -> float:
    cpu_s = process_cpu_s(pid)
    if cpu_s is None:
        raise RuntimeError(f"the server (pid {pid}) exited")
    return cpu_s


def measure_calls(address: str, server_pid: int, rates: Sequence[float], seconds: float) -> list[dict]:
    """Health checks to ``address`` at each of ``rates`` (0: back to back) for ``seconds`` each. Returns, per
    rate, the calls a second reached and the CPU ms per call of the server (its idle taken out) and of this
    process (the client), and the server's idle CPU in ms a second."""
    with grpc.insecure_channel(address) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        check(health_pb2.HealthCheckRequest(), timeout=10)  # connected, and both sides' threads started
        time.sleep(0.5)
        idle_start, idle_t0 = _server_cpu_s(server_pid), time.monotonic()
        time.sleep(seconds)
        idle_per_s = (_server_cpu_s(server_pid) - idle_start) / (time.monotonic() - idle_t0)
        rows = []
        for rate in rates:
            server_start, client_start = _server_cpu_s(server_pid), time.process_time()
            start = time.monotonic()
            calls = 0
            while time.monotonic() - start < seconds:
                check(health_pb2.HealthCheckRequest(), timeout=10)
                calls += 1
                if rate:
                    # To a schedule, so that the call's own time does not lower the rate.
                    pause = start + calls / rate - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
            elapsed = time.monotonic() - start
            server_end, client_end = _server_cpu_s(server_pid), time.process_time()
            server_s = max(0.0, server_end - server_start - idle_per_s * elapsed)
            rows.append({"rate": rate, "calls_per_s": calls / elapsed,
                         "server_ms_per_call": server_s / calls * 1000,
                         "client_ms_per_call": (client_end - client_start) / calls * 1000,
                         "server_idle_ms_per_s": idle_per_s * 1000})
        return rows


def _parse_rates(text: str) -> list[float]:
    rates = [float(part) for part in text.split(",") if part.strip()]
    if not rates or any(rate < 0 for rate in rates):
        raise argparse.ArgumentTypeError(f"--rates takes calls a second, comma-separated, 0 for back to back; "
                                         f"got {text!r}")
    return rates


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.grpc_call_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--servers", default="bare,dispatcher", help="comma-separated, of: bare, dispatcher")
    parser.add_argument("--rates", type=_parse_rates, default=[30.0, 300.0, 0.0],
                        help="calls a second, comma-separated; 0: back to back (default 30,300,0)")
    parser.add_argument("--seconds", type=float, default=5.0, help="each window's length (default 5)")
    parser.add_argument("--cpus", default="", help="run every process on these CPUs (comma-separated), e.g. 0")
    parser.add_argument("--serve-bare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_bare:
        _serve_bare()
        return 0
    servers = [name.strip() for name in args.servers.split(",") if name.strip()]
    unknown = [name for name in servers if name not in SERVERS]
    if unknown or not servers:
        parser.error(f"--servers takes {', '.join(SERVERS)}; got {args.servers!r}")
    if args.seconds <= 0:
        parser.error(f"--seconds must be positive, got {args.seconds}")
    if args.cpus:
        # Before any child starts: each inherits the mask, all its threads included.
        os.sched_setaffinity(0, {int(cpu) for cpu in args.cpus.split(",")})
    print("| server | calls/s | server CPU per call | client CPU per call | server idle |")
    print("|---|---:|---:|---:|---:|")
    for name in servers:
        with ProcessGroup() as group:
            if name == "bare":
                proc = group.spawn([sys.executable, "-m", "benchmarks.grpc_call_cost", "--serve-bare"], "ours", "bare")
                address = f"127.0.0.1:{proc.wait_for_line(_BARE_LINE, 60).group(1)}"
            else:
                service, _ = start_cluster(group, "ours", sys.executable, 0)
                proc = group.procs[0]
                address = service.removeprefix("grpc://")
            for row in measure_calls(address, proc.pid, args.rates, args.seconds):
                print(f"| {SERVERS[name]} | {row['calls_per_s']:,.0f} | {row['server_ms_per_call']:.2f} ms | "
                      f"{row['client_ms_per_call']:.2f} ms | {row['server_idle_ms_per_s']:.1f} ms/s |", flush=True)
    pinned = f" on CPU {args.cpus}" if args.cpus else ""
    print(f"\ncommand: python -m benchmarks.grpc_call_cost{' ' + ' '.join(sys.argv[1:]) if sys.argv[1:] else ''}; "
          f"{os.cpu_count()} CPUs{pinned}; grpcio {grpc.__version__}; CPU from /proc (10 ms ticks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
