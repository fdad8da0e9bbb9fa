"""Anthropic structured output from `sala serve` through the official `anthropic` client
(tests/serve_apis.rs): `messages.parse(output_format=…)` with a pydantic model, plain, streamed
and on the beta path, `output_config.format` with a raw schema, and the older beta top-level
`output_format`, all held to their schema; what cannot be enforced is refused with a 400 naming
the field.

usage: anthropic_structured.py BASE_URL API_KEY
Prints one line per check; exits non-zero on the first failure.
"""
import json
import sys

import anthropic
import pydantic

base, key = sys.argv[1], sys.argv[2]
client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=300)
model = client.models.list().data[0].id


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        sys.exit(1)


class City(pydantic.BaseModel):
    name: str
    country: str
    population: int


def is_city(text):
    try:
        City.model_validate_json(text)
        return True
    except pydantic.ValidationError:
        return False


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


ask = [{"role": "user", "content": "Tell me about Paris."}]

# Without a format the small model answers in prose, which is no City.
free = client.messages.create(model=model, max_tokens=60, temperature=0, messages=ask)
check("without output_format the answer is not a City", not is_city(text_of(free)), repr(text_of(free)))

# messages.parse sends output_config.format with the model's schema: a City comes back.
r = client.messages.parse(model=model, max_tokens=200, temperature=0, messages=ask, output_format=City)
check("parse() gives a City", isinstance(r.parsed_output, City) and r.stop_reason == "end_turn"
      and [b.type for b in r.content] == ["text"], f"{r.stop_reason} {text_of(r)!r}")
city = r.parsed_output

# Streamed: the same City, parsed by the client when the text block ends.
with client.messages.stream(model=model, max_tokens=200, temperature=0, messages=ask, output_format=City) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
check("streamed parse gives the same City", final.parsed_output == city and City.model_validate_json(streamed) == city
      and final.stop_reason == "end_turn", repr(streamed))

# The beta client (its structured-outputs beta header, ?beta=true): the same City.
r = client.beta.messages.parse(model=model, max_tokens=200, temperature=0, messages=ask, output_format=City)
check("beta parse() gives the same City", r.parsed_output == city, text_of(r))

# A raw schema in output_config.format, with an enum the prose answer would never keep to.
verdict = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}, "confidence": {"type": "integer", "minimum": 1, "maximum": 5}},
           "required": ["answer", "confidence"], "additionalProperties": False}
fmt = {"format": {"type": "json_schema", "schema": verdict}}
question = [{"role": "user", "content": "Is Paris the capital of France? Explain."}]
r = client.messages.create(model=model, max_tokens=60, temperature=0, messages=question, output_config=fmt)
v = json.loads(text_of(r))
check("output_config.format holds the answer to the schema", set(v) == {"answer", "confidence"} and v["answer"] in ("yes", "no")
      and 1 <= v["confidence"] <= 5, text_of(r))
for temperature in (0.7, 1.0):
    r = client.messages.create(model=model, max_tokens=60, temperature=temperature, messages=question, output_config=fmt)
    v = json.loads(text_of(r))
    check(f"sampled at temperature {temperature}", set(v) == {"answer", "confidence"} and v["answer"] in ("yes", "no") and 1 <= v["confidence"] <= 5, text_of(r))
events = list(client.messages.create(model=model, max_tokens=60, temperature=0, messages=question, output_config=fmt, stream=True))
streamed = "".join(e.delta.text for e in events if e.type == "content_block_delta")
check("streamed output_config.format", json.loads(streamed) == json.loads(text_of(client.messages.create(
    model=model, max_tokens=60, temperature=0, messages=question, output_config=fmt))), streamed)

# The older beta field, top-level output_format (what raw requests to that beta send).
r = client.messages.create(model=model, max_tokens=60, temperature=0, messages=question, extra_body={"output_format": fmt["format"]})
check("top-level output_format", json.loads(text_of(r))["answer"] in ("yes", "no"), text_of(r))

# count_tokens takes the same field.
counted = client.messages.count_tokens(model=model, messages=question, output_config=fmt)
check("count_tokens with output_config", counted.input_tokens > 0, str(counted))

# What cannot be enforced is refused, naming the field (Anthropic's errors carry no `param`: the
# message names it).
for name, kwargs, field in [
    ("unknown format type", dict(output_config={"format": {"type": "xml", "schema": verdict}}), "output_config.format.type"),
    ("schema the engine cannot compile", dict(output_config={"format": {"type": "json_schema", "schema": {"type": "frobnicate"}}}), "output_config.format.schema"),
    ("format without a schema", dict(output_config={"format": {"type": "json_schema"}}), "output_config.format.schema"),
    ("unknown output_config field", dict(output_config={"verbosity": "low"}), "output_config.verbosity"),
    ("both fields", dict(output_config=fmt, extra_body={"output_format": fmt["format"]}), "output_format"),
    ("unknown top-level format type", dict(extra_body={"output_format": {"type": "regex", "schema": {}}}), "output_format.type"),
]:
    for stream in (False, True):
        try:
            if stream:
                with client.messages.stream(model=model, max_tokens=10, messages=question, **kwargs) as s:
                    s.get_final_message()
            else:
                client.messages.create(model=model, max_tokens=10, messages=question, **kwargs)
            check(f"{name} (stream {stream})", False, "accepted")
        except anthropic.BadRequestError as e:
            check(f"{name} (stream {stream})", e.status_code == 400 and e.body["error"]["type"] == "invalid_request_error"
                  and field in e.body["error"]["message"], str(e.body))

print("anthropic structured output checks passed")
