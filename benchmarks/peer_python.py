"""The interpreter the peer benchmarks run under: a separate venv with torch, Grain, SPDL and the like,
which are never dependencies of dataservice.

Example::

    >>> python, note = find_peer_python(args, "torch==2.13.0 torchdata grain")
    >>> note
    'peers under /work/peervenv/bin/python'
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

__all__ = ["PEER_PYTHON_CANDIDATES", "find_peer_python", "add_peer_arguments"]

REPO = Path(__file__).resolve().parents[1]
#: Where the peers' venv is looked for when ``--peer-python`` is not given.
PEER_PYTHON_CANDIDATES = (Path("/work/peervenv/bin/python"), REPO.parent / "peervenv" / "bin" / "python")


def find_peer_python(args: argparse.Namespace, packages: str) -> tuple[Optional[str], str]:
    """(the peers' interpreter or None, a line saying which or why none): ``args.peer_python``, else the
    first candidate that exists; ``args.no_peers`` skips them. ``packages``: what the venv needs, for the hint."""
    if args.no_peers:
        return None, "peers skipped (--no-peers)"
    candidates = [args.peer_python] if args.peer_python else [str(p) for p in PEER_PYTHON_CANDIDATES if p.exists()]
    if not candidates:
        return None, (f"peers skipped: no interpreter with the peers (make one: python3 -m venv /work/peervenv && "
                      f"/work/peervenv/bin/pip install {packages}; or pass --peer-python PATH)")
    return candidates[0], f"peers under {candidates[0]}"


def add_peer_arguments(parser: argparse.ArgumentParser, packages: str) -> None:
    """``--peer-python PATH`` (an interpreter with ``packages``) or ``--no-peers``."""
    peers = parser.add_mutually_exclusive_group()
    peers.add_argument("--peer-python", metavar="PATH", help=f"interpreter with {packages}")
    peers.add_argument("--no-peers", action="store_true")
