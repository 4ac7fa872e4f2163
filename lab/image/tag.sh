#!/usr/bin/env bash
# Print the lab image tag: a hash of the recipe, so an unchanged recipe is never rebuilt.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
hash=$(cd "$here" && cat build.sh configure.sh packages.txt debian.sources | sha256sum | cut -c1-12)
echo "${LAB_IMAGE_REPO:-sparkops/lab-spark}:$hash"
