#!/bin/bash
# Does `sala run` on the GPU exit cleanly? An H100 run of golden's sala_run_reproduces_golden_logits
# (eval/results/2026-11-28-h100-final-tests) failed once: C_sparse_prefill's output was right, then
# the process aborted at exit ("Destroy(handle_) failed: driver shutting down"). This runs each
# golden case's `sala run` REPEAT (5) times alone, then with LOAD (default 4) other sala processes
# on the GPU, and records every exit code ($OUT/exit-check.txt); under gdb (where installed) an
# abort leaves a backtrace ($OUT/exit-backtraces.txt). Then golden parity alone (GOLDEN=1, default;
# $OUT/golden.log), then, if AFTER is set, that command (e.g. a bench) under what is left of
# DEADLINE_S (default 560).
# Prepare and carry as eval/device-tests.sh says.
set -u
source eval/device-setup.sh
export MLX_ENABLE_TF32=0
END_AT=$(( $(date +%s) + ${DEADLINE_S:-560} ))
left() { echo $(( END_AT - $(date +%s) > 1 ? END_AT - $(date +%s) : 1 )); }
GDB=$(command -v gdb || true)
echo "gdb: ${GDB:-not installed}" | tee "$OUT/exit-check.txt"
run_case() {
  local c=$1 tag=$2 G=.device/golden/$1 ids n rc
  ids=$(python3 -c "import json; print(','.join(map(str,json.load(open('$G/tokens.json'))['prompt_ids'])))")
  n=$(python3 -c "import json; print(len(json.load(open('$G/tokens.json'))['decode_input_ids'])+1)")
  local args=(run --model "$G" --input-ids "$ids" --temperature 0 --ignore-eos --max-tokens "$n" --dtype f32 --device gpu --json)
  if [ -n "$GDB" ]; then
    timeout "$(left)" "$GDB" -q -batch -ex run -ex "thread apply all bt 12" -ex "quit 99" --args "$BIN/sala" "${args[@]}" > "$OUT/gdb-$c-$tag.txt" 2>&1
    # gdb's own exit status is the program's (or 99 after a signal).
    rc=$?
    grep -q "exited normally" "$OUT/gdb-$c-$tag.txt" && rc=0
    [ "$rc" = 0 ] || { echo "===== $c $tag"; cat "$OUT/gdb-$c-$tag.txt"; } >> "$OUT/exit-backtraces.txt"
    rm -f "$OUT/gdb-$c-$tag.txt"
  else
    timeout "$(left)" "$BIN/sala" "${args[@]}" > /dev/null 2> "$OUT/err-$c-$tag.txt"
    rc=$?
    [ "$rc" = 0 ] || { echo "===== $c $tag"; tail -5 "$OUT/err-$c-$tag.txt"; } >> "$OUT/exit-backtraces.txt"
    rm -f "$OUT/err-$c-$tag.txt"
  fi
  echo "$c $tag exit $rc" | tee -a "$OUT/exit-check.txt"
}
export -f run_case left
export BIN OUT END_AT GDB
for i in $(seq "${REPEAT:-5}"); do
  for c in A_dense_f32 B_chunk_boundary C_sparse_prefill D_two_turn; do run_case $c alone$i; done
done
# The same under load: LOAD processes at a time, as golden's run beside the kernel tests was.
for i in $(seq "${REPEAT:-5}"); do for c in A_dense_f32 B_chunk_boundary C_sparse_prefill D_two_turn; do echo "$c loaded$i"; done; done \
  | xargs -P "${LOAD:-4}" -L 1 bash -c 'run_case $0 $1'
echo "exits: $(grep -c 'exit 0$' "$OUT/exit-check.txt") clean, $(grep -c 'exit [1-9]' "$OUT/exit-check.txt") not" | tee -a "$OUT/exit-check.txt"
if [ "${GOLDEN:-1}" = 1 ]; then
  SALA_TEST_DEVICE=gpu SALA_SHARED=.device SALA_BIN=$BIN/sala timeout "$(left)" "$BIN/golden" --test-threads=1 > "$OUT/golden.log" 2>&1
  grep -E "^test |test result" "$OUT/golden.log"
fi
[ -n "${AFTER:-}" ] && timeout "$(left)" bash -c "$AFTER"
true
