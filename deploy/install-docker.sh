#!/usr/bin/env bash
# Installs a Docker engine, Compose v2 and buildx from Debian's packages, and starts the engine.
#
#   sudo deploy/install-docker.sh
#
# For a Debian 12 host with no access to Docker's own package repository (this project's CI is one):
# - the engine: Debian 12's docker.io (dockerd, containerd, runc);
# - Compose v2 (`docker compose`) and buildx (`docker buildx`, BuildKit's build secrets): Debian 13's
#   docker-compose and docker-buildx packages. Debian 12's docker-compose is v1, which rejects this
#   project's compose file. Both are static Go binaries that need only libc6 >= 2.34, so Debian 13's
#   .deb files install as they are. They come from the host's own Debian mirror: the first URI of its apt
#   sources (override with MIRROR=http://...);
# - debootstrap, for deploy/base-image.sh.
# Then it starts dockerd in the background (log: /var/log/dockerd.log) if no engine answers and
# nothing like systemd runs it. What is installed already is left as it is.
set -euo pipefail

die() { echo "install-docker.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (apt-get, dpkg, dockerd)"
command -v apt-get >/dev/null || die "not a Debian host (no apt-get): install Docker Engine and Compose v2 your platform's way"

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v iptables >/dev/null || need+=(iptables)
if [ ${#need[@]} -gt 0 ]; then
    echo "install-docker.sh: apt-get install ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# The host's Debian mirror: the first URI of its apt sources (deb822 or one-line) that is not the security archive.
mirror() {
    if [ -n "${MIRROR:-}" ]; then echo "$MIRROR"; return; fi
    local file
    for file in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$file" ] || continue
        sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' "$file"
        awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/) { print $i; break } }' "$file"
    done | grep -v security | head -n 1 || true
}

# Debian 13's package of a plugin: the pool path from trixie's package index.
install_from_trixie() {
    local package="$1" base index file tmp
    base="$(mirror)"
    [ -n "$base" ] || die "no Debian mirror in this host's apt sources; set MIRROR=http://your.mirror/debian"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' RETURN
    index="$tmp/Packages.xz"
    curl -fsS --retry 3 -m 300 -o "$index" "$base/dists/trixie/main/binary-$(dpkg --print-architecture)/Packages.xz" \
        || die "cannot download trixie's package index from $base"
    # (awk stops at the match, so xz may die of SIGPIPE: not a failure.)
    file="$(xz -dc "$index" | awk -v p="$package" '$1 == "Package:" { hit = ($2 == p) } hit && $1 == "Filename:" { print $2; exit }' || true)"
    [ -n "$file" ] || die "trixie has no package $package"
    echo "install-docker.sh: $package from $base/$file"
    curl -fsS --retry 3 -m 600 -o "$tmp/$package.deb" "$base/$file" || die "cannot download $base/$file"
    dpkg -i "$tmp/$package.deb" >/dev/null
}

docker compose version >/dev/null 2>&1 || install_from_trixie docker-compose
docker buildx version >/dev/null 2>&1 || install_from_trixie docker-buildx

if ! docker info >/dev/null 2>&1; then
    echo "install-docker.sh: starting dockerd (log: /var/log/dockerd.log)"
    nohup dockerd >/var/log/dockerd.log 2>&1 &
    for _ in $(seq 1 120); do
        docker info >/dev/null 2>&1 && break
        sleep 0.5
    done
    docker info >/dev/null 2>&1 || { tail -n 20 /var/log/dockerd.log >&2; die "dockerd did not start"; }
fi
echo "install-docker.sh: $(docker version --format 'engine {{.Server.Version}}, client {{.Client.Version}}'), $(docker compose version)"
