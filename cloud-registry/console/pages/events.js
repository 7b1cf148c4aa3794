// Events page: a live tail of the event stream (newest on top, the last
// 500 kept) with type filters.

import { EventStream } from "../api.js";
import { h, replace, fmtTime } from "../dom.js";

const TYPES = [
  "provider_registered", "capability_registered", "capability_health_changed",
  "lease_requested", "lease_granted", "lease_renewed", "lease_release_requested",
  "lease_released", "lease_expired", "lease_preempt_requested", "lease_preempted",
  "session_started", "session_completed", "session_failed", "session_late_report",
  "artifact_uploaded", "audit_task_created", "audit_task_claimed",
  "audit_task_released", "audit_task_completed",
  "agent_run_created", "agent_run_updated", "agent_proposal_created", "agent_proposal_updated",
];
const KEEP = 500;
/** Events replayed when the page opens (the stream's `tail`). */
const TAIL = 200;

/** `HH:MM:SS.mmm` of an ISO time. */
function clock(iso) {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso ?? "");
  const p = (n, w = 2) => String(n).padStart(w, "0");
  return `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`;
}

function link(ev) {
  if (ev.lease_id) return h("a", { href: `#/leases/${encodeURIComponent(ev.lease_id)}` }, ev.lease_id);
  if (ev.session_id) return h("a", { href: `#/sessions/${encodeURIComponent(ev.session_id)}` }, ev.session_id);
  if (ev.audit_request_id) return h("a", { href: `#/audits/${encodeURIComponent(ev.audit_request_id)}` }, ev.audit_request_id);
  return "";
}

function summary(ev) {
  const d = ev.data || {};
  const bits = [];
  for (const k of ["status", "health_status", "holder_ref", "priority", "preempt_reason", "action_type", "artifact_type", "reason"]) {
    if (d[k] !== undefined && d[k] !== null && typeof d[k] !== "object") bits.push(`${k}=${d[k]}`);
  }
  return bits.join(" ");
}

export default {
  path: "#/events",
  title: "Events",
  render(root) {
    const enabled = new Set(TYPES);
    const tbody = h("tbody", { id: "events-body" });
    let paused = false;
    const count = h("span", { class: "summary", id: "events-count" }, "Loading recent events…");
    let shown = 0;
    const apply = () => {
      for (const tr of tbody.children) tr.hidden = !enabled.has(tr.dataset.eventType);
    };
    const boxes = TYPES.map((t) => h("label", null,
      h("input", { type: "checkbox", checked: true, dataset: { type: t }, on: { change: (e) => { if (e.target.checked) enabled.add(t); else enabled.delete(t); apply(); } } }),
      " ", t));
    const groups = [
      ["all", () => TYPES],
      ["leases", () => TYPES.filter((t) => t.startsWith("lease_"))],
      ["sessions", () => TYPES.filter((t) => t.startsWith("session_") || t === "artifact_uploaded")],
      ["providers", () => TYPES.filter((t) => t.startsWith("provider_") || t.startsWith("capability_"))],
      ["audits", () => TYPES.filter((t) => t.startsWith("audit_"))],
    ];
    const only = groups.map(([label, sel]) => h("button", {
      type: "button", class: "small", dataset: { group: label },
      on: {
        click: () => {
          const want = new Set(sel());
          enabled.clear();
          for (const t of want) enabled.add(t);
          for (const b of boxes) { const i = b.querySelector("input"); i.checked = want.has(i.dataset.type); }
          apply();
        },
      },
    }, label));
    const pause = h("button", { type: "button", class: "small", id: "events-pause", on: { click: () => { paused = !paused; pause.textContent = paused ? "Resume" : "Pause"; } } }, "Pause");
    replace(root,
      h("div", { class: "toolbar" }, h("h1", null, "Events"), count, h("span", { class: "spacer" }), pause),
      h("div", { class: "card" },
        h("div", { class: "card-head" }, h("span", { class: "meta" }, "Show: "), only),
        h("div", { class: "card-body filters" }, boxes)),
      h("div", { class: "card tail" }, h("div", { class: "card-body" },
        h("table", { class: "grid" },
          h("thead", null, h("tr", null, ["#", "Time", "Type", "Provider", "Capability", "Subject", "Detail"].map((x) => h("th", null, x)))),
          tbody))));

    // The page's own stream: the last TAIL events of the log, then live.
    const events = new EventStream({ tail: String(TAIL) });
    const unsub = events.subscribe((ev) => {
      if (paused) return;
      const tr = h("tr", { dataset: { eventType: ev.event_type, eventId: ev.event_id } },
        h("td", { class: "num" }, String(ev.event_id)),
        h("td", { class: "nowrap", title: fmtTime(ev.occurred_at) }, clock(ev.occurred_at)),
        h("td", { class: "nowrap" }, h("code", null, ev.event_type)),
        h("td", { class: "nowrap" }, ev.provider_id || ""),
        h("td", { class: "nowrap" }, ev.capability_id || ""),
        h("td", null, link(ev)),
        h("td", { class: "data" }, summary(ev)));
      tr.hidden = !enabled.has(ev.event_type);
      tbody.insertBefore(tr, tbody.firstChild);
      while (tbody.children.length > KEEP) tbody.removeChild(tbody.lastChild);
      shown += 1;
      count.textContent = `${Math.min(shown, KEEP)} events (the last ${TAIL} before this page opened, then live)`;
    });
    events.onStatus((st) => {
      if (st === "live" && shown === 0) count.textContent = "No events yet; waiting…";
    });
    events.start();
    return () => { unsub(); events.stop(); };
  },
};
