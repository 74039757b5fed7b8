"""Schema-constrained generation on the default pair: speed, forced drafts, and what the mask costs per position.

For each prompt (answers a JSON schema fixes), in one process, greedy, each mode run in turn:

- ``plain``: plain decoding under the schema (the target alone, the mask on every row);
- ``model``: speculative decoding under the schema, the 0.5B draft (``--gamma auto``), forced drafts on;
- ``free``: speculative decoding of the same prompt without the schema (the unconstrained reference).

Per run: tokens/s (prompt reading excluded: rounds only), tokens per target call, forced drafts, and the
time spent computing masks (``specdec.grammar.Grammar.allowed``, wrapped and timed) per masked position.

    python benchmarks/constrained.py                         # benchmarks/results/constrained.{md,json}
    python benchmarks/constrained.py --repeats 3 --max-new-tokens 96
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shlex
import statistics
import sys
import time

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "maxLength": 60},
        "languages": {"type": "array", "items": {"enum": ["python", "c", "rust", "go", "java"]}, "maxItems": 4}},
        "required": ["name", "age", "email", "languages"], "additionalProperties": False},
    "function": {"type": "object", "properties": {
        "name": {"type": "string", "pattern": "^[a-z_][a-z0-9_]{0,30}$"},
        "parameters": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 20}, "type": {"enum": ["int", "str", "float", "list", "dict"]}},
            "required": ["name", "type"], "additionalProperties": False}, "maxItems": 4},
        "returns": {"enum": ["int", "str", "float", "list", "dict", "None"]},
        "docstring": {"type": "string", "maxLength": 120}},
        "required": ["name", "parameters", "returns", "docstring"], "additionalProperties": False},
    "tool-call": {"type": "object", "properties": {
        "name": {"const": "get_weather"},
        "arguments": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                      "unit": {"enum": ["celsius", "fahrenheit"]}},
                      "required": ["city", "unit"], "additionalProperties": False}},
        "required": ["name", "arguments"], "additionalProperties": False},
}
PROMPTS = {
    "person": "Describe a fictional software engineer as JSON: name, age, email and languages.",
    "function": "Describe, as JSON, a Python function that merges two sorted lists: its name, parameters, "
                "return type and docstring.",
    "tool-call": "Call the get_weather tool for Lisbon in celsius. Answer with the call as JSON.",
}


def run_one(pair, ids, schema, mode: str, max_new_tokens: int) -> dict:
    from specdec import SamplingParams, autoregressive_generate, speculative_generate
    from specdec.choices import make_policy
    from specdec.drafters import ModelDrafter
    from specdec.grammar import grammar_for, json_schema_grammar

    constraint = None if mode == "free" else grammar_for(json_schema_grammar(schema), pair)
    mask_seconds, masks = [0.0], [0]
    if constraint is not None:
        inner = constraint.allowed

        def timed():
            t0 = time.perf_counter()
            out = inner()
            mask_seconds[0] += time.perf_counter() - t0
            masks[0] += 1
            return out

        constraint.allowed = timed
    common = dict(max_new_tokens=max_new_tokens, sampling=SamplingParams(temperature=0),
                  eos_token_id=pair.eos_token_ids, constraint=constraint)
    if mode == "plain":
        gen = autoregressive_generate(pair.target, ids, **common)
    else:
        gen = speculative_generate(pair.target, ModelDrafter(pair.draft), ids, gamma=make_policy("auto"), **common)
    s = gen.stats
    rounds_seconds = s.total_seconds - s.prefill_seconds
    text = pair.decode([t for t in gen.tokens if t not in pair.eos_token_ids])
    valid = None
    if constraint is not None:
        import jsonschema

        try:
            jsonschema.validate(json.loads(text), schema)
            valid = True
        except (ValueError, jsonschema.ValidationError):
            valid = False
    return {"mode": mode, "tokens": s.new_tokens, "tokens_per_second": s.new_tokens / rounds_seconds,
            "tokens_per_target_call": s.tokens_per_target_call, "forced": s.forced, "target_calls": s.target_calls,
            "mask_ms_per_position": 1000 * mask_seconds[0] / masks[0] if masks[0] else None, "masks": masks[0],
            "valid": valid, "text": text}


def markdown(report: dict) -> str:
    lines = ["# Schema-constrained generation, the default pair (greedy)", "", f"- command: `{report['command']}`",
             f"- date: {report['date']}", f"- machine: {report['machine']}", "",
             "tokens/s over the rounds (prompt reading excluded), the median of the repeats.", "",
             "| prompt | mode | tokens | tokens/s | × constrained plain | tokens per target call | forced drafts | "
             "mask ms per position | valid |", "|---|---|---|---|---|---|---|---|---|"]
    for name, rows in report["results"].items():
        med = {m: statistics.median(r["tokens_per_second"] for r in rows if r["mode"] == m)
               for m in ("plain", "model", "free")}
        for mode in ("plain", "model", "free"):
            r = next(r for r in rows if r["mode"] == mode)
            mask = "" if r["mask_ms_per_position"] is None else f"{r['mask_ms_per_position']:.2f}"
            lines.append(f"| {name} | {mode} | {r['tokens']} | {med[mode]:.2f} | {med[mode] / med['plain']:.2f}× | "
                         f"{r['tokens_per_target_call']:.2f} | {r['forced']} | {mask} | "
                         f"{'' if r['valid'] is None else r['valid']} |")
    lines += ["", "The answers (model mode):", ""]
    for name, rows in report["results"].items():
        lines.append(f"- {name}: `{next(r for r in rows if r['mode'] == 'model')['text']}`")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=2, metavar="N", help="runs of each mode (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=96, metavar="N", help="default: %(default)s")
    p.add_argument("--out", default="benchmarks/results/constrained", metavar="STEM")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats {args.repeats} is invalid: must be an integer >= 1")
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "src"))
    from specdec import session
    from specdec.machine import cpu_flags, describe_cpu

    pair = session.load(session.load_settings("model"), log=lambda m: print(m, file=sys.stderr))
    results = {}
    for name, schema in SCHEMAS.items():
        ids = pair.encode(PROMPTS[name], chat=True)
        rows = []
        for _ in range(args.repeats):
            for mode in ("plain", "model", "free"):
                rows.append(run_one(pair, ids, schema, mode, args.max_new_tokens))
                print(f"{name} {mode}: {rows[-1]['tokens_per_second']:.2f} tok/s, forced {rows[-1]['forced']}, "
                      f"valid {rows[-1]['valid']}", file=sys.stderr)
        results[name] = rows
    report = {"command": shlex.join(["python", "benchmarks/constrained.py", *(argv or sys.argv[1:])]),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{describe_cpu()}, {os.cpu_count()} cores, flags {' '.join(cpu_flags())}",
              "results": results}
    pathlib.Path(args.out + ".json").write_text(json.dumps(report, indent=2) + "\n")
    pathlib.Path(args.out + ".md").write_text(markdown(report))
    print(f"wrote {args.out}.md and {args.out}.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
