#!/usr/bin/env bash
# What the metrics cost on the pass-through path: two compactor instances as shipped (default
# log level, compaction on with the trigger far away), one with telemetry.metrics on (the
# default) and one with it off, driven in alternating rounds by oha against the same mock, small
# chat completions at c=1 and c=32. Loopback only, bounded in time.
#
#   scripts/bench-metrics.sh [--rounds N] [--seconds S] [--out DIR]
#
# Writes DIR/table.md (default bench-results/metrics). Installs oha when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=5
seconds=4
out=bench-results/metrics
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

cargo build --quiet --release --workspace --bins
bin=$PWD/target/release
command -v oha >/dev/null 2>&1 || cargo install oha --locked --quiet
mkdir -p "$out"
source scripts/lib.sh

mock=$(start mock "$bin/mock-upstream" --listen 127.0.0.1:0 --no-validate)
for metrics in true false; do
  cat > "$work/metrics-$metrics.yaml" <<YAML
listen: 127.0.0.1:0
upstreams:
  - name: mock
    base_url: http://$mock/v1
summarization:
  enabled: true
  trigger: [{type: tokens, value: 100000000}]
telemetry:
  metrics: $metrics
YAML
done
unset RUST_LOG
on=$(start metrics_on "$bin/compactor" --config "$work/metrics-true.yaml")
off=$(start metrics_off "$bin/compactor" --config "$work/metrics-false.yaml")
python3 scripts/bench_bodies.py "$work"

for round in $(seq 1 "$rounds"); do
  echo "== round $round of $rounds"
  for c in 1 32; do
    # Alternate which goes first, so drift on this shared machine hits both alike.
    order="on off"; [ $((round % 2)) = 0 ] && order="off on"
    for target in $order; do
      addr=$on; [ "$target" = off ] && addr=$off
      oha --no-tui --output-format json -o "$work/c$c.$target.r$round.json" -c "$c" -z "${seconds}s" \
        -m POST -T application/json -D "$work/small.json" "http://$addr/v1/chat/completions" >/dev/null
    done
  done
done
# The instance with metrics on really counted them.
curl -fsS "http://$on/metrics" | grep -q 'compactor_requests_total{route="chat_completions"' \
  || { echo "the metrics instance counted nothing" >&2; exit 1; }

python3 - "$work" "$out" "$rounds" "$seconds" <<'PY'
import json, statistics, sys, pathlib, datetime, os
work, out, rounds, seconds = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = []
for c in (1, 32):
    figures = {}
    for target in ("on", "off"):
        runs = [json.loads(p.read_text()) for p in sorted(work.glob(f"c{c}.{target}.r*.json"))]
        figures[target] = {
            "rps": [r["summary"]["requestsPerSec"] for r in runs],
            "p50": [1000 * r["latencyPercentiles"]["p50"] for r in runs],
            "p99": [1000 * r["latencyPercentiles"]["p99"] for r in runs],
        }
    on, off = figures["on"], figures["off"]
    med = statistics.median
    rows.append(
        f"| {c} | {med(on['rps']):.0f} | {med(off['rps']):.0f} | {100 * (med(on['rps']) / med(off['rps']) - 1):+.1f} % "
        f"| {med(on['p50']):.3f} / {med(off['p50']):.3f} | {med(on['p99']):.3f} / {med(off['p99']):.3f} "
        f"| {min(on['rps']):.0f}–{max(on['rps']):.0f} vs {min(off['rps']):.0f}–{max(off['rps']):.0f} |"
    )
table = [
    f"Metrics on vs off, small chat pass-through, oha {seconds} s x {rounds} rounds alternating, "
    f"{os.cpu_count()} cores, {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC (medians)",
    "",
    "| c | req/s on | req/s off | on vs off | p50 ms on / off | p99 ms on / off | req/s range on vs off |",
    "|---:|---:|---:|---:|---:|---:|---|",
    *rows,
]
(out / "table.md").write_text("\n".join(table) + "\n")
print("\n".join(table))
PY
