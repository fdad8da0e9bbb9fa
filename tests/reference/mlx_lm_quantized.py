"""Makes tiny random HF checkpoints, quantizes them with mlx-lm and records mlx-lm's own logits,
so the Rust tests can load mlx-lm's output and compare (tests/mlx_lm.rs).

usage: mlx_lm_quantized.py OUT_DIR TOKENIZER_DIR
writes OUT_DIR/<case>/ (mlx-lm checkpoint) and OUT_DIR/<case>/logits.f32 ([T, vocab] float32) for
the prompt in OUT_DIR/prompt.json.
"""
import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm import convert, load

out, tokenizer_dir = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)
VOCAB = 73448  # the tokenizer's
PROMPT = [int(x) for x in rng.integers(0, 1000, size=24)]
(out / "prompt.json").write_text(json.dumps(PROMPT))

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=VOCAB, rms_norm_eps=1e-5, rope_theta=10000.0,
            max_position_embeddings=256, bos_token_id=1, eos_token_id=2)
CASES = {
    # name: (config overrides, quantization)
    "llama_q4": (dict(model_type="llama", architectures=["LlamaForCausalLM"], tie_word_embeddings=False), dict(q_bits=4, q_group_size=64)),
    "qwen2_q8": (dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], tie_word_embeddings=True), dict(q_bits=8, q_group_size=32)),
    "qwen3_q4": (dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=32, tie_word_embeddings=True), dict(q_bits=4, q_group_size=32)),
}


def tensors(cfg):
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = cfg.get("head_dim", h // cfg["num_attention_heads"])
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    w = lambda *s: (rng.standard_normal(s) * 0.08).astype(np.float32)
    norm = lambda n: (1 + rng.standard_normal(n) * 0.1).astype(np.float32)
    t = {"model.embed_tokens.weight": w(v, h), "model.norm.weight": norm(h)}
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = w(v, h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        t.update({f"{p}.input_layernorm.weight": norm(h), f"{p}.post_attention_layernorm.weight": norm(h),
                  f"{p}.self_attn.q_proj.weight": w(q, h), f"{p}.self_attn.k_proj.weight": w(kv, h),
                  f"{p}.self_attn.v_proj.weight": w(kv, h), f"{p}.self_attn.o_proj.weight": w(h, q),
                  f"{p}.mlp.gate_proj.weight": w(f, h), f"{p}.mlp.up_proj.weight": w(f, h),
                  f"{p}.mlp.down_proj.weight": w(h, f)})
        if cfg["model_type"] == "qwen2":
            for n, r in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
                t[f"{p}.self_attn.{n}.bias"] = (rng.standard_normal(r) * 0.1).astype(np.float32)
        if cfg["model_type"] == "qwen3":
            t[f"{p}.self_attn.q_norm.weight"] = norm(d)
            t[f"{p}.self_attn.k_norm.weight"] = norm(d)
    return t


for name, (overrides, quant) in CASES.items():
    cfg = {**BASE, **overrides}
    hf = out / f"{name}-hf"
    shutil.rmtree(hf, ignore_errors=True)
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(cfg))
    mx.save_safetensors(str(hf / "model.safetensors"), {k: mx.array(v) for k, v in tensors(cfg).items()})
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / f, hf / f)
    dst = out / name
    shutil.rmtree(dst, ignore_errors=True)
    convert(str(hf), mlx_path=str(dst), quantize=True, dtype="float32", **quant)
    model, _ = load(str(dst))
    logits = model(mx.array([PROMPT]))[0].astype(mx.float32)
    np.asarray(logits).astype(np.float32).tofile(dst / "logits.f32")
    print(name, "ok", logits.shape)
