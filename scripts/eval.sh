#!/usr/bin/env bash
# The compaction eval's pipeline tier (no model, deterministic, seconds): 60 generated agent runs
# (English, code, CJK) with planted facts, through compactor's strategies and the references'
# policies; prints which facts are kept verbatim, in the forwarded summary, only shown to the
# summarizer, or lost outright.
# The same test runs in CI with its thresholds (tests/suite/eval.rs). The model tier (a real
# summarizer and answering model) is scripts/eval-model.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --quiet --test suite eval:: -- --nocapture 2>&1 | grep -E '^\|'
