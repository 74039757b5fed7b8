// 4. Live: a prompt, and tokens streamed from the server as server-sent events over fetch, so
// that Stop (or closing the tab) closes the connection and the server ends the generation. The
// request is the OpenAI routes' own body (prompt or messages, max_tokens, speculative: {draft,
// gamma}, ...) plus compare, checked and run by the server's engine as theirs are.
"use strict";

const Live = {
  controller: null,
  info: null,

  async init() {
    const { $, bindOutput } = window.App;
    bindOutput($("live-gamma"), $("live-gamma-value"), 0);
    bindOutput($("live-temp"), $("live-temp-value"), 2);
    $("live-gamma-policy").addEventListener("change", () => {
      $("live-gamma-label").hidden = $("live-gamma-policy").value !== "fixed";
    });
    $("live-form").addEventListener("submit", (e) => { e.preventDefault(); this.start(); });
    $("live-stop").addEventListener("click", () => this.stop("stopped"));
    $("live-compare").addEventListener("change", () => { $("panel-plain").hidden = !$("live-compare").checked; });
    try {
      this.info = await window.App.api("/api/info");
    } catch (err) {
      $("live-status").textContent = err.message;
      return;
    }
    const live = this.info.live;
    $("live-pair").textContent = live.toy ? `the toy pair (words: ${this.info.toy.words.join(" ")})` : live.label;
    if (!$("live-prompt").value) {  // unless the reader typed already
      $("live-prompt").value = live.toy ? "the cat sat on the mat. the dog"
        : "Write a Python function that checks whether a number is prime.";
    }
    if (live.toy) $("live-chat-label").hidden = true;
    else { $("live-temp").value = 0; $("live-temp").dispatchEvent(new Event("input")); $("live-max").value = 128; }
  },

  settings() {
    const { $ } = window.App;
    const prompt = $("live-prompt").value;
    const gamma = $("live-gamma-policy").value === "fixed" ? Number($("live-gamma").value)
      : $("live-gamma-policy").value;
    const body = {
      speculative: { draft: $("live-draft").value.trim() || "model", gamma },
      temperature: Number($("live-temp").value),
      max_tokens: Number($("live-max").value),
      compare: $("live-compare").checked,
    };
    if ($("live-chat").checked && !this.info.live.toy) body.messages = [{ role: "user", content: prompt }];
    else body.prompt = prompt;
    return body;
  },

  clearPanel(mode) {
    const panel = document.getElementById(`panel-${mode}`);
    document.getElementById(`out-${mode}`).replaceChildren();
    for (const dd of panel.querySelectorAll("dd")) dd.textContent = dd.dataset.stat === "tokens" ? "0" : "–";
    panel.classList.remove("done");
  },

  showStats(mode, s) {
    const { fmt } = window.App;
    const panel = document.getElementById(`panel-${mode}`);
    const text = { alpha: fmt(s.alpha, 2), tokens_per_call: fmt(s.tokens_per_call, 2),
                   tokens_per_second: fmt(s.tokens_per_second, 1), tokens: String(s.tokens),
                   mean_gamma: fmt(s.mean_gamma, 2) };
    for (const dd of panel.querySelectorAll("dd")) dd.textContent = text[dd.dataset.stat];
  },

  showPrompt(mode, body) {
    if (body.messages) return; // a chat turn: the template is not shown
    const span = document.createElement("span");
    span.className = "prompt";
    span.textContent = body.prompt.trimEnd();
    document.getElementById(`out-${mode}`).appendChild(span);
  },

  addPieces(mode, pieces) {
    const out = document.getElementById(`out-${mode}`);
    for (const piece of pieces) {
      // Leading white space stays outside the coloured span, so only the token itself is marked.
      let text = piece.text;
      const lead = text.match(/^\s*/)[0];
      const first = !out.querySelector(".tok-live");
      const space = first && out.firstChild && !lead && !/^[.,;:!?]/.test(text) ? " " : lead;
      if (space) out.appendChild(document.createTextNode(space));
      text = text.slice(lead.length);
      if (!text) continue;
      const span = document.createElement("span");
      span.className = `tok-live ${mode === "plain" ? "plain" : piece.kind}`;
      span.textContent = text;
      out.appendChild(span);
    }
    out.scrollTop = out.scrollHeight;
  },

  async start() {
    const { $ } = window.App;
    this.stop(null);
    const body = this.settings();
    this.clearPanel("speculative");
    this.clearPanel("plain");
    $("panel-plain").hidden = !body.compare;
    this.showPrompt("speculative", body);
    if (body.compare) this.showPrompt("plain", body);
    $("live-note").hidden = !(body.compare && this.info.live.toy);
    $("live-note").textContent = "The toy models cost next to nothing to run, so these tokens/s measure the " +
      "loop's overhead, not the models; the comparison means something with real models, where each accepted " +
      "draft saves a target run.";
    $("live-status").textContent = "starting …";
    $("live-go").disabled = true;
    $("live-stop").disabled = false;
    const controller = new AbortController();
    this.controller = controller;
    this.results = {};
    try {
      const response = await window.App.fetch("/api/live", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body), signal: controller.signal,
      });
      if (!response.ok) {
        const data = await response.json().catch(() => ({}));
        throw new Error(data.error || `${response.status} ${response.statusText}`);
      }
      await this.read(response.body.getReader());
    } catch (err) {
      if (err.name !== "AbortError") $("live-status").textContent = err.message;
    } finally {
      if (this.controller === controller) {
        this.controller = null;
        $("live-go").disabled = false;
        $("live-stop").disabled = true;
      }
    }
  },

  async read(reader) {
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let event = "message", data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event: ")) event = line.slice(7);
          else if (line.startsWith("data: ")) data += line.slice(6);
        }
        this.on(event, data ? JSON.parse(data) : {});
      }
    }
  },

  on(event, data) {
    const { $ } = window.App;
    const status = $("live-status");
    if (event === "status") status.textContent = data.message;
    else if (event === "start") {
      status.textContent = data.mode === "plain"
        ? "plain decoding the same prompt with the target alone (after the speculative run, so the two never share the CPU) …"
        : `generating: drafter ${data.draft}, γ = ${data.gamma}, prompt of ${data.prompt_tokens} tokens …`;
    } else if (event === "round") {
      this.addPieces(data.mode, data.pieces);
      this.showStats(data.mode, data);
    } else if (event === "done") {
      this.showStats(data.mode, data);
      this.results[data.mode] = data;
      document.getElementById(`panel-${data.mode}`).classList.add("done");
    } else if (event === "end") {
      const spec = this.results.speculative, plain = this.results.plain;
      status.textContent = spec && plain && plain.tokens_per_second
        ? `done: speculative ${(spec.tokens_per_second / plain.tokens_per_second).toFixed(2)}× the tokens/s of plain decoding`
        : `done: ${spec ? spec.tokens : 0} tokens in ${spec ? spec.target_calls : 0} target calls`;
    } else if (event === "error") status.textContent = `error: ${data.message}`;
  },

  stop(message) {
    if (this.controller) this.controller.abort();
    this.controller = null;
    if (message) window.App.$("live-status").textContent = message;
    window.App.$("live-go").disabled = false;
    window.App.$("live-stop").disabled = true;
  },
};

document.addEventListener("DOMContentLoaded", () => Live.init());
