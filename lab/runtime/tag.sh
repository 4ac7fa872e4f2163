#!/usr/bin/env bash
# Print the lab runtime image tag: a hash of the recipe (this folder's build files and the base
# image tag; platform/ too), so an unchanged recipe is never rebuilt.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
base=${LAB_RUNTIME_BASE:-$("$here/../image/tag.sh")}
hash=$( (cd "$here" && cat build.sh install.sh env.list requirements.txt exclude.txt debs.txt platform/*; echo "$base") \
    | sha256sum | cut -c1-12)
echo "${LAB_RUNTIME_REPO:-sparkops/lab-vllm-cpu}:$hash"
