#!/bin/bash
# Throughput and latency of `sala serve` under concurrent streaming clients, with batching
# (--parallel CLIENTS) against one request at a time (--parallel 1) in the same run.
# usage: eval/serve-load.sh SALA_BINARY MODEL PYTHON_WITH_OPENAI [CLIENTS [SECONDS [MAX_TOKENS [EXTRA SERVE ARGS...]]]]
# e.g.   eval/serve-load.sh target/release/sala SmolLM2-135M-Instruct.Q4_1.gguf venv/bin/python 16 60 32
set -eu
sala=$1 model=$2 python=$3 clients=${4:-16} seconds=${5:-60} max_tokens=${6:-32}
shift $(( $# < 6 ? $# : 6 ))
here=$(cd "$(dirname "$0")/.." && pwd)
for parallel in "$clients" 1; do
  port=$(( 20000 + RANDOM % 20000 ))
  "$sala" serve --model "$model" --port "$port" --parallel "$parallel" "$@" 2>/dev/null &
  server=$!
  trap 'kill $server 2>/dev/null' EXIT
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 0.5
  done
  echo -n "--parallel $parallel: "
  "$python" "$here/tests/reference/openai_load.py" "http://127.0.0.1:$port" none "$clients" "$seconds" "$max_tokens" --load-only
  kill $server; wait $server 2>/dev/null || true
done
