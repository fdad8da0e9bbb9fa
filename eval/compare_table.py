#!/usr/bin/env python3
"""Issue 34's table from one machine's results: llama.cpp (llama-bench), sala and mlx-lm side by side,
with sala / llama.cpp ratios, peak memory at 128K, KV-cache bytes per token and the issue's goals.
Standard library only; runs on the device (`bash eval/device-compare.sh table`) and here.

usage: python3 eval/compare_table.py DIR [--llamacpp FILE] [--sala FILE] [--mlx-lm FILE]
                                         [--gpu-memory FILE] [--partial] [--out FILE]

DIR holds what eval/device-compare.sh writes (its calls' archives, unpacked into one folder):
llamacpp/results.json (llama-bench rows as JSON, or a .jsonl file), sala.csv (`sala bench -o csv`
rows), mlx_lm.csv (eval/mlx_lm_baseline.py), and if present gpu-memory-llama.csv (nvidia-smi samples
during the llama mode) and device-*.txt (the GPU of each mode). A missing input is an error naming
it, unless --partial (its column then reads —).
"""
import argparse
import csv
import json
import os
import re
import sys

# (kind, tokens, depth): kind "pp" = a prompt of `tokens`, "tg" = `tokens` decoded after `depth`.
TESTS = [("pp", 4096, 0), ("pp", 32768, 0), ("tg", 64, 4096), ("tg", 64, 32768), ("tg", 64, 131072)]
DEEP = 131072
COLUMNS = ["llama.cpp Qwen3-8B Q8_0", "sala Qwen3-8B q8", "sala SALA-9B q8", "mlx-lm Qwen3-8B q8"]
LLAMA, SALA_QWEN, SALA_SALA, MLX_LM = COLUMNS
SYNTHETIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "synthetic")
# Bytes per K or V element in llama.cpp's cache types (a q8_0 block: 32 values in 34 bytes).
KV_TYPE_BYTES = {"f16": 2.0, "bf16": 2.0, "f32": 4.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


class Missing(Exception):
    """An input file that is not there or holds no usable rows."""


def test_name(key):
    kind, tokens, depth = key
    return f"{kind}{tokens}" + (f" @ d{depth}" if depth else "")


def key_of(n_prompt, n_gen, depth):
    if n_prompt and not n_gen:
        return ("pp", n_prompt, depth)
    if n_gen and not n_prompt:
        return ("tg", n_gen, depth)
    return None


def to_int(value):
    return int(float(value)) if value not in (None, "") else 0


def read_llamacpp(path):
    """{test: row} of llama-bench's Q8_0 rows (f16 KV preferred), and notes."""
    if not os.path.isfile(path):
        raise Missing(f"{path}: no such file (llama.cpp's results: `bash eval/device-compare.sh llama` writes llamacpp/results.json)")
    with open(path) as f:
        text = f.read()
    try:
        rows = json.loads(text) if path.endswith(".json") else [json.loads(l) for l in text.splitlines() if l.strip().startswith("{")]
    except json.JSONDecodeError as e:
        raise Missing(f"{path}: not llama-bench JSON ({e})")
    rows = [r for r in rows if isinstance(r, dict) and "avg_ts" in r and "Q8_0" in str(r.get("model_type", ""))]
    if not rows:
        raise Missing(f"{path}: no llama-bench row of a Q8_0 model (did every llama-bench run fail? see run.log beside it)")
    kv_types = sorted({r.get("type_k", "f16") for r in rows})
    kv = "f16" if "f16" in kv_types else kv_types[0]
    table, notes = {}, []
    for r in rows:
        key = key_of(to_int(r.get("n_prompt")), to_int(r.get("n_gen")), to_int(r.get("n_depth")))
        if key and r.get("type_k", "f16") == kv:
            if key in table:
                notes.append(f"{path}: {test_name(key)} measured more than once; the last row is used")
            table[key] = {"ts": float(r["avg_ts"]), "sd": float(r.get("stddev_ts") or 0)}
    first = rows[0]
    about = (f"llama.cpp build {first.get('build_commit')} ({first.get('build_number')}), {first.get('model_type')}, "
             f"{first.get('backends')}, -ngl {first.get('n_gpu_layers')} -fa {first.get('flash_attn')}, KV {kv}, "
             f"{len(first.get('samples_ts') or [])} runs a test; GPU {first.get('gpu_info')}")
    return table, kv, about, notes


def read_sala(path):
    """{(model_type, bits): {test: row}} of `sala bench` rows (one sequence, no draft), and notes."""
    if not os.path.isfile(path):
        raise Missing(f"{path}: no such file (sala's results: `bash eval/device-compare.sh sala` writes sala.csv)")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        need = {"model_filename", "model_type", "n_prompt", "n_gen", "n_depth", "avg_ts", "stddev_ts", "peak_mem"}
        if not reader.fieldnames or not need <= set(reader.fieldnames):
            raise Missing(f"{path}: not a `sala bench -o csv` file (needs the columns {', '.join(sorted(need))})")
        rows = list(reader)
    models, notes = {}, []
    for line, r in enumerate(rows, start=2):
        try:
            if to_int(r.get("n_seq")) > 1 or r.get("draft_layers") or r.get("prefix") or r.get("grammar"):
                continue
            bits = re.search(r"-q(\d+) \(synthetic\)$", r["model_filename"])
            key = key_of(to_int(r["n_prompt"]), to_int(r["n_gen"]), to_int(r["n_depth"]))
            if not bits or not key:
                continue
            row = {"ts": float(r["avg_ts"]), "sd": float(r["stddev_ts"] or 0), "peak": to_int(r["peak_mem"])}
        except (TypeError, ValueError) as e:
            raise Missing(f"{path}, line {line}: not a `sala bench` row ({e})")
        model = (r["model_type"], int(bits.group(1)))
        if key in models.get(model, {}):
            notes.append(f"{path}: {r['model_filename']} {test_name(key)} measured more than once; the last row is used")
        models.setdefault(model, {})[key] = row
    if not models:
        raise Missing(f"{path}: no single-sequence row of a --synthetic ... --bits model")
    return models, notes


def read_mlx_lm(path):
    """{test: row} from eval/mlx_lm_baseline.py's csv: prefill as ppN, decode as tg64 @ dN."""
    if not os.path.isfile(path):
        raise Missing(f"{path}: no such file (mlx-lm's results: `bash eval/device-compare.sh mlxlm` writes mlx_lm.csv)")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or not {"context", "prefill_tok_s", "decode_tok_s", "peak_gb"} <= set(rows[0]):
        raise Missing(f"{path}: no rows of eval/mlx_lm_baseline.py (context, prefill_tok_s, decode_tok_s, peak_gb)")
    table = {}
    for r in rows:
        context = int(r["context"])
        table[("pp", context, 0)] = {"ts": float(r["prefill_tok_s"]), "sd": None}
        table[("tg", 64, context)] = {"ts": float(r["decode_tok_s"]), "sd": None, "peak": float(r["peak_gb"]) * 1e9}
    return table


def read_gpu_memory(path):
    """Largest nvidia-smi memory.used sample (MiB -> bytes), or None."""
    if not os.path.isfile(path):
        return None
    used = []
    with open(path) as f:
        for line in f:
            cells = [c.strip() for c in line.split(",")]
            if len(cells) >= 2 and cells[-1].isdigit():
                used.append(int(cells[-1]))
    return max(used) * 2**20 if used else None


def kv_bytes_per_token(config, element_bytes):
    """K and V of every full-attention layer: 2 x layers x KV heads x head_dim x element bytes."""
    with open(os.path.join(SYNTHETIC, config)) as f:
        c = json.load(f)
    layers = c["num_hidden_layers"]
    if "mixer_types" in c:  # SALA: only its sparse-attention (minicpm4) layers keep a K/V per token
        layers = sum(1 for m in c["mixer_types"] if m == "minicpm4")
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return 2 * layers * c["num_key_value_heads"] * head_dim * element_bytes


def fmt_ts(cell):
    if not cell:
        return "—"
    ts = cell["ts"]
    return f"{ts:,.0f}" if ts >= 1000 else f"{ts:.1f}"


def fmt_ratio(a, b):
    return f"{a / b:.2f}×" if a and b else "—"


def fmt_gb(n):
    return f"{n / 1e9:.1f} GB" if n else "—"


def fmt_kib(n):
    return f"{n / 1024:.1f} KiB" if n else "—"


def slope(table):
    """Bytes per cached token from the decode tests' peaks: (peak @ d131072 - peak @ d4096) / depth."""
    deep, shallow = table.get(("tg", 64, DEEP)), table.get(("tg", 64, 4096))
    if not deep or not shallow or not deep.get("peak") or not shallow.get("peak"):
        return None
    return (deep["peak"] - shallow["peak"]) / (DEEP - 4096)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", help="folder with llamacpp/results.json, sala.csv, mlx_lm.csv")
    ap.add_argument("--llamacpp", help="llama-bench results (default DIR/llamacpp/results.json)")
    ap.add_argument("--sala", help="sala bench csv (default DIR/sala.csv)")
    ap.add_argument("--mlx-lm", help="mlx_lm_baseline.py csv (default DIR/mlx_lm.csv)")
    ap.add_argument("--gpu-memory", help="nvidia-smi samples of the llama mode (default DIR/gpu-memory-llama.csv)")
    ap.add_argument("--partial", action="store_true", help="print what there is; a missing input's column reads —")
    ap.add_argument("--out", help="also write the markdown to this file")
    a = ap.parse_args()
    d = a.dir
    if not os.path.isdir(d):
        sys.exit(f"compare_table.py: {d}: not a folder (give the folder with the device calls' result files)")
    paths = {
        LLAMA: a.llamacpp or os.path.join(d, "llamacpp", "results.json"),
        "sala": a.sala or os.path.join(d, "sala.csv"),
        MLX_LM: a.mlx_lm or os.path.join(d, "mlx_lm.csv"),
    }
    errors, notes = [], []
    llama, kv_type, about, sala_models, mlx = {}, "f16", None, {}, {}
    try:
        llama, kv_type, about, more = read_llamacpp(paths[LLAMA])
        notes += more
    except Missing as e:
        errors.append(str(e))
    try:
        sala_models, more = read_sala(paths["sala"])
        notes += more
    except Missing as e:
        errors.append(str(e))
    try:
        mlx = read_mlx_lm(paths[MLX_LM])
    except Missing as e:
        errors.append(str(e))
    if errors and not a.partial:
        for e in errors:
            print(f"compare_table.py: {e}", file=sys.stderr)
        sys.exit("compare_table.py: an input is missing or unreadable (--partial prints the table without it)")
    cols = {LLAMA: llama, SALA_QWEN: sala_models.get(("qwen3", 8), {}), SALA_SALA: sala_models.get(("minicpm_sala", 8), {}), MLX_LM: mlx}
    sala_q4 = sala_models.get(("minicpm_sala", 4), {})

    # One GPU for all: the modes' device-*.txt (name, uuid, driver) must agree.
    devices = {}
    for name in sorted(os.listdir(d)):
        if name.startswith("device-") and name.endswith(".txt"):
            with open(os.path.join(d, name)) as f:
                devices[name] = f.read().strip()
    out = []
    if len(set(devices.values())) > 1:
        warning = ("NOT ONE GPU: the modes ran on different GPUs, so the columns do not compare: "
                   + "; ".join(f"{n}: {v}" for n, v in devices.items()))
        print(f"compare_table.py: {warning}", file=sys.stderr)
        out += [f"**{warning}**", ""]

    head = ["test (t/s)"] + COLUMNS + ["sala Qwen3 / llama.cpp", "sala SALA / llama.cpp"]
    out.append("| " + " | ".join(head) + " |")
    out.append("|---|" + "---:|" * (len(head) - 1))
    for key in TESTS:
        cells = [cols[c].get(key) for c in COLUMNS]
        base = cells[0]["ts"] if cells[0] else None
        ratios = [fmt_ratio(cells[i]["ts"] if cells[i] else None, base) for i in (1, 2)]
        out.append("| " + " | ".join([test_name(key)] + [fmt_ts(c) for c in cells] + ratios) + " |")

    # Peak memory with 131072 tokens cached: nvidia-smi for llama.cpp (all it holds), MLX's peak for the others.
    deep_ran = ("tg", 64, DEEP) in llama  # else the samples' largest is not the d131072 test's
    gpu_mem = read_gpu_memory(a.gpu_memory or os.path.join(d, "gpu-memory-llama.csv")) if deep_ran else None
    peaks = [gpu_mem] + [(cols[c].get(("tg", 64, DEEP)) or {}).get("peak") for c in COLUMNS[1:]]
    out.append("| " + " | ".join([f"memory @ d{DEEP} ¹"] + [fmt_gb(p) for p in peaks]
                                 + [fmt_ratio(peaks[1], peaks[0]), fmt_ratio(peaks[2], peaks[0])]) + " |")
    # KV cache per token: llama.cpp's and mlx-lm's computed from the shapes, sala's measured.
    kv = [kv_bytes_per_token("qwen3-8b.json", KV_TYPE_BYTES.get(kv_type, 2.0)) if llama else None, slope(cols[SALA_QWEN]), slope(cols[SALA_SALA]),
          kv_bytes_per_token("qwen3-8b.json", 2.0)]
    kv_cells = [f"{fmt_kib(kv[0])} ({kv_type}) ²" if kv[0] else "—", f"≈ {fmt_kib(kv[1])} ³" if kv[1] else "—",
                f"≈ {fmt_kib(kv[2])} ³" if kv[2] else "—", f"{fmt_kib(kv[3])} (bf16) ²"]
    out.append("| " + " | ".join(["KV cache per token"] + kv_cells + [fmt_ratio(kv[1], kv[0]), fmt_ratio(kv[2], kv[0])]) + " |")
    out.append("")
    out.append("¹ llama.cpp: the most nvidia-smi showed in use during its run (model, KV cache and compute buffers "
               "of the d131072 test, plus the CUDA context); sala and mlx-lm: MLX's own peak (`peak_mem`, `peak_gb`) "
               "during that test (mlx-lm's includes the prompt's prefill), not MLX's cache of freed buffers.")
    with open(os.path.join(SYNTHETIC, "minicpm-sala-9b.json")) as f:
        sparse_layers = json.load(f)["mixer_types"].count("minicpm4")
    out.append(f"² computed from the shapes: 2 × layers × KV heads × head_dim × bytes ({kv_type} for llama.cpp). "
               f"SALA-9B's {sparse_layers} sparse-attention layers computed so: "
               f"{fmt_kib(kv_bytes_per_token('minicpm-sala-9b.json', 2.0))} (bf16) plus its compressed keys.")
    out.append(f"³ measured: (peak @ d{DEEP} − peak @ d4096) / {DEEP - 4096} tokens, from sala's `peak_mem`.")
    out.append("")
    q4 = sala_q4.get(("tg", 64, 4096))
    if q4:
        out.append(f"sala SALA-9B q4: tg64 @ d4096 {fmt_ts(q4)} t/s (peak {fmt_gb(q4['peak'])}).")
    spread = []
    for c in COLUMNS[:3] + (["sala SALA-9B q4"] if sala_q4 else []):
        table = sala_q4 if c == "sala SALA-9B q4" else cols[c]
        rel = [(r["sd"] / r["ts"], test_name(k)) for k, r in table.items() if k in TESTS and r.get("sd") is not None and r["ts"]]
        if rel:
            worst = max(rel)
            spread.append(f"{c} {100 * worst[0]:.1f} % ({worst[1]})")
    if spread:
        out.append("Largest run-to-run spread (sd / mean): " + "; ".join(spread) + ". mlx-lm: one timed run a test.")
    if about:
        out.append(about + ".")

    # The goals of issue 34 this table measures.
    def ratio(col, key):
        x, b = cols[col].get(key), llama.get(key)
        return x["ts"] / b["ts"] if x and b else None

    def verdict(value, target, unit=""):
        if value is None:
            return "not measured"
        shown = f"{value:.2f}×" if unit == "×" else f"{value:,.1f} t/s"
        goal = f"{target}×" if unit == "×" else f"{target:,} t/s"
        return f"{'met' if value >= target else 'NOT met'} ({shown}, goal ≥ {goal})"

    goals = []
    for depth in (4096, 32768, DEEP):
        goals.append(f"Qwen3-8B q8 decode @ d{depth} ≥ 1.1× llama.cpp: {verdict(ratio(SALA_QWEN, ('tg', 64, depth)), 1.1, '×')}")
    for tokens in (4096, 32768):
        goals.append(f"Qwen3-8B q8 prefill pp{tokens} ≥ 2× llama.cpp: {verdict(ratio(SALA_QWEN, ('pp', tokens, 0)), 2, '×')}")
    if kv[0] is None or kv[1] is None:
        goals.append(f"Qwen3-8B KV per token ≤ llama.cpp's {kv_type}: not measured")
    else:
        goals.append(f"Qwen3-8B KV per token ≤ llama.cpp's {kv_type}: {'met' if kv[1] <= kv[0] else 'NOT met'} "
                     f"(≈ {fmt_kib(kv[1])} against {fmt_kib(kv[0])})")
    s4k = cols[SALA_SALA].get(("tg", 64, 4096))
    goals.append(f"SALA-9B q8 decode @ d4096 ≥ 275 t/s: {verdict(s4k['ts'] if s4k else None, 275, 't/s')}")
    goals.append(f"SALA-9B q8 decode @ d4096 ≥ 1.3× llama.cpp's Qwen3-8B: {verdict(ratio(SALA_SALA, ('tg', 64, 4096)), 1.3, '×')}")
    goals.append(f"SALA-9B q4 decode @ d4096 ≥ 420 t/s: {verdict(q4['ts'] if q4 else None, 420, 't/s')}")
    s32 = cols[SALA_SALA].get(("pp", 32768, 0))
    goals.append(f"SALA-9B q8 prefill pp32768 ≥ 22,000 t/s: {verdict(s32['ts'] if s32 else None, 22000, 't/s')}")
    out.append("")
    out.append("Goals of issue 34 measured here:")
    out += [f"- {g}" for g in goals]

    if devices and len(set(devices.values())) == 1:
        out.append("")
        out.append(f"Every mode on one GPU ({', '.join(devices)}): {next(iter(devices.values()))}")
    for e in errors:
        notes.append(f"missing: {e}")
    for key in TESTS:
        for c in COLUMNS:
            if cols[c] and key not in cols[c]:
                notes.append(f"{c}: no {test_name(key)} (timed out or failed? see that mode's logs)")
    if notes:
        out.append("")
        out += [f"NOTE: {n}" for n in notes]
    text = "\n".join(out) + "\n"
    print(text, end="")
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
