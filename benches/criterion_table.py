#!/usr/bin/env python3
"""Writes the criterion results (target/criterion) as a table into BENCHMARKS.md.

    cargo bench --bench pipeline && python3 benches/criterion_table.py [--print-only]

One row per benchmark: the median time with criterion's 95 % confidence interval, the size it
reports as throughput (series, CSV rows, pods, GPUs or bytes) and the time per unit, which is how
the tables show that cost grows linearly. Replaces the part of BENCHMARKS.md between the
`criterion:begin` and `criterion:end` markers.
"""

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- criterion:begin -->", "<!-- criterion:end -->"
GROUPS = ["build", "render", "build_render", "gzip", "tick", "tick_cpu", "csv_parse", "pod_mapping", "nvml_fake_tick"]
# (plural, singular) of what each group reports as throughput.
UNIT = {"build": ("series", "series"), "render": ("series", "series"),
        "build_render": ("series", "series"), "tick": ("series", "series"),
        "csv_parse": ("rows", "row"), "pod_mapping": ("pods", "pod"), "nvml_fake_tick": ("GPUs", "GPU"),
        "gzip": ("KiB", "KiB")}


def fmt_time(ns):
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def rows():
    found = []
    for bench in sorted((ROOT / "target" / "criterion").glob("**/new/benchmark.json")):
        meta = json.loads(bench.read_text())
        est = json.loads((bench.parent / "estimates.json").read_text())["median"]
        group = meta["group_id"]
        case = meta.get("value_str") or meta.get("function_id") or ""
        tp = meta.get("throughput") or {}
        n = tp.get("Elements") or (tp.get("Bytes", 0) / 1024) or None
        found.append((GROUPS.index(group) if group in GROUPS else 99, group, case, est, n))
    # Within a group, by size: the per-unit column then shows how the cost grows.
    return sorted(found, key=lambda r: (r[0], r[1], r[4] or 0, r[2]))


def table():
    out = ["| benchmark | case | median (95 % CI) | size | per unit |", "|---|---|---:|---:|---:|"]
    for _, group, case, est, n in rows():
        ci = est["confidence_interval"]
        t = est["point_estimate"]
        plural, singular = UNIT.get(group, ("units", "unit"))
        per = f"{fmt_time(t / n)} / {singular}" if n else ""
        size = f"{n:,.0f} {plural}" if n else ""
        out.append(f"| `{group}` | {case} | {fmt_time(t)} ({fmt_time(ci['lower_bound'])} – "
                   f"{fmt_time(ci['upper_bound'])}) | {size} | {per} |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--print-only", action="store_true")
    args = ap.parse_args()
    if not (ROOT / "target" / "criterion").is_dir():
        print("criterion_table: no target/criterion; run `cargo bench --bench pipeline` first", file=sys.stderr)
        return 1
    section = table()
    if args.print_only:
        print(section)
        return 0
    path = ROOT / "BENCHMARKS.md"
    text = path.read_text()
    if BEGIN not in text or END not in text:
        print(f"criterion_table: {path}: markers {BEGIN} / {END} not found", file=sys.stderr)
        return 1
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(head + BEGIN + "\n" + section + END + tail)
    print(f"criterion_table: wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
