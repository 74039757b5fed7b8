// The first three figures: a toy round, 10,000 draws, choosing γ. The engine does the work on
// the server; this file only asks the JSON API and draws what it answers.
"use strict";

const $ = (id) => document.getElementById(id);

// A server started with --api-key answers 401 without "Authorization: Bearer KEY": the page asks
// for the key once (one prompt however many requests were refused), keeps it for this tab in
// sessionStorage, and sends it with every request.
const KEY_ITEM = "specdec-api-key";
const Key = {
  declined: false,
  get() {
    try { return sessionStorage.getItem(KEY_ITEM); } catch (e) { return this.memory || null; }
  },
  set(key) {
    this.memory = key;
    try { sessionStorage.setItem(KEY_ITEM, key); } catch (e) { /* storage off: kept in memory */ }
  },
  ask(refused) {
    if (this.declined) return null;
    const key = window.prompt(refused ? "That API key was refused. This server's API key:"
      : "This server needs its API key (specdec serve/explore --api-key):");
    if (!key) { this.declined = true; return null; }
    this.set(key.trim());
    return this.get();
  },
};

async function authorizedFetch(path, init = {}) {
  const send = (key) => {
    const headers = new Headers(init.headers || {});
    if (key) headers.set("Authorization", `Bearer ${key}`);
    return fetch(path, { ...init, headers });
  };
  const used = Key.get();
  const response = await send(used);
  if (response.status !== 401) return response;
  const now = Key.get();
  const key = now && now !== used ? now : Key.ask(Boolean(used)); // another request may have asked already
  return key ? send(key) : response;
}

async function api(path, body) {
  const init = body === undefined ? {} : {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  };
  const response = await authorizedFetch(path, init);
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    const err = new Error(data.error || `${response.status} ${response.statusText}`);
    err.status = response.status;
    throw err;
  }
  return data;
}

function fmt(value, digits) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}

function chip(word, classes, title) {
  const span = document.createElement("span");
  span.className = `tok ${classes}`;
  span.textContent = word;
  if (title) span.title = title;
  return span;
}

function bindOutput(input, output, digits) {
  const show = () => { output.value = Number(input.value).toFixed(digits); };
  input.addEventListener("input", show);
  show();
}

// --------------------------------------------------------------------------- 1. draft, verify, repeat

const Toy = {
  session: null,
  busy: false,

  async reset() {
    const data = await api("/api/toy/reset", { session: this.session });
    this.session = data.session;
    $("round-line").replaceChildren();
    $("round-caption").textContent = "Press “Run one round”.";
    this.show(data);
  },

  async round() {
    if (this.busy) return;
    this.busy = true;
    $("round-run").disabled = true;
    try {
      const gamma = Number($("round-gamma").value);
      let data;
      try {
        data = await api("/api/toy/round", { session: this.session, gamma });
      } catch (err) {
        if (err.status !== 404) throw err;
        await this.reset(); // the server forgot this session (restart): start again
        data = await api("/api/toy/round", { session: this.session, gamma });
      }
      this.drawRound(data);
      this.show(data, data.n_accepted + 1);
    } catch (err) {
      $("round-caption").textContent = err.message;
    } finally {
      this.busy = false;
      $("round-run").disabled = false;
    }
  },

  drawRound(data) {
    const line = $("round-line");
    line.replaceChildren();
    for (const d of data.drafts) {
      const title = `p = ${d.p.toFixed(2)}, q = ${d.q.toFixed(2)}: kept with probability ${d.keep.toFixed(2)}`;
      line.appendChild(chip(d.word, d.status, d.status === "unchecked" ? "not checked: an earlier draft was rejected" : title));
    }
    const next = chip(data.next.word, `target ${data.next.kind}`,
      data.next.kind === "bonus" ? "bonus: every draft was accepted, the target adds one more"
        : "recovered: drawn from norm(max(0, p − q)) in place of the rejected draft");
    const tag = document.createElement("small");
    tag.className = "kind-tag";
    tag.textContent = data.next.kind;
    next.appendChild(tag);
    line.appendChild(next);
    const n = data.drafts.length;
    $("round-caption").textContent = data.next.kind === "bonus"
      ? `Round ${data.target_runs}: all ${n} drafts accepted, plus a bonus token: ${data.n_accepted + 1} tokens from one target run.`
      : `Round ${data.target_runs}: ${data.n_accepted} of ${n} drafts accepted, then the target's recovered token: ${data.n_accepted + 1} token${data.n_accepted ? "s" : ""}.`;
  },

  show(data, fresh) {
    const text = $("toy-text");
    text.replaceChildren();
    const firstNew = data.words.length - (fresh || 0);
    data.words.forEach((word, i) => {
      if (i && word !== ".") text.appendChild(document.createTextNode(" "));
      const span = document.createElement("span");
      span.className = i < data.prompt_length ? "prompt-word" : i >= firstNew ? "word new-word" : "word";
      span.textContent = word;
      text.appendChild(span);
    });
    text.scrollTop = text.scrollHeight;
    $("toy-runs").textContent = data.target_runs;
    $("toy-tokens").textContent = data.tokens;
    $("toy-per-run").textContent = fmt(data.tokens_per_run, 2);
    $("toy-accepted").textContent = data.drafted
      ? `${data.accepted} / ${data.drafted} (${Math.round((100 * data.accepted) / data.drafted)}%)` : "–";
    $("toy-alpha").textContent = fmt(data.alpha, 2);
    $("toy-expected").textContent = fmt(data.expected_tokens, 2);
  },
};

// --------------------------------------------------------------------------- 2. 10,000 draws

const Draws = {
  seed: 0,

  async load() {
    const button = $("draws-again");
    button.disabled = true;
    $("draws-note").textContent = "drawing …";
    try {
      const data = await api(`/api/draws?n=10000&seed=${this.seed}`);
      this.draw(data);
    } catch (err) {
      $("draws-note").textContent = err.message;
    } finally {
      button.disabled = false;
    }
  },

  draw(data) {
    const groups = data.words.map((word, i) => {
      const acc = data.accepted[i] / data.n, rec = data.recovered[i] / data.n;
      return {
        label: word,
        bars: [
          { series: "target", value: data.target[i], text: data.target[i].toFixed(3), title: `p(${word}) = ${data.target[i]}` },
          { series: "observed", value: data.observed[i], text: data.observed[i].toFixed(3), parts: [
            { series: "accepted", value: acc, title: `${word} as an accepted draft: ${data.accepted[i]} of ${data.n}` },
            { series: "recovered", value: rec, title: `${word} as a recovered token: ${data.recovered[i]} of ${data.n}` },
          ] },
        ],
      };
    });
    Charts.bars($("draws-chart"), groups, { yMax: 0.6, yTitle: "probability / frequency" });
    const gap = Math.max(...data.observed.map((o, i) => Math.abs(o - data.target[i])));
    const wobble = Math.sqrt(0.25 / data.n);
    $("draws-note").textContent =
      `${data.n.toLocaleString("en")} draws (seed ${data.seed}): largest gap |observed − p| = ${gap.toFixed(4)}, ` +
      `random wobble about ±${wobble.toFixed(3)}`;
  },
};

// --------------------------------------------------------------------------- 3. choosing γ

const Gamma = {
  pending: null,

  async update() {
    const alpha = Number($("gamma-alpha").value), c = Number($("gamma-c").value);
    const ask = `/api/plan?alpha=${alpha}&c=${c}&max_gamma=16`;
    this.pending = ask;
    try {
      const data = await api(ask);
      if (this.pending !== ask) return; // a newer slider position is on its way
      this.draw(data);
    } catch (err) {
      $("gamma-detail").textContent = err.message;
    }
  },

  draw(data) {
    const xs = data.rows.map((r) => r.gamma);
    const speed = data.rows.map((r) => r.speedup), arith = data.rows.map((r) => r.arithmetic);
    const best = data.rows[data.best_gamma - 1];
    $("best-gamma").textContent = data.best_gamma;
    const faster = best.speedup > 1 + 1e-9
      ? `${best.speedup.toFixed(2)}× faster` : `${best.speedup.toFixed(2)}× the speed: no γ helps unless α > c`;
    $("gamma-detail").textContent = `: ${faster}, ${best.arithmetic.toFixed(2)}× the arithmetic ` +
      `(a free draft could reach at most ${data.speedup_bound.toFixed(2)}×)`;
    const yMax = Math.max(2, Math.max(...speed) * 1.45);
    Charts.lines($("gamma-chart"), xs, [
      { name: "extra arithmetic", cls: "arith", values: arith },
      { name: "speed-up", cls: "speedup", values: speed },
    ], { yMax, baseline: 1, marker: { x: data.best_gamma, text: `best γ = ${data.best_gamma}` },
         xTitle: "γ (drafted tokens per round)", yTitle: "× plain decoding" });
  },
};

// --------------------------------------------------------------------------- start

window.App = { api, fetch: authorizedFetch, fmt, $, bindOutput };

document.addEventListener("DOMContentLoaded", () => {
  bindOutput($("round-gamma"), $("round-gamma-value"), 0);
  bindOutput($("gamma-alpha"), $("gamma-alpha-value"), 2);
  bindOutput($("gamma-c"), $("gamma-c-value"), 2);
  $("round-run").addEventListener("click", () => Toy.round());
  $("round-reset").addEventListener("click", () => Toy.reset().catch((e) => { $("round-caption").textContent = e.message; }));
  $("draws-again").addEventListener("click", () => { Draws.seed += 1; Draws.load(); });
  for (const id of ["gamma-alpha", "gamma-c"]) $(id).addEventListener("input", () => Gamma.update());
  Toy.reset().catch((e) => { $("round-caption").textContent = e.message; });
  Gamma.update();
  Draws.load();
});
