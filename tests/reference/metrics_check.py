"""`sala serve`'s GET /metrics read with `prometheus_client`'s parser (tests/serve_apis.rs), on a
fresh server: the script makes a known set of requests (completions, chat, messages, streamed and
not, some refused), then checks that the request counters, the token counters and the
histograms say exactly that.

usage: metrics_check.py BASE_URL API_KEY
Prints one line per check; exits non-zero on the first failure.
"""
import sys
import time
import urllib.error
import urllib.request

import anthropic
import openai
from prometheus_client.parser import text_string_to_metric_families

base, key = sys.argv[1], sys.argv[2]
oai = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=300)
ant = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=300)
model = oai.models.list().data[0].id
question = [{"role": "user", "content": "What is the capital of France?"}]


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        sys.exit(1)


def get(path, headers=None):
    try:
        with urllib.request.urlopen(urllib.request.Request(base + path, headers=headers or {})) as r:
            return r.status, r.headers.get("content-type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type"), e.read().decode()


# What the requests below report as usage, summed.
prompt_tokens = completion_tokens = cached_tokens = 0


def add(prompt, completion, cached):
    global prompt_tokens, completion_tokens, cached_tokens
    prompt_tokens, completion_tokens, cached_tokens = prompt_tokens + prompt, completion_tokens + completion, cached_tokens + cached


for _ in range(2):
    r = oai.completions.create(model=model, prompt="The capital of France is", max_tokens=5, temperature=0)
    add(r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.prompt_tokens_details.cached_tokens)
chunks = list(oai.completions.create(model=model, prompt="Once upon a time", max_tokens=6, stream=True, stream_options={"include_usage": True}, seed=1))
u = chunks[-1].usage
add(u.prompt_tokens, u.completion_tokens, u.prompt_tokens_details.cached_tokens)
r = oai.chat.completions.create(model=model, messages=question, temperature=0)
add(r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.prompt_tokens_details.cached_tokens)
chunks = list(oai.chat.completions.create(model=model, messages=question, temperature=0, stream=True, stream_options={"include_usage": True}))
u = chunks[-1].usage
add(u.prompt_tokens, u.completion_tokens, u.prompt_tokens_details.cached_tokens)
r = ant.messages.create(model=model, max_tokens=20, temperature=0, messages=question)
add(r.usage.input_tokens + r.usage.cache_read_input_tokens, r.usage.output_tokens, r.usage.cache_read_input_tokens)
with ant.messages.stream(model=model, max_tokens=20, temperature=0, messages=question) as s:
    u = s.get_final_message().usage
add(u.input_tokens + u.cache_read_input_tokens, u.output_tokens, u.cache_read_input_tokens)
generations = 7
ant.messages.count_tokens(model=model, messages=question)
# Refused: a bad field (400), a wrong key on each API (401).
try:
    oai.completions.create(model=model, prompt="x", n=2)
except openai.BadRequestError:
    pass
for call in [lambda c: c.chat.completions.create(model=model, messages=question), lambda c: c.completions.create(model=model, prompt="x")]:
    try:
        call(openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0))
    except openai.AuthenticationError:
        pass
try:
    anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.create(model=model, max_tokens=5, messages=question)
except anthropic.AuthenticationError:
    pass

status, _, _ = get("/metrics")
check("/metrics needs the key", status == 401)
status, _, _ = get("/metrics", {"x-api-key": "wrong"})
check("/metrics refuses a wrong key", status == 401)
# The worker updates its gauges between rounds: wait (briefly) for it to see it is idle.
for _ in range(50):
    status, content_type, text = get("/metrics", {"Authorization": "Bearer " + key})
    check("/metrics answers", status == 200 and content_type == "text/plain; version=0.0.4; charset=utf-8" and text.endswith("\n"), f"{status} {content_type}")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    if all(s.value == 0 for n in ["sala_queue_depth", "sala_batch_size"] for s in families[n].samples):
        break
    time.sleep(0.1)
print("families:", sorted((n, f.type) for n, f in families.items()))


def samples(family, suffix=""):
    return [s for s in families[family].samples if s.name == family + suffix]


def value(family, suffix="", **labels):
    found = [s.value for s in samples(family, suffix) if all(s.labels.get(k) == v for k, v in labels.items())]
    return found[0] if len(found) == 1 else None


kinds = {"sala_requests": "counter", "sala_prompt_tokens": "counter", "sala_generated_tokens": "counter",
         "sala_time_to_first_token_seconds": "histogram", "sala_request_duration_seconds": "histogram",
         "sala_queue_depth": "gauge", "sala_batch_size": "gauge", "sala_prefix_cache_lookups": "counter",
         "sala_prefix_cache_hits": "counter", "sala_prefix_cache_hit_tokens": "counter",
         "sala_memory_active_bytes": "gauge", "sala_memory_peak_bytes": "gauge",
         "sala_prefill_chunk_tokens": "histogram", "sala_kernel_variants": "gauge",
         "sala_kv_reserved_bytes": "gauge", "sala_kv_budget_bytes": "gauge"}
for name, kind in kinds.items():
    check(f"{name} is a {kind}", name in families and families[name].type == kind and families[name].documentation, str(families.get(name)))

for endpoint, status, want in [("/v1/completions", "200", 3), ("/v1/completions", "400", 1), ("/v1/completions", "401", 1),
                               ("/v1/chat/completions", "200", 2), ("/v1/chat/completions", "401", 1),
                               ("/v1/messages", "200", 2), ("/v1/messages", "401", 1), ("/v1/messages/count_tokens", "200", 1),
                               ("/v1/models", "200", 1), ("/metrics", "401", 2)]:
    got = value("sala_requests", "_total", endpoint=endpoint, status=status)
    check(f"requests {endpoint} {status}", got == want, f"{got} (want {want})")
check("prompt tokens = the usage reported", value("sala_prompt_tokens", "_total") == prompt_tokens, f"{value('sala_prompt_tokens', '_total')} vs {prompt_tokens}")
check("generated tokens = the usage reported", value("sala_generated_tokens", "_total") == completion_tokens, f"{value('sala_generated_tokens', '_total')} vs {completion_tokens}")
check("prefix cache lookups: one per generation", value("sala_prefix_cache_lookups", "_total") == generations)
hits = value("sala_prefix_cache_hits", "_total")
check("prefix cache hits", 0 < hits <= generations and value("sala_prefix_cache_hit_tokens", "_total") == cached_tokens,
      f"{hits} hits, {value('sala_prefix_cache_hit_tokens', '_total')} tokens vs {cached_tokens} cached")

for name in ["sala_time_to_first_token_seconds", "sala_request_duration_seconds"]:
    buckets = sorted(((float(s.labels["le"]), s.value) for s in samples(name, "_bucket")))
    counts = [v for _, v in buckets]
    count, total = value(name, "_count"), value(name, "_sum")
    check(f"{name}: cumulative buckets", counts == sorted(counts) and buckets[-1][0] == float("inf"), str(buckets))
    check(f"{name}: +Inf = count = requests", buckets[-1][1] == count == generations, f"{buckets[-1][1]} {count}")
    check(f"{name}: sum", 0 < total < 600 * generations, str(total))
ttft, latency = value("sala_time_to_first_token_seconds", "_sum"), value("sala_request_duration_seconds", "_sum")
check("first tokens come before the last", ttft <= latency, f"{ttft} vs {latency}")
check("idle: nothing queued or running", value("sala_queue_depth") == 0 and value("sala_batch_size") == 0)
check("idle: no cache memory held, some to hold", value("sala_kv_reserved_bytes") == 0 and value("sala_kv_budget_bytes") > 0,
      f"{value('sala_kv_reserved_bytes')} {value('sala_kv_budget_bytes')}")
active, peak = value("sala_memory_active_bytes"), value("sala_memory_peak_bytes")
check("memory", 0 < active <= peak, f"{active} {peak}")
# The tests serve on the CPU, where no GPU kernel is launched (none is compiled).
check("kernel variants", value("sala_kernel_variants") == 0, str(value("sala_kernel_variants")))

print("metrics checks passed")
