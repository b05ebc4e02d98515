"use strict";
// The run report's page. Everything shown is built with createElement and textContent from the
// embedded JSON: text from tools and the model is never parsed as HTML.
window.addEventListener("error", (event) => {
  document.body.dataset.errors = (document.body.dataset.errors || "") + event.message + ";";
});
const DATA = JSON.parse(document.getElementById("report-data").textContent);
const PAGE = 50;
const COLOURS = ["#1f6fd1", "#d1451f", "#2e9d4a", "#8a3fc4", "#c79a12", "#12a3b5", "#c4407a", "#56606e", "#7a9d12", "#a35b1f"];
const FILTERS = ["change", "set", "server", "tool", "split", "kind"];
const state = { tab: "overview", q: "", page: 0, episode: "", sample: 0, colour: "advantage" };
// (`split` is also the task generation's sample filter)
FILTERS.forEach((name) => { state[name] = ""; });

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  return node;
}
const pct = (x) => (x === null || x === undefined ? "–" : (100 * x).toFixed(1) + "%");
// The run's evaluations in order (payload.py STAGES); `mcp-grpo evaluate --name` adds others.
const STAGES = ["before", "warmup", "after"];
const stageLabel = (s) => ({ warmup: "after warm start", after: "after GRPO" })[s] || s;
const num = (x, d = 3) => (x === null || x === undefined ? "–" : Number(x).toFixed(d));

// -- state in the address (#tab=episodes&change=fixed): shareable, and what tests drive ---------
function readHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  for (const [key, value] of params) if (key in state) state[key] = ["page", "sample"].includes(key) ? Number(value) || 0 : value;
}
function writeHash() {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(state)) if (value !== "" && value !== 0 && !(key === "tab" && value === "overview") && !(key === "colour" && value === "advantage")) params.set(key, value);
  history.replaceState(null, "", "#" + params.toString());
}
function update(patch) {
  Object.assign(state, patch);
  writeHash();
  render();
}

// -- overview ------------------------------------------------------------------------------
function overview() {
  const run = DATA.run, cfg = run.config || {}, summary = run.summary || {};
  const rows = [
    ["run", run.name], ["directory", run.dir],
    ["status", run.finished ? "finished" : "in progress (no summary yet)"],
    ["training steps logged", run.steps],
    ["model", (cfg.model || {}).name_or_path], ["device", cfg.device],
    ["rollout engine", (cfg.rollout || {}).engine], ["estimator", ((cfg.algorithm || {}).advantage || {}).estimator],
    ["wall minutes", summary.wall_minutes !== undefined ? num(summary.wall_minutes, 2) : "–"],
  ];
  const meta = el("table", {}, rows.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v === undefined ? "–" : v))));
  const stages = STAGES.filter((s) => Object.values(DATA.stages).some((row) => s in row));
  const stageTable = el("table", { id: "stages" },
    el("tr", {}, el("th", {}, "held-out group"), stages.map((s) => el("th", {}, stageLabel(s)))),
    Object.entries(DATA.stages).map(([group, row]) => el("tr", {}, el("td", {}, group), stages.map((s) => el("td", { class: "num" }, pct(row[s]))))));
  const toolStages = Object.entries(DATA.tool_stages || {});
  const order = (s) => { const i = STAGES.indexOf(s); return i < 0 ? STAGES.length : i; };
  const played = [...new Set(toolStages.flatMap(([, row]) => Object.keys(row).filter((k) => k !== "tasks")))].sort((a, b) => order(a) - order(b) || a.localeCompare(b));
  const toolTable = el("table", { id: "tool-stages" },
    el("tr", {}, el("th", {}, "tool"), el("th", {}, "tasks"), played.map((s) => el("th", {}, stageLabel(s)))),
    toolStages.map(([tool, row]) => el("tr", {}, el("td", {}, tool), el("td", { class: "num" }, row.tasks), played.map((s) => el("td", { class: "num" }, pct(row[s]))))));
  if (DATA.generation) return [el("h2", {}, "Task generation settings"), el("pre", { class: "config" }, JSON.stringify(run.config, null, 2))];
  return [el("h2", {}, "The run"), meta,
    el("h2", {}, "Held-out success"), Object.keys(DATA.stages).length ? stageTable : el("p", { class: "note" }, "No evaluation has finished yet."),
    ...(toolStages.length ? [el("h2", {}, "Held-out success per tool (the tasks whose gold chain calls it)"), toolTable] : []),
    el("h2", {}, "Config"), el("pre", { class: "config" }, JSON.stringify(run.config, null, 2))];
}

// -- curves --------------------------------------------------------------------------------
function chart(title, series) {
  const width = 340, height = 170, pad = 32;
  const points = Object.values(series).flat();
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  if (x0 === x1) x1 = x0 + 1;
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const sx = (x) => pad + ((x - x0) / (x1 - x0)) * (width - pad - 8);
  const sy = (y) => height - 20 - ((y - y0) / (y1 - y0)) * (height - 30);
  const plot = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
  plot.append(svg("line", { x1: pad, y1: height - 20, x2: width - 8, y2: height - 20, stroke: "#99a" }));
  plot.append(svg("line", { x1: pad, y1: 10, x2: pad, y2: height - 20, stroke: "#99a" }));
  for (const [y, label] of [[y0, y0], [y1, y1]]) {
    const text = svg("text", { x: 2, y: sy(y) + 4, "font-size": 10, fill: "#556" });
    text.textContent = Number(label).toPrecision(3);
    plot.append(text);
  }
  const xlabel = svg("text", { x: width - 60, y: height - 4, "font-size": 10, fill: "#556" });
  xlabel.textContent = `step ${x0}–${x1}`;
  plot.append(xlabel);
  const legend = el("div", { class: "legend" });
  Object.entries(series).forEach(([name, pts], i) => {
    const colour = COLOURS[i % COLOURS.length];
    const line = svg("polyline", { fill: "none", stroke: colour, "stroke-width": 1.5, points: pts.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ") });
    plot.append(line);
    if (pts.length === 1) plot.append(svg("circle", { cx: sx(pts[0][0]), cy: sy(pts[0][1]), r: 3, fill: colour }));
    legend.append(el("span", { style: `--c:${colour}` }, name));
  });
  return el("div", { class: "panel" }, el("h3", {}, title), plot, legend);
}
function curves() {
  const panels = Object.entries(DATA.curves);
  if (!panels.length) return [el("p", { class: "note" }, "No metrics logged yet.")];
  return [el("div", { class: "panels", id: "curves" }, panels.map(([title, series]) => chart(title, series)))];
}

// -- tools ---------------------------------------------------------------------------------
function tools() {
  const rows = DATA.tools.per_tool;
  const kinds = (r) => Object.entries(r.errors_by_kind || {}).map(([k, v]) => `${k} ${v}`).join(", ") || "–";
  const table = el("table", { id: "tool-health" },
    el("tr", {}, ["tool", "calls", "errors", "error rate", "errors by kind", "p50 ms", "p99 ms (worst step)", "server restarts", "breaker openings"].map((h) => el("th", {}, h))),
    rows.map((r) => el("tr", {}, el("td", {}, r.tool), el("td", { class: "num" }, r.calls), el("td", { class: "num" }, r.errors),
      el("td", { class: "num" }, r.calls ? pct(r.errors / r.calls) : "–"), el("td", {}, kinds(r)),
      el("td", { class: "num" }, num(r.p50_ms, 1)), el("td", { class: "num" }, num(r.p99_ms, 1)),
      el("td", { class: "num" }, r.server_restarts ?? 0), el("td", { class: "num" }, r.server_breaker_openings ?? 0))));
  const totals = el("table", {}, Object.entries(DATA.tools.totals).map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", { class: "num" }, v))));
  return [el("h2", {}, "Per tool, over the training steps"), rows.length ? table : el("p", { class: "note" }, "No tool calls logged."),
    el("p", { class: "note" }, "Restarts and breaker openings are its server's: a server restarts, or refuses calls while its circuit breaker is open, for all its tools."),
    el("h2", {}, "Restarts, breaker openings, retries, timeouts, errors by kind"), totals];
}

// -- episodes ------------------------------------------------------------------------------
const slug = (s) => s.replace(/[^a-z]+/g, "-");
function episodeValues(e, name) {
  if (name === "change") return [e.change];
  if (name === "set") return [e.set];
  if (name === "tool") return e.tools;
  return e.groups[name] !== undefined ? [e.groups[name]] : [];
}
function filtered() {
  const q = state.q.toLowerCase();
  return DATA.episodes.filter((e) => FILTERS.every((name) => !state[name] || episodeValues(e, name).includes(state[name]))
    && (!q || e.request.toLowerCase().includes(q) || e.task_id.toLowerCase().includes(q)));
}
function filterBar() {
  const bar = el("div", { class: "filters" });
  for (const name of FILTERS) {
    const values = [...new Set(DATA.episodes.flatMap((e) => episodeValues(e, name)))].sort();
    if (!values.length) continue;
    const select = el("select", { id: `filter-${name}`, onchange: (ev) => update({ [name]: ev.target.value, page: 0 }) },
      el("option", { value: "" }, `any ${name}`), values.map((v) => el("option", { value: v }, v)));
    select.value = state[name];
    bar.append(el("label", {}, name + " ", select));
  }
  const search = el("input", { id: "search", type: "search", placeholder: "search requests", value: state.q });
  search.addEventListener("change", (ev) => update({ q: ev.target.value, page: 0 }));
  bar.append(search);
  return bar;
}
function transcript(stage, label) {
  if (!stage) return el("div", { class: "stage" }, el("h3", {}, label), el("p", { class: "note" }, "not played"));
  return el("div", { class: "stage" }, el("h3", {}, `${label}: ${stage.success ? "right" : "wrong"} (reward ${num(stage.reward, 2)})`),
    stage.messages.map((m) => el("div", { class: `msg ${m.role}` }, el("span", { class: "role" }, m.role + (m.name ? ` · ${m.name}` : "")), m.content)));
}
const STAGE_NAMES = { before: "before", warmup: "after warm start", after: "after" };
function shownStages(episode) {
  // The first and the last evaluation side by side (the warm start's only when it is the last).
  const stages = Object.entries(episode.stages);
  return stages.length > 2 ? [stages[0], stages[stages.length - 1]] : stages;
}
function episodes() {
  const shown = filtered();
  const pages = Math.max(1, Math.ceil(shown.length / PAGE));
  const page = Math.min(state.page, pages - 1);
  const list = el("div", { class: "list", id: "episode-list" },
    el("div", { class: "pager" },
      el("button", { onclick: () => update({ page: Math.max(0, page - 1) }), disabled: page === 0 ? "" : null }, "‹"),
      `${shown.length} of ${DATA.episodes.length} tasks · page ${page + 1}/${pages}`,
      el("button", { onclick: () => update({ page: page + 1 }) }, "›")),
    shown.slice(page * PAGE, (page + 1) * PAGE).map((e) => el("div", {
      class: "item" + (e.task_id === state.episode ? " selected" : ""), "data-task": e.task_id,
      onclick: () => update({ episode: e.task_id }) },
    el("span", { class: `badge ${slug(e.change)}` }, e.change), e.set !== "held-out" ? el("span", { class: "badge" }, e.set) : null,
    e.request)));
  state.page = page; // a page past the end (the filter shrank the list) is the last one
  const chosen = DATA.episodes.find((e) => e.task_id === state.episode) || shown[page * PAGE];
  const detail = chosen ? el("div", {},
    el("p", {}, el("b", {}, chosen.task_id), " · ", Object.entries(chosen.groups).map(([k, v]) => `${k}=${v}`).join(" · ")),
    el("p", {}, chosen.request),
    el("div", { class: "detail", id: "episode-detail" }, shownStages(chosen).map(([name, stage]) => transcript(stage, STAGE_NAMES[name] || name)))) : el("p", { class: "note" }, "No task matches.");
  return [filterBar(), el("div", { class: "episodes" }, list, detail)];
}

// -- tokens --------------------------------------------------------------------------------
function tokenColour(token, mode, scale) {
  const [, mask, adv, behavior, trainer] = token;
  if (mode === "mask") return mask ? "#cfe3ff" : "transparent";
  if (!mask) return "transparent";
  if (mode === "advantage") {
    const a = Math.min(1, Math.abs(adv) / scale);
    return adv >= 0 ? `rgba(46,157,74,${a})` : `rgba(209,69,31,${a})`;
  }
  if (behavior === null || trainer === null) return "transparent";
  const gap = trainer - behavior; // log of the importance weight
  if (mode === "gap") return `rgba(199,154,18,${Math.min(1, Math.abs(gap) / 0.5)})`;
  return gap >= 0 ? `rgba(31,111,209,${Math.min(1, gap / 0.7)})` : `rgba(209,69,31,${Math.min(1, -gap / 0.7)})`;
}
function tokens() {
  if (!DATA.tokens.length) return [el("p", { class: "note" }, "No token samples (logging.token_samples: false, or no training step yet).")];
  const index = Math.min(state.sample, DATA.tokens.length - 1);
  const sample = DATA.tokens[index];
  const pick = el("select", { id: "token-sample", onchange: (ev) => update({ sample: Number(ev.target.value) }) },
    DATA.tokens.map((s, i) => el("option", { value: i }, `step ${s.step} · ${s.task_id} · reward ${num(s.reward, 2)}`)));
  pick.value = String(index);
  const mode = el("select", { id: "token-colour", onchange: (ev) => update({ colour: ev.target.value }) },
    [["advantage", "advantage (green +, red −)"], ["mask", "loss mask (blue: trained)"], ["gap", "|trainer − engine| log-prob"], ["weight", "importance weight (blue > 1, red < 1)"]]
      .map(([v, label]) => el("option", { value: v }, label)));
  mode.value = state.colour;
  const scale = Math.max(1e-6, ...sample.tokens.map((t) => Math.abs(t[2])));
  const view = el("div", { class: "tokens", id: "token-view" });
  sample.tokens.forEach((token, i) => {
    if (sample.cut_at !== null && i === sample.cut_at) view.append(el("span", { class: "cut" }, ` …${sample.cut_tokens} tokens not kept… `));
    const previous = sample.tokens[i - 1];
    const boundary = previous && previous[1] !== token[1] ? (token[1] ? " turn" : " obs") : "";
    const tip = token[1] ? `advantage ${num(token[2])} · engine ${num(token[3])} · trainer ${num(token[4])}` + (token[3] !== null && token[4] !== null ? ` · weight ${num(Math.exp(token[4] - token[3]))}` : "") : "not trained (prompt or tool result)";
    view.append(el("span", { class: "tok" + boundary, style: `background:${tokenColour(token, state.colour, scale)}`, title: tip }, token[0]));
  });
  return [el("div", { class: "filters" }, el("label", {}, "sample ", pick), el("label", {}, "colour by ", mode)),
    el("p", { class: "note" }, `${sample.num_tokens} tokens, ${sample.prompt_length} of them the prompt; a solid bar starts a sampled turn, a dashed one a tool result. Hover a token for its numbers.`),
    view];
}

// -- a task generation (generate-tasks) ------------------------------------------------------
function table(id, head, rows) {
  return el("table", { id }, el("tr", {}, head.map((h) => el("th", {}, h))), rows.map((row) => el("tr", {}, row.map((v) => el("td", typeof v === "number" ? { class: "num" } : {}, v)))));
}
function generation() {
  const g = DATA.generation;
  const q = state.q.toLowerCase();
  const samples = g.samples.filter((s) => (!state.split || s.split === state.split) && (!q || s.request.toLowerCase().includes(q)));
  const splits = [...new Set(g.samples.map((s) => s.split))].sort();
  const pick = el("select", { id: "filter-split", onchange: (ev) => update({ split: ev.target.value }) }, el("option", { value: "" }, "any split"), splits.map((v) => el("option", { value: v }, v)));
  pick.value = state.split;
  const search = el("input", { id: "search", type: "search", placeholder: "search requests", value: state.q });
  search.addEventListener("change", (ev) => update({ q: ev.target.value }));
  return [
    el("h2", {}, "Per server"),
    table("gen-servers", ["server", "family", "templates", "tasks", "multi-call share", "problem"],
      Object.entries(g.servers).map(([name, r]) => [name, r.family, r.templates, r.tasks, pct(r.multi_call_share), r.problem || ""])),
    el("h2", {}, "Tools used"), table("gen-used", ["server", "tool", "tasks", "end-state checks"], g.tools_used.map((t) => [t.server, t.tool, t.tasks, t.checks])),
    el("h2", {}, "Tools left out, and why"), table("gen-left-out", ["server", "tool", "reason"], g.tools_left_out.map((t) => [t.server, t.tool, t.reason])),
    g.servers_without_tasks.length ? el("p", {}, "Servers that contributed no task: " + g.servers_without_tasks.join(", ")) : null,
    Object.keys(g.rejections).length ? [el("h2", {}, "Drafts rejected"), table("gen-rejections", ["reason", "drafts"], Object.entries(g.rejections).map(([k, v]) => [k, typeof v === "object" ? JSON.stringify(v) : v]))] : null,
    el("h2", {}, "Sample requests and their gold chains"),
    el("div", { class: "filters" }, el("label", {}, "split ", pick), search, `${samples.length} of ${g.samples.length}`),
    table("gen-samples", ["split", "template", "request", "gold chain", "answer"], samples.map((s) => [s.split, s.template, s.request, s.chain.join("\n"), s.answer])),
  ];
}

// -- the page ------------------------------------------------------------------------------
const TABS = { overview: ["Overview", overview], curves: ["Curves", curves], tools: ["Tool health", tools], episodes: ["Episodes", episodes], tokens: ["Tokens", tokens], tasks: ["Tasks", generation] };
const shownTabs = () => Object.keys(TABS).filter((id) => id !== "tasks" ? !DATA.generation || id === "overview" : Boolean(DATA.generation));
function render() {
  const started = performance.now();
  const nav = document.getElementById("tabs");
  nav.replaceChildren(...shownTabs().map((id) => [id, TABS[id]]).map(([id, [label]]) => el("button", { class: id === state.tab ? "active" : "", "data-tab": id, onclick: () => update({ tab: id }) }, label)));
  const main = document.getElementById("content");
  const [, build] = TABS[state.tab] || TABS.overview;
  main.replaceChildren(el("section", { class: "active", id: `tab-${state.tab}` }, build()));
  // Milliseconds since the page was asked for (HTML and data parsing included), and of this render.
  document.body.dataset.renderedMs = performance.now().toFixed(1);
  document.body.dataset.renderMs = (performance.now() - started).toFixed(1);
  document.body.dataset.shown = state.tab === "episodes" ? String(filtered().length) : "";
}
document.getElementById("title").textContent = `${DATA.run.name} — ${DATA.generation ? "task generation" : "run"} report`;
document.getElementById("meta").textContent = DATA.generation ? `${DATA.run.dir} · ${DATA.generation.samples.length} sample requests`
  : `${DATA.run.dir} · ${DATA.run.finished ? "finished" : "in progress"} · ${DATA.episodes.length} held-out episodes`;
if (DATA.generation && !location.hash) state.tab = "tasks";
readHash();
window.addEventListener("hashchange", () => { readHash(); render(); });
render();
document.body.dataset.ready = "1";
