"""Schemas are strict for generation (tests/structured_tools.rs): through the official `openai`
client on SmolLM2, `tool_choice="required"` with a weather tool whose schema leaves out
`additionalProperties` gives a call with exactly its three keys, once each, ending by itself
within 80 tokens, plain and streamed, greedy and sampled; the same schema with `"additionalProperties": true`
still compiles and still gives a call.

usage: openai_strict_tools.py BASE_URL API_KEY
Prints one line per check; exits non-zero on the first failure.
"""
import json
import sys

import openai

from tool_stream import streamed_calls

base, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=300)
model = client.models.list().data[0].id


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        sys.exit(1)


def weather(extra=None):
    parameters = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"},
        },
        "required": ["city", "unit", "days"],
    }
    parameters.update(extra or {})
    return [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city", "parameters": parameters}}]


messages = [{"role": "user", "content": "What will the weather be in Oslo for the next 3 days?"}]


def pairs(arguments):
    """The object's key/value pairs as written, so a repeated key is seen."""
    return json.loads(arguments, object_pairs_hook=list)


def valid(arguments):
    written = pairs(arguments)
    keys = [k for k, _ in written]
    args = dict(written)
    return (sorted(keys) == ["city", "days", "unit"] and isinstance(args["city"], str)
            and args["unit"] in ("celsius", "fahrenheit") and isinstance(args["days"], int) and not isinstance(args["days"], bool))


for temperature, seed in [(0, None), (1.0, 1), (1.0, 2), (1.0, 3)]:
    request = dict(model=model, messages=messages, tools=weather(), tool_choice="required",
                   parallel_tool_calls=False, max_tokens=80, temperature=temperature, seed=seed)
    r = client.chat.completions.create(**request)
    calls = r.choices[0].message.tool_calls or []
    check(f"required, temperature {temperature}, seed {seed}: one valid call, finish tool_calls, within 80 tokens",
          r.choices[0].finish_reason == "tool_calls" and len(calls) == 1 and calls[0].function.name == "get_weather"
          and valid(calls[0].function.arguments) and r.usage.completion_tokens < 80,
          f"{r.choices[0].finish_reason} {[(c.function.name, c.function.arguments) for c in calls]} {r.usage.completion_tokens} tokens")
    finish, calls, used = streamed_calls(client, **request)
    check(f"required, streamed, temperature {temperature}, seed {seed}: the same",
          finish == "tool_calls" and len(calls) == 1 and calls[0][0] == "get_weather" and valid(calls[0][1]) and used < 80,
          f"{finish} {calls} {used} tokens")
    print(f"     arguments {calls[0][1] if calls else None}, {used} tokens", flush=True)

# With parallel calls allowed (the client's default) the model may start a second call that
# max_tokens cuts: every call returned is whole and valid, and no call text leaks into content.
for temperature, seed in [(0, None), (1.0, 1)]:
    request = dict(model=model, messages=messages, tools=weather(), tool_choice="required", max_tokens=80, temperature=temperature, seed=seed)
    r = client.chat.completions.create(**request)
    calls = r.choices[0].message.tool_calls or []
    check(f"required, parallel allowed, temperature {temperature}, seed {seed}: every call returned is valid",
          len(calls) >= 1 and all(c.function.name == "get_weather" and valid(c.function.arguments) for c in calls)
          and r.choices[0].finish_reason in ("tool_calls", "length") and not r.choices[0].message.content,
          f"{r.choices[0].finish_reason} {[(c.function.name, c.function.arguments) for c in calls]} {r.choices[0].message.content!r}")
    finish, calls, used = streamed_calls(client, **request)
    check(f"required, parallel allowed, streamed, temperature {temperature}, seed {seed}: the same",
          len(calls) >= 1 and all(n == "get_weather" and valid(a) for n, a in calls) and finish in ("tool_calls", "length"),
          f"{finish} {calls} {used} tokens")

# Extra properties allowed: the schema compiles (an answer, not a 400); a call that completes
# has the required keys (one free to wander may also run to max_tokens).
for extra in [{"additionalProperties": True}, {"additionalProperties": {"type": "string"}}]:
    r = client.chat.completions.create(model=model, messages=messages, tools=weather(extra), tool_choice="required", max_tokens=80, temperature=0)
    calls = r.choices[0].message.tool_calls or []
    args = dict(pairs(calls[0].function.arguments)) if calls else {}
    check(f"{extra} compiles; a finished call has the required keys",
          r.choices[0].finish_reason == "length" or (len(calls) == 1 and {"city", "unit", "days"} <= set(args) and args["unit"] in ("celsius", "fahrenheit")),
          f"{r.choices[0].finish_reason} {[(c.function.name, c.function.arguments) for c in calls]}")

print("strict tool checks passed")
