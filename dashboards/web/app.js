// medic dashboard: polls this agent's read-only JSON API and draws the fleet, one instance's memory,
// the restart plan and the event log. Text from the API (instance names, summaries, reasons) comes
// from configs and payloads, so it only ever enters the page as text nodes or attribute values:
// never through innerHTML. No external resources: the page must work on closed networks.

const params = new URLSearchParams(location.search);
const REFRESH_MS = clamp(Number(params.get("refresh")) || 5, 0.5, 300) * 1000;
const TIMEOUT_MS = 4000;
const SUSPECTS_EVERY_MS = 30000;
const WINDOWS = ["15m", "1h", "6h", "24h"];
const MEMORY_SERIES = [
  { metric: "rss_bytes", label: "RSS", cls: "series-rss" },
  { metric: "tree_memory_bytes", label: "instance (server + workers)", cls: "series-tree" },
  { metric: "allocator_resident_bytes", label: "allocator resident", cls: "series-resident" },
  { metric: "allocator_allocated_bytes", label: "allocator allocated", cls: "series-allocated" },
];
const SEVERITY_RANK = { critical: 4, error: 3, warning: 2, info: 1 };
const SVG_NS = "http://www.w3.org/2000/svg";

const state = {
  data: {}, // endpoint key -> last good body
  errors: {}, // endpoint key -> message of the last failure (cleared on success)
  clockOffset: 0, // agent clock minus browser clock, seconds
  lastOk: null, // agent time of the last successful poll
  unreachableSince: null,
  failedPolls: 0,
  suspectsAt: 0,
  suspectsFor: null,
  polling: false,
  again: false,
};

// ---------------------------------------------------------------------------------------- DOM helpers

function clamp(value, low, high) {
  return Math.min(high, Math.max(low, value));
}

/** An HTML element; string children become text nodes, attributes are set with setAttribute. */
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  appendAll(el, children);
  return el;
}

/** An SVG element, same rules as h(). */
function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setAttrs(el, attrs);
  appendAll(el, children);
  return el;
}

function setAttrs(el, attrs) {
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (/^on/i.test(key) || key === "style") throw new Error(`refusing attribute ${key}`);
    el.setAttribute(key, Array.isArray(value) ? value.filter(Boolean).join(" ") : String(value));
  }
}

function appendAll(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child)); // append(string) makes a text node
  }
}

function byId(id) {
  return document.getElementById(id);
}

function fill(id, ...children) {
  byId(id).replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
}

/** A table row; a cell is a value, or [value, class] for a styled cell. */
function row(cls, ...cells) {
  return h(
    "tr",
    { class: cls },
    cells.map((c) => (Array.isArray(c) ? h("td", { class: c[1] }, c[0]) : h("td", {}, c))),
  );
}

function table(headers, rows, cls) {
  return h(
    "table",
    { class: cls },
    h("thead", {}, h("tr", {}, headers.map((name) => h("th", {}, name)))),
    h("tbody", {}, rows),
  );
}

// ---------------------------------------------------------------------------------------- formatting

function isNum(value) {
  return typeof value === "number" && Number.isFinite(value);
}

function fmtBytes(value) {
  if (!isNum(value)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let size = Math.abs(value);
  let unit = 0;
  while (size >= 1024 && unit < units.length - 1) {
    size /= 1024;
    unit += 1;
  }
  const sign = value < 0 ? "-" : "";
  return `${sign}${unit === 0 ? size.toFixed(0) : size.toFixed(1)} ${units[unit]}`;
}

function fmtRate(bytesPerSecond) {
  return isNum(bytesPerSecond) ? `${bytesPerSecond >= 0 ? "+" : ""}${fmtBytes(bytesPerSecond * 3600)}/h` : "–";
}

function fmtDuration(seconds) {
  if (!isNum(seconds)) return "–";
  const sec = Math.abs(seconds);
  if (sec < 1) return `${(sec * 1000).toFixed(0)}ms`;
  if (sec < 60) return `${sec.toFixed(0)}s`;
  const parts = [
    [86400, "d"],
    [3600, "h"],
    [60, "m"],
    [1, "s"],
  ];
  const out = [];
  let rest = Math.floor(sec);
  for (const [size, name] of parts) {
    if (rest >= size && out.length < 2) {
      out.push(`${Math.floor(rest / size)}${name}`);
      rest %= size;
    } else if (out.length) break;
  }
  return out.join(" ");
}

function fmtLatency(seconds) {
  if (!isNum(seconds)) return "–";
  return seconds < 1 ? `${(seconds * 1000).toFixed(0)} ms` : `${seconds.toFixed(2)} s`;
}

function fmtClock(ts) {
  if (!isNum(ts)) return "–";
  const d = new Date(ts * 1000);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((n) => String(n).padStart(2, "0")).join(":");
}

function fmtWhen(ts, now) {
  if (!isNum(ts)) return "–";
  const delta = ts - now;
  return `${fmtClock(ts)} (${delta >= 0 ? `in ${fmtDuration(delta)}` : `${fmtDuration(-delta)} ago`})`;
}

function fmtPercent(ratio) {
  return isNum(ratio) ? `${(ratio * 100).toFixed(ratio < 0.1 ? 1 : 0)}%` : "–";
}

function agentNow() {
  return Date.now() / 1000 + state.clockOffset;
}

// ---------------------------------------------------------------------------------------- API

class FetchError extends Error {
  constructor(message, unreachable, status) {
    super(message);
    this.unreachable = unreachable;
    this.status = status;
  }
}

async function getJson(path) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), TIMEOUT_MS);
  let response;
  try {
    response = await fetch(path, { signal: controller.signal, cache: "no-store", credentials: "same-origin" });
  } catch (err) {
    const why = err && err.name === "AbortError" ? `no answer within ${TIMEOUT_MS / 1000}s` : "connection failed";
    throw new FetchError(`${path}: ${why}`, true, 0);
  } finally {
    clearTimeout(timer);
  }
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  if (!response.ok) {
    const detail = body && typeof body.error === "string" ? body.error : response.statusText;
    throw new FetchError(`${path}: HTTP ${response.status}: ${detail}`, false, response.status);
  }
  if (body === null || typeof body !== "object") throw new FetchError(`${path}: not a JSON object`, false, 0);
  return body;
}

/** Fetch endpoints in parallel; keep each one's last good body, note each one's error. */
async function load(requests) {
  const keys = Object.keys(requests);
  const results = await Promise.allSettled(keys.map((key) => getJson(requests[key])));
  const outcome = { answered: 0, total: keys.length };
  results.forEach((result, i) => {
    const key = keys[i];
    if (result.status === "fulfilled") {
      state.data[key] = result.value;
      delete state.errors[key];
      outcome.answered += 1;
      if (isNum(result.value.now)) state.clockOffset = result.value.now - Date.now() / 1000;
    } else {
      const err = result.reason;
      state.errors[key] = err instanceof FetchError ? err : new FetchError(String(err), false, 0);
    }
  });
  return outcome;
}

function selection() {
  const hash = new URLSearchParams(location.hash.replace(/^#/, ""));
  const win = hash.get("window");
  return { instance: hash.get("instance"), window: WINDOWS.includes(win) ? win : "1h" };
}

function link(instance, win) {
  const hash = new URLSearchParams();
  hash.set("instance", instance);
  if (win) hash.set("window", win);
  return `#${hash.toString()}`;
}

async function poll() {
  if (state.polling) {
    state.again = true;
    return;
  }
  state.polling = true;
  try {
    const core = await load({
      instances: "/api/v1/instances",
      findings: "/api/v1/findings?state=open",
      plan: "/api/v1/plan",
      actions: "/api/v1/actions?limit=10",
      decisions: "/api/v1/decisions?limit=10",
      events: "/api/v1/events?limit=50",
    });
    const reachable = core.answered > 0; // a proxy answering 502 to everything is no better than silence
    if (reachable) {
      state.lastOk = agentNow();
      state.unreachableSince = null;
      state.failedPolls = 0;
      await loadInstanceDetail();
    } else {
      state.unreachableSince = state.unreachableSince ?? Date.now() / 1000;
      state.failedPolls += 1;
    }
    render();
  } catch (err) {
    showBanner(`The dashboard failed to draw: ${err && err.message ? err.message : err}`, "error");
  } finally {
    state.polling = false;
    if (state.again) {
      state.again = false;
      setTimeout(poll, 0);
    } else {
      setTimeout(poll, REFRESH_MS);
    }
  }
}

async function loadInstanceDetail() {
  const name = selectedInstance();
  if (!name) return;
  const sel = selection();
  const inst = instanceByName(name);
  const latest = (inst && inst.latest) || {};
  const requests = {};
  for (const spec of MEMORY_SERIES) {
    if (spec.metric === "rss_bytes" || spec.metric in latest) {
      const query = new URLSearchParams({ metric: spec.metric, since: sel.window });
      requests[`series:${spec.metric}`] = `/api/v1/instances/${encodeURIComponent(name)}/series?${query}`;
    }
  }
  const now = Date.now();
  if (state.suspectsFor !== name || now - state.suspectsAt > SUSPECTS_EVERY_MS) {
    requests.suspects = `/api/v1/instances/${encodeURIComponent(name)}/suspects?limit=10`;
    state.suspectsAt = now;
    state.suspectsFor = name;
  }
  requests.detail = `/api/v1/instances/${encodeURIComponent(name)}`;
  for (const spec of MEMORY_SERIES) delete state.data[`series:${spec.metric}`];
  await load(requests);
}

// ---------------------------------------------------------------------------------------- model helpers

function instances() {
  const body = state.data.instances;
  return body && Array.isArray(body.instances) ? body.instances : [];
}

function instanceByName(name) {
  return instances().find((inst) => inst.name === name) || null;
}

function openFindings(name) {
  const body = state.data.findings;
  const all = body && Array.isArray(body.findings) ? body.findings : [];
  return name === undefined ? all : all.filter((f) => f.instance === name);
}

function worstSeverity(findings) {
  return findings.reduce((worst, f) => Math.max(worst, SEVERITY_RANK[f.severity] || 0), 0);
}

function selectedInstance() {
  const wanted = selection().instance;
  if (wanted && instanceByName(wanted)) return wanted;
  const ranked = instances()
    .map((inst) => [worstSeverity(openFindings(inst.name)), inst.name])
    .sort((a, b) => b[0] - a[0] || (a[1] < b[1] ? -1 : 1));
  return ranked.length ? ranked[0][1] : null;
}

/** The OOM projection of an instance's leak or oom-risk finding: a line from (t0, v0) to (oomAt, limit). */
function projectionOf(name) {
  const candidates = openFindings(name)
    .filter((f) => ["oom-risk", "leak"].includes(f.kind) && f.evidence)
    .map((f) => {
      const ev = f.evidence;
      const slope = isNum(ev.projection_slope_bytes_per_second)
        ? ev.projection_slope_bytes_per_second
        : ev.slope_bytes_per_second;
      const tto = ev.time_to_oom_seconds;
      const limit = ev.limit_bytes;
      const at = isNum(f.updated_at) ? f.updated_at : f.opened_at;
      if (![slope, tto, limit, at].every(isNum) || slope <= 0) return null;
      return { finding: f, t0: at, v0: limit - slope * tto, oomAt: at + tto, limit, slope };
    })
    .filter(Boolean)
    .sort((a, b) => a.oomAt - b.oomAt);
  return candidates[0] || null;
}

// ---------------------------------------------------------------------------------------- render

function render() {
  renderHeader();
  renderFleet();
  renderInstance();
  renderRemediation();
  renderEvents();
}

function showBanner(text, kind) {
  const banner = byId("banner");
  banner.replaceChildren(text);
  banner.className = `banner banner-${kind}`;
  banner.hidden = false;
}

function renderHeader() {
  const pill = byId("agent-state");
  if (state.unreachableSince !== null) {
    pill.textContent = "unreachable";
    pill.className = "pill pill-bad";
    const seen = state.lastOk ? `last data from ${fmtClock(state.lastOk)}` : "no data received yet";
    const reason = state.errors.instances ? state.errors.instances.message : "no answer";
    showBanner(
      `Agent unreachable since ${fmtClock(state.unreachableSince + state.clockOffset)} ` +
        `(${state.failedPolls} failed ${state.failedPolls === 1 ? "poll" : "polls"}: ${reason}). ` +
        `Showing ${seen}; retrying every ${REFRESH_MS / 1000}s. ` +
        "Check that `medic run` is up (systemctl status, or the pod) and listening on this address.",
      "unreachable",
    );
    document.body.classList.add("stale");
  } else {
    pill.textContent = "connected";
    pill.className = "pill pill-ok";
    byId("banner").hidden = true;
    document.body.classList.remove("stale");
  }
  const plan = state.data.plan;
  const mode = byId("mode");
  if (plan && plan.mode) {
    const fleetPaused = Boolean(plan.fleet && plan.fleet.paused);
    const held = plan.paused ? " · paused" : fleetPaused ? " · fleet paused" : "";
    mode.textContent = `${plan.mode}${held}`;
    mode.className = `pill mode-${plan.mode}${held ? " pill-warn" : ""}`;
    mode.hidden = false;
  } else {
    mode.hidden = true;
  }
  renderTimeScale();
  byId("updated").textContent = state.lastOk ? `updated ${fmtClock(state.lastOk)}` : "";
  document.title = state.unreachableSince !== null ? "medic (unreachable)" : `medic · ${openFindings().length} open`;
}

// A demo (`make run`, agent.time_scale) judges on a compressed clock: say so, or its minutes read as hours.
function renderTimeScale() {
  const body = state.data.instances;
  const scale = body && isNum(body.time_scale) ? body.time_scale : 1;
  const el = byId("time-scale");
  if (scale === 1) {
    el.hidden = true;
    return;
  }
  const factor = Number.isInteger(scale) ? String(scale) : scale.toFixed(1);
  el.textContent =
    `Compressed time: ${factor}x \u2014 detection windows and deadlines are scaled for a demo ` +
    `(agent.time_scale: ${factor}), so findings open and restarts come ${factor} times sooner than with production settings.`;
  el.hidden = false;
}

function sectionError(sectionId, keys) {
  const el = document.querySelector(`#${sectionId} .section-error`);
  const messages = keys.filter((k) => state.errors[k] && !state.errors[k].unreachable).map((k) => state.errors[k].message);
  el.textContent = messages.join(" · ");
  el.hidden = messages.length === 0;
}

function memoryBar(rss, limit) {
  const width = 140;
  const ratio = isNum(rss) && isNum(limit) && limit > 0 ? clamp(rss / limit, 0, 1) : 0;
  const level = ratio >= 0.9 ? "bar-critical" : ratio >= 0.75 ? "bar-warn" : "bar-ok";
  return s(
    "svg",
    { class: "bar", width, height: 10, viewBox: `0 0 ${width} 10`, role: "img", "aria-label": fmtPercent(ratio) },
    s("rect", { class: "bar-track", x: 0, y: 0, width, height: 10, rx: 2 }),
    s("rect", { class: ["bar-fill", level], x: 0, y: 0, width: (ratio * width).toFixed(1), height: 10, rx: 2 }),
  );
}

function findingChip(f) {
  return h("span", { class: ["chip", `sev-${f.severity}`], title: f.summary || "" }, f.kind || "finding");
}

// the instance's memory as judged: its processes together (server and workers), else its RSS
function memoryOf(inst) {
  return isNum(inst.memory_bytes) ? inst.memory_bytes : inst.rss_bytes;
}

const MEMORY_SOURCES = {
  cgroup: "its cgroup's working set",
  pss: "server + workers, shared pages once",
  rss: "RSS of its process",
};

function renderProcesses(name) {
  const body = state.data.detail;
  const detail = body && body.instance && body.instance.name === name ? body.instance : null;
  const processes = (detail && Array.isArray(detail.processes) && detail.processes) || [];
  if (processes.length < 2) {
    fill("processes", h("p", { class: "muted" }, processes.length ? "One process, no workers." : "No process to show."));
    return;
  }
  const rows = processes.map((p) =>
    row(
      p.role === "server" ? "process-server" : "process-worker",
      String(p.pid ?? "–"),
      p.role || "?",
      fmtDuration(p.age_seconds),
      fmtBytes(p.rss_bytes),
      fmtBytes(p.pss_bytes),
      fmtBytes(p.memory_bytes),
      h("code", { class: "small" }, p.command || ""),
    ),
  );
  fill("processes", table(["pid", "role", "age", "RSS", "PSS", "counts", "command"], rows, "processes"));
}

function renderFleet() {
  sectionError("fleet-section", ["instances", "findings"]);
  const list = instances();
  const selected = selectedInstance();
  const sel = selection();
  const now = agentNow();
  const rows = list.map((inst) => {
    const findings = openFindings(inst.name);
    const projection = projectionOf(inst.name);
    const tto = projection ? projection.oomAt - now : null;
    const labels = Object.entries(inst.labels || {}).map(([k, v]) => h("span", { class: "label" }, `${k}=${v}`));
    const row = h(
      "tr",
      { class: ["instance-row", inst.name === selected && "selected"], "data-instance": inst.name },
      h("td", {}, h("a", { href: link(inst.name, sel.window), class: "instance-name" }, inst.name), " ", labels),
      h(
        "td",
        {},
        h("span", { class: ["status", `status-${inst.status}`], title: inst.status_reason || "" }, inst.status || "?"),
        inst.status !== "up" && inst.status_reason ? h("div", { class: "muted small" }, inst.status_reason) : null,
      ),
      h(
        "td",
        { class: "memory" },
        memoryBar(memoryOf(inst), inst.memory_limit_bytes),
        h(
          "span",
          { class: "small" },
          ` ${fmtBytes(memoryOf(inst))} / ${fmtBytes(inst.memory_limit_bytes)} (${fmtPercent(inst.memory_used_ratio)})`,
          inst.workers ? h("span", { class: "muted" }, ` · ${inst.workers} worker${inst.workers > 1 ? "s" : ""}`) : null,
        ),
      ),
      timeToOomCell(projection, tto, findings.find((f) => f.evidence && f.evidence.above_limit)),
      h("td", {}, fmtLatency((inst.latest || {}).latency_p99_seconds)),
      h("td", {}, findings.length ? findings.map(findingChip) : h("span", { class: "muted" }, "none")),
    );
    row.addEventListener("click", (event) => {
      if (event.target.closest("a")) return;
      location.hash = link(inst.name, sel.window);
    });
    return row;
  });
  const empty = state.data.instances
    ? "No instances configured: give `medic run` a config or a command."
    : "Waiting for the agent…";
  document.querySelector("#fleet tbody").replaceChildren(
    ...(rows.length ? rows : [h("tr", {}, h("td", { colspan: 6, class: "muted" }, empty))]),
  );
  const lines = openFindings()
    .slice()
    .sort((a, b) => (SEVERITY_RANK[b.severity] || 0) - (SEVERITY_RANK[a.severity] || 0))
    .map((f) =>
      h(
        "li",
        { class: ["finding-line", `sev-${f.severity}`] },
        h("a", { href: link(f.instance, sel.window) }, f.instance || "?"),
        " ",
        findingChip(f),
        " ",
        h("span", { class: "summary" }, f.summary || ""),
      ),
    );
  fill("open-findings", lines);
}

function timeToOomCell(projection, tto, above) {
  if (above) {
    // as `medic leaks` says it: at an enforced limit now; past a config-only one, unknown
    const text = isNum(above.evidence.time_to_oom_seconds) ? "0s (at its limit)" : "past its limit";
    return h("td", { class: ["tto", "urgent"], title: above.summary || "" }, text);
  }
  if (!projection) return h("td", { class: "tto" }, "–");
  const title = `projected OOM ${fmtClock(projection.oomAt)} (${projection.finding.kind} finding)`;
  const text = tto > 0 ? fmtDuration(tto) : "passed"; // the projection's time has come: look at the chart
  return h("td", { class: ["tto", tto < 3600 && "urgent"], title }, text);
}

function renderInstance() {
  sectionError("instance-section", ["series:rss_bytes", "suspects"]);
  const name = selectedInstance();
  const inst = name ? instanceByName(name) : null;
  if (!inst) {
    byId("instance-title").textContent = "Instance";
    fill("instance-facts", h("p", { class: "muted" }, "No instance to show yet."));
    fill("windows");
    fill("memory-chart");
    fill("memory-legend");
    fill("findings");
    fill("processes");
    fill("suspects");
    return;
  }
  const now = agentNow();
  byId("instance-title").textContent = `Instance ${inst.name}`;
  fill(
    "instance-facts",
    fact("status", `${inst.status}${inst.status_reason ? ` (${inst.status_reason})` : ""}`),
    fact("pid", inst.pid ?? "–"),
    fact("uptime", fmtDuration(inst.uptime_seconds)),
    fact("restarts", inst.restarts ?? "–"),
    fact("memory", `${fmtBytes(memoryOf(inst))}${MEMORY_SOURCES[inst.memory_source] ? ` (${MEMORY_SOURCES[inst.memory_source]})` : ""}`),
    fact("processes", inst.status === "up" ? 1 + (inst.workers || 0) : "–"),
    fact("limit", `${fmtBytes(inst.memory_limit_bytes)}${inst.memory_limit_source ? ` (${inst.memory_limit_source})` : ""}`),
    fact("p99", fmtLatency((inst.latest || {}).latency_p99_seconds)),
    fact("last probe", `${fmtDuration(inst.last_probe_age_seconds)} ago`),
  );
  const sel = selection();
  fill(
    "windows",
    WINDOWS.map((win) => h("a", { href: link(inst.name, win), class: ["window", win === sel.window && "active"] }, win)),
  );
  const series = MEMORY_SERIES.map((spec) => ({ ...spec, body: state.data[`series:${spec.metric}`] }))
    .filter((spec) => spec.body && Array.isArray(spec.body.points) && spec.body.points.length)
    .map((spec) => ({ ...spec, points: spec.body.points.filter((p) => isNum(p[0]) && isNum(p[1])) }));
  const projection = projectionOf(inst.name);
  fill("memory-chart", memoryChart(inst, series, projection, now));
  fill(
    "memory-legend",
    series.map((spec) => h("span", { class: ["key", spec.cls] }, spec.label)),
    isNum(inst.memory_limit_bytes) ? h("span", { class: "key key-limit" }, "memory limit") : null,
    projection ? h("span", { class: "key key-projection" }, "leak projection") : null,
  );
  const findings = openFindings(inst.name);
  fill("findings", findings.length ? findings.map((f) => findingCard(f, now)) : h("p", { class: "muted" }, "No open findings."));
  renderProcesses(inst.name);
  renderSuspects(inst);
}

// the namespace's pause and elected planner, as the agent's last remediation step read them
function fleetPauseFact(fleet, now) {
  if (!fleet || !fleet.shared) return null;
  const pause = fleet.paused;
  if (!pause) return fact("fleet pause", "not paused");
  const until = isNum(pause.until) ? fmtWhen(pause.until, now) : "lifted";
  const on = pause.agent ? ` on ${pause.agent}` : "";
  return fact("fleet paused", `until ${until} by ${pause.by || "an operator"}${on}: ${pause.reason || ""}`, "paused");
}

function fleetPlannerFact(fleet, now) {
  if (!fleet) return null;
  if (!fleet.shared) return fact("planner", "this agent (no other agent shares its coordinator)");
  const leader = fleet.leader;
  if (!leader) return fact("planner", fleet.error ? `unknown: ${fleet.error}` : "none elected");
  const since = isNum(leader.since) ? ` since ${fmtWhen(leader.since, now)}` : "";
  const revision = leader.revision !== null && leader.revision !== undefined ? `, revision ${leader.revision}` : "";
  return fact("planner", `${leader.agent || "?"}${fleet.leads ? " (this agent)" : ""}${since}${revision}`);
}

function fact(label, value, cls) {
  return h(
    "div",
    { class: ["fact", cls] },
    h("span", { class: "fact-label" }, label),
    h("span", { class: "fact-value" }, String(value)),
  );
}

function findingCard(f, now) {
  const ev = f.evidence || {};
  const facts = [];
  if (f.verdict) facts.push(fact("verdict", f.verdict));
  if (isNum(ev.slope_bytes_per_second)) facts.push(fact("slope", fmtRate(ev.slope_bytes_per_second)));
  if (isNum(ev.confidence)) facts.push(fact("confidence", ev.confidence.toFixed(3)));
  if (ev.above_limit) {
    facts.push(fact("projected OOM", isNum(ev.time_to_oom_seconds) ? "now: at its limit" : "unknown: past a limit the kernel does not enforce"));
  } else if (isNum(ev.time_to_oom_seconds)) {
    const at = (isNum(f.updated_at) ? f.updated_at : now) + ev.time_to_oom_seconds;
    facts.push(fact("projected OOM", fmtWhen(at, now)));
  }
  if (isNum(ev.limit_bytes)) {
    const where = ev.limit_source === "config" ? " (medic's config only)" : ev.limit_source ? ` (${ev.limit_source})` : "";
    facts.push(fact("limit", `${fmtBytes(ev.limit_bytes)}${where}${ev.above_limit ? ", above it" : ""}`));
  }
  if (isNum(ev.resident_bytes) && isNum(ev.allocated_bytes)) {
    facts.push(fact("resident / allocated", `${fmtBytes(ev.resident_bytes)} / ${fmtBytes(ev.allocated_bytes)}`));
  }
  facts.push(fact("opened", fmtWhen(f.opened_at, now)));
  const suspects = Array.isArray(ev.suspects) ? ev.suspects.slice(0, 5) : [];
  return h(
    "article",
    { class: ["finding", `sev-${f.severity}`], "data-kind": f.kind },
    h("header", {}, findingChip(f), " ", h("span", { class: "severity" }, f.severity || "")),
    h("p", { class: "summary" }, f.summary || "(no summary)"),
    h("div", { class: "facts" }, facts),
    suspects.length
      ? h("ul", { class: "suspect-lines" }, suspects.map((sp) => h("li", {}, suspectLine(sp))))
      : null,
    collectingLine(ev.collecting),
  );
}

// what a leak finding waits for: allocation sites being collected, or why their tracing ended
function collectingLine(waiting) {
  if (!waiting || typeof waiting !== "object" || !waiting.message) return null;
  return h("p", { class: "muted" }, `collecting ${waiting.what || "allocation sites"}: ${waiting.message}`);
}

function suspectLine(sp) {
  const share = isNum(sp.share) ? `, ${fmtPercent(sp.share)} of the growth` : "";
  const held = heldBy(sp);
  return `${sp.name || "?"}: ${fmtRate(sp.bytes_per_second)}${share}${held ? `; ${held}` : ""}`;
}

// what holds a suspect, where the process could say: "held by static field Cache.ENTRIES (java.util.HashMap…)",
// "held by cache_service.CACHE (dict of 5000 int -> bytes), added at cache_service.py:16"; or where a
// Python container is filled
function heldBy(sp) {
  const first = Array.isArray(sp.held_by) ? sp.held_by[0] : null;
  if (!first) return sp.added_at ? `filled at ${sp.added_at}` : "";
  if (typeof first === "string") return `held by ${first}`;
  if (!first.where) return "";
  return `held by ${first.where}${first.what ? ` (${first.what})` : ""}${first.added_at ? `, added at ${first.added_at}` : ""}`;
}

function renderSuspects(inst) {
  const body = state.data.suspects;
  const list = body && body.instance === inst.name && Array.isArray(body.suspects) ? body.suspects : null;
  if (list === null) {
    fill("suspects", h("p", { class: "muted" }, "Loading…"));
    return;
  }
  if (!list.length) {
    fill(
      "suspects",
      h(
        "p",
        { class: "muted" },
        "Nothing grows in the histograms or heap profiles of the last 6 h. Suspects need type/class histograms " +
          `or heap profiles: \`medic doctor ${inst.name}\` says what is missing.`,
      ),
    );
    return;
  }
  const rows = list.map((sp) =>
    h(
      "tr",
      {},
      h("td", { class: "mono" }, heldBy(sp) ? `${sp.name || "?"} ${heldBy(sp)}` : sp.name || "?"),
      h("td", {}, sp.kind || ""),
      h("td", { class: "num" }, fmtRate(sp.bytes_per_second)),
      h("td", { class: "num" }, fmtPercent(sp.share)),
      h("td", { class: "num" }, isNum(sp.confidence) ? sp.confidence.toFixed(3) : "–"),
    ),
  );
  fill("suspects", table(["Suspect", "Kind", "Growth", "Share", "Confidence"], rows, "grid"));
}

// ---------------------------------------------------------------------------------------- charts

const CHART = { width: 960, height: 300, left: 76, right: 170, top: 14, bottom: 30 };

function niceStep(max, count) {
  const raw = max / count;
  const power = 1024 ** Math.floor(Math.log(raw) / Math.log(1024));
  const scaled = raw / power;
  const nice = [1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100, 128, 200, 256, 500, 512, 1000, 1024].find((n) => n >= scaled) || 1024;
  return nice * power;
}

function memoryChart(inst, series, projection, now) {
  const all = series.flatMap((spec) => spec.points);
  if (!all.length) {
    const why = state.errors["series:rss_bytes"] ? state.errors["series:rss_bytes"].message : "no samples in this window yet";
    return h("p", { class: "muted empty-chart" }, `No memory chart: ${why}.`);
  }
  let tStart = Infinity;
  let tLast = -Infinity;
  let dataMax = 0;
  for (const [t, v] of all) {
    tStart = Math.min(tStart, t);
    tLast = Math.max(tLast, t);
    dataMax = Math.max(dataMax, v);
  }
  const tNow = Math.max(now, tLast);
  const span = Math.max(tNow - tStart, 30);
  let tEnd = tNow;
  const limit = inst.memory_limit_bytes;
  let oomVisible = false;
  if (projection) {
    oomVisible = projection.oomAt <= tNow + 1.5 * span;
    tEnd = oomVisible ? Math.max(tNow, projection.oomAt) + span * 0.04 : tNow + span * 0.3;
  }
  const projectionAt = (t) => projection.v0 + projection.slope * (t - projection.t0);
  const projEnd = projection ? Math.min(tEnd, projection.oomAt) : null;
  // the limit is drawn when it matters (a projection runs to it) or when it does not flatten the data
  const showLimit = isNum(limit) && limit > 0 && (projection !== null || limit <= 4 * dataMax);
  let yMax = Math.max(dataMax, showLimit ? limit : 0, projection ? projectionAt(projEnd) : 0) * 1.08;
  if (!(yMax > 0)) yMax = 1;

  const { width, height, left, right, top, bottom } = CHART;
  const plotW = width - left - right;
  const plotH = height - top - bottom;
  const x = (t) => left + ((t - tStart) / (tEnd - tStart || 1)) * plotW;
  const y = (v) => top + plotH - (v / yMax) * plotH;
  const parts = [s("title", {}, `Memory of ${inst.name}`)];

  const step = niceStep(yMax, 4);
  for (let v = 0; v <= yMax; v += step) {
    parts.push(s("line", { class: "grid", x1: left, x2: left + plotW, y1: y(v), y2: y(v) }));
    parts.push(s("text", { class: "axis", x: left - 6, y: y(v) + 4, "text-anchor": "end" }, fmtBytes(v)));
  }
  for (let i = 0; i <= 4; i += 1) {
    const t = tStart + ((tEnd - tStart) * i) / 4;
    parts.push(s("text", { class: "axis", x: x(t), y: height - 8, "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle" }, fmtClock(t)));
  }
  if (tEnd > tNow) {
    parts.push(s("line", { class: "now", x1: x(tNow), x2: x(tNow), y1: top, y2: top + plotH }));
    parts.push(s("text", { class: "axis", x: x(tNow) + 3, y: top + 10 }, "now"));
  }
  for (const spec of series) {
    const points = spec.points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    parts.push(s("polyline", { class: ["series", spec.cls], points }, s("title", {}, spec.label)));
  }
  const labelX = left + plotW + 6;
  if (showLimit) {
    parts.push(s("line", { class: "limit", x1: left, x2: left + plotW, y1: y(limit), y2: y(limit) }));
    parts.push(s("text", { class: "limit-label", x: labelX, y: y(limit) + 4 }, `limit ${fmtBytes(limit)}`));
  } else if (isNum(limit) && limit > 0) {
    parts.push(s("text", { class: "limit-label", x: labelX, y: top + 10 }, `limit ${fmtBytes(limit)} ↑`));
    parts.push(s("text", { class: "axis", x: labelX, y: top + 24 }, "(off scale)"));
  }
  if (projection) {
    const from = Math.max(projection.t0, tStart);
    parts.push(
      s("line", { class: "projection", x1: x(from), y1: y(projectionAt(from)), x2: x(projEnd), y2: y(projectionAt(projEnd)) }),
    );
    if (oomVisible) {
      parts.push(s("circle", { class: "oom-point", cx: x(projection.oomAt), cy: y(projection.limit), r: 4 }));
    }
    const delta = projection.oomAt - now;
    const labelY = showLimit ? y(limit) + 20 : top + 40;
    parts.push(s("text", { class: "oom-label", x: labelX, y: labelY }, `OOM ${fmtClock(projection.oomAt)}`));
    const when = delta >= 0 ? `in ${fmtDuration(delta)}` : `${fmtDuration(-delta)} ago`;
    parts.push(s("text", { class: "oom-label", x: labelX, y: labelY + 14 }, when));
  }
  parts.push(s("rect", { class: "frame", x: left, y: top, width: plotW, height: plotH }));
  return s(
    "svg",
    { class: "chart-memory", viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": `memory of ${inst.name}` },
    parts,
  );
}

/** An entry's status as `medic plan` words it: dry-run's would-be restart, held by the budget, or
 * against its deadline. */
function planStatus(e, now) {
  if (e.dry_run) return "would-restart";
  if (e.held_by && !isNum(e.deadline) && isNum(e.slot_at) && e.slot_at > now) return `held: ${e.held_by}`;
  return e.hopeless ? "hopeless" : e.late ? "late" : "on-time";
}

function planTimeline(entries, now) {
  const rowH = 30;
  const left = 170;
  const right = 120;
  const top = 22;
  const width = 960;
  const height = top + entries.length * rowH + 26;
  const times = entries.flatMap((e) => [e.slot_at, e.deadline, e.latest_start]).filter(isNum);
  const tStart = Math.min(now, ...times);
  const tEnd = Math.max(now + 60, ...times);
  const pad = (tEnd - tStart) * 0.05;
  const t0 = tStart - pad;
  const t1 = tEnd + pad;
  const plotW = width - left - right;
  const x = (t) => left + ((t - t0) / (t1 - t0)) * plotW;
  const parts = [s("title", {}, "Restart plan against deadlines")];
  for (let i = 0; i <= 4; i += 1) {
    const t = t0 + ((t1 - t0) * i) / 4;
    parts.push(s("line", { class: "grid", x1: x(t), x2: x(t), y1: top - 6, y2: height - 22 }));
    parts.push(s("text", { class: "axis", x: x(t), y: height - 6, "text-anchor": "middle" }, fmtClock(t)));
  }
  parts.push(s("line", { class: "now", x1: x(now), x2: x(now), y1: top - 12, y2: height - 22 }));
  parts.push(s("text", { class: "axis", x: x(now) + 3, y: top - 10 }, "now"));
  entries.forEach((e, i) => {
    const cy = top + i * rowH + rowH / 2;
    const status = planStatus(e, now);
    const cls = `plan-${status.split(":")[0]}`;
    const name = `${e.instance} (${e.kind || "restart"})`;
    parts.push(s("text", { class: "plan-name", x: left - 8, y: cy + 4, "text-anchor": "end" }, name));
    if (isNum(e.slot_at)) {
      parts.push(s("line", { class: "plan-wait", x1: x(now), x2: x(e.slot_at), y1: cy, y2: cy }));
    }
    const tick = (t, cls, half, label) =>
      s("line", { class: cls, x1: x(t), x2: x(t), y1: cy - half, y2: cy + half }, s("title", {}, label));
    if (isNum(e.latest_start)) parts.push(tick(e.latest_start, "plan-latest", 9, `must start by ${fmtClock(e.latest_start)}`));
    if (isNum(e.deadline)) parts.push(tick(e.deadline, "plan-deadline", 11, `projected OOM ${fmtClock(e.deadline)}`));
    if (isNum(e.slot_at)) {
      const said = e.dry_run ? "would restart (dry-run, nothing restarted)" : "restart planned";
      const title = s("title", {}, `${said} ${fmtClock(e.slot_at)}`);
      parts.push(s("circle", { class: ["plan-slot", cls], cx: x(e.slot_at), cy, r: 6 }, title));
    }
    parts.push(s("text", { class: ["plan-status", cls], x: left + plotW + 8, y: cy + 4 }, status));
  });
  const attrs = { class: "chart-plan", viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "restart plan" };
  return s("svg", attrs, parts);
}

// ---------------------------------------------------------------------------------------- remediation, events

/** The last step's refusals for instances the plan does not list (escalated, in progress, paused…). */
function heldElsewhere(step, entries) {
  const planned = new Set(entries.map((e) => e.instance));
  return Object.entries(step.decisions || {}).filter(([name, d]) => d && !d.ok && !planned.has(name));
}

function renderRemediation() {
  const planMissing = state.errors.plan && state.errors.plan.status === 404; // said below, not an error
  sectionError("remediation-section", planMissing ? ["actions", "decisions"] : ["plan", "actions", "decisions"]);
  const plan = state.data.plan;
  const now = agentNow();
  if (!plan) {
    const err = state.errors.plan;
    const text = err && err.status === 404 ? "Remediation is not enabled on this agent." : "Waiting for the plan…";
    fill("remediation-state", h("p", { class: "muted" }, text));
    fill("plan");
    fill("actions");
    fill("decisions");
    return;
  }
  const budget = plan.budget || {};
  const coordinator = plan.coordinator || {};
  const pause = plan.paused;
  fill(
    "remediation-state",
    fact("mode", plan.mode || "?"),
    pause
      ? fact("paused", `until ${fmtWhen(pause.until, now)} by ${pause.by || "an operator"}: ${pause.reason || ""}`, "paused")
      : fact("pause", "not paused"),
    fleetPauseFact(plan.fleet, now),
    fleetPlannerFact(plan.fleet, now),
    fact("coordinator", coordinator.ok === false ? `DOWN: ${coordinator.error || "?"} (no restarts until it answers)` : "ok"),
    fact("budget", budget.text || "?"),
    fact("windows", plan.windows || "any time"),
  );
  const step = plan.step || {};
  const planned = step.plan || {};
  const entries = Array.isArray(planned.entries) ? planned.entries : [];
  fill(
    "plan",
    entries.length ? planTimeline(entries, now) : h("p", { class: "muted" }, "No restarts planned."),
    entries.length
      ? h("ul", { class: "plan-reasons" }, entries.map((e) => h("li", {}, h("b", {}, e.instance || "?"), `: ${e.reason || ""}`)))
      : null,
    (planned.problems || []).map((p) => h("p", { class: "problem" }, String(p))),
    (plan.requests || []).map((r) =>
      h(
        "p",
        { class: r.status === "held" ? "problem" : "muted" },
        `request: ${r.instance || "?"}: ${r.kind || "manual"} restart asked by ${r.requested_by || "an operator"} ` +
          `(action ${r.action_id ?? "?"}): ${r.detail || "waiting for the next remediation step"}`,
      ),
    ),
    heldElsewhere(step, entries).map(([name, d]) =>
      h("p", { class: "problem" }, `held: ${name}: ${d.stage || "?"}/${d.code || "?"}: ${d.reason || ""}`),
    ),
    (plan.in_progress || []).map((name) => h("p", { class: "in-progress" }, `restarting now: ${name}`)),
    (plan.escalations || []).map((e) =>
      h(
        "p",
        { class: "problem" },
        `escalated: ${e.instance || "?"}: ${e.reason || ""} (a person must look; automatic remediation stopped)`,
      ),
    ),
  );
  const actions = (state.data.actions && state.data.actions.actions) || [];
  fill(
    "actions",
    actions.length
      ? table(
          ["When", "Instance", "Action", "Mode", "Outcome", "Reason"],
          actions.map((a) =>
            row(null, fmtWhen(a.created_at, now), a.instance || "", a.action || "", a.mode || "",
              [a.outcome || "", `outcome-${a.outcome}`], a.reason || ""),
          ),
          "grid",
        )
      : h("p", { class: "muted" }, "No actions yet."),
  );
  const decisions = (state.data.decisions && state.data.decisions.decisions) || [];
  fill(
    "decisions",
    decisions.length
      ? table(
          ["When", "Instance", "Stage", "Decision", "Reason"],
          decisions.map((d) =>
            row(null, fmtWhen(d.ts, now), d.instance || "", d.stage || "",
              [`${d.ok ? "go" : "no"}: ${d.code || ""}`, d.ok ? "ok" : "refused"], d.reason || ""),
          ),
          "grid",
        )
      : h("p", { class: "muted" }, "No decisions yet."),
  );
}

function renderEvents() {
  sectionError("events-section", ["events"]);
  const events = (state.data.events && state.data.events.events) || [];
  const now = agentNow();
  const sorted = events.slice().sort((a, b) => (b.id ?? 0) - (a.id ?? 0) || (b.ts ?? 0) - (a.ts ?? 0));
  fill(
    "events",
    sorted.length
      ? table(
          ["When", "Severity", "Instance", "Kind", "Message"],
          sorted.map((e) =>
            row(`sev-${e.severity}`, [fmtWhen(e.ts, now), "nowrap"], e.severity || "", e.instance || "–",
              [e.kind || "", "mono"], e.message || ""),
          ),
          "grid events",
        )
      : h("p", { class: "muted" }, state.data.events ? "No events yet." : "Waiting for the event log…"),
  );
}

// ---------------------------------------------------------------------------------------- start

window.addEventListener("hashchange", () => {
  state.suspectsAt = 0;
  poll();
});
document.addEventListener("visibilitychange", () => {
  if (!document.hidden) poll();
});
poll();
