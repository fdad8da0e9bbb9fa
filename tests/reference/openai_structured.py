"""Structured output from `sala serve` through the official `openai` client (tests/serve.rs):
`response_format` (a pydantic model via `parse()`, `json_object`) and `tool_choice="required"`
always give output that parses, sampled or greedy, streamed or not; the same requests without
constraints do not.

usage: openai_structured.py BASE_URL API_KEY
Prints one line per check; exits non-zero on the first failure.
"""
import json
import sys

import openai
import pydantic

base, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=300)
model = client.models.list().data[0].id


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        sys.exit(1)


# Bounded lengths and range: a 135M model, sampling, may otherwise run a string or a list (and
# greedy, repeat list items) until max_tokens; the grammar keeps the output valid, not short.
Name = pydantic.constr(max_length=40)


class City(pydantic.BaseModel):
    name: Name
    country: Name
    population: int = pydantic.Field(ge=0, le=100_000_000)
    landmarks: list[Name] = pydantic.Field(max_length=3)


def is_city(text):
    try:
        City.model_validate_json(text or "")
        return True
    except pydantic.ValidationError:
        return False


questions = ["Tell me about Paris.", "Describe the city of Tokyo."]

# The same questions without a format: the small model answers in prose, which is no City.
free = [client.chat.completions.create(model=model, messages=[{"role": "user", "content": q}], temperature=0, max_tokens=30)
        for q in questions]
check("without response_format the answers are not City objects", not any(is_city(r.choices[0].message.content) for r in free),
      repr([r.choices[0].message.content for r in free]))

# With it, parse() returns a City every time: greedy, and sampled at temperature 0.7 with seeds.
for q in questions:
    for temperature, seed in [(0, None), (0.7, 1), (0.7, 2)]:
        r = client.beta.chat.completions.parse(model=model, messages=[{"role": "user", "content": q}], response_format=City,
                                               temperature=temperature, seed=seed, max_tokens=200)
        city = r.choices[0].message.parsed
        check(f"parse() gives a City ({q!r}, temperature {temperature}, seed {seed})",
              isinstance(city, City) and r.choices[0].finish_reason == "stop", repr(r.choices[0].message.content))

# Streamed, the deltas join into the same object the whole answer gives.
whole = client.beta.chat.completions.parse(model=model, messages=[{"role": "user", "content": questions[0]}], response_format=City,
                                           temperature=0, max_tokens=200).choices[0].message.content
with client.beta.chat.completions.stream(model=model, messages=[{"role": "user", "content": questions[0]}], response_format=City,
                                         temperature=0, max_tokens=200) as stream:
    final = stream.get_final_completion()
check("streamed parse() gives the same City", final.choices[0].message.parsed == City.model_validate_json(whole), repr(final.choices[0].message.content))

# json_object: any JSON object.
r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "List three colours."}],
                                   response_format={"type": "json_object"}, temperature=0, max_tokens=120)
try:
    value = json.loads(r.choices[0].message.content)
except ValueError:
    value = None
check("json_object gives a JSON object", isinstance(value, dict) and r.choices[0].finish_reason == "stop", repr(r.choices[0].message.content))

# tool_choice="required": a parseable call with valid arguments, whatever is asked, streamed too.
weather = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                           "required": ["city", "unit"], "additionalProperties": False}}},
           {"type": "function", "function": {"name": "get_time", "description": "Current time in a time zone",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"], "additionalProperties": False}}}]
asks = ["What's the weather in Paris?", "Tell me a joke.", "Hi!"]
free_calls = [client.chat.completions.create(model=model, messages=[{"role": "user", "content": q}], tools=weather, temperature=0, max_tokens=30)
              for q in asks]
check("with tool_choice auto the small model does not always call", not all(r.choices[0].message.tool_calls for r in free_calls),
      repr([r.choices[0].message for r in free_calls]))


def valid_call(call):
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        return set(args) == {"city", "unit"} and isinstance(args["city"], str) and args["unit"] in ("celsius", "fahrenheit")
    return call.function.name == "get_time" and set(args) == {"zone"} and isinstance(args["zone"], str)


for q in asks:
    for temperature, seed in [(0, None), (0.7, 3)]:
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": q}], tools=weather, tool_choice="required",
                                           parallel_tool_calls=False, temperature=temperature, seed=seed, max_tokens=120)
        m = r.choices[0].message
        check(f"required gives a valid call ({q!r}, temperature {temperature})",
              r.choices[0].finish_reason == "tool_calls" and m.tool_calls and all(valid_call(c) for c in m.tool_calls), repr(m))
    chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": q}], tools=weather, tool_choice="required",
                                                 temperature=0, max_tokens=120, stream=True))
    calls = [t for c in chunks if c.choices for t in (c.choices[0].delta.tool_calls or [])]
    check(f"streamed required call ({q!r})", calls and all(valid_call(c) for c in calls) and chunks[-1].choices[0].finish_reason == "tool_calls",
          repr(calls))

# parallel_tool_calls=false: exactly one call.
r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Weather in Paris and time in Tokyo?"}], tools=weather,
                                   tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=120)
check("one call without parallel_tool_calls", len(r.choices[0].message.tool_calls or []) == 1, repr(r.choices[0].message))

# What cannot be enforced is refused, naming the field.
for name, extra, param in [
    ("unknown response_format type", dict(response_format={"type": "xml"}), "response_format.type"),
    ("schema the engine cannot compile", dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}}), "response_format"),
    ("json_schema without an object", dict(response_format={"type": "json_schema", "json_schema": "x"}), "response_format.json_schema"),
]:
    try:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, **extra)
        check(name, False, "accepted")
    except openai.BadRequestError as e:
        check(name, e.status_code == 400 and e.body.get("param") == param, str(e.body))

print("structured output checks passed")
