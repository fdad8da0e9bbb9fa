"""Exercises `sala serve` with the official `openai` Python client (tests/serve.rs).

usage: openai_client.py BASE_URL API_KEY
Prints one line per check; exits non-zero on the first failure.
"""
import concurrent.futures
import json
import sys
import urllib.error
import urllib.request

import openai

base, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=300)
model = client.models.list().data[0].id
question = [{"role": "user", "content": "What is the capital of France?"}]


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        sys.exit(1)


# Non-streaming, with usage.
r = client.chat.completions.create(model=model, messages=question, temperature=0)
check("non-streaming answer", r.choices[0].message.content == "The capital of France is Paris.", r.choices[0].message.content)
check("finish_reason stop", r.choices[0].finish_reason == "stop", r.choices[0].finish_reason)
check("usage counts", r.usage.prompt_tokens == 37 and r.usage.completion_tokens == 8 and r.usage.total_tokens == 45, str(r.usage))

# Streaming with usage in a final chunk.
chunks = list(client.chat.completions.create(model=model, messages=question, temperature=0, stream=True, stream_options={"include_usage": True}))
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check("streamed answer", text == "The capital of France is Paris.", text)
check("streamed finish_reason", [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop")
check("streamed usage", chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8 and not chunks[-1].choices, str(chunks[-1]))

# Stop sequences end the answer and are not echoed; max_tokens gives finish_reason length.
r = client.chat.completions.create(model=model, messages=question, temperature=0, stop=[" Paris", "zzz"])
check("stop sequence", r.choices[0].message.content == "The capital of France is" and r.choices[0].finish_reason == "stop", repr(r.choices[0].message.content))
r = client.chat.completions.create(model=model, messages=question, temperature=0, max_tokens=3)
check("max_tokens", r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length", str(r.usage))
r = client.chat.completions.create(model=model, messages=question, temperature=0, logit_bias={"504": -100}, max_tokens=8)
check("logit_bias", not r.choices[0].message.content.startswith("The capital"), r.choices[0].message.content)

# Tools round trip: a forced call comes back parsed into tool_calls (also streamed), the tool's
# result goes back in, and the model answers in text.
# (Keys in sorted order: the server passes tools on in the client's order, and this is the order
# in which the 135M test model then writes a call rather than copying the schema.)
weather = [{"function": {"description": "Get the current weather for a city", "name": "get_weather",
            "parameters": {"properties": {"city": {"type": "string"}}, "required": ["city"], "type": "object"}}, "type": "function"}]
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
named = {"type": "function", "function": {"name": "get_weather"}}
r = client.chat.completions.create(model=model, messages=ask, temperature=0, max_tokens=60, tools=weather, tool_choice=named)
m = r.choices[0].message
check("tool call parsed", r.choices[0].finish_reason == "tool_calls" and m.content is None and len(m.tool_calls) == 1
      and m.tool_calls[0].function.name == "get_weather" and m.tool_calls[0].id.startswith("call_"), str(r))
arguments = json.loads(m.tool_calls[0].function.arguments)
check("tool call arguments are a JSON object", isinstance(arguments, dict), m.tool_calls[0].function.arguments)
chunks = list(client.chat.completions.create(model=model, messages=ask, temperature=0, max_tokens=60, tools=weather, tool_choice=named, stream=True))
deltas = [c.choices[0].delta for c in chunks if c.choices]
streamed = [t for d in deltas for t in (d.tool_calls or [])]
check("streamed tool call", len(streamed) == 1 and streamed[0].function.name == "get_weather"
      and json.loads(streamed[0].function.arguments) == arguments and chunks[-1].choices[0].finish_reason == "tool_calls", str(streamed))
followup = ask + [
    {"role": "assistant", "content": None, "tool_calls": [{"id": m.tool_calls[0].id, "type": "function",
     "function": {"name": "get_weather", "arguments": m.tool_calls[0].function.arguments}}]},
    {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": json.dumps({"city": "Paris", "temperature_c": 21, "sky": "sunny"})},
]
r = client.chat.completions.create(model=model, messages=followup, temperature=0, max_tokens=40, tools=weather)
check("answer after the tool result", r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.content
      and not r.choices[0].message.tool_calls and r.usage.prompt_tokens > 150, repr(r.choices[0].message.content))
r = client.chat.completions.create(model=model, messages=ask, temperature=0, max_tokens=20, tools=weather, tool_choice="none")
check("tool_choice none", not r.choices[0].message.tool_calls and r.choices[0].message.content, str(r.choices[0].message))

# Errors arrive in OpenAI's schema with the right status.
for name, kwargs, status in [
    ("unknown model", dict(model="nope", messages=question), 404),
    ("bad temperature", dict(model=model, messages=question, temperature="hot"), 400),
    ("too many stops", dict(model=model, messages=question, stop=["a", "b", "c", "d", "e"]), 400),
    ("context overflow", dict(model=model, messages=question, max_tokens=10**7), 400),
    ("tool_choice names no tool", dict(model=model, messages=question, tools=weather, tool_choice={"type": "function", "function": {"name": "nope"}}), 400),
    ("tool without a name", dict(model=model, messages=question, tools=[{"type": "function", "function": {}}]), 400),
    ("tool_choice without tools", dict(model=model, messages=question, tool_choice="required"), 400),
    ("tool call arguments not JSON", dict(model=model, messages=question + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "not json"}}]}], tools=weather), 400),
]:
    try:
        client.chat.completions.create(**kwargs)
        check(name, False, "no error")
    except openai.APIStatusError as e:
        check(name, e.status_code == status and "message" in e.response.json()["error"], f"{e.status_code} {e.response.text}")

# A wrong key is refused.
try:
    openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).models.list()
    check("api key", False, "accepted a wrong key")
except openai.AuthenticationError:
    check("api key", True)

# A client that disconnects mid-stream frees its slot; others are served concurrently.
stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Tell me a long story."}], stream=True, max_tokens=400)
next(iter(stream))
stream.close()


def one(i):
    r = client.chat.completions.create(model=model, messages=question, temperature=0, max_tokens=8)
    return r.choices[0].message.content


with concurrent.futures.ThreadPoolExecutor(4) as pool:
    answers = list(pool.map(one, range(4)))
check("concurrent requests", all(a == "The capital of France is Paris." for a in answers), str(answers))

# Oversized and malformed bodies: JSON errors, never a crash.
def raw(body, content_type="application/json"):
    req = urllib.request.Request(base + "/v1/chat/completions", data=body, headers={"Content-Type": content_type, "Authorization": "Bearer " + key})
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())

status, body = raw(b"x" * (9 << 20))
check("oversized body", status == 413 and "error" in body, str(status))
status, body = raw(b"{\"messages\": [")
check("malformed JSON", status == 400 and body["error"]["code"] == "invalid_json", str(body))
status, body = raw(json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}).encode())
check("bad role", status == 400 and body["error"]["param"] == "messages[0].role", str(body))
print("all checks passed")
