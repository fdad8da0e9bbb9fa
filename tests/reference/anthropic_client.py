"""`sala serve`'s Anthropic Messages API with the official `anthropic` client (tests/serve_apis.rs):
answers equal the chat endpoint's for the same conversation (system prompt, several turns), stop
sequences and max_tokens give their stop reasons, a tool_use round trip with a tool_result,
streaming (text and tools, events in Anthropic's order), count_tokens, the beta path, typed
errors, and the API key as x-api-key or a bearer token.

usage: anthropic_client.py BASE_URL API_KEY
Prints one line per check; exits non-zero on the first failure.
"""
import json
import sys
import urllib.error
import urllib.request

import anthropic
import openai

base, key = sys.argv[1], sys.argv[2]
client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=300)
chat = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=300)
model = chat.models.list().data[0].id
question = [{"role": "user", "content": "What is the capital of France?"}]


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        sys.exit(1)


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def chat_answer(messages, **kwargs):
    r = chat.chat.completions.create(model=model, messages=messages, temperature=0, **kwargs)
    return r.choices[0].message.content, r.usage


# A plain question: the chat endpoint's answer, with Anthropic's usage and stop reason.
r = client.messages.create(model=model, max_tokens=40, temperature=0, messages=question)
want, usage = chat_answer(question, max_tokens=40)
plain_usage = usage
check("answer", text_of(r) == want == "The capital of France is Paris." and r.content[0].type == "text", repr(text_of(r)))
check("message shape", r.type == "message" and r.role == "assistant" and r.id.startswith("msg_") and r.model == model, str(r))
check("end_turn", r.stop_reason == "end_turn" and r.stop_sequence is None, r.stop_reason)
check("usage", r.usage.input_tokens + r.usage.cache_read_input_tokens == usage.prompt_tokens and r.usage.output_tokens == usage.completion_tokens, str(r.usage))
big = client.messages.create(model=model, max_tokens=1_000_000, temperature=0, messages=question)
check("max_tokens past the context is a cap", text_of(big) == want and big.stop_reason == "end_turn", repr(text_of(big)))
counted = client.messages.count_tokens(model=model, messages=question)
check("count_tokens", counted.input_tokens == usage.prompt_tokens, str(counted))

# A system prompt, as a string or as text blocks, and several turns: what the chat endpoint says.
system = "You are a geography teacher. Answer in one short sentence."
turns = question + [{"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And of Italy?"}]
want, usage = chat_answer([{"role": "system", "content": system}] + turns, max_tokens=30)
for name, sys_prompt in [("string", system), ("blocks", [{"type": "text", "text": "You are a geography teacher. "}, {"type": "text", "text": "Answer in one short sentence."}])]:
    r = client.messages.create(model=model, max_tokens=30, temperature=0, system=sys_prompt, messages=turns)
    check(f"system ({name}) and turns", text_of(r) == want and r.usage.input_tokens + r.usage.cache_read_input_tokens == usage.prompt_tokens, repr(text_of(r)))
blocks = [{"role": "user", "content": [{"type": "text", "text": "What is the capital "}, {"type": "text", "text": "of France?"}]}]
check("content blocks", text_of(client.messages.create(model=model, max_tokens=40, temperature=0, messages=blocks)) == "The capital of France is Paris.")

# Stop sequences and max_tokens.
r = client.messages.create(model=model, max_tokens=40, temperature=0, messages=question, stop_sequences=[" Paris", "zzz"])
check("stop_sequence", text_of(r) == "The capital of France is" and r.stop_reason == "stop_sequence" and r.stop_sequence == " Paris", f"{text_of(r)!r} {r.stop_reason} {r.stop_sequence!r}")
r = client.messages.create(model=model, max_tokens=3, temperature=0, messages=question)
check("max_tokens", r.stop_reason == "max_tokens" and r.usage.output_tokens == 3, f"{r.stop_reason} {r.usage}")

# A tool_use round trip: the forced call comes back as a tool_use block; its tool_result goes
# back in and the model answers in text.
weather = [{"name": "get_weather", "description": "Get the current weather for a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
forced = {"type": "tool", "name": "get_weather"}
r = client.messages.create(model=model, max_tokens=60, temperature=0, messages=ask, tools=weather, tool_choice=forced)
calls = [b for b in r.content if b.type == "tool_use"]
check("tool_use", r.stop_reason == "tool_use" and len(calls) == 1 and calls[0].name == "get_weather" and calls[0].id.startswith("toolu_")
      and isinstance(calls[0].input, dict) and isinstance(calls[0].input.get("city"), str), str(r.content))
c = chat.chat.completions.create(model=model, messages=ask, temperature=0, max_tokens=60, tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                 tools=[{"type": "function", "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]}} for t in weather])
check("tool input is the chat endpoint's call", calls[0].input == json.loads(c.choices[0].message.tool_calls[0].function.arguments), f"{calls[0].input} vs {c.choices[0].message.tool_calls}")
followup = ask + [
    {"role": "assistant", "content": r.content},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": '{"temperature_c": 21, "sky": "sunny"}'}]},
]
r2 = client.messages.create(model=model, max_tokens=40, temperature=0, messages=followup, tools=weather)
check("answer after the tool_result", r2.stop_reason in ("end_turn", "max_tokens") and text_of(r2) and not [b for b in r2.content if b.type == "tool_use"]
      and r2.usage.input_tokens + r2.usage.cache_read_input_tokens > 150, f"{text_of(r2)!r} {r2.usage}")
r3 = client.messages.create(model=model, max_tokens=20, temperature=0, messages=ask, tools=weather, tool_choice={"type": "none"})
check("tool_choice none", r3.stop_reason != "tool_use" and text_of(r3), str(r3.content))
# One call: with parallel calls allowed, greedy SmolLM2 starts a second that max_tokens cuts
# (then the stop reason is max_tokens, which tests/reference/cut_calls.py checks).
r4 = client.messages.create(model=model, max_tokens=60, temperature=0, messages=ask, tools=weather,
                            tool_choice={"type": "any", "disable_parallel_tool_use": True})
check("tool_choice any", r4.stop_reason == "tool_use" and [b.name for b in r4.content if b.type == "tool_use"][:1] == ["get_weather"], str(r4.content))

# Streaming text: the same answer, events in Anthropic's order.
with client.messages.stream(model=model, max_tokens=40, temperature=0, messages=question) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
check("streamed text", streamed == "The capital of France is Paris." and text_of(final) == streamed, repr(streamed))
check("streamed stop and usage", final.stop_reason == "end_turn" and final.usage.output_tokens == plain_usage.completion_tokens
      and final.usage.input_tokens + final.usage.cache_read_input_tokens == plain_usage.prompt_tokens, str(final.usage))


def event_order_ok(events):
    types = [e.type for e in events]
    if types[0] != "message_start" or types[-2:] != ["message_delta", "message_stop"]:
        return False
    index, open_ = 0, None
    for e in events[1:-2]:
        if e.type == "ping":
            continue
        if e.type == "content_block_start":
            if open_ is not None or e.index != index:
                return False
            open_ = e.index
        elif e.type == "content_block_delta":
            if e.index != open_:
                return False
        elif e.type == "content_block_stop":
            if e.index != open_:
                return False
            open_, index = None, index + 1
        else:
            return False
    return open_ is None and index > 0


events = list(client.messages.create(model=model, max_tokens=40, temperature=0, messages=question, stream=True))
check("event order (text)", event_order_ok(events) and events[0].message.usage.output_tokens == 0
      and "".join(e.delta.text for e in events if e.type == "content_block_delta") == "The capital of France is Paris."
      and events[-2].delta.stop_reason == "end_turn", str([e.type for e in events]))

# Streaming a tool call: input_json_delta, the same input as unstreamed.
events = list(client.messages.create(model=model, max_tokens=60, temperature=0, messages=ask, tools=weather, tool_choice=forced, stream=True))
starts = [e.content_block for e in events if e.type == "content_block_start"]
partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
check("event order (tool)", event_order_ok(events) and [b.type for b in starts] == ["tool_use"] and starts[0].name == "get_weather"
      and json.loads(partial) == calls[0].input and events[-2].delta.stop_reason == "tool_use", str([e.type for e in events]))
with client.messages.stream(model=model, max_tokens=60, temperature=0, messages=ask, tools=weather, tool_choice=forced) as s:
    final = s.get_final_message()
check("streamed tool_use", [(b.type, b.name, b.input) for b in final.content if b.type == "tool_use"] == [("tool_use", "get_weather", calls[0].input)], str(final.content))

# The beta client's path (?beta=true).
r = client.beta.messages.create(model=model, max_tokens=40, temperature=0, messages=question)
check("beta path", text_of(r) == "The capital of France is Paris.", repr(text_of(r)))

# Errors: Anthropic's shape with the status the SDK maps to its typed exceptions.
for name, kwargs, exc, kind in [
    ("bad temperature", dict(temperature=1.5), anthropic.BadRequestError, "invalid_request_error"),
    ("unknown model", dict(model="nope"), anthropic.NotFoundError, "not_found_error"),
    ("image block", dict(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]),
     anthropic.BadRequestError, "invalid_request_error"),
    ("server tool", dict(tools=[{"type": "web_search_20250305", "name": "web_search"}]), anthropic.BadRequestError, "invalid_request_error"),
]:
    try:
        client.messages.create(**{"model": model, "max_tokens": 10, "messages": question, **kwargs})
        check(name, False, "no error")
    except exc as e:
        check(name, e.body["type"] == "error" and e.body["error"]["type"] == kind and e.body["error"]["message"], str(e.body))
try:
    with client.messages.stream(model=model, max_tokens=10, messages=question, temperature=1.5) as s:
        s.get_final_message()
    check("streamed request error", False, "no error")
except anthropic.BadRequestError as e:
    check("streamed request error", e.body["error"]["type"] == "invalid_request_error", str(e.body))

# The API key: x-api-key (the SDK's default) or a bearer token; a wrong one is refused.
try:
    anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.create(model=model, max_tokens=5, messages=question)
    check("wrong x-api-key", False, "no error")
except anthropic.AuthenticationError as e:
    check("wrong x-api-key", e.status_code == 401 and e.body["error"]["type"] == "authentication_error", str(e.body))
try:
    urllib.request.urlopen(urllib.request.Request(base + "/v1/messages", data=json.dumps({"max_tokens": 5, "messages": question}).encode(),
                                                  headers={"content-type": "application/json"}))
    check("no key", False, "no error")
except urllib.error.HTTPError as e:
    body = json.loads(e.read())
    check("no key", e.code == 401 and body["type"] == "error" and body["error"]["type"] == "authentication_error", str(body))
try:
    anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.count_tokens(model=model, messages=question)
    check("count_tokens needs the key", False, "no error")
except anthropic.AuthenticationError:
    check("count_tokens needs the key", True)
bearer = anthropic.Anthropic(base_url=base, auth_token=key, max_retries=0)
check("bearer token", text_of(bearer.messages.create(model=model, max_tokens=40, temperature=0, messages=question)) == "The capital of France is Paris.")

print("anthropic client checks passed")
