// runrow demo page: plain JavaScript, no build step.
// Each turn is a run. Its answer streams over EventSource from /v1/runs/{id}/events.
// The last seq seen and the text so far are kept in sessionStorage, so a reload resumes
// the stream right after that seq: no gap, no duplicate.
// A run that asks for approval journals input_requested and waits (status "waiting");
// the page shows an approval card, rebuilt from the journal on a reload.
// With "steer" ticked, a message sent while a turn runs is read by that turn (its answer
// says so, where it read it) and its own card ends "absorbed".
"use strict";

const TERMINAL = new Set(["completed", "failed", "cancelled", "expired", "absorbed"]);
const ACTIVE = new Set(["running", "queued", "waiting"]);  // what Stop can stop
const EVENT_TYPES = ["user_message_created", "run_queued", "content_delta", "tool_call_started",
  "tool_call_finished", "input_requested", "input_provided", "message_done", "complete", "message",
  "steering_delivered", "children_awaited"];
const $ = (sel) => document.querySelector(sel);
const streams = new Map();  // run_id -> EventSource
const streamedHere = new Set();  // runs whose answer this page showed as it streamed
const toolsOf = new Map();  // run_id -> its tool calls, as last rendered
const approvalsOf = new Map();  // run_id -> [{key, request, expires_at, provided, value}]
// Counters a test (or a curious person) can read: both must stay 0.
window.__demo = { duplicates: 0, gaps: 0, resumed: {} };

const randomId = () => Math.random().toString(36).slice(2, 10);
const user = () => localStorage.getItem("runrow.demo.user");
const conversation = () => localStorage.getItem("runrow.demo.conversation");

function init() {
  const params = new URLSearchParams(location.search);
  if (params.get("user")) localStorage.setItem("runrow.demo.user", params.get("user"));
  if (params.get("conversation")) localStorage.setItem("runrow.demo.conversation", params.get("conversation"));
  if (!user()) localStorage.setItem("runrow.demo.user", "guest-" + randomId().slice(0, 4));
  if (!conversation()) localStorage.setItem("runrow.demo.conversation", "c-" + randomId());
  $("#user").value = user();
  $("#conversation").value = conversation();
  $("#user").addEventListener("change", (e) => switchTo(e.target.value.trim(), conversation()));
  $("#conversation").addEventListener("change", (e) => switchTo(user(), e.target.value.trim()));
  $("#new-conversation").addEventListener("click", () => switchTo(user(), "c-" + randomId()));
  $("#composer-form").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("#composer").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); send(); }
  });
  $("#stop").addEventListener("click", stop);
  updateStop();
  load();
}

function switchTo(u, c) {
  if (!u || !c) return;
  localStorage.setItem("runrow.demo.user", u);
  localStorage.setItem("runrow.demo.conversation", c);
  $("#user").value = u; $("#conversation").value = c;
  for (const es of streams.values()) es.close();
  streams.clear();
  toolsOf.clear();
  approvalsOf.clear();
  $("#turns").replaceChildren();
  $("#notes").replaceChildren();
  setTaken(false);
  updateStop();
  load();
}

async function api(method, path, body, headers = {}) {
  const res = await fetch(path, {
    method,
    headers: { "Authorization": "Bearer demo-" + user(), "Content-Type": "application/json", ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await res.json().catch(() => ({}));
  if (!res.ok) {
    const err = new Error((data.error && data.error.message) || res.statusText);
    err.status = res.status;
    throw err;
  }
  return data;
}

function showError(msg) { $("#error").textContent = msg || ""; }

// Stop is for turns that are running, queued or waiting: with none, it is disabled.
function updateStop() {
  $("#stop").disabled = ![...document.querySelectorAll(".turn .status")]
    .some((s) => ACTIVE.has(s.textContent));
}

// Another user's conversation: said at once (the API answers 403), and Send is disabled.
function setTaken(taken) {
  $("#send").disabled = taken;
  $("#composer").disabled = taken;
  if (taken) showError(`conversation ${conversation()} belongs to another user: pick another name or start a new conversation`);
}

// -- per-run state kept across reloads ---------------------------------------------------
const key = (runId) => "runrow.demo.run." + runId;
function saved(runId) {
  let s = null;
  try { s = JSON.parse(sessionStorage.getItem(key(runId))); } catch { s = null; }
  s = s || { seq: 0, text: "", tools: [] };
  s.approvals = s.approvals || [];
  s.children = s.children || {};  // sub-agents (a research turn): run_id -> {n, text, status}
  return s;
}
function save(runId, s) { sessionStorage.setItem(key(runId), JSON.stringify(s)); }

// -- rendering ----------------------------------------------------------------------------
function turnEl(runId) {
  let el = document.querySelector(`.turn[data-run-id="${runId}"]`);
  if (el) return el;
  el = document.createElement("article");
  el.className = "turn";
  el.dataset.runId = runId;
  el.innerHTML = `<div class="head"><div class="user"></div><span class="status"></span></div>
    <div class="tools"></div><div class="approvals"></div><div class="children"></div><div class="answer"></div><div class="error" hidden></div><div class="meta"></div>`;
  el.querySelector(".meta").textContent = "run " + runId;
  $("#turns").appendChild(el);
  $("#empty").hidden = true;
  return el;
}

// A queued turn a stop cancelled: its message went back to the composer and it never
// ran, so its card is one line saying so (no answer box left empty below it).
function markReturned(el) {
  const u = el.querySelector(".user");
  u.textContent = "(message returned to the composer)";
  u.classList.add("draft");
  el.classList.add("returned");
}

// A research turn's sub-agents: one panel each, from the tree's stream (events of runs
// other than the turn's own carry their run_id). Kept in sessionStorage with the turn.
function renderChildren(runId, children) {
  const box = turnEl(runId).querySelector(".children");
  const panels = Object.entries(children).sort((a, b) => a[1].n - b[1].n).map(([id, c]) => {
    const p = document.createElement("div");
    p.className = "child";
    p.dataset.runId = id;
    p.dataset.status = c.status;
    p.innerHTML = `<div class="child-head"><span class="child-name"></span> <span class="status"></span></div><div class="child-text"></div>`;
    p.querySelector(".child-name").textContent = `sub-agent ${c.n}`;
    p.querySelector(".status").textContent = c.status;
    p.querySelector(".child-text").textContent = c.text;
    return p;
  });
  box.replaceChildren(...panels);
}
function childEvent(st, data) {
  const c = st.children[data.run_id] || (st.children[data.run_id] = { n: Object.keys(st.children).length + 1, text: "", status: "queued" });
  if (data.type === "content_delta" && !data.stream) { c.text += data.delta; c.status = "running"; }
  else if (data.type === "complete") c.status = data.status;
}

// A steering message a running turn read: its card says which run read it.
function markAbsorbed(el, into) {
  el.classList.add("absorbed");
  el.querySelector(".meta").textContent = `run ${el.dataset.runId}, read by the running turn (run ${into})`;
}

function setStatus(runId, status) {
  const badge = turnEl(runId).querySelector(".status");
  if (TERMINAL.has(badge.textContent) && !TERMINAL.has(status)) return;  // terminal is sticky
  badge.textContent = status;
  badge.className = "status " + status;
  updateStop();
  if (status === "queued") watchPosition(runId);
  else showPosition(runId, status === "waiting" ? "waiting for your approval" : null);
  renderTools(runId);
  renderApprovals(runId);
}
const statusOf = (runId) => turnEl(runId).querySelector(".status").textContent;

// "you're #3": a queued turn's place in line, refreshed until it starts.
const watching = new Set();
function showPosition(runId, text) {
  const head = turnEl(runId).querySelector(".head");
  let el = head.querySelector(".position");
  if (!el) { el = document.createElement("span"); el.className = "position"; head.querySelector(".status").before(el); }
  el.textContent = text || "";
  el.hidden = !text;
}
async function watchPosition(runId) {
  if (watching.has(runId)) return;
  watching.add(runId);
  try {
    while (turnEl(runId).querySelector(".status").textContent === "queued") {
      const pos = await api("GET", `/v1/runs/${runId}/position`).catch(() => null);
      if (!pos || pos.status !== "queued" || pos.position === null) break;
      const wait = pos.estimated_wait_seconds;
      showPosition(runId, `you're ${pos.exact === false ? "about " : ""}#${pos.position}` + (wait ? ` (~${Math.ceil(wait)}s)` : ""));
      await new Promise((r) => setTimeout(r, 2000));
    }
  } finally {
    watching.delete(runId);
    const status = statusOf(runId);
    if (status !== "queued") showPosition(runId, status === "waiting" ? "waiting for your approval" : null);
  }
}

// Tool events use runrow's vocabulary: tool_call_started / tool_call_finished with
// tool_call_id and name. A reaped run's complete event lists the calls that never
// finished (uncertain_tool_calls): their side effect may or may not have happened.
// A call that waits for approval runs only once approved: until then it did not happen.
function renderTools(runId, tools) {
  if (tools !== undefined) toolsOf.set(runId, tools || []);
  const status = statusOf(runId);
  const asks = approvalsOf.get(runId) || [];
  turnEl(runId).querySelector(".tools").textContent = (toolsOf.get(runId) || []).map((t) => {
    const call = `${t.name}(${JSON.stringify(t.arguments)})`;
    const ask = asks.find((a) => a.request && a.request.tool_call_id === t.tool_call_id);
    const denied = ask && ask.provided && !(ask.value && ask.value.approved === true);
    if (denied) return `✗ ${call}: denied, not run`;
    if (t.result) return `✓ ${call} → ${JSON.stringify(t.result)}`;
    if (ask && !ask.provided) {
      return TERMINAL.has(status) ? `✗ ${call}: not run (no approval)` : `… ${call}: waiting for your approval`;
    }
    if (t.uncertain) return `⚠ ${call}: outcome unknown (the worker was lost)`;
    return `… ${call}`;
  }).join("\n");
}

// -- approvals (human in the loop) ------------------------------------------------------
// The agent asked: input_requested {key, request: {kind: "approval", tool, args, prompt},
// expires_at}; the answer: input_provided {key, value: {approved}}. Both are in the
// journal, so a reload (or a new tab, or a restarted server) draws the same card.
function approvalRequested(list, data) {
  const known = list.find((a) => a.key === data.key);
  if (known) { known.request = data.request; known.expires_at = data.expires_at ?? null; return; }
  list.push({ key: data.key, request: data.request, expires_at: data.expires_at ?? null, provided: false, value: null });
}
function approvalProvided(list, key, value) {
  const a = list.find((x) => x.key === key);
  if (a) { a.provided = true; a.value = value; }
}

function renderApprovals(runId) {
  const box = turnEl(runId).querySelector(".approvals");
  const status = statusOf(runId);
  const cards = (approvalsOf.get(runId) || [])
    .filter((a) => a.request && a.request.kind === "approval")
    .map((a) => approvalCard(runId, a, status));
  box.replaceChildren(...cards);
}

function approvalCard(runId, a, status) {
  const r = a.request;
  const card = document.createElement("div");
  card.className = "approval";
  card.dataset.key = a.key;
  card.innerHTML = `<div class="prompt"></div><code class="call"></code><div class="decision"></div>`;
  card.querySelector(".prompt").textContent = r.prompt || `Run ${r.tool}?`;
  card.querySelector(".call").textContent = `${r.tool}(${JSON.stringify(r.args ?? {})})`;
  const decision = card.querySelector(".decision");
  if (a.provided) {
    const approved = !!(a.value && a.value.approved === true);
    card.dataset.decision = approved ? "approved" : "denied";
    decision.textContent = approved ? "✓ approved" : "✗ denied";
  } else if (TERMINAL.has(status)) {
    card.dataset.decision = "none";
    decision.textContent = status === "expired" ? "expired: nobody answered in time, so it did not run"
      : `no answer: the run ended ${status}, so it did not run`;
  } else {
    card.dataset.decision = "pending";
    const until = a.expires_at ? ` (until ${new Date(a.expires_at).toLocaleTimeString()})` : "";
    decision.textContent = "waiting for your approval" + until;
    const buttons = document.createElement("div");
    buttons.className = "buttons";
    for (const [label, approved] of [["Approve", true], ["Deny", false]]) {
      const b = document.createElement("button");
      b.type = "button";
      b.className = approved ? "approve" : "deny";
      b.textContent = label;
      b.addEventListener("click", () => decide(runId, a.key, approved, card));
      buttons.appendChild(b);
    }
    card.appendChild(buttons);
  }
  return card;
}

// The answer goes to POST /v1/runs/{id}/input; repeating it is harmless (recorded: false).
async function decide(runId, inputKey, approved, card) {
  showError("");
  for (const b of card.querySelectorAll("button")) b.disabled = true;
  try {
    await api("POST", `/v1/runs/${runId}/input`, { key: inputKey, value: { approved } });
    const st = saved(runId);
    approvalProvided(st.approvals, inputKey, { approved });
    save(runId, st);
    approvalsOf.set(runId, st.approvals);
    renderTools(runId);
    renderApprovals(runId);
  } catch (err) {
    // 409: the run no longer waits for this (it expired, was stopped, or got another answer).
    showError(err.message);
    for (const b of card.querySelectorAll("button")) b.disabled = false;
  }
}

// Why a turn failed (e.g. "worker_lost: the worker stopped heartbeating ..."), under its answer.
function showRunError(runId, error) {
  const el = turnEl(runId).querySelector(".error");
  el.textContent = error ? `${error.type || "error"}: ${error.message || ""}` : "";
  el.hidden = !error;
}

function renderNotes(notes) {
  $("#notes").replaceChildren(...notes.map((n) => {
    const li = document.createElement("li"); li.textContent = n.text; return li;
  }));
}

// The tool's side effect is visible as soon as the call finishes, not when the turn does.
async function refreshNotes() {
  try {
    renderNotes((await api("GET", `/v1/conversations/${encodeURIComponent(conversation())}`)).notes);
  } catch (err) {
    showError(err.message);
  }
}

async function load() {
  showError("");
  let conv;
  try {
    conv = await api("GET", `/v1/conversations/${encodeURIComponent(conversation())}`);
  } catch (err) {
    if (err.status === 403) { $("#empty").hidden = false; $("#notes").replaceChildren(); setTaken(true); return; }
    showError(err.message); return;
  }
  setTaken(false);
  $("#empty").hidden = conv.turns.length > 0;
  for (const turn of conv.turns) {
    const run = turn.run;
    const el = turnEl(run.id);
    const userEl = el.querySelector(".user");
    if (turn.user_message === null) {
      markReturned(el);
    } else {
      userEl.textContent = typeof turn.user_message === "string" ? turn.user_message : JSON.stringify(turn.user_message);
    }
    const s = saved(run.id);
    // A finished turn's tool calls and approvals come with it (this tab may never have
    // seen them stream); a live turn's are what this tab has seen so far.
    approvalsOf.set(run.id, turn.inputs || s.approvals);
    toolsOf.set(run.id, turn.tool_calls || s.tools);
    setStatus(run.id, run.status);
    renderTools(run.id);
    renderApprovals(run.id);
    renderChildren(run.id, s.children);
    showRunError(run.id, run.error);
    if (run.status === "absorbed") markAbsorbed(el, run.absorbed_into);
    const answerEl = el.querySelector(".answer");
    if (streamedHere.has(run.id)) {
      // keep the streamed text: it is what this page received, event by event
    } else if (TERMINAL.has(run.status) && !streams.has(run.id)) {
      if (turn.answer) {
        answerEl.textContent = turn.answer.content;
        answerEl.classList.toggle("partial", turn.answer.status === "partial");
      }
    } else if (!streams.has(run.id)) {
      answerEl.textContent = s.text;  // what this tab had shown before a reload
      follow(run.id);
    }
  }
  renderNotes(conv.notes);
  updateStop();
}

// -- streaming ----------------------------------------------------------------------------
function follow(runId) {
  const s = saved(runId);
  if (s.seq > 0) window.__demo.resumed[runId] = s.seq;
  // The turn's whole tree (tree=true): a research turn's sub-agents stream in the same
  // stream, and its ids are the tree's positions (a turn without children: its own).
  const url = `/v1/runs/${runId}/events?tree=true&from=${s.seq}&access_token=${encodeURIComponent("demo-" + user())}`;
  const es = new EventSource(url);
  streams.set(runId, es);
  const onEvent = (msg) => {
    const seq = Number(msg.lastEventId);
    const st = saved(runId);
    if (seq <= st.seq) { window.__demo.duplicates += 1; return; }
    if (seq !== st.seq + 1) window.__demo.gaps += 1;
    st.seq = seq;
    const data = JSON.parse(msg.data);
    const el = turnEl(runId);
    if (data.run_id && data.run_id !== runId) {  // a sub-agent's event
      childEvent(st, data);
      renderChildren(runId, st.children);
      save(runId, st);
      return;
    }
    switch (data.type) {
      case "content_delta":
        if (!data.stream) { st.text += data.delta; el.querySelector(".answer").textContent = st.text; }
        setStatus(runId, "running");
        break;
      case "tool_call_started":
        st.tools.push({ tool_call_id: data.tool_call_id, name: data.name, arguments: data.arguments });
        renderTools(runId, st.tools); setStatus(runId, "running");
        break;
      case "tool_call_finished": {
        const t = st.tools.find((x) => x.tool_call_id === data.tool_call_id);
        if (t) t.result = data.result;
        renderTools(runId, st.tools); setStatus(runId, "running");
        refreshNotes();
        break;
      }
      case "children_awaited":
        setStatus(runId, "waiting");  // parked on its sub-agents: no worker held
        break;
      case "input_requested":
        approvalRequested(st.approvals, data);
        approvalsOf.set(runId, st.approvals);
        setStatus(runId, "waiting");
        break;
      case "input_provided":
        approvalProvided(st.approvals, data.key, data.value);
        approvalsOf.set(runId, st.approvals);
        setStatus(runId, "queued");  // until a worker picks the run up again
        break;
      case "complete":
        for (const u of data.uncertain_tool_calls || []) {
          const t = st.tools.find((x) => x.tool_call_id === u.tool_call_id);
          if (t) t.uncertain = true; else st.tools.push({ tool_call_id: u.tool_call_id, name: u.name, uncertain: true });
        }
        renderTools(runId, st.tools);
        setStatus(runId, data.status);
        if (data.status === "absorbed") markAbsorbed(el, data.into);
        el.querySelector(".answer").classList.toggle("partial", data.status !== "completed" && st.text !== "");
        showRunError(runId, data.error);
        break;
      default:
        if (seq > 2) setStatus(runId, "running");
    }
    save(runId, st);
    if (data.type === "complete") {
      streamedHere.add(runId);
      es.close();
      streams.delete(runId);
      load();  // refresh notes and other turns
    }
  };
  for (const type of EVENT_TYPES) es.addEventListener(type, onEvent);
  es.onerror = () => {
    // The browser reconnects by itself (sending Last-Event-ID) unless the server refused:
    // a 204 means the run finished with nothing left to send, so read where it ended.
    if (es.readyState === EventSource.CLOSED) {
      streams.delete(runId);
      api("GET", `/v1/runs/${runId}`).then((run) => {
        if (TERMINAL.has(run.status)) load();
        else showError(`lost the stream of run ${runId}; reload to resume`);
      }).catch((err) => showError(err.message));
    }
  };
}

async function send() {
  const box = $("#composer");
  const content = box.value.trim();
  if (!content) return;
  showError("");
  try {
    // A retried send with the same key would return the same run instead of a second one.
    const accepted = await api("POST", `/v1/conversations/${encodeURIComponent(conversation())}/messages`,
      { content, on_busy: $("#steer").checked ? "steer" : "enqueue" }, { "Idempotency-Key": crypto.randomUUID ? crypto.randomUUID() : randomId() + randomId() });
    box.value = "";
    const el = turnEl(accepted.run_id);
    el.querySelector(".user").textContent = content;
    setStatus(accepted.run_id, accepted.status);
    follow(accepted.run_id);
  } catch (err) {
    showError(err.message);
  }
}

async function stop() {
  showError("");
  try {
    const result = await api("POST", `/v1/conversations/${encodeURIComponent(conversation())}/stop`);
    for (const id of result.cancelled) setStatus(id, "cancelled");
    const drafts = result.drafts.map((d) => typeof d.content === "string" ? d.content : JSON.stringify(d.content));
    if (drafts.length) {
      const box = $("#composer");
      box.value = [...drafts, box.value.trim()].filter(Boolean).join("\n\n");
      box.focus();
    }
    for (const d of result.drafts) markReturned(turnEl(d.run_id));
    if (result.noop) showError("nothing to stop");
  } catch (err) {
    showError(err.message);
  }
}

init();
