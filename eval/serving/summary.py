#!/usr/bin/env python3
"""One table over guidellm's result files: the serving figures of eval/device-serving.sh.

    summary.py DIR [--markdown OUT.md] [--json OUT.json]

DIR holds `SERVER__MODEL__WORKLOAD.json` (or `.json.xz`, as eval/results keeps them), each written
by `guidellm benchmark run --output-path` (one or more benchmarks in it, one per rate). A row per benchmark: requests that succeeded, failed
or were cut off, output tokens per second, time to first token and inter-token latency (median
and 99th percentile, guidellm's own statistics over the successful requests). For a workload whose
name starts with `prefix` it adds the first request's time to first token against the median of
the later ones (the shared prefix's cache). Exits 1 if a file holds no benchmark or a request
failed, so a harness run that half-worked is not taken for a result.
"""
from __future__ import annotations

import argparse
import json
import lzma
import os
import statistics
import sys


def stat(metrics: dict, name: str, which: str) -> float:
    s = metrics[name]["successful"]
    return s["median"] if which == "p50" else s["percentiles"][which]


def rows_of(path: str) -> list[dict]:
    name = os.path.basename(path)
    server, model, workload = name[: name.rindex(".json")].split("__")
    with (lzma.open(path, "rt") if name.endswith(".xz") else open(path)) as f:
        report = json.load(f)
    benchmarks = report.get("benchmarks") or []
    if not benchmarks:
        raise ValueError(f"{path}: no benchmark in it")
    rows = []
    for b in benchmarks:
        strategy = b["args"]["strategy"]
        rate = strategy.get("streams") or strategy.get("rate") or ""
        m, totals = b["metrics"], b["request_totals"]
        row = {
            "server": server, "model": model, "workload": workload,
            "strategy": strategy["type_"], "rate": rate,
            "ok": totals["successful"], "errored": totals["errored"], "incomplete": totals["incomplete"],
            "duration_s": b["duration"],
            "output_tok_s": m["output_tokens_per_second"]["successful"]["mean"],
            "prompt_tokens": m["prompt_token_count"]["successful"]["mean"],
            "output_tokens": m["output_token_count"]["successful"]["mean"],
            "ttft_p50_ms": stat(m, "time_to_first_token_ms", "p50"),
            "ttft_p99_ms": stat(m, "time_to_first_token_ms", "p99"),
            "itl_p50_ms": stat(m, "inter_token_latency_ms", "p50"),
            "itl_p99_ms": stat(m, "inter_token_latency_ms", "p99"),
        }
        if workload.startswith("prefix"):
            done = sorted(b["requests"]["successful"], key=lambda r: r["start_time"])
            if len(done) >= 2:
                later = statistics.median(r["time_to_first_token_ms"] for r in done[1:])
                row["first_ttft_ms"] = done[0]["time_to_first_token_ms"]
                row["later_ttft_p50_ms"] = later
                row["first_over_later"] = done[0]["time_to_first_token_ms"] / later
        rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    head = ("| server | model | workload | rate | ok / failed / cut | out tok/s | TTFT p50 ms | TTFT p99 ms "
            "| ITL p50 ms | ITL p99 ms | prefix: first / later TTFT |")
    lines = [head, "|" + "---|" * 3 + "---:|" * 8]
    for r in rows:
        prefix = ""
        if "first_over_later" in r:
            prefix = f"{r['first_ttft_ms']:.0f} / {r['later_ttft_p50_ms']:.0f} ({r['first_over_later']:.1f}×)"
        rate = f"{r['strategy']} {r['rate']}".rstrip()
        lines.append(
            f"| {r['server']} | {r['model']} | {r['workload']} | {rate} "
            f"| {r['ok']} / {r['errored']} / {r['incomplete']} | {r['output_tok_s']:.1f} "
            f"| {r['ttft_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f} | {r['itl_p50_ms']:.2f} | {r['itl_p99_ms']:.2f} | {prefix} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--markdown")
    ap.add_argument("--json")
    args = ap.parse_args()
    files = sorted(f for f in os.listdir(args.dir) if f.endswith((".json", ".json.xz")) and f.count("__") == 2)
    if not files:
        print(f"summary: no SERVER__MODEL__WORKLOAD.json in {args.dir}", file=sys.stderr)
        return 1
    rows, bad = [], []
    for f in files:
        try:
            rows += rows_of(os.path.join(args.dir, f))
        except (ValueError, KeyError, json.JSONDecodeError, lzma.LZMAError) as e:
            bad.append(f"{f}: {e!r}")
    table = markdown(rows)
    print(table, end="")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    failed = [f"{r['server']} {r['model']} {r['workload']} {r['rate']}: {r['errored']} failed, {r['incomplete']} cut off"
              for r in rows if r["errored"] or r["incomplete"]]
    for line in bad + failed:
        print(f"summary: {line}", file=sys.stderr)
    return 1 if bad or failed else 0


if __name__ == "__main__":
    sys.exit(main())
