#!/usr/bin/env bash
# The client-held limits under abuse, with compactor as shipped (release build, default limits,
# summarization on so chat bodies are read whole) in front of the mock upstreams, loopback only:
# stalled bodies (peak memory, how long they are held), 5 000 idle sockets (are normal requests
# still served), then a soak with oha (failures, memory before and after). About 3 minutes.
# The figures go into the README's Security section.
#
#   scripts/probe-limits.sh [soak seconds, default 60]
set -euo pipefail
cd "$(dirname "$0")/.."
soak=${1:-60}
cargo build --quiet --release --workspace --bins
bin=target/release
source scripts/lib.sh
if ! command -v oha >/dev/null 2>&1; then cargo install oha --locked --quiet; fi
mock_stack
addr=$(start compactor "$bin/compactor" --config "$work/proxy.yaml")
pid=$(cat "$work/compactor.pid")
python3 scripts/probes/limits.py --addr "$addr" --pid "$pid"
rss() { awk '/VmRSS/ {printf "%.0f", $2 / 1024}' "/proc/$pid/status"; }
before=$(rss)
body='{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello"}]}'
oha --no-tui -z "${soak}s" -c 32 -m POST -H 'content-type: application/json' -d "$body" \
  "http://$addr/v1/chat/completions" > "$work/soak.txt"
total=$(grep -oE '\[200\] [0-9]+' "$work/soak.txt" | awk '{print $2}')
others=$(grep -E '^\s*\[[0-9]+\]' "$work/soak.txt" | grep -v '\[200\]' || true)
errors=$(sed -n '/Error distribution/,$p' "$work/soak.txt" | tail -n +2 || true)
echo "soak: ${soak} s at 32 connections: ${total:-0} answered 200; other statuses: ${others:-none}; errors: ${errors:-none}; RSS ${before} MB before, $(rss) MB after"
echo "compactor log: $(grep -cE 'ERROR|panicked' "$work/compactor.log" || true) errors or panics"
