"""The viewer page's stylesheet and script, inlined into every page (no server, no network).

The script builds the page from the embedded JSON with DOM calls and ``textContent`` only: episode
text (model output, tool output) is never parsed as HTML, so it cannot add elements or run code. The
page's Content-Security-Policy admits exactly this script and this stylesheet (by hash) and no
network at all, a second wall behind the first.
"""

from __future__ import annotations

CSS = r"""
:root { --fg:#1f2328; --muted:#656d76; --line:#d0d7de; --bg:#ffffff; --panel:#f6f8fa;
  --ok:#1a7f37; --warn:#9a6700; --bad:#cf222e; --grey:#6e7781; --train:#d3f5dc; --ctx:#eef1f4; --env:#e3ecfa; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
  color: var(--fg); background: var(--bg); }
header { padding: 14px 20px 10px; border-bottom: 1px solid var(--line); background: var(--panel); }
h1 { font-size: 18px; margin: 0 0 4px; }
h2 { font-size: 15px; margin: 0 0 8px; }
main { padding: 12px 20px 40px; }
.muted { color: var(--muted); }
.note { color: var(--warn); }
section.panel, details.panel { border: 1px solid var(--line); border-radius: 6px; padding: 10px 12px; margin: 0 0 12px;
  background: var(--bg); }
#filters label { margin-right: 12px; white-space: nowrap; }
#filters .row { margin: 4px 0; }
#filters input[type=number] { width: 6em; }
#filters input[type=search] { width: 16em; }
#visible-count { font-weight: 600; }
.badge { display: inline-block; padding: 0 7px; border-radius: 10px; font-size: 12px; font-weight: 600;
  color: #fff; background: var(--grey); }
.term-completed { background: var(--ok); }
.term-max_turns, .term-max_tokens, .term-timeout { background: var(--warn); }
.term-tool_error { background: var(--bad); }
.term-infra_error { background: #82071e; }
.term-context_overflow { background: var(--grey); }
details.episode { border: 1px solid var(--line); border-radius: 6px; margin: 0 0 6px; background: var(--bg); }
details.episode > summary { cursor: pointer; padding: 6px 10px; list-style-position: inside; }
details.episode > summary > span { margin-right: 10px; }
details.episode[open] > summary { border-bottom: 1px solid var(--line); background: var(--panel); }
.ep-id { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; }
.reward { font-weight: 600; }
.flag-masked { color: var(--bad); font-weight: 600; }
.flag-errors { color: var(--bad); }
.episode-body { padding: 8px 12px; }
.facts-row { display: flex; gap: 12px; align-items: flex-start; flex-wrap: wrap; margin: 0 0 8px; }
table.facts { border-collapse: collapse; font-size: 13px; }
button.prompt-toggle { font-size: 12px; margin: 0 0 4px; display: block; }
table.facts td, table.facts th { border: 1px solid var(--line); padding: 2px 8px; text-align: left;
  vertical-align: top; }
table.facts th { background: var(--panel); font-weight: 600; }
.detail { white-space: pre-wrap; word-break: break-word; }
.item { border-left: 4px solid var(--line); margin: 6px 0; padding: 2px 8px; background: var(--panel);
  border-radius: 0 4px 4px 0; }
.item-head { font-size: 12px; font-weight: 600; color: var(--muted); }
.item-text { margin: 2px 0; white-space: pre-wrap; word-break: break-word;
  font: 13px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace; }
.role-user { border-left-color: #8250df; }
.role-assistant { border-left-color: var(--ok); background: #f3fbf5; }
.kind-tool_call { border-left-color: #0969da; background: #f1f7ff; }
.role-tool { border-left-color: #57606a; }
.status-error { border-left-color: var(--bad); background: #fff1f0; }
.status-error .item-head { color: var(--bad); }
.kind-reasoning { border-left-color: #bf8700; background: #fffbe6; }
.clip-note { font-size: 12px; color: var(--warn); }
details.tokens-box, details.meta-box { margin: 8px 0; }
details.tokens-box > summary, details.meta-box > summary { cursor: pointer; font-weight: 600; }
.legend span { margin-right: 10px; }
.tokens { white-space: pre-wrap; word-break: break-all; font: 13px/1.7 ui-monospace, SFMono-Regular, Menlo, monospace;
  border: 1px solid var(--line); padding: 6px; border-radius: 4px; max-height: 480px; overflow: auto; }
.tok { border-radius: 2px; }
.tok.m1 { background: var(--train); }
.tok.m0.seg-prompt { background: var(--ctx); color: #57606a; }
.tok.m0.seg-env { background: var(--env); color: #57606a; }
.tok.m0.seg-model { background: #ffe8d6; text-decoration: line-through; }
.tok.lowp { box-shadow: inset 0 -2px 0 var(--bad); }
.tok.empty { padding-left: 2px; }
.tok:hover { outline: 1px solid #0969da; }
.swatch { display: inline-block; width: 1em; height: 1em; vertical-align: -2px; border-radius: 2px; margin-right: 3px; }
#compare-view { display: grid; grid-template-columns: 1fr 1fr; gap: 10px; }
.compare-col { border: 1px solid var(--line); border-radius: 6px; min-width: 0; }
.compare-col > .col-head { padding: 6px 10px; background: var(--panel); border-bottom: 1px solid var(--line); }
.compare-col > .col-head > span { margin-right: 8px; }
#compare select { max-width: 28em; }
#compare > summary { cursor: pointer; }
#compare > summary > h2 { display: inline; }
#compare[open] > summary { margin-bottom: 8px; }
pre.meta { white-space: pre-wrap; word-break: break-word; font-size: 12px; }
.n-traj { color: #8250df; font-weight: 600; }
.trajs-box { margin: 8px 0; }
table.trajs { border-collapse: collapse; font-size: 13px; margin: 4px 0; }
table.trajs td, table.trajs th { border: 1px solid var(--line); padding: 2px 8px; text-align: left;
  vertical-align: top; }
table.trajs th { background: var(--panel); font-weight: 600; }
table.trajs td.num { text-align: right; }
table.trajs tr.selected td { background: #f3f0ff; }
table.trajs tr.untrained td { color: var(--muted); }
button.traj-tab { font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; }
.traj-view { border: 1px solid #c8b6f5; border-radius: 6px; padding: 6px 10px; margin: 6px 0; }
.traj-head { font-weight: 600; margin: 0 0 4px; }
.history-note { font-size: 12px; color: var(--muted); border-top: 1px dashed var(--line); margin: 8px 0 4px;
  padding-top: 2px; }
"""

JS = r"""
"use strict";
(() => {
  const data = JSON.parse(document.getElementById("episode-data").textContent);
  const episodes = data.episodes;
  const LOW_LOGPROB = Math.log(0.1);

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function token(value) {  // a safe CSS class fragment from data
    return String(value).replace(/[^A-Za-z0-9_-]/g, "_").slice(0, 40);
  }
  function num(x, digits) {
    if (x === null || x === undefined) return "n/a";
    return Number.isInteger(x) ? String(x) : x.toFixed(digits === undefined ? 3 : digits);
  }
  function badge(term) { return el("span", "badge term-" + token(term), term); }

  // ---- overview -------------------------------------------------------------------------------
  function overview() {
    const box = document.getElementById("overview");
    box.append(el("div", "", "source: " + data.source));
    const counts = Object.entries(data.terminations).map(([k, v]) => k + " " + v).join(", ");
    box.append(el("div", "", data.total + " episodes in the file (" + counts + ")"));
    if (data.embedded < data.total) {
      box.append(el("div", "note", "only the first " + data.embedded + " episodes are embedded (--max-episodes " +
        data.caps.episodes + "; --skip N shows later ones)"));
    }
    if (data.replaced) {
      box.append(el("div", "muted", data.replaced + " older records superseded by re-runs of the same episode"));
    }
    box.append(el("div", data.tokenizer.ok ? "muted" : "note", "tokenizer: " + data.tokenizer.status));
    const several = episodes.some(ep => ep.n_traj > 1);
    box.append(el("div", "muted", "caps per " + (several ? "trajectory" : "episode") + ": " + data.caps.tokens +
      " tokens (prompt tail " + data.caps.prompt_tokens + "), " + data.caps.chars + " characters per message block; " +
      (several ? "conversation and tokens of " + data.caps.trajectories + " trajectories per episode; " : "") +
      "cuts are marked where they happen"));
    if (data.skipped.length) {
      const details = el("details", "note skipped");
      const lines = data.skipped_total === 1 ? " line" : " lines";
      details.append(el("summary", "", data.skipped_total + lines + " of the file could not be shown"));
      for (const [line, reason] of data.skipped) details.append(el("div", "", "line " + line + ": " + reason));
      box.append(details);
    }
  }

  // ---- one episode ---------------------------------------------------------------------------
  function factsTable(ep) {
    const table = el("table", "facts");
    const rows = [
      ["termination", ep.term + (ep.detail ? ": " + ep.detail : "")],
      ["reward", num(ep.reward, 4) + (ep.masked ? " (masked: not trained on)" : "") +
        (ep.correct === null ? "" : ep.correct ? ", correct" : ", not correct")],
    ];
    const metrics = Object.entries(ep.reward_metrics);
    if (metrics.length) rows.push(["reward metrics", metrics.map(([k, v]) => k + " " + num(v, 4)).join(", ")]);
    const several = ep.n_traj > 1;
    rows.push(["model calls", ep.calls.map(c => "#" + c[0] + " " + c[2] + " tokens, " + c[1] +
      (several ? " (trajectory " + c[3] + ")" : "")).join("; ") || "none"]);
    if (several) {
      const why = new Map();
      for (const t of ep.trajs) why.set(t.opened_by, (why.get(t.opened_by) || 0) + 1);
      rows.push(["trajectories", ep.n_traj + " (" + Array.from(why, ([k, v]) => k + " " + v).join(", ") + "), " +
        ep.rerendered + " prompt tokens rendered again"]);
      rows.push(["tokens", ep.prompt_tokens + " prompt, " + ep.response_tokens + " response (all trajectories)"]);
    } else {
      rows.push(["tokens", ep.tok.prompt_total + " prompt, " + ep.tok.resp_total + " response"]);
    }
    rows.push(["tool calls", ep.tool_calls + (ep.tool_errors ? " (" + ep.tool_errors + " errors)" : "") +
      (ep.parse_errors ? ", " + ep.parse_errors + " unparseable" : "") +
      (ep.unknown_tools ? ", " + ep.unknown_tools + " to unknown tools" : "")]);
    if (ep.batch_cut) rows.push(["batch", "cut by the trainer's length limits (masked)"]);
    rows.push(["wall time", num(ep.wall_s, 2) + " s"]);
    for (const [name, value] of rows) {
      const tr = el("tr");
      tr.append(el("th", "", name), el("td", "detail", value));
      table.append(tr);
    }
    const row = el("div", "facts-row");
    row.append(table);
    if (ep.tools.length) {
      const tools = el("table", "facts tools");
      const head = el("tr");
      for (const h of ["tool", "calls", "errors", "timeouts", "truncated"]) head.append(el("th", "", h));
      tools.append(head);
      for (const cells of ep.tools) {
        const tr = el("tr");
        for (const cell of cells) tr.append(el("td", "", cell));
        tools.append(tr);
      }
      row.append(tools);
    }
    return row;
  }

  function itemLabel(item) {
    if (item.kind === "tool_call") return "tool call → " + item.name;
    if (item.kind === "tool_result") return "tool result ← " + (item.name || "?") + " (" + (item.status || "?") + ")";
    if (item.kind === "reasoning") return item.role + " reasoning";
    return item.role + (item.kind === "other" ? " (other content)" : "");
  }

  function conversation(view) {  // an episode of one trajectory, or one trajectory's view
    const box = el("div", "conversation");
    const first = view.first_message === undefined ? -1 : view.first_message;
    let noted = false;
    for (const item of view.items) {
      if (first > 0 && !noted && item.message >= first) {
        noted = true;
        if (box.childElementCount) {
          box.append(el("div", "history-note", "↑ the history its first call was given (its prompt renders it) · " +
            "↓ from its first call on"));
        }
      }
      const div = el("div", "item role-" + token(item.role) + " kind-" + token(item.kind) +
        (item.status ? " status-" + token(item.status) : ""));
      div.append(el("div", "item-head", itemLabel(item) + (item.call === null ? "" : " · call " + item.call)));
      div.append(el("pre", "item-text", item.text));
      if (item.clipped) div.append(el("div", "clip-note", "… " + item.clipped + " more characters not shown"));
      box.append(div);
    }
    if (!view.items.length) box.append(el("div", "muted", "no messages recorded"));
    if (view.items_left_out) box.append(el("div", "clip-note", view.items_left_out + " more messages not shown"));
    return box;
  }

  function tokenTitle(unmasked, t, i, kind, call) {
    const piece = t.pieces ? t.pieces[i] : null;
    let title = "token " + t.ids[i] + (piece === null ? "" : " " + JSON.stringify(piece));
    title += "\n" + kind + (kind === "prompt" ? "" : ", call " + call);
    title += "\nloss mask " + t.mask[i] + (kind === "model" && unmasked ? " (" + unmasked + ")" : "");
    const lp = t.lp[i];
    if (lp !== null) title += "\nlogprob " + lp.toFixed(4) + " (p " + Math.exp(lp).toFixed(3) + ")";
    else if (kind === "model") title += "\nno logprob recorded";
    if (piece === "") title += "\npart of a character completed by a later token";
    return title;
  }

  function tokens(t, unmasked) {  // unmasked: why model tokens carry no loss here ("" when they do)
    const box = el("div");
    if (t.note) box.append(el("div", "note", t.note));
    if (!t.ids.length) return box;
    const legend = el("div", "legend muted");
    for (const [cls, label] of [["m1", "trained on (loss mask 1)"], ["m0 seg-prompt", "prompt"],
                                ["m0 seg-env", "tool results / template (mask 0)"], ["lowp", "p < 0.1"]]) {
      const item = el("span");
      item.append(el("span", "swatch tok " + cls, " "), document.createTextNode(label));
      legend.append(item);
    }
    box.append(legend);
    const area = el("div", "tokens");
    const prompt = el("span", "prompt-tokens");
    prompt.hidden = true;
    const showLabel = "show the prompt (" + (t.prompt_shown < t.prompt_total ? "its last " + t.prompt_shown + " of " +
      t.prompt_total : t.prompt_total) + " tokens)";
    const toggle = el("button", "prompt-toggle", showLabel);
    toggle.type = "button";
    toggle.addEventListener("click", () => {
      prompt.hidden = !prompt.hidden;
      toggle.textContent = prompt.hidden ? showLabel : "hide the prompt";
    });
    if (t.prompt_shown) area.append(toggle, prompt);
    if (t.prompt_shown < t.prompt_total) {
      const earlier = t.prompt_total - t.prompt_shown;
      prompt.append(el("span", "clip-note", "[" + earlier + " earlier prompt tokens not shown]\n"));
    }
    for (const [kind, call, start, length] of t.segs) {
      const parent = kind === "prompt" ? prompt : area;
      for (let i = start; i < start + length; i++) {
        const span = el("span", "tok m" + (t.mask[i] === "1" ? "1" : "0") + " seg-" + token(kind));
        const piece = t.pieces ? t.pieces[i] : null;
        span.textContent = piece === null ? "[" + t.ids[i] + "]" : piece;
        if (piece === "") span.classList.add("empty");
        if (t.lp[i] !== null && t.lp[i] < LOW_LOGPROB) span.classList.add("lowp");
        span.title = tokenTitle(unmasked, t, i, kind, call);
        parent.append(span);
      }
    }
    if (t.resp_shown < t.resp_total) {
      area.append(el("span", "clip-note", "\n[" + (t.resp_total - t.resp_shown) + " later response tokens not shown]"));
    }
    box.append(area);
    return box;
  }

  function lazy(className, label, build) {
    const details = el("details", className);
    details.append(el("summary", "", label));
    details.addEventListener("toggle", () => {
      if (details.open && !details.dataset.rendered) {
        details.dataset.rendered = "1";
        details.append(build());
      }
    });
    return details;
  }

  function tokensBox(t, trained, unmasked) {
    const total = t.prompt_total + t.resp_total;
    return lazy("tokens-box", "Tokens: " + t.ids.length + " shown of " + total + ", " + trained +
      " trained on (hover a token for its id, loss mask and logprob)", () => tokens(t, unmasked));
  }

  function trajectoryView(ep, tr) {
    const box = el("div", "traj-view");
    box.dataset.index = String(tr.index);
    box.append(el("div", "traj-head", "trajectory " + tr.index + " · agent " + tr.agent + " · opened by " +
      tr.opened_by + (tr.detail ? ": " + tr.detail : "") + " · reward " + num(tr.reward, 4) +
      (tr.trained ? "" : " · not trained (a call without an agent with train_aux_calls off, calls sampled " +
        "otherwise than the policy, or replies the agent discarded)")));
    if (!tr.view) {
      box.append(el("div", "clip-note", "its conversation and tokens are not embedded (" + data.caps.trajectories +
        " trajectories per episode: the first and the last ones; agentboost view --max-trajectories N)"));
      return box;
    }
    box.append(conversation(tr.view));
    const unmasked = ep.masked ? "episode masked: " + ep.term : tr.trained ? "" : "trajectory not trained";
    box.append(tokensBox(tr.view.tok, tr.loss, unmasked));
    return box;
  }

  function trajectories(ep) {
    const box = el("div", "trajs-box");
    box.append(el("h2", "", "Trajectories (" + ep.n_traj + ")"));
    const table = el("table", "trajs");
    const head = el("tr");
    for (const h of ["trajectory", "agent", "opened by", "calls", "prompt tokens", "response tokens", "model tokens",
                     "re-rendered", "trained", "reward"]) head.append(el("th", "", h));
    table.append(head);
    const panel = el("div", "traj-panel");
    const rows = [];
    function select(k) {
      rows.forEach((row, j) => {
        row.classList.toggle("selected", j === k);
        row.querySelector("button").setAttribute("aria-pressed", j === k ? "true" : "false");
      });
      panel.replaceChildren(trajectoryView(ep, ep.trajs[k]));
    }
    ep.trajs.forEach((tr, k) => {
      const row = el("tr", tr.trained ? "" : "untrained");
      row.dataset.index = String(tr.index);
      const cell = el("td");
      const button = el("button", "traj-tab", "#" + tr.index);
      button.type = "button";
      button.addEventListener("click", () => select(k));
      cell.append(button);
      const more = tr.n_calls > tr.calls.length ? " … (" + tr.n_calls + " calls)" : "";
      const calls = tr.calls.map(c => "#" + c).join(" ") + more;
      const opened = el("td", "", tr.opened_by);
      if (tr.detail) opened.title = tr.detail;
      row.append(cell, el("td", "", tr.agent), opened, el("td", "", calls));
      for (const n of [tr.prompt, tr.response, tr.model, tr.rerendered]) row.append(el("td", "num", n));
      row.append(el("td", "", tr.trained ? "yes" : "no"), el("td", "num", num(tr.reward, 4)));
      rows.push(row);
      table.append(row);
    });
    box.append(table);
    if (ep.trajs.length < ep.n_traj) {
      box.append(el("div", "clip-note", (ep.n_traj - ep.trajs.length) + " more trajectories not listed"));
    }
    box.append(panel);
    if (ep.trajs.length) select(0);
    return box;
  }

  function episodeBody(ep) {
    const body = el("div", "episode-body");
    body.append(factsTable(ep));
    if (ep.n_traj > 1) {
      body.append(trajectories(ep));
    } else {
      body.append(conversation(ep));
      body.append(tokensBox(ep.tok, ep.trained, ep.masked ? "episode masked: " + ep.term : ""));
    }
    body.append(lazy("meta-box", "Metadata", () => el("pre", "meta", ep.meta)));
    return body;
  }

  function summaryLine(ep, parent) {
    parent.append(badge(ep.term));
    parent.append(el("span", "reward", "reward " + num(ep.reward)));
    parent.append(el("span", "ep-id", ep.id));
    if (ep.task !== null) parent.append(el("span", "muted", "task " + ep.task));
    parent.append(el("span", "muted", ep.turns + " calls, " + ep.tool_calls + " tool calls"));
    if (ep.n_traj > 1) parent.append(el("span", "n-traj", ep.n_traj + " trajectories"));
    if (ep.tool_errors) parent.append(el("span", "flag-errors", ep.tool_errors + " tool errors"));
    if (ep.masked) parent.append(el("span", "flag-masked", "masked"));
  }

  // ---- list + filters -------------------------------------------------------------------------
  const cards = [];
  function list() {
    const box = document.getElementById("episodes");
    for (const ep of episodes) {
      const details = el("details", "episode");
      details.dataset.id = ep.id;
      details.dataset.termination = ep.term;
      const summary = el("summary");
      summaryLine(ep, summary);
      details.append(summary);
      details.addEventListener("toggle", () => {
        if (details.open && !details.dataset.rendered) {
          details.dataset.rendered = "1";
          details.append(episodeBody(ep));
        }
      });
      cards.push([ep, details]);
      box.append(details);
    }
    if (!episodes.length) box.append(el("div", "muted", "no episodes to show"));
  }

  function filters() {
    const terms = document.getElementById("term-filters");
    const present = data.all_terminations.filter(t => data.terminations[t]);
    for (const term of present) {
      const label = el("label");
      const box = el("input", "term-filter");
      box.type = "checkbox";
      box.checked = true;
      box.value = term;
      box.addEventListener("change", apply);
      label.append(box, document.createTextNode(" "), badge(term));
      label.append(document.createTextNode(" " + data.terminations[term]));
      terms.append(label);
    }
    for (const id of ["reward-min", "reward-max", "search"]) {
      for (const event of ["input", "change"]) document.getElementById(id).addEventListener(event, apply);
    }
    document.getElementById("tool-errors-only").addEventListener("change", apply);
    document.getElementById("masked-hide").addEventListener("change", apply);
    const several = document.getElementById("several-only");
    several.parentElement.hidden = !episodes.some(ep => ep.n_traj > 1);
    several.addEventListener("change", apply);
    apply();
  }

  function bound(id) {
    const text = document.getElementById(id).value.trim();
    const value = Number(text);
    return text === "" || Number.isNaN(value) ? null : value;
  }

  function apply() {
    const allowed = new Set(Array.from(document.querySelectorAll(".term-filter:checked"), b => b.value));
    const lo = bound("reward-min"), hi = bound("reward-max");
    const errorsOnly = document.getElementById("tool-errors-only").checked;
    const hideMasked = document.getElementById("masked-hide").checked;
    const severalOnly = document.getElementById("several-only").checked;
    const needle = document.getElementById("search").value.trim().toLowerCase();
    let shown = 0;
    for (const [ep, card] of cards) {
      let ok = allowed.has(ep.term);
      if (ok && lo !== null) ok = ep.reward !== null && ep.reward >= lo;
      if (ok && hi !== null) ok = ep.reward !== null && ep.reward <= hi;
      if (ok && errorsOnly) ok = ep.tool_errors + ep.parse_errors + ep.unknown_tools > 0;
      if (ok && hideMasked) ok = !ep.masked;
      if (ok && severalOnly) ok = ep.n_traj > 1;
      if (ok && needle) ok = (ep.id + " " + (ep.task || "")).toLowerCase().includes(needle);
      card.hidden = !ok;
      shown += ok ? 1 : 0;
    }
    document.getElementById("visible-count").textContent = shown + " of " + episodes.length + " episodes shown";
  }

  // ---- side by side ---------------------------------------------------------------------------
  function compare() {
    const groups = new Map();
    for (const ep of episodes) {
      if (ep.task === null) continue;
      if (!groups.has(ep.task)) groups.set(ep.task, []);
      groups.get(ep.task).push(ep);
    }
    const tasks = Array.from(groups.entries()).filter(([, eps]) => eps.length > 1);
    const taskSelect = document.getElementById("compare-task");
    const selects = [document.getElementById("compare-a"), document.getElementById("compare-b")];
    const view = document.getElementById("compare-view");
    if (!tasks.length) {
      document.getElementById("compare-controls").hidden = true;
      view.append(el("div", "muted", "no task has two samples among the embedded episodes"));
      return;
    }
    tasks.forEach(([task, eps], i) => {
      const option = el("option", "", task + " (" + eps.length + " samples, rewards " +
        eps.map(e => num(e.reward, 2)).join(" ") + ")");
      option.value = String(i);
      taskSelect.append(option);
    });
    function fillSamples() {
      const eps = tasks[Number(taskSelect.value)][1];
      selects.forEach((select, k) => {
        select.replaceChildren();
        eps.forEach((ep, i) => {
          const option = el("option", "", ep.id + " · " + ep.term + " · reward " + num(ep.reward, 2));
          option.value = String(i);
          select.append(option);
        });
        select.value = String(Math.min(k, eps.length - 1));
      });
      if (eps.length > 1) {  // show the most different pair: the best against the worst
        const order = eps.map((e, i) => [e.reward === null ? -Infinity : e.reward, i]).sort((a, b) => b[0] - a[0]);
        if (order[0][0] !== order[order.length - 1][0]) {
          selects[0].value = String(order[0][1]);
          selects[1].value = String(order[order.length - 1][1]);
        }
      }
      show();
    }
    function show() {
      const eps = tasks[Number(taskSelect.value)][1];
      view.replaceChildren();
      for (const select of selects) {
        const ep = eps[Number(select.value)];
        const col = el("div", "compare-col");
        col.dataset.id = ep.id;
        const head = el("div", "col-head");
        summaryLine(ep, head);
        col.append(head, episodeBody(ep));
        view.append(col);
      }
    }
    const best = tasks.findIndex(([, eps]) => new Set(eps.map(e => e.reward)).size > 1);
    taskSelect.value = String(best < 0 ? 0 : best);
    taskSelect.addEventListener("change", fillSamples);
    for (const select of selects) select.addEventListener("change", show);
    fillSamples();
  }

  overview();
  list();
  filters();
  compare();
  document.body.dataset.ready = "1";
})();
"""
