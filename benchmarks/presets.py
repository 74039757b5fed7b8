"""The GGUF files users download: the default target re-quantized into each llama-quantize preset, run by us and
by llama.cpp in the same script run (issue 28's goals).

    python benchmarks/presets.py [--presets Q2_K Q3_K_M ...] [--tokens 128] [--repeats 3] [--perplexity] \
        [--out benchmarks/results/presets]

Per preset: the default target (Q4_K_M) is re-quantized once by llama.cpp's own quantizer (llama-cpp-python's
``llama_model_quantize``, ``allow_requantize``) into ``~/.cache/specdec/presets/`` (kept for the next run), then
- ours, plain: ``specdec generate PROMPT --target FILE --draft lookup --temperature 0 --max-new-tokens N --compare
  --json``: the baseline's tokens/s (plain decoding, prompt reading included), peak memory, load time (warm: a
  first run of the same command has read the file into the page cache);
- ours, the main job: the same with the default draft model (``--compare``): the speculative speed-up over our
  own plain decoding, run ``--repeats`` times (each run its own ratio, both sides in one process): the median
  and the range, since one run's baseline moves with the minute;
- llama.cpp, plain: ``llama-bench -m FILE -pg P,N -t THREADS`` with P our prompt's token count: N / the time to
  read P tokens and generate N, timed as ours is (the goal's ratio); and ``-p 0 -n N`` (generation only,
  flattering to llama.cpp) beside it;
- with ``--perplexity``: ``benchmarks/perplexity.py --gguf FILE`` (ours against ``llama-perplexity``).
A preset with a tensor type we have no kernel for shows the one-line refusal (exit 2) instead of figures.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

from servers import write_atomic

from specdec.cache import cache_dir
from specdec.loading.defaults import default_paths
from specdec.machine import cpu_flags

PROMPT = "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring."
PRESETS = ["Q2_K", "Q3_K_M", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "IQ4_XS", "F16", "BF16"]
HERE = pathlib.Path(__file__).resolve().parent
SPECDEC = [sys.executable, "-m", "specdec"]


def flags() -> str:
    return " ".join(f for f in cpu_flags() if f in ("avx2", "avx512f", "avx512_vnni", "amx_tile"))


def tools_bin() -> pathlib.Path | None:
    found = sorted((cache_dir() / "llama.cpp-tools").glob("native-*/bin/llama-bench"))
    return found[-1].parent if found else None


def requantize(source: str, preset: str) -> str:
    if preset == "Q4_K_M":
        return source
    import llama_cpp

    folder = cache_dir() / "presets"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{pathlib.Path(source).stem.replace('q4_k_m', preset.lower())}.gguf"
    if not path.exists():
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{preset}")
        params.allow_requantize, params.nthread = True, os.cpu_count() or 1
        partial = path.with_suffix(".partial")
        if llama_cpp.llama_model_quantize(source.encode(), str(partial).encode(), params) != 0:
            raise SystemExit(f"llama_model_quantize failed for {preset}")
        partial.rename(path)
    return str(path)


def ours(path: str, tokens: int, threads: int, drafter: str | None) -> dict:
    cmd = [*SPECDEC, "generate", PROMPT, "--target", path, "--temperature", "0", "--max-new-tokens", str(tokens),
           "--compare", "--json", "--threads", str(threads)] + (["--draft", drafter] if drafter else [])
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        return {"error": (run.stderr.strip().splitlines() or [f"exit {run.returncode}"])[-1], "rc": run.returncode}
    return json.loads(run.stdout)


def llama_bench(binary: pathlib.Path, path: str, tokens: int, threads: int, prompt: int = 0) -> float | None:
    """llama.cpp's generated tokens a second: ``-p 0 -n N`` (generation only) when ``prompt`` is 0, else
    ``-pg prompt,N``: N / the seconds to read the prompt and generate N tokens (prompt reading included)."""
    shape = ["-pg", f"{prompt},{tokens}", "-p", "0", "-n", "0"] if prompt else ["-p", "0", "-n", str(tokens)]
    run = subprocess.run([str(binary / "llama-bench"), "-m", path, *shape, "-t", str(threads), "-o", "json"],
                         capture_output=True, text=True)
    if run.returncode != 0:
        return None
    rows = [r for r in json.loads(run.stdout) if not prompt or r.get("n_prompt") == prompt]
    if not rows:
        return None
    return float(rows[0]["avg_ts"]) if not prompt else tokens / (float(rows[0]["avg_ns"]) / 1e9)


def perplexity(path: str, threads: int) -> str:
    run = subprocess.run([sys.executable, str(HERE / "perplexity.py"), "--gguf", path, "--threads", str(threads)],
                         capture_output=True, text=True)
    found = re.findall(r"ours[^\n]*", run.stdout)
    return (found[-1] if found else (run.stdout.strip().splitlines() or ["?"])[-1]) + f" (exit {run.returncode})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=PRESETS)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of the main job per preset (the median speed-up and its range are reported; default 1)")
    ap.add_argument("--perplexity", action="store_true")
    ap.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    binary = tools_bin()
    source = str(default_paths(progress=False)[0])
    rows = []
    for preset in args.presets:
        t = time.perf_counter()
        path = requantize(source, preset)
        size = os.path.getsize(path) / 1e9
        print(f"{preset}: {path} ({size:.2f} GB, ready in {time.perf_counter() - t:.0f} s)", flush=True)
        ours(path, 8, args.threads, "lookup")  # warm: the file in the page cache, the kernels built
        plain = ours(path, args.tokens, args.threads, "lookup")
        runs = [ours(path, args.tokens, args.threads, None) for _ in range(args.repeats)]
        speedups = [r["speedup"] for r in runs if r.get("speedup")]
        main_job = dict(runs[0], speedup=statistics.median(speedups) if speedups else None, speedups=speedups)
        theirs = llama_bench(binary, path, args.tokens, args.threads) if binary else None
        both = (llama_bench(binary, path, args.tokens, args.threads, plain["prompt_tokens"])
                if binary and plain.get("prompt_tokens") else None)
        row = {"preset": preset, "file_gb": round(size, 3), "plain": plain, "main_job": main_job,
               "llama_bench_tokens_per_second": theirs, "llama_bench_with_prompt_tokens_per_second": both}
        if args.perplexity:
            row["perplexity"] = perplexity(path, args.threads)
        rows.append(row)
        ours_tps = plain.get("baseline_tokens_per_second")
        print(f"  ours plain {ours_tps} tok/s, llama.cpp {both} tok/s ({theirs} generation only), main job speed-up "
              f"{main_job.get('speedup')}, peak {plain.get('peak_memory_gb')} GB, load {plain.get('load_seconds')} s"
              + (f"; {plain['error']}" if "error" in plain else ""), flush=True)
    lines = ["# The default target in each llama-quantize preset, ours vs llama.cpp", "",
             f"`python benchmarks/presets.py --presets {' '.join(args.presets)} --tokens {args.tokens} "
             f"--threads {args.threads} --repeats {args.repeats}"
             + (" --perplexity" if args.perplexity else "") + (f" --out {args.out}`" if args.out else "`")
             + f", CPU flags {flags()}, {os.cpu_count()} cores. Ours: plain decoding of the `--compare` "
             f"baseline (prompt reading included). llama.cpp: `llama-bench -pg P,{args.tokens}` with P our prompt's "
             f"tokens, {args.tokens} / the seconds to read the prompt and generate (timed as ours: the ratio), and "
             f"`llama-bench -p 0 -n {args.tokens}` (generation only, flattering to llama.cpp).",
             "", "| preset | file GB | ours plain tok/s | llama.cpp tok/s | ratio | llama.cpp generation only "
             "| its ratio | main job speed-up over our plain (median, range) | peak GB | warm load s |"
             + (" perplexity |" if args.perplexity else ""),
             "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if args.perplexity else "")]

    def cell(value, fmt="{:.1f}"):
        return fmt.format(value) if value else "–"

    def spread(m: dict) -> str:
        got = m.get("speedups") or []
        extra = f" ({min(got):.2f}–{max(got):.2f}, {len(got)} runs)" if len(got) > 1 else ""
        return cell(m.get("speedup"), "{:.2f}×") + extra

    for r in rows:
        p, m = r["plain"], r["main_job"]
        lb, both = r["llama_bench_tokens_per_second"], r.get("llama_bench_with_prompt_tokens_per_second")
        tps = p.get("baseline_tokens_per_second")
        first = p.get("error") or cell(tps)
        lines.append(f"| {r['preset']} | {r['file_gb']:.2f} | {first} | {cell(both)} | "
                     f"{cell(tps and both and tps / both, '{:.2f}×')} | {cell(lb)} | "
                     f"{cell(tps and lb and tps / lb, '{:.2f}×')} | {spread(m)} | "
                     f"{p.get('peak_memory_gb', '–')} | {p.get('load_seconds', '–')} |"
                     + (f" {r['perplexity']} |" if args.perplexity else ""))
    print("\n".join(lines))
    if args.out:
        write_atomic(args.out + ".md", "\n".join(lines) + "\n")
        write_atomic(args.out + ".json", json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
