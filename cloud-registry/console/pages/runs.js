// Agent runs: `#/runs` (status, type, title, creator, model, time,
// duration) and `#/runs/{id}` (input, status timeline, LLM and tool steps,
// evidence, final result, proposals; an Earth command run also shows its
// text or transcription, the matched entities and the action plan, with
// a button copying the run id). Both follow the `agent_run_*` events (and
// the detail the `agent_proposal_*` events of its run): the list fetches
// the run an event names and puts its row in place, the detail fetches
// itself again; a burst of events for one run costs one fetch at a time.

import { api, can, events, coalesced } from "../api.js";
import { h, replace, clear, fmtTime, fmtDuration, badge } from "../dom.js";
import { jsonBlock } from "./artifact.js";
import { proposalCard } from "./proposals.js";

const FINAL = new Set(["completed", "failed", "stopped"]);
const RUN_EVENTS = new Set(["agent_run_created", "agent_run_updated"]);
const PROPOSAL_EVENTS = new Set(["agent_proposal_created", "agent_proposal_updated"]);

function took(run) {
  const end = run.completed_at || (FINAL.has(run.status) ? run.updated_at : null);
  return end ? fmtDuration(new Date(end) - new Date(run.created_at)) : "running";
}

function modelOf(run) {
  if (run.model) return run.provider ? `${run.provider} · ${run.model}` : run.model;
  return run.run_type === "earth_command" ? "deterministic resolver" : "—";
}

const list = {
  path: "#/runs",
  title: "Agent runs",
  render(root) {
    const f = { run_type: "", status: "" };
    const body = h("tbody");
    const err = h("p", { class: "error" });
    const summary = h("span", { class: "summary" });
    const sel = (name, values, label) => h("label", null, label, " ", h("select", { name, on: { change: (e) => { f[name] = e.target.value; load(); } } },
      values.map((v) => h("option", { value: v }, v || `any ${label.toLowerCase()}`))));
    replace(root, h("h2", null, "Agent runs"),
      h("div", { class: "filters toolbar" },
        sel("run_type", ["", "earth_command", "situational_awareness", "config_proposal", "diagnostic"], "Type"),
        sel("status", ["", "queued", "running", "waiting_approval", "completed", "failed", "stopped"], "Status"),
        h("button", { type: "button", id: "runs-refresh", on: { click: () => load() } }, "Refresh"), summary),
      err,
      h("table", { class: "grid runs" },
        h("thead", null, h("tr", null, ["run", "status", "type", "title", "creator", "model", "created", "duration"].map((x) => h("th", null, x)))),
        body));
    const rows = new Map(); // run_id -> <tr>
    const row = (run) => h("tr", { dataset: { runId: run.run_id, status: run.status } },
      h("td", null, h("a", { href: `#/runs/${encodeURIComponent(run.run_id)}` }, h("code", null, run.run_id))),
      h("td", null, badge(run.status)),
      h("td", null, run.run_type),
      h("td", { class: "run-title" }, run.title),
      h("td", null, run.created_by),
      h("td", null, modelOf(run)),
      h("td", null, fmtTime(run.created_at)),
      h("td", { class: "num" }, took(run)));
    const matches = (run) => (!f.run_type || run.run_type === f.run_type) && (!f.status || run.status === f.status);
    const count = () => { summary.textContent = `${rows.size} runs`; };
    // Put one run's row in place: replaced where it is, a new one on top
    // (the list is newest first), removed when it no longer matches.
    const put = (run) => {
      const old = rows.get(run.run_id);
      if (!matches(run)) { if (old) { old.remove(); rows.delete(run.run_id); count(); } return; }
      const tr = row(run);
      if (old) old.replaceWith(tr);
      else { body.querySelector("tr.none")?.remove(); body.insertBefore(tr, body.firstChild); }
      rows.set(run.run_id, tr);
      tr.classList.add("fresh");
      count();
    };
    let gen = 0;
    async function load() {
      const my = ++gen;
      try {
        const r = await api.get("agents/runs", { run_type: f.run_type, status: f.status, limit: 100 });
        if (my !== gen) return;
        clear(body); rows.clear(); err.textContent = "";
        for (const run of r.runs || []) {
          const tr = row(run);
          rows.set(run.run_id, tr);
          body.appendChild(tr);
        }
        count();
        if (!rows.size) body.appendChild(h("tr", { class: "none" }, h("td", { colspan: 8, class: "muted" }, "No runs.")));
      } catch (e) { err.textContent = `Cannot list runs: ${e.message}`; }
    }
    const refresh = coalesced(async (runId) => {
      const d = await api.get(`agents/runs/${encodeURIComponent(runId)}`);
      put(d.run);
    });
    load();
    return events.subscribe((ev) => {
      const runId = ev.data?.run_id;
      if (RUN_EVENTS.has(ev.event_type) && typeof runId === "string") refresh(runId);
    });
  },
};

function stepView(s) {
  const io = [];
  if (s.input !== null && s.input !== undefined) io.push(h("details", null, h("summary", null, "input"), jsonBlock(s.input)));
  if (s.output !== null && s.output !== undefined) io.push(h("details", null, h("summary", null, "output"), jsonBlock(s.output)));
  return h("li", { class: `step step-${s.step_type}`, dataset: { stepType: s.step_type, stepName: s.name } },
    h("span", { class: "step-index" }, `#${s.step_index}`), " ",
    h("b", null, s.step_type), " ", h("code", { class: "step-name" }, s.name), " ", badge(s.status),
    s.duration_ms != null ? h("span", { class: "muted" }, ` ${fmtDuration(s.duration_ms)}`) : null,
    s.error ? h("p", { class: "error" }, s.error) : null, io);
}

function copyButton(text) {
  const b = h("button", { type: "button", class: "copy-run-id", id: "copy-run-id", on: { click: async () => {
    try {
      await navigator.clipboard.writeText(text);
      b.textContent = "Copied"; b.dataset.copied = "true";
    } catch (_) {
      // No clipboard permission: select the id so the user can copy it.
      const sel = window.getSelection();
      const r = document.createRange();
      r.selectNodeContents(document.getElementById("run-id"));
      sel.removeAllRanges(); sel.addRange(r);
      b.textContent = "Selected: press Ctrl+C"; b.dataset.copied = "selected";
    }
    setTimeout(() => { if (b.isConnected) b.textContent = "Copy run id"; }, 2000);
  } } }, "Copy run id");
  return b;
}

function earthView(run, steps, evidence) {
  const res = run.result_json || {};
  const input = run.input || {};
  const tr = steps.find((s) => s.step_type === "transcription");
  const trEv = evidence.find((e) => e.evidence_type === "transcription");
  const spoken = tr?.output?.text ?? trEv?.content;
  const plan = steps.find((s) => s.step_type === "action" && s.name === "earth.action_plan");
  const actions = res.actions || plan?.output?.actions || plan?.output || [];
  const ents = res.matched_entities || [];
  return h("div", { class: "earth" },
    h("h3", null, "Command"),
    h("dl", { class: "kv" },
      h("dt", null, "source"), h("dd", null, input.source || "text"),
      h("dt", null, spoken !== undefined ? "transcription" : "text"), h("dd", { class: "earth-text" }, spoken ?? input.input_text ?? run.objective),
      input.transcription_id ? [h("dt", null, "transcription id"), h("dd", null, h("code", null, input.transcription_id))] : null,
      res.summary ? [h("dt", null, "summary"), h("dd", { class: "earth-summary" }, res.summary)] : null,
      res.confidence !== undefined ? [h("dt", null, "confidence"), h("dd", null, `${Math.round(res.confidence * 100)} %`)] : null,
      res.clarification_needed ? [h("dt", null, "clarification"), h("dd", null, "needed")] : null),
    (res.missing_data || []).length ? h("ul", { class: "muted missing" }, res.missing_data.map((m) => h("li", null, m))) : null,
    h("h3", null, `Action plan (${Array.isArray(actions) ? actions.length : 0})`),
    h("ol", { class: "plan" }, (Array.isArray(actions) ? actions : []).map((a) => h("li", { class: "plan-action", dataset: { actionType: a.type } },
      h("b", null, a.type), " ",
      a.layer ? `layer ${a.layer} ` : "", a.domain ? `domain ${a.domain} ` : "",
      a.entity_ids ? `${a.entity_ids.length} entities ` : "", a.title ? `“${a.title}” ` : "",
      a.reason ? h("span", { class: "muted" }, a.reason) : null,
      h("details", null, h("summary", null, "JSON"), jsonBlock(a))))),
    h("h3", null, `Matched entities (${ents.length})`),
    ents.length ? h("details", { open: ents.length <= 20 }, h("summary", null, `${ents.length} entities`), h("table", { class: "grid entities" },
      h("thead", null, h("tr", null, ["entity", "name", "domain", "country", "lat", "lon"].map((x) => h("th", null, x)))),
      h("tbody", null, ents.slice(0, 200).map((e) => h("tr", null,
        h("td", null, h("code", null, e.entity_id)), h("td", null, e.name), h("td", null, e.domain),
        h("td", null, e.country || "—"),
        h("td", { class: "num" }, e.lat != null ? e.lat.toFixed(2) : "—"),
        h("td", { class: "num" }, e.lon != null ? e.lon.toFixed(2) : "—"))))))
      : h("p", { class: "muted" }, "None."),
    ents.length > 200 ? h("p", { class: "muted" }, `… and ${ents.length - 200} more.`) : null);
}

function timeline(run, steps) {
  const items = [{ at: run.created_at, what: `created by ${run.created_by}`, cls: "created" }];
  for (const s of steps) if (s.started_at) items.push({ at: s.started_at, what: `${s.step_type} ${s.name}: ${s.status}`, cls: s.status });
  if (run.completed_at || FINAL.has(run.status) || run.status === "waiting_approval") {
    items.push({ at: run.completed_at || run.updated_at, what: run.status, cls: run.status });
  }
  items.sort((a, b) => new Date(a.at) - new Date(b.at));
  return h("ul", { class: "timeline run-timeline" }, items.map((i) =>
    h("li", { class: `ev-${i.cls}` }, h("span", { class: "when" }, fmtTime(i.at)), " ", h("span", { class: "what" }, i.what))));
}

/** `#/runs/{id}`: one run in full. */
export const detail = {
  path: "#/runs/{id}",
  title: "Agent run",
  nav: false,
  render(root, params) {
    const id = params.id;
    const box = h("div", { id: "run-detail" });
    replace(root, h("p", null, h("a", { href: "#/runs" }, "← Agent runs")), box);
    // A reload keeps the sections the reader unfolded (by their summary).
    const unfolded = () => new Set([...box.querySelectorAll("details[open] > summary")].map((s) => s.textContent));
    async function load() {
      const keep = unfolded();
      let d;
      try { d = await api.get(`agents/runs/${encodeURIComponent(id)}`); } catch (e) {
        replace(box, h("p", { class: "error" }, e.status === 404 ? `No run ${id}.` : `Cannot load the run: ${e.message}`));
        return;
      }
      const { run, steps = [], evidence = [], proposals = [] } = d;
      const llm = steps.filter((s) => s.step_type === "llm");
      const tools = steps.filter((s) => s.step_type === "tool");
      const other = steps.filter((s) => s.step_type !== "llm" && s.step_type !== "tool");
      const canStop = !FINAL.has(run.status) && (run.created_by === api.principal || can("admin"));
      replace(box,
        h("h2", null, h("span", { class: "run-title" }, run.title), " ", badge(run.status)),
        h("div", { class: "toolbar" },
          h("code", { id: "run-id" }, run.run_id), copyButton(run.run_id),
          h("button", { type: "button", on: { click: load } }, "Refresh"),
          canStop ? h("button", { type: "button", class: "danger", on: { click: async () => {
            try { await api.post(`agents/runs/${encodeURIComponent(id)}/stop`); } catch (e) { alertBox(box, e); }
            load();
          } } }, "Stop") : null),
        h("dl", { class: "kv" },
          h("dt", null, "type"), h("dd", null, run.run_type),
          h("dt", null, "objective"), h("dd", { class: "run-objective" }, run.objective),
          h("dt", null, "creator"), h("dd", null, run.created_by),
          h("dt", null, "model"), h("dd", null, modelOf(run)),
          h("dt", null, "created"), h("dd", null, fmtTime(run.created_at)),
          h("dt", null, "duration"), h("dd", null, took(run)),
          run.request_id ? [h("dt", null, "request id"), h("dd", null, h("code", null, run.request_id))] : null,
          run.error ? [h("dt", null, "error"), h("dd", { class: "error" }, run.error)] : null),
        run.run_type === "earth_command" ? earthView(run, steps, evidence) : null,
        h("h3", null, "Status timeline"), timeline(run, steps),
        h("h3", null, "Input"), jsonBlock(run.input, "run-input"),
        h("h3", null, `LLM steps (${llm.length})`), llm.length ? h("ol", { class: "steps llm-steps" }, llm.map(stepView)) : h("p", { class: "muted" }, "None: no model was used."),
        h("h3", null, `Tool steps (${tools.length})`), tools.length ? h("ol", { class: "steps tool-steps" }, tools.map(stepView)) : h("p", { class: "muted" }, "None."),
        other.length ? [h("h3", null, "Policy, action and transcription steps"), h("ol", { class: "steps other-steps" }, other.map(stepView))] : null,
        h("h3", null, `Evidence (${evidence.length})`),
        evidence.length ? h("ul", { class: "evidence" }, evidence.map((e) => h("li", null,
          badge(e.evidence_type), " ", h("b", null, e.title), " ", h("span", { class: "muted" }, e.source),
          e.url ? [" ", h("code", null, e.url)] : null,
          e.content_hash ? h("div", { class: "muted" }, "sha256 ", h("code", null, e.content_hash)) : null,
          h("details", null, h("summary", null, "content"), h("pre", { class: "evidence-content" }, e.content))))) : h("p", { class: "muted" }, "None."),
        h("h3", null, "Final result"),
        run.result_markdown ? h("pre", { class: "result-markdown" }, run.result_markdown) : null,
        run.result_json ? h("details", null, h("summary", null, "result JSON"), jsonBlock(run.result_json)) : null,
        !run.result_markdown && !run.result_json ? h("p", { class: "muted" }, "No result yet.") : null,
        h("h3", null, `Proposals (${proposals.length})`),
        proposals.length ? h("div", { class: "proposals" }, proposals.map((p) => proposalCard(p, load))) : h("p", { class: "muted" }, "None."));
      box.dataset.status = run.status;
      box.dataset.steps = String(steps.length);
      for (const s of box.querySelectorAll("details > summary")) if (keep.has(s.textContent)) s.parentElement.open = true;
    }
    const reload = coalesced(load);
    load();
    return events.subscribe((ev) => {
      if ((RUN_EVENTS.has(ev.event_type) || PROPOSAL_EVENTS.has(ev.event_type)) && ev.data?.run_id === id) reload(id);
    });
  },
};

function alertBox(box, e) {
  box.insertBefore(h("p", { class: "error", role: "alert" }, e.message), box.firstChild);
}

export default list;
