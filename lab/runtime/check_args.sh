#!/usr/bin/env bash
# Parse a `vllm serve` command line with the image's own vLLM parser, in a throwaway container.
# Usage: lab/runtime/check_args.sh IMAGE MODEL [ARGS...]   (exit non-zero with vLLM's message)
# The serve role runs the same script (roles/serve/files/vllm_check_args.py) before any change.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
image=${1:?usage: check_args.sh IMAGE MODEL [ARGS...]}
shift
exec docker run --rm -i --network none --entrypoint python3 "$image" - "$@" \
    <"$here/../../roles/serve/files/vllm_check_args.py"
