"""Asks `sala serve` about documents with the official `openai` Python client (tests/prefix_cache.rs).

usage: openai_prefix.py BASE_URL
Two requests in turn that share a system prompt and a document, then two sent at once that share
another document; prints one JSON object: each answer (greedy) with the cached_tokens it reports,
streamed and not.
"""
import concurrent.futures
import json
import sys

import openai

client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none", max_retries=0, timeout=600)
model = client.models.list().data[0].id
system = "You answer questions about the document the user gives, in a few words."
documents = [
    "Report. The lighthouse on Kerran Point was built in 1871 by the engineer Ada Moss. "
    "It stands 31 metres tall and its lamp burned whale oil until 1902. " * 6,
    "Minutes. The committee met on Tuesday in the library. Mr Hale proposed a new roof; "
    "Ms Ortiz seconded. The vote was five to two in favour. " * 6,
]


def ask(document, question, stream):
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": document + "\n\nQuestion: " + question},
    ]
    if stream:
        chunks = list(client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=12,
                                                     stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        usage = chunks[-1].usage
    else:
        r = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=12)
        text, usage = r.choices[0].message.content, r.usage
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else None
    return {"text": text, "prompt_tokens": usage.prompt_tokens, "cached_tokens": cached}


results = [ask(documents[0], "Who built the lighthouse?", False), ask(documents[0], "How tall is it?", True)]
with concurrent.futures.ThreadPoolExecutor(2) as pool:
    together = [pool.submit(ask, documents[1], q, False) for q in ["Who proposed the roof?", "What was the vote?"]]
    results += [f.result() for f in together]
print(json.dumps(results))
