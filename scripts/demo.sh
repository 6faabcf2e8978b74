#!/usr/bin/env bash
# Starts the mock upstream and compactor in front of it, then shows requests going through:
# a plain chat, a stream, and a long conversation being compacted (summarized, then reused on
# the next turn, then re-summarized once it has grown past the trigger again), one agent run in
# the Responses API and one Claude Code-style run in Anthropic's Messages API compacted.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --release --workspace --bins
bin=target/release
source scripts/lib.sh

mock_stack --chunks 4
cat >> "$work/proxy.yaml" <<YAML
  trigger: [{type: messages, value: 12}]
  keep: {type: messages, value: 4}
  headroom: null
  summary_max_tokens: 64
YAML
proxy=http://$(start compactor "$bin/compactor" --config "$work/proxy.yaml")
echo "mock upstream: $upstream   compactor: $proxy"

echo; echo "== a chat request through compactor"
curl -sS "$proxy/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hello!"}]}'
echo; echo; echo "== a streamed reply, byte for byte"
curl -sS -N "$proxy/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"Hello!"}]}'

conversation() { # number of user/assistant exchanges, then the final question
  python3 - "$1" <<'PY'
import json, sys
n = int(sys.argv[1])
messages = [{"role": "system", "content": "You are a helpful assistant."}]
for i in range(n):
    messages.append({"role": "user", "content": f"Question {i}: tell me about topic {i}."})
    messages.append({"role": "assistant", "content": f"Answer {i}: topic {i} is interesting."})
messages.append({"role": "user", "content": "And what next?"})
print(json.dumps({"model": "gpt-4o-mini", "stream": True, "messages": messages}))
PY
}
for turns in 6 7 9; do
  echo; echo "== a conversation of $((turns * 2 + 2)) messages (trigger: 12 messages)"
  conversation "$turns" > "$work/body.json"
  curl -sS -N -D "$work/headers" -o "$work/reply" "$proxy/v1/chat/completions" \
    -H 'content-type: application/json' --data-binary @"$work/body.json"
  head -c 400 "$work/reply"
  echo; grep -i '^x-compactor' "$work/headers" || true
done
responses_run() { # turns of an agent run in the Responses API: reasoning, a call, its output
  python3 - "$1" <<'PY'
import json, sys
n = int(sys.argv[1])
items = [{"role": "developer", "content": "Work carefully."}]
for i in range(n):
    items.append({"role": "user", "content": [{"type": "input_text", "text": f"Task {i}: read file {i}."}]})
    items.append({"type": "reasoning", "id": f"rs_{i}", "summary": [], "encrypted_content": "gAAAA..."})
    items.append({"type": "function_call", "call_id": f"call_{i}", "name": "read_file", "arguments": json.dumps({"path": f"src/{i}.rs"})})
    items.append({"type": "function_call_output", "call_id": f"call_{i}", "output": f"fn f{i}() {{ /* body */ }}\n" * 60})
items.append({"role": "user", "content": "What next?"})
print(json.dumps({"model": "gpt-4.1", "instructions": "Be brief.", "store": False, "input": items}))
PY
}
echo; echo "== a Responses agent run of 22 items (POST /v1/responses, trigger: 12)"
responses_run 5 > "$work/body.json"
curl -sS -D "$work/headers" -o "$work/reply" "$proxy/v1/responses" \
  -H 'content-type: application/json' --data-binary @"$work/body.json"
head -c 400 "$work/reply"
echo; grep -i '^x-compactor' "$work/headers" || true

messages_run() { # tool turns of a Claude Code-style run: thinking, a Read call, its result
  python3 - "$1" <<'PY'
import json, sys
def signature(text):  # the mock upstream's stand-in for Anthropic's thinking signatures
    h = 0xcbf29ce484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001b3) % 2**64
    return f"sig{h:016x}"
n = int(sys.argv[1])
messages = [{"role": "user", "content": "Fix the failing test."}]
for i in range(n):
    messages.append({"role": "assistant", "content": [
        {"type": "thinking", "thinking": f"Look at file {i}.", "signature": signature(f"Look at file {i}.")},
        {"type": "tool_use", "id": f"toolu_{i}", "name": "Read", "input": {"file_path": f"src/{i}.rs"}}]})
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"fn f{i}() {{ /* body */ }}\n" * 60}]})
print(json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 1024, "system": "You are Claude Code.",
                  "tools": [{"name": "Read", "input_schema": {"type": "object"}}], "messages": messages}))
PY
}
echo; echo; echo "== a Messages run of 15 messages (POST /v1/messages, as Claude Code sends it; trigger: 12)"
messages_run 7 > "$work/body.json"
curl -sS -D "$work/headers" -o "$work/reply" "$proxy/v1/messages" \
  -H 'content-type: application/json' -H 'anthropic-version: 2023-06-01' --data-binary @"$work/body.json"
head -c 400 "$work/reply"
echo; grep -i '^x-compactor' "$work/headers" || true

echo; echo "== compactor's log"
cat "$work/compactor.log"
