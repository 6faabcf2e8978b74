#!/usr/bin/env bash
# Runs every test: Rust unit, integration and black-box tests, then the Python SDK suite
# (official openai SDK + LangChain) against the real binaries. Sets up its own venv, and
# installs redis-server (apt-get, as root) when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# tests/redis.rs starts real redis-server processes on loopback.
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq redis-server
  else
    echo "scripts/test.sh: redis-server is needed (apt-get install redis-server)" >&2
    exit 1
  fi
fi

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
