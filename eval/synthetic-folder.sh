#!/bin/bash
# Makes a synthetic model's folder: a synthetic.json naming a preset (eval/synthetic/*.json) and
# its quantization, and a tokenizer's files, so that `sala serve/run/chat/show/bench -m OUTDIR`
# take a model with the preset's shapes and random weights, drawn when it is loaded (no checkpoint
# needed, a few MB to carry to a GPU machine).
#   eval/synthetic-folder.sh PRESET BITS TOKENIZER_DIR OUTDIR     (BITS: 8, 4, ... or none)
#   eval/synthetic-folder.sh minicpm-sala-9b 8 ../shared/assets/minicpm4-tokenizer .device/sala-9b-q8
#   eval/synthetic-folder.sh qwen3-8b 8 ../shared/assets/minicpm4-tokenizer .device/qwen3-8b-q8
# Any tokenizer with no more tokens than the preset's vocab_size works (MiniCPM4's 73,448 fit
# Qwen3-8B's 151,936; ids past the tokenizer's decode to nothing). No generation_config.json is
# copied: requests and flags set the sampling, the preset's config the end tokens.
set -eu
if [ $# -ne 4 ]; then
  echo "usage: $0 PRESET BITS|none TOKENIZER_DIR OUTDIR" >&2
  exit 2
fi
preset=$1 bits=$2 tokenizer=$3 out=$4
if [ ! -f "$tokenizer/tokenizer.json" ]; then
  echo "$tokenizer: no tokenizer.json; give a folder with a tokenizer (e.g. ../shared/assets/minicpm4-tokenizer)" >&2
  exit 1
fi
mkdir -p "$out"
for f in tokenizer.json tokenizer_config.json special_tokens_map.json added_tokens.json chat_template.jinja; do
  if [ -f "$tokenizer/$f" ]; then cp "$tokenizer/$f" "$out/"; fi
done
case $bits in
  none) printf '{"preset": "%s"}\n' "$preset" > "$out/synthetic.json" ;;
  *[!0-9]* | '') echo "BITS must be a number (8, 4, ...) or none, not $bits" >&2; exit 2 ;;
  *) printf '{"preset": "%s", "bits": %s}\n' "$preset" "$bits" > "$out/synthetic.json" ;;
esac
echo "$out: $(cat "$out/synthetic.json")"
