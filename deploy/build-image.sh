#!/usr/bin/env bash
# Builds the dataservice image (deploy/Dockerfile) the way the tests do, from the repository root.
#
#   deploy/build-image.sh                  # -> dataservice:latest
#   TAG=registry.example/dataservice:1 deploy/build-image.sh
#
# - Base image: BASE_IMAGE if set; else python:3.11-slim if the engine has it or can pull it; else the
#   air-gapped equivalent built from Debian's packages by deploy/base-image.sh (dataservice-base:bookworm,
#   built once and reused).
# - Network: the build runs on the host's network (--network host), so pip reaches the index the host
#   reaches, through the host's proxy if it has one.
# - pip's configuration: the host's (`pip config list`) goes in as the build secret `pip.conf`, minus what
#   names files of this host (find-links, constraint, file: indexes), and the CA bundle pip trusts
#   (PIP_CERT, pip's `cert`, else REQUESTS_CA_BUNDLE or SSL_CERT_FILE) as the secret `ca-certificates`.
#   Secrets are mounted for the one `pip install` and are in no layer of the image.
#
# Prints the image's size at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

TAG="${TAG:-dataservice:latest}"
die() { echo "build-image.sh: $*" >&2; exit 1; }
docker info >/dev/null 2>&1 || die "no Docker engine answers (sudo deploy/install-docker.sh installs and starts one)"
docker buildx version >/dev/null 2>&1 || die "docker buildx is missing: build secrets need BuildKit (deploy/install-docker.sh)"

if [ -z "${BASE_IMAGE:-}" ]; then
    if docker image inspect python:3.11-slim >/dev/null 2>&1 || timeout 60 docker pull -q python:3.11-slim >/dev/null 2>&1; then
        BASE_IMAGE=python:3.11-slim
    else
        BASE_IMAGE=dataservice-base:bookworm
        if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
            echo "build-image.sh: python:3.11-slim cannot be pulled; building $BASE_IMAGE from Debian's packages"
            if [ "$(id -u)" = 0 ]; then deploy/base-image.sh "$BASE_IMAGE"; else sudo deploy/base-image.sh "$BASE_IMAGE"; fi
        fi
    fi
fi

secrets="$(mktemp -d)"
trap 'rm -rf "$secrets"' EXIT
python3 - "$secrets" <<'EOF'
"""The host's pip configuration, as a pip.conf a build can use, and the CA bundle pip trusts."""
import os
import re
import shutil
import subprocess
import sys

out = sys.argv[1]
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
settings = {}
for line in listed.splitlines():
    match = re.fullmatch(r"(?::env:|global|install|download)\.([\w-]+)='(.*)'", line.strip())
    if match:
        settings[match.group(1)] = match.group(2)
for name, value in os.environ.items():  # PIP_INDEX_URL and the like, as pip reads them
    if name.startswith("PIP_"):
        settings[name[4:].lower().replace("_", "-")] = value
cert = settings.pop("cert", None) or os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("SSL_CERT_FILE")
keep = ("index-url", "extra-index-url", "trusted-host", "proxy", "timeout", "default-timeout", "retries")
lines = ["[global]"]
for key in keep:
    if key in settings:
        # Indexes on this host's disk (file:) do not exist in the build.
        values = [v for v in settings[key].split() if not v.startswith("file:")]
        if values:
            lines.append(f"{key} = {' '.join(values)}")
with open(os.path.join(out, "pip.conf"), "w") as f:
    f.write("\n".join(lines) + "\n")
if cert and os.path.isfile(cert):
    shutil.copyfile(cert, os.path.join(out, "ca-certificates.crt"))
EOF
args=(--secret "id=pip.conf,src=$secrets/pip.conf")
[ -f "$secrets/ca-certificates.crt" ] && args+=(--secret "id=ca-certificates,src=$secrets/ca-certificates.crt")

echo "build-image.sh: building $TAG from $BASE_IMAGE"
docker buildx build --load --network host --build-arg "BASE_IMAGE=$BASE_IMAGE" "${args[@]}" \
    -f deploy/Dockerfile -t "$TAG" .
echo "build-image.sh: built $TAG ($(docker image inspect --format '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1 / 1e6}') from $BASE_IMAGE)"
