"""The install commands: `make demo` and `make test` install the exact versions of the lock.

``requirements/lock.txt`` pins every package, and the Makefile reads it as pip constraints;
these tests check that the lock covers what pyproject.toml asks for, that the environment
``make test`` made holds exactly the locked versions, and (slow) that ``make demo`` in a
fresh virtualenv installs only what the demo needs and tells the user what to do next.

Example::

    $ python -m pytest tests/test_install.py
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements" / "lock.txt"


def _locked() -> dict[str, Version]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"{LOCK}: {line!r} is not an exact pin (name==version)"
            pins[canonicalize_name(name)] = Version(version)
    return pins


def _requirements() -> list[Requirement]:
    """pyproject.toml's dependencies and the extras make demo and make test install (the docs extra with test)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    requirements = [Requirement(r) for r in (*project["dependencies"], *extras["test"], *extras["images"])]
    # The test extra names the docs extra as dataservice[docs]: its requirements, not the package itself.
    for requirement in [r for r in requirements if canonicalize_name(r.name) == "dataservice"]:
        requirements.remove(requirement)
        requirements += [Requirement(r) for extra in requirement.extras for r in extras[extra]]
    return requirements


def test_the_lock_pins_every_requirement_within_its_range() -> None:
    pins = _locked()
    for requirement in _requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in {LOCK.name}: run `make lock`"
        assert requirement.specifier.contains(pins[name], prereleases=True), \
            f"{LOCK.name} pins {name}=={pins[name]}, outside pyproject.toml's {requirement}: run `make lock`"
    # What builds the editable install is pinned too, so a setuptools release cannot break a fresh clone.
    assert {"pip", "setuptools"} <= set(pins)


def test_make_test_installed_the_locked_versions() -> None:
    if not (Path(sys.prefix) / ".installed-test").exists():
        pytest.skip(f"{sys.prefix} was not made by `make test` (make test-latest runs the newest releases)")
    pins = _locked()
    installed = {canonicalize_name(d.metadata["Name"]): Version(d.version) for d in importlib.metadata.distributions()}
    installed.pop("dataservice")
    unlocked = sorted(f"{name}=={version}" for name, version in installed.items() if name not in pins)
    assert not unlocked, f"installed but not locked: {unlocked}; run `make lock`"
    differ = sorted(f"{name} {installed[name]} (locked {pins[name]})" for name in installed
                    if installed[name] != pins[name])
    assert not differ, f"installed versions differ from {LOCK.name}: {differ}"


@pytest.mark.slow
def test_make_demo_installs_only_what_the_demo_needs(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venv = tmp_path / "venv"
    result = subprocess.run(["make", "--no-print-directory", "-C", str(REPO), f"VENV={venv}", f"PYTHON={sys.executable}", "demo"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    # It said what it installs before the minute it takes, and ended with the next step.
    assert re.search(r"^Installing what the demo needs: .*\(no PyTorch or JAX\)", result.stdout, re.M | re.S), \
        result.stdout
    assert "cluster stopped (exit code 0)" in result.stdout
    assert result.stdout.rstrip().endswith("the README starts with a distributed read in ten lines."), \
        result.stdout[-2000:]
    assert "dataservice dispatcher --port 5050" in result.stdout
    freeze = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "freeze", "--all", "--exclude-editable"],
                            capture_output=True, text=True, timeout=120, check=True).stdout
    installed = {canonicalize_name(line.partition("==")[0]): Version(line.partition("==")[2])
                 for line in freeze.splitlines() if "==" in line}
    assert not {"torch", "jax", "jaxlib", "pytest"} & set(installed), sorted(installed)
    pins = _locked()
    assert {name: version for name, version in installed.items() if pins.get(name) != version} == {}
