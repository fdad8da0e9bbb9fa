"""Served decode rates of `sala serve` through the official `openai` client (issue 57;
eval/device-served.sh runs it on the lent GPU, and it runs against a CPU server as well).

usage: openai_rate.py BASE_URL [--api-key KEY] [--streams 1,16] [--rounds 4,2] [--max-tokens 256]
                      [--temperature 0.8] [--top-p 0.95] [--formats free,json] [--label NAME]
                      [--csv FILE] [--no-ignore-eos]

For each format and stream count S: ROUNDS rounds, each S streaming chat completions started
together (one thread each, released by a barrier), every request max_tokens long. A request's decode
rate is (completion tokens - 1) / (last text chunk - first text chunk): time to first token is left
out, so it compares with `sala bench`'s tg rows (one stream) and `x16` rows (the sum over a round's
streams). `wall` is a round's tokens over its whole time, prefill and first tokens included.
Formats: `free` (text) and `json` (response_format json_schema: objects like the bench grammar
suite's, at least 64 of them, so the grammar cannot end an answer before 256 tokens).
Every request asks for `ignore_eos` (vLLM's extension) so that random weights decode max_tokens;
`short` counts the answers that ended sooner (a server that ignores the field, or a stop).
Prints a markdown table; --csv appends the same rows (a header when the file is new).
Exits non-zero when a request fails or a stream ends without a finish_reason or usage.
"""
import argparse
import csv
import os
import statistics
import sys
import threading
import time

import openai

# The bench grammar suite's item (src/eval/bench.rs, bench_grammar), in a list the answer must
# keep open for 64 items: the mask changes with every string, number and list as there.
ITEM = {"type": "object", "properties": {"name": {"type": "string"}, "count": {"type": "integer"},
                                         "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "count", "tags"], "additionalProperties": False}
SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "items": ITEM, "minItems": 64}},
          "required": ["items"], "additionalProperties": False}
FORMATS = {"free": None, "json": {"type": "json_schema", "json_schema": {"name": "items", "schema": SCHEMA}}}
TOPICS = ["a lighthouse keeper", "a city under the sea", "the first winter on Mars", "a clockmaker's apprentice",
          "a library that never closes", "two rival chefs", "a river that runs uphill", "a lost satellite"]


def counts(text, name):
    values = [int(x) for x in text.split(",")]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{name}: positive integers separated by commas, e.g. 1,16")
    return values


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", help="the server, e.g. http://127.0.0.1:8080")
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "none"))
    ap.add_argument("--streams", type=lambda t: counts(t, "--streams"), default=[1, 16])
    ap.add_argument("--rounds", type=lambda t: counts(t, "--rounds"), default=[4, 2],
                    help="rounds for each --streams value (one value: the same for all)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--formats", default="free,json", help="comma-separated: " + ", ".join(FORMATS))
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds at each stream count before each format")
    ap.add_argument("--label", default="", help="the model column (default: the served model's id)")
    ap.add_argument("--csv", help="append the rows to this CSV file")
    ap.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false")
    args = ap.parse_args()
    formats = args.formats.split(",")
    if unknown := [f for f in formats if f not in FORMATS]:
        ap.error(f"--formats: unknown {unknown}; known: {', '.join(FORMATS)}")
    rounds = args.rounds * len(args.streams) if len(args.rounds) == 1 else args.rounds
    if len(rounds) != len(args.streams):
        ap.error(f"--rounds: one value, or one for each of the {len(args.streams)} --streams values")
    if args.max_tokens < 2:
        ap.error("--max-tokens: at least 2 (a rate needs two tokens)")

    client = openai.OpenAI(base_url=args.base.rstrip("/") + "/v1", api_key=args.api_key, max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    label = args.label or model
    extra = {"chat_template_kwargs": {"enable_thinking": False}}
    if args.ignore_eos:
        extra["ignore_eos"] = True

    def one(fmt, i):
        """One streamed request: its times (perf_counter), tokens, text chunks and finish."""
        request = dict(model=model, stream=True, stream_options={"include_usage": True}, max_tokens=args.max_tokens,
                       temperature=args.temperature, top_p=args.top_p, extra_body=extra,
                       messages=[{"role": "user", "content": f"Write a long story about {TOPICS[i % len(TOPICS)]} (#{i})."}])
        if FORMATS[fmt] is not None:
            request["response_format"] = FORMATS[fmt]
        start = time.perf_counter()
        first = last = None
        finish, usage, chunks, text = None, None, 0, []
        for chunk in client.chat.completions.create(**request):
            now = time.perf_counter()
            if chunk.usage:
                usage = chunk.usage
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            # Thinking text comes as reasoning_content (an extra field to the client).
            piece = (delta.content or "") + (getattr(delta, "reasoning_content", None) or "")
            if piece or delta.tool_calls:
                first = first if first is not None else now
                last = now
                chunks += 1
                text.append(piece)
            if chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        if finish is None or usage is None:
            raise SystemExit(f"request {i} ({fmt}): the stream ended without a finish_reason ({finish}) or usage ({usage})")
        return {"start": start, "first": first, "last": last, "end": time.perf_counter(), "tokens": usage.completion_tokens,
                "chunks": chunks, "finish": finish, "text": "".join(text)}

    def rate(r):
        if r["tokens"] < 2 or r["first"] is None or r["last"] <= r["first"]:
            return None
        return (r["tokens"] - 1) / (r["last"] - r["first"])

    def round_of(fmt, streams, base):
        """`streams` requests released together; their results in order."""
        barrier = threading.Barrier(streams)
        results, errors = [None] * streams, []

        def run(k):
            try:
                barrier.wait()
                results[k] = one(fmt, base + k)
            except BaseException as e:  # noqa: BLE001 - reported below, with the request's number
                errors.append(f"request {base + k}: {e!r}")
                barrier.abort()

        threads = [threading.Thread(target=run, args=(k,)) for k in range(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise SystemExit(f"{fmt}, {streams} streams: " + "; ".join(errors))
        return results

    columns = ["model", "format", "streams", "requests", "max_tokens", "tokens_mean", "short", "chunks_mean",
               "stream_tps_median", "stream_tps_min", "aggregate_tps", "wall_tps", "ttft_p50_s", "temperature", "top_p"]
    rows = []
    print("| model | format | streams | requests | tokens | short | tok/s per stream (median, min) | aggregate tok/s | wall tok/s | TTFT p50 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for fmt in formats:
        # Untimed rounds at every stream count first: a GPU build compiles kernels for each batch
        # size at its first use (seconds each), which is no part of the rate.
        for w in range(args.warmup):
            for streams in args.streams:
                round_of(fmt, streams, 1000 + 100 * w)
        for streams, n_rounds in zip(args.streams, rounds):
            done, aggregates, walls = [], [], []
            for r in range(n_rounds):
                results = round_of(fmt, streams, r * streams)
                rates = [rate(x) for x in results]
                # An answer of one token (or one text chunk) has no decode time: counted as short, left out.
                aggregates.append(sum(y for y in rates if y is not None))
                walls.append(sum(x["tokens"] for x in results) / (max(x["end"] for x in results) - min(x["start"] for x in results)))
                done += [(x, y) for x, y in zip(results, rates)]
            if fmt == "json" and not all(x["text"].lstrip().startswith("{") for x, _ in done):
                print(f"warning: a json answer does not start with '{{': {done[0][0]['text'][:80]!r}", file=sys.stderr)
            rates = [y for _, y in done if y is not None] or [float("nan")]
            row = {"model": label, "format": fmt, "streams": streams, "requests": len(done), "max_tokens": args.max_tokens,
                   "tokens_mean": statistics.mean(x["tokens"] for x, _ in done),
                   "short": sum(x["tokens"] < args.max_tokens for x, _ in done),
                   "chunks_mean": statistics.mean(x["chunks"] for x, _ in done),
                   "stream_tps_median": statistics.median(rates), "stream_tps_min": min(rates),
                   "aggregate_tps": statistics.mean(aggregates), "wall_tps": statistics.mean(walls),
                   "ttft_p50_s": statistics.median(x["first"] - x["start"] for x, _ in done),
                   "temperature": args.temperature, "top_p": args.top_p}
            rows.append(row)
            print(f"| {label} | {fmt} | {streams} | {row['requests']} | {row['tokens_mean']:.1f} | {row['short']} "
                  f"| {row['stream_tps_median']:.1f}, {row['stream_tps_min']:.1f} | {row['aggregate_tps']:.1f} "
                  f"| {row['wall_tps']:.1f} | {row['ttft_p50_s']:.3f} s |", flush=True)
    if args.csv:
        new = not os.path.exists(args.csv) or os.path.getsize(args.csv) == 0
        with open(args.csv, "a", newline="") as f:
            out = csv.DictWriter(f, fieldnames=columns)
            if new:
                out.writeheader()
            out.writerows({k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in row.items()} for row in rows)


if __name__ == "__main__":
    main()
