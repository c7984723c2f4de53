// Rollbox trajectory viewer: the episode list with filters, and one
// episode's timeline and reward. Plain JavaScript, no dependencies: the page
// is embedded in the rollbox binary and works offline.
"use strict";

const END_COLORS = {
  finished: ["var(--ok)", "var(--ok-soft)"],
  max_turns: ["var(--warn)", "var(--warn-soft)"],
  context_overflow: ["var(--orange)", "var(--orange-soft)"],
  episode_timeout: ["var(--warn)", "var(--warn-soft)"],
  policy_error: ["var(--violet)", "var(--violet-soft)"],
  sandbox_error: ["var(--bad)", "var(--bad-soft)"],
  cancelled: ["var(--grey)", "var(--grey-soft)"],
  interrupted: ["var(--grey)", "var(--grey-soft)"],
  sandbox_abuse: ["var(--bad)", "var(--bad-soft)"],
  record_error: ["var(--violet)", "var(--violet-soft)"],
  running: ["var(--accent)", "var(--accent-soft)"],
};
const ERROR_COLORS = {
  bad_arguments: ["var(--orange)", "var(--orange-soft)"],
  unknown_tool: ["var(--orange)", "var(--orange-soft)"],
  timeout: ["var(--warn)", "var(--warn-soft)"],
  nonzero_exit: ["var(--bad)", "var(--bad-soft)"],
  oom: ["var(--violet)", "var(--violet-soft)"],
  output_truncated: ["var(--yellow)", "var(--yellow-soft)"],
  sandbox_error: ["var(--bad)", "var(--bad-soft)"],
  policy_error: ["var(--violet)", "var(--violet-soft)"],
  sandbox_abuse: ["var(--bad)", "var(--bad-soft)"],
  cancelled: ["var(--grey)", "var(--grey-soft)"],
};
// Reward-hacking monitors (agent/monitor), in the trajectory's order.
const MONITORS = ["test_tampering", "single_search_exit", "one_at_a_time_pruning", "repeated_calls",
  "judge_disagreement", "serial_collapse", "spurious_parallelism"];
const MONITOR_COLORS = ["var(--bad)", "var(--bad-soft)"];
const EVENT_COLORS = {
  tool_output_truncated: "var(--yellow)", context_truncated: "var(--yellow)", pruned: "var(--yellow)",
  context_overflow: "var(--bad)", prune_refused: "var(--bad)", read_refused: "var(--bad)",
};

const state = { list: null, filters: { rollout: "", task: "", min: "", max: "", error: "", monitor: "", ends: new Set(), text: "" }, selected: null };

// el builds an element: el("div", {class: "x", onclick: f}, child, "text", ...).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "style" && typeof v === "object") Object.assign(e.style, v);
    else if (k.startsWith("--")) e.style.setProperty(k, v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function badge(text, colors, extra) {
  const [c, s] = colors || ["var(--grey)", "var(--grey-soft)"];
  return el("span", Object.assign({ class: "badge", "--c": c, "--s": s }, extra || {}), text);
}
function endBadge(reason) { return badge(reason.replace(/_/g, " "), END_COLORS[reason], { "data-end": reason }); }
function errorBadge(kind, n) {
  return el("span", { class: "badge", "--c": (ERROR_COLORS[kind] || [])[0], "--s": (ERROR_COLORS[kind] || [])[1], "data-error": kind },
    kind.replace(/_/g, " "), n > 1 ? el("span", { class: "n" }, "×" + n) : null);
}
function monitorBadge(name, v) {
  return el("span", { class: "badge monitor", "--c": MONITOR_COLORS[0], "--s": MONITOR_COLORS[1], "data-monitor": name, title: "monitor " + name },
    "⚑ " + name.replace(/_/g, " "), v > 1 ? el("span", { class: "n" }, "×" + v) : null);
}
function rewardColor(v) { return v === null || v === undefined ? "var(--grey)" : v >= 1 ? "var(--ok)" : v > 0 ? "var(--warn)" : "var(--bad)"; }
function bar(v, cls, color) {
  const w = Math.max(0, Math.min(1, v || 0)) * 100;
  return el("span", { class: "bar " + (cls || ""), "--c": color || rewardColor(v) }, el("i", { style: { width: w + "%" } }));
}
function fmtReward(v) { return v === null || v === undefined ? "—" : (Math.round(v * 1000) / 1000).toString(); }
function fmtMS(ms) {
  if (ms < 1) return ms.toFixed(2) + " ms";
  if (ms < 1000) return Math.round(ms) + " ms";
  if (ms < 60000) return (ms / 1000).toFixed(1) + " s";
  return (ms / 60000).toFixed(1) + " min";
}
function lines(s) { return s ? s.replace(/\n$/, "").split("\n").length : 0; }
function bytesText(b) { if (b === undefined || b === null) return ""; return typeof b === "string" ? b : "[binary, " + (b.base64 || "").length + " base64 chars]"; }
function count(n, word) { return n + " " + word + (n === 1 ? "" : "s"); }

async function getJSON(url) {
  const r = await fetch(url, { cache: "no-store" });
  const body = await r.json();
  if (!r.ok) throw new Error((body.error && body.error.message) || r.statusText);
  return body;
}

// ---- the list ----

async function loadList() {
  state.list = await getJSON("/api/episodes");
  renderRun();
  renderFilterOptions();
  renderList();
}

// renderRun shows the run above the list: the one run, or the run picked
// among several (runs are never counted together), or how many there are.
function renderRun() {
  const run = document.getElementById("run");
  const l = state.list;
  const runs = l.runs || [];
  const picked = runs.find(r => r.rollout_id === state.filters.rollout) || (runs.length === 1 ? runs[0] : null);
  if (!picked) {
    run.replaceChildren(
      el("span", { class: "mono" }, l.dir),
      el("span", {}, el("b", {}, runs.length), " runs"),
      el("span", {}, el("b", {}, l.total), " episodes"),
      el("span", { class: "muted" }, "pick a run to see its reward"));
  } else {
    const r = picked.summary || {};
    const mean = r.reward_mean !== undefined ? r.reward_mean : picked.reward_mean;
    run.replaceChildren(...[
      el("span", {}, "run ", el("b", { class: "mono", "data-rollout": picked.rollout_id }, picked.rollout_id)),
      el("span", {}, el("b", {}, picked.episodes), " episodes"),
      el("span", {}, "reward mean ", el("b", {}, fmtReward(mean))),
      r.pass_rate !== undefined ? el("span", {}, "pass rate ", el("b", {}, fmtReward(r.pass_rate))) : null,
      r.wall_time_s !== undefined ? el("span", {}, "wall time ", el("b", {}, r.wall_time_s.toFixed(1) + " s")) : null,
      r.interrupted ? badge("interrupted", END_COLORS.interrupted) : null,
    ].filter(Boolean));
  }
  const sk = document.getElementById("skipped");
  sk.replaceChildren(...l.skipped.map(s => el("div", {}, "skipped " + s.file + ": " + s.error)));
}

function renderFilterOptions() {
  const runs = state.list.runs || [];
  const runRow = document.getElementById("f-run-row");
  runRow.hidden = runs.length < 2;
  const runSel = document.getElementById("f-run");
  const keepRun = state.filters.rollout;
  runSel.replaceChildren(el("option", { value: "" }, "all runs (" + runs.length + ")"),
    ...runs.map(r => el("option", { value: r.rollout_id, selected: r.rollout_id === keepRun },
      r.rollout_id + " (" + r.episodes + ", mean " + fmtReward(r.reward_mean) + ")")));
  const es = state.list.episodes.filter(e => !state.filters.rollout || e.rollout_id === state.filters.rollout);
  const tasks = {}, ends = {}, errs = {}, mons = {};
  for (const e of es) {
    tasks[e.task_id] = (tasks[e.task_id] || 0) + 1;
    ends[e.end] = (ends[e.end] || 0) + 1;
    for (const k of Object.keys(e.tool_errors || {})) errs[k] = (errs[k] || 0) + 1;
    for (const m of e.triggered || []) mons[m] = (mons[m] || 0) + 1;
  }
  const mon = document.getElementById("f-monitor");
  const keepMon = state.filters.monitor;
  mon.replaceChildren(el("option", { value: "" }, "any"),
    el("option", { value: "any", selected: keepMon === "any" }, "any fired (" + es.filter(e => (e.triggered || []).length).length + ")"),
    el("option", { value: "none", selected: keepMon === "none" }, "none fired"),
    ...MONITORS.filter(m => mons[m] || m === keepMon).map(m => el("option", { value: m, selected: m === keepMon }, m.replace(/_/g, " ") + " (" + (mons[m] || 0) + ")")));
  const task = document.getElementById("f-task");
  const keepTask = state.filters.task;
  task.replaceChildren(el("option", { value: "" }, "all tasks (" + Object.keys(tasks).length + ")"),
    ...Object.keys(tasks).sort().map(t => el("option", { value: t, selected: t === keepTask }, t + " (" + tasks[t] + ")")));
  const err = document.getElementById("f-error");
  const keepErr = state.filters.error;
  err.replaceChildren(el("option", { value: "" }, "any"),
    el("option", { value: "none", selected: keepErr === "none" }, "none"),
    ...Object.keys(errs).sort().map(k => el("option", { value: k, selected: k === keepErr }, k.replace(/_/g, " ") + " (" + errs[k] + ")")));
  const chips = document.getElementById("f-end");
  chips.replaceChildren(...Object.keys(ends).sort().map(reason => {
    const [c] = END_COLORS[reason] || ["var(--grey)"];
    return el("button", {
      type: "button", class: "chip", "data-end": reason, "aria-pressed": state.filters.ends.has(reason) ? "true" : "false",
      style: { color: c },
      onclick: () => {
        state.filters.ends.has(reason) ? state.filters.ends.delete(reason) : state.filters.ends.add(reason);
        renderFilterOptions(); renderList(); saveHash();
      },
    }, reason.replace(/_/g, " "), el("span", { class: "n" }, ends[reason]));
  }));
}

function matches(e) {
  const f = state.filters;
  if (f.rollout && e.rollout_id !== f.rollout) return false;
  if (f.task && e.task_id !== f.task) return false;
  if (f.ends.size && !f.ends.has(e.end)) return false;
  if (f.error === "none" && Object.keys(e.tool_errors || {}).length) return false;
  if (f.error && f.error !== "none" && !(e.tool_errors || {})[f.error]) return false;
  const fired = e.triggered || [];
  if (f.monitor === "any" && !fired.length) return false;
  if (f.monitor === "none" && fired.length) return false;
  if (f.monitor && f.monitor !== "any" && f.monitor !== "none" && !fired.includes(f.monitor)) return false;
  if (f.min !== "" && (e.reward === null || e.reward < parseFloat(f.min))) return false;
  if (f.max !== "" && (e.reward === null || e.reward > parseFloat(f.max))) return false;
  if (f.text) {
    const t = f.text.toLowerCase();
    if (!(e.id.toLowerCase().includes(t) || (e.end_message || "").toLowerCase().includes(t) || e.task_id.toLowerCase().includes(t))) return false;
  }
  return true;
}

function renderList() {
  const shown = state.list.episodes.filter(matches);
  document.getElementById("count").textContent = "showing " + shown.length + " of " + state.list.total;
  const ol = document.getElementById("episodes");
  ol.replaceChildren(...shown.map(e => {
    const [c] = END_COLORS[e.end] || ["var(--grey)"];
    const errs = Object.entries(e.tool_errors || {}).sort();
    return el("li", {
      class: "ep" + (e.id === state.selected ? " selected" : ""), "data-episode-id": e.id, "--c": c, tabindex: "0",
      onclick: () => openEpisode(e.id), onkeydown: ev => { if (ev.key === "Enter") openEpisode(e.id); },
    },
      el("div", { class: "ep-task" }, e.task_id, el("span", { class: "muted" }, " #" + e.group_index)),
      el("div", { class: "ep-reward", title: e.reward_error ? "unscored: " + e.reward_error : "reward" }, bar(e.reward),
        el("span", { class: "reward-value" }, e.reward_error ? "unscored" : fmtReward(e.reward))),
      el("div", { class: "ep-id" }, e.id),
      (state.list.runs || []).length > 1 && !state.filters.rollout ? el("div", { class: "ep-run muted mono" }, "run " + e.rollout_id) : null,
      el("div", { class: "ep-meta" },
        endBadge(e.end),
        ...errs.map(([k, n]) => errorBadge(k, n)),
        e.reward_error ? badge(e.reward_error.replace(/_/g, " "), ERROR_COLORS.policy_error, { "data-reward-error": e.reward_error }) : null,
        ...(e.triggered || []).map(m => monitorBadge(m, (e.monitors || {})[m])),
        e.truncations && !(e.tool_errors || {}).output_truncated ? badge("truncated ×" + e.truncations, ERROR_COLORS.output_truncated) : null,
        el("span", { class: "muted" }, count(e.turns, "turn") + " · " + count(e.tool_calls, "call") + " · " + fmtMS(e.duration_ms))),
    );
  }));
}

function bindFilters() {
  const f = state.filters;
  const on = (id, key) => document.getElementById(id).addEventListener("input", ev => { f[key] = ev.target.value; renderList(); saveHash(); });
  document.getElementById("f-run").addEventListener("input", ev => {
    f.rollout = ev.target.value; renderRun(); renderFilterOptions(); renderList(); saveHash();
  });
  on("f-task", "task"); on("f-min", "min"); on("f-max", "max"); on("f-error", "error"); on("f-monitor", "monitor"); on("f-text", "text");
  document.getElementById("f-clear").addEventListener("click", () => {
    Object.assign(f, { rollout: "", task: "", min: "", max: "", error: "", monitor: "", text: "" }); f.ends.clear();
    for (const id of ["f-min", "f-max", "f-text"]) document.getElementById(id).value = "";
    renderRun(); renderFilterOptions(); renderList(); saveHash();
  });
}

// ---- the URL: #/e/ID?rollout=...&task=...&end=a,b&error=...&min=&max= ----

function saveHash() {
  const f = state.filters, q = new URLSearchParams();
  if (f.rollout) q.set("rollout", f.rollout);
  if (f.task) q.set("task", f.task);
  if (f.ends.size) q.set("end", [...f.ends].join(","));
  if (f.error) q.set("error", f.error);
  if (f.monitor) q.set("monitor", f.monitor);
  if (f.min !== "") q.set("min", f.min);
  if (f.max !== "") q.set("max", f.max);
  const h = "#/" + (state.selected ? "e/" + encodeURIComponent(state.selected) : "") + (q.toString() ? "?" + q : "");
  if (location.hash !== h) history.replaceState(null, "", h);
}

function readHash() {
  const h = location.hash.replace(/^#\/?/, "");
  const [path, query] = h.split("?");
  const q = new URLSearchParams(query || "");
  const f = state.filters;
  f.rollout = q.get("rollout") || ""; f.task = q.get("task") || ""; f.error = q.get("error") || ""; f.monitor = q.get("monitor") || ""; f.min = q.get("min") || ""; f.max = q.get("max") || "";
  f.ends = new Set((q.get("end") || "").split(",").filter(Boolean));
  document.getElementById("f-min").value = f.min; document.getElementById("f-max").value = f.max;
  return path.startsWith("e/") ? decodeURIComponent(path.slice(2)) : null;
}

// ---- one episode ----

async function openEpisode(id) {
  state.selected = id;
  saveHash();
  for (const li of document.querySelectorAll(".ep")) {
    li.classList.toggle("selected", li.dataset.episodeId === id);
    if (li.dataset.episodeId === id) li.scrollIntoView({ block: "nearest" });
  }
  const detail = document.getElementById("detail");
  detail.replaceChildren(el("div", { class: "empty" }, "loading " + id + " …"));
  let t;
  try {
    t = await getJSON("/api/episodes/" + encodeURIComponent(id));
  } catch (err) {
    detail.replaceChildren(el("div", { class: "error-box" }, "Could not load " + id + ": " + err.message));
    return;
  }
  if (state.selected !== id) return;
  detail.replaceChildren(renderEpisode(t));
  detail.scrollTop = 0;
}

function renderEpisode(t) {
  const term = t.termination || { reason: "running", step: t.steps.length - 1 };
  const reward = t.reward;
  const sb = t.sandbox || {};
  const st = t.stats || {};
  const errs = Object.entries(st.tool_errors || {}).sort();
  const root = el("article", { class: "episode", "data-episode-id": t.episode_id });

  root.append(el("div", { class: "head" },
    el("div", {},
      el("h1", {}, t.task_id),
      el("div", { class: "id" }, t.episode_id),
      el("div", { class: "tags" }, endBadge(term.reason), ...errs.map(([k, n]) => errorBadge(k, n)),
        ...MONITORS.filter(m => monitorValue(t.monitors, m) > 0).map(m => monitorBadge(m, monitorValue(t.monitors, m))),
        badge(sb.backend || "?"), t.policy && t.policy.kind ? badge("policy " + t.policy.kind) : null,
        t.source ? el("span", { id: "source-badge" }, badge("source " + t.source)) : null,
        t.outcomes ? el("span", { id: "outcome-badge" }, badge("outcome " + t.outcomes.status)) : null),
      t.parent ? el("div", { class: "parent", id: "parent" }, "sub-agent " + t.parent.index + " of stage " + t.parent.stage + " of ",
        el("a", { href: "#e/" + encodeURIComponent(t.parent.episode_id) }, t.parent.episode_id),
        " (its step " + t.parent.step + ") · frozen: never trained on, never rewarded") : null),
    el("div", { class: "score", id: "reward" },
      el("div", { class: "label" }, "reward"),
      el("div", { class: "value", id: "reward-total", style: { color: rewardColor(reward ? reward.total : null) } },
        !reward ? "not scored" : reward.total === null ? "unscored" : fmtReward(reward.total)),
      bar(reward ? reward.total : 0, "big"))));

  const cards = el("div", { class: "cards" });
  // The reward broken down.
  const rc = el("section", { class: "card", id: "reward-card" }, el("h3", {}, "Reward"));
  if (reward) {
    if (reward.total === null) {
      rc.append(el("div", { class: "error-box", id: "reward-error" }, "Unscored (" + (reward.error_kind || "?").replace(/_/g, " ") +
        "): the reward could not be computed; the episode is left out of means and advantages, never counted 0."));
    }
    const comps = Object.entries(reward.components || {}).sort();
    for (const [k, v] of comps) {
      rc.append(el("div", { class: "component", "data-name": k }, el("span", {}, k.replace(/_/g, " ")), el("span", { class: "v" }, fmtReward(v)), bar(v)));
    }
    if (!comps.length) rc.append(el("div", { class: "muted" }, "no components"));
    if (reward.details && reward.details.length) rc.append(el("ul", { class: "details-list" }, ...reward.details.map(d => el("li", {}, d))));
    const v = reward.verifier;
    if (v) {
      const out = bytesText(v.stdout) + (bytesText(v.stderr) ? (bytesText(v.stdout) ? "\n" : "") + "[stderr]\n" + bytesText(v.stderr) : "");
      rc.append(el("div", { style: { marginTop: "10px" } },
        el("div", { class: "tl-head" }, el("span", { class: "muted" }, "verifier"), el("code", {}, v.command),
          badge("exit " + v.exit_code, v.exit_code === 0 ? END_COLORS.finished : ERROR_COLORS.nonzero_exit),
          v.timed_out ? badge("timed out", ERROR_COLORS.timeout) : null, el("span", { class: "muted" }, fmtMS(v.duration_ms))),
        v.removed && v.removed.length ? el("div", { class: "files" }, "removed before verifying: " + v.removed.join(", ")) : null,
        v.restored && v.restored.length ? el("div", { class: "files" }, "restored: " + v.restored.join(", ")) : null,
        out ? el("details", { class: "out" }, el("summary", {}, "verifier output (" + count(lines(out), "line") + ")"), el("pre", { class: "output" }, out)) : null));
    }
    if (reward.judge) rc.append(judgeSection(reward.judge));
    if (reward.workspace) {
      const w = reward.workspace;
      rc.append(el("details", { class: "out", id: "workspace-diff" }, el("summary", {}, "workspace diff (" + count(w.files.length, "file") + ", " + w.bytes + " bytes" + (w.dropped ? ", " + w.dropped + " cut" : "") + ")"),
        el("div", { class: "files" }, ...w.files.map(f => el("div", {}, f.status + " " + f.path))),
        el("pre", { class: "output" }, w.diff)));
    }
  } else {
    rc.append(el("div", { class: "muted" }, "This episode was not scored: it ended " + term.reason.replace(/_/g, " ") + ", which is not the model's doing."));
  }
  cards.append(rc);
  if (t.monitors) cards.append(monitorCard(t.monitors));
  if (t.outcomes) cards.append(outcomeCard(t.outcomes));
  if (t.import || (t.redactions && t.redactions.length)) cards.append(importCard(t));
  if (t.subagents || st.critical_steps !== undefined) cards.append(subagentCard(t));

  // How it ended.
  cards.append(el("section", { class: "card", id: "end-card" }, el("h3", {}, "End"),
    el("dl", { class: "kv" },
      el("dt", {}, "reason"), el("dd", {}, endBadge(term.reason)),
      term.message ? [el("dt", {}, "message"), el("dd", {}, term.message)] : null,
      el("dt", {}, "at step"), el("dd", {}, String(term.step)),
      term.answer !== undefined && term.answer !== null ? [el("dt", {}, "answer"), el("dd", {}, el("code", {}, term.answer))] : null,
      term.ids && term.ids.length ? [el("dt", {}, "ids"), el("dd", {}, el("code", {}, term.ids.join(", ")))] : null,
      el("dt", {}, "duration"), el("dd", {}, fmtMS(st.duration_ms || 0) + " (model " + fmtMS(st.policy_ms || 0) + ", tools " + fmtMS(st.tool_ms || 0) + ")"),
      el("dt", {}, "tokens"), el("dd", {}, (st.prompt_tokens || 0) + " prompt · " + (st.completion_tokens || 0) + " completion"))));

  // The sandbox as it ran.
  let limits = "";
  if (sb.limits) limits = "cpus " + sb.limits.cpus + " · " + sb.limits.memory_mb + " MB · pids " + sb.limits.pids + " · disk " + sb.limits.disk_mb + " MB";
  cards.append(el("section", { class: "card" }, el("h3", {}, "Sandbox & policy"),
    el("dl", { class: "kv" },
      el("dt", {}, "backend"), el("dd", {}, sb.backend || "?"),
      sb.image ? [el("dt", {}, "image"), el("dd", {}, sb.image)] : null,
      sb.image_digest ? [el("dt", {}, "digest"), el("dd", { class: "mono" }, sb.image_digest.slice(0, 19))] : null,
      sb.runtime ? [el("dt", {}, "runtime"), el("dd", {}, sb.runtime)] : null,
      el("dt", {}, "network"), el("dd", {}, sb.network || "?"),
      limits ? [el("dt", {}, "limits"), el("dd", {}, limits)] : null,
      el("dt", {}, "policy"), el("dd", {}, [t.policy.kind, t.policy.model, t.policy.endpoint].filter(Boolean).join(" · ")),
      el("dt", {}, "seed"), el("dd", {}, String(t.seed)),
      el("dt", {}, "started"), el("dd", {}, new Date(t.started_at).toLocaleString()))));
  root.append(cards);

  root.append(el("h2", { class: "section" }, "Timeline · " + count(st.turns || 0, "turn") + " · " + count(st.tool_calls || 0, "tool call")));
  root.append(renderTimeline(t));
  return root;
}

// outcomeCard shows an imported episode's outcome status and its signals.
function outcomeCard(o) {
  const c = el("section", { class: "card", id: "outcome-card" }, el("h3", {}, "Outcome signals"),
    el("div", { class: "muted", id: "outcome-status" }, o.status === "scored"
      ? "scored" + (o.scored_at ? " at " + new Date(o.scored_at).toLocaleString() : "")
      : "pending: the window closes at " + new Date(o.matures_at).toLocaleString() + "; no reward until then"));
  for (const s of o.signals || []) {
    c.append(el("div", { class: "component", "data-signal": s.name, "data-late": s.late ? "true" : "false" },
      el("span", {}, s.name.replace(/_/g, " ") + (s.source ? " · " + s.source : "") + (s.at ? " · " + s.at : "") + (s.late ? " · late (not in the reward)" : "")),
      el("span", { class: "v" }, s.raw !== undefined ? JSON.stringify(s.raw) : String(s.value))));
  }
  if (!(o.signals || []).length) c.append(el("div", { class: "muted" }, "no signal yet"));
  return c;
}

// importCard shows where an imported episode came from and what was
// redacted from it (kinds, places, counts: never the text).
function importCard(t) {
  const i = t.import || {};
  return el("section", { class: "card", id: "import-card" }, el("h3", {}, "Import"),
    el("dl", { class: "kv" },
      el("dt", {}, "source"), el("dd", {}, t.source || "?"),
      i.external_id ? [el("dt", {}, "caller's id"), el("dd", { class: "mono" }, i.external_id)] : null,
      i.format ? [el("dt", {}, "format"), el("dd", {}, i.format)] : null,
      i.policy_version ? [el("dt", {}, "policy version"), el("dd", {}, i.policy_version)] : null,
      i.group_by ? [el("dt", {}, "grouped by"), el("dd", {}, i.group_by + " " + (i.group_key || ""))] : null,
      i.imported_at ? [el("dt", {}, "imported"), el("dd", {}, new Date(i.imported_at).toLocaleString())] : null,
      i.missing && i.missing.length ? [el("dt", {}, "replay needs"), el("dd", {}, i.missing.join(", "))] : null),
    ...(t.redactions || []).map(r => el("div", { class: "component", "data-redaction": r.kind },
      el("span", {}, "redacted " + r.kind.replace(/_/g, " ") + " at " + r.path), el("span", { class: "v" }, "×" + r.count))));
}

// subagentCard shows an orchestrator episode's tree: per stage (one
// spawn_subagents call), the orchestrator's turns up to it and each
// sub-agent with its end, steps and answer as the orchestrator saw it; the
// critical path (each stage's longest sub-agent) is marked, and the
// critical steps are summed as they were computed.
function subagentCard(t) {
  const st = t.stats || {};
  const subs = t.subagents || [];
  const c = el("section", { class: "card", id: "subagents-card" }, el("h3", {}, "Sub-agents · critical path"));
  c.append(el("div", { class: "component", id: "critical-steps" }, el("span", {}, "critical steps"), el("span", { class: "v" }, String(st.critical_steps)),
    el("span", { class: "muted" }, "of " + st.total_steps + " steps in all · " + count(subs.length, "sub-agent"))));
  const stages = new Map();
  for (const sa of subs) {
    if (!stages.has(sa.stage)) stages.set(sa.stage, []);
    stages.get(sa.stage).push(sa);
  }
  // The orchestrator's turns in each stage: those up to its spawn call.
  const turnOf = new Map(t.steps.map(s => [s.index, s.turn]));
  let prevTurn = -1, sum = [];
  const tree = el("ol", { class: "tree", id: "subagent-tree" });
  for (const [stage, list] of [...stages.entries()].sort((a, b) => a[0] - b[0])) {
    const turn = turnOf.get(list[0].step);
    const own = turn === undefined ? 0 : turn - prevTurn;
    if (turn !== undefined) prevTurn = turn;
    const longest = Math.max(0, ...list.map(sa => sa.steps));
    sum.push(own + "+" + longest);
    tree.append(el("li", { class: "stage", "data-stage": stage },
      el("div", { class: "tl-head" }, el("b", {}, "stage " + stage), el("span", { class: "muted" }, "step " + list[0].step + " · orchestrator " + count(own, "turn") + " + longest sub-agent " + count(longest, "step"))),
      el("ul", {}, ...list.map(sa => el("li", { class: "sub" + (sa.critical ? " critical" : ""), "data-subagent": sa.episode_id, "data-critical": sa.critical ? "true" : "false" },
        sa.critical ? el("span", { class: "crit", title: "on the critical path" }, "★") : el("span", { class: "crit" }, ""),
        sa.file ? el("a", { href: "#e/" + encodeURIComponent(sa.episode_id) }, "#" + sa.index) : el("span", {}, "#" + sa.index),
        endBadge(sa.end), el("span", { class: "muted" }, count(sa.steps, "step")),
        sa.useful ? badge("useful", END_COLORS.finished) : sa.finished ? badge("answered") : badge("no output", ERROR_COLORS.nonzero_exit),
        sa.truncated ? badge("answer cut " + sa.answer.length + " of " + sa.answer_bytes + " bytes", ERROR_COLORS.output_truncated) : null,
        el("span", { class: "prompt", title: sa.prompt }, sa.prompt),
        el("code", { class: "answer" }, sa.answer === "" ? "(no answer)" : sa.answer))))));
  }
  const rest = (st.turns || 0) - (prevTurn + 1);
  if (stages.size) sum.push(String(rest));
  c.append(tree);
  if (stages.size) c.append(el("div", { class: "muted", id: "critical-sum" }, "critical steps = " + sum.join(" + ") + " (after the last stage) = " + st.critical_steps));
  else c.append(el("div", { class: "muted" }, "no sub-agent was spawned: every step was the orchestrator's"));
  return c;
}

function monitorValue(ms, name) {
  if (!ms || ms[name] === undefined) return undefined;
  const v = ms[name];
  return v === true ? 1 : v === false ? 0 : v;
}

// monitorCard lists the monitors that apply to the episode: fired ones
// first, then those that stayed at 0.
function monitorCard(ms) {
  const c = el("section", { class: "card", id: "monitor-card" }, el("h3", {}, "Monitors"));
  const names = MONITORS.filter(m => ms[m] !== undefined);
  names.sort((a, b) => (monitorValue(ms, b) > 0) - (monitorValue(ms, a) > 0));
  for (const m of names) {
    const v = ms[m];
    c.append(el("div", { class: "component", "data-monitor": m, "data-fired": monitorValue(ms, m) > 0 ? "true" : "false" },
      el("span", {}, m.replace(/_/g, " ")), el("span", { class: "v", style: { color: monitorValue(ms, m) > 0 ? "var(--bad)" : "var(--ok)" } }, String(v))));
  }
  if (!names.length) c.append(el("div", { class: "muted" }, "none applies"));
  return c;
}

// judgeSection shows a judge reward: each rubric's score and each judge's,
// with every sample's answer a click away.
function judgeSection(j) {
  const box = el("div", { id: "judge", style: { marginTop: "10px" } },
    el("div", { class: "tl-head" }, el("span", { class: "muted" }, "judges"), el("b", {}, j.score === null ? "unscored" : fmtReward(j.score)),
      el("span", { class: "muted" }, j.aggregate + " over judges · " + count(j.calls, "answer") + " · " + j.cache_hits + " cached · spread " + fmtReward(j.spread) + " · " + fmtMS(j.duration_ms))));
  if (j.error) box.append(el("div", { class: "tl-err" }, j.error));
  for (const r of j.rubrics || []) {
    const cut = (r.views || []).filter(v => v.dropped).map(v => v.kind + " cut " + v.dropped + " of " + v.bytes + " bytes");
    box.append(el("div", { class: "component", "data-rubric": r.name },
      el("span", {}, r.name + " ×" + r.weight), el("span", { class: "v" }, r.score === null ? "—" : fmtReward(r.score)), bar(r.score),
      el("span", { class: "muted" }, Object.entries(r.by_judge || {}).map(([k, v]) => k + " " + fmtReward(v)).join(" · ") + (cut.length ? " · " + cut.join(", ") : ""))));
  }
  for (const js of j.judges || []) {
    const samples = [];
    for (const rs of js.rubrics || []) for (const [i, s] of (rs.samples || []).entries()) samples.push([rs.rubric, i, s]);
    box.append(el("details", { class: "out", "data-judge": js.name },
      el("summary", {}, js.name + " (" + js.model + "): " + (js.score === null ? "unscored" : fmtReward(js.score))),
      ...samples.map(([rubric, i, s]) => el("div", { class: "sample", "data-rubric": rubric },
        el("div", { class: "tl-head" }, el("b", {}, rubric + (samples.length > (js.rubrics || []).length ? " #" + (i + 1) : "")),
          s.score === null ? badge("failed", ERROR_COLORS.nonzero_exit) : el("span", {}, (s.raw || "") + " → " + fmtReward(s.score)),
          s.cached ? badge("cached") : null, s.attempts > 1 ? badge(s.attempts + " attempts", ERROR_COLORS.timeout) : null,
          el("span", { class: "muted" }, fmtMS(s.latency_ms || 0))),
        s.reason ? el("div", { class: "tl-text" }, s.reason) : null,
        s.error ? el("div", { class: "tl-err" }, s.error) : null,
        el("pre", { class: "output" }, s.text || "")))));
  }
  return box;
}

function renderTimeline(t) {
  const events = {};
  for (const e of t.context_events || []) (events[e.step] = events[e.step] || []).push(e);
  const maxTool = Math.max(1, ...t.steps.filter(s => s.type === "tool").map(s => s.duration_ms || 0));
  const maxModel = Math.max(1, ...t.steps.filter(s => s.type === "model").map(s => s.duration_ms || 0));
  const ol = el("ol", { class: "timeline", id: "timeline" });
  for (const s of t.steps) {
    ol.append(s.type === "model" ? modelItem(s, maxModel) : s.type === "user" ? userItem(s) : toolItem(s, maxTool));
    for (const e of events[s.index] || []) ol.append(eventItem(e));
  }
  const term = t.termination;
  if (term) {
    const [c] = END_COLORS[term.reason] || ["var(--grey)"];
    ol.append(el("li", { class: "tl end", "--c": c, "data-type": "end" }, el("span", { class: "dot" }),
      el("div", { class: "tl-card", "--c": c }, el("div", { class: "tl-head" }, el("span", { class: "tl-title" }, "End"), endBadge(term.reason),
        term.message ? el("span", { class: "muted" }, term.message) : null))));
  }
  return ol;
}

function timing(ms, max, color) {
  return el("span", { class: "tl-time" }, bar(ms / max, "", color), fmtMS(ms || 0));
}

function modelItem(s, max) {
  const u = s.usage;
  return el("li", { class: "tl model", "--c": "var(--model)", "data-type": "model", "data-index": s.index }, el("span", { class: "dot" }),
    el("div", { class: "tl-card" },
      el("div", { class: "tl-head" }, el("span", { class: "tl-title" }, "Turn " + s.turn), el("span", { class: "muted" }, "model · step " + s.index),
        u ? el("span", { class: "muted" }, u.prompt_tokens + "+" + u.completion_tokens + " tokens" + (u.estimated ? " (est.)" : "")) : null,
        s.attempts > 1 ? badge(s.attempts + " attempts", ERROR_COLORS.timeout) : null,
        timing(s.duration_ms, max, "var(--model)")),
      s.content ? el("div", { class: "tl-text" }, s.content) : null,
      s.tool_calls && s.tool_calls.length ? el("div", { class: "calls" }, ...s.tool_calls.map(c =>
        el("span", { class: "call", title: c.arguments }, el("b", {}, c.name), " " + c.arguments))) : null));
}

// userItem is a later user (or system) message of an imported conversation.
function userItem(s) {
  return el("li", { class: "tl user", "--c": "var(--grey)", "data-type": "user", "data-index": s.index }, el("span", { class: "dot" }),
    el("div", { class: "tl-card" },
      el("div", { class: "tl-head" }, el("span", { class: "tl-title" }, s.name || "user"), el("span", { class: "muted" }, "step " + s.index)),
      s.content ? el("div", { class: "tl-text" }, s.content) : null));
}

function toolItem(s, max) {
  const kind = s.error_kind;
  let color = "var(--ok)";
  if (kind) color = (ERROR_COLORS[kind] || ["var(--bad)"])[0];
  const args = typeof s.arguments === "string" ? s.arguments : JSON.stringify(s.arguments);
  const status = s.exit_code !== null && s.exit_code !== undefined
    ? badge("exit " + s.exit_code, s.exit_code === 0 ? END_COLORS.finished : ERROR_COLORS.nonzero_exit)
    : badge(s.ok === false ? "failed" : "ok", s.ok === false ? ERROR_COLORS.nonzero_exit : END_COLORS.finished);
  const out = s.output || "";
  const outLines = lines(out);
  const last = out.replace(/\n$/, "").split("\n").slice(-1)[0] || "";
  const pre = el("pre", { class: "output" });
  // Highlight the marker where the output was cut for the model.
  const m = out.match(/\n\[\.\.\. output truncated: \d+ bytes omitted \.\.\.\]\n/);
  if (m) {
    pre.append(out.slice(0, m.index), el("span", { class: "trunc" }, m[0]), out.slice(m.index + m[0].length));
  } else {
    pre.append(out);
  }
  const streams = [];
  const so = bytesText(s.stdout), se = bytesText(s.stderr);
  if (se && (s.stdout_stored_dropped || s.stderr_stored_dropped || s.truncated)) {
    streams.push(el("details", { class: "out" }, el("summary", {}, "full stdout and stderr as stored"),
      el("pre", { class: "output" }, so + (se ? "\n[stderr]\n" + se : ""))));
  }
  return el("li", { class: "tl tool" + (kind ? " has-error" : ""), "--c": color, "data-type": "tool", "data-index": s.index, "data-error": kind || "" },
    el("span", { class: "dot" }),
    el("div", { class: "tl-card", "--c": kind ? color : "var(--line)" },
      el("div", { class: "tl-head" }, el("span", { class: "tl-title" }, s.name), el("span", { class: "tl-args", title: args }, args),
        status, kind ? errorBadge(kind) : null, s.truncated && kind !== "output_truncated" ? badge("truncated", ERROR_COLORS.output_truncated) : null,
        s.timed_out ? badge("timed out", ERROR_COLORS.timeout) : null, s.oom_killed ? badge("OOM", ERROR_COLORS.oom) : null,
        timing(s.duration_ms, max, color)),
      s.error && kind !== "nonzero_exit" ? el("div", { class: "tl-err" }, s.error) : null,
      s.files ? el("div", { class: "files" }, ...Object.entries(s.files).map(([p, h]) => el("div", {}, "wrote " + p + "  sha256:" + h.slice(0, 12)))) : null,
      out ? el("div", { class: "preview" }, last) : null,
      out ? el("details", { class: "out" }, el("summary", {}, "output (" + count(outLines, "line") + ", " + out.length + " bytes" + (s.bytes_dropped ? ", " + s.bytes_dropped + " not shown to the model" : "") + ")"), pre) : null,
      ...streams));
}

function eventItem(e) {
  const c = EVENT_COLORS[e.kind] || "var(--ink-3)";
  return el("li", { class: "tl event", "--c": c, "data-type": "event", "data-kind": e.kind }, el("span", { class: "dot" }),
    el("div", { class: "tl-card" }, el("div", { class: "event-line", "--c": c }, el("b", {}, e.kind.replace(/_/g, " ")), " ",
      e.detail || "", e.ids && e.ids.length ? el("span", { class: "muted" }, " [" + e.ids.join(", ") + "]") : null)));
}

// ---- start ----

async function main() {
  bindFilters();
  const open = readHash();
  try {
    await loadList();
  } catch (err) {
    document.getElementById("detail").replaceChildren(el("div", { class: "error-box" }, "Could not load the episodes: " + err.message));
    return;
  }
  document.body.dataset.ready = "true";
  if (open) openEpisode(open);
  window.addEventListener("hashchange", () => {
    const id = readHash();
    renderFilterOptions(); renderList();
    if (id && id !== state.selected) openEpisode(id);
  });
}
main();
