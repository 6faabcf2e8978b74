#!/usr/bin/env bash
# Runs anthropic_ts.mjs against compactor (mocks on loopback) with the TypeScript SDK version
# given as $1 (default 1.16.0). Needs node and npm; not part of the test suite, which cannot
# assume node: its findings are recorded in docs/apis.md ("The Messages API").
set -euo pipefail
cd "$(dirname "$0")/../.."
version=${1:-1.16.0}
cargo build --quiet --workspace --bins
bin=target/debug
source scripts/lib.sh
(cd "$work" && npm install --silent --no-save "@anthropic-ai/sdk@$version" >/dev/null)
cp scripts/probes/anthropic_ts.mjs "$work/"
mock_stack --chunks 4
cat >> "$work/proxy.yaml" <<YAML
  trigger: [{type: messages, value: 8}]
  keep: {type: messages, value: 2}
  summary_max_tokens: 32
YAML
proxy=http://$(start compactor "$bin/compactor" --config "$work/proxy.yaml")
echo "@anthropic-ai/sdk $version, node $(node --version)"
(cd "$work" && COMPACTOR_URL=$proxy node anthropic_ts.mjs)
