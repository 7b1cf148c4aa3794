// Lease page: the lease's fields, its timeline (from the event log, replayed
// and then followed live: requested, granted, preemption with its grace
// countdown, the end) and its sessions.

import { api, EventStream, can } from "../api.js";
import { h, replace, badge, countdown, fmtTime, fmtDuration } from "../dom.js";

const LABEL = {
  lease_requested: "requested",
  lease_granted: "granted",
  lease_renewed: "renewed",
  lease_release_requested: "release requested",
  lease_released: "released",
  lease_expired: "expired",
  lease_preempt_requested: "preempt requested",
  lease_preempted: "preempted (revoked)",
  session_started: "session started",
  session_completed: "session completed",
  session_failed: "session failed",
  artifact_uploaded: "artifact uploaded",
};

function describe(ev) {
  const d = ev.data || {};
  const parts = [];
  switch (ev.event_type) {
    case "lease_requested":
      parts.push(`priority ${d.priority}`, d.purpose ? `purpose: ${d.purpose}` : null);
      break;
    case "lease_granted":
      if (d.expires_at) parts.push(`until ${fmtTime(d.expires_at)}`);
      if (d.generation !== undefined && d.generation !== null) parts.push(`generation ${d.generation}`);
      break;
    case "lease_renewed":
      if (d.expires_at) parts.push(`until ${fmtTime(d.expires_at)}`);
      break;
    case "lease_preempt_requested": {
      const n = d.notice || {};
      parts.push(`reason ${n.preempt_reason || d.preempt_reason || "—"}`);
      if (n.preempting_lease_id) parts.push(`by ${n.preempting_lease_id}`);
      break;
    }
    case "lease_preempted":
      if (d.preempt_reason) parts.push(`reason ${d.preempt_reason}`);
      if (d.preempted_by) parts.push(`handed over to ${d.preempted_by}`);
      break;
    case "lease_released":
    case "lease_expired":
      if (d.reason) parts.push(`reason ${typeof d.reason === "string" ? d.reason : JSON.stringify(d.reason)}`);
      break;
    default:
      if (ev.session_id) parts.push(ev.session_id);
  }
  return parts.filter(Boolean).join(" · ");
}

export default {
  path: "#/leases/{id}",
  title: "Lease",
  nav: false,
  render(root, { id }) {
    const head = h("div", { id: "lease-head" }, h("h1", null, "Lease ", h("code", null, id)));
    const fields = h("div", { class: "card" }, h("div", { class: "card-body" }, "Loading…"));
    const tl = h("ol", { class: "timeline", id: "lease-timeline" });
    const sessions = h("div", { id: "lease-sessions" });
    const err = h("p", { class: "error", id: "lease-error" });
    replace(root, head, err, fields,
      h("div", { class: "card" }, h("div", { class: "card-head" }, h("span", { class: "title" }, "Timeline")), h("div", { class: "card-body" }, tl)),
      h("div", { class: "card" }, h("div", { class: "card-head" }, h("span", { class: "title" }, "Sessions")), h("div", { class: "card-body" }, sessions)));
    let stopped = false;
    const seen = new Set();

    function renderLease(l) {
      const grace = l.status === "grace_period" || l.status === "preempt_requested";
      const rows = [
        ["Status", h("span", { id: "lease-status" }, badge(l.status))],
        ["Capability", h("code", null, l.capability_id || "— (chosen at grant)")],
        ["Holder", h("span", { id: "lease-holder" }, l.holder_ref), h("span", { class: "muted" }, ` (${l.holder_type}, principal ${l.principal})`)],
        ["Project", l.project_id],
        ["Purpose", h("span", { id: "lease-purpose" }, l.purpose)],
        ["Priority", String(l.priority)],
        ["Mode", l.mode],
        ["Requested", fmtTime(l.requested_at)],
        ["Granted", fmtTime(l.granted_at)],
        ["Expires", l.expires_at ? [fmtTime(l.expires_at), " ", !grace && !l.ended_at ? countdown(l.expires_at) : null] : "—"],
        grace && l.grace_until ? ["Grace period", h("span", { id: "lease-grace", class: "countdown-wrap grace" }, "ends in ", countdown(l.grace_until))] : null,
        l.preempt_reason ? ["Preempt reason", l.preempt_reason] : null,
        l.preempted_by ? ["Preempted by", h("a", { href: `#/leases/${encodeURIComponent(l.preempted_by)}` }, l.preempted_by)] : null,
        l.ended_at ? ["Ended", fmtTime(l.ended_at)] : null,
        l.lease_group_id ? ["Group", h("code", null, l.lease_group_id)] : null,
      ].filter(Boolean);
      const dl = h("dl", { class: "kv" }, rows.map(([k, ...v]) => [h("dt", null, k), h("dd", null, v)]));
      const canRelease = !l.ended_at && (can("release_any") || (l.principal === api.principal && can("lease")));
      replace(fields, h("div", { class: "card-body" }, dl,
        canRelease ? h("p", null, h("button", { type: "button", class: "action", on: { click: release } }, "Release")) : null));
    }

    async function release() {
      try {
        await api.post(`capability-leases/${encodeURIComponent(id)}/release`, { reason: "released from the console" });
      } catch (e) { replace(err, `Release failed: ${e.message}`); }
    }

    async function loadLease() {
      try {
        const l = await api.get(`capability-leases/${encodeURIComponent(id)}`);
        if (!stopped) renderLease(l);
      } catch (e) {
        if (!stopped) replace(err, e.status === 404 ? `No lease ${id}.` : `Cannot load the lease: ${e.message}`);
      }
    }

    async function loadSessions() {
      try {
        const s = await api.get(`capability-leases/${encodeURIComponent(id)}/sessions`);
        if (stopped) return;
        const list = s.sessions || [];
        replace(sessions, list.length
          ? h("table", { class: "grid" },
            h("thead", null, h("tr", null, ["Session", "Action", "Status", "Started", "Duration"].map((x) => h("th", null, x)))),
            h("tbody", null, list.map((x) => h("tr", { dataset: { sessionId: x.session_id } },
              h("td", null, h("a", { href: `#/sessions/${encodeURIComponent(x.session_id)}` }, x.session_id)),
              h("td", null, x.action_type || x.action || "—"),
              h("td", null, badge(x.status)),
              h("td", null, fmtTime(x.started_at || x.created_at)),
              h("td", { class: "num" }, x.ended_at && x.started_at ? fmtDuration(new Date(x.ended_at) - new Date(x.started_at)) : "—")))))
          : h("p", { class: "muted" }, "No sessions under this lease."));
      } catch (e) {
        if (!stopped) replace(sessions, h("p", { class: "muted" }, `Sessions: ${e.message}`));
      }
    }

    function addEvent(ev) {
      if (seen.has(ev.event_id)) return;
      seen.add(ev.event_id);
      const li = h("li", { class: `ev-${ev.event_type}`, dataset: { eventType: ev.event_type, eventId: ev.event_id } },
        h("span", { class: "when" }, fmtTime(ev.occurred_at)),
        h("span", { class: "what" }, LABEL[ev.event_type] || ev.event_type),
        h("span", { class: "detail" }, describe(ev)),
        ev.event_type === "lease_preempt_requested" && ev.data && ev.data.notice && ev.data.notice.grace_until
          ? h("span", { class: "detail" }, `grace period until ${fmtTime(ev.data.notice.grace_until)} (${fmtDuration(new Date(ev.data.notice.grace_until) - new Date(ev.occurred_at))})`) : null);
      // Keep the list ordered by event id.
      const after = [...tl.children].find((c) => Number(c.dataset.eventId) > ev.event_id);
      tl.insertBefore(li, after || null);
    }

    const stream = new EventStream({ lease_id: id, after: 0 });
    const unsub = stream.subscribe((ev) => {
      addEvent(ev);
      if (ev.event_type && ev.event_type.startsWith("lease_")) loadLease();
      if (ev.event_type && ev.event_type.startsWith("session_")) loadSessions();
    });
    stream.start();
    loadLease();
    loadSessions();
    return () => { stopped = true; unsub(); stream.stop(); };
  },
};
