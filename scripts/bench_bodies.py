"""Request bodies for scripts/bench.sh: a small chat, a streamed chat, a ~1 MB agent conversation."""

import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
small = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Say hello."}]}
(out / "small.json").write_text(json.dumps(small))
(out / "stream.json").write_text(json.dumps({**small, "stream": True}))

messages = [{"role": "system", "content": "You are a coding agent. Follow the rules.\n" * 20}]
size, i = 0, 0
while size < 1024 * 1024 or i % 4:
    if i % 4 == 0:
        m = {"role": "user", "content": f"Step {i}: please look at \"src/main.rs\" and fix the bug."}
    elif i % 4 == 1:
        m = {"role": "assistant", "content": None, "tool_calls": [{"id": f"call_{i}", "type": "function",
             "function": {"name": "read_file", "arguments": json.dumps({"path": f"/repo/src/file_{i}.rs"})}}]}
    elif i % 4 == 2:
        m = {"role": "tool", "tool_call_id": f"call_{i - 1}", "content": f"fn main() {{\n    println!(\"{i}\");\n}}\n" * 12}
    else:
        m = {"role": "assistant", "content": f"I changed line {i}; the tests pass now. " * 4}
    messages.append(m)
    size += len(json.dumps(m))
    i += 1
messages.append({"role": "user", "content": "What next?"})
(out / "big.json").write_text(json.dumps({"model": "gpt-4o-mini", "messages": messages}))
