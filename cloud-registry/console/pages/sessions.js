// Sessions and evidence: `#/sessions` (a filterable list, live from the
// event stream) and `#/sessions/{id}` (input, result, error and every
// artifact previewed and checked, see artifact.js).
//
// Filters live in the hash's query (`#/sessions?status=failed&lease_id=…`),
// so other pages link to a filtered list.

import { api, events } from "../api.js";
import { h, replace, clear, fmtTime, fmtDuration, badge, table } from "../dom.js";
import { artifactView, jsonBlock, revokeAll } from "./artifact.js";

const STATUSES = ["", "pending", "running", "completed", "failed", "cancelled", "incomplete_evidence"];
const SESSION_EVENTS = new Set(["session_started", "session_completed", "session_failed", "artifact_uploaded", "session_late_report"]);

function hashQuery() {
  const q = location.hash.split("?")[1] || "";
  return Object.fromEntries(new URLSearchParams(q));
}

function setHashQuery(base, f) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(f)) if (v) q.set(k, v);
  const s = q.toString();
  history.replaceState(null, "", s ? `${base}?${s}` : base);
}

function duration(s) {
  if (!s.ended_at) return null;
  return new Date(s.ended_at).getTime() - new Date(s.started_at).getTime();
}

function sessionRow(s) {
  return h("tr", { dataset: { sessionId: s.session_id } },
    h("td", null, h("a", { href: `#/sessions/${encodeURIComponent(s.session_id)}` }, h("code", null, s.session_id))),
    h("td", null, badge(s.status)),
    h("td", null, s.action),
    h("td", null, s.capability_id),
    h("td", null, h("a", { href: `#/leases/${encodeURIComponent(s.lease_id)}` }, h("code", null, s.lease_id))),
    h("td", null, fmtTime(s.started_at)),
    h("td", { class: "num" }, s.ended_at ? fmtDuration(duration(s)) : "running"),
    h("td", { class: "num" }, String((s.artifact_refs || []).length)));
}

function matches(s, f) {
  return (!f.status || s.status === f.status) &&
    (!f.capability_id || s.capability_id === f.capability_id) &&
    (!f.lease_id || s.lease_id === f.lease_id);
}

const list = {
  path: "#/sessions",
  title: "Sessions",
  render(root) {
    const f = Object.assign({ status: "", capability_id: "", lease_id: "" }, hashQuery());
    const rows = new Map();
    const body = h("tbody");
    const summary = h("span", { class: "summary" });
    const err = h("p", { class: "error" });
    const status = h("select", { name: "status", id: "filter-status", on: { change: (e) => { f.status = e.target.value; reload(); } } },
      STATUSES.map((s) => h("option", { value: s, selected: s === f.status }, s || "any status")));
    const capSel = h("select", { name: "capability_id", id: "filter-capability", on: { change: (e) => { f.capability_id = e.target.value; reload(); } } },
      h("option", { value: "" }, "any capability"));
    const lease = h("input", { type: "search", id: "filter-lease", placeholder: "lease id", value: f.lease_id, on: { change: (e) => { f.lease_id = e.target.value.trim(); reload(); } } });
    const tbl = h("table", { class: "grid sessions" },
      h("thead", null, h("tr", null, ["session", "status", "action", "capability", "lease", "started", "duration", "artifacts"].map((x) => h("th", null, x)))),
      body);
    replace(root,
      h("h2", null, "Sessions"),
      h("div", { class: "filters toolbar" },
        h("label", null, "Status ", status), h("label", null, "Capability ", capSel), h("label", null, "Lease ", lease), summary),
      err, tbl);

    api.get("capabilities").then((r) => {
      for (const c of r.capabilities || []) {
        capSel.appendChild(h("option", { value: c.capability_id, selected: c.capability_id === f.capability_id }, c.capability_id));
      }
      if (f.capability_id && !(r.capabilities || []).some((c) => c.capability_id === f.capability_id)) {
        capSel.appendChild(h("option", { value: f.capability_id, selected: true }, f.capability_id));
      }
    }).catch(() => {});

    const put = (s) => {
      const old = rows.get(s.session_id);
      if (!matches(s, f)) { if (old) { old.remove(); rows.delete(s.session_id); } return; }
      const tr = sessionRow(s);
      if (old) old.replaceWith(tr); else body.insertBefore(tr, body.firstChild);
      rows.set(s.session_id, tr);
      tr.classList.add("fresh");
      summary.textContent = `${rows.size} sessions`;
    };
    let gen = 0;
    async function reload() {
      setHashQuery("#/sessions", f);
      const my = ++gen;
      try {
        const r = await api.get("sessions", { status: f.status, capability_id: f.capability_id, lease_id: f.lease_id, limit: 200 });
        if (my !== gen) return;
        clear(body); rows.clear(); err.textContent = "";
        for (const s of r.sessions || []) { const tr = sessionRow(s); rows.set(s.session_id, tr); body.appendChild(tr); }
        summary.textContent = `${rows.size} sessions`;
        if (!rows.size) body.appendChild(h("tr", { class: "none" }, h("td", { colspan: 8, class: "muted" }, "No sessions match.")));
      } catch (e) { err.textContent = `Cannot list sessions: ${e.message}`; }
    }
    reload();
    return events.subscribe((ev) => {
      if (!SESSION_EVENTS.has(ev.event_type) || !ev.session_id) return;
      api.get(`sessions/${encodeURIComponent(ev.session_id)}`).then((s) => {
        body.querySelector("tr.none")?.remove();
        put(s);
      }).catch(() => {});
    });
  },
};

/** `#/sessions/{id}`: one session and its evidence. */
export const detail = {
  path: "#/sessions/{id}",
  title: "Session",
  nav: false,
  render(root, params) {
    const id = params.id;
    const bag = [];
    const head = h("div");
    const arts = h("div", { class: "artifacts" });
    const shown = new Map(); // artifact_id -> uploaded
    replace(root, h("p", null, h("a", { href: "#/sessions" }, "← Sessions")), head, h("h3", null, "Evidence"), arts);

    async function loadSession() {
      try {
        const s = await api.get(`sessions/${encodeURIComponent(id)}`);
        replace(head,
          h("h2", null, "Session ", h("code", null, s.session_id), " ", badge(s.status)),
          h("dl", { class: "kv" },
            h("dt", null, "action"), h("dd", null, s.action),
            h("dt", null, "capability"), h("dd", null, s.capability_id),
            h("dt", null, "lease"), h("dd", null, h("a", { href: `#/leases/${encodeURIComponent(s.lease_id)}` }, h("code", null, s.lease_id))),
            h("dt", null, "started"), h("dd", null, fmtTime(s.started_at)),
            h("dt", null, "ended"), h("dd", null, s.ended_at ? `${fmtTime(s.ended_at)} (${fmtDuration(duration(s))})` : "running")),
          s.error_message ? h("div", { class: "error session-error" }, h("b", null, "Error: "), s.error_message) : null,
          h("h3", null, "Input"), jsonBlock(s.input_summary, "session-input"),
          h("h3", null, "Result summary"), s.result_summary ? jsonBlock(s.result_summary, "session-result") : h("p", { class: "muted" }, "No result yet."),
          s.late_report ? [h("h3", null, "Late report"), jsonBlock(s.late_report)] : null);
      } catch (e) {
        replace(head, h("p", { class: "error" }, e.status === 404 ? `No session ${id}.` : `Cannot load the session: ${e.message}`));
      }
    }
    async function loadArtifacts() {
      try {
        const r = await api.get("artifacts", { session_id: id, limit: 1000 });
        const list = r.artifacts || [];
        if (!list.length && !shown.size) { replace(arts, h("p", { class: "muted none" }, "No artifacts.")); return; }
        arts.querySelector(".none")?.remove();
        for (const a of list) {
          if (shown.get(a.artifact_id) === a.uploaded) continue;
          const card = artifactView(a, bag);
          const old = arts.querySelector(`[data-artifact-id="${CSS.escape(a.artifact_id)}"]`);
          if (old) old.replaceWith(card); else arts.appendChild(card);
          shown.set(a.artifact_id, a.uploaded);
        }
      } catch (e) {
        replace(arts, h("p", { class: "error" }, `Cannot list the artifacts: ${e.message}`));
      }
    }
    loadSession();
    loadArtifacts();
    const unsub = events.subscribe((ev) => {
      if (ev.session_id !== id) return;
      if (ev.event_type === "artifact_uploaded") loadArtifacts();
      else if (SESSION_EVENTS.has(ev.event_type)) { loadSession(); loadArtifacts(); }
    });
    return () => { unsub(); revokeAll(bag); };
  },
};

export default list;
