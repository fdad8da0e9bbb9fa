#!/usr/bin/env python3
"""Independent float64 numpy forward of the dense HF decoder families, for tests/dense_families.rs.

    python3 dense_forward.py MODEL_DIR ID,ID,... OUT.f32

MODEL_DIR holds an HF-layout checkpoint (config.json + model.safetensors, float tensors). The script
runs the whole id list as one sequence (positions 0..T-1, causal) and writes the logits [T, vocab]
to OUT as raw little-endian float32, row-major.

Written from the published Hugging Face semantics, not from the Rust code under test:
  * LlamaForCausalLM / MistralForCausalLM (model_type llama, mistral): pre-norm decoder, RMSNorm,
    rotate-half RoPE, GQA causal softmax attention (scale 1/sqrt(head_dim), kv head = q head // n_rep
    as in `repeat_kv`), SwiGLU MLP; `attention_bias` puts a bias on q, k, v and o.
  * Qwen2ForCausalLM: q/k/v biases, none on o_proj (sliding window only if use_sliding_window).
  * Qwen3ForCausalLM: per-head RMSNorm of q and k (over head_dim, weights q_norm/k_norm) on
    `proj(x).view(..., heads, head_dim)` before RoPE; explicit head_dim; biases iff attention_bias.
  * MiniCPM (modeling_minicpm.py): embeddings * scale_emb, each residual branch *
    scale_depth/sqrt(num_hidden_layers), logits = lm_head(h / (hidden_size / dim_model_base)).
    Its MiniCPMLongRoPE builds the cos/sin cache once for max_position_embeddings, so long factors
    iff max_position_embeddings > original_max_position_embeddings, for every position; scaling
    factor sqrt(1 + ln(max/orig)/ln(orig)) on cos and sin.
  * RoPE (modeling_rope_utils.py): inv_freq_i = 1/base^(2i/d), i < d/2, per rope_scaling type:
      linear   inv_freq / factor
      llama3   wavelen = 2pi/inv_freq; > orig/low: inv/factor; < orig/high: unchanged;
               otherwise s = (orig/wavelen - low)/(high - low), inv = (1-s) inv/factor + s inv
      yarn     correction range from beta_fast/beta_slow (floor/ceil, clipped to [0, d-1]), linear ramp,
               inv = inv_interp (1-extrap) + inv_extrap extrap; attention_factor (explicit, else
               mscale/mscale_all_dim ratio, else 0.1 ln(factor) + 1) multiplies cos and sin.
               (`factor` is taken from rope_scaling; HF 4.5x replaces it by max/orig when orig is in
               rope_scaling - keep configs consistent, factor = max/orig, so both readings agree.)
      longrope inv = 1/(ext * base^(2i/d)), ext = short_factor while seq_len <= orig, long_factor
               beyond (HF dynamic update, seq_len = max position + 1); attention_factor explicit,
               else sqrt(1 + ln(max/orig)/ln(orig)) (1 when max <= orig), on cos and sin.
  * Tied embeddings: lm_head.weight = embed_tokens.weight (tie_word_embeddings, or no lm_head.weight).

Only numpy is needed: the safetensors file is read with the small parser below (the format is an
8-byte little-endian header length, a JSON header, then raw little-endian tensor bytes).
"""

import json
import math
import os
import struct
import sys

import numpy as np


# ---------------------------------------------------------------------------------------------
# Checkpoint reading


def _bf16_to_f32(raw):
    u16 = np.frombuffer(raw, dtype="<u2").astype(np.uint32)
    return (u16 << 16).view(np.float32)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    body = data[8 + n :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = body[start:end]
        dtype = info["dtype"]
        if dtype == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif dtype == "F64":
            arr = np.frombuffer(raw, dtype="<f8")
        elif dtype == "F16":
            arr = np.frombuffer(raw, dtype="<f2")
        elif dtype == "BF16":
            arr = _bf16_to_f32(raw)
        else:
            raise SystemExit(f"{path}: tensor {name}: dtype {dtype} not handled by the reference")
        out[name] = arr.astype(np.float64).reshape(info["shape"])
    return out


def load_weights(model_dir):
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        return read_safetensors(single)
    index = os.path.join(model_dir, "model.safetensors.index.json")
    with open(index) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    weights = {}
    for name in files:
        weights.update(read_safetensors(os.path.join(model_dir, name)))
    return weights


# ---------------------------------------------------------------------------------------------
# RoPE


def rope_inv_freq(cfg, head_dim, seq_len):
    """(inv_freq [d/2], attention_factor) for a forward whose largest position is seq_len - 1."""
    base = float(cfg.get("rope_theta", 10000.0))
    d = head_dim
    inv = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    rs = cfg.get("rope_scaling")
    if not rs:
        return inv, 1.0
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / float(rs["factor"]), 1.0
    if kind == "llama3":
        factor = float(rs["factor"])
        low = float(rs["low_freq_factor"])
        high = float(rs["high_freq_factor"])
        orig = float(rs["original_max_position_embeddings"])
        low_wavelen, high_wavelen = orig / low, orig / high
        wavelen = 2 * math.pi / inv
        out = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (orig / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, out), 1.0
    if kind == "yarn":
        max_pos = float(cfg["max_position_embeddings"])
        orig = float(rs.get("original_max_position_embeddings", max_pos))
        factor = rs.get("factor")
        factor = float(factor) if factor is not None else max_pos / orig

        def get_mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        af = rs.get("attention_factor")
        if af is None:
            mscale, mscale_all_dim = rs.get("mscale"), rs.get("mscale_all_dim")
            if mscale and mscale_all_dim:
                af = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
            else:
                af = get_mscale(factor)
        beta_fast = rs.get("beta_fast") or 32
        beta_slow = rs.get("beta_slow") or 1

        def correction_dim(rot):
            return d * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

        lo = max(math.floor(correction_dim(beta_fast)), 0)
        hi = min(math.ceil(correction_dim(beta_slow)), d - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(d // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
        extrap = 1 - ramp
        pos_freqs = base ** (np.arange(0, d, 2, dtype=np.float64) / d)
        inv_extrap = 1.0 / pos_freqs
        inv_interp = 1.0 / (factor * pos_freqs)
        return inv_interp * (1 - extrap) + inv_extrap * extrap, float(af)
    if kind in ("longrope", "su"):
        max_pos = float(cfg["max_position_embeddings"])
        orig = rs.get("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
        orig = float(orig)
        factor = max_pos / orig
        if cfg["model_type"] == "minicpm":
            # MiniCPMLongRoPE: fixed at init from max_position_embeddings; its scaling factor
            # ignores any attention_factor key.
            use_long = max_pos > orig
            af = math.sqrt(1 + math.log(factor) / math.log(orig))
        else:
            use_long = seq_len > orig
            af = rs.get("attention_factor")
            if af is None:
                af = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))
        ext = np.asarray(rs["long_factor" if use_long else "short_factor"], dtype=np.float64)
        assert ext.shape == (d // 2,), f"longrope factors must have head_dim/2 = {d // 2} entries"
        return 1.0 / (ext * base ** (np.arange(0, d, 2, dtype=np.float64) / d)), float(af)
    raise SystemExit(f"reference: rope_scaling type {kind!r} not implemented")


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def apply_rope(x, cos, sin):
    # x [H, T, D]; cos/sin [T, D]
    return x * cos[None] + rotate_half(x) * sin[None]


# ---------------------------------------------------------------------------------------------
# Forward


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    x = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(x)
    return e / np.sum(e, axis=axis, keepdims=True)


def forward(model_dir, ids):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    w = load_weights(model_dir)
    mt = cfg["model_type"]
    if mt not in ("llama", "mistral", "qwen2", "qwen3", "minicpm"):
        raise SystemExit(f"reference: model_type {mt!r} not implemented")

    hidden = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    n_layers = cfg["num_hidden_layers"]
    eps = float(cfg["rms_norm_eps"])
    n_rep = heads // kv_heads

    if mt == "qwen2":
        qkv_bias, o_bias = True, False
    else:
        qkv_bias = o_bias = bool(cfg.get("attention_bias", False))
    qk_norm = mt == "qwen3"
    if mt == "qwen2" and cfg.get("use_sliding_window"):
        raise SystemExit("reference: sliding-window attention not implemented")
    if mt == "mistral" and cfg.get("sliding_window") is not None and cfg["sliding_window"] < len(ids):
        raise SystemExit("reference: sliding-window attention not implemented")

    if mt == "minicpm":
        emb_scale = float(cfg["scale_emb"])
        res_scale = float(cfg["scale_depth"]) / math.sqrt(n_layers)
        head_div = hidden / float(cfg["dim_model_base"])
    else:
        emb_scale, res_scale, head_div = 1.0, 1.0, 1.0

    ids = np.asarray(ids, dtype=np.int64)
    T = len(ids)
    positions = np.arange(T, dtype=np.float64)
    inv_freq, attn_factor = rope_inv_freq(cfg, head_dim, seq_len=T)
    freqs = np.outer(positions, inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb) * attn_factor, np.sin(emb) * attn_factor

    causal = np.triu(np.full((T, T), -np.inf), k=1)
    scale = head_dim ** -0.5

    def linear(x, name, bias):
        y = x @ w[name + ".weight"].T
        if bias:
            y = y + w[name + ".bias"]
        return y

    h = w["model.embed_tokens.weight"][ids] * emb_scale
    for i in range(n_layers):
        p = f"model.layers.{i}"
        a = f"{p}.self_attn"
        x = rms_norm(h, w[f"{p}.input_layernorm.weight"], eps)
        q = linear(x, f"{a}.q_proj", qkv_bias).reshape(T, heads, head_dim)
        k = linear(x, f"{a}.k_proj", qkv_bias).reshape(T, kv_heads, head_dim)
        v = linear(x, f"{a}.v_proj", qkv_bias).reshape(T, kv_heads, head_dim)
        if qk_norm:
            q = rms_norm(q, w[f"{a}.q_norm.weight"], eps)
            k = rms_norm(k, w[f"{a}.k_norm.weight"], eps)
        q, k, v = (t.transpose(1, 0, 2) for t in (q, k, v))  # [H, T, D]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k = np.repeat(k, n_rep, axis=0)  # repeat_kv: q head j reads kv head j // n_rep
        v = np.repeat(v, n_rep, axis=0)
        scores = q @ k.transpose(0, 2, 1) * scale + causal[None]
        o = softmax(scores) @ v  # [H, T, D]
        o = o.transpose(1, 0, 2).reshape(T, heads * head_dim)
        h = h + linear(o, f"{a}.o_proj", o_bias) * res_scale
        x = rms_norm(h, w[f"{p}.post_attention_layernorm.weight"], eps)
        m = f"{p}.mlp"
        mlp = linear(silu(linear(x, f"{m}.gate_proj", False)) * linear(x, f"{m}.up_proj", False), f"{m}.down_proj", False)
        h = h + mlp * res_scale
    h = rms_norm(h, w["model.norm.weight"], eps)
    lm_head = w.get("lm_head.weight")
    if lm_head is None or cfg.get("tie_word_embeddings", False):
        lm_head = w["model.embed_tokens.weight"]
    return (h / head_div) @ lm_head.T


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__.split("\n\n")[1])
    model_dir, id_list, out = sys.argv[1:]
    ids = [int(t) for t in id_list.split(",") if t.strip()]
    logits = forward(model_dir, ids)
    np.ascontiguousarray(logits, dtype="<f4").tofile(out)


if __name__ == "__main__":
    main()
