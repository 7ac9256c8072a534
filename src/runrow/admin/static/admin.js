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
  let lastDelta = null;

  function summary(ev) {
    if (ev.type === "content_delta") return ev.delta || "";
    if (ev.type === "complete") return "status " + ev.status + (ev.error ? " · " + JSON.stringify(ev.error) : "");
    const rest = Object.assign({}, ev);
    delete rest.type;
    delete rest.seq;
    const text = JSON.stringify(rest);
    return text === "{}" ? "" : text;
  }

  function show(id, data) {
    let ev;
    try { ev = JSON.parse(data); } catch (e) { return; }
    const seq = Number(id) || 0;
    if (seq <= state.lastSeq) return; // already shown (a reconnect's overlap)
    state.events += 1;
    state.lastSeq = seq;
    if (ev.type === "content_delta" && lastDelta) {
      lastDelta.querySelector(".text").textContent += summary(ev);
    } else {
      const li = document.createElement("li");
      li.value = seq;
      li.dataset.type = ev.type;
      const type = document.createElement("span");
      type.className = "type";
      type.textContent = ev.type;
      const text = document.createElement("span");
      text.className = "text";
      text.textContent = summary(ev);
      li.append(type, " ", text);
      list.append(li);
      lastDelta = ev.type === "content_delta" ? li : null;
    }
    list.scrollTop = list.scrollHeight;
    if (ev.type === "complete") {
      state.done = true;
      live.textContent = "ended: " + (ev.status || "");
    } else {
      live.textContent = "live";
    }
  }

  async function readOnce() {
    const headers = { Accept: "text/event-stream" };
    if (state.lastSeq) headers["Last-Event-ID"] = String(state.lastSeq);
    const resp = await fetch(list.dataset.events, { headers: headers, credentials: "same-origin" });
    if (resp.status === 204) { state.done = true; live.textContent = "ended"; return; }
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
          if (state.done) { reader.cancel(); return; }
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
    while (!state.done) {
      try {
        await readOnce();
        delay = 500;
      } catch (e) {
        live.textContent = "reconnecting";
        delay = Math.min(delay * 2, 10000);
      }
      if (!state.done) await new Promise(function (r) { setTimeout(r, delay); });
    }
  }
  follow();
})();
