#!/usr/bin/env bash
# Make sure a Docker engine answers: install Debian's docker.io (and debootstrap, for the lab
# image) when missing, and start dockerd when none runs. The host has no systemd (PID 1 is not
# systemd), so dockerd is started in the background with its log in /var/log/sparkops-dockerd.log.
set -euo pipefail
if docker info >/dev/null 2>&1; then
    exit 0
fi
need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
    echo "installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ "$(id -u)" != 0 ]; then
    echo "no Docker engine answers and starting one needs root" >&2
    exit 1
fi
if ! pgrep -x dockerd >/dev/null; then
    echo "starting dockerd"
    nohup dockerd >/var/log/sparkops-dockerd.log 2>&1 &
fi
for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && exit 0
    sleep 1
done
echo "dockerd did not answer within 60 s; see /var/log/sparkops-dockerd.log" >&2
tail -n 20 /var/log/sparkops-dockerd.log >&2 || true
exit 1
