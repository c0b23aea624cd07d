// The dashboard page: polls the JSON API, draws the table, one rollout's detail and its charts, and
// posts operator actions. Every request carries the token in X-Dashboard-Token (the API takes it from
// nowhere else). Text from the cluster goes in with textContent only, never as HTML.
"use strict";

const TOKEN = document.querySelector('meta[name="dashboard-token"]').content;
const LIST_POLL_MS = 1500;
const DETAIL_POLL_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";

let selected = null; // "namespace/name"
let shown = null; // the detail as last drawn: the revision and step an action is bound to
let acting = false;

async function api(path, options = {}) {
  const response = await fetch(path, {
    ...options,
    credentials: "same-origin",
    headers: { "X-Dashboard-Token": TOKEN, ...(options.headers || {}) },
  });
  let body = null;
  try {
    body = await response.json();
  } catch (error) {
    body = { error: `HTTP ${response.status}` };
  }
  return { status: response.status, body };
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) tr.appendChild(cell instanceof Node ? cell : el("td", cell));
  return tr;
}

function when(iso) {
  if (!iso) return "";
  const date = new Date(iso);
  return date.toLocaleString();
}

function stepText(step, weight) {
  if (!step) return "-";
  return `${step.index + 1} (${step.weight}%)`;
}

function verdictCell(verdict) {
  const cls = verdict === "pass" ? "ok" : verdict === "fail" ? "bad" : "muted";
  return el("td", verdict || "", cls);
}

// -- the table ------------------------------------------------------------------------------------

async function refreshList() {
  let answer;
  try {
    answer = await api("/api/rollouts");
  } catch (error) {
    document.getElementById("connection").textContent = "the dashboard is not reachable";
    return;
  }
  const connection = document.getElementById("connection");
  if (answer.status !== 200) {
    connection.textContent = answer.body.error || `HTTP ${answer.status}`;
    return;
  }
  connection.textContent = `updated ${new Date().toLocaleTimeString()}`;
  const tbody = document.querySelector("#rollouts tbody");
  const rows = answer.body.rollouts;
  document.getElementById("empty").hidden = rows.length > 0;
  tbody.replaceChildren(
    ...rows.map((rollout) => {
      const key = `${rollout.namespace}/${rollout.name}`;
      const phase = el("td", rollout.phase, `phase-${rollout.phase}`);
      const last = rollout.lastDecision ? rollout.lastDecision.reason : rollout.problem || "";
      const tr = row([
        rollout.namespace,
        rollout.name,
        phase,
        rollout.revision || "",
        rollout.stableRevision || "",
        rollout.weight === null || rollout.weight === undefined ? "-" : `${rollout.weight}%`,
        stepText(rollout.step),
        when(rollout.since),
        verdictCell(rollout.verdict),
        last,
      ]);
      tr.dataset.key = key;
      tr.dataset.phase = rollout.phase;
      tr.dataset.step = rollout.step ? String(rollout.step.index + 1) : "";
      if (key === selected) tr.classList.add("selected");
      tr.addEventListener("click", () => select(key));
      return tr;
    })
  );
}

function select(key) {
  selected = key;
  shown = null;
  location.hash = key;
  document.getElementById("action-result").textContent = "";
  document.getElementById("action-result").className = "";
  for (const tr of document.querySelectorAll("#rollouts tbody tr")) {
    tr.classList.toggle("selected", tr.dataset.key === key);
  }
  refreshDetail();
}

// -- one rollout --------------------------------------------------------------------------------

async function refreshDetail() {
  if (!selected) return;
  const key = selected;
  const answer = await api(`/api/rollouts/${key}`);
  if (key !== selected) return;
  const section = document.getElementById("detail");
  section.hidden = false;
  document.getElementById("detail-title").textContent = key;
  if (answer.status !== 200) {
    document.getElementById("detail-summary").textContent = answer.body.error || `HTTP ${answer.status}`;
    return;
  }
  const detail = answer.body;
  shown = detail;
  section.dataset.phase = detail.phase;
  section.dataset.step = detail.step ? String(detail.step.index + 1) : "";
  const summary = [
    `phase ${detail.phase}`,
    detail.pause ? `(${detail.pause.kind}: ${detail.pause.reason})` : "",
    detail.revision ? `· canary ${detail.revision}` : "",
    detail.stableRevision ? `vs stable ${detail.stableRevision}` : "",
    detail.step ? `· step ${stepText(detail.step)}` : "",
    detail.weight !== null && detail.weight !== undefined ? `· weight ${detail.weight}%` : "",
    detail.pendingCommand ? `· ${detail.pendingCommand.command} by ${detail.pendingCommand.by} waits for the controller` : "",
    detail.problem || "",
  ];
  document.getElementById("detail-summary").textContent = summary.filter(Boolean).join(" ");
  const artefacts = detail.artefacts || {};
  document.getElementById("detail-artefacts").textContent = [
    detail.revision && artefacts.canary ? `canary serves ${artefacts.canary.text}` : "",
    detail.stableRevision && artefacts.stable ? `stable serves ${artefacts.stable.text}` : "",
  ].filter(Boolean).join(" · ");
  const last = detail.lastCommandResult;
  document.getElementById("last-command").textContent = last
    ? `last command: ${last.command} by ${last.by || "?"} ${last.accepted ? "accepted" : "refused"} at ${when(last.at)}: ${last.message}`
    : "";
  drawActions(detail.actions || {});
  drawCharts(detail.charts);
  drawChecks(detail);
  drawDecisions(detail.decisions || []);
}

// A button is enabled only when the rollout's state would take its command now; its tooltip says why
// not. The controller stays the authority: what it refuses (an approve without approval: manual, a
// command it reads too late) comes back as its answer.
function drawActions(actions) {
  for (const button of document.querySelectorAll("#actions button")) {
    const action = actions[button.dataset.action];
    const allowed = Boolean(action && action.allowed);
    button.disabled = acting || !allowed;
    button.title = allowed ? "" : (action && action.reason) || "not available";
  }
}

// Abort and promote cannot be taken back: say what they do to which revision, and ask.
const CONFIRM = {
  abort: (key, detail) => `Abort the rollout of ${detail.revision} (${key})? Its traffic goes back to the stable revision now.`,
  promote: (key, detail) => `Promote ${detail.revision} (${key}) now, skipping the remaining steps and checks?`,
};

function drawChecks(detail) {
  const explain = detail.explain;
  const note = document.getElementById("evaluation-summary");
  const tbody = document.querySelector("#checks tbody");
  if (!explain) {
    note.textContent = detail.explainProblem || "no evaluation recorded yet";
    tbody.replaceChildren();
    return;
  }
  note.textContent =
    `${when(explain.at)}: ${explain.verdict || "no verdict"}, ${explain.requests ?? "?"} requests — ${explain.action}. ` +
    explain.reasons.join(" ");
  tbody.replaceChildren(
    ...explain.checks.map((check) =>
      row([
        check.name + (check.critical ? " (critical)" : ""),
        verdictCell(check.verdict),
        check.value ?? "",
        check.limit,
        check.stable ?? "",
        check.samples === null || check.samples === undefined ? "" : Math.round(check.samples),
        check.statement,
      ])
    )
  );
}

function drawDecisions(decisions) {
  const tbody = document.querySelector("#decisions tbody");
  tbody.replaceChildren(
    ...decisions.map((decision) =>
      row([
        when(decision.at),
        decision.action,
        decision.weight === null ? "" : `${decision.weight}%`,
        decision.phase,
        decision.reason,
      ])
    )
  );
}

// -- charts ---------------------------------------------------------------------------------------

function svg(tag, attributes, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function niceCeiling(value) {
  if (!(value > 0)) return 1;
  const magnitude = Math.pow(10, Math.floor(Math.log10(value)));
  for (const factor of [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) {
    if (factor * magnitude >= value) return factor * magnitude;
  }
  return 10 * magnitude;
}

function clock(seconds, span) {
  // Seconds only where the chart spans minutes: a rollout's hours read better without them.
  const format = span < 900 ? { hour: "2-digit", minute: "2-digit", second: "2-digit" } : { hour: "2-digit", minute: "2-digit" };
  return new Date(seconds * 1000).toLocaleTimeString([], format);
}

function chart(spec, markers, from, to) {
  const width = 900, height = 170, left = 58, right = 12, top = 26, bottom = 24;
  const plotW = width - left - right, plotH = height - top - bottom;
  const span = Math.max(to - from, 1e-9);
  const values = spec.series.flatMap((s) => s.points.map((p) => p[1])).concat(spec.limits.map((l) => l.value));
  const yTop = spec.yMax || niceCeiling(Math.max(...values, 0) * 1.1 || 1);
  const x = (t) => left + ((Math.min(Math.max(t, from), to) - from) / span) * plotW;
  const y = (v) => top + plotH - (Math.min(Math.max(v, 0), yTop) / yTop) * plotH;
  const root = svg("svg", { class: "chart", width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
  root.setAttribute("aria-label", spec.title);
  root.appendChild(svg("text", { x: left, y: 15, class: "title" }, `${spec.title}${spec.unit ? ` (${spec.unit})` : ""}`));
  for (let i = 0; i <= 4; i++) {
    const value = (yTop * i) / 4;
    root.appendChild(svg("line", { x1: left, x2: left + plotW, y1: y(value), y2: y(value), class: "grid" }));
    root.appendChild(svg("text", { x: left - 6, y: y(value) + 4, class: "tick", "text-anchor": "end" }, +value.toPrecision(3)));
  }
  for (let i = 0; i <= 6; i++) {
    const t = from + (span * i) / 6;
    const anchor = i === 6 ? "end" : i === 0 ? "start" : "middle";
    root.appendChild(svg("text", { x: x(t), y: height - 6, class: "tick", "text-anchor": anchor }, clock(t, span)));
  }
  for (const limit of spec.limits) {
    const line = svg("line", { x1: left, x2: left + plotW, y1: y(limit.value), y2: y(limit.value), class: "limit", stroke: spec.limitColour || "#c0392b" });
    line.appendChild(svg("title", {}, limit.label));
    root.appendChild(line);
    root.appendChild(svg("text", { x: left + plotW - 4, y: y(limit.value) - 4, class: "limit-label", "text-anchor": "end", fill: spec.limitColour || "#c0392b" }, limit.label));
  }
  for (const series of spec.series) {
    const corners = [];
    let previous = null;
    for (const [t, v] of series.points) {
      if (series.step && previous !== null && v !== previous[1]) corners.push([t, previous[1]]);
      corners.push([t, v]);
      previous = [t, v];
    }
    const line = svg("polyline", { points: corners.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" "), stroke: series.colour, class: "series" });
    line.appendChild(svg("title", {}, series.label));
    root.appendChild(line);
    if (!series.step) {
      for (const [t, v] of series.points) root.appendChild(svg("circle", { cx: x(t), cy: y(v), r: 2.5, fill: series.colour, class: "point" }));
    }
  }
  markers.forEach((marker, index) => {
    if (marker.at < from || marker.at > to) return;
    const group = svg("g", { class: `marker ${marker.action}` });
    group.appendChild(svg("title", {}, marker.detail));
    group.appendChild(svg("line", { x1: x(marker.at), x2: x(marker.at), y1: top, y2: top + plotH, stroke: marker.colour }));
    const atEdge = x(marker.at) > left + plotW - 80;
    group.appendChild(svg("text", { x: atEdge ? x(marker.at) - 3 : x(marker.at) + 3, y: top + 10 + (index % 2) * 11, fill: marker.colour, class: "marker-label", "text-anchor": atEdge ? "end" : "start" }, marker.label));
    root.appendChild(group);
  });
  root.appendChild(svg("rect", { x: left, y: top, width: plotW, height: plotH, class: "frame" }));
  let legendX = left + 8 * (spec.title.length + (spec.unit || "").length + 3) + 16;
  for (const series of spec.series) {
    root.appendChild(svg("line", { x1: legendX, x2: legendX + 16, y1: 10, y2: 10, stroke: series.colour, "stroke-width": 3 }));
    root.appendChild(svg("text", { x: legendX + 20, y: 14, class: "legend" }, series.label));
    legendX += 34 + 6.2 * series.label.length;
  }
  return root;
}

function drawCharts(charts) {
  const container = document.getElementById("charts");
  if (!charts) {
    container.replaceChildren();
    return;
  }
  // At least five minutes across: a rollout that just started would squeeze every tick together.
  const from = Math.min(charts.from, charts.to - 300);
  const nodes = [chart(charts.traffic, charts.markers, from, charts.to)];
  for (const check of charts.checks) {
    const figure = chart(check, charts.markers, from, charts.to);
    figure.dataset.check = check.title;
    nodes.push(figure);
    const note = check.prometheusError
      ? `${check.source}; Prometheus: ${check.prometheusError}`
      : check.series.length === 0
      ? "no values yet"
      : check.source;
    nodes.push(el("p", note, "chart-note"));
  }
  container.replaceChildren(...nodes);
}

// -- actions --------------------------------------------------------------------------------------

async function act(action) {
  if (!selected || !shown || acting) return;
  if (CONFIRM[action] && !window.confirm(CONFIRM[action](selected, shown))) return;
  const result = document.getElementById("action-result");
  const buttons = document.querySelectorAll("#actions button");
  acting = true;
  buttons.forEach((button) => (button.disabled = true));
  result.className = "waiting";
  result.textContent = `${action}: waiting for the controller's answer…`;
  try {
    const answer = await api(`/api/rollouts/${selected}/${action}`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({
        revision: shown.revision ?? null,
        step: shown.step ? shown.step.index : null,
        reason: document.getElementById("reason").value || null,
      }),
    });
    const body = answer.body;
    if (body.outcome) {
      result.className = body.outcome;
      const who = { controller: "the controller", dashboard: "the dashboard", "api-server": "the API server" }[body.decidedBy] || body.decidedBy;
      const verb = { accepted: "accepted", refused: "refused", "no-answer": "issued, no answer yet", withdrawn: "withdrawn" }[body.outcome];
      result.textContent = `${action} ${verb} (${who}): ${body.message}`;
    } else {
      result.className = "error";
      result.textContent = `${action}: ${body.error || `HTTP ${answer.status}`}`;
    }
  } catch (error) {
    result.className = "error";
    result.textContent = `${action}: ${error}`;
  } finally {
    acting = false;
    drawActions(shown.actions || {});
    refreshDetail();
    refreshList();
  }
}

for (const button of document.querySelectorAll("#actions button")) {
  button.addEventListener("click", () => act(button.dataset.action));
}

if (location.hash.length > 1) select(decodeURIComponent(location.hash.slice(1)));
refreshList();
setInterval(refreshList, LIST_POLL_MS);
setInterval(() => {
  if (selected && !acting) refreshDetail();
}, DETAIL_POLL_MS);
