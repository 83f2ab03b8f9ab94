#!/usr/bin/env bash
# Builds a Python base image from Debian's packages, for hosts that reach no container registry.
#
#   sudo deploy/base-image.sh                       # -> dataservice-base:bookworm
#   docker build --build-arg BASE_IMAGE=dataservice-base:bookworm -f deploy/Dockerfile -t dataservice .
#
# deploy/Dockerfile starts FROM python:3.11-slim, the official image. An air-gapped cluster, or a CI
# machine that can reach Debian's package mirror but no registry, cannot pull it. This script makes
# an image with the same layout from Debian's own packages:
# - Debian 12 (bookworm), the release python:3.11-slim is built on, with its Python 3.11;
# - `python`, `python3` and `pip` first on PATH, from a virtual environment in /usr/local/python,
#   so the Dockerfile's `pip install` needs no --break-system-packages;
# - ca-certificates, and the tools the Dockerfile uses (useradd).
# It runs debootstrap into a temporary directory (about 70 s), strips the documentation and apt's
# caches, and imports the tree with `docker import`.
#
# The package mirror is the host's own: the first deb.debian.org-style URI of its apt sources that
# serves the suite (override with MIRROR=http://...), and apt's HTTP proxy if it has one. No mirror
# host is written here.
#
# Needs root (debootstrap and chroot), debootstrap, and a running Docker engine.
# Environment: SUITE (default bookworm), MIRROR, TAG (or the first argument).
set -euo pipefail

SUITE="${SUITE:-bookworm}"
TAG="${1:-${TAG:-dataservice-base:$SUITE}}"

die() { echo "base-image.sh: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (debootstrap and chroot); run it with sudo"
command -v debootstrap >/dev/null || die "debootstrap is not installed (Debian: apt-get install debootstrap)"
command -v docker >/dev/null || die "docker is not installed"
docker info >/dev/null 2>&1 || die "no Docker engine answers (is dockerd running?)"

# The host's mirror: deb822 sources (URIs: + Suites:) first, then one-line sources.list entries.
host_mirror() {
    local file uris suites
    for file in /etc/apt/sources.list.d/*.sources; do
        [ -f "$file" ] || continue
        # One stanza per blank-line-separated block; keep the URIs of those whose Suites holds $SUITE.
        awk -v suite="$SUITE" '
            /^[[:space:]]*$/ { if (uris != "" && index(" " suites " ", " " suite " ")) { print uris; exit }
                               uris = ""; suites = ""; next }
            /^URIs:/   { sub(/^URIs:[[:space:]]*/, ""); split($0, u, " "); uris = u[1] }
            /^Suites:/ { sub(/^Suites:[[:space:]]*/, ""); suites = $0 }
            END { if (uris != "" && index(" " suites " ", " " suite " ")) print uris }
        ' "$file" | head -n 1
    done
    for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$file" ] || continue
        awk -v suite="$SUITE" '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/) { if ($(i+1) == suite) print $i; break } }' "$file"
    done
}

if [ -z "${MIRROR:-}" ]; then
    MIRROR="$(host_mirror | head -n 1 || true)"
    [ -n "$MIRROR" ] || die "no apt source of this host serves '$SUITE'; set MIRROR=http://your.mirror/debian"
fi
# apt's proxy, for debootstrap's downloads (it does not read apt's configuration).
if [ -z "${http_proxy:-}" ] && command -v apt-config >/dev/null; then
    proxy="$(apt-config shell P Acquire::http::Proxy 2>/dev/null | sed -n "s/^P='\(.*\)'$/\1/p")"
    [ -n "$proxy" ] && export http_proxy="$proxy"
fi

ROOT="$(mktemp -d /tmp/dataservice-base.XXXXXX)"
trap 'rm -rf "$ROOT"' EXIT
echo "base-image.sh: debootstrap $SUITE from $MIRROR into $ROOT"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,passwd \
    "$SUITE" "$ROOT" "$MIRROR" >"$ROOT.log" 2>&1 || { tail -n 30 "$ROOT.log" >&2; die "debootstrap failed (log: $ROOT.log)"; }
rm -f "$ROOT.log"

# python, python3 and pip from a virtual environment first on PATH, as /usr/local/bin in python:3.11-slim.
chroot "$ROOT" python3 -m venv /usr/local/python
chroot "$ROOT" /usr/local/python/bin/python -m pip --version >/dev/null

# What a slim image leaves out: documentation, manuals, locales but C.UTF-8, apt's lists and caches.
rm -rf "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/info/* \
       "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/* "$ROOT"/var/log/*.log "$ROOT"/tmp/*
find "$ROOT"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} +
find "$ROOT" -name __pycache__ -type d -prune -exec rm -rf {} +

tar --numeric-owner -C "$ROOT" -c . | docker import \
    --change 'ENV PATH=/usr/local/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --message "Debian $SUITE with Python 3 (deploy/base-image.sh)" \
    - "$TAG" >/dev/null
echo "base-image.sh: built $TAG ($(docker image inspect --format '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1 / 1e6}'))"
