"""``dataservice datasets``: list the catalogue's datasets, and prepare one (TFDS's ``tfds build``).

::

    dataservice datasets list [--data-dir DIR] [--json]
    dataservice datasets build NAME[/CONFIG][:VERSION] [--data-dir DIR] [--num-shards N]
                               [--max-examples-per-split N] [--import MODULE ...]

``list`` shows the registered builders (with their versions and configs) and every dataset
prepared under the data directory, TFDS's included, with its splits. ``build`` prepares a dataset
(a no-op when it is prepared already); ``--import`` first imports modules that define builders of
your own, e.g. ``--import my_project.datasets``. Exit codes: 0 done, 1 the preparation failed,
2 a wrong name, version or flag.

Example::

    $ dataservice datasets build shapes --data-dir /mnt/datasets
    prepared shapes:1.0.0 in /mnt/datasets/shapes/1.0.0: train 6,000 examples (1 shard), test 1,000 (1 shard)
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any

from dataservice import errors

__all__ = ["add_parser", "run"]

EXIT_FAILURE = 1
EXIT_USAGE = 2


def add_parser(commands: Any, positive_int: Any) -> argparse.ArgumentParser:
    """Adds ``datasets`` to the ``dataservice`` command's subparsers."""
    datasets = commands.add_parser(
        "datasets", help="list the dataset catalogue, or prepare a dataset",
        description="List the catalogue's builders and the datasets prepared in a data directory, or prepare "
                    "one (TFDS's on-disk format).")
    actions = datasets.add_subparsers(dest="datasets_command", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="registered builders and prepared datasets",
                                 description="Show the registered builders and the datasets prepared in the "
                                             "data directory (TFDS's too).")
    listing.add_argument("--json", action="store_true", help="print JSON instead of text")
    build = actions.add_parser("build", help="prepare a dataset",
                               description="Prepare a dataset (nothing to do if it is prepared already).")
    build.add_argument("name", metavar="NAME[/CONFIG][:VERSION]", help="e.g. shapes, or my_ds/small:1.*.*")
    build.add_argument("--num-shards", type=positive_int, metavar="N", default=None,
                       help="shards per split (default: by size, as TFDS: 64 MiB to 1 GiB each)")
    build.add_argument("--max-examples-per-split", type=positive_int, metavar="N", default=None,
                       help="prepare only the first N examples of each split (a trial run)")
    for sub in (listing, build):
        sub.add_argument("--data-dir", metavar="DIR", default=None,
                         help="where datasets are prepared (default: $DATASERVICE_DATA_DIR, $TFDS_DATA_DIR or "
                              "~/tensorflow_datasets)")
        sub.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                         help="import MODULE first, to register the builders it defines (repeatable)")
        sub.set_defaults(_parser=sub)
    datasets.set_defaults(_parser=datasets)
    return datasets


def _prepared(data_dir: str) -> list[dict]:
    from dataservice.catalogue.dataset_info import DATASET_INFO_FILENAME, DatasetInfo

    found = []
    if not os.path.isdir(data_dir):
        return found
    for root, dirs, files in os.walk(data_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("incomplete.", "downloads", ".")))
        if DATASET_INFO_FILENAME in files:
            dirs[:] = []
            try:
                info = DatasetInfo.read_from_directory(root)
            except (OSError, ValueError) as exc:
                found.append({"directory": root, "error": str(exc)})
                continue
            found.append({"name": info.name, "config": info.config_name or None, "version": str(info.version),
                          "directory": root,
                          "splits": {n: {"examples": s.num_examples, "shards": s.num_shards}
                                     for n, s in info.splits.items()}})
    return found


def _builders() -> list[dict]:
    from dataservice.catalogue import registry

    out = []
    for name in registry.list_builders():
        cls = registry._REGISTRY[name]
        configs = [c.name for c in cls.BUILDER_CONFIGS]
        versions = sorted({str(v) for v in ([cls.VERSION] if cls.VERSION else []) + list(cls.SUPPORTED_VERSIONS)}
                          | {str(c.version) for c in cls.BUILDER_CONFIGS if c.version is not None})
        out.append({"name": name, "module": cls.__module__, "configs": configs, "versions": versions})
    return out


def _splits_text(splits: dict) -> str:
    return ", ".join(f"{name} {s['examples']:,} examples ({s['shards']} shard{'s' if s['shards'] != 1 else ''})"
                     for name, s in splits.items())


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Runs ``dataservice datasets list|build``; returns the exit code."""
    from dataservice import catalogue

    for module in args.imports:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            print(f"dataservice datasets: error: --import {module}: {exc}", file=sys.stderr, flush=True)
            return EXIT_USAGE
    data_dir = os.path.expanduser(args.data_dir) if args.data_dir else catalogue.default_data_dir()
    if args.datasets_command == "list":
        listing = {"data_dir": data_dir, "builders": _builders(), "prepared": _prepared(data_dir)}
        if args.json:
            json.dump(listing, sys.stdout, indent=2)
            sys.stdout.write("\n")
            return 0
        print("registered builders:")
        for b in listing["builders"]:
            configs = f", configs {', '.join(b['configs'])}" if b["configs"] else ""
            print(f"  {b['name']}  versions {', '.join(b['versions'])}{configs}  ({b['module']})")
        print(f"prepared in {data_dir}:" if listing["prepared"] else f"nothing prepared in {data_dir}")
        for p in listing["prepared"]:
            if "error" in p:
                print(f"  {p['directory']}: unreadable: {p['error']}")
                continue
            name = p["name"] + (f"/{p['config']}" if p["config"] else "")
            print(f"  {name}:{p['version']}  {_splits_text(p['splits'])}")
        return 0
    try:
        b = catalogue.builder(args.name, data_dir=data_dir)
        config = catalogue.DownloadConfig(num_shards=args.num_shards,
                                          max_examples_per_split=args.max_examples_per_split)
    except (errors.CatalogueError, ValueError) as exc:
        print(f"dataservice datasets build: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    was_prepared = b.is_prepared
    try:
        b.download_and_prepare(download_config=config)
    except Exception as exc:  # a builder's own code failed: report it, leave nothing half-written
        print(f"dataservice datasets build: error: preparing {args.name} failed: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
        return EXIT_FAILURE
    splits = {n: {"examples": s.num_examples, "shards": s.num_shards} for n, s in b.info.splits.items()}
    verb = "already prepared" if was_prepared else "prepared"
    config_name = f"/{b.builder_config.name}" if b.builder_config is not None else ""
    print(f"{verb} {b.name}{config_name}:{b.version} in {b.data_dir}: {_splits_text(splits)}", flush=True)
    return 0
