"""This checkout against an earlier revision, in one run: the main job and the served figures, side by side.

For a change that must not move behaviour or speed (a house pass, a refactor): the earlier revision's ``src/``
is exported (``git archive``) into a temporary folder and both trees run with the same virtual environment, the
same models and the same machine, turn about (A B A B ..., so the machine's drift falls on both), each as its
own process with ``PYTHONPATH`` naming its ``src/``:

- ``main``: the README's main job, ``specdec generate PROMPT --compare --max-new-tokens 128 --json`` (greedy, the
  default pair): speculative and plain tokens/s, the speed-up, and whether the two trees' texts are identical
  (greedy: they must be, token for token);
- ``serve``: ``benchmarks/serve_load.py`` (it starts ``specdec serve``): aggregate tokens/s and time to first
  token per level of concurrent clients;
- ``load``: the warm load (the file in the page cache, the kernels built: one unmeasured run first) of the default
  pair (``specdec generate PROMPT --max-new-tokens 4 --json``, its draft model) and of each ``--load-targets``
  FILE alone (``--target FILE --draft lookup``): ``load_seconds`` and ``peak_memory_gb``.

    python benchmarks/tree_ab.py --base 3bcbd8a                     # both sections, 3 pairs each
    python benchmarks/tree_ab.py --base HEAD~5 --sections main --runs 5
    python benchmarks/tree_ab.py --base HEAD~2 --sections load --runs 5 --load-targets Q6_K.gguf F16.gguf

Writes ``--out``.md and .json (default benchmarks/results/tree-ab): every pair's figures, the ratios
this/base pair by pair, and their medians.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shlex
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROMPT = "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring."


def export(rev: str, folder: pathlib.Path) -> pathlib.Path:
    """``rev``'s src/ under ``folder``; its path."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder / "src"


def env_for(src: pathlib.Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(src)}


def main_job(src: pathlib.Path, max_new_tokens: int, timeout: float) -> dict:
    command = [sys.executable, "-m", "specdec", "generate", PROMPT, "--compare", "--max-new-tokens",
               str(max_new_tokens), "--json"]
    done = subprocess.run(command, env=env_for(src), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"main job failed under {src}: {done.stderr[-2000:]}")
    out = json.loads(done.stdout)
    return {key: out.get(key) for key in ("text", "tokens_per_second", "baseline_tokens_per_second", "speedup",
                                          "identical_to_baseline", "alpha", "tokens_per_target_call")}


def loaded(src: pathlib.Path, target: str | None, timeout: float) -> dict:
    """One warm load: the default pair (target None) or FILE alone with prompt lookup."""
    command = [sys.executable, "-m", "specdec", "generate", "def f():", "--max-new-tokens", "4", "--json",
               *(["--target", target, "--draft", "lookup"] if target else [])]
    done = subprocess.run(command, env=env_for(src), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"load of {target or 'the default pair'} failed under {src}: {done.stderr[-2000:]}")
    out = json.loads(done.stdout)
    return {key: out.get(key) for key in ("load_seconds", "peak_memory_gb")}


def served(src: pathlib.Path, clients: list[int], scratch: pathlib.Path, timeout: float) -> list[dict]:
    stem = scratch / f"serve-{len(list(scratch.iterdir()))}"
    command = [sys.executable, str(ROOT / "benchmarks" / "serve_load.py"), "--clients", *map(str, clients),
               "--requests-per-client", "2", "--out", str(stem)]
    done = subprocess.run(command, env=env_for(src), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"serve_load failed under {src}: {done.stderr[-2000:]}")
    rows = json.loads(pathlib.Path(f"{stem}.json").read_text())["rows"]
    return [{k: r[k] for k in ("clients", "tokens_per_s", "ttft_p50_s", "errors")} for r in rows]


def median_ratio(pairs: list[tuple[float, float]]) -> float | None:
    ratios = [a / b for a, b in pairs if a and b]
    return statistics.median(ratios) if ratios else None


def markdown(report: dict) -> str:
    lines = [f"# This checkout ({report['head']}) against {report['base']} ({report['base_commit']})", "",
             f"- command: `{report['command']}`", f"- date: {report['date']}",
             f"- machine: {report['machine']}", "", "Ratios are this / base, pair by pair (each pair run back to "
             "back); the figure is their median.", ""]
    if report.get("main"):
        lines += ["## The main job (`specdec generate PROMPT --compare --max-new-tokens 128 --json`)", "",
                  "| pair | speculative tok/s (this / base) | plain tok/s (this / base) | speed-up (this / base) | "
                  "same text |", "|---|---|---|---|---|"]
        for i, (a, b) in enumerate(report["main"], 1):
            lines.append(f"| {i} | {a['tokens_per_second']:.2f} / {b['tokens_per_second']:.2f} | "
                         f"{a['baseline_tokens_per_second']:.2f} / {b['baseline_tokens_per_second']:.2f} | "
                         f"{a['speedup']:.2f} / {b['speedup']:.2f} | {a['text'] == b['text']} |")
        s = report["summary"]["main"]
        lines += ["", f"Median ratios: speculative {s['speculative']:.3f}, plain {s['plain']:.3f}; identical texts in "
                  f"{s['identical']} of {len(report['main'])} pairs; speculative = plain in every run: "
                  f"{s['exact']}.", ""]
    if report.get("serve"):
        lines += ["## Served (`benchmarks/serve_load.py`, the default pair, greedy, 2 requests per client)", "",
                  "| pair | clients | tokens/s (this / base) | TTFT p50 s (this / base) | errors |",
                  "|---|---|---|---|---|"]
        for i, (a_rows, b_rows) in enumerate(report["serve"], 1):
            for a, b in zip(a_rows, b_rows, strict=True):
                lines.append(f"| {i} | {a['clients']} | {a['tokens_per_s']:.1f} / {b['tokens_per_s']:.1f} | "
                             f"{a['ttft_p50_s']:.2f} / {b['ttft_p50_s']:.2f} | {a['errors']} / {b['errors']} |")
        lines += [""] + [f"Median ratio at {n} clients: tokens/s {r['tokens_per_s']:.3f}, TTFT {r['ttft']:.3f}."
                         for n, r in report["summary"]["serve"].items()] + [""]
    if report.get("load"):
        lines += ["## Warm loads (`specdec generate 'def f():' --max-new-tokens 4 --json`)", "",
                  "| what | load s, each pair (this / base) | peak GB (this / base) | median load ratio |",
                  "|---|---|---|---|"]
        for what, pairs in report["load"].items():
            lines.append(f"| {what} | {', '.join(f'{a[0]:.2f} / {b[0]:.2f}' for a, b in pairs)} | "
                         f"{pairs[0][0][1]} / {pairs[0][1][1]} | {report['summary']['load'][what]:.3f} |")
        lines.append("")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, metavar="REV", help="the earlier revision (a commit, tag or HEAD~N)")
    p.add_argument("--sections", nargs="+", choices=("main", "serve", "load"),
                   default=["main", "serve"])
    p.add_argument("--load-targets", nargs="*", default=[], metavar="FILE",
                   help="load: GGUF files loaded alone besides the default pair")
    p.add_argument("--runs", type=int, default=3, metavar="N", help="pairs per section (default: %(default)s)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4], metavar="N",
                   help="serve: levels of concurrent clients (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="N", help="main: default %(default)s")
    p.add_argument("--timeout", type=float, default=900.0, metavar="S", help="per process (default: %(default)s)")
    p.add_argument("--out", default="benchmarks/results/tree-ab", metavar="STEM")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error(f"--runs {args.runs} is invalid: must be an integer >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rev = lambda r: subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", r], check=True,  # noqa: E731
                                   capture_output=True, text=True).stdout.strip()
    sys.path.insert(0, str(ROOT / "src"))
    from specdec.machine import cpu_flags, describe_cpu

    report = {"command": shlex.join(["python", "benchmarks/tree_ab.py", *(argv or sys.argv[1:])]),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{describe_cpu()}, {os.cpu_count()} cores, flags {' '.join(cpu_flags())}",
              "head": rev("HEAD"), "base": args.base, "base_commit": rev(args.base), "summary": {}}
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="specdec-ab-") as tmp:
        base_src, this_src, scratch = export(args.base, pathlib.Path(tmp)), ROOT / "src", pathlib.Path(tmp) / "out"
        scratch.mkdir()
        if "main" in args.sections:
            report["main"] = []
            for i in range(args.runs):
                order = [this_src, base_src] if i % 2 == 0 else [base_src, this_src]
                got = {src: main_job(src, args.max_new_tokens, args.timeout) for src in order}
                report["main"].append((got[this_src], got[base_src]))
                a, b = report["main"][-1]
                log(f"main {i + 1}: speculative {a['tokens_per_second']:.2f} / {b['tokens_per_second']:.2f} tok/s, "
                    f"plain {a['baseline_tokens_per_second']:.2f} / {b['baseline_tokens_per_second']:.2f}, "
                    f"same text {a['text'] == b['text']}")
            pairs = report["main"]
            report["summary"]["main"] = {
                "speculative": median_ratio([(a["tokens_per_second"], b["tokens_per_second"]) for a, b in pairs]),
                "plain": median_ratio([(a["baseline_tokens_per_second"], b["baseline_tokens_per_second"])
                                       for a, b in pairs]),
                "identical": sum(a["text"] == b["text"] for a, b in pairs),
                "exact": all(a["identical_to_baseline"] and b["identical_to_baseline"] for a, b in pairs)}
        if "serve" in args.sections:
            report["serve"] = []
            for i in range(args.runs):
                order = [this_src, base_src] if i % 2 == 0 else [base_src, this_src]
                got = {src: served(src, args.clients, scratch, args.timeout) for src in order}
                report["serve"].append((got[this_src], got[base_src]))
                log(f"serve {i + 1}: " + ", ".join(f"{a['clients']} clients {a['tokens_per_s']:.1f} / "
                                                   f"{b['tokens_per_s']:.1f} tok/s"
                                                   for a, b in zip(*report["serve"][-1], strict=True)))
            report["summary"]["serve"] = {
                n: {"tokens_per_s": median_ratio([(a[j]["tokens_per_s"], b[j]["tokens_per_s"])
                                                  for a, b in report["serve"]]),
                    "ttft": median_ratio([(a[j]["ttft_p50_s"], b[j]["ttft_p50_s"]) for a, b in report["serve"]])}
                for j, n in enumerate(args.clients)}
        if "load" in args.sections:
            report["load"], report["summary"]["load"] = {}, {}
            for target in [None, *args.load_targets]:
                what = os.path.basename(target) if target else "the default pair"
                for src in (this_src, base_src):
                    loaded(src, target, args.timeout)  # warm: the file's pages cached, the kernels built
                pairs = []
                for i in range(args.runs):
                    order = [this_src, base_src] if i % 2 == 0 else [base_src, this_src]
                    got = {src: loaded(src, target, args.timeout) for src in order}
                    pairs.append(tuple((got[s]["load_seconds"], got[s]["peak_memory_gb"])
                                       for s in (this_src, base_src)))
                    log(f"load {what} {i + 1}: {pairs[-1][0][0]:.2f} / {pairs[-1][1][0]:.2f} s")
                report["load"][what] = pairs
                report["summary"]["load"][what] = median_ratio([(a[0], b[0]) for a, b in pairs])
    out = ROOT / args.out if not os.path.isabs(args.out) else pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(f"{out}.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    pathlib.Path(f"{out}.md").write_text(markdown(report))
    log(f"wrote {out}.md and {out}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
