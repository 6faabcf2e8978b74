"""What the client-held limits hold under abuse, against a running compactor (loopback only).

  stalled   N clients each send a burst of the body, then nothing: compactor's peak RSS, how
            many got 408, and how long the last one held its bytes.
  idle      N sockets opened and left idle (spread over 127.0.0.2-.6 so the per-address cap is
            not what stops them), then normal requests on fresh connections from 127.0.0.1:
            how many are served.

Run by scripts/probe-limits.sh, which starts compactor and the mocks and then the soak.
Prints one line per figure; exits non-zero when a normal client was not served.
"""

import argparse
import asyncio
import json
import resource
import time


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def normal_request(host: str, port: int, source: str = "127.0.0.1") -> int:
    body = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host, port, local_addr=(source, 0)), 10
    )
    writer.write(
        (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n{body}"
        ).encode()
    )
    await writer.drain()
    status_line = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    try:
        return int(status_line.split()[1])
    except (IndexError, ValueError):
        return 0


async def stalled(host: str, port: int, pid: int, clients: int, burst: int) -> None:
    declared = burst * 2
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {declared}\r\n\r\n"
    ).encode()
    prefix = b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"'
    chunk = prefix + b"x" * (burst - len(prefix))
    answers: list[tuple[str, float]] = []
    started = time.monotonic()

    async def one() -> None:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(head)
            writer.write(chunk)
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), 130)
            answers.append((line.decode(errors="replace").strip(), time.monotonic() - started))
            writer.close()
        except (OSError, asyncio.TimeoutError) as error:
            answers.append((f"error {type(error).__name__}", time.monotonic() - started))

    tasks = [asyncio.create_task(one()) for _ in range(clients)]
    peak, baseline = 0.0, rss_mb(pid)
    while not all(task.done() for task in tasks):
        peak = max(peak, rss_mb(pid))
        await asyncio.sleep(0.2)
    served = await normal_request(host, port)
    codes: dict[str, int] = {}
    for line, _ in answers:
        code = line.split(" ")[1] if line.startswith("HTTP/") else line
        codes[code] = codes.get(code, 0) + 1
    last = max(at for _, at in answers)
    print(
        f"stalled: {clients} clients x {burst / 1e6:.0f} MB burst then silence: "
        f"RSS {baseline:.0f} MB before, {peak:.0f} MB peak; answers {codes}; "
        f"the last released after {last:.1f} s; a normal request afterwards: {served}"
    )


async def idle(host: str, port: int, pid: int, sockets: int, requests: int) -> bool:
    sources = [f"127.0.0.{i}" for i in range(2, 7)]
    held = []
    for i in range(sockets):
        try:
            _, writer = await asyncio.open_connection(host, port, local_addr=(sources[i % 5], 0))
            held.append(writer)
        except OSError:
            break
    await asyncio.sleep(0.5)  # probe pacing: let compactor accept them before measuring
    statuses = []
    for _ in range(requests):
        statuses.append(await normal_request(host, port))
    for writer in held:
        writer.close()
    ok = statuses.count(200)
    print(
        f"idle: {len(held)} idle sockets opened (5 addresses); normal requests after: "
        f"{ok}/{requests} served 200, others {sorted(set(s for s in statuses if s != 200))}; "
        f"compactor RSS {rss_mb(pid):.0f} MB"
    )
    return ok == requests


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--addr", required=True)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--stalled-clients", type=int, default=40)
    parser.add_argument("--burst-mb", type=int, default=10)
    parser.add_argument("--idle-sockets", type=int, default=5000)
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    host, port = args.addr.rsplit(":", 1)
    await stalled(host, int(port), args.pid, args.stalled_clients, args.burst_mb * 1_000_000)
    served = await idle(host, int(port), args.pid, args.idle_sockets, args.requests)
    return 0 if served else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
