#!/usr/bin/env bash
# Runs every test: Rust unit, integration and black-box tests, then the Python suite (official
# openai, anthropic and google-genai SDKs, LangChain, and the real Claude Code, Codex, opencode and Gemini CLIs) against the real
# binaries. Sets up its own venv and the CLIs (npm install in tests/agents), and installs
# redis-server and node (apt-get, as root) when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# tests/suite/redis.rs starts real redis-server processes on loopback.
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq redis-server
  else
    echo "scripts/test.sh: redis-server is needed (apt-get install redis-server)" >&2
    exit 1
  fi
fi

# tests/python/test_agents.py and test_gemini.py drive the real Claude Code, Codex, opencode and Gemini CLIs, pinned in
# tests/agents/package.json and installed from the npm registry.
if ! command -v npm >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq nodejs npm
  else
    echo "scripts/test.sh: node and npm are needed (apt-get install nodejs npm)" >&2
    exit 1
  fi
fi
agents=tests/agents
agents_stamp="$agents/node_modules/.lock.sha256"
agents_want=$(sha256sum "$agents/package-lock.json" | cut -d' ' -f1)
# `npm install`, not `ci`: opencode-ai names twelve platform binaries as optional packages and
# the registry serves only some of them, so its lock cannot record the rest and `npm ci` refuses
# it as out of sync. With the lock in sync, `install` installs what it records.
if [ "$(cat "$agents_stamp" 2>/dev/null)" != "$agents_want" ]; then
  (cd "$agents" && npm install --no-audit --no-fund --loglevel=error)
  echo "$agents_want" > "$agents_stamp"
fi
# The Codex CLI with remote compaction v1, in its own folder: npm cannot install two versions of
# one package side by side, and its lock records only this platform's binary (npm leaves out
# the other platforms' aliased optional packages), so `npm install` (not `ci`) reads it.
codex_v1="$agents/codex-v1"
codex_v1_stamp="$codex_v1/node_modules/.lock.sha256"
codex_v1_want=$(sha256sum "$codex_v1/package-lock.json" | cut -d' ' -f1)
if [ "$(cat "$codex_v1_stamp" 2>/dev/null)" != "$codex_v1_want" ]; then
  (cd "$codex_v1" && npm install --no-audit --no-fund --loglevel=error)
  echo "$codex_v1_want" > "$codex_v1_stamp"
fi

cargo test --locked --workspace
cargo build --locked --workspace --bins

# A venv at DIR from REQUIREMENTS, made again only when they change (a stamp of their hash).
venv_from() { # DIR REQUIREMENTS
  local dir=$1 requirements=$2 want
  want=$(sha256sum "$requirements" | cut -d' ' -f1)
  if [ ! -x "$dir/bin/python" ] || [ "$(cat "$dir/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
    python3 -m venv "$dir"
    "$dir/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
    echo "$want" > "$dir/.requirements.sha256"
  fi
}
venv=.venv
venv_from "$venv" tests/python/requirements.txt
# The real LiteLLM proxy for tests/python/test_gateways.py, frozen in a venv of its own (its
# pins would fight the SDKs').
venv_from .venv-gateways tests/gateways/requirements.txt
"$venv/bin/python" -m pytest -q tests/python
