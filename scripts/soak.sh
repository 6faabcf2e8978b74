#!/usr/bin/env bash
# Where compactor's memory levels off under mixed traffic: compactor as shipped (release build,
# default limits and cache caps, summarization on) in front of the mock upstream and a mock
# summarizer, loopback only. scripts/soak.py drives 32 clients for the given minutes: small
# chats, streams, long conversations that are each new to the summary cache (so it fills to
# its cap), the next turn of a recent one (reused), and bad input (broken JSON, oversized
# bodies, unknown routes). RSS is printed each minute; the closing lines give the plateau and
# the configured bounds it should sit under.
#
#   scripts/soak.sh [minutes, default 20]
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-20}
cargo build --quiet --release --workspace --bins
bin=target/release
source scripts/lib.sh
mock_stack
cat >> "$work/proxy.yaml" <<YAML
  trigger: [{type: tokens, value: 4000}]
  max_calls_per_minute_per_tenant: 100000
  max_concurrent_calls_per_tenant: 64
  max_concurrent_calls: 64
YAML
addr=$(start compactor "$bin/compactor" --config "$work/proxy.yaml")
pid=$(cat "$work/compactor.pid")
python3 scripts/soak.py --addr "$addr" --pid "$pid" --minutes "$minutes"
echo "compactor log: $(grep -cE 'ERROR|panicked' "$work/compactor.log" || true) errors or panics"
