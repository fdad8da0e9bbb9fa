#!/bin/bash
# Issue 59 on one lent H200: `sala serve` against llama.cpp's `llama-server`, both driven over HTTP
# by guidellm (vLLM's load generator, unchanged; 0.3.1, the last release that needs no PyTorch,
# which keeps its CPU test in CI light). Random weights with the released shapes, the MiniCPM4
# tokenizer in both servers (eval/serving/gguf_with_tokenizer.py writes it into the GGUF), fixed
# output lengths (guidellm sends ignore_eos), `--parallel` matched.
#
# STEPS, in the order given (default "build sala-9b"); workloads stop 20 s before BUDGET_S:
#   build      llama-server for sm_90 from llamacpp-bench's source (~9 min on 16 cores, niced, in the
#              background while gputests and coldstart run: BUILD_BG=1; a sala workload step waits for
#              it, so that nothing is measured beside a compiler), or unpacked from a build an earlier
#              lease sent back (LLAMA_KIT, below), and the Q8_0
#              GGUF of Qwen3-8B's shape with the MiniCPM4 tokenizer
#   llama      the workloads on llama-server, Qwen3-8B Q8_0 (waits for the build)
#   sala-qwen  the workloads on sala serve, synthetic qwen3-8b at 8 bits
#   sala-9b    the workloads on sala serve, synthetic minicpm-sala-9b at 8 bits, and prefix128k
#   coldstart  sala serve on qwen3-8b twice, MLX's disk cache and the kernels' check memo emptied
#              before the first: each start's time to ready, its first request (1K in, 64 out)
#              and then 16 at once
#   gputests   GPU_TESTS (default: the kernels compiled ahead (the checks' and the decode attention's),
#              the disk cache, prefill attention past MLX's plan cache and padded to repeating shapes) of
#              tests/gpu_kernels.rs, the test binary carried as .device/bin/gpu_kernels
#   attention  `kernels prefill-attention` (benches/kernels.rs, carried as .device/bin/kernels): a prompt
#              chunk's attention at a new shape, again, and padded to repeating shapes, into $OUT
# WORKLOADS (default "random prompt4k prefix32k mixed"; sala-9b adds prefix128k): as
#   eval/serving/workloads.sh describes them (1K in / 256 out at 1, 4, 16, 64; 4K in at 16; 16
#   questions over a 32K-token shared prefix; 64 streams while 32K-token prompts arrive every 5 s).
#
# Prepare in the checkout the device call sends (every path here is git-ignored):
#   SALA_OPENBLAS=off cargo build --release
#   rm -rf .device/bin && mkdir -p .device/bin && cp target/release/sala .device/bin/ && strip .device/bin/sala \
#     && tar cJf .device/bin.tar.xz -C .device bin && rm -r .device/bin
#   ../shared/tools/mlx-cuda-bundle                                          # -> .device/mlx-cuda
#   mkdir -p .device/tokenizer && cp ../shared/assets/minicpm4-tokenizer/{tokenizer.json,tokenizer.model,\
#     tokenizer_config.json,special_tokens_map.json,added_tokens.json,generation_config.json} .device/tokenizer/
#   ../shared/tools/llamacpp-bench/prepare .llamacpp-bench                  # llama.cpp's source, ~9 MiB
#   Or build it on the development machine (no GPU needed; ~35 min on 2 cores, niced) with
#   `bash eval/serving/build-llama-server.sh .llamacpp-bin`: the build step then only unpacks it.
#   A build made here comes back in $OUT as llama-server-sm90.tar.xz.part-NN (15 MiB parts, with
#   llama.cpp's gguf-py); put them in $LLAMA_KIT (default .llamacpp-bin) and carry that instead of
#   the source tarball (move it out of .llamacpp-bench): later leases skip the build.
#   bash eval/serving/wheels.sh                                             # -> .whl: guidellm and what the image lacks
#   A lease's compiled kernels come back as kernel-cache.tar.xz.part-NN (~1.2 MB); put them in
#   .device/kernel-cache and carry it too: a fresh machine then starts sala in seconds, not ~3 min.
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda", ".device/tokenizer", ".llamacpp-bench", ".whl"];
#   STEPS="build sala-9b" bash eval/device-serving.sh; then STEPS="llama sala-qwen" on the same warm machine.
#   A later call on the warm machine keeps .device/ and .llamacpp-bench (git-ignored) but not .whl:
#   carry .whl each call. .llamacpp-bin with the sala kit is over the 64 MiB a call carries, so
#   carry it in a later call (with .whl).
# Back in $OUT: summary.md (eval/serving/summary.py over every result so far on this machine),
# phases.txt, device.txt, and serving-STEPS.tar.xz (guidellm's JSON files and the servers' logs).
set -u
STARTED=$(date +%s)
OUT=${OUT:-/tmp/device-serving-out}
STEPS=${STEPS:-"build sala-9b"}
WORKLOADS=${WORKLOADS:-"random prompt4k prefix32k mixed"}
BUDGET_S=${BUDGET_S:-570}
PARALLEL=${PARALLEL:-80}          # both servers: the most requests decoded at once
LLAMA_CTX=${LLAMA_CTX:-262144}    # llama-server's one KV cache, shared by its slots (-kvu)
BITS=${BITS:-8}
BUILD_BG=${BUILD_BG:-1}
LLAMA_KIT=${LLAMA_KIT:-.llamacpp-bin}  # an earlier lease's llama-server build, in parts
SALA=${SALA:-sala}                # the binary in .device/bin the sala steps serve with, and their rows' server name
SALA_ARGS=${SALA_ARGS:-}          # more flags for sala serve (e.g. "--cache-memory 0")
KEEP=/tmp/device-serving          # kept on a warm machine: build, models, results
RESULTS=$KEEP/results
LOGS=$KEEP/logs
SRC=$KEEP/llama.cpp
BUILD=$KEEP/build
GGUF=$KEEP/qwen3-8b-q8_0-minicpm4-tokenizer.gguf
mkdir -p "$OUT" "$RESULTS" "$LOGS"

prebuilt() { ls "$LLAMA_KIT"/llama-server-sm90.tar.xz.part-* > /dev/null 2>&1; }
LLAMA_SOURCE=.llamacpp-bench/llama.cpp-src.tar.xz
prebuilt && LLAMA_SOURCE=""
# The llama.cpp kit only where a step builds llama-server or its GGUF.
LLAMA_NEEDS=""
case " $STEPS " in *" build "*) LLAMA_NEEDS=".llamacpp-bench/make_gguf.py $LLAMA_SOURCE" ;; esac
for f in .device/bin.tar.xz .device/mlx-cuda/activate.sh .device/tokenizer/tokenizer.model $LLAMA_NEEDS; do
  [ -e "$f" ] || { echo "device-serving: no $f: prepare it as this script's header says, and carry it" >&2; exit 1; }
done
ls .whl/guidellm-*.whl > /dev/null 2>&1 || { echo "device-serving: no .whl/guidellm-*.whl: run eval/serving/wheels.sh here and carry .whl" >&2; exit 1; }
source eval/device-setup.sh
export XDG_CACHE_HOME=$KEEP/cache HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$KEEP/site" .whl/*.whl \
  || { echo "device-serving: the wheels did not install" >&2; exit 1; }
export PYTHONPATH=$KEEP/site
TOKENIZER=$PWD/.device/tokenizer

# Kernels an earlier lease compiled (a fresh machine spends ~3 min compiling them): MLX's disk cache
# and the self-checks' memo, as this script sends them back, carried in .device/kernel-cache.
MLX_DISK_CACHE=${TMPDIR:-/tmp}/mlx
KERNEL_KIT=.device/kernel-cache
if ls "$KERNEL_KIT"/kernel-cache.tar.xz.part-* > /dev/null 2>&1 && [ ! -d "$MLX_DISK_CACHE" ]; then
  mkdir -p "$KEEP/kernel-cache" "$XDG_CACHE_HOME" && cat "$KERNEL_KIT"/kernel-cache.tar.xz.part-* | tar xJ -C "$KEEP/kernel-cache" \
    && cp -r "$KEEP/kernel-cache/mlx" "$MLX_DISK_CACHE" && cp -r "$KEEP/kernel-cache/cache/." "$XDG_CACHE_HOME/" \
    && phase "kernels from $KERNEL_KIT"
fi
pack() {
  python3 eval/serving/summary.py "$RESULTS" --markdown "$OUT/summary.md" > /dev/null 2> "$OUT/summary-errors.txt"
  cat "$OUT/summary.md" "$OUT/summary-errors.txt" 2> /dev/null
  tar cJf "$OUT/serving-$(echo $STEPS | tr ' ' '-').tar.xz" -C "$KEEP" results logs 2> /dev/null
  # Sent back for later leases (put the parts in .device/kernel-cache), unless they came from there.
  if [ -d "$MLX_DISK_CACHE" ] && ! ls "$KERNEL_KIT"/kernel-cache.tar.xz.part-* > /dev/null 2>&1; then
    tar cJf - -C "$(dirname "$MLX_DISK_CACHE")" mlx -C "$KEEP" cache 2> /dev/null | split -b 15M -d - "$OUT/kernel-cache.tar.xz.part-"
  fi
}
SERVER_PID=""
stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  kill -INT "$SERVER_PID" 2> /dev/null
  for _ in $(seq 100); do kill -0 "$SERVER_PID" 2> /dev/null || break; sleep 0.2; done
  kill -9 "$SERVER_PID" 2> /dev/null
  SERVER_PID=""
}
trap 'stop_server; pack' EXIT

# ---- llama-server: build (in the background, niced, while a step that measures nothing runs) and the GGUF ----
BUILD_PID=""
build() {
  if [ -x "$BUILD/bin/llama-server" ] && [ -s "$GGUF" ]; then phase "build: present"; return 0; fi
  if [ ! -x "$BUILD/bin/llama-server" ] && prebuilt; then
    cat "$LLAMA_KIT"/llama-server-sm90.tar.xz.part-* | tar xJ -C "$KEEP" && phase "build: llama-server from $LLAMA_KIT"
  fi
  phase "build: start"
  (
    set -e
    [ -x "$BUILD/bin/llama-server" ] || [ -f "$SRC/CMakeLists.txt" ] || { tar xJf "$LLAMA_SOURCE" -C "$KEEP"; rm -f "$SRC/.git"; }
    [ -s "$GGUF" ] || python3 eval/serving/gguf_with_tokenizer.py "$GGUF.partial" --type q8_0 --tokenizer "$TOKENIZER" \
      --kit .llamacpp-bench --gguf-py "$SRC/gguf-py" > "$LOGS/make-gguf.log" 2>&1
    [ -s "$GGUF" ] || mv "$GGUF.partial" "$GGUF"
    if [ ! -x "$BUILD/bin/llama-server" ]; then
      # The web UI is not built (no network, no npm): the server embeds an empty asset table. The
      # CPU code is AVX2, not native: a native build here, on a CPU whose flags list AMX, died of an
      # illegal instruction (the GPU does the model's work either way).
      [ -f "$BUILD/CMakeCache.txt" ] || cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
        -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
        -DGGML_CCACHE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=ON -DGGML_CUDA_NCCL=OFF \
        -DGGML_CUDA_COMPRESSION_MODE=none > "$LOGS/llama-configure.log" 2>&1
      nice -n 19 cmake --build "$BUILD" --target llama-server -j "$(($(nproc) - 3))" > "$LOGS/llama-build.log" 2>&1
      # Sent back for later leases (files from $OUT: 16 MiB each at most).
      tar cJf - -C "$KEEP" build/bin llama.cpp/gguf-py | split -b 15M -d - "$OUT/llama-server-sm90.tar.xz.part-"
    fi
  ) &
  BUILD_PID=$!
  if [ "$BUILD_BG" != 1 ]; then wait_build; fi
}
wait_build() {
  [ -n "$BUILD_PID" ] || return 0
  wait "$BUILD_PID"; local rc=$?
  BUILD_PID=""
  phase "build: end rc=$rc"
  [ "$rc" = 0 ] || { tail -30 "$LOGS/llama-build.log" "$LOGS/llama-configure.log" "$LOGS/make-gguf.log" 2> /dev/null; return 1; }
}

# ---- servers ----
PORT=8400
up() {  # up NAME: waits for /health to answer 200 (a model loads in ~10-60 s)
  for _ in $(seq 600); do
    kill -0 "$SERVER_PID" 2> /dev/null || { echo "device-serving: $1 exited"; tail -20 "$LOGS/$1.log"; return 1; }
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")" = 200 ] && { phase "$1 up"; return 0; }
    sleep 0.5
  done
  return 1
}
start_llama() {
  # A build made elsewhere (eval/serving/build-llama-server.sh) finds CUDA's libraries by its
  # RUNPATH's usual places; where none holds them, by the image's own copy.
  local libs=""
  if ldd "$BUILD/bin/llama-server" | grep -q "libcu.*not found"; then
    libs=$(dirname "$(find /usr/local /opt /usr/lib -name 'libcublas.so.13' 2> /dev/null | head -1)")
    phase "llama-server: CUDA's libraries from $libs"
  fi
  LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$BUILD/bin/llama-server" -m "$GGUF" -ngl 99 -fa on -np "$PARALLEL" -kvu -c "$LLAMA_CTX" --no-webui \
    --host 127.0.0.1 --port "$PORT" > "$LOGS/llama-qwen3-8b.log" 2>&1 &
  SERVER_PID=$!
  up llama-qwen3-8b
}
start_sala() {  # start_sala PRESET: a synthetic model's folder (synthetic.json beside the tokenizer)
  local dir=$KEEP/models/$1-q$BITS
  bash eval/synthetic-folder.sh "$1" "$BITS" "$TOKENIZER" "$dir" || return 1
  # At debug level the log has a line per scheduler round (its decode rows, prompt chunks, time and
  # where the host's part of it went).
  # shellcheck disable=SC2086  # SALA_ARGS is a list of flags
  "$BIN/$SALA" serve -m "$dir" --parallel "$PARALLEL" --port "$PORT" --log-level debug $SALA_ARGS > "$LOGS/$SALA-$1.log" 2>&1 &
  SERVER_PID=$!
  up "$SALA-$1"
}

# ---- workloads: eval/serving/workloads.sh, stopped at the budget ----
workloads() {  # workloads SERVER MODEL [EXTRA_WORKLOAD]
  phase "workloads $1 $2"
  TOKENIZER=$TOKENIZER LOGS=$LOGS DEADLINE=$((STARTED + BUDGET_S - 20)) \
    bash eval/serving/workloads.sh "http://127.0.0.1:$PORT" "$1" "$2" "$RESULTS" $WORKLOADS ${3:-} | tee -a "$OUT/phases.txt"
}

# ---- cold and warm starts: the kernels compiled in the first, read from MLX's disk cache in the second ----
completion() {  # completion N: N requests at once of ~1K tokens in, 64 out
  local body model
  model=$(curl -s "http://127.0.0.1:$PORT/v1/models" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
  body=$(python3 -c 'import json, sys; print(json.dumps({"model": sys.argv[1], "prompt": "the quick brown fox " * 256, "max_tokens": 64, "ignore_eos": True}))' "$model")
  seq "$1" | xargs -P "$1" -I{} curl -s -o /dev/null -w '%{http_code}\n' "http://127.0.0.1:$PORT/v1/completions" \
    -H 'Content-Type: application/json' -d "$body" | sort | uniq -c | tr '\n' ' '
}
coldstart() {
  # MLX's disk cache of compiled kernels and the memo of passed self-checks, as on a fresh machine
  rm -rf "${TMPDIR:-/tmp}/mlx" "$XDG_CACHE_HOME/sala/kernel-checks"
  local run t0 t1 t2 t3 codes1 codes16
  for run in cold warm; do
    t0=$(date +%s.%N)
    start_sala qwen3-8b || return 1
    t1=$(date +%s.%N); codes1=$(completion 1)
    t2=$(date +%s.%N); codes16=$(completion 16)
    t3=$(date +%s.%N)
    phase "coldstart $run: ready $(awk "BEGIN{print $t1 - $t0}") s; first request $(awk "BEGIN{print $t2 - $t1}") s ($codes1); 16 at once $(awk "BEGIN{print $t3 - $t2}") s ($codes16)"
    grep -E "compiled [0-9]+ GPU kernels" "$LOGS/$SALA-qwen3-8b.log" | tee -a "$OUT/phases.txt"
    grep "kernel variants met" "$LOGS/$SALA-qwen3-8b.log" | cut -c1-200 | tee -a "$OUT/phases.txt"
    cp "$LOGS/$SALA-qwen3-8b.log" "$LOGS/$SALA-qwen3-8b-coldstart-$run.log"
    stop_server
  done
}
gputests() {
  local t
  for t in ${GPU_TESTS:-compiling_ahead_reaches_every_kernel_variant_the_checks_launch decode_variants_launched_ahead_are_all_a_server_meets a_kernel_variant_is_compiled_once_into_mlx_disk_cache prefill_attention_at_more_shapes_than_mlx_plans_keeps_answering prompt_attention_padded_through_cudnn_matches_masked_softmax}; do
    timeout 120 "$BIN/gpu_kernels" --include-ignored --exact "$t" > "$LOGS/gputest-$t.log" 2>&1
    phase "gputest $t rc=$? $(grep -E '^test result' "$LOGS/gputest-$t.log")"
  done
}

for step in $STEPS; do
  case $step in
    coldstart) coldstart ;;
    gputests) gputests ;;
    attention) timeout 240 "$BIN/kernels" prefill-attention > "$OUT/prefill-attention.md" 2>&1; phase "kernels prefill-attention rc=$?" ;;
    build) build ;;
    llama) wait_build && start_llama && workloads llama qwen3-8b; stop_server ;;
    sala-qwen) wait_build; start_sala qwen3-8b && workloads "$SALA" qwen3-8b; stop_server ;;
    sala-9b) wait_build; start_sala minicpm-sala-9b && workloads "$SALA" minicpm-sala-9b prefix128k; stop_server ;;
    *) echo "device-serving: unknown step $step" >&2 ;;
  esac
done
wait_build
