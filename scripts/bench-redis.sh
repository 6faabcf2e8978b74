#!/usr/bin/env bash
# The reuse path with the Redis tier: the same ~1 MB conversation over the trigger, its summary
# made once, then driven by oha through
#   local:  a replica whose in-process cache holds the summary (a local hit, no round trip),
#   remote: a replica whose in-process cache can hold nothing (cache.max_bytes: 1), so every
#           request asks Redis (a Redis hit, then planning again with it),
# each against the same body untouched on the same replica (x-compactor: off). Loopback only,
# bounded in time; a redis-server of its own on a free port.
#
#   scripts/bench-redis.sh [--rounds N] [--seconds S] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=3
seconds=4
out=bench-results/redis
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
command -v redis-server >/dev/null 2>&1 || { echo "redis-server is needed" >&2; exit 1; }
mkdir -p "$out"
source scripts/lib.sh

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no > "$work/redis.log" 2>&1 &
echo $! > "$work/redis.pid"
for _ in $(seq 1 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done

mock=$(start mock "$bin/mock-upstream" --listen 127.0.0.1:0 --no-validate)
summarizer=$(start summarizer "$bin/mock-upstream" --listen 127.0.0.1:0 --mode summarizer)
for tier in local remote; do
  max_bytes=67108864; [ "$tier" = remote ] && max_bytes=1
  cat > "$work/$tier.yaml" <<YAML
listen: 127.0.0.1:0
upstreams:
  - name: mock
    base_url: http://$mock/v1
  - name: summarizer
    base_url: http://$summarizer/v1
    models: ["summarizer-*"]
summarization:
  enabled: true
  upstream: summarizer
  model_name: summarizer-model
  trigger: [{type: tokens, value: 100000}]
  keep: {type: messages, value: 20}
cache:
  max_bytes: $max_bytes
  backend: redis
  redis:
    url: redis://127.0.0.1:$port
    signing_key: bench-signing-key-0123456789
YAML
done
unset RUST_LOG
local_addr=$(start local "$bin/compactor" --config "$work/local.yaml")
remote_addr=$(start remote "$bin/compactor" --config "$work/remote.yaml")
python3 scripts/bench_bodies.py "$work"
post=(-m POST -T application/json -D "$work/big.json")
# The summary is made once, by the local replica; the remote one only ever reads it.
curl -fsS -o /dev/null -D "$work/warm.headers" "http://$local_addr/v1/chat/completions" \
  -H 'content-type: application/json' --data-binary @"$work/big.json"
grep -qi 'x-compactor-compaction: summarized' "$work/warm.headers" || { echo "warm-up did not summarize" >&2; exit 1; }
curl -fsS -o /dev/null -D "$work/remote.headers" "http://$remote_addr/v1/chat/completions" \
  -H 'content-type: application/json' --data-binary @"$work/big.json"
grep -qi 'x-compactor-compaction: reused' "$work/remote.headers" || { echo "the remote replica did not reuse" >&2; exit 1; }

for round in $(seq 1 "$rounds"); do
  echo "== round $round of $rounds"
  for c in 1 8; do
    for tier in local remote; do
      addr=$local_addr; [ "$tier" = remote ] && addr=$remote_addr
      oha --no-tui --output-format json -o "$work/c$c.$tier.untouched.r$round.json" -c "$c" -z "${seconds}s" \
        "${post[@]}" -H 'x-compactor: off' "http://$addr/v1/chat/completions" >/dev/null
      oha --no-tui --output-format json -o "$work/c$c.$tier.reused.r$round.json" -c "$c" -z "${seconds}s" \
        "${post[@]}" "http://$addr/v1/chat/completions" >/dev/null
    done
  done
done
calls=$(curl -fsS "http://$remote_addr/metrics" | awk '/^compactor_summarizer_calls_total\{result="ok"\}/{print $2}')

python3 - "$work" "$out" "$rounds" "$seconds" "${calls:-0}" <<'PY'
import json, statistics, sys, pathlib, datetime, os
work, out, rounds, seconds, calls = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), *sys.argv[3:6]
med = statistics.median
def figures(c, tier, kind):
    runs = [json.loads(p.read_text()) for p in sorted(work.glob(f"c{c}.{tier}.{kind}.r*.json"))]
    return {k: med([1000 * r["latencyPercentiles"][k] for r in runs]) for k in ("p50", "p99")} | {
        "rps": med([r["summary"]["requestsPerSec"] for r in runs])}
rows = []
for c in (1, 8):
    for tier, label in (("local", "local hit (in-process cache)"), ("remote", "Redis hit (in-process cache empty)")):
        u, r = figures(c, tier, "untouched"), figures(c, tier, "reused")
        met = "met" if r["p50"] - u["p50"] < 3 else "**missed**"
        rows.append(f"| {label} | {c} | {u['p50']:.2f} / {u['p99']:.2f} | {r['p50']:.2f} / {r['p99']:.2f} | {r['p50'] - u['p50']:+.2f} | {met} |")
table = [
    f"Reuse path at ~1 MB with the Redis tier, oha {seconds} s x {rounds} rounds, {os.cpu_count()} cores, "
    f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC (medians; summarizer calls by the remote replica: {calls})",
    "",
    "| reuse from | c | untouched p50 / p99 ms | reused p50 / p99 ms | reused − untouched p50 ms | < 3 ms target |",
    "|---|---:|---:|---:|---:|---|",
    *rows,
]
(out / "table.md").write_text("\n".join(table) + "\n")
print("\n".join(table))
PY
