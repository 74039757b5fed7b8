"""The report of ``serve_compare.py``: a concurrency level's figures, the tables and issue 20's goals, from the
measurements alone (no server).

``report["servers"][name]`` (name ``specdec`` or ``llama-server``) holds ``answers`` (one dict per request of
the follow-up, cold and long sections: ``section``, ``label``, ``ttft``, ``prompt_tokens``, ``ok``, ``error``)
and ``levels`` (one summary per concurrency level: ``clients``, ``tokens_per_s``, ``ttft_p50_s``,
``ttft_p95_s``, ``client_tokens_per_s``, ``errors``). The structured and tools sections' answers also carry
``run`` ("greedy", "seed 1"; tools: "required greedy", ...), ``total`` (seconds, sent -> whole answer),
``tokens``, ``valid`` and ``invalid`` (why not). Ratios are specdec / llama-server: below 1 is better for times,
above 1 for throughputs.
"""

from __future__ import annotations

from servers import quantile

SERVERS = ("specdec", "llama-server")
SECTION_TITLES = {
    "followup": "Follow-up: a file + a question, then the same file + another question",
    "cold": "Cold long context: a different file of the same size",
    "long": "Long prompts: a cold prompt of each length",
}
ISSUE_SECTIONS = {20: ("followup", "cold", "concurrency", "long"), 26: ("structured", "tools")}  # whose goals


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def num(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def level_summary(clients: int, per_client: list[tuple[list[dict], float]], wall: float) -> dict:
    """One concurrency level's figures from each client's (answers, seconds) and the level's wall seconds."""
    answers = [a for answers, _ in per_client for a in answers]
    ok = [a for a in answers if a["ok"]]
    tokens = sum(a["tokens"] or 0 for a in ok)
    rates = [sum(a["tokens"] or 0 for a in rs if a["ok"]) / s for rs, s in per_client if s > 0]
    return {"clients": clients, "requests": len(answers), "errors": len(answers) - len(ok), "tokens": tokens,
            "wall_s": wall, "tokens_per_s": tokens / wall if wall > 0 else None,
            "ttft_p50_s": quantile([a["ttft"] for a in ok], 0.5), "ttft_p95_s": quantile([a["ttft"] for a in ok], 0.95),
            "client_tokens_per_s": sum(rates) / len(rates) if rates else None, "answers": answers}


def answers_by_label(report: dict, section: str) -> list[tuple[str, dict[str, dict]]]:
    """[(label, {server: answer})] of one section, labels in the order they were asked."""
    out: dict[str, dict[str, dict]] = {}
    for name in SERVERS:
        for a in report["servers"].get(name, {}).get("answers", []):
            if a["section"] == section:
                out.setdefault(a["label"], {})[name] = a
    return list(out.items())


def levels_by_clients(report: dict) -> dict[int, dict[str, dict]]:
    out: dict[int, dict[str, dict]] = {}
    for name in SERVERS:
        for level in report["servers"].get(name, {}).get("levels", []):
            out.setdefault(level["clients"], {})[name] = level
    return dict(sorted(out.items()))


def figure(row: dict[str, dict], name: str, key: str) -> float | None:
    item = row.get(name)
    return None if item is None or (item.get("ok") is False) else item.get(key)


def reused(answer: dict | None) -> int | None:
    """Prompt tokens the server took from its cache: specdec's ``prompt_tokens_reused``, llama-server's
    ``timings.cache_n``."""
    extra = (answer or {}).get("extra") or {}
    value = (extra.get("specdec") or {}).get("prompt_tokens_reused", (extra.get("timings") or {}).get("cache_n"))
    return value if isinstance(value, int) else None


def ttft_table(report: dict, section: str) -> list[str]:
    lines = ["| request | prompt tokens | reused from cache | specdec TTFT s | llama-server TTFT s "
             "| specdec / llama-server | errors |", "|---|---:|---:|---:|---:|---:|---|"]
    for label, row in answers_by_label(report, section):
        spec, llama = figure(row, "specdec", "ttft"), figure(row, "llama-server", "ttft")
        tokens = " / ".join(str((row.get(n) or {}).get("prompt_tokens") or "–") for n in SERVERS)
        cached = " / ".join("–" if reused(row.get(n)) is None else str(reused(row.get(n))) for n in SERVERS)
        errors = "; ".join(f"{n}: {row[n]['error']}" for n in SERVERS if n in row and row[n].get("error"))
        lines.append(f"| {label} | {tokens} | {cached} | {num(spec)} | {num(llama)} | {num(ratio(spec, llama))} "
                     f"| {errors or '–'} |")
    return lines + ["", "Prompt tokens and reused: specdec / llama-server (their usage, specdec's "
                        "`prompt_tokens_reused`, llama-server's `timings.cache_n`)."]


def concurrency_rows(report: dict) -> list[dict]:
    """Per N: both servers' figures, specdec / llama-server, and each one's tokens/s over its own N = 1."""
    levels = levels_by_clients(report)
    base = levels.get(1, {})
    rows = []
    for n, row in levels.items():
        out = {"clients": n}
        for name in SERVERS:
            level = row.get(name) or {}
            out[name] = {k: level.get(k) for k in ("tokens_per_s", "ttft_p50_s", "ttft_p95_s",
                                                   "client_tokens_per_s", "errors", "requests")}
            out[name]["over_n1"] = ratio(level.get("tokens_per_s"), (base.get(name) or {}).get("tokens_per_s"))
        out["ratio"] = ratio(out["specdec"]["tokens_per_s"], out["llama-server"]["tokens_per_s"])
        rows.append(out)
    return rows


def concurrency_table(report: dict) -> list[str]:
    lines = ["| N | specdec tok/s | llama-server tok/s | specdec / llama-server | specdec / own N=1 "
             "| llama-server / own N=1 | TTFT p50 / p95 s specdec | TTFT p50 / p95 s llama-server "
             "| tok/s per client specdec / llama-server | errors |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in concurrency_rows(report):
        s, ll = r["specdec"], r["llama-server"]
        errors = " / ".join(str(x["errors"]) if x["errors"] is not None else "–" for x in (s, ll))
        lines.append(f"| {r['clients']} | {num(s['tokens_per_s'], 1)} | {num(ll['tokens_per_s'], 1)} "
                     f"| {num(r['ratio'])} | {num(s['over_n1'])} | {num(ll['over_n1'])} "
                     f"| {num(s['ttft_p50_s'])} / {num(s['ttft_p95_s'])} "
                     f"| {num(ll['ttft_p50_s'])} / {num(ll['ttft_p95_s'])} "
                     f"| {num(s['client_tokens_per_s'], 1)} / {num(ll['client_tokens_per_s'], 1)} | {errors} |")
    return lines


def tally(answers: list[dict]) -> dict:
    """Requests, errors, valid answers and end-to-end tokens/s (completion tokens / seconds, answers that
    completed; and of the valid answers alone) of some structured or tools answers."""
    ok = [a for a in answers if a["ok"]]
    valid = [a for a in ok if a.get("valid")]
    tokens, seconds = sum(a["tokens"] or 0 for a in ok), sum(a["total"] or 0.0 for a in ok)
    valid_seconds = sum(a["total"] or 0.0 for a in valid)
    return {"requests": len(answers), "errors": len(answers) - len(ok), "valid": len(valid), "tokens": tokens,
            "seconds": seconds, "tokens_per_s": tokens / seconds if seconds > 0 else None,
            "valid_tokens_per_s": sum(a["tokens"] or 0 for a in valid) / valid_seconds if valid_seconds > 0 else None}


def schema_rows(report: dict, section: str) -> list[dict]:
    """Per run of the structured or tools section, then "all": each server's tally and specdec / llama-server
    tokens/s."""
    answers = {n: [a for a in report["servers"].get(n, {}).get("answers", []) if a["section"] == section]
               for n in SERVERS}
    names = list(dict.fromkeys(a["run"] for n in SERVERS for a in answers[n]))
    rows = []
    for run in [*names, "all"] if names else []:
        row = {"run": run} | {n: tally([a for a in answers[n] if run in ("all", a["run"])]) for n in SERVERS}
        row["ratio"] = ratio(row["specdec"]["tokens_per_s"], row["llama-server"]["tokens_per_s"])
        rows.append(row)
    return rows


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def cell(text: str) -> str:
    """``text`` in a markdown table's cell: its pipes escaped."""
    return text.replace("|", "\\|")


def shown(value) -> str:
    return "–" if value is None else str(value)


def end_to_end(answer: dict | None) -> float | None:
    if not answer or not answer.get("ok") or not answer.get("total"):
        return None
    return (answer.get("tokens") or 0) / answer["total"]


def verdict(answer: dict | None) -> str:
    if not answer or not answer.get("ok"):
        return "error" if answer else "–"
    return "–" if answer.get("valid") is None else "yes" if answer["valid"] else "**no**"


def split_line(report: dict, section: str) -> str | None:
    """Where the servers' time went in a section, from their own figures (specdec's ``specdec`` field,
    llama-server's ``timings``): prompt reading and generating seconds; specdec's tokens per target call."""
    def answers(name: str, key: str) -> list[dict]:
        return [(a.get("extra") or {}).get(key) or {} for a in report["servers"].get(name, {}).get("answers", [])
                if a["section"] == section and a["ok"]]

    def total(items: list[dict], key: str) -> float:
        return sum(x.get(key) or 0 for x in items)

    spec, llama = answers("specdec", "specdec"), answers("llama-server", "timings")
    parts = []
    if any(spec):
        prefill, tokens, calls = total(spec, "prefill_seconds"), total(spec, "new_tokens"), total(spec, "target_calls")
        parts.append(f"specdec: {prefill:.1f} s reading prompts, {total(spec, 'seconds') - prefill:.1f} s generating "
                     f"{tokens:.0f} tokens in {calls:.0f} target calls ({num(ratio(tokens, calls))} per call, "
                     f"{total(spec, 'forced'):.0f} forced drafts)")
    if any(llama):
        parts.append(f"llama-server: {total(llama, 'prompt_ms') / 1000:.1f} s reading {total(llama, 'prompt_n'):.0f} "
                     f"prompt tokens ({total(llama, 'cache_n'):.0f} from cache), "
                     f"{total(llama, 'predicted_ms') / 1000:.1f} s generating {total(llama, 'predicted_n'):.0f} tokens")
    return "Their own figures, answers that completed: " + "; ".join(parts) + "." if parts else None


def per_answer_line(report: dict, section: str) -> str:
    """Seconds per answer on each server (the same requests, end to end) and how many were valid: tokens/s counts
    every token a server wrote, a call or not, so a server that writes 192 tokens of text where a call was asked for
    reads fast by it; the time to an answer does not."""
    rows = [row for _, row in answers_by_label(report, section)]
    parts = []
    for name in SERVERS:
        done = [r[name] for r in rows if r.get(name) and r[name].get("total") is not None]
        valid = sum(1 for a in done if a.get("valid"))
        mean = sum(a["total"] for a in done) / len(done) if done else None
        parts.append(f"{name} {num(mean)} s ({valid} of {len(done)} valid)")
    return "Seconds per answer, mean of the same requests end to end: " + "; ".join(parts) + "."


def schema_tables(report: dict, section: str) -> list[str]:
    lines = ["| run | specdec tok/s | llama-server tok/s | specdec / llama-server | valid specdec | valid llama-server "
             "| tok/s of the valid answers alone | errors |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in schema_rows(report, section):
        s, ll = r["specdec"], r["llama-server"]
        lines.append(f"| {r['run']} | {num(s['tokens_per_s'], 1)} | {num(ll['tokens_per_s'], 1)} | {num(r['ratio'])} "
                     f"| {s['valid']} of {s['requests']} | {ll['valid']} of {ll['requests']} "
                     f"| {num(s['valid_tokens_per_s'], 1)} / {num(ll['valid_tokens_per_s'], 1)} "
                     f"| {s['errors']} / {ll['errors']} |")
    split = split_line(report, section)
    lines += ["", split] if split else []
    lines += ["", per_answer_line(report, section)]
    lines += ["", "| request | tokens | prompt tokens | reused from cache | seconds | specdec tok/s "
              "| llama-server tok/s | specdec / llama-server | valid | why not valid, errors |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for label, row in answers_by_label(report, section):
        both = [row.get(n) for n in SERVERS]
        spec, llama = (end_to_end(a) for a in both)
        why = "; ".join(f"{n}: {a.get('error') or a.get('invalid')}" for n, a in row.items()
                        if a.get("error") or a.get("invalid"))
        pairs = [" / ".join(shown((a or {}).get(key)) for a in both) for key in ("tokens", "prompt_tokens")]
        pairs += [" / ".join(shown(reused(a)) for a in both), " / ".join(num((a or {}).get("total")) for a in both)]
        lines.append(f"| {label} | {' | '.join(pairs)} | {num(spec, 1)} | {num(llama, 1)} | {num(ratio(spec, llama))} "
                     f"| {' / '.join(verdict(a) for a in both)} | {cell(why or '–')} |")
    return lines + ["", "tokens, prompt tokens, reused, seconds, valid: specdec / llama-server."]


def goals(report: dict) -> list[dict]:
    """Issue 20's and 26's goals that these measurements decide: {"goal", "issue", "measured", "met"} (met
    None: not measured; "detail" where the figure is a count)."""
    out = []
    issue = [20]

    def add(goal: str, measured: float | None, met, detail: str | None = None) -> None:
        out.append({"goal": goal, "issue": issue[0], "measured": measured,
                    "met": None if measured is None else bool(met(measured))} | ({"detail": detail} if detail else {}))

    follow = [row for label, row in answers_by_label(report, "followup") if label != "cold"]
    spec = [figure(r, "specdec", "ttft") for r in follow]
    worst = max(spec) if spec and None not in spec else None
    add("follow-up TTFT <= 1 s (worst follow-up, specdec)", worst, lambda v: v <= 1.0)
    ratios = [ratio(figure(r, "specdec", "ttft"), figure(r, "llama-server", "ttft")) for r in follow]
    add("follow-up TTFT <= 1.5x llama-server's (worst ratio)",
        max(ratios) if ratios and None not in ratios else None, lambda v: v <= 1.5)
    cold = answers_by_label(report, "cold")
    add("cold long context TTFT <= llama-server's (ratio)",
        ratio(figure(cold[0][1], "specdec", "ttft"), figure(cold[0][1], "llama-server", "ttft")) if cold else None,
        lambda v: v <= 1.0)
    rows = {r["clients"]: r for r in concurrency_rows(report)}
    for n, own in ((4, 2.5), (8, 3.0)):
        add(f"{n} clients: aggregate tokens/s >= {own}x specdec's own 1-client figure",
            rows[n]["specdec"]["over_n1"] if n in rows else None, lambda v, own=own: v >= own)
        add(f"{n} clients: aggregate tokens/s >= 1.5x llama-server --parallel {n}",
            rows[n]["ratio"] if n in rows else None, lambda v: v >= 1.5)
    issue[0] = 26

    def specdec_answers(section: str, run_prefix: str = "") -> list[dict]:
        return [a for a in report["servers"].get("specdec", {}).get("answers", [])
                if a["section"] == section and a["run"].startswith(run_prefix)]

    for section, what in (("structured", "schema-constrained answers >= 1.5x llama-server's json_schema answers"),
                          ("tools", "tool-call answers >= 1.5x llama-server's (--jinja)")):
        everything = next((r for r in schema_rows(report, section) if r["run"] == "all"), None)
        add(f"{section}: {what} (tokens/s end to end, all runs)", everything and everything["ratio"],
            lambda v: v >= 1.5)
    for goal, answers in (("structured: every specdec answer valid against its schema",
                           specdec_answers("structured")),
                          ("tools, tool_choice required: every specdec answer a valid call",
                           specdec_answers("tools", "required"))):
        t = tally(answers)
        add(goal, t["valid"] / t["requests"] if answers else None, lambda v: v == 1.0,
            f"{t['valid']} of {t['requests']}" if answers else None)
    return out


def goal_lines(report: dict, issue: int | None = None) -> list[str]:
    verdict = {True: "met", False: "**not met**", None: "not measured"}
    return [f"- {g['goal']}: {g.get('detail') or num(g['measured'])} — {verdict[g['met']]}" for g in goals(report)
            if issue is None or g["issue"] == issue]


def markdown(report: dict) -> str:
    s, m, ll = report["settings"], report["machine"], report["llama_server"]
    lines = [
        "# specdec serve vs llama-server: what editors and agents send",
        "",
        f"- command: `{report['command']}`" + ("" if report.get("complete") else " (**incomplete run**)"),
        f"- date: {report['date']}; machine: {m['cpu']}; flags: {' '.join(m['flags']) or 'none'}; "
        f"{m['cores']} cores; Python {m['python']}",
        f"- model: `{report['model']}` (both servers)",
        *(f"- {name}: " + "; ".join(f"`{c}`" for c in report["servers"][name]["commands"])
          for name in SERVERS if name in report["servers"]),
        f"- llama-server: {ll['version'].splitlines()[0] if ll.get('version') else 'version unknown'}; "
        f"{ll['slot_context']} KV tokens per slot",
        "- clients: the openai client, " + (f"streaming chat completions, temperature 0; answers of "
        f"{s['answer_tokens']} tokens (follow-up, cold, long) and {s['max_tokens']} (concurrency); "
        if set(ISSUE_SECTIONS[20]) & set(s["sections"]) else "") + f"{s['warmup']} warm-up request(s) after each "
        "server start",
        "",
    ]
    prompts = {k: len(v) for k, v in report.get("prompts", {}).items()}
    docs = report.get("documents", {})
    for section in ("followup", "cold", "long"):
        if section not in s["sections"]:
            continue
        files = ", ".join(f"{d['file']} ({d['tokens']} tokens)" for k, d in docs.items() if k.startswith(section))
        lines += [f"## {SECTION_TITLES[section]}", "", f"Files of Python's standard library: {files}.", "",
                  *ttft_table(report, section), ""]
        if section == "followup":
            lines += [f"Questions: {' / '.join(report.get('questions', []))}", ""]
    bench = report.get("llama_bench")
    if bench:
        rates = bench.get("tokens_per_s") or {}
        lines += [f"llama-bench prompt reading (`{bench['command']}`): "
                  + (", ".join(f"{n} tokens {v:.1f} tokens/s" for n, v in rates.items()) or bench.get("error")), ""]
    if "concurrency" in s["sections"]:
        lines += ["## Concurrency: N clients at once", "",
                  f"Each client sends {s['requests_per_client']} requests in turn over four short coding prompts; "
                  "tok/s = completion tokens / the level's wall time; llama-server runs `--parallel N`.", "",
                  *concurrency_table(report), ""]
    if "structured" in s["sections"]:
        lines += ["## Structured output: `response_format` json_schema (strict)", "",
                  f"{plural(prompts.get('structured', 0), 'prompt')}, each with its JSON schema, "
                  f"sent as `response_format` `{{\"type\": \"json_schema\", ...}}`; whole (non-streamed) answers of up "
                  f"to {s['schema_max_tokens']} tokens, greedy and at temperature {s['sampled_temperature']} with each "
                  "seed (temperature and seed only, as an OpenAI client sends them: each server's own defaults for the "
                  "rest of sampling); tok/s end to end = completion tokens / seconds from the request sent to the "
                  "whole answer (prompt reading included); valid = JSON that validates against the schema "
                  "(jsonschema).", "",
                  *schema_tables(report, "structured"), ""]
    if "tools" in s["sections"]:
        parallel = ("`parallel_tool_calls` false" if s.get("no_parallel_tool_calls")
                    else "`parallel_tool_calls` not sent (each server's default)")
        lines += ["## Tool calls: `tools` with `tool_choice` " + " and ".join(f"`{c}`" for c in s["tool_choices"]),
                  "", f"{plural(prompts.get('tools', 0), 'prompt')} with 1-3 tools each, {parallel}; whole answers of "
                  f"up to {s['schema_max_tokens']} tokens, the same runs; valid = finish_reason `tool_calls` and every "
                  "call names a declared tool, its arguments validating against the tool's `parameters`.", "",
                  *schema_tables(report, "tools"), ""]
    for issue, sections in ISSUE_SECTIONS.items():
        if set(sections) & set(s["sections"]):
            lines += [f"## Issue {issue}'s goals", "", *goal_lines(report, issue), ""]
    return "\n".join(lines)

