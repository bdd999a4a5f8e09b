// pinboard dashboard: polls /dashboard/api/state every two seconds and
// renders it; actions POST to /dashboard/api/push (workers) and
// /dashboard/api/inspect/act (storage) with the session's CSRF token in a
// header; the storage inspector reads /dashboard/api/inspect/{ids,show}. No framework, no build step: this file is served as is.
"use strict";

const POLL_MS = 2000;
const HISTORY = 60; // samples kept per namespace for the charts (two minutes)
const csrf = document.querySelector('meta[name="csrf"]').content;
const history = new Map(); // ns -> [{t, requests, errors, buckets}]
let bucketBounds = [];
let timer = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function secs(ms) { return (ms / 1000).toFixed(1) + " s"; }
function short(session) { return session.slice(0, 12); }

function status(text) { document.getElementById("status").textContent = text; }

async function post(path, body) {
  const res = await fetch(path, {
    method: "POST",
    credentials: "same-origin",
    headers: { "content-type": "application/json", "x-pinboard-csrf": csrf },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (res.status === 401) { location.reload(); return null; }
  const text = await res.text();
  let detail = text;
  try { detail = JSON.parse(text).detail || text; } catch (_) { /* not JSON */ }
  if (!res.ok) throw new Error(detail || res.statusText);
  return text;
}

// One confirmation dialog for every action; resolves to the deadline
// (a number, or null for none) or undefined when cancelled.
function confirmAction(text, deadline) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  const input = document.getElementById("confirm-deadline");
  const label = document.getElementById("confirm-deadline-label");
  const wantsDeadline = deadline !== undefined;
  input.classList.toggle("hidden", !wantsDeadline);
  label.classList.toggle("hidden", !wantsDeadline);
  input.value = wantsDeadline && deadline !== null ? String(deadline) : "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      if (dialog.returnValue !== "ok") return resolve(undefined);
      if (!wantsDeadline) return resolve(null);
      const v = input.value.trim();
      resolve(v === "" ? null : Number(v));
    }, { once: true });
    dialog.returnValue = "";
    dialog.showModal();
  });
}

async function act(text, defaultDeadline, build, done) {
  const deadline = await confirmAction(text, defaultDeadline);
  if (deadline === undefined) return;
  try {
    await post("/dashboard/api/push", build(deadline));
    status(done);
  } catch (e) {
    status("refused: " + e.message);
  }
  poll();
}

function renderWorkers(workers) {
  document.getElementById("worker-count").textContent = `(${workers.length})`;
  const body = document.querySelector("#workers tbody");
  body.replaceChildren(...workers.map((w) => {
    const state = w.draining ? "draining" : "serving";
    const toggle = w.draining
      ? el("button", { class: "undrain", type: "button", onclick: () => act(`Undrain ${w.sessionId}?`, undefined, () => ({ type: "undrain", sessionId: w.sessionId }), `undrained ${short(w.sessionId)}`) }, "Undrain")
      : el("button", { class: "drain danger", type: "button", onclick: () => act(`Drain ${w.sessionId} (${w.advertiseUrl})? It takes no new ids; its instances are aborted at the deadline.`, 30, (d) => ({ type: "drain", sessionId: w.sessionId, deadline: d }), `drained ${short(w.sessionId)}`) }, "Drain");
    return el("tr", { "data-session": w.sessionId },
      el("td", { class: "mono", title: w.sessionId }, short(w.sessionId)),
      el("td", {}, w.hostname || "–"),
      el("td", {}, w.env || "–"),
      el("td", { class: "mono" }, w.advertiseUrl),
      el("td", {}, w.namespaces.join(", ")),
      el("td", { class: "num" }, w.headroom),
      el("td", { class: "num instances" }, w.instances),
      el("td", { class: "num" }, secs(w.expiresInMs)),
      el("td", { class: "num" }, secs(w.lastHeartbeatAgoMs) + " ago"),
      el("td", { class: "state state-" + state }, state),
      el("td", {}, toggle));
  }));
}

function renderPlacements(page) {
  document.getElementById("placement-count").textContent =
    page.matched > page.placements.length ? `(${page.placements.length} of ${page.matched})` : `(${page.matched})`;
  const body = document.querySelector("#placements tbody");
  body.replaceChildren(...page.placements.map((p) => el("tr", { "data-key": p.ns + "/" + p.id },
    el("td", {}, p.ns),
    el("td", { class: "mono" }, p.id),
    el("td", { class: "mono owner", title: p.sessionId }, short(p.sessionId)),
    el("td", {}, p.hostname || "–"),
    el("td", { class: "mono" }, p.epoch),
    el("td", {}, p.tag || "–"),
    el("td", {}, p.live ? "yes" : "no"),
    el("td", {}, p.live ? el("button", { class: "wind-down", type: "button", onclick: () => act(`Wind down ${p.ns}/${p.id} on ${short(p.sessionId)}? It finishes in-flight work and releases its placement by the deadline.`, 30, (d) => ({ type: "wind_down", sessionId: p.sessionId, ns: p.ns, id: p.id, deadline: d === null ? 30 : d }), `winding down ${p.ns}/${p.id}`) }, "Wind down") : ""))));
}

function renderMoves(moves) {
  const body = document.querySelector("#moves tbody");
  body.replaceChildren(...moves.map((m) => el("tr", {},
    el("td", {}, new Date(m.atMs).toLocaleTimeString()),
    el("td", { class: "mono" }, m.ns + "/" + m.id),
    el("td", { class: "mono", title: m.from }, short(m.from)),
    el("td", { class: "mono", title: m.to }, short(m.to)),
    el("td", { class: "mono" }, m.epoch),
    el("td", {}, m.reason.replaceAll("_", " ") + (m.by === "sweeper" ? " (sweeper wake)" : "")))));
  if (moves.length === 0) body.append(el("tr", {}, el("td", { colSpan: 6, class: "hint" }, "nothing moved yet")));
}

function renderSweeper(s) {
  const rows = [
    ["Enabled", s.enabled ? "yes (--database-url)" : "no (no --database-url)"],
    ["Holder", !s.enabled ? "–" : s.heldHere ? "this node" : "another node (or none)"],
    ["Laps", s.laps],
    ["Last lap", s.lastLapAgoMs === null ? "never" : secs(s.lastLapAgoMs) + " ago"],
    ["Alarms delivered", s.alarmsDelivered],
    ["Wakes", s.wakes],
    ["Failures", s.failures],
  ];
  document.getElementById("sweeper").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

// p99 of the requests that fell in `buckets` (counts per bound, then the rest).
function p99(buckets) {
  const total = buckets.reduce((a, b) => a + b, 0);
  if (total === 0) return null;
  let seen = 0;
  for (let i = 0; i < buckets.length; i++) {
    seen += buckets[i];
    if (seen >= total * 0.99) return i < bucketBounds.length ? bucketBounds[i] : Infinity;
  }
  return Infinity;
}

function series(samples) {
  const out = { rate: [], errors: [], p99: [] };
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1], b = samples[i];
    const dt = (b.t - a.t) / 1000;
    const dr = b.requests - a.requests;
    out.rate.push(dt > 0 ? dr / dt : 0);
    out.errors.push(dr > 0 ? (b.errors - a.errors) / dr : 0);
    out.p99.push(p99(b.buckets.map((n, j) => n - a.buckets[j])) || 0);
  }
  return out;
}

function sparkline(values, color) {
  const canvas = el("canvas", { width: 180, height: 36 });
  const ctx = canvas.getContext("2d");
  const finite = values.map((v) => (Number.isFinite(v) ? v : 0));
  const max = Math.max(1e-9, ...finite);
  ctx.fillStyle = "#f6f8fa";
  ctx.fillRect(0, 0, 180, 36);
  if (finite.length === 1) {
    ctx.fillStyle = color;
    ctx.fillRect(0, 35 - (finite[0] / max) * 33 - 1, 3, 3);
  }
  ctx.strokeStyle = color;
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  finite.forEach((v, i) => {
    // Spread over the full width once two minutes are sampled; fill from the left until then.
    const x = (i / Math.max(1, Math.max(finite.length, 20) - 1)) * 178 + 1;
    const y = 35 - (v / max) * 33;
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  });
  ctx.stroke();
  return canvas;
}

function renderTraffic(traffic, nowMs) {
  for (const row of traffic) {
    const samples = history.get(row.ns) || [];
    samples.push({ t: nowMs, requests: row.requests, errors: row.errors, buckets: row.buckets });
    while (samples.length > HISTORY) samples.shift();
    history.set(row.ns, samples);
  }
  const cards = traffic.map((row) => {
    const s = series(history.get(row.ns));
    const last = (xs) => (xs.length ? xs[xs.length - 1] : 0);
    const p = last(s.p99);
    return el("div", { class: "chart-card", "data-ns": row.ns, "data-samples": String(history.get(row.ns).length) },
      el("h3", {}, row.ns),
      el("div", { class: "chart" },
        el("span", {}, "req/s ", el("b", {}, last(s.rate).toFixed(1))), sparkline(s.rate, "#0b62d6"),
        el("span", {}, "errors ", el("b", {}, (last(s.errors) * 100).toFixed(1) + "%")), sparkline(s.errors, "#c62828"),
        el("span", {}, "p99 ", el("b", {}, p === Infinity ? "> 30 s" : "≤ " + p + " ms")), sparkline(s.p99, "#b35900")));
  });
  const box = document.getElementById("traffic");
  if (cards.length === 0) box.replaceChildren(el("p", { class: "hint" }, "no requests yet"));
  else box.replaceChildren(...cards);
}

function searchParams() {
  const params = new URLSearchParams();
  for (const name of ["ns", "tag", "id"]) {
    const v = document.getElementById("search-" + name).value.trim();
    if (v) params.set(name, v);
  }
  return params;
}

async function poll() {
  clearTimeout(timer);
  try {
    const res = await fetch("/dashboard/api/state?" + searchParams(), { credentials: "same-origin" });
    if (res.status === 401) { location.reload(); return; }
    if (!res.ok) {
      let detail = res.statusText;
      try { detail = (await res.json()).detail || detail; } catch (_) { /* not JSON */ }
      throw new Error(detail);
    }
    const state = await res.json();
    bucketBounds = state.latencyBucketsMs;
    renderWorkers(state.workers);
    renderPlacements(state.placements);
    renderMoves(state.moves);
    renderSweeper(state.sweeper);
    renderTraffic(state.traffic, state.nowMs);
    document.getElementById("updated").textContent = "updated " + new Date(state.nowMs).toLocaleTimeString();
  } catch (e) {
    document.getElementById("updated").textContent = "cannot reach pinboard: " + e.message;
  }
  timer = setTimeout(poll, POLL_MS);
}

// The storage inspector: a page of ids, one id's rows, its controls.
let inspectAfter = null;

async function getJson(path, params) {
  const res = await fetch(path + "?" + new URLSearchParams(params), { credentials: "same-origin" });
  if (res.status === 401) { location.reload(); return null; }
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(body.detail || res.statusText);
  return body;
}

function flag(on) { return el("td", { class: on ? "flag-yes" : "" }, on ? "yes" : "–"); }

async function inspectList(after) {
  const ns = document.getElementById("inspect-ns").value.trim();
  if (!ns) return;
  const params = { ns, filter: document.getElementById("inspect-filter").value };
  if (after) params.after = after;
  try {
    const page = await getJson("/dashboard/api/inspect/ids", params);
    if (!page) return;
    inspectAfter = page.next;
    document.getElementById("inspect-next").classList.toggle("hidden", !page.next);
    document.getElementById("inspect-count").textContent = `(${page.ids.length} on this page)`;
    document.querySelector("#inspect-ids tbody").replaceChildren(...page.ids.map((s) => el("tr", { "data-id": s.id },
      el("td", { class: "mono" }, s.id),
      el("td", { class: "num" }, s.rows),
      el("td", { class: "mono" }, s.epoch === null ? "–" : s.epoch),
      flag(s.marked), flag(s.parked), flag(s.paused),
      el("td", {}, s.alarmAtMs === null ? "–" : new Date(s.alarmAtMs).toLocaleString() + (s.alarmDue ? " (due)" : "")),
      el("td", {}, el("button", { class: "inspect-show", type: "button", onclick: () => inspectShow(ns, s.id) }, "Show")))));
  } catch (e) {
    status("storage: " + e.message);
  }
}

async function inspectAct(ns, id, action, tray, key, text) {
  if ((await confirmAction(text)) === undefined) return;
  try {
    await post("/dashboard/api/inspect/act", tray ? { ns, id, action, tray, key } : { ns, id, action });
    status(`${action} ${ns}/${id}: done`);
  } catch (e) {
    status(`${action} ${ns}/${id} refused: ` + e.message);
  }
  await inspectShow(ns, id);
  await inspectList(null);
}

async function inspectShow(ns, id) {
  const box = document.getElementById("inspect-detail");
  try {
    const v = await getJson("/dashboard/api/inspect/show", { ns, id });
    if (!v) return;
    const owner = v.placement ? `owner ${short(v.placement.owner)} at epoch ${v.placement.epoch}` : "not placed";
    const paused = v.paused !== null;
    const head = el("h3", { "data-id": id },
      el("span", { class: "mono" }, `${ns}/${id}`),
      el("span", { class: "hint" }, `${v.rows} rows · stored epoch ${v.epoch === null ? "–" : v.epoch} · ${owner}` + (paused ? ` · paused by ${v.paused.by}` : "")),
      paused
        ? el("button", { class: "inspect-resume", type: "button", onclick: () => inspectAct(ns, id, "resume", null, null, `Resume ${ns}/${id}? It activates again on its next request.`) }, "Resume")
        : el("button", { class: "inspect-pause danger", type: "button", onclick: () => inspectAct(ns, id, "pause", null, null, `Pause ${ns}/${id}? It is closed now and refuses activation until resumed.`) }, "Pause"),
      el("button", { class: "inspect-delete danger", type: "button", onclick: () => inspectAct(ns, id, "delete", null, null, `Delete every row of ${ns}/${id}? This cannot be undone.`) }, "Delete state"));
    const trays = el("table", { id: "inspect-trays" },
      el("thead", {}, el("tr", {}, ...["Tray", "Key", "Marked", "Parked", "Attempts", "Fields", "Dead letters", ""].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...v.trays.map((t) => el("tr", { "data-tray": t.tray + "/" + t.key },
        el("td", { class: "mono" }, t.tray),
        el("td", { class: "mono" }, t.key),
        flag(t.marked), flag(t.parked),
        el("td", { class: "num" }, t.attempts),
        el("td", { class: "mono fields" }, JSON.stringify(t.fields).slice(0, 400)),
        el("td", { class: "num dead" }, t.dead.length),
        el("td", {},
          t.parked ? el("button", { class: "inspect-unpark", type: "button", onclick: () => inspectAct(ns, id, "unpark", t.tray, t.key, `Unpark ${t.tray}/${t.key} of ${ns}/${id}? Its head item is delivered afresh.`) }, "Unpark") : "",
          " ",
          el("button", { class: "inspect-skip danger", type: "button", onclick: () => inspectAct(ns, id, "skip", t.tray, t.key, `Skip the head item of ${t.tray}/${t.key} of ${ns}/${id}? It goes to the tray's dead letters unhandled.`) }, "Skip head"))))));
    const alarm = v.alarm ? el("p", { class: "hint" }, `alarm at ${new Date(v.alarm.atMs).toLocaleString()}` + (v.alarm.due ? " (due)" : "") + `; schedules ${JSON.stringify(v.alarm.schedules)}`) : "";
    box.replaceChildren(head, trays, alarm);
  } catch (e) {
    box.replaceChildren(el("p", { class: "error" }, e.message));
  }
}

document.getElementById("inspect-form").addEventListener("submit", (e) => { e.preventDefault(); inspectList(null); });
document.getElementById("inspect-next").addEventListener("click", () => inspectList(inspectAfter));

document.getElementById("search").addEventListener("input", () => poll());
document.getElementById("search").addEventListener("submit", (e) => { e.preventDefault(); poll(); });
document.getElementById("logout").addEventListener("click", async () => {
  try { await post("/dashboard/logout"); } catch (_) { /* the session is gone either way */ }
  location.href = "/dashboard";
});
poll();
