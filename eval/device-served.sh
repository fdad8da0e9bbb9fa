#!/bin/bash
# Issue 57's table in one call on one lent H200: what `sala bench` says against what `sala serve`
# users get, for synthetic MiniCPM-SALA-9B and Qwen3-8B at 8 bits (random weights, the released
# shapes; the MiniCPM4 tokenizer for both), one stream and 16, free and under a JSON grammar.
#   speed    sala bench (speed suite): pipelined tg at 1 and 16 sequences, greedy `sala run`'s
#            path, and the sampled / served-style rows (temperature 0.8, top-p 0.95)
#   serve    sala serve -m FOLDER --parallel 16 (FOLDER: synthetic.json + tokenizer), measured by
#            tests/reference/openai_rate.py through the openai client: one stream and 16,
#            free and under response_format json_schema, decode tok/s from first token to last
#   grammar  sala bench --suite grammar: tokens drawn as the server draws them, free and under
#            the bench's JSON grammar, at 1 and 16 sequences
# Steps run in this order, both models each (the goals' rows first); a step that would start
# past BUDGET_S is skipped, a running one is stopped at it (SIGINT), so the call ends with its
# files. Each step builds its model once (~15-60 s for 9B at 8 bits); the whole call is planned at
# about 7 minutes on an H200 (six builds, ~30 s of decoding per bench step, ~40 s per serve step).
#
# Prepare in the checkout the device call sends (/work/main; every path here is git-ignored):
#   SALA_OPENBLAS=off cargo build --release
#   rm -rf .device/bin && mkdir -p .device/bin && cp target/release/sala .device/bin/ && strip .device/bin/sala \
#     && tar cJf .device/bin.tar.xz -C .device bin && rm -r .device/bin
#   ../shared/tools/mlx-cuda-bundle                                   # -> .device/mlx-cuda (~19 MiB)
#   mkdir -p .device/tokenizer && cp ../shared/assets/minicpm4-tokenizer/{tokenizer.json,tokenizer_config.json,\
#     special_tokens_map.json,added_tokens.json,generation_config.json} .device/tokenizer/   # ~3.5 MiB
#   .whl: the openai client (tests' pin) and the packages the image lacks (~4 MiB; its httpx, anyio,
#   tqdm serve; typing-extensions is carried because pydantic needs >= 4.16); /.whl/ in .git/info/exclude:
#     for s in openai==1.109.1 pydantic==2.14.4 pydantic-core==2.50.5 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1 \
#       annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0; do python3 -m pip download \
#       --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_17_x86_64 -d .whl $s; done
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda", ".device/tokenizer", ".whl"];
#   bash eval/device-served.sh            (STEPS="speed serve" or MODELS=minicpm-sala-9b for less)
# Back in $OUT: bench.csv/.md (both bench suites), served.csv/.md (the client's rows),
# phases.txt (step times), device.txt, logs.tar.xz (each step's stderr and the servers' logs).
set -u

# ---- What is measured: the flags in one place (each may be overridden from the environment, e.g.
# SPEED="-p 0 -n 128 --n-seq 1,16 -r 3"). SPEED assumes the speed suite adds its sampled/served rows
# (`tg256 served`, `tg256 served x16`) by itself; if they need a flag, it goes on that line ----
MODELS=${MODELS:-"minicpm-sala-9b qwen3-8b"}     # presets, as eval/synthetic/*.json
BITS=${BITS:-8}
STEPS=${STEPS:-"speed serve grammar"}
read -ra SPEED_ARGS <<< "${SPEED:-"-p 0 -n 256 --n-seq 1,16 -r 2 --draft-layers 0"}"
read -ra GRAMMAR_ARGS <<< "${GRAMMAR:-"--suite grammar -p 0 -n 256 --n-seq 1,16 -r 2 --tokenizer .device/tokenizer"}"
read -ra SERVE_ARGS <<< "${SERVE:-"--parallel 16"}"
read -ra RATE_ARGS <<< "${RATE:-"--streams 1,16 --rounds 4,2 --max-tokens 256 --temperature 0.8 --top-p 0.95 --formats free,json"}"
BUDGET_S=${BUDGET_S:-530}                         # the command's limit is 600 s
# ---------------------------------------------------------------------------------------------------

for f in .device/bin.tar.xz .device/mlx-cuda/activate.sh .device/tokenizer/tokenizer.json; do
  [ -e "$f" ] || { echo "device-served: no $f: prepare it as this script's header says, and carry it" >&2; exit 1; }
done
OUT=${OUT:-/tmp/device-served-out}
mkdir -p "$OUT"
source eval/device-setup.sh
# The self-check memo stays on the machine: files under $OUT count against the 8 that come back.
export XDG_CACHE_HOME=/tmp/sala-cache HF_HUB_OFFLINE=1
LOGS=/tmp/device-served-logs
MODELS_DIR=/tmp/device-served-models
mkdir -p "$LOGS" "$MODELS_DIR"
left() { echo $((BUDGET_S - SECONDS)); }
trap 'phase "end"; tar cJf "$OUT/logs.tar.xz" -C "$LOGS" . 2>/dev/null' EXIT
$BIN/sala --version | tee -a "$OUT/device.txt"

# The openai client's missing packages, from the carried wheels.
CLIENT=1
if ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl 2> "$LOGS/pip.log"; then
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -c "import openai, pydantic" 2>> "$LOGS/pip.log" || { CLIENT=0; echo "device-served: the openai client does not import (carry .whl): serve steps skipped" | tee -a "$OUT/phases.txt"; }
phase "setup done"

# Whether URL answers 2xx (/health: 503 until the model is built).
healthy() {
  python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" "$1" 2> /dev/null
}

# A synthetic model's folder, as `sala serve -m` loads it: synthetic.json beside the tokenizer.
folder() {
  local dir=$MODELS_DIR/$1-q$BITS
  mkdir -p "$dir"
  cp .device/tokenizer/* "$dir/"
  printf '{"preset": "%s", "bits": %s}\n' "$1" "$BITS" > "$dir/synthetic.json"
  echo "$dir"
}

# bench NAME MODEL ARGS...: one sala bench process; rows appended to bench.csv, its table to bench.md.
bench() {
  local name=$1 model=$2; shift 2
  [ "$(left)" -ge 60 ] || { phase "SKIP $name $model: $(left) s left"; return 1; }
  phase "start $name $model"
  echo "## $name $model" >> "$OUT/bench.md"
  timeout --signal=INT --kill-after=10 "$(left)" $BIN/sala bench --synthetic "$model" --bits "$BITS" "$@" -o csv --output-file "$OUT/bench.csv" 2> "$LOGS/$name-$model.log" | tee -a "$OUT/bench.md"
  local rc=${PIPESTATUS[0]}
  phase "end $name $model rc=$rc"
  [ "$rc" = 0 ] || tail -5 "$LOGS/$name-$model.log"
}

# serve MODEL: a server on the model's folder, measured by the openai client, then stopped.
serve() {
  local model=$1 dir port server rc
  [ "$CLIENT" = 1 ] || return 1
  [ "$(left)" -ge 90 ] || { phase "SKIP serve $model: $(left) s left"; return 1; }
  dir=$(folder "$model")
  port=$((20000 + RANDOM % 20000))
  phase "start serve $model (port $port)"
  $BIN/sala serve -m "$dir" --port "$port" "${SERVE_ARGS[@]}" > "$LOGS/serve-$model.log" 2>&1 &
  server=$!
  until healthy "http://127.0.0.1:$port/health"; do
    if ! kill -0 "$server" 2>/dev/null || [ "$(left)" -lt 30 ]; then
      phase "serve $model: not ready (server $(kill -0 "$server" 2>/dev/null && echo running || echo exited))"
      tail -5 "$LOGS/serve-$model.log"
      kill -9 "$server" 2>/dev/null
      return 1
    fi
    sleep 1
  done
  phase "ready serve $model"
  echo "## served $model" >> "$OUT/served.md"
  timeout --signal=INT --kill-after=10 "$(left)" python3 tests/reference/openai_rate.py "http://127.0.0.1:$port" \
    --label "$model-q$BITS" --csv "$OUT/served.csv" "${RATE_ARGS[@]}" 2> "$LOGS/rate-$model.log" | tee -a "$OUT/served.md"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || tail -5 "$LOGS/rate-$model.log"
  kill -INT "$server" 2>/dev/null
  for _ in $(seq 15); do kill -0 "$server" 2>/dev/null || break; sleep 1; done
  kill -9 "$server" 2>/dev/null
  wait "$server" 2>/dev/null
  rm -rf "$dir"
  phase "end serve $model rc=$rc"
}

for step in $STEPS; do
  for model in $MODELS; do
    case $step in
      speed) bench speed "$model" "${SPEED_ARGS[@]}" ;;
      grammar) bench grammar "$model" "${GRAMMAR_ARGS[@]}" ;;
      serve) serve "$model" ;;
      *) echo "device-served: unknown step '$step' (speed, serve, grammar)" >&2; exit 1 ;;
    esac
  done
done

echo; echo "=== bench"; cat "$OUT/bench.md" 2>/dev/null
echo; echo "=== served"; cat "$OUT/served.md" 2>/dev/null
echo; cat "$OUT/phases.txt"
