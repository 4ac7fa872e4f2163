#!/usr/bin/env bash
# Serve the tiny model with the lab runtime image and measure: time to /health, /v1/completions,
# /v1/models, the KV figures in /metrics, RSS, and how fast SIGTERM ends the server.
# Usage: lab/runtime/smoke.sh [IMAGE] [MODEL_DIR]   (prints one JSON line; exit 1 on a failure)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
image=${1:-$("$here/tag.sh")}
model=${2:-${SPARKOPS_CACHE:-/var/cache/sparkops}/models/tiny-llama}
[ -e "$model/model.safetensors" ] || "$here/make_model.sh" "$model" "$image" >/dev/null
name=sparkops-runtime-smoke-$$
port=${SMOKE_PORT:-18$(( $$ % 1000 + 100 ))}
trap 'docker rm -f "$name" >/dev/null 2>&1 || true' EXIT
t0=$(date +%s.%N)
docker run -d --name "$name" -p "127.0.0.1:$port:8000" -v "$model:/model:ro" \
    -e VLLM_ENABLE_V1_MULTIPROCESSING=0 "$image" /model --served-model-name tiny \
    --enforce-eager --distributed-executor-backend uni --kv-cache-memory-bytes 64M \
    --max-model-len 1024 >/dev/null
healthy=""
for _ in $(seq 1 600); do
    if curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1; then healthy=$(date +%s.%N); break; fi
    if [ "$(docker inspect -f '{{.State.Running}}' "$name")" != true ]; then break; fi
    sleep 0.5
done
if [ -z "$healthy" ]; then docker logs "$name" 2>&1 | tail -n 40; echo "not healthy" >&2; exit 1; fi
completion=$(curl -fsS "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"tiny","prompt":"The spark","max_tokens":8}')
models=$(curl -fsS "http://127.0.0.1:$port/v1/models")
metrics=$(curl -fsS "http://127.0.0.1:$port/metrics")
rss=$(docker stats --no-stream --format '{{.MemUsage}}' "$name" | cut -d/ -f1 | xargs)
t1=$(date +%s.%N)
docker kill -s TERM "$name" >/dev/null
code=$(docker wait "$name")
t2=$(date +%s.%N)
python3 - "$t0" "$healthy" "$t1" "$t2" "$code" "$rss" "$completion" "$models" "$metrics" <<'PY'
import json, sys
t0, th, t1, t2 = map(float, sys.argv[1:5])
comp, models, metrics = json.loads(sys.argv[7]), json.loads(sys.argv[8]), sys.argv[9]
info = [l for l in metrics.splitlines() if l.startswith("vllm:cache_config_info")]
out = {"time_to_healthy_s": round(th - t0, 1), "sigterm_exit_s": round(t2 - t1, 2),
       "exit_code": int(sys.argv[5]), "rss": sys.argv[6],
       "completion_tokens": comp["usage"]["completion_tokens"],
       "models": [m["id"] for m in models["data"]], "cache_config_info": info[:1]}
print(json.dumps(out))
ok = out["completion_tokens"] > 0 and out["models"] == ["tiny"] and info and out["exit_code"] == 0
sys.exit(0 if ok else 1)
PY
