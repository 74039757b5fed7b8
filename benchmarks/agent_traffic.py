"""Agent-like traffic through the OpenAI chat route: ``specdec serve`` with each drafter against ``llama-server``
with each ``--spec-type`` (issue 27's goal: >= 2x llama-server's best type, the same outputs as plain decoding).

Every configuration is one server start on 127.0.0.1 (one after the other, never two at once: they would share
the cores), asked the same traffic in the same order by one client, greedy, non-streamed; every server is
stopped at the end (SIGTERM, then kill), whatever happened. Per request: completion tokens (usage) / seconds
from sent to the whole answer, end to end (prompt reading included). The traffic, ``--rounds`` times over:

- ``edit``: one conversation editing one file (``--lines`` lines of a standard-library module) over ``--turns``
  turns: the file and an instruction, then instruction after instruction, each answer (the whole file again)
  sent back as the conversation's assistant turn, as an agent does;
- ``tools``: ``--tasks`` fresh conversations with the same system prompt, each asking for one JSON tool call
  (read a file, search, list a folder, run the tests): the calls' JSON repeats from request to request;
- ``variations``: ``--tasks`` fresh conversations asking for the same function with variations (CSV, TSV,
  semicolons, pipes, ...): the answers repeat each other's code.

Later requests can draft from earlier answers only through the server's history (``--draft history+...``):
the table starts empty at each start, so the first round of the traffic warms it, and ``--rounds 2`` shows
the traffic again with the table warm (a second conversation on the same file, the same tool calls, ...).

    python benchmarks/agent_traffic.py                      # the default configurations, 128-token answers
    python benchmarks/agent_traffic.py --ours none history+lookup --llama none ngram-mod --max-tokens 4 \\
        --turns 1 --tasks 1 --rounds 1 --out /tmp/agent-tiny    # a smoke run
    python benchmarks/agent_traffic.py -- --threads 2       # options after -- go to every specdec serve

Outputs: each configuration's texts are compared with its own server's plain decoding (``--draft none`` for
specdec, no ``--spec-type`` for llama-server): greedy speculative decoding must give the same text. Results go
to ``--out``.md and .json with the command, the CPU and its flags. llama-server is found as serve_compare.py
finds it (``$SPECDEC_LLAMA_CPP_TOOLS``, else benchmarks/build_llama_cpp_tools.sh's folder); ``draft-simple``
types get ``-md`` the draft GGUF (``--draft-gguf``, else the default pair's draft).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import sysconfig
import time

import httpx
from servers import OWN_SERVER_ARGS, llama_server, option_value, quantile, running, specdec_server, write_atomic

OURS = ("none", "lookup", "lookup+model", "history+lookup", "history+lookup+model")
LLAMA = ("none", "ngram-mod", "ngram-cache", "draft-simple", "ngram-mod,draft-simple", "ngram-cache,draft-simple")
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "amx_tile")
SOURCE = "textwrap.py"  # the edited file: its first --lines lines
EDITS = (
    "Add a one-line docstring to every function that has none.",
    "Rename the parameter `width` to `line_width` everywhere.",
    "Add type hints to every function signature.",
    "Remove every comment line.",
    "Add `__all__` at the top listing the public names.",
    "Sort the imports alphabetically.",
)
EDIT_SYSTEM = "You are a coding agent. Reply with the complete updated file in one ```python block, nothing else."
TOOL_SYSTEM = ("You are a coding agent with tools. Reply with exactly one JSON object and nothing else:\n"
               '{"tool": NAME, "arguments": {...}} where NAME is one of read_file (arguments: path), '
               "search (arguments: pattern, path), list_dir (arguments: path), run_tests (arguments: path, "
               "verbose).")
TOOL_TASKS = (
    "Open src/app/main.py so you can see how the app starts.",
    "Look for every TODO in src/app.",
    "Show me what is in the folder src/app/handlers.",
    "Run the tests in tests/test_handlers.py, verbosely.",
    "Open src/app/handlers/users.py.",
    "Look for the string 'timeout' in src/app/config.",
    "Show me what is in the folder tests.",
    "Run the tests in tests/test_config.py, verbosely.",
)
VARIATIONS = (
    ("parse_csv_line", "comma-separated", "','"),
    ("parse_tsv_line", "tab-separated", "'\\t'"),
    ("parse_semicolon_line", "semicolon-separated", "';'"),
    ("parse_pipe_line", "pipe-separated", "'|'"),
    ("parse_colon_line", "colon-separated", "':'"),
    ("parse_space_line", "space-separated", "' '"),
    ("parse_caret_line", "caret-separated", "'^'"),
    ("parse_tilde_line", "tilde-separated", "'~'"),
)


def variation_prompt(name: str, kind: str, separator: str) -> str:
    return (f"Write a Python function `{name}(line: str) -> list[str]` that splits one {kind} line into fields on "
            f"{separator}, honouring double-quoted fields (a quoted field may contain the separator, and \"\" inside "
            "quotes is one quote). Include a docstring and raise ValueError on an unterminated quote. Code only.")


def source_file(lines: int) -> str:
    path = pathlib.Path(sysconfig.get_paths()["stdlib"]) / SOURCE
    return "".join(path.read_text(encoding="utf-8").splitlines(keepends=True)[:lines])


def traffic(args) -> list[dict]:
    """The scenarios' requests in order: {"scenario", "label", "conversation" (a key: requests of one key share a
    conversation, each answer appended), "messages" (the new user turn, or the whole first messages)}."""
    out, code = [], source_file(args.lines)
    for r in range(args.rounds):
        first = f"Here is `{SOURCE}`:\n\n```python\n{code}```\n\n{EDITS[0]}"
        for t in range(args.turns):
            user = first if t == 0 else EDITS[t % len(EDITS)]
            out.append({"scenario": "edit", "label": f"round {r} turn {t}", "conversation": f"edit-{r}",
                        "system": EDIT_SYSTEM if t == 0 else None, "user": user})
        for i in range(args.tasks):
            out.append({"scenario": "tools", "label": f"round {r} task {i}", "conversation": f"tools-{r}-{i}",
                        "system": TOOL_SYSTEM, "user": TOOL_TASKS[i % len(TOOL_TASKS)]})
        for i in range(args.tasks):
            out.append({"scenario": "variations", "label": f"round {r} task {i}", "conversation": f"var-{r}-{i}",
                        "system": None, "user": variation_prompt(*VARIATIONS[i % len(VARIATIONS)])})
    return out


def run_traffic(url: str, model: str, api_key: str, requests: list[dict], args, name: str, log) -> list[dict]:
    """Send ``requests`` in order on one server; each answer with its tokens, seconds and text."""
    conversations: dict[str, list[dict]] = {}
    answers = []
    with httpx.Client(base_url=url, timeout=args.timeout, headers={"Authorization": f"Bearer {api_key}"}) as client:
        client.post("/v1/chat/completions", json={"model": model, "max_tokens": 4, "temperature": 0,
                                                  "messages": [{"role": "user", "content": "Say hi."}]})
        for request in requests:
            messages = conversations.setdefault(request["conversation"], [])
            if request["system"]:
                messages.append({"role": "system", "content": request["system"]})
            messages.append({"role": "user", "content": request["user"]})
            body = {"model": model, "messages": messages, "max_tokens": args.max_tokens, "temperature": 0}
            sent = time.perf_counter()
            response = client.post("/v1/chat/completions", json=body)
            seconds = time.perf_counter() - sent
            answer = {k: request[k] for k in ("scenario", "label")} | {"seconds": seconds, "ok": False}
            if response.status_code == 200:
                data = response.json()
                text = data["choices"][0]["message"].get("content") or ""
                tokens = data["usage"]["completion_tokens"]
                answer |= {"ok": True, "text": text, "tokens": tokens, "prompt_tokens": data["usage"]["prompt_tokens"],
                           "tokens_per_s": tokens / seconds if seconds > 0 else None,
                           "figures": {k: v for k, v in (data.get("specdec") or {}).items()
                                       if k in ("drafter", "drafted", "accepted", "target_calls")}}
                messages.append({"role": "assistant", "content": text})
            else:
                answer["error"] = f"HTTP {response.status_code}: {response.text[:300]}"
            log(f"[{name}] {answer['scenario']} {answer['label']}: {answer.get('tokens')} tokens in {seconds:.2f} s"
                + ("" if answer["ok"] else f", ERROR {answer['error']}"))
            answers.append(answer)
    return answers


def summary(answers: list[dict]) -> dict:
    ok = [a for a in answers if a["ok"]]
    rates = [a["tokens_per_s"] for a in ok if a["tokens_per_s"]]
    seconds = sum(a["seconds"] for a in ok)
    return {"requests": len(answers), "ok": len(ok), "median_tokens_per_s": quantile(rates, 0.5),
            "mean_tokens_per_s": sum(rates) / len(rates) if rates else None,
            "total_tokens_per_s": sum(a["tokens"] for a in ok) / seconds if seconds else None}


def identical(answers: list[dict], reference: list[dict] | None) -> str:
    if reference is None:
        return "–"
    same = sum(a.get("text") == b.get("text") and a["ok"] and b["ok"] for a, b in zip(answers, reference, strict=True))
    return f"{same}/{len(answers)}"


def markdown(report: dict) -> str:
    lines = [f"# Agent-like traffic: specdec serve vs llama-server ({report['date']})", "",
             f"Command: `{report['command']}`", "",
             f"Machine: {report['machine']['cpu']}, {report['machine']['cores']} cores, flags "
             f"{' '.join(report['machine']['flags']) or 'none'}; model `{report['model']}`; "
             f"{report['settings']['max_tokens']}-token answers, greedy, end to end per request.", "",
             "| server | drafter / --spec-type | requests | median tokens/s | mean | total | vs llama best | "
             "same text as its plain | " + " | ".join(f"{s} median" for s in report["scenarios"]) + " |",
             "|---|---|---|---|---|---|---|---|" + "---|" * len(report["scenarios"])]
    best = max((c["summary"]["median_tokens_per_s"] or 0 for c in report["configs"] if c["server"] == "llama-server"
                and c["name"] != "none"), default=0)
    for c in report["configs"]:
        s, num = c["summary"], lambda x: "–" if x is None else f"{x:.2f}"  # noqa: E731
        ratio = f"{s['median_tokens_per_s'] / best:.2f}x" if best and s["median_tokens_per_s"] else "–"
        lines.append(f"| {c['server']} | {c['name']} | {s['ok']}/{s['requests']} | {num(s['median_tokens_per_s'])} | "
                     f"{num(s['mean_tokens_per_s'])} | {num(s['total_tokens_per_s'])} | {ratio} | {c['identical']} | "
                     + " | ".join(num(c["scenarios"][k]["median_tokens_per_s"]) for k in report["scenarios"]) + " |")
    lines += ["", "tokens/s: completion tokens / seconds from sent to the whole answer, per request; total: all "
              "tokens / all seconds. 'vs llama best': the median over llama-server's best --spec-type's median.", ""]
    if not report["complete"]:
        lines.append("**Incomplete run**: a configuration failed or the run was stopped.")
    return "\n".join(lines) + "\n"


def machine() -> dict:
    from specdec.machine import all_cpu_flags, describe_cpu

    have = all_cpu_flags()
    return {"cpu": describe_cpu(), "flags": [f for f in CPU_FLAGS if f in have], "cores": os.cpu_count()}


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    own, server_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                usage="%(prog)s [options] [-- specdec serve options]")
    p.add_argument("--ours", nargs="*", default=list(OURS), metavar="DRAFT",
                   help=f"specdec serve --draft values, one start each (default: {' '.join(OURS)}; none is the "
                   "plain reference)")
    p.add_argument("--llama", nargs="*", default=list(LLAMA), metavar="TYPES",
                   help=f"llama-server --spec-type values, one start each (default: {' '.join(LLAMA)}; none = no "
                   "--spec-type, the plain reference)")
    p.add_argument("--max-tokens", type=int, default=128, metavar="N", help="max_tokens of every answer "
                   "(default: %(default)s)")
    p.add_argument("--turns", type=int, default=4, metavar="T", help="turns of the edit conversation "
                   "(default: %(default)s)")
    p.add_argument("--tasks", type=int, default=4, metavar="K", help="tool-call and variation requests each "
                   "(default: %(default)s)")
    p.add_argument("--rounds", type=int, default=2, metavar="R", help="times the whole traffic is sent "
                   "(default: %(default)s)")
    p.add_argument("--lines", type=int, default=60, metavar="L", help=f"lines of {SOURCE} edited (default: "
                   "%(default)s)")
    p.add_argument("--threads", type=int, default=2, metavar="N", help="llama-server's -t (default: %(default)s)")
    p.add_argument("--context", type=int, default=8192, metavar="N", help="llama-server's -c (default: "
                   "%(default)s)")
    p.add_argument("--model", metavar="GGUF", help="the target GGUF (default: specdec serve's --target, else the "
                   "default pair's)")
    p.add_argument("--draft-gguf", metavar="GGUF", help="llama-server's -md for draft-simple (default: the default "
                   "pair's draft)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S", help="seconds a request may take")
    p.add_argument("--startup-timeout", type=float, default=600.0, metavar="S", help="seconds a server may take "
                   "to be ready")
    p.add_argument("--out", default="benchmarks/results/agent-traffic", metavar="STEM",
                   help="writes STEM.md and STEM.json (default: %(default)s)")
    args = p.parse_args(own)
    if min(args.max_tokens, args.turns, args.rounds, args.lines, args.threads) < 1 or args.tasks < 0:
        p.error("--max-tokens, --turns, --rounds, --lines and --threads must be >= 1, --tasks >= 0")
    clash = [a for a in server_args if a.split("=")[0] in OWN_SERVER_ARGS + ("--draft",)]
    if clash:
        p.error(f"{', '.join(clash)}: this script chooses the servers' host, port and drafter itself")
    return args, server_args


def gguf_paths(args, server_args) -> tuple[str, str]:
    given = args.model or option_value(server_args, "--target")
    if given and not given.endswith(".gguf"):
        raise ValueError(f"--target {given} is not a .gguf file: give llama-server's file with --model")
    if given and args.draft_gguf:
        return given, args.draft_gguf
    from specdec.loading.defaults import default_paths

    target, draft = default_paths(progress=False)[:2]
    return given or str(target), args.draft_gguf or str(draft)


def run(args, server_args, argv, log) -> int:
    from specdec import strict_json
    from specdec.bench.llamacpp_cli import find_tool

    model, draft = gguf_paths(args, server_args)
    binary = find_tool("llama-server") if args.llama else None
    requests = traffic(args)
    api_key = option_value(server_args, "--api-key") or "none"
    report = {"command": shlex.join(["benchmarks/agent_traffic.py", *argv]), "machine": machine(), "model": model,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "complete": False,
              "settings": {k: getattr(args, k) for k in ("max_tokens", "turns", "tasks", "rounds", "lines", "threads")},
              "scenarios": list(dict.fromkeys(r["scenario"] for r in requests)), "configs": []}
    log(f"CPU flags: {' '.join(report['machine']['flags']) or 'none'}; {len(requests)} requests per configuration")

    def save() -> None:
        write_atomic(args.out + ".json", strict_json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        write_atomic(args.out + ".md", markdown(report))

    first = lambda names: sorted(names, key=lambda n: n != "none")  # noqa: E731  (the reference runs first)
    plans = [("specdec", d, specdec_server([*server_args, "--draft", d])) for d in first(args.ours)]
    for types in first(args.llama):
        extra = [] if types == "none" else ["--spec-type", types] + (["-md", draft] if "draft-" in types else [])
        plans.append(("llama-server", types, llama_server(str(binary), model, context=args.context, parallel=1,
                                                          threads=args.threads, extra=extra)))
    references: dict[str, list[dict]] = {}
    for server_name, name, server in plans:
        with running(server, args.startup_timeout, log) as (model_name, _):
            answers = run_traffic(server.url, model_name, api_key, requests, args, f"{server_name} {name}", log)
        if name == "none":
            references[server_name] = answers
        report["configs"].append({
            "server": server_name, "name": name, "command": shlex.join(server.command), "answers": answers,
            "summary": summary(answers), "scenarios": {s: summary([a for a in answers if a["scenario"] == s])
                                                       for s in report["scenarios"]},
            "identical": "reference" if name == "none" else identical(answers, references.get(server_name))})
        save()
    report["complete"] = all(c["summary"]["ok"] == c["summary"]["requests"] for c in report["configs"])
    save()
    print(markdown(report), flush=True)
    log(f"wrote {args.out}.md and {args.out}.json")
    return 0 if report["complete"] else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, server_args = parse_args(argv)

    def on_term(signum, frame):  # so that `finally` stops the servers when this script is terminated
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        return run(args, server_args, argv, lambda msg: print(msg, file=sys.stderr, flush=True))
    except (RuntimeError, ValueError, OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as err:
        print(f"agent_traffic: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
