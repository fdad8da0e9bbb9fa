#!/bin/bash
# Issue 34's table on one lent NVIDIA GPU (H100): llama.cpp (llama-bench), sala and mlx-lm on the same
# machine, as consecutive device calls on one warm machine (a call may run 10 minutes). Same tests for
# all: pp4096, pp32768 (prefill in 2048-token batches) and tg64 @ d4096, d32768, d131072 (64 tokens
# decoded after that many in the cache), on random weights with the released shapes (speed does not
# depend on the values). Modes, several per call run in order (`bash eval/device-compare.sh sala mlxlm`):
#   llama  llama.cpp's llama-bench on a Qwen3-8B-shaped Q8_0 GGUF, f16 KV, -fa 1 -r 3
#          (../shared/tools/llamacpp-bench) -> $OUT/llamacpp/results.{json,csv,md}. While it builds
#          (GPU idle), `sala doctor` runs every kernel's self-check once: later sala processes on this
#          machine find them in the memo (DOCTOR=0 skips; it is stopped when llama-bench is linked).
#   sala   sala bench --synthetic qwen3-8b and minicpm-sala-9b, --bits 8, the tests above with -r 3, and
#          minicpm-sala-9b --bits 4 tg64 @ d4096 -> $OUT/sala.csv (peak_mem: MLX's own peak, bytes).
#          The decode tests also run as real greedy generation (`tg64 greedy`, every token read back as
#          `sala run` does; --draft-layers 0), which the table leaves out.
#          Qwen3-8B runs from a copy of its preset with max_position_embeddings 131072 + 64, so that
#          tg64 @ d131072 fits (llama.cpp only warns past the GGUF's context length; YaRN does not
#          read it). One process per model and test kind, so a failure loses only its own rows.
#   mlxlm  eval/mlx_lm_baseline.py: mlx-lm on Qwen3-8B shapes, 8 bits, one timed run per context of
#          MLX_CONTEXTS (4096,32768,131072) -> $OUT/mlx_lm.csv
#   table  eval/compare_table.py over every result of this machine's calls (kept in
#          /tmp/device-compare/results) -> $OUT/compare.md. It runs here on the CPU machine too.
# Every mode: $OUT/device-MODE.txt (GPU name, uuid, driver: the table checks that all are one GPU),
# nvidia-smi memory every 500 ms ($OUT/gpu-memory-MODE.csv) and start/end times ($OUT/phases-MODE.txt).
# Estimated wall time on an H100 (llamacpp-bench README, eval/results/2026-11-26-h200x2-tp phases,
# eval/results/*/mlx_lm.csv, the issue's table):
#   llama  ~6 min on a fresh machine: untar+configure ~0.5 min, llama-bench build ~3 min (16 cores), model
#          loads ~0.3 min, pp4096+pp32768 ~0.3 min, tg64 @ d4096,d32768 ~0.4 min (each depth is prefilled once
#          and its state restored per run), tg64 @ d131072 ~1–1.5 min (128K prefill + 18 GiB state copies).
#          ~2.5 min again on a warm machine (build and GGUF in /tmp/lcpp-run are reused).
#   sala   ~7.5 min on an H100 (448 s on a fresh machine, 2026-11-27): five processes, each ~12 s to
#          build its synthetic model; the two decode processes (4 prefills of 131072 tokens each) most.
#   mlxlm  ~1.5 min: model build ~0.3 min, two runs per context (131072: 2 x ~22 s).
#   So: call 1 `llama`, call 2 `sala`, call 3 `mlxlm table`. BUDGET_S (570) bounds a call: a step
#   that would start past it is skipped, a running one is stopped (SIGINT) at it, so the call ends cleanly.
# Prepare here (repo root; the paths are git-ignored):
#   SALA_OPENBLAS=off cargo build --release
#   mkdir -p .device/bin && cp target/release/sala .device/bin/ && strip .device/bin/sala && tar cJf .device/bin.tar.xz -C .device bin
#   ../shared/tools/mlx-cuda-bundle .device/mlx-cuda-py --with-python    # MLX runtime + mlx, mlx-lm wheels, ~20 MiB
#   ../shared/tools/llamacpp-bench/prepare .llamacpp-bench                # kit + llama.cpp source, ~9 MiB
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda-py", ".llamacpp-bench"] (~35 MiB);
#   bash eval/device-compare.sh llama;  bash eval/device-compare.sh sala;  bash eval/device-compare.sh mlxlm table
#   Each call hands back $OUT/device-compare-MODES.tar.xz (the `$OUT/...` files above, inside it).
#   `table` sees earlier calls' files only on the same warm machine; else, here, over the calls'
#   archives unpacked into one folder: python3 eval/compare_table.py DIR
set -u
# The lending tool brings back at most 8 files from $OUT: a call writes its files in a folder of
# its own and hands them back as one archive, device-compare-MODES.tar.xz (compare.md beside it).
DEST=${OUT:-/tmp/device-compare-out}
BUDGET_S=${BUDGET_S:-570}
BIN=.device/bin
MLX_BUNDLE=${MLX_BUNDLE:-.device/mlx-cuda-py}
KIT=${KIT:-.llamacpp-bench}
LCPP_WORK=${LCPP_WORK:-/tmp/lcpp-run}
# Kept between the calls of one warm machine: the table's inputs, the self-check memo, the config copy.
KEEP=/tmp/device-compare
RESULTS=$KEEP/results
mkdir -p "$DEST" "$RESULTS" "$KEEP/cache"
OUT=$(mktemp -d "$KEEP/call.XXXXXX")
# One kernel self-check memo for every sala process on this machine.
export XDG_CACHE_HOME=$KEEP/cache
# No network there: the doctor's hub check does not try.
export HF_HUB_OFFLINE=1

die() { echo "device-compare: $*" >&2; exit 1; }
# The nvidia-smi sampler of the running mode stops with the script, however it ends.
SMI=""
pack() {
  { [ -z "$SMI" ] || kill "$SMI"; } 2>/dev/null
  local archive
  archive="$DEST/device-compare-$(IFS=-; echo "$*").tar.xz"
  tar cJf "$archive" -C "$OUT" . && echo "files: $archive"
  [ ! -f "$OUT/compare.md" ] || cp "$OUT/compare.md" "$DEST/"
}
trap 'pack "$@"' EXIT
phase() { echo "$(date +%s.%N) $*" >> "$OUT/phases-$MODE.txt"; }
left() { echo $((BUDGET_S - SECONDS)); }

# sala and its MLX runtime (unpacked into /tmp/mlx-cuda once per machine); says what is missing.
SALA_READY=0
sala_setup() {
  [ "$SALA_READY" = 1 ] && return 0
  if [ -f .device/bin.tar.xz ]; then
    tar xJf .device/bin.tar.xz -C .device || { echo "device-compare: .device/bin.tar.xz: cannot unpack" >&2; return 1; }
  fi
  [ -x $BIN/sala ] || { echo "device-compare: no $BIN/sala: carry .device/bin.tar.xz (see this script's header)" >&2; return 1; }
  [ -f "$MLX_BUNDLE/activate.sh" ] || {
    echo "device-compare: no $MLX_BUNDLE/activate.sh: make it with ../shared/tools/mlx-cuda-bundle $MLX_BUNDLE --with-python and carry it" >&2
    return 1
  }
  # shellcheck disable=SC1091
  source "$MLX_BUNDLE/activate.sh"
  $BIN/sala --version > "$OUT/sala-version.txt" 2>&1
  SALA_READY=1
}

# sala bench NAME ARGS...: one process, rows appended to $OUT/sala.csv when it ends.
sala_bench() {
  local name=$1; shift
  if [ "$(left)" -lt 30 ]; then
    echo "SKIP sala $name: only $(left) s of BUDGET_S=$BUDGET_S left" | tee -a "$OUT/skipped.txt"; return 1
  fi
  phase "start $name $*"
  timeout --signal=INT --kill-after=10 "$(left)" $BIN/sala bench "$@" -o csv --output-file "$OUT/sala.csv" \
    > "$OUT/sala-$name.md" 2> "$OUT/sala-$name.log"
  local rc=$?
  phase "end $name rc=$rc"
  cat "$OUT/sala-$name.md"
  [ "$rc" = 0 ] || { echo "sala $name: rc=$rc (124: stopped at BUDGET_S); last lines of sala-$name.log:"; tail -5 "$OUT/sala-$name.log"; }
  return "$rc"
}

mode_llama() {
  [ -f "$KIT/run.sh" ] || die "no $KIT/run.sh: run ../shared/tools/llamacpp-bench/prepare $KIT here and carry it"
  mkdir -p "$OUT/llamacpp"
  local doctor="" watcher=""
  if [ "${DOCTOR:-1}" = 1 ] && [ ! -x "$LCPP_WORK/build/bin/llama-bench" ]; then
    if sala_setup 2> "$OUT/doctor.txt"; then
      phase "start doctor (during the llama.cpp build)"
      $BIN/sala doctor >> "$OUT/doctor.txt" 2>&1 &
      doctor=$!
      # The doctor must not share the GPU with a benchmark: stopped once llama-bench is linked.
      ( while kill -0 "$doctor" 2>/dev/null; do
          if [ -x "$LCPP_WORK/build/bin/llama-bench" ]; then
            kill "$doctor" 2>/dev/null && echo "doctor stopped: llama-bench was built first" >> "$OUT/doctor.txt"
            break
          fi
          sleep 1
        done ) &
      watcher=$!
    else
      echo "no doctor (llama.cpp runs all the same): $(cat "$OUT/doctor.txt")"
    fi
  fi
  phase "start llama.cpp run.sh"
  OUT="$OUT/llamacpp" WORK="$LCPP_WORK" BUDGET_S=$(($(left) - 15)) bash "$KIT/run.sh"
  phase "end llama.cpp run.sh rc=$?"
  if [ -n "$doctor" ]; then
    wait "$doctor" 2>/dev/null
    wait "$watcher" 2>/dev/null
    phase "doctor done"
    grep -cE "^OK +kernel" "$OUT/doctor.txt" | sed 's/^/kernels verified by the doctor (memo for the sala mode): /'
  fi
}

mode_sala() {
  sala_setup || exit 1
  # The Qwen3-8B preset with room for 64 tokens after a 131072-token cache; named qwen3-8b as the preset.
  python3 -c "import json, sys; c = json.load(open('eval/synthetic/qwen3-8b.json')); c['max_position_embeddings'] = 131072 + 64; json.dump(c, open(sys.argv[1], 'w'), indent=1)" \
    "$KEEP/qwen3-8b.json" || die "cannot write $KEEP/qwen3-8b.json"
  cp "$KEEP/qwen3-8b.json" "$OUT/qwen3-8b-config.json"
  local qwen=$KEEP/qwen3-8b.json
  sala_bench qwen3-prefill --synthetic "$qwen" --bits 8 -p 4096,32768 -n 0 -r 3
  sala_bench qwen3-decode --synthetic "$qwen" --bits 8 -p 0 -n 64 -d 4096,32768,131072 -r 3 --draft-layers 0
  sala_bench sala-prefill --synthetic minicpm-sala-9b --bits 8 -p 4096,32768 -n 0 -r 3
  sala_bench sala-decode --synthetic minicpm-sala-9b --bits 8 -p 0 -n 64 -d 4096,32768,131072 -r 3 --draft-layers 0
  sala_bench sala-q4-decode --synthetic minicpm-sala-9b --bits 4 -p 0 -n 64 -d 4096 -r 3
}

mode_mlxlm() {
  sala_setup || exit 1
  python3 -c "import mlx.core, mlx_lm" 2>/dev/null \
    || die "mlx-lm does not import: $MLX_BUNDLE needs --with-python, and /tmp/mlx-cuda must not be unpacked from a bundle without it (rm -rf /tmp/mlx-cuda, then run again)"
  if [ "$(left)" -lt 60 ]; then
    echo "SKIP mlxlm: only $(left) s of BUDGET_S=$BUDGET_S left" | tee -a "$OUT/skipped.txt"; return 1
  fi
  phase "start mlx-lm ${MLX_CONTEXTS:-4096,32768,131072}"
  timeout --signal=INT --kill-after=10 "$(left)" python3 eval/mlx_lm_baseline.py eval/synthetic/qwen3-8b.json 8 \
    "${MLX_CONTEXTS:-4096,32768,131072}" "$OUT/mlx_lm.csv" 2>&1 | grep -v Warning | tee "$OUT/mlx_lm.log"
  phase "end mlx-lm rc=${PIPESTATUS[0]}"
}

[ $# -gt 0 ] || die "usage: bash eval/device-compare.sh MODE... (llama, sala, mlxlm, table)"
for MODE in "$@"; do
  case "$MODE" in llama|sala|mlxlm|table) ;; *) die "unknown mode '$MODE' (llama, sala, mlxlm, table)" ;; esac
done
for MODE in "$@"; do
  echo "=== $MODE (+${SECONDS}s)"
  if [ "$MODE" = table ]; then
    cp -r "$OUT"/. "$RESULTS"/
    python3 eval/compare_table.py "$RESULTS" --out "$OUT/compare.md"
    continue
  fi
  nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader | tee "$OUT/device-$MODE.txt"
  nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/gpu-memory-$MODE.csv" &
  SMI=$!
  "mode_$MODE"
  kill "$SMI"
  wait "$SMI" 2>/dev/null
  SMI=""
  # Kept for a later call's `table` on this machine.
  cp -r "$OUT"/. "$RESULTS"/
done
echo "=== done (+${SECONDS}s)"
