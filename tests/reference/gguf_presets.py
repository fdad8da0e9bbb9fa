"""Writes SmolLM2's weights as GGUF files in llama.cpp's preset mixes (tests/gguf.rs), each with its
reference: the same file dequantized by gguf-py to F32.

usage: gguf_presets.py SOURCE.gguf OUT_DIR PRESET...
writes OUT_DIR/PRESET.gguf and OUT_DIR/PRESET.f32.gguf, and prints one JSON line per preset:
{"preset", "types": {type name: tensor count}, "rel_rms": {type name: relative RMS error}}.

PRESET is Q4_K_M, Q5_K_M, Q6_K, Q8_0 or Q4_0 (llama.cpp's per-tensor rules, src/llama-quant.cpp:
more bits for attn_v/ffn_down in some layers, the tied embedding as the output, and the fallback
types for rows that are not a multiple of 256), or MIX (not a llama.cpp preset: Q2_K, Q3_K and
IQ4_XS by layer on the 1536-column ffn_down, Q4_1 and IQ4_NL on the 576-column matrices).

gguf-py 0.19.0 quantizes Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0; the K-quants and IQ4 types are
quantized here by plain min/max (or max-magnitude) rounding. Any valid block encoding serves:
the reference is the file's own blocks as gguf-py dequantizes them.
"""
import json
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFValueType, GGUFWriter, quants

F32 = np.float32
KVALUES = np.array(quants.IQ4_NL.kvalues, dtype=F32)


def div(a, b):
    """a / b, 0 where b is 0."""
    a, b = np.broadcast_arrays(np.asarray(a, F32), np.asarray(b, F32))
    return np.divide(a, b, out=np.zeros(a.shape, F32), where=b != 0)


def half(x):
    """f16 values (as stored) and their f32 value."""
    h = np.asarray(x, F32).astype(np.float16)
    return h, h.astype(F32)


def signed_absmax(g):
    """The value of largest magnitude along the last axis, with its sign."""
    i = np.abs(g).argmax(-1)[..., None]
    return np.take_along_axis(g, i, -1)[..., 0]


def as_bytes(*parts):
    n = parts[0].shape[0]
    return np.concatenate([np.ascontiguousarray(p).view(np.uint8).reshape(n, -1) for p in parts], axis=1)


def pack_k_scales(sc, m):
    """Q4_K/Q5_K: eight 6-bit scales and mins in 12 bytes."""
    out = np.zeros((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    return out


def k_affine(x, levels, groups, scale_levels):
    """w ≈ d·sc·q − dmin·m per group: (d, dmin, sc, m, q) with f16 d/dmin."""
    n = x.shape[0]
    g = x.reshape(n, groups, -1)
    lo = np.minimum(g.min(-1), 0)
    scale, offs = (g.max(-1) - lo) / levels, -lo
    d16, d = half(scale.max(-1) / scale_levels)
    dmin16, dmin = half(offs.max(-1) / scale_levels)
    sc = np.clip(np.rint(div(scale, d[:, None])), 0, scale_levels).astype(np.uint8)
    m = np.clip(np.rint(div(offs, dmin[:, None])), 0, scale_levels).astype(np.uint8)
    s, o = d[:, None] * sc, dmin[:, None] * m
    q = np.clip(np.rint(div(g + o[..., None], s[..., None])), 0, levels).astype(np.uint8)
    return d16, dmin16, sc, m, q


def q4_k(x):
    d, dmin, sc, m, q = k_affine(x, 15, 8, 63)
    n = x.shape[0]
    q = q.reshape(n, 4, 2, 32)
    qs = q[:, :, 0] | (q[:, :, 1] << 4)
    return as_bytes(d, dmin, pack_k_scales(sc, m), qs)


def q5_k(x):
    d, dmin, sc, m, q = k_affine(x, 31, 8, 63)
    n = x.shape[0]
    qh = np.zeros((n, 32), np.uint8)
    for j in range(8):
        qh |= ((q[:, j] >> 4) & 1) << j
    low = (q & 15).reshape(n, 4, 2, 32)
    qs = low[:, :, 0] | (low[:, :, 1] << 4)
    return as_bytes(d, dmin, pack_k_scales(sc, m), qh, qs)


def q2_k(x):
    d, dmin, sc, m, q = k_affine(x, 3, 16, 15)
    n = x.shape[0]
    q = q.reshape(n, 2, 4, 32)  # weight 128h + 32s + l is bits 2s of byte 32h + l
    qs = q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)
    return as_bytes(sc | (m << 4), qs, d, dmin)


def q6_k(x):
    n = x.shape[0]
    g = x.reshape(n, 16, 16)
    scale = -signed_absmax(g) / 32
    d16, d = half(np.abs(scale).max(-1) / 127)
    sc = np.clip(np.rint(div(scale, d[:, None])), -128, 127).astype(np.int8)
    q = np.clip(np.rint(div(g, (d[:, None] * sc)[..., None])), -32, 31).astype(np.int16) + 32
    q = q.astype(np.uint8).reshape(n, 2, 4, 32)  # weight 128h + 32k + l
    ql = np.concatenate([(q[:, :, 0] & 15) | ((q[:, :, 2] & 15) << 4), (q[:, :, 1] & 15) | ((q[:, :, 3] & 15) << 4)], axis=2)
    qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)
    return as_bytes(ql, qh, sc, d16)


def q3_k(x):
    n = x.shape[0]
    g = x.reshape(n, 16, 16)
    scale = -signed_absmax(g) / 4
    d16, d = half(np.abs(scale).max(-1) / 32)
    sc = np.clip(np.rint(div(scale, d[:, None])), -32, 31).astype(np.int16)
    q = np.clip(np.rint(div(g, (d[:, None] * sc)[..., None])), -4, 3).astype(np.int16).reshape(n, 256)
    high = (q >= 0).astype(np.uint8)  # set: no −4
    low = np.where(q >= 0, q, q + 4).astype(np.uint8).reshape(n, 2, 4, 32)
    qs = low[:, :, 0] | (low[:, :, 1] << 2) | (low[:, :, 2] << 4) | (low[:, :, 3] << 6)
    hmask = np.zeros((n, 32), np.uint8)
    for b, bits in enumerate(high.reshape(n, 8, 32).transpose(1, 0, 2)):
        hmask |= bits << b
    u = (sc + 32).astype(np.uint8)
    scales = np.zeros((n, 12), np.uint8)
    scales[:, :8] = (u[:, :8] & 15) | ((u[:, 8:] & 15) << 4)
    for t in range(4):
        scales[:, 8:] |= ((u[:, 4 * t:4 * t + 4] >> 4) & 3) << (2 * t)
    return as_bytes(hmask, qs, scales, d16)


def iq4_nibbles(g, s):
    """The codebook entry nearest each g/s."""
    return np.abs(div(g, s)[..., None] - KVALUES).argmin(-1).astype(np.uint8)


def iq4_nl(x):
    n = x.shape[0]
    g = x.reshape(n, 32)
    d16, d = half(-signed_absmax(g) / 127)
    nib = iq4_nibbles(g, d[:, None])
    return as_bytes(d16, nib[:, :16] | (nib[:, 16:] << 4))


def iq4_xs(x):
    n = x.shape[0]
    g = x.reshape(n, 8, 32)
    scale = -signed_absmax(g) / 127
    d16, d = half(np.abs(scale).max(-1) / 31)
    ls = (np.clip(np.rint(div(scale, d[:, None])), -32, 31) + 32).astype(np.uint8)
    nib = iq4_nibbles(g, (d[:, None] * (ls.astype(F32) - 32))[..., None])
    qs = nib[..., :16] | (nib[..., 16:] << 4)
    scales_l = (ls[:, 0::2] & 15) | ((ls[:, 1::2] & 15) << 4)
    scales_h = np.zeros(n, np.uint16)
    for ib in range(8):
        scales_h |= ((ls[:, ib] >> 4) & 3).astype(np.uint16) << (2 * ib)
    return as_bytes(d16, scales_h, scales_l, qs)


OURS = {T.Q2_K: q2_k, T.Q3_K: q3_k, T.Q4_K: q4_k, T.Q5_K: q5_k, T.Q6_K: q6_k, T.IQ4_NL: iq4_nl, T.IQ4_XS: iq4_xs}
# llama.cpp's stand-ins when a row is not a multiple of 256 weights.
FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0, T.Q2_K: T.IQ4_NL, T.Q3_K: T.IQ4_NL, T.IQ4_XS: T.IQ4_NL}
# llama.cpp's LLAMA_FTYPE_MOSTLY_* (general.file_type) and each preset's default type.
PRESETS = {"Q4_K_M": (15, T.Q4_K), "Q5_K_M": (17, T.Q5_K), "Q6_K": (18, T.Q6_K), "Q8_0": (7, T.Q8_0), "Q4_0": (2, T.Q4_0), "MIX": (32, None)}


def use_more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def quantize(x, qtype):
    """Rows of x as blocks of qtype (uint8 [rows, bytes per row])."""
    rows = x.reshape(-1, x.shape[-1])
    if qtype in OURS:
        block = quants.GGML_QUANT_SIZES[qtype][0]
        return OURS[qtype](rows.reshape(-1, block)).reshape(rows.shape[0], -1)
    return quants.quantize(rows, qtype)


def tensor_type(preset, name, cols, layer, n_layer):
    """The type llama.cpp's rules give tensor `name` (MIX: see the module docstring)."""
    _, base = PRESETS[preset]
    if preset == "MIX":
        if name == "token_embd.weight":
            return T.Q8_0
        if "ffn_down" in name:
            return (T.Q2_K, T.Q3_K, T.IQ4_XS)[layer % 3]
        return T.IQ4_NL if (layer + len(name)) % 2 else T.Q4_1
    qtype = base
    if name == "token_embd.weight":  # tied: the output's rule
        qtype = T.Q8_0 if cols % quants.GGML_QUANT_SIZES[base][0] else (base if base == T.Q8_0 else T.Q6_K)
    elif preset in ("Q4_K_M", "Q5_K_M") and ("attn_v" in name or "ffn_down" in name) and use_more_bits(layer, n_layer):
        qtype = T.Q6_K
    if cols % 256 and qtype in FALLBACK:
        qtype = FALLBACK[qtype]
    return qtype


def writer_like(reader, path, file_type):
    w = GGUFWriter(path, "llama")
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        value = file_type if field.name == "general.file_type" else field.contents()
        kind = field.types[0]
        w.add_key_value(field.name, value, kind, sub_type=field.types[-1] if kind == GGUFValueType.ARRAY else None)
    return w


def main():
    source, out, presets = sys.argv[1], sys.argv[2], sys.argv[3:]
    reader = GGUFReader(source)
    n_layer = int(reader.fields["llama.block_count"].contents())
    weights = [(t.name, t.tensor_type, quants.dequantize(t.data, t.tensor_type).astype(F32)) for t in reader.tensors]
    for preset in presets:
        file_type, _ = PRESETS[preset]
        quantized = writer_like(reader, f"{out}/{preset}.gguf", file_type)
        reference = writer_like(reader, f"{out}/{preset}.f32.gguf", 0)
        types, err, norm = {}, {}, {}
        for name, stored, x in weights:
            if x.ndim == 1:
                quantized.add_tensor(name, x)
                reference.add_tensor(name, x)
                types["F32"] = types.get("F32", 0) + 1
                continue
            layer = int(name.split(".")[1]) if name.startswith("blk.") else 0
            qtype = tensor_type(preset, name, x.shape[-1], layer, n_layer)
            blocks = quantize(x, qtype)
            back = quants.dequantize(blocks, qtype).astype(F32).reshape(x.shape)
            quantized.add_tensor(name, blocks, raw_dtype=qtype)
            reference.add_tensor(name, back)
            types[qtype.name] = types.get(qtype.name, 0) + 1
            err[qtype.name] = err.get(qtype.name, 0.0) + float(((back - x) ** 2).sum())
            norm[qtype.name] = norm.get(qtype.name, 0.0) + float((x**2).sum())
        for w in (quantized, reference):
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
        rel = {k: (err[k] / norm[k]) ** 0.5 for k in err}
        print(json.dumps({"preset": preset, "types": types, "rel_rms": rel}), flush=True)


main()
