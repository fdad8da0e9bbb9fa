"""mlx-lm (Python) on Qwen3-8B-shaped random weights, quantized as `sala bench --synthetic --bits`
does (group 64): prefill of an N-token prompt in 2048-token steps and 64 decode tokens after it,
through mlx-lm's own generate loop. The side-by-side baseline for eval/device-perf.sh.

usage: python3 eval/mlx_lm_baseline.py CONFIG.json BITS CONTEXT[,CONTEXT...] OUT.csv
"""
import csv, json, sys, time

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import generate_step
from mlx_lm.models import qwen3
from mlx_lm.sample_utils import make_sampler

config_path, bits, contexts, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
args = qwen3.ModelArgs.from_dict(json.load(open(config_path)))
model = qwen3.Model(args)
model.set_dtype(mx.bfloat16)
nn.quantize(model, group_size=64, bits=bits)
mx.eval(model.parameters())
greedy = make_sampler(temp=0.0)
rows = []
for context in [int(c) for c in contexts.split(",")]:
    for rep in range(2):  # the first run warms up
        prompt = mx.random.randint(0, args.vocab_size, (context,))
        mx.eval(prompt)
        mx.reset_peak_memory()
        start = time.perf_counter()
        steps = generate_step(prompt, model, max_tokens=65, sampler=greedy, prefill_step_size=2048)
        next(steps)  # the prompt's prefill and the first token
        first = time.perf_counter()
        for _ in steps:
            pass
        end = time.perf_counter()
        if rep == 1:
            rows.append({
                "context": context,
                "prefill_tok_s": round(context / (first - start), 1),
                "decode_tok_s": round(64 / (end - first), 2),
                "peak_gb": round(mx.get_peak_memory() / 1e9, 2),
            })
            print(rows[-1], flush=True)
            # Written after every context, so a run stopped at a time limit keeps what it measured.
            with open(out_path, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
