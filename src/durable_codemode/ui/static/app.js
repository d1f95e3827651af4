// durable-codemode's web page: the runs, and one run drawn live from its event stream, with its waiting calls.
// No build step, nothing from the network. Every text from a run is put in the page as text (textContent),
// never as HTML: the server has escaped control characters and bidi overrides already (ui/_views.py).
"use strict";

(function () {
  const TOKEN_KEY = "codemode-token";
  const here = new URL(window.location.href);
  const given = here.searchParams.get("token");
  if (given) {  // keep it for this tab, and out of the address bar (and of the history, and of any referrer)
    sessionStorage.setItem(TOKEN_KEY, given);
    here.searchParams.delete("token");
    history.replaceState(null, "", here.pathname + here.search);
  }
  const token = sessionStorage.getItem(TOKEN_KEY) || "";

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function notice(message, ok) {
    const box = document.getElementById("notice");
    if (!message) { box.hidden = true; return; }
    box.textContent = message;
    box.className = ok ? "notice ok" : "notice";
    box.hidden = false;
  }

  async function api(path, options) {
    const init = Object.assign({ headers: {} }, options || {});
    init.headers["Authorization"] = "Bearer " + token;
    let response;
    try {
      response = await fetch(path, init);
    } catch (e) {
      throw new Error("the codemode ui server does not answer (" + e.message + "): is it still running?");
    }
    let body = null;
    try { body = await response.json(); } catch (e) { body = null; }
    if (!response.ok) {
      throw new Error((body && body.error) || ("the server answered " + response.status));
    }
    return body;
  }

  function runLink(rawId) {
    return "/run/" + rawId.split("/").map(encodeURIComponent).join("/");
  }

  async function who() {
    const me = await api("/api/me");
    document.getElementById("who").textContent = me.approver
      ? "deciding as " + me.approver + (me.signed ? " (signed)" : " (unsigned)") : "read-only";
    return me;
  }

  // -- the runs page ---------------------------------------------------------------------------------------------

  async function runsPage() {
    let me;
    try { me = await who(); } catch (e) { notice(e.message); return; }
    const select = document.getElementById("filter-status");
    for (const state of me.states) select.appendChild(el("option", null, state)).value = state;
    const agent = document.getElementById("filter-agent");
    document.getElementById("filters").addEventListener("submit", (e) => { e.preventDefault(); refresh(); });
    select.addEventListener("change", () => refresh());
    agent.addEventListener("change", () => refresh());
    async function refresh() {
      const query = new URLSearchParams();
      if (agent.value) query.set("agent", agent.value);
      if (select.value) query.set("status", select.value);
      try {
        const body = await api("/api/runs?" + query.toString());
        const rows = document.querySelector("#runs tbody");
        rows.replaceChildren();
        for (const run of body.runs) {
          const row = el("tr");
          row.dataset.state = run.state;
          const cell = el("td", "id");
          const link = el("a", null, run.id);
          link.href = runLink(run.raw_id);
          cell.appendChild(link);
          row.appendChild(cell);
          row.appendChild(el("td", null, run.agent));
          row.appendChild(el("td", "state", run.state));
          row.appendChild(el("td", null, run.started ? new Date(run.started).toLocaleString() : ""));
          row.appendChild(el("td", "calls", run.calls === null || run.calls === undefined ? "" : String(run.calls)));
          row.appendChild(el("td", "waiting", run.waiting ? run.waiting + " call(s)" : ""));
          rows.appendChild(row);
        }
        document.getElementById("empty").hidden = body.runs.length > 0;
        notice(null);
      } catch (e) {
        notice(e.message);
      }
    }
    await refresh();
    setInterval(refresh, 2000);
  }

  // -- one run ---------------------------------------------------------------------------------------------------

  async function runPage() {
    const runId = here.pathname.slice("/run/".length).split("/").map(decodeURIComponent).join("/");
    const base = "/api/runs/" + runId.split("/").map(encodeURIComponent).join("/");
    document.getElementById("run-id").textContent = runId;
    let me;
    try { me = await who(); } catch (e) { notice(e.message); return; }
    const tree = document.getElementById("tree");
    const status = document.getElementById("status");
    const snippets = new Map();   // run_code call id -> {item, calls}
    const calls = new Map();      // nested (or direct) call id -> li
    const answers = new Map();    // "turn:index" -> the answer's text node
    const policies = new Map();   // call id -> who may decide it (from its approval_wait event)
    let turnList = tree;
    let turn = -1;
    let ended = false;

    function callNode(callId, parent) {
      let node = calls.get(callId);
      if (!node) {
        node = el("li", "call running", callId);
        node.dataset.call = callId;
        (parent || turnList).appendChild(node);
        calls.set(callId, node);
      }
      return node;
    }

    function snippetOf(callId) {
      return snippets.get(callId) || { item: turnList, calls: turnList };
    }

    function apply(ev) {
      switch (ev.kind) {
        case "run_start":
          status.textContent = "running: agent " + ev.agent + (ev.model ? ", model " + ev.model : "");
          break;
        case "model_request": {
          turn = ev.turn;
          const item = el("li", "turn");
          item.appendChild(el("strong", null, "model turn " + ev.turn));
          turnList = el("ol");
          item.appendChild(turnList);
          tree.appendChild(item);
          break;
        }
        case "reset":
          for (const [key, node] of answers) if (key.startsWith(ev.turn + ":")) node.textContent = "";
          turnList.appendChild(el("li", "quiet", "the model's attempt failed (" + ev.reason + "); it answers again"));
          break;
        case "text": {
          const key = turn + ":" + ev.index;
          let node = answers.get(key);
          if (!node) { node = el("div", "answer"); turnList.appendChild(node); answers.set(key, node); }
          node.textContent = ev.start ? ev.text : node.textContent + ev.text;
          break;
        }
        case "text_end": {
          const node = answers.get(turn + ":" + ev.index);
          if (node) node.textContent = ev.text;
          break;
        }
        case "tool_call":
          if (ev.tool !== "run_code") callNode(ev.call_id).textContent = ev.call_id + " " + ev.tool + "(" + ev.args + ")";
          break;
        case "snippet_start": {
          const item = el("li", "snippet");
          item.appendChild(el("span", "mono", "run_code " + ev.call_id));
          item.appendChild(el("pre", "code", ev.code));
          const list = el("ol", "calls");
          item.appendChild(list);
          turnList.appendChild(item);
          snippets.set(ev.call_id, { item: item, calls: list });
          break;
        }
        case "call_start": {
          const node = callNode(ev.call_id, snippetOf(ev.call_id.split(".").slice(0, -1).join(".")).calls);
          node.textContent = ev.call_id + " " + ev.tool + "(" + ev.args + ")";
          node.className = "call " + (ev.gated ? "paused" : "running");
          break;
        }
        case "call_end": {
          const node = callNode(ev.call_id);
          node.className = "call " + ev.status;
          node.appendChild(el("span", "quiet", "  " + ev.status + " " + Math.round(ev.seconds * 1000) + " ms → "
            + ev.result));
          break;
        }
        case "print":
          snippetOf(ev.call_id).calls.appendChild(el("li", null)).appendChild(el("pre", "print", ev.text));
          break;
        case "approval_wait": {
          if (ev.policy) policies.set(ev.raw_call_id, ev.policy);
          const node = callNode(ev.call_id);
          node.className = "call paused";
          const label = el("span", "quiet wait", "  waits for a person" + (ev.policy ? " (" + ev.policy + ")" : ""));
          node.appendChild(label);
          refreshPending();
          break;
        }
        case "approval_decided": {
          const node = callNode(ev.call_id);
          const by = ev.via === "timeout" ? "by the timeout" : "by " + (ev.approver || "an approver");
          node.appendChild(el("div", "decided", (ev.approved ? "approved " : "denied ") + by
            + (ev.note ? ": " + ev.note : "") + (ev.settled ? "" : " (one of the approvals it needs)")));
          if (ev.settled) {
            for (const label of node.querySelectorAll(".wait")) label.remove();
            if (ev.approved) node.className = "call running";
          }
          refreshPending();
          break;
        }
        case "child_start": {
          const node = callNode(ev.call_id);
          const line = el("div", null, "child run ");
          const link = el("a", null, ev.run_id + " (" + ev.agent + ")");
          link.href = runLink(ev.raw_run_id);
          line.appendChild(link);
          node.appendChild(line);
          break;
        }
        case "child_end":
          callNode(ev.call_id).appendChild(el("div", "quiet", "child run " + ev.status
            + (ev.error ? ": " + ev.error : "")));
          break;
        case "compute":
          snippetOf(ev.call_id).calls.appendChild(el("li", "quiet", ev.reason));
          break;
        case "snippet_end":
          snippetOf(ev.call_id).calls.appendChild(el("li", "quiet", "ended: " + ev.outcome + " (" + ev.calls
            + " calls) → " + ev.result));
          break;
        case "continued":
          tree.appendChild(el("li", "quiet", "continued as new (workflow run " + ev.run_index + ")"));
          break;
        case "trimmed":
          tree.appendChild(el("li", "quiet", ev.missed + " earlier events are no longer kept by the run"));
          break;
        case "end":
          ended = true;
          status.textContent = "run " + ev.status + (ev.error ? ": " + ev.error : "");
          status.dataset.status = ev.status;
          if (ev.output !== null) {
            const item = el("li", "final");
            item.appendChild(el("strong", null, "output"));
            item.appendChild(el("div", "answer", ev.output));
            tree.appendChild(item);
          }
          break;
      }
    }

    async function refreshPending() {
      if (ended) { document.getElementById("approvals").hidden = true; return; }
      let body;
      try { body = await api(base + "/pending"); } catch (e) { return; }
      // Kept in place while still waiting: a refresh must not wipe a note being typed.
      const list = document.getElementById("waiting");
      const shown = new Map(Array.from(list.children, (item) => [item.dataset.call, item]));
      const waiting = new Set(body.pending.map((p) => p.raw_call_id));
      for (const [callId, item] of shown) if (!waiting.has(callId)) item.remove();
      for (const p of body.pending) if (!shown.has(p.raw_call_id)) list.appendChild(pendingItem(p));
      document.getElementById("approvals").hidden = body.pending.length === 0;
    }

    function pendingItem(p) {
      const item = el("li", "pending");
      item.dataset.call = p.raw_call_id;
      item.appendChild(el("div", "mono", p.call_id + " " + p.tool + "(" + p.args + ")"));
      if (p.code_line) item.appendChild(el("div", "quiet mono", "line " + p.line + ": " + p.code_line));
      const policy = p.policy || policies.get(p.raw_call_id);
      if (policy) item.appendChild(el("div", "quiet policy", "who may decide: " + policy));
      if (p.run_id) item.appendChild(el("div", "quiet", "waits in child run " + p.run_id + ": decide it there"));
      if (p.expires) item.appendChild(el("div", "quiet", "denied automatically at "
        + new Date(p.expires).toLocaleString()));
      const actions = el("div", "actions");
      const note = el("input");
      note.placeholder = "note (optional)";
      note.maxLength = 500;
      const approve = el("button", "approve", "Approve");
      const deny = el("button", "deny", "Deny");
      const canDecide = Boolean(me.approver) && !p.run_id;
      for (const button of [approve, deny]) {
        button.disabled = !canDecide;
        button.addEventListener("click", () => decide(p.raw_call_id, button === approve, note.value, [approve, deny]));
      }
      if (!me.approver) note.disabled = true;
      actions.append(note, approve, deny);
      item.appendChild(actions);
      return item;
    }

    async function decide(callId, approved, note, buttons) {
      for (const b of buttons) b.disabled = true;
      try {
        await api(base + "/decisions", {
          method: "POST", headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ call_id: callId, approved: approved, note: note || null }),
        });
        notice((approved ? "Approved " : "Denied ") + callId, true);
      } catch (e) {
        notice(e.message);
        for (const b of buttons) b.disabled = false;
      }
      refreshPending();
    }

    async function showTrace() {
      try {
        const body = await api(base + "/trace");
        document.getElementById("trace").textContent = body.trace;
        document.getElementById("trace-section").hidden = false;
      } catch (e) {
        notice(e.message);
      }
    }

    async function follow() {
      let after = null;
      while (!ended) {
        let body;
        try {
          body = await api(base + "/events" + (after === null ? "" : "?after=" + after));
        } catch (e) {
          notice(e.message + " (trying again)");
          await new Promise((r) => setTimeout(r, 2000));
          continue;
        }
        if (!body.streams) {
          document.getElementById("no-stream").hidden = false;
          status.textContent = "";
          await showTrace();
          await refreshPending();
          const runs = await api("/api/runs").catch(() => ({ runs: [] }));
          const mine = runs.runs.find((r) => r.raw_id === runId);
          if (mine && mine.state !== "running" && mine.state !== "waiting") { ended = true; break; }
          await new Promise((r) => setTimeout(r, 3000));
          continue;
        }
        notice(null);
        for (const ev of body.events) apply(ev);
        after = body.last;
      }
      await showTrace();
    }

    refreshPending();
    setInterval(() => { if (!ended) refreshPending(); }, 3000);
    follow();
  }

  window.addEventListener("DOMContentLoaded", () => {
    if (!token) {
      notice("This page needs the address `codemode ui` printed, with its token (…/?token=…).");
      return;
    }
    if (document.body.dataset.page === "runs") runsPage();
    else runPage();
  });
})();
