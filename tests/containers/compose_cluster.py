"""The compose cluster of ``docker-compose.yml``, run for real: a Docker engine, the image, ``docker compose``.

``tests/containers/test_compose_cluster.py`` drives it; ``make test-containers`` runs that (never ``make test``).

- ``engine_problem()``: why no Docker engine can be used here (None when one answers, after starting
  ``dockerd`` if it is installed, we are root, and nothing runs it yet).
- ``build_image()``: ``deploy/build-image.sh`` (the base image from Debian's packages where no registry
  answers), timed.
- ``ComposeProject``: ``docker compose`` over a copy of ``docker-compose.yml`` in a directory of its own, with
  the token secret written there, under a project name of its own: ``down -v`` can never remove the volumes
  of a user's own ``dataservice`` project on the same machine.

Every command has a deadline; a command that fails raises ``CommandError`` with its output.

Example::

    >>> project = ComposeProject(tmp_path, token="t" * 43)
    >>> project.up_healthy(["dispatcher", "worker1", "worker2"], timeout_s=240)
    >>> project.run_client(["--epochs", "1"], timeout_s=300).stdout
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
IMAGE = "dataservice:latest"
#: How long dockerd may take to answer after it is started.
ENGINE_START_S = 60.0


class CommandError(RuntimeError):
    """A command failed or missed its deadline; the message carries its output."""


def run(args: Sequence[str], timeout_s: float, check: bool = True, env: Optional[dict] = None,
        cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    """``args`` run to completion within ``timeout_s``; CommandError (with its output) if it fails and ``check``."""
    try:
        result = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout_s, env=env,
                                cwd=cwd, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise CommandError(f"`{' '.join(args)}` still running after {timeout_s:.0f} s:\n"
                           f"{_text(exc.stdout)[-3000:]}\n{_text(exc.stderr)[-3000:]}") from exc
    if check and result.returncode != 0:
        raise CommandError(f"`{' '.join(args)}` exited with {result.returncode}:\n"
                           f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def _text(out) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")


def _answers() -> bool:
    try:
        return run(["docker", "info"], 30, check=False).returncode == 0
    except (OSError, CommandError):
        return False


def engine_problem(log_path: Path) -> Optional[str]:
    """None when a Docker engine with Compose v2 and buildx answers, after starting ``dockerd`` (logging to
    ``log_path``) if it is installed and not running; else why not, for ``pytest.skip``."""
    if shutil.which("docker") is None:
        return "no docker command: install a Docker engine (Debian 12: sudo deploy/install-docker.sh)"
    if not _answers():
        if shutil.which("dockerd") is None:
            return "no Docker engine answers and dockerd is not installed (Debian 12: sudo deploy/install-docker.sh)"
        if os.geteuid() != 0:
            return "no Docker engine answers, and only root may start dockerd here (sudo deploy/install-docker.sh)"
        log = open(log_path, "ab")
        subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)
        deadline = time.monotonic() + ENGINE_START_S
        while not _answers():
            if time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-1500:]
                return f"dockerd did not answer within {ENGINE_START_S:.0f} s of its start; its log ends:\n{tail}"
            time.sleep(0.5)
    for plugin in ("compose", "buildx"):
        if run(["docker", plugin, "version"], 30, check=False).returncode != 0:
            return f"`docker {plugin}` is missing (Debian 12: sudo deploy/install-docker.sh installs Debian 13's)"
    return None


def build_image() -> float:
    """Builds ``dataservice:latest`` with ``deploy/build-image.sh``; the seconds it took."""
    started = time.monotonic()
    run(["bash", str(REPO / "deploy" / "build-image.sh")], 1800, cwd=REPO)
    return time.monotonic() - started


def image_size_mb(image: str = IMAGE) -> float:
    return int(run(["docker", "image", "inspect", "--format", "{{.Size}}", image], 30).stdout) / 1e6


class ComposeProject:
    """``docker-compose.yml`` as written, in ``directory`` with its secret file ``deploy/auth_token``."""

    def __init__(self, directory: Path, token: str):
        self.directory = directory
        self.name = f"dataservice-test-{uuid.uuid4().hex[:6]}"
        (directory / "deploy").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / "docker-compose.yml", directory / "docker-compose.yml")
        self.write_token(token)

    def write_token(self, token: str) -> None:
        """The secret file every service reads (a bind mount: running containers see the new file at once)."""
        path = self.directory / "deploy" / "auth_token"
        path.write_text(token + "\n")
        path.chmod(0o644)  # the containers' user (uid 1000) reads it
        self.token = token

    def compose(self, *args: str, timeout_s: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        return run(["docker", "compose", "-p", self.name, "--project-directory", str(self.directory),
                    "-f", str(self.directory / "docker-compose.yml"), *args], timeout_s, check=check)

    def up_healthy(self, services: Sequence[str], timeout_s: float) -> float:
        """``up -d --wait`` of ``services`` (the image built already); the seconds until all were healthy."""
        started = time.monotonic()
        self.compose("up", "-d", "--no-build", "--wait", "--wait-timeout", str(int(timeout_s)), *services,
                     timeout_s=timeout_s + 30)
        return time.monotonic() - started

    def container(self, service: str) -> str:
        """The id of ``service``'s container."""
        ids = self.compose("ps", "-a", "-q", service).stdout.split()
        if len(ids) != 1:
            raise CommandError(f"{service} has {len(ids)} containers: {ids}")
        return ids[0]

    def state(self, service: str) -> dict:
        """``docker inspect``'s State of ``service``'s container (Status, Health.Status, RestartCount...)."""
        info = json.loads(run(["docker", "inspect", self.container(service)], 30).stdout)[0]
        return {**info["State"], "RestartCount": info.get("RestartCount", 0)}

    def health(self, service: str) -> str:
        state = self.state(service)
        return (state.get("Health") or {}).get("Status", state["Status"])

    def client_command(self, *args: str, entrypoint: Optional[str] = None) -> list:
        """``docker compose run`` of the client service (on the compose network, with the secret)."""
        cmd = ["docker", "compose", "-p", self.name, "--project-directory", str(self.directory),
               "-f", str(self.directory / "docker-compose.yml"), "run", "--rm", "-T", "--no-deps"]
        if entrypoint:
            cmd += ["--entrypoint", entrypoint]
        return cmd + ["client", *args]

    def resources(self) -> dict:
        """The project's containers, networks and volumes that exist now (by compose's project label)."""
        label = f"label=com.docker.compose.project={self.name}"
        return {kind: run(["docker", *command, "--filter", label, "-q"], 30).stdout.split()
                for kind, command in (("containers", ["ps", "-a"]), ("networks", ["network", "ls"]),
                                      ("volumes", ["volume", "ls"]))}

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", "--timeout", "10", timeout_s=180, check=False)
