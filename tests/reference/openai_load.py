"""Load and fuzz for `sala serve` (tests/serve.rs).

usage: openai_load.py BASE_URL API_KEY CLIENTS SECONDS [MAX_TOKENS [--load-only]]
1. CLIENTS threads stream chat completions (MAX_TOKENS each, default 16) back to back for SECONDS;
   every request must finish with a finish_reason and no error. Prints requests, tokens/s and
   latency percentiles (eval/serve-load.sh uses this part alone).
2. A bounded fuzz: 300 malformed or mutated requests; every answer must be JSON (an OpenAI error
   for 4xx), and the server must still answer correctly afterwards.
"""
import concurrent.futures
import json
import random
import sys
import time
import urllib.error
import urllib.request

import openai

base, key, clients, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
max_tokens = int(sys.argv[5]) if len(sys.argv) > 5 else 16
load_only = "--load-only" in sys.argv[6:]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=600)
model = client.models.list().data[0].id
prompts = ["What is the capital of France?", "Name a color.", "Say hello.", "What is 2 + 2?"]


def worker(i):
    done, tokens, latencies, first_token = 0, 0, [], []
    deadline = time.time() + seconds
    while time.time() < deadline:
        start = time.time()
        first = None
        finish = None
        usage = None
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompts[(i + done) % len(prompts)]}],
            stream=True, max_tokens=max_tokens, stream_options={"include_usage": True})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and first is None:
                first = time.time() - start
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
            if chunk.usage:
                usage = chunk.usage
        assert finish in ("stop", "length") and usage is not None, (finish, usage)
        done += 1
        tokens += usage.completion_tokens
        latencies.append(time.time() - start)
        if first is not None:
            first_token.append(first)
    return done, tokens, latencies, first_token


start = time.time()
with concurrent.futures.ThreadPoolExecutor(clients) as pool:
    results = list(pool.map(worker, range(clients)))
elapsed = time.time() - start
requests = sum(r[0] for r in results)
tokens = sum(r[1] for r in results)
lat = sorted(x for r in results for x in r[2])
ttft = sorted(x for r in results for x in r[3])
pct = lambda v, p: v[min(len(v) - 1, int(p * len(v)))]
print(f"load: {clients} clients, {elapsed:.0f} s: {requests} requests, 0 failed, {tokens / elapsed:.1f} generated tok/s, "
      f"latency p50 {pct(lat, 0.5):.2f} s p95 {pct(lat, 0.95):.2f} s, first token p50 {pct(ttft, 0.5):.2f} s p95 {pct(ttft, 0.95):.2f} s", flush=True)
if load_only:
    sys.exit(0)

# Fuzz.
rng = random.Random(0)
# Both length keys, so a cut that spoils one name still leaves the answer short.
valid = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "max_completion_tokens": 2}
values = [None, True, False, 0, -1, 3.5, 1e308, "", "x", [], {}, [1, 2], {"a": 1}, "\u0000", "🦀" * 50, [{"role": "user"}], 10 ** 30]
keys = list(valid) + ["temperature", "top_p", "top_k", "min_p", "stop", "stream", "seed", "logit_bias", "n",
                      "frequency_penalty", "presence_penalty", "stream_options", "chat_template_kwargs", "max_completion_tokens", "tools"]


def post(body):
    req = urllib.request.Request(base + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


statuses = {}
for i in range(300):
    kind = rng.random()
    if kind < 0.15:
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    elif kind < 0.3:
        text = json.dumps(valid)
        cut = rng.randrange(len(text))
        body = (text[:cut] + text[cut + 1:]).encode()
    else:
        req = json.loads(json.dumps(valid))
        for _ in range(rng.randrange(1, 4)):
            req[rng.choice(keys)] = rng.choice(values)
        if rng.random() < 0.3:
            req["messages"] = rng.choice(values + [[{"role": rng.choice(["user", "x", 1]), "content": rng.choice(values)}]])
        # Keep valid requests short: a null max_tokens would mean the server's default length.
        if req.get("max_completion_tokens") is None:
            req["max_completion_tokens"] = 2
        body = json.dumps(req).encode()
    status, payload = post(body)
    statuses[status] = statuses.get(status, 0) + 1
    if "text/event-stream" in str(payload[:0]):
        continue
    if status >= 500:
        print(f"fuzz: server error {status} for {body[:200]!r}: {payload[:300]!r}")
        sys.exit(1)
    if not payload.startswith(b"data:"):
        answer = json.loads(payload)
        if status >= 400:
            assert "message" in answer["error"] and "type" in answer["error"], answer
print(f"fuzz: 300 requests, statuses {dict(sorted(statuses.items()))}, no 5xx, every answer JSON")
r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is the capital of France?"}], temperature=0)
assert r.choices[0].message.content == "The capital of France is Paris.", r.choices[0].message.content
print("server healthy after load and fuzz")
