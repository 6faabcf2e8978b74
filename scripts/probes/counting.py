"""Counting against a real model server (scripts/counting-check.sh drives it): compactor's token
count against the server's own `usage.prompt_tokens`, per class of text, before and after
calibration, and what happens to a conversation that grows past the server's window.

Reads compactor's debug log (`compactor::calibration` lines, JSON) for the count it made of each
forwarded body; stdlib only, loopback only, bounded.
"""

import argparse
import json
import random
import statistics
import time
import urllib.error
import urllib.request

WORDS = (
    "the deployment failed because migration locked orders table for twelve minutes so we "
    "rolled back and scheduled it weekend window with smaller batch size customer reported "
    "latency spike after release cache invalidation service restarted cluster node memory "
    "pressure query plan index missing on column created ticket follow up review tomorrow"
).split()
IDENTIFIERS = "config parser request buffer retry_count upstream handle window summary tokens".split()
CJK = (
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学"
    "对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经"
    "データベースの移行は週末に行いますサーバーが再起動されました"
)
CLASSES = ["prose", "code", "json", "cjk"]


def prose(rng, sentences):
    return " ".join(
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 16))).capitalize() + "."
        for _ in range(sentences)
    )


def code(rng, lines):
    out = ["```rust"]
    for _ in range(lines):
        a, b, n = rng.choice(IDENTIFIERS), rng.choice(IDENTIFIERS), rng.randint(0, 5000)
        out.append(rng.choice([
            f"fn {a}_{b}(&self, {b}: usize) -> Result<Vec<u8>, Error> {{",
            f"    let {a} = self.{b}.get({n}).ok_or(Error::Missing)?;",
            f"    if {a}.len() > {n} {{ return Err(Error::TooLong({a}.len())); }}",
            "}",
        ]))
    return "\n".join(out + ["```"])


def json_output(rng, items):
    return json.dumps([
        {"id": rng.randint(0, 99999), "status": rng.choice(["failed", "ok", "queued"]),
         "latency_ms": rng.randint(0, 99999) / 10, "host": f"node-{rng.randint(0, 63)}.internal",
         "tags": [rng.choice(WORDS), rng.choice(WORDS)], "retries": rng.randint(0, 4)}
        for _ in range(items)
    ])


def cjk(rng, sentences):
    return "".join("".join(rng.choice(CJK) for _ in range(rng.randint(15, 40))) + "。"
                   for _ in range(sentences))


def turn(kind, rng, t):
    if kind == "prose":
        return [{"role": "user", "content": prose(rng, rng.randint(2, 4))},
                {"role": "assistant", "content": prose(rng, rng.randint(5, 9))}]
    if kind == "code":
        return [{"role": "user", "content": "Fix this:\n" + code(rng, 6)},
                {"role": "assistant", "content": code(rng, rng.randint(10, 16))}]
    if kind == "json":
        call = f"call_{t}_{rng.randint(0, 10**6)}"
        return [
            {"role": "user", "content": "Which jobs failed?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": call, "type": "function",
             "function": {"name": "list_jobs", "arguments": json.dumps({"page": t})}}]},
            {"role": "tool", "tool_call_id": call, "content": json_output(rng, rng.randint(3, 6))},
            {"role": "assistant", "content": "Two of them failed."},
        ]
    return [{"role": "user", "content": cjk(rng, rng.randint(2, 3))},
            {"role": "assistant", "content": cjk(rng, rng.randint(4, 6))}]


def conversation(kind, rng, turns):
    messages = [{"role": "system", "content": "You are a careful assistant."}]
    for t in range(turns):
        messages += turn(kind, rng, t)
    return messages + [{"role": "user", "content": "And now? Answer in one word."}]


class Compactor:
    def __init__(self, addr, log):
        self.url = f"http://{addr}/v1/chat/completions"
        self.log = log
        self.seen = 0

    def post(self, model, messages, stream=False, max_tokens=4):
        body = {"model": model, "messages": messages, "max_tokens": max_tokens}
        if stream:
            body["stream"] = True
        request = urllib.request.Request(self.url, json.dumps(body).encode(),
                                         {"content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def samples(self, model):
        """Calibration samples of `model` logged since the last call: (estimated, counted)."""
        deadline = time.time() + 10
        while time.time() < deadline:
            lines = open(self.log, encoding="utf-8", errors="replace").read().splitlines()
            found = []
            for line in lines[self.seen:]:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                fields = event.get("fields", event)
                if event.get("target") == "compactor::calibration" and fields.get("model") == model:
                    found.append((fields["estimated"], fields["counted"]))
            if found:
                self.seen = len(lines)
                return found
            time.sleep(0.05)
        return []


def streamed_text(body):
    """The text a chat-completions stream carried."""
    text = []
    for line in body.decode("utf-8", "replace").splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        try:
            chunk = json.loads(line[6:])
        except ValueError:
            continue
        for choice in chunk.get("choices", []):
            text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)


def ratio_row(name, ratios):
    lo, hi = min(ratios), max(ratios)
    mean = statistics.mean(ratios)
    return f"| {name} | {mean:.2f} ({lo:.2f}–{hi:.2f}) |"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--addr", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--window", type=int, default=4096)
    args = parser.parse_args()
    proxy = Compactor(args.addr, args.log)
    rng = random.Random(25)

    # Before: every request names a model compactor has never seen, so its count is the
    # configured ratio alone.
    before = {kind: [] for kind in CLASSES}
    for i in range(3):
        for kind in CLASSES:
            model = f"smollm2-fresh-{kind}-{i}"
            status, _, body = proxy.post(model, conversation(kind, rng, rng.randint(1, 4)))
            assert status == 200, body[:300]
            for estimated, counted in proxy.samples(model):
                before[kind].append(estimated / counted)

    # Calibration: ordinary traffic of one model, then fresh conversations measured.
    for _ in range(2):
        for kind in CLASSES:
            status, _, body = proxy.post("smollm2", conversation(kind, rng, rng.randint(1, 4)))
            assert status == 200, body[:300]
            proxy.samples("smollm2")
    after = {kind: [] for kind in CLASSES}
    for _ in range(3):
        for kind in CLASSES:
            status, _, body = proxy.post("smollm2", conversation(kind, rng, rng.randint(1, 4)))
            assert status == 200, body[:300]
            for estimated, counted in proxy.samples("smollm2"):
                after[kind].append(estimated / counted)

    print("| text | estimate / real, before | after calibration |")
    print("|---|---|---|")
    for kind in CLASSES:
        b = ratio_row(kind, before[kind]).split("|")[2].strip()
        a = ratio_row(kind, after[kind]).split("|")[2].strip()
        print(f"| {kind} | {b} | {a} |")

    # A CJK conversation grown past the window, streamed, as a chat app sends it: with a
    # model compactor never saw (the ratio alone) and with the calibrated one.
    print()
    print("| CJK conversation grown past the window, streamed | uncalibrated | calibrated |")
    print("|---|---|---|")
    outcomes = {}
    for model in ["smollm2-fresh-growth", "smollm2"]:
        grow = random.Random(7)
        fresh = model != "smollm2"
        messages = conversation("cjk", grow, 1)
        empty = compacted = errors = 0
        for t in range(16):
            question = messages.pop()
            messages += turn("cjk", grow, 100 + t)
            messages.append(question)
            # A fresh name per turn keeps the "before" column uncalibrated throughout.
            name = f"{model}-{t}" if fresh else model
            status, headers, body = proxy.post(name, messages, stream=True)
            if status != 200:
                errors += 1
            elif not streamed_text(body):
                empty += 1
            if headers.get("x-compactor-compaction") in ("summarized", "reused", "truncated"):
                compacted += 1
        outcomes[model] = (empty, compacted, errors)
    rows = [("empty 200 streams", 0), ("compacted turns", 1), ("error answers", 2)]
    for name, index in rows:
        print(f"| {name} | {outcomes['smollm2-fresh-growth'][index]} | {outcomes['smollm2'][index]} |")


if __name__ == "__main__":
    main()
