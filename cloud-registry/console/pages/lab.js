// Lab page: every provider with its capabilities grouped by type, their
// holders (priority, time left) and queues (priority, age). Live: an event
// re-fetches only the rows it concerns (a lease event: that capability's
// leases; a provider or health event: that provider and its capabilities).
// A request queued by selector (no capability chosen yet) is listed in the
// queue of every capability its selector matches, marked "any of N". The
// last heartbeat's age ticks in the page from `last_heartbeat_at`.

import { api, events, can } from "../api.js";
import { h, replace, badge, countdown, age } from "../dom.js";

const HOLDING = new Set(["granted", "active", "renew_pending", "preempt_requested", "grace_period"]);

/** The page's model: providers, capabilities, leases by capability. */
class LabModel {
  constructor() {
    this.providers = new Map(); // provider_id -> provider
    this.caps = new Map(); // capability_id -> capability
    this.holders = new Map(); // capability_id -> [lease]
    this.queues = new Map(); // capability_id -> [lease]
    this.bySelector = new Map(); // lease_id -> lease queued by selector
  }

  /** Requests queued by selector that `c` could take, in queue order. */
  selectorQueue(c) {
    const out = [];
    for (const l of this.bySelector.values()) if (selectorMatches(l.capability_selector, c)) out.push(l);
    return out.sort(queueOrder);
  }

  /** How many known capabilities `sel` matches. */
  matchCount(sel) {
    let n = 0;
    for (const c of this.caps.values()) if (selectorMatches(sel, c)) n++;
    return n;
  }

  /** Capability ids a selector-queued lease concerns. */
  capsMatching(sel) {
    const out = [];
    for (const c of this.caps.values()) if (selectorMatches(sel, c)) out.push(c.capability_id);
    return out;
  }

  setLeases(list, onlyCap) {
    if (onlyCap !== undefined) {
      this.holders.set(onlyCap, []);
      this.queues.set(onlyCap, []);
    } else {
      this.holders.clear();
      this.queues.clear();
      this.bySelector.clear();
    }
    for (const l of list) {
      if (!l.capability_id) {
        if (l.status === "requested" && l.capability_selector) this.bySelector.set(l.lease_id, l);
        continue;
      }
      const into = l.status === "requested" ? this.queues : HOLDING.has(l.status) ? this.holders : null;
      if (!into) continue;
      if (!into.has(l.capability_id)) into.set(l.capability_id, []);
      into.get(l.capability_id).push(l);
    }
    for (const m of [this.holders, this.queues]) {
      for (const arr of m.values()) arr.sort(queueOrder);
    }
  }

  /**
   * Apply one lease as an event carries it (the lease at that moment):
   * it moves between queue, holders and gone. Returns the capability ids
   * whose rows changed.
   */
  applyLease(l) {
    const cid = l.capability_id;
    const touched = [];
    const wasSel = this.bySelector.get(l.lease_id);
    if (wasSel) {
      this.bySelector.delete(l.lease_id);
      touched.push(...this.capsMatching(wasSel.capability_selector));
    }
    if (!cid) {
      if (l.status === "requested" && l.capability_selector) {
        this.bySelector.set(l.lease_id, l);
        touched.push(...this.capsMatching(l.capability_selector));
      }
      return [...new Set(touched)];
    }
    for (const m of [this.holders, this.queues]) {
      const arr = m.get(cid);
      if (arr) {
        const i = arr.findIndex((x) => x.lease_id === l.lease_id);
        if (i >= 0) arr.splice(i, 1);
      }
    }
    const into = l.status === "requested" ? this.queues : HOLDING.has(l.status) ? this.holders : null;
    if (into) {
      if (!into.has(cid)) into.set(cid, []);
      const arr = into.get(cid);
      arr.push(l);
      arr.sort(queueOrder);
    }
    const c = this.caps.get(cid);
    if (c && (c.status === "available" || c.status === "leased")) {
      c.status = (this.holders.get(cid) || []).length ? "leased" : "available";
    }
    touched.push(cid);
    return [...new Set(touched)];
  }

  capsOf(providerId) {
    return [...this.caps.values()].filter((c) => c.provider_id === providerId);
  }
}

/** Queue order: higher priority first, then the older request. */
function queueOrder(a, b) {
  return b.priority - a.priority || String(a.requested_at).localeCompare(String(b.requested_at));
}

/** True when capability `c` can serve `sel` (type, every tag, provider, node). */
function selectorMatches(sel, c) {
  if (!sel || !c || sel.capability_type !== c.capability_type) return false;
  if (sel.provider_id && sel.provider_id !== c.provider_id) return false;
  if (sel.node_id && sel.node_id !== c.node_id) return false;
  const tags = c.tags || [];
  return (sel.tags || []).every((t) => tags.includes(t));
}

async function fetchLeases(capabilityId) {
  const q = { limit: 10000 };
  if (capabilityId) q.capability_id = capabilityId;
  const [held, queued] = await Promise.all([
    api.get("capability-leases", Object.assign({ active_only: true }, q)),
    api.get("capability-leases", Object.assign({ status: "requested" }, q)),
  ]);
  return held.leases.concat(queued.leases);
}

function holderCell(l, onRelease, c) {
  const grace = l.status === "grace_period" || l.status === "preempt_requested";
  const until = grace && l.grace_until ? l.grace_until : l.expires_at;
  const mine = l.principal === api.principal;
  return h("div", { class: "holder", dataset: { leaseId: l.lease_id, status: l.status } },
    h("a", { href: `#/leases/${encodeURIComponent(l.lease_id)}`, class: "holder-ref" }, l.holder_ref),
    " ",
    h("span", { class: "prio" }, `p${l.priority}`),
    " ",
    l.status !== "active" && l.status !== "granted" ? badge(l.status) : null,
    " ",
    until ? h("span", { class: grace ? "countdown-wrap grace" : "countdown-wrap" },
      grace ? "ends in " : "", countdown(until)) : null,
    mine && c && c.capability_type === "camera"
      ? [" ", h("a", { href: `#/live/${encodeURIComponent(c.capability_id)}`, class: "live-link" }, "Live")]
      : null,
    (can("release_any") || (mine && can("lease")))
      ? [" ", h("button", { type: "button", class: "action small", title: "Release this lease", on: { click: () => onRelease(l) } }, "Release")]
      : null);
}

/** A waiting request; `anyOf` (a number) for one queued by selector. */
function queueCell(l, anyOf) {
  const sel = l.capability_selector;
  const what = sel ? [sel.capability_type, ...(sel.tags || []).map((t) => `#${t}`), sel.provider_id ? `on ${sel.provider_id}` : null, sel.node_id ? `node ${sel.node_id}` : null].filter(Boolean).join(" ") : "";
  return h("div", { class: anyOf !== undefined ? "queued by-selector" : "queued", dataset: { leaseId: l.lease_id } },
    h("a", { href: `#/leases/${encodeURIComponent(l.lease_id)}` }, l.holder_ref),
    " ", h("span", { class: "prio" }, `p${l.priority}`),
    " ", h("span", { class: "muted" }, "waiting "), age(l.requested_at, { ago: false }),
    anyOf !== undefined
      ? [" ", h("span", { class: "selector muted small", title: `queued by selector: ${what}; granted to the first of these that is free` }, `by selector: ${what} (any of ${anyOf})`)]
      : null);
}

export default {
  path: "#/lab",
  title: "Lab",
  render(root) {
    const model = new LabModel();
    const summary = h("span", { class: "summary", id: "lab-summary" }, "Loading…");
    const list = h("div", { id: "providers" });
    const err = h("p", { class: "error", id: "lab-error" });
    replace(root, h("div", { class: "toolbar" }, h("h1", null, "Lab"), summary), err, list);
    const cards = new Map(); // provider_id -> card element
    const rows = new Map(); // capability_id -> tr

    const release = async (l) => {
      try {
        await api.post(`capability-leases/${encodeURIComponent(l.lease_id)}/release`, { reason: "released from the console" });
      } catch (e) {
        replace(err, `Release failed: ${e.message}`);
      }
    };

    function capRow(c, online) {
      const holders = model.holders.get(c.capability_id) || [];
      const queue = model.queues.get(c.capability_id) || [];
      const bySel = model.selectorQueue(c);
      const waiting = [...queue.map((l) => [l, undefined]), ...bySel.map((l) => [l, model.matchCount(l.capability_selector)])]
        .sort((a, b) => queueOrder(a[0], b[0]));
      return h("tr", {
        class: ["cap", online ? null : "offline"],
        dataset: { capabilityId: c.capability_id, status: c.status, health: c.health_status },
      },
      h("td", { class: "name" }, h("div", null, c.display_name), h("code", { class: "muted" }, c.capability_id)),
      h("td", null, badge(c.status)),
      h("td", null, badge(c.health_status)),
      h("td", null, c.lease_mode, c.preemptible ? null : h("div", { class: "muted small" }, "not preemptible")),
      h("td", { class: "holders" }, holders.length ? holders.map((l) => holderCell(l, release, c)) : h("span", { class: "muted" }, "—")),
      h("td", { class: "queue" }, waiting.length ? waiting.map(([l, n]) => queueCell(l, n)) : h("span", { class: "muted" }, "—")));
    }

    function providerCard(p) {
      const online = p.online_status === "online";
      const caps = model.capsOf(p.provider_id).sort((a, b) =>
        String(a.capability_type).localeCompare(String(b.capability_type)) || a.capability_id.localeCompare(b.capability_id));
      const groups = new Map();
      for (const c of caps) {
        if (!groups.has(c.capability_type)) groups.set(c.capability_type, []);
        groups.get(c.capability_type).push(c);
      }
      const body = [];
      for (const [type, list] of groups) {
        list.forEach((c, i) => {
          const tr = capRow(c, online);
          if (i === 0) {
            tr.insertBefore(h("td", { class: "type", rowspan: String(list.length) }, type.replace(/_/g, " ")), tr.firstChild);
            tr.classList.add("group-start");
          }
          tr.dataset.type = type;
          rows.set(c.capability_id, tr);
          body.push(tr);
        });
      }
      // Heartbeats are not events: the age ticks here from the last
      // `last_heartbeat_at` fetched (on opening, on this provider's events).
      const hb = p.last_heartbeat_at ? age(p.last_heartbeat_at) : h("span", null, "—");
      hb.classList.add("heartbeat-age");
      return h("section", {
        class: ["card", "provider", online ? "online" : "offline"],
        dataset: { providerId: p.provider_id, online: String(online) },
      },
      h("div", { class: "card-head" },
        h("span", { class: "title" }, p.provider_id),
        badge(p.online_status),
        h("span", { class: "meta" }, "host ", h("b", null, p.hostname || "—")),
        h("span", { class: "meta" }, "platform ", h("b", null, p.platform || "—")),
        h("span", { class: "meta" }, "boot ", h("code", null, p.boot_id || "—")),
        h("span", { class: "meta" }, "last heartbeat ", h("b", null, hb))),
      h("div", { class: "card-body" },
        caps.length
          ? h("table", { class: "grid caps" },
            h("colgroup", null, ["c-type", "c-name", "c-status", "c-health", "c-mode", "c-holder", "c-queue"].map((c) => h("col", { class: c }))),
            h("thead", null, h("tr", null, ["Type", "Capability", "Status", "Health", "Lease mode", "Holder (priority, time left)", "Queue (priority, waiting)"].map((x) => h("th", null, x)))),
            h("tbody", null, body))
          : h("p", { class: "muted" }, "No capabilities registered.")));
    }

    function renderSummary() {
      const ps = [...model.providers.values()];
      const on = ps.filter((p) => p.online_status === "online").length;
      let held = 0, queued = 0;
      for (const a of model.holders.values()) held += a.length;
      for (const a of model.queues.values()) queued += a.length;
      queued += model.bySelector.size;
      replace(summary, `${ps.length} providers (${on} online) · ${model.caps.size} capabilities · ${held} held · ${queued} waiting`);
    }

    function renderAll() {
      cards.clear();
      rows.clear();
      const ps = [...model.providers.values()].sort((a, b) => a.provider_id.localeCompare(b.provider_id));
      const frag = document.createDocumentFragment();
      for (const p of ps) {
        const card = providerCard(p);
        cards.set(p.provider_id, card);
        frag.appendChild(card);
      }
      replace(list, ps.length ? frag : h("p", { class: "empty" }, "No provider has registered yet."));
      renderSummary();
      root.dataset.rendered = "true";
    }

    function renderProvider(id) {
      const p = model.providers.get(id);
      if (!p) return;
      for (const [cid, tr] of rows) if (!tr.isConnected) rows.delete(cid);
      const card = providerCard(p);
      const old = cards.get(id);
      cards.set(id, card);
      if (old && old.isConnected) old.replaceWith(card);
      else renderAll();
      renderSummary();
    }

    function renderCap(cid) {
      const c = model.caps.get(cid);
      const tr = rows.get(cid);
      if (!c || !tr || !tr.isConnected) { if (c) renderProvider(c.provider_id); return; }
      const p = model.providers.get(c.provider_id);
      const nt = capRow(c, p && p.online_status === "online");
      const typeCell = tr.querySelector("td.type");
      if (typeCell) { nt.insertBefore(typeCell, nt.firstChild); nt.classList.add("group-start"); }
      nt.dataset.type = tr.dataset.type;
      rows.set(cid, nt);
      tr.replaceWith(nt);
    }

    // Coalesced refreshes: many events for one key cost one fetch.
    const pendingCaps = new Set();
    const pendingProviders = new Set();
    let scheduled = false;
    let stopped = false;
    function schedule() {
      if (scheduled) return;
      scheduled = true;
      setTimeout(flush, 30);
    }
    async function flush() {
      scheduled = false;
      const ps = [...pendingProviders];
      const cs = [...pendingCaps];
      pendingProviders.clear();
      pendingCaps.clear();
      try {
        await Promise.all(ps.map(async (pid) => {
          const [p, caps] = await Promise.all([
            api.get(`capability-providers/${encodeURIComponent(pid)}`),
            api.get("capabilities", { provider_id: pid }),
          ]);
          if (stopped) return;
          model.providers.set(pid, p);
          for (const [id, c] of model.caps) if (c.provider_id === pid) model.caps.delete(id);
          for (const c of caps.capabilities) model.caps.set(c.capability_id, c);
          renderProvider(pid);
        }));
        await Promise.all(cs.map(async (cid) => {
          const [leases, cap] = await Promise.all([
            fetchLeases(cid),
            api.get(`capabilities/${encodeURIComponent(cid)}`).catch(() => null),
          ]);
          if (stopped) return;
          if (cap) model.caps.set(cid, cap);
          model.setLeases(leases, cid);
          renderCap(cid);
          renderSummary();
        }));
        replace(err);
      } catch (e) {
        if (!stopped) replace(err, `Refresh failed: ${e.message}`);
      }
    }

    // Lease events carry the lease: applied at once once the first load is
    // in (before that, the capability's leases are fetched after it).
    let loaded = false;
    const dirty = new Set();
    let frame = 0;
    const paint = () => {
      frame = 0;
      for (const cid of dirty) renderCap(cid);
      dirty.clear();
      renderSummary();
    };
    const unsubscribe = events.subscribe((ev) => {
      const t = ev.event_type || "";
      if (t.startsWith("lease_")) {
        const cid = ev.capability_id || (ev.data && ev.data.capability_id);
        if (!cid) {
          // A request queued by selector: its rows are those it matches.
          if (!loaded || !ev.data?.lease_id || !(ev.data.capability_selector || model.bySelector.has(ev.data.lease_id))) return;
          for (const c of model.applyLease(ev.data)) dirty.add(c);
          if (!frame) frame = requestAnimationFrame(paint);
          return;
        }
        if (!loaded || !ev.data || !ev.data.lease_id) { pendingCaps.add(cid); schedule(); return; }
        for (const c of model.applyLease(ev.data)) dirty.add(c);
        if (!frame) frame = requestAnimationFrame(paint);
      } else if (t === "provider_registered" || t === "capability_registered" || t === "capability_health_changed") {
        const pid = ev.provider_id || (ev.data && ev.data.provider_id);
        if (pid) { pendingProviders.add(pid); schedule(); }
      }
    });

    (async () => {
      try {
        const t0 = performance.now();
        const [ps, cs, ls] = await Promise.all([
          api.get("capability-providers"),
          api.get("capabilities"),
          fetchLeases(),
        ]);
        if (stopped) return;
        for (const p of ps.providers) model.providers.set(p.provider_id, p);
        for (const c of cs.capabilities) model.caps.set(c.capability_id, c);
        model.setLeases(ls);
        loaded = true;
        renderAll();
        if (pendingCaps.size) schedule();
        root.dataset.renderMs = String(Math.round(performance.now() - t0));
      } catch (e) {
        replace(summary, "");
        replace(err, `Cannot load the lab: ${e.message}`);
      }
    })();

    return () => { stopped = true; unsubscribe(); if (frame) cancelAnimationFrame(frame); };
  },
};

