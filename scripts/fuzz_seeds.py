"""Writes seed conversations for the fuzzer: agent runs with parallel and non-adjacent tool
calls, skill reads, CJK, escapes and image parts, from a few hundred bytes to about 1 MB."""
import json
import random
import sys
from pathlib import Path


def conversation(rng: random.Random, turns: int) -> dict:
    messages = [{"role": "system", "content": "You are an agent. " * rng.randint(1, 20)}]
    call = 0
    for _ in range(turns):
        kind = rng.random()
        if kind < 0.3:
            messages.append({"role": "user", "content": rng.choice(["fix it", "你好，世界", "quote \" and \\ slash", "x" * rng.randint(1, 3000)])})
        elif kind < 0.45:
            messages.append({"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 200}}]})
        elif kind < 0.6:
            messages.append({"role": "assistant", "content": "done " * rng.randint(1, 50)})
        else:
            ids = []
            for _ in range(rng.randint(1, 3)):
                call += 1
                ids.append(f"call_{call}")
            path = rng.choice(["/mnt/skills/public/a/SKILL.md", "/repo/src/main.rs", "/mnt/skills/../etc/passwd"])
            messages.append({"role": "assistant", "content": None, "tool_calls": [{"id": i, "type": "function", "function": {"name": rng.choice(["read_file", "bash"]), "arguments": json.dumps({"path": path})}} for i in ids]})
            rng.shuffle(ids)
            for i in ids:
                messages.append({"role": "tool", "tool_call_id": i, "content": "line\n" * rng.randint(1, 400)})
    messages.append({"role": "user", "content": "next?"})
    return {"model": "gpt-4o", "stream": True, "messages": messages}


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(7)
    for n, turns in enumerate([3, 8, 20, 60, 200, 800]):
        (out / f"seed-{n}.json").write_text(json.dumps(conversation(rng, turns), ensure_ascii=rng.random() < 0.5))


if __name__ == "__main__":
    main()
