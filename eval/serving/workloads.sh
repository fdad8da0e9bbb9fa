#!/bin/bash
# Issue 59's workloads against one OpenAI-compatible server, each a guidellm run whose report is
# written as RESULTS/SERVER__MODEL__WORKLOAD.json (eval/serving/summary.py reads them):
#   eval/serving/workloads.sh URL SERVER MODEL RESULTS [WORKLOAD ...]
# WORKLOADS (default "random prompt4k prefix32k mixed"):
#   random      $PROMPT tokens in, $OUTPUT out, at each concurrency of $CONCURRENCY, 2 requests a
#               stream (8 at least)
#   prompt4k    $LONG_PROMPT in, $OUTPUT out, at concurrency $STREAMS, 2 requests a stream
#   prefixN     N = 32k, 128k or a token count: a prefix of that many tokens shared by $QUESTIONS
#               questions of 64 tokens, $PREFIX_OUTPUT out, one after another (guidellm's
#               synchronous profile): the first pays the prefix, the rest can reuse it
#   mixed       $MIXED_STREAMS streams (256 in, $MIXED_OUTPUT out, 2 requests a stream) while
#               prompts of $MIXED_PROMPT tokens ($MIXED_LONG of them, 16 out) arrive every
#               $MIXED_EVERY s: two guidellm processes at once, `mixed-streams` and `mixed-long`
# A warm-up runs first and is not kept: $PROMPT in, 32 out, at the most streams any run holds (16
# at least), as many requests as streams, so the batch sizes the runs meet have all been met once
# (sala compiles kernel variants as batch sizes first appear in a process: what that costs cold is
# in eval/results/2026-11-30-h200-serving).
# Sizes come from the environment (the defaults are the issue's; tests/serve_guidellm.rs runs every
# workload at small sizes on the CPU). GUIDELLM is the command (default `python3 -m guidellm`),
# TOKENIZER the tokenizer folder guidellm counts with (default: MODEL's folder under MODELS),
# DEADLINE the epoch second after which no run starts and a running one is stopped (default none).
# Exits 1 if a run failed or was stopped.
set -u
if [ $# -lt 4 ]; then
  echo "usage: $0 URL SERVER MODEL RESULTS [WORKLOAD ...]" >&2
  exit 2
fi
URL=$1 SERVER=$2 MODEL=$3 RESULTS=$4
shift 4
WORKLOADS=${*:-random prompt4k prefix32k mixed}
read -ra GUIDELLM <<< "${GUIDELLM:-python3 -m guidellm}"
TOKENIZER=${TOKENIZER:?give TOKENIZER: the folder of the tokenizer the server uses}
PROMPT=${PROMPT:-1024}
OUTPUT=${OUTPUT:-256}
CONCURRENCY=${CONCURRENCY:-1 4 16 64}
LONG_PROMPT=${LONG_PROMPT:-4096}
STREAMS=${STREAMS:-16}
QUESTIONS=${QUESTIONS:-16}
PREFIX_OUTPUT=${PREFIX_OUTPUT:-128}
MIXED_STREAMS=${MIXED_STREAMS:-64}
MIXED_OUTPUT=${MIXED_OUTPUT:-512}
MIXED_PROMPT=${MIXED_PROMPT:-32768}
MIXED_LONG=${MIXED_LONG:-6}
MIXED_EVERY=${MIXED_EVERY:-5}
DEADLINE=${DEADLINE:-}
LOGS=${LOGS:-$RESULTS/logs}
mkdir -p "$RESULTS" "$LOGS"
failed=0

# run WORKLOAD DATA guidellm-args...: one guidellm run, stopped at DEADLINE.
run() {
  local workload=$1 data=$2; shift 2
  local limit=()
  if [ -n "$DEADLINE" ]; then
    local left=$((DEADLINE - $(date +%s)))
    if [ "$left" -lt 20 ]; then echo "SKIP $SERVER $MODEL $workload: ${left} s left"; failed=1; return 1; fi
    limit=(timeout --signal=INT --kill-after=10 "$left")
  fi
  echo "$(date +%s) start $SERVER $MODEL $workload"
  ${limit[@]+"${limit[@]}"} "${GUIDELLM[@]}" benchmark run --target "$URL" --processor "$TOKENIZER" --data "$data" \
    --disable-progress --disable-console-outputs --output-path "$RESULTS/${SERVER}__${MODEL}__${workload}.json" "$@" \
    > "$LOGS/guidellm-$SERVER-$MODEL-$workload.log" 2>&1
  local rc=$?
  echo "$(date +%s) end $SERVER $MODEL $workload rc=$rc"
  if [ "$rc" != 0 ]; then failed=1; tail -5 "$LOGS/guidellm-$SERVER-$MODEL-$workload.log"; fi
  return "$rc"
}

per_stream() { local n=$((2 * $1)); echo $((n < 8 ? 8 : n)); }

widest=16
for c in $CONCURRENCY $STREAMS $MIXED_STREAMS; do [ "$c" -gt "$widest" ] && widest=$c; done
run warmup "prompt_tokens=$PROMPT,output_tokens=32,samples=$widest" --rate-type concurrent --rate "$widest" --max-requests "$widest"
rm -f "$RESULTS/${SERVER}__${MODEL}__warmup.json"
for w in $WORKLOADS; do
  case $w in
    random)
      for c in $CONCURRENCY; do
        n=$(per_stream "$c")
        run "random-c$c" "prompt_tokens=$PROMPT,output_tokens=$OUTPUT,samples=$n" --rate-type concurrent --rate "$c" --max-requests "$n"
      done ;;
    prompt4k)
      n=$(per_stream "$STREAMS")
      run prompt4k "prompt_tokens=$LONG_PROMPT,output_tokens=$OUTPUT,samples=$n" --rate-type concurrent --rate "$STREAMS" --max-requests "$n" ;;
    prefix*)
      size=${w#prefix}
      case $size in *k) size=$((${size%k} * 1024)) ;; esac
      run "$w" "prefix_tokens=$size,prompt_tokens=64,output_tokens=$PREFIX_OUTPUT,samples=$QUESTIONS" \
        --rate-type synchronous --max-requests "$QUESTIONS" ;;
    mixed)
      run mixed-long "prompt_tokens=$MIXED_PROMPT,output_tokens=16,samples=$MIXED_LONG" \
        --rate-type constant --rate "$(python3 -c "print(1 / $MIXED_EVERY)")" --max-requests "$MIXED_LONG" &
      long=$!
      n=$(per_stream "$MIXED_STREAMS")
      run mixed-streams "prompt_tokens=256,output_tokens=$MIXED_OUTPUT,samples=$n" --rate-type concurrent \
        --rate "$MIXED_STREAMS" --max-requests "$n"
      wait "$long" || failed=1 ;;
    *) echo "workloads: unknown workload $w" >&2; failed=1 ;;
  esac
done
exit "$failed"
