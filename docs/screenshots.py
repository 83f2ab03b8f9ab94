"""Screenshots of three rendered pages of the site, taken in headless Chromium, and a check of their layout.

    .venv/bin/python docs/screenshots.py            # builds the site, writes docs/assets/*.png

It builds the site (``mkdocs build --strict``) into a temporary directory, serves it on 127.0.0.1, and for
the home page, a tutorial and an API page: dumps the DOM Chromium rendered and checks it has the site's
navigation, highlighted code and no raw Markdown (no code fence, no unrendered ``:::`` directive), then
takes a 1280x900 screenshot into ``docs/assets/``. Needs Debian's ``chromium``.

Example::

    $ .venv/bin/python docs/screenshots.py
    docs/assets/home.png: navigation, highlighted code, no raw Markdown
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO / "docs" / "assets"
PAGES = {"home": "", "tutorial": "tutorials/pytorch/", "api": "reference/service/"}
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


def chromium(*args: str, profile: str) -> subprocess.CompletedProcess:
    return subprocess.run([shutil.which("chromium") or "chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                           *args], capture_output=True, text=True, timeout=120)


def layout_problems(dom: str) -> list[str]:
    """What a rendered page lacks: the site's navigation, highlighted code; or raw Markdown it shows."""
    problems = []
    if 'class="md-nav' not in dom:
        problems.append("no navigation (md-nav)")
    if 'class="highlight' not in dom and 'class="doc doc-' not in dom:
        problems.append("no highlighted code")
    text = dom.split("<body", 1)[-1]
    if "```" in text or "\n::: " in text:
        problems.append("raw Markdown (a code fence or a ::: directive) in the page")
    return problems


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name): no line per request
        pass


def main() -> int:
    if shutil.which("chromium") is None:
        print("chromium is not installed (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    site = Path(tempfile.mkdtemp(prefix="site-"))
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=REPO, env=env,
                   check=True, capture_output=True, timeout=300)
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ASSETS.mkdir(exist_ok=True)
    failed = False
    try:
        for name, path in PAGES.items():
            url = f"http://127.0.0.1:{server.server_port}/{path}"
            with tempfile.TemporaryDirectory() as profile:
                dom = chromium("--dump-dom", url, profile=profile).stdout
            problems = layout_problems(dom)
            out = ASSETS / f"{name}.png"
            with tempfile.TemporaryDirectory() as profile:
                chromium(f"--screenshot={out}", "--window-size=1280,900", url, profile=profile)
            if not out.exists():
                problems.append("no screenshot written")
            failed |= bool(problems)
            print(f"{out.relative_to(REPO)}: {'; '.join(problems) or 'navigation, highlighted code, no raw Markdown'}")
    finally:
        server.shutdown()
        shutil.rmtree(site, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
