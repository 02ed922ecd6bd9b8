"""Overload probes against a running longrank server (standard library only).

burst: N `/rerank` requests at once, each with fresh random texts (no cache answers them) and every segment read:
how many were answered 200, refused 429 (with their Retry-After), timed out (503) or failed, and when the last
answer came.

slow: N slow clients that send part of a request's headers, wait until the server closes the connection, and
reopen it at once, while one well-behaved client (the same address) searches in a loop: its latencies.

steady: N clients searching in a loop on keep-alive connections for SECONDS, while the server's resident memory
(its PID's VmRSS) and the latency of `GET /batch` and `GET /tasks` are sampled twice a second; then what the query
log did (`/metrics`).

usage: python3 bench/overload.py burst URL [N=300] [DOCS=10]
       python3 bench/overload.py slow URL [N=2000] [SECONDS=20] [QUERY_PATH=/search?q=bees]
       python3 bench/overload.py steady URL PID [N=64] [SECONDS=60] [QUERY_PATH=/search?q=wing+flutter]
"""

import asyncio
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse


def post(url, path, body, timeout=120):
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"content-type": "application/json"})
        response = conn.getresponse()
        return response.status, response.getheader("retry-after"), response.read()
    except Exception as e:  # noqa: BLE001 - a failure is a result here
        return type(e).__name__, None, b""
    finally:
        conn.close()


def burst(url, n, docs):
    words = "flow wing heat boundary layer pressure shock wave number speed".split()
    rng = random.Random(0)
    bodies = [
        {
            "query": " ".join(rng.choice(words) for _ in range(4)),
            "documents": [{"text": " ".join(rng.choice(words) + str(rng.randrange(10**6)) for _ in range(300))}
                          for _ in range(docs)],
            "preselect": {"selector": "none"},
        }
        for _ in range(n)
    ]
    results = [None] * n
    go = threading.Event()

    def one(i):
        go.wait()
        results[i] = post(url, "/rerank", bodies[i]) + (time.monotonic(),)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    start = time.monotonic()
    go.set()
    for t in threads:
        t.join()
    statuses = {}
    for status, _, _, _ in results:
        statuses[status] = statuses.get(status, 0) + 1
    retry = sorted(int(r) for s, r, _, _ in results if s == 429 and r)
    served = sorted(at - start for s, _, _, at in results if s == 200)
    refused = sorted(at - start for s, _, _, at in results if s == 429)
    print(f"burst of {n} /rerank ({docs} documents each): {statuses}")
    if retry:
        print(f"  Retry-After: min {retry[0]} s, median {retry[len(retry) // 2]} s, max {retry[-1]} s")
    if refused:
        print(f"  429s answered after: median {statistics.median(refused):.2f} s, max {refused[-1]:.2f} s")
    if served:
        print(f"  200s answered by {served[-1]:.1f} s")
    others = sorted(at - start for s, _, _, at in results if s not in (200, 429))
    if others:
        print(f"  neither served nor refused: {len(others)}, answered between {others[0]:.1f} and {others[-1]:.1f} s")


async def slow_client(host, port, stop):
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: 127")
            await writer.drain()
            await reader.read()  # until the server closes it
            writer.close()
        except OSError:
            await asyncio.sleep(0.01)


def slow(url, n, seconds, path):
    u = urllib.parse.urlsplit(url)
    stop = threading.Event()

    def attack():
        async def main():
            tasks = [asyncio.create_task(slow_client(u.hostname, u.port, stop)) for _ in range(n)]
            while not stop.is_set():
                await asyncio.sleep(0.1)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run(main())

    attacker = threading.Thread(target=attack)
    attacker.start()
    time.sleep(2)  # every connection the server allows is taken
    latencies, failures = [], {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            if response.status == 200:
                latencies.append(time.monotonic() - started)
            else:
                failures[response.status] = failures.get(response.status, 0) + 1
        except Exception as e:  # noqa: BLE001
            failures[type(e).__name__] = failures.get(type(e).__name__, 0) + 1
        finally:
            conn.close()
    stop.set()
    attacker.join()
    latencies.sort()
    q = lambda p: latencies[min(len(latencies) - 1, int(p * len(latencies)))] if latencies else float("nan")
    print(f"{n} reconnecting slow clients, {seconds} s: well-behaved {path}: {len(latencies)} answered 200, "
          f"failures {failures}; p50 {q(0.5):.3f} s, p90 {q(0.9):.3f} s, max {q(1.0):.3f} s")


def steady(url, pid, n, seconds, path):
    u = urllib.parse.urlsplit(url)
    stop = threading.Event()
    counts = [0] * n

    def client(i):
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        while not stop.is_set():
            try:
                conn.request("GET", path)
                conn.getresponse().read()
                counts[i] += 1
            except Exception:  # noqa: BLE001 - reconnect and go on
                conn.close()
                conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)

    def rss_mb():
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

    def timed(route):
        started = time.monotonic()
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        conn.request("GET", route)
        conn.getresponse().read()
        conn.close()
        return time.monotonic() - started

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    rss, batch, tasks = [], [], []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        rss.append(rss_mb())
        batch.append(timed("/batch"))
        tasks.append(timed("/tasks"))
        time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join()
    ms = lambda xs: f"p50 {1000 * statistics.median(xs):.1f} ms, max {1000 * max(xs):.1f} ms"
    print(f"{n} clients, {seconds:.0f} s of {path}: {sum(counts) / seconds:.0f} searches/s")
    print(f"  RSS: first {rss[0]:.0f} MB, max {max(rss):.0f} MB, last {rss[-1]:.0f} MB")
    print(f"  GET /batch {ms(batch)}; GET /tasks {ms(tasks)}")
    time.sleep(2)  # the query log's writer drains
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("GET", "/metrics")
    metrics = conn.getresponse().read().decode()
    print("  " + "; ".join(line for line in metrics.splitlines() if line.startswith("longrank_query_log")))


if __name__ == "__main__":
    mode, url = sys.argv[1], sys.argv[2].rstrip("/")
    if mode == "burst":
        burst(url, int(sys.argv[3]) if len(sys.argv) > 3 else 300, int(sys.argv[4]) if len(sys.argv) > 4 else 10)
    elif mode == "slow":
        slow(url, int(sys.argv[3]) if len(sys.argv) > 3 else 2000, float(sys.argv[4]) if len(sys.argv) > 4 else 20,
             sys.argv[5] if len(sys.argv) > 5 else "/search?q=bees")
    elif mode == "steady":
        steady(url, int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 64,
               float(sys.argv[5]) if len(sys.argv) > 5 else 60, sys.argv[6] if len(sys.argv) > 6 else "/search?q=wing+flutter")
    else:
        sys.exit(__doc__)
