#!/usr/bin/env python3
"""Medians of `sala serve --log-level debug` scheduler rounds, by how many requests a round decoded.

    python3 eval/serving/rounds.py LOG [LOG ...] [--min N]

Only rounds without a prompt chunk count (pure decode rounds), and only batch sizes seen at least N
times (default 20). Columns: round wall time, the host's graph building and encoding, the builder
blocked, the evaluator waiting for a read, and the MiB MLX held for arrays and kept cached.
"""
import argparse
import re
import statistics

ROUND = re.compile(
    r"round decoded=(\d+) .*?chunks=(\d+) .*? ms=([\d.]+) chunks_ms=[\d.]+ build_ms=([\d.]+) encode_ms=([\d.]+) "
    r"blocked_ms=([\d.]+) read_wait_ms=([\d.]+) active_mib=(\d+) cached_mib=(\d+)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+")
    parser.add_argument("--min", type=int, default=20)
    args = parser.parse_args()
    print("| log | decoded | rounds | ms | build ms | encode ms | blocked ms | read wait ms | active MiB | cached MiB (min) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for path in args.logs:
        rows = []
        with open(path, errors="replace") as f:
            for line in f:
                m = ROUND.search(line)
                if m and m.group(2) == "0":
                    rows.append([float(v) for v in m.groups()])
        for decoded in sorted({int(r[0]) for r in rows}):
            these = [r for r in rows if int(r[0]) == decoded]
            if len(these) < args.min:
                continue
            med = lambda i: statistics.median(r[i] for r in these)
            print(f"| {path} | {decoded} | {len(these)} | {med(2):.2f} | {med(3):.2f} | {med(4):.2f} | {med(5):.2f} | "
                  f"{med(6):.2f} | {med(7):.0f} | {med(8):.0f} ({min(r[8] for r in these):.0f}) |")


if __name__ == "__main__":
    main()
