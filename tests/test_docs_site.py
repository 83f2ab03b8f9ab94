"""The documentation site (issue 30): ``mkdocs build --strict`` builds it (never with ``--quiet``, which hides
the warnings that --strict counts, so the build would pass with a broken link) (``make docs``, which ``make test``
runs first), and its generated reference pages hold what the code has: every subcommand and option of the
``dataservice`` command from its argparse parsers, and the API from the docstrings, with no directive left
unrendered. Its Python examples run in tests/test_readme.py."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dataservice.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def _text(page: Path) -> str:
    """A built page's text, tags stripped."""
    return re.sub(r"<[^>]+>", "", page.read_text())


def test_the_cli_reference_has_every_subcommand_and_option(site):
    text = _text(site / "reference" / "cli" / "index.html")
    parser = build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subcommands.choices.items():
        assert f"dataservice {name}" in text, name
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help") and action.help != argparse.SUPPRESS:
                    assert option in text, f"dataservice {name} {option}"


def test_the_api_reference_is_rendered_from_the_docstrings(site):
    # Each object gets a heading whose id is its full path, with its signature and docstring under it.
    expected = {"service": ["client.distribute.distribute", "client.distribute.register_dataset",
                            "client.distribute.from_dataset_id", "dispatcher.server.DispatchServer",
                            "worker.server.WorkerServer"],
                "configuration": ["service.config.DispatcherConfig", "service.config.WorkerConfig"],
                "formats": [], "errors": []}
    for page, objects in expected.items():
        html = (site / "reference" / page / "index.html").read_text()
        assert ":::" not in html, page
        for path in objects:
            assert f'id="dataservice.{path}"' in html, (page, path)
    service = _text(site / "reference" / "service" / "index.html")
    assert "processing_mode" in service and "distributed_epoch" in service  # distribute's docstring
    formats = _text(site / "reference" / "formats" / "index.html")
    assert "DSW2" in formats and "journal.log" in formats  # the wire format's and the journal's docstrings
    dataset = _text(site / "reference" / "dataset" / "index.html")
    for method in ("map", "batch", "shuffle", "split_groups"):
        assert re.search(rf"\b{method}\b", dataset), method
    errors = _text(site / "reference" / "errors" / "index.html")
    assert "ServiceError" in errors and "InvalidRequestError" in errors


def test_a_broken_link_fails_the_strict_build(tmp_path):
    """--strict has teeth: the same site with a link to a page that does not exist does not build."""
    docs = tmp_path / "docs"
    subprocess.run(["cp", "-r", str(REPO / "docs"), str(docs)], check=True, timeout=60)
    (docs / "get-started.md").write_text((docs / "get-started.md").read_text() + "\n[gone](no-such-page.md)\n")
    config = (REPO / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}") \
        .replace("docs/hooks/", f"{docs}/hooks/").replace("paths: [.]", f"paths: [{REPO}]")
    (tmp_path / "mkdocs.yml").write_text(config)
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "out")],
                            cwd=tmp_path, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"), capture_output=True,
                            text=True, timeout=BUILD_TIMEOUT_S)
    assert result.returncode != 0
    assert "no-such-page.md" in result.stdout + result.stderr
