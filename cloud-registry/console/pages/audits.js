// Audit tasks: `#/audits` (requests with their claims and status, live
// from the audit_task_* events) and `#/audits/{id}` (the request, its
// claim and leases, the result's decision, confidence and findings by
// severity, the chief decision, and links to the leases and artifacts
// cited).

import { api, events } from "../api.js";
import { h, replace, clear, fmtTime, fmtDuration, badge, countdown } from "../dom.js";
import { jsonBlock } from "./artifact.js";

const AUDIT_EVENTS = new Set(["audit_task_created", "audit_task_claimed", "audit_task_released", "audit_task_completed"]);
const SEVERITIES = ["critical", "high", "medium", "low"];

function leaseLink(id) {
  return h("a", { href: `#/leases/${encodeURIComponent(id)}`, class: "lease-link" }, h("code", null, id));
}

/** A link to the session holding artifact `id` (looked up), else its id as text. */
function artifactLink(id) {
  const el = h("span", { class: "artifact-ref" }, h("code", null, id));
  api.get(`artifacts/${encodeURIComponent(id)}`).then((a) => {
    replace(el, h("a", { href: `#/sessions/${encodeURIComponent(a.session_id)}`, class: "artifact-link" }, h("code", null, id)), " ", h("span", { class: "muted" }, a.artifact_type));
  }).catch(() => { /* not an artifact id: stays text */ });
  return el;
}

function claimCell(c) {
  if (!c) return h("span", { class: "muted" }, "—");
  return h("span", { class: "claim" }, c.agent_ref || c.principal,
    c.ended_at ? h("span", { class: "muted" }, ` (ended ${c.end_reason || ""})`) : [" ", countdown(c.expires_at, { prefix: "expires in " })]);
}

function requestRow(r) {
  const q = r.request;
  return h("tr", { dataset: { auditId: q.audit_request_id } },
    h("td", null, h("a", { href: `#/audits/${encodeURIComponent(q.audit_request_id)}` }, h("code", null, q.audit_request_id))),
    h("td", null, q.audit_type),
    h("td", null, badge(r.status)),
    h("td", { class: "num" }, String(q.priority)),
    h("td", { class: "objective" }, q.objective),
    h("td", null, claimCell(r.claim)),
    h("td", null, r.decision ? badge(r.decision) : "—"),
    h("td", null, fmtTime(r.created_at)));
}

const list = {
  path: "#/audits",
  title: "Audits",
  render(root) {
    const f = { status: "", audit_type: "" };
    const body = h("tbody");
    const summary = h("span", { class: "summary" });
    const err = h("p", { class: "error" });
    const sel = (name, values, label) => h("label", null, label, " ", h("select", { name, on: { change: (e) => { f[name] = e.target.value; reload(); } } },
      values.map((v) => h("option", { value: v }, v || `any ${label.toLowerCase()}`))));
    replace(root, h("h2", null, "Audit tasks"),
      h("div", { class: "filters toolbar" },
        sel("status", ["", "queued", "claimed", "completed", "failed"], "Status"),
        sel("audit_type", ["", "software", "hardware", "multimodal", "chief"], "Type"), summary),
      err,
      h("table", { class: "grid audits" },
        h("thead", null, h("tr", null, ["request", "type", "status", "priority", "objective", "claim", "decision", "created"].map((x) => h("th", null, x)))),
        body));
    let gen = 0, pending = null;
    async function reload() {
      const my = ++gen;
      try {
        const r = await api.get("audit-requests", { status: f.status, audit_type: f.audit_type, order: "newest", limit: 200 })
          .catch((e) => { if (e.code === "invalid_query") return api.get("audit-requests", { status: f.status, audit_type: f.audit_type, limit: 200 }); throw e; });
        if (my !== gen) return;
        clear(body); err.textContent = "";
        for (const rec of r.audit_requests || []) body.appendChild(requestRow(rec));
        summary.textContent = `${(r.audit_requests || []).length} of ${r.total ?? "?"} requests`;
        if (!(r.audit_requests || []).length) body.appendChild(h("tr", null, h("td", { colspan: 8, class: "muted" }, "No audit requests.")));
      } catch (e) { err.textContent = `Cannot list audit requests: ${e.message}`; }
    }
    reload();
    return events.subscribe((ev) => {
      if (!AUDIT_EVENTS.has(ev.event_type)) return;
      clearTimeout(pending);
      pending = setTimeout(reload, 100);
    });
  },
};

function findingsView(findings) {
  if (!findings || !findings.length) return h("p", { class: "muted" }, "No findings.");
  return SEVERITIES.concat(["other"]).map((sev) => {
    const of = findings.filter((x) => (SEVERITIES.includes(x.severity) ? x.severity : "other") === sev);
    if (!of.length) return null;
    return h("div", { class: `findings sev-${sev}` },
      h("h4", null, badge(sev), ` ${of.length} ${sev}`),
      h("ul", null, of.map((x) => h("li", { class: "finding", dataset: { findingId: x.finding_id } },
        h("b", { class: "finding-title" }, x.title), " ", h("code", { class: "muted" }, x.finding_id),
        h("p", { class: "finding-description" }, x.description),
        x.suggested_fix ? h("p", { class: "muted" }, "Suggested fix: ", x.suggested_fix) : null,
        (x.evidence_ref_ids || []).length ? h("p", null, "Evidence: ", x.evidence_ref_ids.map((id) => [artifactLink(id), " "])) : null))));
  });
}

function chiefView(res) {
  const c = res.chief || res;
  if (!c.final_decision && !c.overall_risk_level && !c.blocking_reasons) return null;
  return h("div", { class: "card chief" },
    h("div", { class: "card-head" }, h("span", { class: "title" }, "Chief decision"), " ",
      c.final_decision ? badge(c.final_decision) : null),
    h("div", { class: "card-body" }, h("dl", { class: "kv" },
      c.final_decision ? [h("dt", null, "final decision"), h("dd", { class: "final-decision" }, c.final_decision)] : null,
      c.overall_risk_level ? [h("dt", null, "overall risk"), h("dd", null, c.overall_risk_level)] : null,
      c.blocking_reasons ? [h("dt", null, "blocking"), h("dd", null, h("ul", null, c.blocking_reasons.map((b) => h("li", null, b))))] : null,
      c.recommended_next_step ? [h("dt", null, "next step"), h("dd", null, c.recommended_next_step)] : null,
      c.handoff_target ? [h("dt", null, "hand-off to"), h("dd", null, c.handoff_target)] : null)));
}

/**
 * The leases taken for audit `id`: the registry names them in their
 * purpose ("audit {id} (type): objective"); looked up per capability the
 * result used, else among the latest leases.
 */
function auditLeases(id, caps) {
  const el = h("span", { class: "audit-leases" }, "—");
  const prefix = `audit ${id} (`;
  const asks = caps && caps.length
    ? caps.map((c) => api.get("capability-leases", { capability_id: c, limit: 200 }))
    : [api.get("capability-leases", { limit: 500 })];
  Promise.all(asks.map((p) => p.catch(() => ({ leases: [] })))).then((rs) => {
    const seen = new Set();
    const found = [];
    for (const r of rs) for (const l of r.leases || []) {
      if (String(l.purpose || "").startsWith(prefix) && !seen.has(l.lease_id)) { seen.add(l.lease_id); found.push(l); }
    }
    if (found.length) replace(el, found.map((l) => [leaseLink(l.lease_id), " ", h("span", { class: "muted" }, `${l.capability_id} ${l.status}`), " "]));
  });
  return el;
}

/** `#/audits/{id}`: one audit request and its result. */
export const detail = {
  path: "#/audits/{id}",
  title: "Audit",
  nav: false,
  render(root, params) {
    const id = params.id;
    const box = h("div");
    replace(root, h("p", null, h("a", { href: "#/audits" }, "← Audit tasks")), box);
    async function load() {
      let rec;
      try { rec = await api.get(`audit-requests/${encodeURIComponent(id)}`); } catch (e) {
        replace(box, h("p", { class: "error" }, e.status === 404 ? `No audit request ${id}.` : `Cannot load: ${e.message}`));
        return;
      }
      let res = null;
      if (rec.status === "completed" || rec.result_status) {
        try { res = await api.get(`audit-requests/${encodeURIComponent(id)}/result`); } catch (_) { res = null; }
      }
      const q = rec.request;
      const c = rec.claim;
      replace(box,
        h("h2", null, "Audit ", h("code", null, q.audit_request_id), " ", badge(rec.status)),
        h("dl", { class: "kv" },
          h("dt", null, "type"), h("dd", null, q.audit_type),
          h("dt", null, "project"), h("dd", null, q.project_name ? `${q.project_name} (${q.project_id})` : q.project_id),
          h("dt", null, "task"), h("dd", null, q.task_id),
          h("dt", null, "trigger"), h("dd", null, q.trigger),
          h("dt", null, "priority"), h("dd", null, String(q.priority)),
          h("dt", null, "objective"), h("dd", { class: "objective" }, q.objective),
          h("dt", null, "time budget"), h("dd", null, fmtDuration(q.time_budget_seconds * 1000)),
          h("dt", null, "attempts"), h("dd", null, `${rec.attempts} of ${rec.max_attempts}`),
          h("dt", null, "created"), h("dd", null, `${fmtTime(rec.created_at)} by ${rec.created_by}`),
          rec.waiting_on?.length ? [h("dt", null, "waiting on"), h("dd", null, rec.waiting_on.map((w) => [h("a", { href: `#/audits/${encodeURIComponent(w)}` }, w), " "]))] : null,
          rec.failure_reason ? [h("dt", null, "failure"), h("dd", { class: "error" }, rec.failure_reason)] : null),
        (q.acceptance_criteria || []).length ? [h("h3", null, "Acceptance criteria"), h("ul", null, q.acceptance_criteria.map((x) => h("li", null, x)))] : null,
        h("h3", null, "Claim"),
        c ? h("dl", { class: "kv claim" },
          h("dt", null, "by"), h("dd", null, `${c.agent_ref} (${c.principal}), attempt ${c.attempt}`),
          h("dt", null, "claimed"), h("dd", null, fmtTime(c.claimed_at)),
          h("dt", null, c.ended_at ? "ended" : "expires"), h("dd", null, c.ended_at ? `${fmtTime(c.ended_at)} (${c.end_reason || ""})` : countdown(c.expires_at)),
          c.lease_group_id ? [h("dt", null, "lease group"), h("dd", null, h("code", null, c.lease_group_id))] : null,
          h("dt", null, "leases"), h("dd", null, (c.lease_ids || []).length ? c.lease_ids.map((l) => [leaseLink(l), " "]) : "—"))
          : h("p", { class: "muted" }, rec.status === "queued" ? "Not claimed yet." : "The claim has ended (its leases are listed below)."),
        (q.artifact_refs || []).length || (q.evidence_refs || []).length ? [h("h3", null, "Cited in the request"),
          h("p", null, (q.artifact_refs || []).concat(q.evidence_refs || []).map((a) => [artifactLink(a), " "]))] : null,
        h("h3", null, "Leases"), h("p", null, auditLeases(q.audit_request_id, res?.used_capabilities)),
        h("h3", null, "Result"),
        res ? resultView(res) : h("p", { class: "muted" }, "No result yet."),
        h("details", null, h("summary", null, "request JSON"), jsonBlock(q)));
    }
    load();
    let pending = null;
    return events.subscribe((ev) => {
      if (!AUDIT_EVENTS.has(ev.event_type) || (ev.audit_request_id && ev.audit_request_id !== id)) return;
      clearTimeout(pending);
      pending = setTimeout(load, 100);
    });
  },
};

function resultView(res) {
  return h("div", { class: "result" },
    h("dl", { class: "kv" },
      h("dt", null, "status"), h("dd", null, badge(res.status)),
      h("dt", null, "decision"), h("dd", { class: "decision" }, badge(res.decision)),
      h("dt", null, "confidence"), h("dd", { class: "confidence" }, `${Math.round((res.confidence ?? 0) * 100)} %`),
      h("dt", null, "summary"), h("dd", { class: "result-summary" }, res.summary),
      h("dt", null, "took"), h("dd", null, fmtDuration(res.duration_ms)),
      h("dt", null, "completed"), h("dd", null, fmtTime(res.completed_at)),
      (res.used_capabilities || []).length ? [h("dt", null, "capabilities"), h("dd", null, res.used_capabilities.join(", "))] : null,
      (res.artifact_refs || []).length ? [h("dt", null, "artifacts"), h("dd", null, res.artifact_refs.map((a) => [artifactLink(a), " "]))] : null,
      (res.required_actions || []).length ? [h("dt", null, "required actions"), h("dd", null, h("ul", null, res.required_actions.map((a) => h("li", null, a))))] : null),
    chiefView(res),
    h("h4", null, "Findings"),
    findingsView(res.findings),
    (res.timeline || []).length ? [h("h4", null, "Timeline"), jsonBlock(res.timeline)] : null);
}

export default list;
