"""``specdec bench`` results as files: a markdown table, JSON with every run, a bar chart PNG.

Every file is written atomically (a temporary file in the same folder, then ``os.replace``), so a
reader never sees half a table and an interrupted run leaves the previous files as they were.
"""

from __future__ import annotations

import os
from dataclasses import asdict

from .. import strict_json
from ..cache import write_atomic
from .stats import Row, best_rows, compare_gammas, fastest_rows, slower_than_plain
from .suite import BenchResult

COLUMNS = ("mode", "backend", "tokens/s median (min–max)", "speed-up vs plain", "vs llama.cpp plain", "decoding only",
           "Thm 3.8: paper / with T(k)", "α", "tokens/target call", "mean γ", "same as plain")
ANCHOR_MODE = "llamacpp-cli-plain"  # llama.cpp's own plain decoding (llama-completion), built for this CPU


def markdown(result: BenchResult) -> str:
    """The table, per temperature and prompt category; the best mode of each category (per backend) in bold."""
    s, m = result.settings, result.machine
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v and k != "specdec")
    lines = [
        "# specdec bench",
        "",
        f"Command: `{result.command}`  " if result.command else "",
        f"Machine: {m['cpu']} (flags: {', '.join(m.get('cpu_flags') or ['?'])}), {m['cores']} cores, "
        f"{m['torch_threads']} torch threads; {versions}; {m['date']}.  ",
        f"Settings: {s.max_new_tokens} new tokens (fewer if the model ends its answer), {s.repeats} repeat(s), "
        f"seed {s.seed}, chat template, one process, modes interleaved (order rotated per prompt) after a warm-up.  ",
        "tokens/s = new tokens / seconds of the whole decoding call, prompt reading included. "
        "Speed-up = median tokens/s of the mode / median tokens/s of `plain` (our plain decoding) on the same "
        "backend, prompts and temperature, measured in this run; min–max over the runs (prompts × repeats); "
        "α and tokens per target call pooled over the runs; mean γ = drafted tokens per round; "
        "same as plain (greedy): every run's tokens equal plain decoding's, token for token. "
        f"vs llama.cpp plain: median tokens/s / that of `{ANCHOR_MODE}` (llama.cpp's own llama-completion, "
        "built for this CPU's instruction sets) on the same prompts and temperature in this run. "
        "Decoding only: the speed-up with prompt reading left out on both sides (seconds per new token). "
        "Thm 3.8: the speed-up the paper predicts for the decoding from this row's α, γ (mean, rounded) and "
        "c = draft seconds per drafted token / plain's seconds per target call; \"with T(k)\": the same with the "
        "measured cost of a verification call T(γ+1)/T(1) instead of the paper's assumption 1. "
        "Bold: the drafting mode with the largest speed-up in the category (per backend).",
        "",
    ]
    best = {id(r) for r in best_rows(result.rows)}
    categories = dict.fromkeys(p.category for p in result.prompts)
    prompts = {c: [p.id for p in result.prompts if p.category == c] for c in categories}
    for temperature in s.temperatures:
        title = "Greedy (temperature 0)" if temperature == 0 else f"Sampling at temperature {temperature:g}"
        lines += [f"## {title}", ""]
        for category, ids in prompts.items():
            rows = [r for r in result.rows if r.temperature == temperature and r.category == category]
            if not rows:
                continue
            lines += [f"### {category} ({', '.join(ids)})", "", "| " + " | ".join(COLUMNS) + " |",
                      "|" + "---|" * len(COLUMNS)]
            anchor = next((r.median_tps for r in rows if r.mode == ANCHOR_MODE), None)
            lines += [_table_line(r, bold=id(r) in best, anchor=anchor) for r in rows]
            lines.append("")
    lines += ["## Notes", ""] + [f"- {n}" for n in notes(result)] + [""]
    return "\n".join(line for i, line in enumerate(lines) if line or (i and lines[i - 1])) + "\n"


def _table_line(r: Row, bold: bool, anchor: float | None = None) -> str:
    same = {True: "yes", False: f"NO ({r.differing_runs} of {r.runs} runs differ)", None: "—"}[r.same_as_plain]
    cells = [f"**{r.mode}**" if bold else r.mode, r.backend,
             f"{r.median_tps:.2f} ({r.min_tps:.2f}–{r.max_tps:.2f})", _x(r.speedup),
             _x(r.median_tps / anchor if anchor else None), _x(r.decode_speedup),
             _predicted(r), _num(r.alpha),
             _num(r.tokens_per_target_call), _num(r.mean_gamma), same]
    return "| " + " | ".join(cells) + " |"


def notes(result: BenchResult) -> list[str]:
    """Best mode per category, adaptive vs fixed γ, rows slower than plain, differing outputs, skips."""
    out = list(result.notes)
    several_backends = len({r.backend for r in result.rows}) > 1
    for r in best_rows(result.rows):
        where = f" on {r.backend}" if several_backends else ""
        out.append(f"Best at {_temp(r.temperature)} on {r.category}{where}: {r.mode}, {_x(r.speedup)} over plain "
                   f"({r.median_tps:.2f} tokens/s).")
    if several_backends:
        for r in fastest_rows(result.rows):
            out.append(f"Fastest at {_temp(r.temperature)} on {r.category}, any backend: {r.mode} ({r.backend}), "
                       f"{r.median_tps:.2f} tokens/s.")
    for c in compare_gammas(result.rows):
        adaptive = ", ".join(f"{r.mode} {_x(r.speedup)}" for r in c.adaptive)
        out.append(f"γ for {c.drafter} ({c.backend}) at {_temp(c.temperature)} on {c.category}: {adaptive}; "
                   f"best fixed γ in hindsight {c.best_fixed.mode} {_x(c.best_fixed.speedup)}.")
    for r in slower_than_plain(result.rows):
        out.append(f"SLOWER than plain: {r.mode} ({r.backend}) on {r.category} at {_temp(r.temperature)}: "
                   f"{_x(r.speedup)} (α {_num(r.alpha)}, {_num(r.tokens_per_target_call)} tokens per target call).")
    for r in result.rows:
        if r.same_as_plain is False:
            out.append(f"OUTPUT DIFFERS from plain decoding: {r.mode} ({r.backend}) on {r.category}, "
                       f"{r.differing_runs} of {r.runs} greedy runs.")
    return out


def as_json(result: BenchResult) -> dict:
    """Everything: machine, command, settings, prompts, every run (with its tokens) and the rows."""
    runs = []
    for r in result.records:
        run = asdict(r)
        run["tokens"] = list(r.tokens)
        run["tokens_per_second"] = r.tokens_per_second
        runs.append(run)
    return {
        "command": result.command,
        "machine": result.machine,
        "settings": asdict(result.settings),
        "notes": notes(result),
        "prompts": [asdict(p) for p in result.prompts],
        "rows": [asdict(r) for r in result.rows],
        "runs": runs,
    }


def plot_speedups(result: BenchResult, path: str | os.PathLike) -> None:
    """Speed-up over plain per mode, bars grouped by prompt category, one panel per temperature;
    a mode keeps its colour in every panel, and each bar carries its value."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    temperatures = list(result.settings.temperatures)
    categories = list(dict.fromkeys(r.category for r in result.rows))
    shown = [r for r in result.rows if r.mode != "plain" and r.speedup is not None]
    series = list(dict.fromkeys((r.mode, r.backend) for r in shown))
    palette = colormaps["tab10" if len(series) <= 10 else "tab20"]
    color = {key: palette(i % palette.N) for i, key in enumerate(series)}
    label = {key: key[0] if len(result.settings.backends) == 1 else f"{key[0]} [{key[1]}]" for key in series}
    width = max(8.0, 1.5 + 0.45 * len(series) * len(categories))
    fig = Figure(figsize=(width, 0.8 + 3.4 * len(temperatures)), dpi=110)
    FigureCanvasAgg(fig)
    for i, temperature in enumerate(temperatures):
        ax = fig.add_subplot(len(temperatures), 1, i + 1)
        rows = [r for r in shown if r.temperature == temperature]
        here = [key for key in series if any((r.mode, r.backend) == key for r in rows)]
        bar = 0.84 / max(len(here), 1)
        for j, key in enumerate(here):
            by_category = {r.category: r.speedup for r in rows if (r.mode, r.backend) == key}
            xs = [k + (j - (len(here) - 1) / 2) * bar for k, c in enumerate(categories) if c in by_category]
            ys = [by_category[c] for c in categories if c in by_category]
            bars = ax.bar(xs, ys, bar * 0.92, color=color[key], zorder=3)
            ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
        ax.axhline(1.0, color="0.3", linewidth=1, linestyle="--", zorder=4)
        ax.set_xticks(range(len(categories)), categories)
        ax.set_ylabel("speed-up over plain (×)")
        ax.set_ylim(0, max([r.speedup for r in rows] + [1.0]) * 1.15)
        ax.set_title(_temp(temperature).capitalize() + " — dashed line: plain decoding", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3, zorder=0)
    handles = [Patch(color=color[key], label=label[key]) for key in series]
    columns = max(1, min(len(handles), int(width // 2.7)))
    if handles:
        fig.legend(handles=handles, loc="lower center", ncol=columns, fontsize=8, frameon=False)
    rows_of_legend = -(-len(handles) // columns)
    fig.tight_layout(rect=(0, 0.06 * rows_of_legend / len(temperatures), 1, 1))
    write_atomic(path, lambda f: fig.savefig(f, format="png", bbox_inches="tight"))


def write_outputs(result: BenchResult, out_dir: str | os.PathLike, stem: str = "bench") -> list[str]:
    """Write STEM.md, STEM.json and STEM.png into out_dir (created if needed); return the paths."""
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(os.fspath(out_dir), stem)
    md, js, png = base + ".md", base + ".json", base + ".png"
    text = markdown(result)
    write_atomic(md, lambda f: f.write(text.encode("utf-8")))
    data = strict_json.dumps(as_json(result), indent=1) + "\n"
    write_atomic(js, lambda f: f.write(data.encode("utf-8")))
    plot_speedups(result, png)
    return [md, js, png]


def _predicted(r: Row) -> str:
    if r.predicted_paper is None:
        return "—"
    return f"{r.predicted_paper:.2f}× / {r.predicted_cost_curve:.2f}×"


def _temp(temperature: float) -> str:
    return "greedy" if temperature == 0 else f"temperature {temperature:g}"


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"

