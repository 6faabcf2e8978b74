"""Mixed traffic against compactor for a number of minutes, RSS sampled every 10 s (see
scripts/soak.sh). Standard library only: each client is a thread with its own keep-alive
connection."""

import argparse
import http.client
import json
import random
import threading
import time

parser = argparse.ArgumentParser()
parser.add_argument("--addr", required=True)
parser.add_argument("--pid", required=True)
parser.add_argument("--minutes", type=float, default=20)
parser.add_argument("--clients", type=int, default=32)
args = parser.parse_args()
host, port = args.addr.split(":")
deadline = time.monotonic() + args.minutes * 60
counts = {}
lock = threading.Lock()


def rss_mb():
    with open(f"/proc/{args.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


def conversation(seed, turns):
    rng = random.Random(seed)
    messages = [{"role": "system", "content": "You are a careful coding agent."}]
    for turn in range(turns):
        words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "error", "E1234", "src/main.rs"]) for _ in range(120))
        messages.append({"role": "user", "content": f"step {turn} of task {seed}: {words}"})
        messages.append({"role": "assistant", "content": f"done {turn}: {words[:200]}"})
    messages.append({"role": "user", "content": "go on"})
    return messages


def request(rng):
    """One request of the mix: (kind, method, path, body bytes)."""
    roll = rng.random()
    if roll < 0.45:
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]}
        return "chat", "POST", "/v1/chat/completions", json.dumps(body).encode()
    if roll < 0.60:
        body = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        return "stream", "POST", "/v1/chat/completions", json.dumps(body).encode()
    if roll < 0.75:
        # A conversation new to the cache, over the trigger: summarized, and the summary kept
        # until the cache's byte cap evicts it.
        body = {"model": "gpt-4o-mini", "messages": conversation(rng.getrandbits(48), 16)}
        return "new-conversation", "POST", "/v1/chat/completions", json.dumps(body).encode()
    if roll < 0.90:
        # The next turn of one of a few recent conversations: reused.
        body = {"model": "gpt-4o-mini", "messages": conversation(rng.randrange(64), 16)}
        return "next-turn", "POST", "/v1/chat/completions", json.dumps(body).encode()
    if roll < 0.95:
        return "bad-json", "POST", "/v1/chat/completions", b'{"model": "gpt-4o-mini", "messages": ['
    if roll < 0.98:
        return "unknown-route", "GET", "/v1/nothing-here", b""
    return "oversized", "POST", "/v1/chat/completions", b"x" * (33 * 1024 * 1024)


def client(index):
    rng = random.Random(index)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    while time.monotonic() < deadline:
        kind, method, path, body = request(rng)
        try:
            connection.request(method, path, body=body, headers={"content-type": "application/json"})
            response = connection.getresponse()
            response.read()
            outcome = f"{kind} {response.status}"
            if response.getheader("connection", "").lower() == "close":
                connection.close()
                connection = http.client.HTTPConnection(host, int(port), timeout=60)
        except Exception as error:  # noqa: BLE001 - counted, then a new connection
            outcome = f"{kind} {type(error).__name__}"
            connection.close()
            connection = http.client.HTTPConnection(host, int(port), timeout=60)
        with lock:
            counts[outcome] = counts.get(outcome, 0) + 1


threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
for thread in threads:
    thread.start()
started = time.monotonic()
samples = []
print(f"RSS at start: {rss_mb():.0f} MB", flush=True)
while time.monotonic() < deadline:
    time.sleep(10)
    samples.append((time.monotonic() - started, rss_mb()))
    if len(samples) % 6 == 0:
        with lock:
            total = sum(counts.values())
        print(f"{samples[-1][0] / 60:5.1f} min  RSS {samples[-1][1]:6.0f} MB  requests {total}", flush=True)
for thread in threads:
    thread.join(timeout=90)
with lock:
    for outcome in sorted(counts):
        print(f"  {outcome}: {counts[outcome]}")
# What the configured caps hold at the end: the summary cache against cache.max_bytes.
try:
    metrics = http.client.HTTPConnection(host, int(port), timeout=10)
    metrics.request("GET", "/metrics")
    text = metrics.getresponse().read().decode()
    for line in text.splitlines():
        if line.startswith(("compactor_summary_cache_bytes", "compactor_summary_cache_entries",
                            "compactor_summarizer_calls_total", "compactor_compactions_total")):
            print(f"  {line}")
except OSError as error:
    print(f"  metrics unavailable: {error}")
last_quarter = [rss for at, rss in samples if at >= 0.75 * samples[-1][0]]
half = [rss for at, rss in samples if 0.5 * samples[-1][0] <= at < 0.75 * samples[-1][0]]
print(f"plateau: RSS {min(last_quarter):.0f}-{max(last_quarter):.0f} MB over the last quarter "
      f"(third quarter {min(half):.0f}-{max(half):.0f} MB), peak {max(rss for _, rss in samples):.0f} MB")
