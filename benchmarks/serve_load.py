"""Load on ``specdec serve``: concurrent streaming clients, time to first token, per-token latency, fairness.

The script starts ``specdec serve`` itself on 127.0.0.1 and a free port (server options after ``--``),
waits for ``GET /health`` to answer 200, then for each concurrency level runs that many streaming chat
clients at once, each sending ``--requests-per-client`` greedy requests one after another over a fixed
set of coding prompts (eight-word prompts when the server is the toy pair). It stops the server at the
end (SIGTERM, then kill), whatever happened.

    python benchmarks/serve_load.py                          # default pair; benchmarks/results/serve-load.{md,json}
    python benchmarks/serve_load.py --clients 1 4 -- --toy   # the toy pair, no download
    python benchmarks/serve_load.py -- --gamma 3 --draft lookup+model

Per request: time to first token (TTFT: from sending the request to the first chunk with content),
the gaps between content chunks, per-token latency ((total - TTFT) / (tokens - 1)), tokens (the final
usage), whether it completed (a finish_reason and ``data: [DONE]``), and the server's ``specdec``
figures (alpha, tokens per target call). Per level, one row: requests/s, aggregate tokens/s, TTFT and
per-token latency p50/p95, errors.

Fairness (issue 13: "time to first token with 4 busy clients <= one prompt's reading plus one round
of each other client"). From the 1-client run: *prompt reading + first round* ~ its TTFT p95, and
*one round* ~ its per-token latency p50 x its mean tokens per target call (a round's tokens arrive
together). Bound for N clients = TTFT_1 p95 + (N - 1) x round_1. It is compared with the p95 TTFT of
the *busy arrivals* at the highest level >= 4: each client's second and later requests, which arrive
while the other clients are generating (a client's first request arrives in a burst with all the
others', and so may also wait for their prompt readings, which the goal does not count). With one
request per client there are no busy arrivals and all requests are used (noted in the output).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import shlex
import signal
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import httpx
from servers import OWN_SERVER_ARGS, quantile, specdec_server, write_atomic

CODING_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "Write a Python function that reads a CSV file and returns the average of a numeric column.",
    "Implement a Stack class in Python with push, pop, peek and is_empty methods.",
    "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
)
TOY_PROMPTS = ("the", "the dog", "the cat sat", "on the mat")  # the toy pair knows eight words only


@dataclass
class RequestResult:
    level: int
    client: int
    index: int  # this client's n-th request (0 = first, arriving in the burst)
    prompt: str
    ok: bool = False
    error: str | None = None
    status: int | None = None
    ttft: float | None = None  # seconds, request sent -> first content chunk
    total: float | None = None  # seconds, request sent -> [DONE]
    tokens: int | None = None  # completion tokens (usage), else content chunks
    chunks: int = 0  # content chunks
    gaps: list[float] = field(default_factory=list)  # seconds between content chunks
    per_token: float | None = None  # (total - ttft) / (tokens - 1)
    finish_reason: str | None = None
    done: bool = False
    figures: dict | None = None  # the server's "specdec" field


# ---------------------------------------------------------------------------------------------- clients


async def one_request(http: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int,
                      result: RequestResult) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    last = None
    usage_tokens = None
    async with http.stream("POST", url + "/v1/chat/completions", json=body) as response:
        result.status = response.status_code
        if response.status_code != 200:
            text = (await response.aread()).decode("utf-8", "replace")
            result.error = f"HTTP {response.status_code}: {text[:200]}"
            return
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                result.done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                result.error = f"error event: {chunk['error'].get('message')}"
                return
            if chunk.get("usage"):
                usage_tokens = chunk["usage"].get("completion_tokens")
            if chunk.get("specdec") is not None:
                result.figures = chunk["specdec"]
            for choice in chunk.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    now = time.perf_counter()
                    if last is None:
                        result.ttft = now - sent
                    else:
                        result.gaps.append(now - last)
                    last = now
                    result.chunks += 1
                if choice.get("finish_reason"):
                    result.finish_reason = choice["finish_reason"]
    result.total = time.perf_counter() - sent
    result.tokens = usage_tokens if usage_tokens is not None else result.chunks
    if result.ttft is not None and result.tokens and result.tokens > 1:
        result.per_token = (result.total - result.ttft) / (result.tokens - 1)
    missing = [what for what, seen in (("finish_reason", result.finish_reason), ("[DONE]", result.done),
                                       ("content", result.ttft is not None)) if not seen]
    result.ok = not missing
    if missing:
        result.error = "incomplete answer: no " + ", ".join(missing)


async def timed_request(http, url, model, prompt, max_tokens, timeout, result) -> RequestResult:
    try:
        await asyncio.wait_for(one_request(http, url, model, prompt, max_tokens, result), timeout)
    except asyncio.TimeoutError:
        result.ok, result.error = False, f"timeout: no complete answer within {timeout:g} s"
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as err:
        result.ok, result.error = False, f"{type(err).__name__}: {err}"
    return result


async def run_level(url: str, model: str, prompts: tuple[str, ...], clients: int, requests: int,
                    max_tokens: int, timeout: float) -> tuple[list[RequestResult], float]:
    """``clients`` concurrent clients, each sending ``requests`` requests in turn; (results, wall seconds)."""
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as http:

        async def client(c: int) -> list[RequestResult]:
            out = []
            for j in range(requests):
                prompt = prompts[(c + j) % len(prompts)]
                out.append(await timed_request(http, url, model, prompt, max_tokens, timeout,
                                               RequestResult(clients, c, j, prompt)))
            return out

        start = time.perf_counter()
        per_client = await asyncio.gather(*(client(c) for c in range(clients)))
        wall = time.perf_counter() - start
    return [r for rs in per_client for r in rs], wall


# ---------------------------------------------------------------------------------------------- report


def mean_figure(results: list[RequestResult], key: str) -> float | None:
    values = [r.figures[key] for r in results if r.figures and isinstance(r.figures.get(key), (int, float))]
    return statistics.fmean(values) if values else None


def summarize(clients: int, results: list[RequestResult], wall: float) -> dict:
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft for r in ok]
    per_token = [r.per_token for r in ok if r.per_token is not None]
    gaps = [g for r in ok for g in r.gaps]
    busy = [r.ttft for r in ok if r.index > 0]
    tokens = sum(r.tokens or 0 for r in ok)
    return {
        "clients": clients, "requests": len(results), "completed": len(ok), "errors": len(results) - len(ok),
        "wall_s": wall, "requests_per_s": len(ok) / wall if wall > 0 else None,
        "tokens": tokens, "tokens_per_s": tokens / wall if wall > 0 else None,
        "ttft_p50_s": quantile(ttfts, 0.5), "ttft_p95_s": quantile(ttfts, 0.95),
        "ttft_busy_p95_s": quantile(busy, 0.95), "busy_arrivals": len(busy),
        "per_token_p50_s": quantile(per_token, 0.5), "per_token_p95_s": quantile(per_token, 0.95),
        "chunk_gap_p50_s": quantile(gaps, 0.5), "chunk_gap_p95_s": quantile(gaps, 0.95),
        "alpha_mean": mean_figure(ok, "alpha"),
        "tokens_per_target_call_mean": mean_figure(ok, "tokens_per_target_call"),
        "error_messages": sorted({r.error for r in results if r.error})[:5],
    }


def fairness(rows: list[dict]) -> dict | None:
    """The issue-13 check at the highest level >= 4 against the bound estimated from the 1-client run."""
    base = next((r for r in rows if r["clients"] == 1), None)
    busy = [r for r in rows if r["clients"] >= 4]
    if base is None or not busy:
        return {"checked": False, "why": "needs a 1-client level and one with >= 4 clients"}
    top = max(busy, key=lambda r: r["clients"])
    if base["ttft_p95_s"] is None or base["per_token_p50_s"] is None or top["ttft_p95_s"] is None:
        return {"checked": False, "why": "the 1-client or the top level has no completed multi-token request"}
    tokens_per_round = base["tokens_per_target_call_mean"] or 1.0
    round_s = base["per_token_p50_s"] * tokens_per_round
    bound = base["ttft_p95_s"] + (top["clients"] - 1) * round_s
    if top["ttft_busy_p95_s"] is not None:
        measured, which = top["ttft_busy_p95_s"], "busy arrivals (each client's 2nd+ request)"
    else:
        measured, which = top["ttft_p95_s"], "all requests (no busy arrivals)"
    return {"checked": True, "clients": top["clients"], "prompt_and_first_round_s": base["ttft_p95_s"],
            "round_s": round_s, "tokens_per_round": tokens_per_round, "bound_s": bound,
            "measured_ttft_p95_s": measured, "measured_over": which, "ratio": measured / bound if bound else None,
            "within": measured <= bound,
            "estimate": "bound = TTFT p95 (1 client) + (N-1) x per-token p50 (1 client) x tokens per target call "
                        "(1 client)"}


def ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.1f}"


def num(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


TABLE_HEAD = ("| clients | requests | req/s | tok/s | TTFT p50 ms | TTFT p95 ms | per-token p50 ms | per-token p95 ms "
              "| chunk gap p95 ms | α | tok/call | errors |\n"
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def table_row(r: dict) -> str:
    return (f"| {r['clients']} | {r['requests']} | {num(r['requests_per_s'])} | {num(r['tokens_per_s'], 1)} "
            f"| {ms(r['ttft_p50_s'])} | {ms(r['ttft_p95_s'])} "
            f"| {ms(r['per_token_p50_s'])} | {ms(r['per_token_p95_s'])} "
            f"| {ms(r['chunk_gap_p95_s'])} | {num(r['alpha_mean'])} | {num(r['tokens_per_target_call_mean'])} "
            f"| {r['errors']} |")


def fairness_line(f: dict | None) -> str:
    if not f or not f.get("checked"):
        return f"Fairness: not checked ({(f or {}).get('why', 'no data')})."
    verdict = "within" if f["within"] else "ABOVE"
    return (f"Fairness ({f['clients']} clients): TTFT p95 over {f['measured_over']} = "
            f"{ms(f['measured_ttft_p95_s'])} ms, {verdict} the bound {ms(f['bound_s'])} ms "
            f"(ratio {num(f['ratio'])}) = prompt + first round {ms(f['prompt_and_first_round_s'])} ms "
            f"+ {f['clients'] - 1} x round {ms(f['round_s'])} ms ({num(f['tokens_per_round'])} tokens per round), "
            "all estimated from the 1-client run.")


def markdown(report: dict) -> str:
    s = report["settings"]
    lines = [
        "# specdec serve under load",
        "",
        f"- command: `{report['command']}`",
        f"- server: `specdec serve {' '.join(shlex.quote(a) for a in report['server_args'])}` "
        f"(model {report['model']}; ready after {report['server_ready_s']:.1f} s)",
        f"- machine: {report['machine']['cpu']}; flags: {' '.join(report['machine']['flags']) or 'none'}; "
        f"{report['machine']['cores']} cores; Python {report['machine']['python']}",
        f"- date: {report['date']}",
        f"- each client: {s['requests_per_client']} streaming chat requests in turn, max_tokens {s['max_tokens']}, "
        f"greedy, {s['warmup']} warm-up request(s) first; prompts: {s['prompt_set']}",
        "",
        TABLE_HEAD,
        *(table_row(r) for r in report["rows"]),
        "",
        "TTFT: request sent → first content chunk. Per-token: (total − TTFT) / (tokens − 1), per request. "
        "Chunk gap: time between content chunks (one chunk per round). α and tok/call: the server's `specdec` "
        "figures, mean over requests. req/s and tok/s: completed requests and their tokens over the level's "
        "wall time.",
        "",
        fairness_line(report["fairness"]),
        "",
    ]
    if s["prompt_set"] == "toy":
        lines += ["Toy pair: a round takes microseconds, so HTTP and the clients' own parsing dominate every "
                  "figure; the fairness check means something only on real models.", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    own, server_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                usage="%(prog)s [options] [-- specdec serve options]")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8], metavar="N",
                   help="concurrency levels, each a run of N clients at once (default: 1 4 8)")
    p.add_argument("--requests-per-client", type=int, default=2, metavar="N", help="default: %(default)s")
    p.add_argument("--max-tokens", type=int, default=32, metavar="N", help="default: %(default)s")
    p.add_argument("--warmup", type=int, default=1, metavar="N",
                   help="requests sent (and not counted) before the first level (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S",
                   help="seconds a request may take to its [DONE] (default: %(default)s)")
    p.add_argument("--startup-timeout", type=float, default=600.0, metavar="S",
                   help="seconds the server may take to answer /health 200 (default: %(default)s)")
    p.add_argument("--out", default="benchmarks/results/serve-load", metavar="STEM",
                   help="writes STEM.md and STEM.json (default: %(default)s)")
    args = p.parse_args(own)
    if any(n < 1 for n in args.clients) or args.requests_per_client < 1 or args.max_tokens < 1 or args.warmup < 0:
        p.error("--clients, --requests-per-client and --max-tokens must be >= 1, --warmup >= 0")
    clash = [a for a in server_args if a.split("=")[0] in OWN_SERVER_ARGS]
    if clash:
        p.error(f"{', '.join(clash)}: this script chooses the server's host and port itself")
    return args, server_args


def run(args: argparse.Namespace, server_args: list[str], argv: list[str]) -> int:
    from specdec.machine import cpu_flags, describe_cpu

    server = specdec_server(server_args)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    try:
        log(f"starting: {shlex.join(server.command)}")
        server.start()
        ready = server.wait_healthy(args.startup_timeout)
        names = server.model_names()
        model = names[0]
        toy = "specdec-toy" in names
        prompts = TOY_PROMPTS if toy else CODING_PROMPTS
        log(f"server ready after {ready:.1f} s at {server.url} (model {model})")
        for i in range(args.warmup):
            warm, _ = asyncio.run(run_level(server.url, model, prompts[i % len(prompts):], 1, 1, args.max_tokens,
                                            args.timeout))
            if not warm[0].ok:
                log(f"warm-up request failed: {warm[0].error}")
        rows, results = [], []
        print(TABLE_HEAD, flush=True)
        for clients in args.clients:
            level, wall = asyncio.run(run_level(server.url, model, prompts, clients, args.requests_per_client,
                                                args.max_tokens, args.timeout))
            rows.append(summarize(clients, level, wall))
            results += level
            print(table_row(rows[-1]), flush=True)
            for message in rows[-1]["error_messages"]:
                log(f"  error ({clients} clients): {message}")
    finally:
        server.stop()
    report = {
        "command": shlex.join([os.path.relpath(sys.argv[0]) if sys.argv[0] else "serve_load.py", *argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": describe_cpu(), "flags": cpu_flags(), "cores": os.cpu_count(),
                    "python": platform.python_version(), "platform": platform.platform()},
        "server_args": server_args, "model": model, "server_ready_s": ready,
        "settings": {"clients": args.clients, "requests_per_client": args.requests_per_client,
                     "max_tokens": args.max_tokens, "warmup": args.warmup, "timeout_s": args.timeout,
                     "temperature": 0, "prompt_set": "toy" if toy else "coding", "prompts": list(prompts)},
        "rows": rows, "fairness": fairness(rows),
        "requests": [asdict(r) for r in results],
    }
    print(fairness_line(report["fairness"]), flush=True)
    write_atomic(args.out + ".json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    write_atomic(args.out + ".md", markdown(report))
    log(f"wrote {args.out}.md and {args.out}.json")
    return 1 if any(r["errors"] for r in rows) else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, server_args = parse_args(argv)

    def on_term(signum, frame):  # so that `finally` stops the server when this script is terminated
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        return run(args, server_args, argv)
    except RuntimeError as err:
        print(f"serve_load: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
