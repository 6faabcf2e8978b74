#!/usr/bin/env bash
# Fuzzes the parser, planner and rewrite with cargo-fuzz (libFuzzer). Not run by CI.
#   scripts/fuzz.sh [seconds]     (default 60)
# Seeds are real-shaped conversations up to about 1 MB (scripts/fuzz_seeds.py), the dictionary
# holds the format's tokens, and the target checks every rewrite with its own oracle.
# cargo-fuzz needs nightly features; RUSTC_BOOTSTRAP lets the stable toolchain provide them.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
python3 scripts/fuzz_seeds.py fuzz/corpus/plan
RUSTC_BOOTSTRAP=1 cargo fuzz run plan fuzz/corpus/plan -- \
  -max_total_time="${1:-60}" -max_len=1048576 -dict=fuzz/plan.dict
