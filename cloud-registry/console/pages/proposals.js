// Config proposals: `#/proposals` (admins; the API refuses others) with
// each proposal's before/after diff, risk level, policy result, and Apply
// / Reject. The page follows the server's policy (docs/earth-command.md
// "Proposal policy"): a super_admin applies a low-risk proposal at once
// (the server's `auto` mode); every other apply asks for a confirmation
// first and is sent with `{"confirm": true}`; a proposal the policy
// rejected (secret fields, schema errors) shows as rejected with the
// reason and offers no Apply. The page follows the `agent_proposal_*`
// events (which only admins' streams carry): a proposal created, or
// applied or rejected by anyone, has its card put in place without a
// reload (fetched with its run, which lists its proposals).

import { api, can, events, coalesced } from "../api.js";
import { h, replace, clear, fmtTime, badge } from "../dom.js";
import { jsonBlock } from "./artifact.js";

/** Flatten a JSON value into `path → value` (objects by key; arrays whole). */
function flatten(v, prefix, out) {
  if (v && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length) {
    for (const [k, x] of Object.entries(v)) flatten(x, prefix ? `${prefix}.${k}` : k, out);
  } else if (prefix) {
    out.set(prefix, v);
  }
  return out;
}

const show = (v) => (v === undefined ? "" : typeof v === "string" ? v : JSON.stringify(v));

/** A table of the fields that differ between `before` and `after` (and the others folded). */
export function diffView(before, after) {
  const b = flatten(before ?? {}, "", new Map());
  const a = flatten(after ?? {}, "", new Map());
  const keys = [...new Set([...b.keys(), ...a.keys()])].sort();
  const rows = [], same = [];
  for (const k of keys) {
    const bv = b.get(k), av = a.get(k);
    const kind = !b.has(k) ? "added" : !a.has(k) ? "removed" : show(bv) === show(av) ? "same" : "changed";
    const tr = h("tr", { class: `diff-${kind}` }, h("td", null, h("code", null, k)), h("td", { class: "before" }, h("pre", null, show(bv))), h("td", { class: "after" }, h("pre", null, show(av))), h("td", null, kind));
    (kind === "same" ? same : rows).push(tr);
  }
  return h("div", { class: "diff" },
    h("table", { class: "grid diff-table" },
      h("thead", null, h("tr", null, h("th", null, "field"), h("th", null, "before"), h("th", null, "after"), h("th", null, ""))),
      h("tbody", null, rows.length ? rows : h("tr", null, h("td", { colspan: 4, class: "muted" }, "No field changes.")))),
    same.length ? h("details", null, h("summary", null, `${same.length} unchanged fields`),
      h("table", { class: "grid" }, h("tbody", null, same))) : null);
}

function policyView(p) {
  const pr = p.policy_result || {};
  return h("dl", { class: "kv policy" },
    h("dt", null, "policy decision"), h("dd", { class: "policy-decision" }, String(pr.decision ?? "—")),
    pr.applied_mode ? [h("dt", null, "applied mode"), h("dd", null, pr.applied_mode)] : null,
    (pr.risk_reasons || []).length ? [h("dt", null, "risk reasons"), h("dd", null, h("ul", null, pr.risk_reasons.map((r) => h("li", null, show(r)))))] : null,
    (pr.secret_fields || []).length ? [h("dt", null, "secret fields"), h("dd", { class: "secret-fields" }, pr.secret_fields.map(show).join(", "))] : null,
    (pr.schema_errors || []).length ? [h("dt", null, "schema errors"), h("dd", null, h("ul", null, pr.schema_errors.map((r) => h("li", null, show(r)))))] : null,
    pr.last_refusal ? [h("dt", null, "last refusal"), h("dd", null, `${pr.last_refusal.by} (${pr.last_refusal.role}): ${pr.last_refusal.reason}`)] : null,
    p.applied_by ? [h("dt", null, "applied by"), h("dd", null, `${p.applied_by} at ${fmtTime(p.applied_at)}`)] : null);
}

/** Whether the server would apply `p` for this role without a confirmation. */
function autoApplies(p) {
  return can("auto_apply") && p.risk_level === "low";
}

/**
 * One proposal as a card; `changed()` is called after it was applied or
 * rejected (the caller reloads).
 */
export function proposalCard(p, changed) {
  const msg = h("div", { class: "proposal-msg", role: "status" });
  const actions = h("div", { class: "toolbar proposal-actions" });
  const open = p.status === "pending" || p.status === "approved";
  const send = async (verb, body) => {
    clear(msg);
    try {
      const out = await api.post(`agents/proposals/${p.id}/${verb}`, body);
      replace(msg, h("p", { class: "ok" }, verb === "apply" ? `Applied (${out?.policy_result?.applied_mode ?? "manual"}).` : "Rejected."));
      setTimeout(() => changed && changed(), 300);
    } catch (e) {
      if (e.code === "confirmation_required") { askConfirm(e.message); return; }
      replace(msg, h("p", { class: "error", role: "alert" }, `${e.code}: ${e.message}`));
    }
  };
  const askConfirm = (why) => {
    replace(msg, h("div", { class: "confirm", id: `confirm-${p.id}` },
      h("p", null, why || `Apply this ${p.risk_level}-risk change to ${show(p.target)}? It takes effect at once.`),
      h("button", { type: "button", class: "primary confirm-apply", on: { click: () => send("apply", { confirm: true }) } }, "Confirm apply"),
      h("button", { type: "button", class: "link", on: { click: () => clear(msg) } }, "Cancel")));
  };
  if (open && can("apply_proposal")) {
    actions.appendChild(h("button", { type: "button", class: "primary apply", on: { click: () => {
      if (autoApplies(p)) send("apply", {});
      else askConfirm();
    } } }, autoApplies(p) ? "Apply (low risk)" : "Apply…"));
  }
  if (open && can("reject_proposal")) {
    const reason = h("input", { type: "text", class: "reject-reason", placeholder: "reason", maxlength: "500" });
    actions.appendChild(reason);
    actions.appendChild(h("button", { type: "button", class: "danger reject", on: { click: () => {
      const r = reason.value.trim();
      if (!r) { replace(msg, h("p", { class: "error" }, "Give a reason to reject.")); reason.focus(); return; }
      send("reject", { reason: r });
    } } }, "Reject"));
  }
  return h("section", { class: `card proposal status-${p.status}`, dataset: { proposalId: String(p.id), status: p.status } },
    h("div", { class: "card-head" },
      h("span", { class: "title" }, `Proposal #${p.id} · ${p.proposal_type}`), " ",
      h("code", null, show(p.target)), h("span", { class: "spacer" }),
      h("span", { class: "risk" }, "risk ", badge(`risk-${p.risk_level}`, p.risk_level)), " ", badge(p.status)),
    h("div", { class: "card-body" },
      p.status === "rejected" || p.status === "failed"
        ? h("p", { class: "error rejection" }, h("b", null, p.status === "rejected" ? "Rejected: " : "Failed: "), p.error || "no reason recorded")
        : null,
      h("p", { class: "rationale" }, h("b", null, "Rationale: "), p.rationale),
      h("p", { class: "muted" }, "Run ", h("a", { class: "run-ref", href: `#/runs/${encodeURIComponent(p.run_id)}` }, h("code", null, p.run_id))),
      diffView(p.before_payload, p.after_payload),
      policyView(p),
      h("details", null, h("summary", null, "policy result JSON"), jsonBlock(p.policy_result)),
      actions, msg));
}

const page = {
  path: "#/proposals",
  title: "Proposals",
  render(root) {
    const f = { status: "" };
    const box = h("div", { class: "proposals" });
    const err = h("p", { class: "error" });
    replace(root, h("h2", null, "Config proposals"),
      h("div", { class: "filters toolbar" },
        h("label", null, "Status ", h("select", { name: "status", on: { change: (e) => { f.status = e.target.value; load(); } } },
          ["", "pending", "applied", "rejected", "failed"].map((s) => h("option", { value: s }, s || "any status")))),
        h("button", { type: "button", on: { click: () => load() } }, "Refresh")),
      can("admin") ? null : h("p", { class: "muted" }, "Only admins see and decide proposals."),
      err, box);
    const cards = new Map(); // proposal id -> card
    const put = (p) => {
      const old = cards.get(p.id);
      if (f.status && p.status !== f.status) { if (old) { old.remove(); cards.delete(p.id); } return; }
      const card = proposalCard(p, () => refresh(p.run_id));
      card.classList.add("fresh");
      if (old) old.replaceWith(card);
      else {
        box.querySelector("p.none")?.remove();
        // Newest (highest id) first, as the list comes.
        const after = [...cards.entries()].filter(([id]) => id < p.id).sort((a, b) => b[0] - a[0])[0];
        box.insertBefore(card, after ? after[1] : null);
      }
      cards.set(p.id, card);
    };
    let gen = 0;
    async function load() {
      const my = ++gen;
      try {
        const r = await api.get("agents/proposals", { status: f.status, limit: 200 });
        if (my !== gen) return;
        clear(box); cards.clear(); err.textContent = "";
        const list = r.proposals || [];
        for (const p of list) {
          const card = proposalCard(p, () => refresh(p.run_id));
          cards.set(p.id, card);
          box.appendChild(card);
        }
        if (!list.length) box.appendChild(h("p", { class: "muted none" }, "No proposals."));
      } catch (e) {
        err.textContent = e.status === 403 ? "Your role may not see proposals." : `Cannot list proposals: ${e.message}`;
      }
    }
    // An event names its proposal and run: the run's detail lists its
    // proposals, so one fetch brings the cards of that run up to date.
    const pending = new Map(); // run_id -> proposal ids to put
    const refresh = coalesced(async (runId) => {
      const ids = pending.get(runId);
      pending.delete(runId);
      const d = await api.get(`agents/runs/${encodeURIComponent(runId)}`);
      for (const p of d.proposals || []) if (!ids || ids.has(p.id) || cards.has(p.id)) put(p);
    });
    load();
    if (!can("admin")) return undefined;
    return events.subscribe((ev) => {
      if (ev.event_type !== "agent_proposal_created" && ev.event_type !== "agent_proposal_updated") return;
      const runId = ev.data?.run_id, pid = ev.data?.proposal_id;
      if (typeof runId !== "string" || typeof pid !== "number") return;
      if (!pending.has(runId)) pending.set(runId, new Set());
      pending.get(runId).add(pid);
      refresh(runId);
    });
  },
};

export default page;
