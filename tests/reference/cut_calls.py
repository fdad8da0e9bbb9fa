"""A second parallel call cut by max_tokens, through the official `openai` and `anthropic` clients
(tests/serve_apis.rs): the complete first call comes back as a call, the finish reason is
`length` / `max_tokens`, and no text of the cut call is content, streamed or not.

The cut is measured, not guessed: a greedy answer with room makes two calls; its tokens (read
from `logprobs`) show where the second call starts, and `max_tokens` is set to stop inside it.

usage: cut_calls.py BASE_URL API_KEY
Prints one line per check; exits non-zero on the first failure.
"""
import json
import sys

import anthropic
import openai

base, key = sys.argv[1], sys.argv[2]
chat = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=300)
messages_api = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=300)
model = chat.models.list().data[0].id


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        sys.exit(1)


schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"], "additionalProperties": False}
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather for a city", "parameters": schema}}]
ask = [{"role": "user", "content": "What is the weather in Paris and in Tokyo?"}]

# With room: two calls, and the tokens they took.
full = chat.chat.completions.create(model=model, messages=ask, tools=tools, tool_choice="required", temperature=0, max_tokens=200, logprobs=True)
calls = [(c.function.name, json.loads(c.function.arguments)) for c in full.choices[0].message.tool_calls or []]
check("the whole answer makes two calls", len(calls) >= 2 and full.choices[0].finish_reason == "tool_calls", repr(full.choices[0].message))
tokens = [t.token for t in full.choices[0].logprobs.content]
text = "".join(tokens)
check("the tokens spell the calls", text.count("<tool_call>") == len(calls), repr(text))
# The cut: a few tokens past the second opener, inside the second call's JSON.
second = text.index("<tool_call>", text.index("</tool_call>"))
upto, n = 0, 0
while upto <= second + len("<tool_call>\n{\"name\": \"get"):
    upto += len(tokens[n])
    n += 1
max_tokens = n
check("the cut falls inside the second call", text[:upto].count("</tool_call>") == 1 and max_tokens < len(tokens) - 3, f"{max_tokens} of {len(tokens)}: {text[:upto]!r}")
first = calls[0]

# OpenAI, not streamed: the first call, `length`, no content.
r = chat.chat.completions.create(model=model, messages=ask, tools=tools, tool_choice="required", temperature=0, max_tokens=max_tokens, logprobs=True)
got = "".join(t.token for t in r.choices[0].logprobs.content)
check("the cut answer is the whole answer's start", got == text[:upto], f"{got!r} vs {text[:upto]!r}")
m = r.choices[0].message
check("openai: finish_reason length", r.choices[0].finish_reason == "length" and r.usage.completion_tokens == max_tokens, f"{r.choices[0].finish_reason} {r.usage}")
check("openai: the complete call is kept", [(c.function.name, json.loads(c.function.arguments)) for c in m.tool_calls or []] == [first], repr(m.tool_calls))
check("openai: no call text in content", not m.content, repr(m.content))

# OpenAI, streamed.
chunks = list(chat.chat.completions.create(model=model, messages=ask, tools=tools, tool_choice="required", temperature=0, max_tokens=max_tokens, stream=True))
content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
streamed_calls = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
check("openai streamed: finish_reason length", finish == ["length"], repr(finish))
check("openai streamed: the complete call is kept", [(d.function.name, json.loads(d.function.arguments)) for d in streamed_calls] == [first], repr(streamed_calls))
check("openai streamed: no call text in content", content == "", repr(content))

# Anthropic, not streamed: a tool_use block only, stop_reason max_tokens.
anthropic_tools = [{"name": "get_weather", "description": "Get the current weather for a city", "input_schema": schema}]
r = messages_api.messages.create(model=model, max_tokens=max_tokens, temperature=0, messages=ask, tools=anthropic_tools, tool_choice={"type": "any"})
check("anthropic: stop_reason max_tokens", r.stop_reason == "max_tokens" and r.usage.output_tokens == max_tokens, f"{r.stop_reason} {r.usage}")
check("anthropic: the complete call is the only block", [(b.type, b.name, b.input) for b in r.content] == [("tool_use", *first)], repr(r.content))

# Anthropic, streamed: the same blocks, in Anthropic's events.
events = list(messages_api.messages.create(model=model, max_tokens=max_tokens, temperature=0, messages=ask, tools=anthropic_tools,
                                           tool_choice={"type": "any"}, stream=True))
starts = [e.content_block.type for e in events if e.type == "content_block_start"]
texts = "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")
check("anthropic streamed: one tool_use block, no text", starts == ["tool_use"] and texts == "", f"{starts} {texts!r}")
check("anthropic streamed: stop_reason max_tokens", events[-2].type == "message_delta" and events[-2].delta.stop_reason == "max_tokens", repr(events[-2]))
with messages_api.messages.stream(model=model, max_tokens=max_tokens, temperature=0, messages=ask, tools=anthropic_tools, tool_choice={"type": "any"}) as s:
    final = s.get_final_message()
check("anthropic streamed: the final message", final.stop_reason == "max_tokens" and [(b.type, b.name, b.input) for b in final.content] == [("tool_use", *first)],
      repr(final.content))

# With room again, the same request is whole: two calls and tool_use (the cut alone changed it).
r = messages_api.messages.create(model=model, max_tokens=200, temperature=0, messages=ask, tools=anthropic_tools, tool_choice={"type": "any"})
check("anthropic with room: every call, tool_use", r.stop_reason == "tool_use" and [(b.name, b.input) for b in r.content if b.type == "tool_use"] == calls,
      repr(r.content))

print("cut call checks passed")
