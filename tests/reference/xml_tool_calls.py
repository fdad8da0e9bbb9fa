"""Forced calls in MiniCPM-SALA's own `minicpm4_xml` syntax (tests/structured_tools.rs): a tiny
MiniCPM-SALA with random weights and the MiniCPM4 tokenizer, sampled at temperature 1, so only the
grammar makes an answer valid. Through the official `openai` client (`tool_choice` "required" and
a named function) and the official `anthropic` client (`tool_choice` any and tool), plain and
streamed, for several seeds: every answer is one call whose arguments are valid under the schema
(a bounded string, a string with a pattern, an integer with bounds, an enum). Then anthropic's
`messages.parse` with a pydantic model, plain and streamed: every answer parses.

usage: xml_tool_calls.py BASE_URL API_KEY
Prints one line per check and a summary; exits non-zero on the first failure.
"""
import json
import re
import sys

from typing import Literal

import anthropic
import openai
import pydantic

from tool_stream import streamed_calls

base, key = sys.argv[1], sys.argv[2]
oa = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=300)
an = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=300)
model = oa.models.list().data[0].id

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 12},
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "seats": {"type": "integer", "minimum": 1, "maximum": 9},
        "cabin": {"type": "string", "enum": ["economy", "business"]},
    },
    "required": ["city", "seats", "cabin"],
}
TOOLS = [
    {"name": "book_flight", "description": "Book a flight", "schema": SCHEMA},
    {"name": "cancel", "description": "Cancel a booking", "schema": {"type": "object", "properties": {"ref": {"type": "string", "maxLength": 6}}, "required": ["ref"]}},
]
OPENAI_TOOLS = [{"type": "function", "function": {"name": t["name"], "description": t["description"], "parameters": t["schema"]}} for t in TOOLS]
ANTHROPIC_TOOLS = [{"name": t["name"], "description": t["description"], "input_schema": t["schema"]} for t in TOOLS]
MESSAGES = [{"role": "user", "content": "Book me two business seats to Oslo."}]
MAX_TOKENS = 200
SEEDS = [1, 2, 3]


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        sys.exit(1)


def problems(name, args):
    """What makes `args` invalid for function `name` (by hand: JSON Schema's rules for these keywords)."""
    schema = next(t["schema"] for t in TOOLS if t["name"] == name)
    if not isinstance(args, dict):
        return [f"arguments {args!r} are not an object"]
    found = [f"missing {k}" for k in schema["required"] if k not in args]
    found += [f"undeclared {k}" for k in args if k not in schema["properties"]]
    for k, v in args.items():
        s = schema["properties"].get(k, {})
        if s.get("type") == "string":
            if not isinstance(v, str):
                found.append(f"{k}={v!r} is no string")
                continue
            if not s.get("minLength", 0) <= len(v) <= s.get("maxLength", len(v)):
                found.append(f"{k}={v!r} has length {len(v)}")
            if "pattern" in s and not re.search(s["pattern"], v):
                found.append(f"{k}={v!r} does not match {s['pattern']}")
            if "enum" in s and v not in s["enum"]:
                found.append(f"{k}={v!r} not in {s['enum']}")
        if s.get("type") == "integer" and (not isinstance(v, int) or isinstance(v, bool) or not s["minimum"] <= v <= s["maximum"]):
            found.append(f"{k}={v!r} is no integer in [{s['minimum']}, {s['maximum']}]")
    return found


tally = {"answers": 0, "valid": 0, "tokens": []}


def judge(label, finish, calls, used, want_finish, only=None):
    """One answer: exactly one call (to `only`, when named), valid, finished as a call."""
    tally["answers"] += 1
    bad = [] if len(calls) == 1 else [f"{len(calls)} calls"]
    for name, args in calls:
        bad += problems(name, args) + ([f"called {name}"] if only and name != only else [])
    bad += [] if finish == want_finish else [f"finish {finish}"]
    check(label, not bad, f"{bad} {calls}")
    tally["valid"] += 1
    tally["tokens"].append(used)
    print(f"     {calls[0][0]} {json.dumps(calls[0][1], ensure_ascii=False)} ({used} tokens)", flush=True)


def openai_plain(**kw):
    r = oa.chat.completions.create(**kw)
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in r.choices[0].message.tool_calls or []]
    return r.choices[0].finish_reason, calls, r.usage.completion_tokens


def openai_streamed(**kw):
    finish, calls, used = streamed_calls(oa, **kw)
    return finish, [(n, json.loads(a)) for n, a in calls], used


def anthropic_message(m):
    calls = [(b.name, b.input) for b in m.content if b.type == "tool_use"]
    return m.stop_reason, calls, m.usage.output_tokens


for seed in SEEDS:
    for choice, only in [("required", None), ({"type": "function", "function": {"name": "book_flight"}}, "book_flight")]:
        kw = dict(model=model, messages=MESSAGES, tools=OPENAI_TOOLS, tool_choice=choice, parallel_tool_calls=False,
                  temperature=1.0, seed=seed, max_tokens=MAX_TOKENS)
        what = "required" if only is None else "named"
        judge(f"openai {what}, seed {seed}", *openai_plain(**kw), "tool_calls", only)
        judge(f"openai {what}, streamed, seed {seed}", *openai_streamed(**kw), "tool_calls", only)
    for choice, only in [({"type": "any", "disable_parallel_tool_use": True}, None),
                         ({"type": "tool", "name": "book_flight", "disable_parallel_tool_use": True}, "book_flight")]:
        # Anthropic's API takes no seed: the answers differ run to run, and each must be valid.
        kw = dict(model=model, messages=MESSAGES, tools=ANTHROPIC_TOOLS, tool_choice=choice, temperature=1.0, max_tokens=MAX_TOKENS)
        judge(f"anthropic {choice['type']}, try {seed}", *anthropic_message(an.messages.create(**kw)), "tool_use", only)
        with an.messages.stream(**kw) as stream:
            judge(f"anthropic {choice['type']}, streamed, try {seed}", *anthropic_message(stream.get_final_message()), "tool_use", only)



class Booking(pydantic.BaseModel):
    """Fields a random model must still end (the anthropic client moves bounds such as maxLength
    into descriptions before it sends a schema, so only their shape is enforced)."""
    cabin: Literal["economy", "business"]
    window: bool
    meal: Literal["vegetarian", "standard", "none"]


for seed in SEEDS:
    kw = dict(model=model, max_tokens=MAX_TOKENS, temperature=1.0, messages=MESSAGES, output_format=Booking)
    r = an.messages.parse(**kw)
    check(f"anthropic messages.parse, try {seed}", isinstance(r.parsed_output, Booking) and r.stop_reason == "end_turn", repr(r.content))
    with an.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    check(f"anthropic messages.parse, streamed, try {seed}", isinstance(final.parsed_output, Booking) and final.stop_reason == "end_turn", repr(final.content))

t = tally["tokens"]
print(f"{tally['valid']} of {tally['answers']} answers valid calls; tokens per answer min {min(t)}, max {max(t)}, mean {sum(t) / len(t):.1f}")
print("xml tool call checks passed")
