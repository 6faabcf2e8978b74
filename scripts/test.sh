#!/usr/bin/env bash
# Runs every test: Rust unit, integration and black-box tests, then the Python SDK suite
# (official openai SDK + LangChain) against the real binaries. Sets up its own venv.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --locked --workspace
cargo build --locked --workspace --bins

venv=.venv
stamp="$venv/.requirements.sha256"
want=$(sha256sum tests/python/requirements.txt | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/python/requirements.txt
  echo "$want" > "$stamp"
fi
"$venv/bin/python" -m pytest -q tests/python
