"""Aggregates scripts/bench.sh's oha runs into results.json, table.md and latency.svg."""

import argparse
import datetime
import json
import statistics
from collections import defaultdict
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("runs")
parser.add_argument("out")
parser.add_argument("--idle-rss-kb", type=int)
parser.add_argument("--peak-rss-kb", type=int)
parser.add_argument("--rounds", type=int)
parser.add_argument("--seconds", type=float)
parser.add_argument("--machine")
args = parser.parse_args()

groups = defaultdict(list)
for path in sorted(Path(args.runs).glob("*.r*.json")):
    scenario, conc, target, _round = path.name[: -len(".json")].split(".")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError:
        continue
    groups[(scenario, int(conc[1:]), target)].append(data)


def ms(seconds):
    return None if seconds is None else round(seconds * 1000, 3)


def median(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


rows = {}
for (scenario, conc, target), runs in groups.items():
    ok = [r for r in runs if r.get("summary", {}).get("successRate", 0) > 0]
    if not ok:
        continue
    rows[(scenario, conc, target)] = {
        "scenario": scenario,
        "concurrency": conc,
        "target": target,
        "runs": len(ok),
        "success_rate": median([r["summary"]["successRate"] for r in ok]),
        "requests_per_sec": median([r["summary"]["requestsPerSec"] for r in ok]),
        "p50_ms": median([ms(r["latencyPercentiles"].get("p50")) for r in ok]),
        "p99_ms": median([ms(r["latencyPercentiles"].get("p99")) for r in ok]),
        "first_byte_p50_ms": median([ms((r.get("firstBytePercentiles") or {}).get("p50")) for r in ok]),
        "first_byte_p99_ms": median([ms((r.get("firstBytePercentiles") or {}).get("p99")) for r in ok]),
    }

NGINX = ("nginx_n", "nginx_1", "nginx")


def harder_nginx(scenario, conc):
    """The faster of the nginx peers (worker_processes = cores, or 1) for this scenario."""
    peers = [rows[(scenario, conc, t)] for t in NGINX if (scenario, conc, t) in rows]
    peers = [p for p in peers if p["requests_per_sec"]]
    return max(peers, key=lambda p: p["requests_per_sec"]) if peers else None


for row in rows.values():
    direct = rows.get((row["scenario"], row["concurrency"], "direct"))
    if direct and row["target"] != "direct":
        for field in ("p50_ms", "p99_ms", "first_byte_p50_ms", "first_byte_p99_ms"):
            if row[field] is not None and direct[field] is not None:
                row["added_" + field] = round(row[field] - direct[field], 3)
        if row["scenario"] == "stream" and direct["p50_ms"]:
            row["total_stream_vs_direct_pct"] = round(100 * (row["p50_ms"] / direct["p50_ms"] - 1), 2)
for row in rows.values():
    nginx = harder_nginx(row["scenario"], row["concurrency"])
    if nginx and row["target"] not in ("direct",) + NGINX:
        row["nginx_peer"] = nginx["target"]
        row["rps_ratio_to_nginx"] = round(row["requests_per_sec"] / nginx["requests_per_sec"], 3)

reused = {c: rows.get(("big_reused", c, "reuse_instance")) for c in (1, 32)}
untouched = {c: rows.get(("big_untouched", c, "reuse_instance")) for c in (1, 32)}
reuse_added = {
    c: round(reused[c]["p50_ms"] - untouched[c]["p50_ms"], 3)
    for c in (1, 32)
    if reused[c] and untouched[c]
}

report = {
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "machine": args.machine,
    "rounds": args.rounds,
    "seconds_per_run": args.seconds,
    "memory": {
        "idle_rss_mb": round(args.idle_rss_kb / 1024, 1) if args.idle_rss_kb else None,
        "peak_rss_256_streams_mb": round(args.peak_rss_kb / 1024, 1) if args.peak_rss_kb else None,
    },
    "reuse_path_added_p50_ms_vs_untouched": reuse_added,
    "rows": sorted(rows.values(), key=lambda r: (r["scenario"], r["concurrency"], r["target"])),
}
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
(out / "results.json").write_text(json.dumps(report, indent=2))

names = {
    "pass_small": "small chat, pass-through",
    "stream": "SSE 64 chunks x 20 ms",
    "big_under": "1 MB conversation, under trigger",
    "big_untouched": "1 MB, x-compactor: off",
    "big_reused": "1 MB, over trigger, summary cached",
}


def fmt(value):
    return "–" if value is None else f"{value:g}"


lines = [
    f"Measured {report['date']} on {args.machine}; `scripts/bench.sh --rounds {args.rounds} --seconds {fmt(args.seconds)}`; medians over rounds.",
    "",
    "| scenario | c | target | req/s | p50 ms | p99 ms | added p50 | added p99 | first byte p99 | vs nginx |",
    "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
]
for row in report["rows"]:
    lines.append(
        f"| {names.get(row['scenario'], row['scenario'])} | {row['concurrency']} | {row['target']} | "
        f"{fmt(row['requests_per_sec'])} | {fmt(row['p50_ms'])} | {fmt(row['p99_ms'])} | "
        f"{fmt(row.get('added_p50_ms'))} | {fmt(row.get('added_p99_ms'))} | {fmt(row.get('first_byte_p99_ms'))} | "
        f"{fmt(row.get('rps_ratio_to_nginx'))} |"
    )
mem = report["memory"]


def get(scenario, conc, target, field):
    row = rows.get((scenario, conc, target))
    return None if row is None else row.get(field)


def best_nginx_added(conc, field):
    values = [get("pass_small", conc, t, field) for t in NGINX]
    values = [v for v in values if v is not None]
    return min(values) if values else None


targets = [
    ("small chat req/s vs the harder nginx, c=32", get("pass_small", 32, "compactor", "rps_ratio_to_nginx"), ">= 1.0x"),
    ("small chat req/s vs the harder nginx, c=128", get("pass_small", 128, "compactor", "rps_ratio_to_nginx"), ">= 1.0x"),
    ("added p50 at c=1, compactor / best nginx (ms)",
     f"{fmt(get('pass_small', 1, 'compactor', 'added_p50_ms'))} / {fmt(best_nginx_added(1, 'added_p50_ms'))}", "<= nginx"),
    ("added p99 at c=1, compactor / best nginx (ms)",
     f"{fmt(get('pass_small', 1, 'compactor', 'added_p99_ms'))} / {fmt(best_nginx_added(1, 'added_p99_ms'))}", "<= nginx"),
    ("streaming added first-byte p99 at c=1 (ms)", get("stream", 1, "compactor", "added_first_byte_p99_ms"), "< 0.5"),
    ("reuse path at 1 MB, added p50 over untouched (ms), c=1", reuse_added.get(1), "< 3"),
    ("idle RSS (MB)", mem["idle_rss_mb"], "< 20"),
    ("peak RSS, 256 streams (MB)", mem["peak_rss_256_streams_mb"], "< 64"),
]
lines += ["", "| target row | measured | target |", "|---|---:|---|"]
lines += [f"| {name} | {value if isinstance(value, str) else fmt(value)} | {goal} |" for name, value, goal in targets]
lines += [
    "",
    f"Reuse path, added p50 over forwarding the same 1 MB body untouched: {reuse_added} ms (by concurrency).",
    f"compactor RSS: idle {fmt(mem['idle_rss_mb'])} MB, peak under 256 concurrent streams {fmt(mem['peak_rss_256_streams_mb'])} MB.",
]
(out / "table.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))

# A small SVG chart: p50 and p99 of the small pass-through chat per target and concurrency.
chart_rows = [r for r in report["rows"] if r["scenario"] == "pass_small"]
width, bar_h, gap, left = 760, 14, 10, 210
scale_max = max([r["p99_ms"] or 0 for r in chart_rows] + [0.001])
height = 60 + len(chart_rows) * (2 * bar_h + gap)
svg = [
    f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
    f'<text x="10" y="20" font-size="14">Small chat pass-through latency (ms): p50 (dark) and p99 (light), {args.machine}</text>',
]
y = 40
colors = {"direct": "#555", "compactor": "#1f6feb", "compactor_shared": "#8250df", "nginx_n": "#2da44e", "nginx_1": "#4ac26b", "litellm": "#bf8700"}
for row in chart_rows:
    label = f"{row['target']} c={row['concurrency']}"
    color = colors.get(row["target"], "#888")
    for i, (field, opacity) in enumerate((("p50_ms", 1.0), ("p99_ms", 0.45))):
        value = row[field] or 0
        w = (width - left - 80) * value / scale_max
        yy = y + i * bar_h
        svg.append(f'<rect x="{left}" y="{yy}" width="{w:.1f}" height="{bar_h - 2}" fill="{color}" fill-opacity="{opacity}"/>')
        svg.append(f'<text x="{left + w + 4:.1f}" y="{yy + bar_h - 4}">{value:g}</text>')
    svg.append(f'<text x="10" y="{y + bar_h + 4}">{label}</text>')
    y += 2 * bar_h + gap
svg.append("</svg>")
(out / "latency.svg").write_text("\n".join(svg) + "\n")
