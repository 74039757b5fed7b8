// Small inline-SVG charts drawn from the API's numbers: grouped/stacked bars and lines.
// Everything is styled by CSS classes (style.css); nothing is fetched from anywhere.
"use strict";

const Charts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const W = 720;

  function el(tag, attrs, parent) {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (parent) parent.appendChild(node);
    return node;
  }

  function label(parent, x, y, str, cls, anchor) {
    const t = el("text", { x, y, class: cls || "axis-label", "text-anchor": anchor || "middle" }, parent);
    t.textContent = str;
    return t;
  }

  function tip(node, str) {
    el("title", {}, node).textContent = str;
  }

  // Linear map from [d0, d1] to [r0, r1].
  function scale(d0, d1, r0, r1) {
    return (v) => r0 + ((v - d0) * (r1 - r0)) / (d1 - d0);
  }

  // Round numbers for an axis from 0 to about max: [ticks, top].
  function ticks(max, count) {
    const raw = max / count;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw);
    const top = Math.ceil(max / step - 1e-9) * step;
    const out = [];
    for (let v = 0; v <= top + step / 2; v += step) out.push(+v.toFixed(10));
    return [out, top];
  }

  function frame(container, height, margin) {
    container.replaceChildren();
    const svg = el("svg", { viewBox: `0 0 ${W} ${height}`, class: "chart-svg", preserveAspectRatio: "xMidYMid meet" }, container);
    const plot = { x0: margin.left, x1: W - margin.right, y0: height - margin.bottom, y1: margin.top };
    return { svg, plot };
  }

  function yAxis(svg, plot, y, values, fmt, title) {
    const g = el("g", { class: "axis y-axis" }, svg);
    for (const v of values) {
      el("line", { x1: plot.x0, x2: plot.x1, y1: y(v), y2: y(v), class: "grid" }, g);
      label(g, plot.x0 - 8, y(v) + 4, fmt(v), "tick", "end");
    }
    const t = label(g, 0, 0, title, "axis-title");
    t.setAttribute("transform", `translate(16 ${(plot.y0 + plot.y1) / 2}) rotate(-90)`);
  }

  // groups: [{label, bars: [{series, value, text, title, parts?: [{series, value, title}]}]}]
  function bars(container, groups, opts) {
    const { svg, plot } = frame(container, 300, { top: 18, right: 16, bottom: 40, left: 64 });
    const [yt, top] = ticks(opts.yMax, 5);
    const y = scale(0, top, plot.y0, plot.y1);
    yAxis(svg, plot, y, yt, (v) => v.toFixed(1), opts.yTitle);
    const groupWidth = (plot.x1 - plot.x0) / groups.length;
    const barWidth = Math.min(64, (groupWidth * 0.62) / groups[0].bars.length);
    groups.forEach((group, gi) => {
      const cx = plot.x0 + groupWidth * (gi + 0.5);
      const left = cx - (barWidth * group.bars.length) / 2 - 4 * (group.bars.length - 1) / 2;
      group.bars.forEach((bar, bi) => {
        const x = left + bi * (barWidth + 4);
        const g = el("g", { class: `bar bar-${bar.series}`, "data-word": group.label,
                            "data-series": bar.series, "data-value": bar.value }, svg);
        let base = 0;
        for (const part of bar.parts || [{ series: bar.series, value: bar.value, title: bar.title }]) {
          const rect = el("rect", { x, width: barWidth, y: y(base + part.value), height: y(base) - y(base + part.value),
                                    class: `seg seg-${part.series}`, "data-value": part.value }, g);
          tip(rect, part.title || bar.title || String(part.value));
          base += part.value;
        }
        label(g, x + barWidth / 2, y(bar.value) - 6, bar.text, "bar-value");
      });
      label(svg, cx, plot.y0 + 24, group.label, "category");
    });
    el("line", { x1: plot.x0, x2: plot.x1, y1: plot.y0, y2: plot.y0, class: "axis-line" }, svg);
  }

  // series: [{name, cls, values}] over xs; opts: {yMax, baseline, marker: {x, text}, xTitle, yTitle}
  function lines(container, xs, series, opts) {
    const { svg, plot } = frame(container, 320, { top: 26, right: 24, bottom: 46, left: 64 });
    const [yt, top] = ticks(opts.yMax, 5);
    const x = scale(xs[0], xs[xs.length - 1], plot.x0, plot.x1);
    const y = scale(0, top, plot.y0, plot.y1);
    yAxis(svg, plot, y, yt, (v) => `${+v.toFixed(2)}×`, opts.yTitle);
    const xg = el("g", { class: "axis x-axis" }, svg);
    for (const v of xs) {
      el("line", { x1: x(v), x2: x(v), y1: plot.y0, y2: plot.y0 + 5, class: "axis-line" }, xg);
      label(xg, x(v), plot.y0 + 19, String(v), "tick");
    }
    label(xg, (plot.x0 + plot.x1) / 2, plot.y0 + 40, opts.xTitle, "axis-title");
    el("line", { x1: plot.x0, x2: plot.x1, y1: plot.y0, y2: plot.y0, class: "axis-line" }, svg);
    const clipId = `clip-${container.id}`;
    el("rect", { x: plot.x0 - 7, y: plot.y1 - 6, width: plot.x1 - plot.x0 + 14, height: plot.y0 - plot.y1 + 7 },
       el("clipPath", { id: clipId }, el("defs", {}, svg)));
    const area = el("g", { "clip-path": `url(#${clipId})` }, svg);
    if (opts.baseline !== undefined) {
      el("line", { x1: plot.x0, x2: plot.x1, y1: y(opts.baseline), y2: y(opts.baseline), class: "baseline" }, area);
    }
    if (opts.marker) {
      const mx = x(opts.marker.x);
      el("line", { x1: mx, x2: mx, y1: plot.y0, y2: plot.y1 - 4, class: "marker" }, svg);
      label(svg, mx, plot.y1 - 10, opts.marker.text, "marker-label", mx > plot.x1 - 60 ? "end" : "middle");
    }
    for (const s of series) {
      const d = xs.map((v, i) => `${i ? "L" : "M"}${x(v).toFixed(1)},${y(s.values[i]).toFixed(1)}`).join("");
      const g = el("g", { class: `series ${s.cls}`, "data-series": s.cls }, area);
      el("path", { d, class: "line" }, g);
      xs.forEach((v, i) => {
        if (y(s.values[i]) < plot.y1 - 6) return; // off the top of the chart
        const dot = el("circle", { cx: x(v), cy: y(s.values[i]), r: opts.marker && v === opts.marker.x ? 5.5 : 3.5,
                                   class: "dot", "data-x": v, "data-value": s.values[i] }, g);
        tip(dot, `γ = ${v}: ${s.name} ${s.values[i].toFixed(2)}×`);
      });
    }
  }

  return { bars, lines, ticks };
})();
