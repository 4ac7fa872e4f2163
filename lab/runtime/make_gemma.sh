#!/usr/bin/env bash
# Make the lab's tiny Gemma with per-layer embeddings (make_tiny_gemma.py) in OUT_DIR, offline,
# inside the lab runtime image (its torch and transformers initialise the model), with the tiny
# Llama's tokenizer (made first by make_model.sh when missing).
# Usage: lab/runtime/make_gemma.sh OUT_DIR [IMAGE] [gemma4|gemma3n]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: make_gemma.sh OUT_DIR [IMAGE] [gemma4|gemma3n]}
image=${2:-$("$here/tag.sh")}
kind=${3:-gemma4}
tok=${SPARKOPS_CACHE:-/var/cache/sparkops}/models/tiny-llama
[ -e "$tok/tokenizer.json" ] || "$here/make_model.sh" "$tok" "$image" >/dev/null
mkdir -p "$out"
out=$(cd "$out" && pwd)
exec docker run --rm -i --network none --user "$(id -u):$(id -g)" -e HOME=/tmp -v "$out:/out" \
    -v "$tok:/tok:ro" --entrypoint python3 "$image" - /out /tok "$kind" <"$here/make_tiny_gemma.py"
