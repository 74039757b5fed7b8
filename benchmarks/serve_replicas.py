"""Replicas on Ray Serve (issue 29): prefix affinity vs random routing, and 8 clients through two replicas
vs one process with two threads, measured side by side in one run on this machine.

The script starts each server itself on 127.0.0.1 and a free port, waits for ``GET /health``, measures,
and stops it (SIGTERM, then kill), whatever happened:

* **affinity**, once per router (``--replicas 2 --threads 1 --router prefix``, then ``--router pow2``, Ray's
  default: the shorter queue of two random replicas, i.e. blind to prefixes): ``--contexts`` long contexts
  (the first ``--context-chars`` characters of specdec's own source files, ~4 characters a token; eight-word
  text with ``--toy``) are each sent once (``max_tokens`` 1), all of them, then one follow-up each (the
  context and a question, streamed). A *hit* is a follow-up answered by the replica that answered its
  context (the ``x-specdec-replica`` header); its time to first token (TTFT) shows whether the replica read
  the context again. Goal: hit rate >= 95% and TTFT <= 1 s with ``prefix``; not so with ``pow2``.
* **throughput**: ``--clients`` streaming clients at once, ``--requests-per-client`` greedy requests each,
  through ``--replicas 2 --threads 1`` and through one ``specdec serve --threads 2``; aggregate generated
  tokens per second, and their ratio (goal >= 0.9).

    python benchmarks/serve_replicas.py                        # default pair; benchmarks/results/serve-replicas.*
    python benchmarks/serve_replicas.py --toy --contexts 4 --requests-per-client 1   # tiny smoke run
    python benchmarks/serve_replicas.py -- --draft lookup+model     # more options for every server
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import random
import sys
import threading
import time
from collections import Counter

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import quantile, running, specdec_server, write_atomic  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEADER = "x-specdec-replica"
TOY_WORDS = ("the", "cat", "dog", "sat", "ran", "on", "mat", ".")
QUESTIONS = ("Explain what the first function does.", "Find a bug in this code.", "Write a test for it.")
TASKS = ("Write a Python function that checks whether a number is prime.", "Write a binary search in Python.",
         "Write a function that parses an ISO date.", "Write a Python class for a stack with a max() method.")


def contexts(n: int, chars: int, toy: bool) -> list[str]:
    if toy:
        rng = random.Random(29)
        return [" ".join(rng.choice(TOY_WORDS) for _ in range(max(8, chars // 5))) for _ in range(n)]
    files = sorted((ROOT / "src" / "specdec").rglob("*.py"), key=lambda p: -p.stat().st_size)
    texts = [p.read_text(encoding="utf-8")[:chars] for p in files if p.stat().st_size >= chars]
    if len(texts) < n:
        raise SystemExit(f"--contexts {n} is too many: only {len(texts)} source files have {chars} characters")
    return texts[:n]


def body(context: str, question: str | None, toy: bool, max_tokens: int, stream: bool) -> dict:
    if toy:
        return {"prompt": context + (" the dog" if question else ""), "max_tokens": max_tokens,
                "temperature": 0, "stream": stream}
    content = f"{context}\n\n{question}" if question else context
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0,
            "stream": stream}


def streamed(http: httpx.Client, path: str, payload: dict) -> dict:
    """One streamed request: its replica, TTFT (to the first content chunk), tokens, whether it completed."""
    start, ttft, chunks, done = time.monotonic(), None, 0, False
    with http.stream("POST", path, json=payload) as r:
        replica = r.headers.get(HEADER)
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line[6:] == "[DONE]":
                done = True
                continue
            event = json.loads(line[6:])
            choice = (event.get("choices") or [{}])[0]
            text = choice.get("text") or (choice.get("delta") or {}).get("content")
            if text:
                ttft = ttft if ttft is not None else time.monotonic() - start
                chunks += 1
            if "usage" in event and event["usage"]:
                chunks = event["usage"]["completion_tokens"]
    return {"replica": replica, "ttft": ttft, "tokens": chunks, "done": done, "seconds": time.monotonic() - start,
            "status": r.status_code}


def affinity(url: str, texts: list[str], toy: bool, timeout: float) -> dict:
    path = "/v1/completions" if toy else "/v1/chat/completions"
    with httpx.Client(base_url=url, timeout=timeout) as http:
        homes = []
        for text in texts:
            r = http.post(path, json=body(text, None, toy, 1, False))
            r.raise_for_status()
            homes.append(r.headers.get(HEADER))
        follows = [streamed(http, path, body(text, QUESTIONS[i % len(QUESTIONS)], toy, 8, True) |
                            {"stream_options": {"include_usage": True}})
                   for i, text in enumerate(texts)]
    hits = [f["replica"] == home for f, home in zip(follows, homes, strict=True)]
    ttfts = [f["ttft"] for f in follows if f["ttft"] is not None]
    pairs = list(zip(follows, hits, strict=True))
    return {"contexts": len(texts), "hits": sum(hits), "hit_rate": sum(hits) / len(hits),
            "ttft_p50_s": quantile(ttfts, 0.5), "ttft_p95_s": quantile(ttfts, 0.95),
            "ttft_hit_p50_s": quantile([f["ttft"] for f, h in pairs if h and f["ttft"]], 0.5),
            "ttft_miss_p50_s": quantile([f["ttft"] for f, h in pairs if not h and f["ttft"]], 0.5),
            "replicas_seen": len({h for h in homes})}


def throughput(url: str, clients: int, per_client: int, toy: bool, max_tokens: int, timeout: float) -> dict:
    results: list[dict] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        with httpx.Client(base_url=url, timeout=timeout) as http:
            for j in range(per_client):
                task = TASKS[(c + j) % len(TASKS)]
                payload = ({"prompt": "the cat", "max_tokens": max_tokens, "temperature": 0, "stream": True} if toy
                           else {"messages": [{"role": "user", "content": task}], "max_tokens": max_tokens,
                                 "temperature": 0, "stream": True})
                payload["stream_options"] = {"include_usage": True}
                try:
                    got = streamed(http, "/v1/completions" if toy else "/v1/chat/completions", payload)
                except httpx.HTTPError as err:
                    got = {"error": repr(err), "tokens": 0, "done": False}
                with lock:
                    results.append(got)

    start = time.monotonic()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    tokens = sum(r["tokens"] for r in results)
    return {"clients": clients, "requests": len(results), "completed": sum(r["done"] for r in results),
            "tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall,
            "replicas_seen": len({r.get("replica") for r in results if r.get("replica")}),
            "per_replica": sorted(Counter(r["replica"] for r in results if r.get("replica")).values(), reverse=True)}


def parse_args(argv: list[str]):
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    else:
        extra = []
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--toy", action="store_true", help="the eight-word toy pair (smoke runs), no download")
    p.add_argument("--contexts", type=int, default=20, help="long contexts, one follow-up each (default: 20)")
    p.add_argument("--context-chars", type=int, default=12000, help="characters a context (default: 12000, ~3K "
                   "tokens)")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients of the throughput part (default: 8)")
    p.add_argument("--requests-per-client", type=int, default=4, help="(default: 4)")
    p.add_argument("--max-tokens", type=int, default=128, help="of the throughput requests (default: 128)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a request may take (default: 600)")
    p.add_argument("--startup-timeout", type=float, default=900.0, help="seconds a server may take to be ready")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "serve-replicas"),
                   help="results' path without extension: .json and .md are written")
    args = p.parse_args(argv)
    for name in ("contexts", "context_chars", "clients", "requests_per_client", "max_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)} is invalid: must be an integer >= 1")
    return args, extra + (["--toy"] if args.toy else [])


def markdown(report: dict) -> str:
    lines = ["# Replicas on Ray Serve (issue 29)", "", f"{report['date']}, {report['machine']}, server options "
             f"`{' '.join(report['server_args']) or '(defaults)'}`", "",
             "| router | contexts | hits | hit rate | follow-up TTFT p50 | p95 | hit p50 | miss p50 |",
             "|---|---|---|---|---|---|---|---|"]
    f = lambda v: "–" if v is None else f"{v:.3f} s"  # noqa: E731
    for name, a in report["affinity"].items():
        lines.append(f"| {name} | {a['contexts']} | {a['hits']} | {a['hit_rate']:.0%} | {f(a['ttft_p50_s'])} | "
                     f"{f(a['ttft_p95_s'])} | {f(a['ttft_hit_p50_s'])} | {f(a['ttft_miss_p50_s'])} |")
    lines += ["", "| setup | clients | requests | completed | requests per replica | tokens | seconds | tokens/s |",
              "|---|---|---|---|---|---|---|---|"]
    for name, t in report["throughput"].items():
        split = " / ".join(map(str, t.get("per_replica") or [])) or "–"
        lines.append(f"| {name} | {t['clients']} | {t['requests']} | {t['completed']} | {split} | {t['tokens']} | "
                     f"{t['seconds']:.1f} | {t['tokens_per_s']:.2f} |")
    lines += ["", f"Two replicas / one process: **{report['throughput_ratio']:.2f}x** tokens/s (goal >= 0.9)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args, server_args = parse_args(sys.argv[1:] if argv is None else argv)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    texts = contexts(args.contexts, args.context_chars, args.toy)
    report = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": platform.processor() or
              platform.machine(), "cpus": os.cpu_count(), "server_args": server_args, "affinity": {},
              "throughput": {}}
    for router in ("prefix", "pow2"):
        server = specdec_server(["--replicas", "2", "--threads", "1", "--router", router, *server_args])
        with running(server, args.startup_timeout, log):
            report["affinity"][router] = affinity(server.url, texts, args.toy, args.timeout)
            log(f"affinity {router}: {report['affinity'][router]}")
            if router == "prefix":
                report["throughput"]["2 replicas x 1 thread"] = throughput(
                    server.url, args.clients, args.requests_per_client, args.toy, args.max_tokens, args.timeout)
    single = specdec_server(["--threads", "2", *server_args])
    with running(single, args.startup_timeout, log):
        report["throughput"]["1 process x 2 threads"] = throughput(
            single.url, args.clients, args.requests_per_client, args.toy, args.max_tokens, args.timeout)
    return finish(report, args, log)


def finish(report: dict, args, log) -> int:
    t = report["throughput"]
    report["throughput_ratio"] = t["2 replicas x 1 thread"]["tokens_per_s"] / max(
        t["1 process x 2 threads"]["tokens_per_s"], 1e-9)
    write_atomic(args.out + ".json", json.dumps(report, indent=1) + "\n")
    write_atomic(args.out + ".md", markdown(report))
    print(markdown(report))
    log(f"wrote {args.out}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
