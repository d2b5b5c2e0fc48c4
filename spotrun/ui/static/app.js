// spotrun dashboard: reads /api/status, /api/audit, /api/budgets and /api/page/<id> (the CLI's --json views);
// on the team server also /api/session (who is logged in) and, for admins, /api/trail.
"use strict";
window.spotrun = { spendChart: null, page: null, session: undefined };
const POLL_MS = 2000;
const $ = (html) => { const t = document.createElement("template"); t.innerHTML = html.trim(); return t.content; };
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const usd = (v) => v == null ? "-" : (Math.abs(v) >= 10 ? v.toFixed(2) : v.toFixed(4));
const pct = (v) => v == null ? "-" : (v * 100).toFixed(1) + "%";
const hours = (v) => v == null ? "-" : v.toFixed(3);
const dur = (s) => { if (s == null) return "-"; const neg = s < 0; s = Math.abs(s);
  const h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60); return (neg ? "-" : "") + h + "h" + String(m).padStart(2, "0"); };
const ts = (iso) => iso ? Date.parse(iso) / 1000 : null;
const secs = (v) => v == null ? "?" : (Math.abs(v) < 100 ? v.toFixed(1) + "s"
  : Math.floor(v / 60) + "m" + String(Math.round(v % 60)).padStart(2, "0") + "s");
// Lost steps: "-" while it runs or if it never ran, "?" when no report gave its last step.
const lostSteps = (t) => t.lost_steps != null ? String(t.lost_steps)
  : (t.started_at_market && t.ended_at_market ? "?" : "-");
const PARTS = [["detection_s", "detection"], ["waiting_s", "waiting"], ["launch_s", "launch"],
  ["boot_s", "boot"], ["restore_s", "restore"], ["first_step_s", "first step"]];
// Time to resume after the reclaim before this attempt: the total, then every part.
const resumeCell = (t) => !t.time_to_resume ? "-" : `<span class="resume" title="${esc(PARTS.map(([k, l]) =>
  l + " " + secs(t.time_to_resume[k])).join(", "))}">${secs(t.time_to_resume.total_s)}</span>
  <span class="dim">(${PARTS.map(([k]) => secs(t.time_to_resume[k])).join(" + ")})</span>`;
const terminal = (st) => ["succeeded", "failed", "cancelled", "budget_exhausted"].includes(st);

async function getJSON(url) {
  const r = await fetch(url, { credentials: "same-origin" });
  // The team server's session ended (logout elsewhere, expiry, revoked token): log in again.
  if (r.status === 401 && window.spotrun.session) {
    location.assign("/login?next=" + encodeURIComponent(location.pathname));
  }
  if (!r.ok) throw new Error(url + ": " + r.status);
  return r.json();
}

// Who is logged in, and the logout form with its CSRF token; null under `spotrun ui` (no login there).
async function sessionBar() {
  const r = await fetch("/api/session", { credentials: "same-origin" });
  if (!r.ok) return null;
  const s = await r.json();
  const logout = s.csrf ? `<form method="post" action="/logout" class="logout" id="logout">
    <input type="hidden" name="csrf" value="${esc(s.csrf)}"><button type="submit" id="logout-button">log out</button></form>` : "";
  document.querySelector("header").append($(`${logout}<span id="who" class="dim">${esc(s.user)} (${esc(s.role)})</span>`));
  return s;
}

// The action trail's newest rows, newest first (admins on the team server).
function trailTable(rows) {
  const body = rows.slice(-50).reverse().map((t) => `<tr data-trail="${t.id}"><td class="l mono">${esc(String(t.at).slice(0, 19))}</td>
    <td class="l">${esc(t.user || "-")}</td><td class="l">${esc(t.action)}</td><td class="l">${esc(t.target)}</td>
    <td class="l state-${t.outcome === "ok" ? "succeeded" : "failed"}">${esc(t.outcome)}</td><td class="l">${esc(t.remote_addr)}</td>
    <td class="l wrap">${esc(t.detail)}</td></tr>`).join("");
  return `<h1>action trail</h1><table id="trail"><thead><tr><th class="l">at (UTC)</th><th class="l">user</th>
    <th class="l">action</th><th class="l">target</th><th class="l">outcome</th><th class="l">from</th><th class="l">detail</th>
    </tr></thead><tbody>${body}</tbody></table>`;
}

function setClock(clock) {
  if (!clock) return;
  document.getElementById("clock").textContent = clock.provider_clock === "market"
    ? "times: market clock (up to x" + clock.time_scale + " the wall)" : "times: provider clock";
}

// Spend against each project and owner budget (= spotrun budgets --json); nothing without [budgets].
function budgetTable(budgets) {
  if (!budgets.length) return "";
  const rows = budgets.map((b) => {
    const used = Math.min(Math.max(b.used_fraction, 0), 1);
    return `<tr data-budget="${esc(b.scope + ":" + b.name)}"><td class="l">${esc(b.scope)} ${esc(b.name)}</td>
      <td class="l">${esc(b.period === "total" ? "total" : b.period_key)}</td><td>${usd(b.budget_usd)}</td>
      <td class="spent">${usd(b.spent_usd)}</td><td>${usd(b.committed_usd)}</td>
      <td class="${b.left_usd < 0 ? "state-failed" : ""}">${usd(b.left_usd)}</td>
      <td><span class="bar"><span style="width:${Math.round(used * 100)}%"></span></span> ${pct(b.used_fraction)}</td>
      <td>${b.running_jobs.length}</td><td>${b.queued_jobs}</td></tr>`;
  }).join("");
  return `<h1>budgets</h1><table id="budgets"><thead><tr><th class="l">budget</th><th class="l">period</th>
    <th>budget $</th><th>spent $</th><th>committed $</th><th>left $</th><th>used</th><th>running</th><th>queued</th>
    </tr></thead><tbody>${rows}</tbody></table>`;
}

async function jobList() {
  const admin = window.spotrun.session && window.spotrun.session.role === "admin";
  const [jobs, audits, budgets, trail] = await Promise.all([getJSON("/api/status"), getJSON("/api/audit"),
    getJSON("/api/budgets"), admin ? getJSON("/api/trail") : null]);
  const byId = Object.fromEntries(audits.map((a) => [a.id, a]));
  if (jobs.length) setClock(jobs[0].clock);
  const rows = jobs.map((j) => {
    const a = byId[j.id] || {};
    const prog = j.total_steps ? j.step / j.total_steps : null;
    return `<tr data-job="${esc(j.id)}"><td class="l"><a href="/job/${encodeURIComponent(j.id)}">${esc(j.id)}</a></td>
      <td class="l state-${esc(j.state)}">${esc(j.state)}</td>
      <td class="l">${esc(j.project)}</td><td class="l">${esc(j.owner)}</td>
      <td><span class="bar"><span style="width:${prog == null ? 0 : Math.round(prog * 100)}%"></span></span>
        ${j.total_steps ? j.step + "/" + j.total_steps : j.step}</td>
      <td>${usd(a.actual_usd)}</td><td>${usd(a.baseline_on_demand_usd)}</td>
      <td>${usd(a.saved_usd)} (${pct(a.saved_fraction)})</td><td>${j.reclaims}</td>
      <td>${j.deadline_headroom_s_market == null ? "-" : dur(j.deadline_headroom_s_market)}</td>
      <td>${j.budget_headroom_usd == null ? "-" : usd(j.budget_headroom_usd)}</td></tr>`;
  }).join("");
  const app = document.getElementById("app");
  app.replaceChildren($(`${budgetTable(budgets)}<h1>jobs</h1>
    <table id="jobs"><thead><tr><th class="l">job</th><th class="l">state</th><th class="l">project</th>
    <th class="l">owner</th><th>progress</th>
    <th>spend $</th><th>baseline $</th><th>saved $</th><th>reclaims</th>
    <th>deadline left</th><th>budget left $</th></tr></thead><tbody>${rows}</tbody></table>
    ${jobs.length ? "" : '<p class="dim">no jobs yet: spotrun submit job.yaml</p>'}${trail ? trailTable(trail) : ""}`));
  document.getElementById("live").textContent = "· updated " + new Date().toLocaleTimeString();
  return !jobs.every((j) => terminal(j.state));
}

function timeline(st) {
  const atts = st.attempts.filter((a) => a.started_at_market);
  if (!atts.length) return '<p class="dim">no attempt has started yet</p>';
  const pools = [...new Set(atts.map((a) => `${a.instance_type} ${a.zone} ${a.market}`))];
  const now = Date.now() / 1000;
  const t0 = Math.min(...atts.map((a) => ts(a.started_at_market)));
  const t1 = Math.max(...atts.map((a) => ts(a.ended_at_market) ?? now), t0 + 1);
  const W = 900, L = 230, lane = 26, H = pools.length * lane + 24;
  const x = (t) => L + (t - t0) / (t1 - t0) * (W - L - 10);
  let svg = `<svg id="timeline" width="${W}" height="${H}" role="img" aria-label="attempts by pool">`;
  pools.forEach((p, i) => { svg += `<text x="4" y="${i * lane + 17}">${esc(p)}</text>`; });
  for (const a of atts) {
    const pool = `${a.instance_type} ${a.zone} ${a.market}`, i = pools.indexOf(pool);
    const s = ts(a.started_at_market), e = ts(a.ended_at_market) ?? now;
    svg += `<rect class="attempt ${esc(a.market)}" data-attempt="${a.number}" data-pool="${esc(pool)}"
      data-market="${esc(a.market)}" x="${x(s)}" y="${i * lane + 4}" width="${Math.max(x(e) - x(s), 2)}"
      height="${lane - 8}"><title>attempt ${a.number}: ${esc(pool)}, ${esc(a.end_reason || a.state)},
      resumed from ${a.resumed_from}, ran to ${a.ran_to ?? "?"}, lost steps ${lostSteps(a)}</title></rect>`;
    svg += `<text x="${x(s) + 3}" y="${i * lane + 17}" style="fill:#fff">${a.number}</text>`;
    if (a.notice_at_market) {
      const n = x(ts(a.notice_at_market)), y = i * lane + 2;
      svg += `<path class="notice" data-attempt="${a.number}" d="M${n - 5},${y} L${n + 5},${y} L${n},${y + 8} Z"><title>notice</title></path>`;
    }
    if (a.end_reason === "reclaimed") {
      svg += `<line class="reclaim" data-attempt="${a.number}" x1="${x(e)}" x2="${x(e)}" y1="${i * lane + 1}" y2="${i * lane + lane - 1}"><title>reclaimed</title></line>`;
    }
  }
  svg += `<text x="${L}" y="${H - 4}">${new Date(t0 * 1000).toISOString().slice(0, 19)}Z</text>`;
  svg += `<text x="${W - 150}" y="${H - 4}">${new Date(t1 * 1000).toISOString().slice(0, 19)}Z</text></svg>`;
  return svg + `<div class="legend dim"><span><i class="sw" style="background:#2b7bd6"></i>spot</span>
    <span><i class="sw" style="background:#e67e22"></i>on-demand</span><span><i class="sw" style="background:#f1c40f"></i>notice</span>
    <span><i class="sw" style="background:#c0392b"></i>reclaim</span></div>`;
}

// Both curves on one x grid (uPlot wants aligned data): linear between points, flat after.
function aligned(a, b) {
  const xs = [...new Set([...a, ...b].map((p) => p[0]))].sort((p, q) => p - q);
  const at = (pts, x) => {
    if (!pts.length || x < pts[0][0]) return pts.length ? 0 : null;
    for (let i = pts.length - 1; i >= 0; i--) {
      if (pts[i][0] <= x) {
        const n = pts[i + 1];
        if (!n || n[0] === pts[i][0]) return pts[i][1];
        return pts[i][1] + (n[1] - pts[i][1]) * (x - pts[i][0]) / (n[0] - pts[i][0]);
      }
    }
    return null;
  };
  return [xs, xs.map((x) => at(a, x)), xs.map((x) => at(b, x))];
}

function drawSpend(el, page) {
  const data = aligned(page.spend_curve_market, page.baseline_curve_market);
  if (window.spotrun.spendChart) window.spotrun.spendChart.destroy();
  const marks = page.reclaims_market;
  window.spotrun.spendChart = new uPlot({
    width: 900, height: 260, scales: { x: { time: true } },
    series: [{ label: page.clock.provider_clock + " time" },
             { label: "actual $", stroke: "#2b7bd6", width: 2, value: (u, v) => usd(v) },
             { label: "on-demand baseline $", stroke: "#e67e22", dash: [6, 4], width: 2, value: (u, v) => usd(v) }],
    axes: [{}, { label: "cumulative USD" }],
    hooks: { draw: [(u) => { const c = u.ctx; c.save(); c.strokeStyle = "#c0392b"; c.lineWidth = 1.5;
      for (const t of marks) { const px = u.valToPos(t, "x", true);
        c.beginPath(); c.moveTo(px, u.bbox.top); c.lineTo(px, u.bbox.top + u.bbox.height); c.stroke(); }
      c.restore(); }] },
  }, data, el);
}

function causes(a) {
  const rows = Object.entries(a.causes).map(([k, w]) =>
    `<tr data-cause="${esc(k)}"><td>${esc(k.replaceAll("_", " "))}</td><td>${usd(w.usd)}</td><td>${hours(w.hours)}</td>
     <td>${a.actual_usd > 0 ? pct((w.usd || 0) / a.actual_usd) : "-"}</td></tr>`).join("");
  return `<table id="causes"><thead><tr><th>cause</th><th>$</th><th>h (${a.hours_clock})</th><th>share</th></tr></thead>
    <tbody>${rows}<tr><td><b>= actual</b></td><td id="causes-total"><b>${usd(a.causes_total_usd)}</b></td><td></td><td></td></tr>
    <tr class="dim"><td>not charged: free reclaims (first hour)</td><td>(${usd(a.not_charged.usd)})</td><td>${hours(a.not_charged.hours)}</td><td></td></tr>
    <tr class="dim"><td>hindsight optimum (what-if, not spent)</td><td>(${usd(a.hindsight_optimal_usd)})</td><td></td><td></td></tr></tbody></table>`;
}

// Times inside an event's text come from the provider (a notice's time): say so.
const marketTimes = (text, clock) => clock.provider_clock === "provider" ? text
  : String(text ?? "").replace(/\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?/g, (m) => m + " (market)");

async function jobPage(id) {
  const page = await getJSON("/api/page/" + encodeURIComponent(id));
  window.spotrun.page = page;
  const st = page.status, a = page.audit;
  setClock(page.clock);
  const attRows = st.attempts.map((t) => `<tr data-attempt="${t.number}"><td>${t.number}</td>
    <td class="l">${esc(t.instance_type)} ${esc(t.zone)} ${esc(t.market)}</td><td>${t.price_usd_per_hour.toFixed(3)}</td>
    <td class="l">resumed from ${t.resumed_from}, ran to ${t.ran_to ?? "?"}</td><td class="l">${esc(t.end_reason || t.state)}</td>
    <td class="lost">${lostSteps(t)}</td><td class="l ttr">${resumeCell(t)}</td>
    <td class="l notice">${esc(t.notice_outcome || "-")}</td></tr>`).join("");
  const evRows = (st.events || []).slice(-60).reverse().map((e) =>
    `<tr><td class="l mono">${esc((e.ts_wall || "").slice(11, 19))}</td><td class="l">${esc(e.kind)}</td><td class="l">${esc(marketTimes(e.detail, page.clock))}</td></tr>`).join("");
  const app = document.getElementById("app");
  app.replaceChildren($(`<h1 id="job-id" class="mono">${esc(st.id)}</h1>
    <div><span class="card">state<b class="state-${esc(st.state)}" id="job-state">${esc(st.state)}</b></span>
    <span class="card">project<b id="job-project">${esc(st.project)}</b></span>
    <span class="card">owner<b id="job-owner">${esc(st.owner)}</b></span>
    <span class="card">progress<b>${st.total_steps ? st.step + "/" + st.total_steps : st.step}</b></span>
    <span class="card">spend<b id="job-spend">$${usd(a.actual_usd)}</b></span>
    <span class="card">on-demand baseline<b>$${usd(a.baseline_on_demand_usd)}</b></span>
    <span class="card">saved<b>$${usd(a.saved_usd)} (${pct(a.saved_fraction)})</b></span>
    <span class="card">reclaims<b>${st.reclaims}</b></span>
    <span class="card">deadline headroom<b>${st.deadline_headroom_s_market == null ? "-" : dur(st.deadline_headroom_s_market)}</b></span>
    <span class="card">budget headroom<b>${st.budget_headroom_usd == null ? "-" : "$" + usd(st.budget_headroom_usd)}</b></span></div>
    <h2>attempts by pool (${esc(page.clock.provider_clock)} time)</h2>${timeline(st)}
    <table id="attempts"><thead><tr><th>#</th><th class="l">pool</th><th>$/h</th><th class="l">steps</th><th class="l">end</th>
    <th>lost steps</th><th class="l">to resume</th><th class="l">notice</th></tr></thead><tbody>${attRows}</tbody></table>
    <p class="dim" id="resume-legend">to resume: from the reclaim before the attempt to its first new step, ${esc(page.clock.provider_clock)}-clock seconds
    (${PARTS.map(([, l]) => l).join(" + ")}; ? = not known). Lost steps: finished steps the next attempt computed again (? = no report named the last step).</p>
    <h2>cumulative spend against the on-demand baseline</h2><div id="spend"></div>
    <h2>where the money went</h2>${causes(a)}
    <h2>events (wall clock)</h2><table id="events"><tbody>${evRows}</tbody></table>
    <h2>log tail</h2><pre class="log" id="log">${esc(page.log_tail)}</pre>`));
  drawSpend(document.getElementById("spend"), page);
  const log = document.getElementById("log"); log.scrollTop = log.scrollHeight;
  document.getElementById("live").textContent = "· " + (terminal(st.state) ? "final" : "live") + ", updated " + new Date().toLocaleTimeString();
  return !terminal(st.state);
}

async function main() {
  const m = location.pathname.match(/^\/job\/([^/]+)$/);
  const view = m ? () => jobPage(decodeURIComponent(m[1])) : jobList;
  let again = true;
  try {
    if (window.spotrun.session === undefined) window.spotrun.session = await sessionBar();
    again = await view();
  } catch (e) {
    document.getElementById("app").replaceChildren($(`<p class="state-failed">${esc(e.message)}</p>`));
  }
  document.body.dataset.ready = "1";
  if (again) setTimeout(main, POLL_MS);
}
main();
