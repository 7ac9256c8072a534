// runrow admin: the run page's live journal, read from the run's event stream in
// runrow's format (id = seq, event = type, data = the event's fields). Read with fetch
// rather than EventSource, so that every event type shows (an EventSource delivers only
// the types it was told to listen for); it reconnects with Last-Event-ID like one, and
// stops at the terminal event or a 204 (the run ended and nothing follows).
"use strict";
(function () {
  const list = document.getElementById("journal");
  if (!list) return;
  const live = document.getElementById("live-status");
  const state = { events: 0, lastSeq: 0, done: false };
  window.__runrowAdmin = state;
  // Events written when a run is queued (by the enqueue, or a retry's): the rest come
  // from a worker that holds the run.
  const QUEUE_EVENTS = new Set(["user_message_created", "run_queued"]);

  // The summary's status badge follows the journal: its ending, its park for input, an
  // answer queueing it again and the worker's next event (the page was rendered before
  // any of them; the row says the same once they commit, in the same statement).
  const badge = document.querySelector(".summary .status");
  // The status the page's actions and input forms were drawn for.
  let drawnFor = badge ? badge.textContent : "";
  function setStatus(status) {
    if (!badge || !status) return;
    badge.textContent = status;
    badge.className = "status status-" + status;
    if (status !== drawnFor) scheduleRedraw();
  }

  // The parts that depend on the status (Cancel or Retry, the timeline, the lineage's
  // row, the input forms) are drawn again from the run's page as the server renders it
  // now, so they follow the badge.
  let redrawTimer = null;
  function scheduleRedraw() {
    if (redrawTimer !== null) clearTimeout(redrawTimer);
    redrawTimer = setTimeout(function () {
      redrawTimer = null;
      if (badge.textContent !== drawnFor) redraw(); // (a replay may pass through and come back)
    }, 200);
  }
  function swapParts(html) {
    const fresh = new DOMParser().parseFromString(html, "text/html");
    for (const id of ["actions", "timeline", "lineage", "waiting", "children"]) {
      const now = document.getElementById(id), then = fresh.getElementById(id);
      if (now && then) now.replaceWith(document.importNode(then, true));
    }
    const freshBadge = fresh.querySelector(".summary .status");
    if (freshBadge) drawnFor = freshBadge.textContent;
  }
  async function redraw() {
    try {
      const resp = await fetch(location.href, { credentials: "same-origin" });
      if (resp.ok) swapParts(await resp.text());
    } catch (e) { /* the next status change draws them again */ }
  }

  // An answer to a waiting input is sent without leaving the page: the journal goes on
  // (input_provided, then the resumed run). Without this script the form posts as is.
  document.addEventListener("submit", async function (ev) {
    const form = ev.target;
    if (!(form instanceof HTMLFormElement) || !form.classList.contains("answer")) return;
    ev.preventDefault();
    const body = new URLSearchParams(new FormData(form, ev.submitter));
    for (const b of form.querySelectorAll("button")) b.disabled = true;
    let resp;
    try {
      resp = await fetch(form.action, { method: "POST", body: body, credentials: "same-origin" });
    } catch (e) {
      for (const b of form.querySelectorAll("button")) b.disabled = false;
      live.textContent = "the answer was not sent: " + e.message;
      return;
    }
    // Recorded: the redirect's page, with the forms gone. Refused: the page that says why
    // (next to the form, what was typed kept), or an error page (a stale token: 403).
    const html = await resp.text();
    if (resp.ok || /id="waiting"/.test(html)) {
      swapParts(html);
    } else {
      for (const b of form.querySelectorAll("button")) b.disabled = false;
      const why = new DOMParser().parseFromString(html, "text/html").querySelector("[role=alert]");
      const note = document.createElement("p");
      note.setAttribute("role", "alert");
      note.className = "error";
      note.textContent = why ? why.textContent : "HTTP " + resp.status;
      form.prepend(note);
    }
    const alert = document.querySelector("#waiting [role=alert]");
    if (alert) { alert.tabIndex = -1; alert.focus(); }
  });

  function summary(ev) {
    if (ev.type === "content_delta") return ev.delta || "";
    if (ev.type === "complete") return "status " + ev.status + (ev.error ? " · " + JSON.stringify(ev.error) : "");
    const rest = Object.assign({}, ev);
    delete rest.type;
    delete rest.seq;
    delete rest.run_id;
    delete rest.run_seq;
    const text = JSON.stringify(rest);
    return text === "{}" ? "" : text;
  }

  // One journal list: the run's own (its events drive the badge), or a root's tree
  // (every run's events, each with its run; it ends with the root's ending).
  function journal(ol, st, tree) {
    let lastDelta = null;
    function show(id, data) {
      let ev;
      try { ev = JSON.parse(data); } catch (e) { return; }
      const seq = Number(id) || 0;
      if (seq <= st.lastSeq) return; // already shown (a reconnect's overlap)
      st.events += 1;
      st.lastSeq = seq;
      if (ev.type === "content_delta" && lastDelta && lastDelta.dataset.run === String(ev.run_id || "")) {
        lastDelta.querySelector(".text").textContent += summary(ev);
      } else {
        const li = document.createElement("li");
        li.value = seq;
        li.dataset.type = ev.type;
        li.dataset.run = String(ev.run_id || "");
        const type = document.createElement("span");
        type.className = "type";
        type.textContent = ev.type;
        const text = document.createElement("span");
        text.className = "text";
        text.textContent = summary(ev);
        if (tree) {
          const run = document.createElement("a");
          run.className = "run";
          run.href = (ol.dataset.events.split("/runs/")[0]) + "/runs/" + ev.run_id;
          run.textContent = ev.run_id === ol.dataset.root ? "root" : String(ev.run_id).slice(0, 8);
          li.append(run, " ");
        }
        li.append(type, " ", text);
        ol.append(li);
        lastDelta = ev.type === "content_delta" ? li : null;
      }
      ol.scrollTop = ol.scrollHeight;
      if (tree) {
        if (ev.type === "complete" && ev.run_id === ol.dataset.root) st.done = true;
        return;
      }
      if (ev.type === "complete") {
        st.done = true;
        live.textContent = "ended: " + (ev.status || "");
        setStatus(ev.status);
      } else if (ev.type === "input_requested") {
        setStatus("waiting");
        live.textContent = "live";
      } else if (ev.type === "input_provided") {
        setStatus("queued"); // answered: queued again until a worker claims it
        live.textContent = "live";
      } else {
        if (badge && badge.textContent === "queued" && !QUEUE_EVENTS.has(ev.type)) setStatus("running");
        live.textContent = "live";
      }
    }

    async function readOnce() {
      const headers = { Accept: "text/event-stream" };
      if (st.lastSeq) headers["Last-Event-ID"] = String(st.lastSeq);
      const resp = await fetch(ol.dataset.events, { headers: headers, credentials: "same-origin" });
      if (resp.status === 204) { st.done = true; if (!tree) live.textContent = "ended"; return; }
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "", id = null, data = [];
      for (;;) {
        const chunk = await reader.read();
        if (chunk.done) return;
        buffer += decoder.decode(chunk.value, { stream: true });
        let nl;
        while ((nl = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, nl).replace(/\r$/, "");
          buffer = buffer.slice(nl + 1);
          if (line === "") {
            if (data.length) show(id, data.join("\n"));
            id = null; data = [];
            if (st.done) { reader.cancel(); return; }
          } else if (line.startsWith("id:")) {
            id = line.slice(3).trim();
          } else if (line.startsWith("data:")) {
            data.push(line.slice(5).replace(/^ /, ""));
          }
        }
      }
    }

    async function follow() {
      let delay = 500;
      while (!st.done) {
        try {
          await readOnce();
          delay = 500;
        } catch (e) {
          if (!tree) live.textContent = "reconnecting";
          delay = Math.min(delay * 2, 10000);
        }
        if (!st.done) await new Promise(function (r) { setTimeout(r, delay); });
      }
    }
    follow();
  }
  journal(list, state, false);
  const treeList = document.getElementById("tree-journal");
  if (treeList) {
    const treeState = { events: 0, lastSeq: 0, done: false };
    window.__runrowAdminTree = treeState;
    journal(treeList, treeState, true);
  }
})();
