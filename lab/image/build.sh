#!/usr/bin/env bash
# Build the lab Spark base image: Debian bookworm with systemd as PID 1, python3 and the docker
# CLI, made with debootstrap and `docker import` (no registry is needed).
# (docker import cannot set STOPSIGNAL here: containers are started with --stop-signal SIGRTMIN+3.)
# Usage: lab/image/build.sh [TAG]   (default tag: sparkops/lab-spark:<hash of this recipe>)
# The image is rebuilt only when the recipe (the files of this folder) changes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tag=${1:-$("$here/tag.sh")}
if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "lab image $tag is up to date"
    exit 0
fi
mirror=${LAB_DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
work=$(mktemp -d /var/tmp/sparkops-lab-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
rootfs=$work/rootfs
packages=$(grep -v '^#' "$here/packages.txt" | xargs | tr ' ' ',')
echo "building $tag with debootstrap ($suite, $mirror)"
debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -n 30 "$work/debootstrap.log"; exit 1; }
cp "$here/debian.sources" "$rootfs/etc/apt/sources.list.d/debian.sources"
rm -f "$rootfs/etc/apt/sources.list"
chroot "$rootfs" /bin/sh -s <"$here/configure.sh"
chroot "$rootfs" apt-get clean
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin
# No package lists in the image: mark them as never updated, so `apt update_cache` with
# cache_valid_time fetches them on first use.
touch -d @0 "$rootfs/var/lib/apt/lists"
tar -C "$rootfs" --numeric-owner -c . | docker import \
    --change 'ENV container=docker' \
    --change 'CMD ["/sbin/init"]' \
    --change "LABEL org.opencontainers.image.title=sparkops-lab-spark" \
    - "$tag" >/dev/null
echo "built $tag"
