"""An Anthropic stream's usage is one split of the prompt (tests/serve_apis.rs): with the official
`anthropic` client streaming a conversation twice, the second time from the server's prefix
cache, `message_start` and `message_delta` report the same input_tokens and
cache_read_input_tokens, input_tokens counting only what was not read from the cache, and the
two adding up to the prompt the non-streamed answer reports.

usage: anthropic_stream_usage.py BASE_URL API_KEY
Prints one line per check; exits non-zero on the first failure.
"""
import sys

import anthropic

base, key = sys.argv[1], sys.argv[2]
client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=300)
model = client.models.list().data[0].id
messages = [{"role": "user", "content": "Here is a short story about a lighthouse keeper who finds a bottle on the shore, with a map inside. Tell me what happens next."}]


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        sys.exit(1)


def streamed():
    """The usage of message_start and of message_delta."""
    start = delta = None
    with client.messages.stream(model=model, max_tokens=8, temperature=0, messages=messages) as stream:
        for event in stream:
            if event.type == "message_start":
                start = event.message.usage
            elif event.type == "message_delta":
                delta = event.usage
    return start, delta


whole = client.messages.create(model=model, max_tokens=8, temperature=0, messages=messages).usage
prompt = whole.input_tokens + (whole.cache_read_input_tokens or 0)
check("the prompt has tokens", prompt > 10, str(whole))
for turn in ("first", "second"):
    start, delta = streamed()
    split = lambda u: (u.input_tokens, u.cache_read_input_tokens or 0)
    check(f"{turn} stream: message_start and message_delta split the prompt alike", split(start) == split(delta), f"{start} / {delta}")
    check(f"{turn} stream: input and cache read add up to the prompt", sum(split(start)) == prompt, f"{start}, prompt {prompt}")
    check(f"{turn} stream: output tokens only at the end", start.output_tokens == 0 and delta.output_tokens > 0, f"{start} / {delta}")
# The same conversation again: its prompt comes from the prefix cache, which both events say.
check("the last stream read from the prefix cache", (start.cache_read_input_tokens or 0) > 0, str(start))
print("anthropic stream usage checks passed")
