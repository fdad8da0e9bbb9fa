"""Checks sala's config-default tables against the transformers config classes themselves.

Reads a JSON list of {"family", "key", "kind", "value", "source"} on stdin (kind: json, same_as,
computed, off, required) and instantiates each family's class with nothing but what the check
needs; prints one line per key and `passed` at the end if every default agrees.
"""
import json
import sys

import transformers

CLASSES = {
    "llama": transformers.LlamaConfig,
    "mistral": transformers.MistralConfig,
    "qwen2": transformers.Qwen2Config,
    "qwen3": transformers.Qwen3Config,
}


def same(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


def check(entry):
    cls = CLASSES[entry["family"]]
    key, kind, value = entry["key"], entry["kind"], entry["value"]
    if kind == "required" or entry["source"].startswith("not in "):
        return None
    if kind == "json":
        # Qwen keeps sliding_window only while use_sliding_window is on.
        kwargs = {"use_sliding_window": True} if key == "sliding_window" and entry["family"].startswith("qwen") else {}
        got = getattr(cls(**kwargs), key)
        return same(got, value), got
    if kind == "same_as":
        got = getattr(cls(**{value: 7}), key)
        return got == 7, got
    if kind == "off":
        got = getattr(cls(), key, None)
        return got is None, got
    if key == "head_dim":
        c = cls(hidden_size=64, num_attention_heads=4)
        got = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return got == 16, got
    if key == "rope_theta":
        got = cls().rope_theta
        return same(got, 10000.0), got
    if key == "tie_word_embeddings":
        got = cls().tie_word_embeddings
        return got is value.startswith("true"), got
    raise SystemExit(f"no check for computed key {key}")


failures = 0
checked = 0
for entry in json.load(sys.stdin):
    result = check(entry)
    if result is None:
        continue
    ok, got = result
    checked += 1
    print(f"{'ok  ' if ok else 'FAIL'} {entry['family']}.{entry['key']}: sala {entry['kind']} {entry['value']!r}, transformers {got!r}")
    failures += not ok
print(f"transformers {transformers.__version__}: {checked} defaults checked, {failures} differ")
if failures == 0 and checked > 0:
    print("passed")
