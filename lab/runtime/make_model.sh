#!/usr/bin/env bash
# Make the tiny lab Llama (make_tiny_model.py) in OUT_DIR, offline. Runs on the host when its
# Python has numpy and tokenizers, else inside the lab runtime image (which has both).
# Usage: lab/runtime/make_model.sh OUT_DIR [IMAGE]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: make_model.sh OUT_DIR [IMAGE]}
mkdir -p "$out"
out=$(cd "$out" && pwd)
if python3 -c 'import numpy, tokenizers' 2>/dev/null; then
    exec python3 "$here/make_tiny_model.py" "$out"
fi
image=${2:-$("$here/tag.sh")}
exec docker run --rm -i --network none --user "$(id -u):$(id -g)" -v "$out:/out" \
    --entrypoint python3 "$image" - /out <"$here/make_tiny_model.py"
