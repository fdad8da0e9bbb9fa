"""`sala serve`'s /v1/completions and chat logprobs with the official `openai` client
(tests/serve_apis.rs), checked against a reference the test computed another way: the greedy
tokens and their logits from `sala run --temperature 0 --logits-out`, and each prompt position's
log-softmax from a separate forward over that prefix.

usage: openai_completions.py BASE_URL API_KEY REFERENCE.json
Prints one line per check; exits non-zero on the first failure.
"""
import json
import math
import sys

import openai

base, key, reference = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=300)
model = client.models.list().data[0].id
prompt, prompt_ids = reference["prompt"], reference["prompt_ids"]
greedy_ids, greedy_text = reference["greedy_ids"], reference["greedy_text"]
n_greedy = len(greedy_ids)
TOL = 2e-3  # f32 logits of differently shaped forwards (one chunk of all positions vs one prefix each)


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        sys.exit(1)


def close(a, b, tol=TOL):
    return a is not None and b is not None and abs(a - b) <= tol


def check_offsets(name, text, lp):
    spans = [text[o:o + len(t)] for o, t in zip(lp.text_offset, lp.tokens)]
    check(name, spans == lp.tokens and lp.text_offset == sorted(lp.text_offset), f"{spans} vs {lp.tokens}")


def check_distribution(name, lp, top, greedy):
    """Each position: sum of exp(top) ≤ 1, at most top+1 entries holding the token itself, and
    under greedy decoding the chosen token is the most likely one."""
    for i, (t, tl, tops) in enumerate(zip(lp.tokens, lp.token_logprobs, lp.top_logprobs)):
        if tl is None:
            continue
        total = sum(math.exp(v) for v in tops.values())
        ok = total <= 1 + 1e-5 and top <= len(tops) <= top + 1 and close(tops.get(t), tl, 1e-6) and tl <= 0
        if greedy:
            ok = ok and close(tl, max(tops.values()), 1e-6)
        check(f"{name} position {i}", ok, f"{t!r} {tl} {tops} (sum {total})")


# Greedy completion with logprobs: the text, tokens and their log-probabilities are sala run's.
r = client.completions.create(model=model, prompt=prompt, max_tokens=n_greedy, temperature=0, logprobs=5)
c = r.choices[0]
check("greedy text is sala run's", c.text == greedy_text, f"{c.text!r} vs {greedy_text!r}")
check("usage", r.usage.prompt_tokens == len(prompt_ids) and r.usage.completion_tokens == n_greedy, str(r.usage))
check("object and finish_reason", r.object == "text_completion" and c.finish_reason == "length" and r.id.startswith("cmpl-"), str(r))
lp = c.logprobs
check("tokens spell the text", "".join(lp.tokens) == c.text and len(lp.tokens) == n_greedy, str(lp.tokens))
check("tokens are sala run's", lp.tokens == [reference["token_texts"][str(i)] for i in greedy_ids], str(lp.tokens))
check_offsets("text_offset", c.text, lp)
check_distribution("greedy", lp, 5, greedy=True)
ref = reference["greedy_logprobs"]
check("logprobs equal sala run's logits' log-softmax", all(close(a, b["logprob"]) for a, b in zip(lp.token_logprobs, ref)),
      f"{lp.token_logprobs} vs {[b['logprob'] for b in ref]}")
for i, (tops, b) in enumerate(zip(lp.top_logprobs, ref)):
    want = dict(b["top"])
    check(f"top_logprobs {i} equal sala run's", set(list(want)[:1]) <= set(tops) and all(close(v, want[k]) for k, v in tops.items() if k in want), f"{tops} vs {want}")

# The same prompt as token ids.
r_ids = client.completions.create(model=model, prompt=prompt_ids, max_tokens=n_greedy, temperature=0)
check("token-id prompt", r_ids.choices[0].text == greedy_text and r_ids.usage.prompt_tokens == len(prompt_ids), r_ids.choices[0].text)

# Scoring (lm-eval-harness): echo, max_tokens 0, logprobs — the prompt's own log-probabilities.
for name, p in [("text", prompt), ("token ids", prompt_ids)]:
    r = client.completions.create(model=model, prompt=p, max_tokens=0, echo=True, logprobs=3, temperature=0)
    c, lp = r.choices[0], r.choices[0].logprobs
    check(f"echo scoring ({name}): text is the prompt", c.text == prompt and r.usage.completion_tokens == 0 and c.finish_reason == "length", repr(c.text))
    check(f"echo scoring ({name}): tokens", "".join(lp.tokens) == prompt and len(lp.tokens) == len(prompt_ids), str(lp.tokens))
    check(f"echo scoring ({name}): first has none", lp.token_logprobs[0] is None and lp.top_logprobs[0] is None)
    scored = reference["prompt_logprobs"]
    check(f"echo scoring ({name}): equal a separate forward per prefix", all(close(a, b["logprob"]) for a, b in zip(lp.token_logprobs[1:], scored)),
          f"{lp.token_logprobs[1:]} vs {[b['logprob'] for b in scored]}")
    for i, (tops, b) in enumerate(zip(lp.top_logprobs[1:], scored)):
        want = dict(b["top"])
        shared = [k for k in tops if k in want]
        check(f"echo scoring ({name}): alternatives {i + 1}", len(shared) >= 2 and all(close(tops[k], want[k]) for k in shared), f"{tops} vs {want}")
    check_offsets(f"echo scoring ({name}): text_offset", c.text, lp)
    check_distribution(f"echo scoring ({name})", lp, 3, greedy=False)

# Echo with generation: the prompt, then the greedy answer, scored throughout.
r = client.completions.create(model=model, prompt=prompt, max_tokens=3, echo=True, logprobs=1, temperature=0)
c, lp = r.choices[0], r.choices[0].logprobs
answer = "".join(reference["token_texts"][str(i)] for i in greedy_ids[:3])
check("echo + answer text", c.text == prompt + answer, repr(c.text))
check("echo + answer tokens", len(lp.tokens) == len(prompt_ids) + 3 and lp.token_logprobs[0] is None
      and all(close(a, b["logprob"]) for a, b in zip(lp.token_logprobs[len(prompt_ids):], ref)), str(lp.token_logprobs))
check_offsets("echo + answer text_offset", c.text, lp)

# Streaming: the same text and log-probabilities, usage last, then [DONE].
chunks = list(client.completions.create(model=model, prompt=prompt, max_tokens=n_greedy, temperature=0, logprobs=2, stream=True,
                                        stream_options={"include_usage": True}))
text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
tokens = [t for ch in chunks if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.tokens]
values = [v for ch in chunks if ch.choices and ch.choices[0].logprobs for v in ch.choices[0].logprobs.token_logprobs]
check("streamed text", text == greedy_text, repr(text))
check("streamed logprobs", "".join(tokens) == greedy_text and all(close(a, b["logprob"]) for a, b in zip(values, ref)) and len(values) == n_greedy, f"{tokens} {values}")
finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
check("streamed finish_reason last", finishes[-1] == "length" and all(f is None for f in finishes[:-1]), str(finishes))
check("streamed usage", not chunks[-1].choices and chunks[-1].usage.completion_tokens == n_greedy and chunks[-1].usage.prompt_tokens == len(prompt_ids), str(chunks[-1]))
chunks = list(client.completions.create(model=model, prompt=prompt, max_tokens=0, echo=True, logprobs=1, stream=True))
check("streamed echo scoring", chunks[0].choices[0].text == prompt and chunks[0].choices[0].logprobs.token_logprobs[0] is None
      and len(chunks[0].choices[0].logprobs.tokens) == len(prompt_ids), str(chunks[0]))

# Several prompts: one choice each, in order; a stop string ends the text before it.
r = client.completions.create(model=model, prompt=[prompt, "Hello, my name is"], max_tokens=n_greedy, temperature=0)
check("several prompts", [ch.index for ch in r.choices] == [0, 1] and r.choices[0].text == greedy_text and r.choices[1].text, str(r.choices))
stop = greedy_text.strip()[-1]
r = client.completions.create(model=model, prompt=prompt, max_tokens=n_greedy, temperature=0, stop=[stop])
check("stop", r.choices[0].text == greedy_text[:greedy_text.index(stop)] and r.choices[0].finish_reason == "stop", repr(r.choices[0].text))
cut = greedy_text.index("ri")  # inside " Paris": the token the stop string cuts is the last listed
r = client.completions.create(model=model, prompt=prompt, max_tokens=n_greedy, temperature=0, stop=["ri"], logprobs=1)
lp = r.choices[0].logprobs
check("stop inside a token", r.choices[0].text == greedy_text[:cut] and "".join(lp.tokens).startswith(r.choices[0].text)
      and "".join(lp.tokens[:-1]) == greedy_text[:sum(len(t) for t in lp.tokens[:-1])] and len(lp.tokens) == 1, f"{r.choices[0].text!r} {lp.tokens}")
r = client.completions.create(model=model, prompt=prompt, temperature=0)
check("max_tokens defaults to 16", r.usage.completion_tokens <= 16 and (r.usage.completion_tokens == 16) == (r.choices[0].finish_reason == "length"), str(r.usage))

# Refused fields name themselves.
for name, kwargs in [("n", dict(n=2)), ("best_of", dict(best_of=2)), ("suffix", dict(suffix=" end")), ("logprobs", dict(logprobs=6)),
                     ("prompt", dict(prompt=[])), ("max_tokens", dict(max_tokens=-1))]:
    try:
        client.completions.create(**{"model": model, "prompt": prompt, **kwargs})
        check(f"{name} refused", False, "no error")
    except openai.BadRequestError as e:
        check(f"{name} refused", e.status_code == 400 and e.body["param"] == name and name in e.body["message"], str(e.body))

# Chat logprobs: each token with its bytes and alternatives; greedy picks the most likely.
question = [{"role": "user", "content": "What is the capital of France?"}]
r = client.chat.completions.create(model=model, messages=question, temperature=0, logprobs=True, top_logprobs=3)
content = r.choices[0].logprobs.content
text = r.choices[0].message.content
check("chat answer", text == "The capital of France is Paris.", text)
check("chat tokens spell the answer", "".join(t.token for t in content) == text and len(content) == r.usage.completion_tokens - 1, str([t.token for t in content]))
for t in content:
    total = sum(math.exp(a.logprob) for a in t.top_logprobs)
    check(f"chat token {t.token!r}", len(t.top_logprobs) == 3 and close(t.logprob, t.top_logprobs[0].logprob, 1e-6)
          and t.top_logprobs[0].token == t.token and t.bytes == list(t.token.encode()) and total <= 1 + 1e-5
          and t.top_logprobs == sorted(t.top_logprobs, key=lambda a: -a.logprob), str(t))
chunks = list(client.chat.completions.create(model=model, messages=question, temperature=0, logprobs=True, top_logprobs=3, stream=True))
streamed = [t for ch in chunks if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.content]
check("streamed chat logprobs", [t.token for t in streamed] == [t.token for t in content] and all(close(a.logprob, b.logprob, 5e-4) for a, b in zip(streamed, content)),
      str([(t.token, t.logprob) for t in streamed]))
check("each streamed delta carries its tokens", all("".join(t.token for t in ch.choices[0].logprobs.content) == ch.choices[0].delta.content
                                                    for ch in chunks if ch.choices and ch.choices[0].logprobs))
r = client.chat.completions.create(model=model, messages=question, temperature=0, logprobs=True)
check("chat logprobs without alternatives", all(t.top_logprobs == [] for t in r.choices[0].logprobs.content), str(r.choices[0].logprobs))
r = client.chat.completions.create(model=model, messages=question, temperature=0)
check("no logprobs unless asked", r.choices[0].logprobs is None)
for name, kwargs in [("top_logprobs", dict(logprobs=True, top_logprobs=21)), ("top_logprobs", dict(top_logprobs=2))]:
    try:
        client.chat.completions.create(model=model, messages=question, **kwargs)
        check(f"chat {name} refused", False, "no error")
    except openai.BadRequestError as e:
        check(f"chat {kwargs} refused", e.status_code == 400 and e.body["param"] == name, str(e.body))

print("completions and logprobs checks passed")
