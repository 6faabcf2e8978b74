#!/usr/bin/env bash
# Fuzzes the parser, planner and rewrite with cargo-fuzz (libFuzzer). Not run by CI.
#   scripts/fuzz.sh [seconds]     (default 60)
# cargo-fuzz needs nightly features; RUSTC_BOOTSTRAP lets the stable toolchain provide them.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
mkdir -p fuzz/corpus/plan
printf '%s' '{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"q"},{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"/mnt/skills/x\"}"}}]},{"role":"tool","tool_call_id":"a","content":"r"},{"role":"user","content":"q2"}]}' > fuzz/corpus/plan/seed.json
RUSTC_BOOTSTRAP=1 cargo fuzz run plan fuzz/corpus/plan -- -max_total_time="${1:-60}" -max_len=4096
