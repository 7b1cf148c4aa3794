// The Earth command's action executor: runs a validated EarthActionPlan
// (the `actions` of `POST /api/v1/agents/earth/command`) against a map
// context, in this order:
//   1. clear the previous AI highlight (unless `plan.additive`),
//   2. show the layers the plan names (and the layer of every domain it
//      highlights or filters),
//   3. apply filters and highlights,
//   4. focus the view,
//   5. open the result panel,
//   6. record the execution summary (getEarthCommandExecutionState()).
//
// The map is injected: `context` is
//   {
//     entities(domain) -> [{entity_id, name, ...}]   loaded entities; an
//                          entity's position in the array is its index
//     highlights(domain) -> HighlightState           that domain's marker states
//     setLayer(layer, enabled)                       layer = a domain name
//     setFilter(domain, indices | null)              null shows every entity
//     focus({lat, lon, altitude_km, region, entity_id})
//     showResult({title, items, count, summary, missing_data, notes, run_id})
//     redraw()                                       optional, called once at the end
//   }
// so the executor runs the same against the page's canvas and a test's
// fake. A plan the backend would refuse (an unknown action type or domain,
// more than 500 ids in one highlight) is refused whole: nothing is
// changed and the answer is `{ok: false, error}`. Ids the map does not
// know are skipped with a note.

/** Action types the backend may return. */
export const ACTION_TYPES = Object.freeze([
  "show_layer", "highlight_entities", "filter_entities", "focus_view", "open_result_panel", "clear_highlight",
]);

/** Domains (also the layer names of `show_layer`). */
export const DOMAINS = Object.freeze(["satellites", "compute_centers", "bgp", "news", "vessels", "cables"]);

/** Most ids one `highlight_entities` may carry. */
export const MAX_HIGHLIGHT_IDS = 500;

/** Colour used when an action has none (or an invalid one), per domain. */
export const DOMAIN_COLORS = Object.freeze({
  satellites: "#7dd3fc", compute_centers: "#f59e0b", bgp: "#ef4444",
  news: "#a78bfa", vessels: "#34d399", cables: "#f472b6",
});

const COLOR_RE = /^#(?:[0-9a-fA-F]{3}|[0-9a-fA-F]{6})$/;

/**
 * The states of one layer's markers, kept apart: the AI command's
 * highlight (`ai`, a set of indices with its colour), the marker under the
 * pointer (`hover`) and the user's locked selection (`locked`). Clearing
 * the AI highlight never touches `hover` or `locked`.
 */
export class HighlightState {
  constructor() {
    /** @type {Set<number>} indices highlighted by the last AI command */
    this.ai = new Set();
    this.aiColor = null;
    /** @type {number | null} index under the pointer */
    this.hover = null;
    /** @type {Set<number>} indices the user locked by clicking */
    this.locked = new Set();
    /** bumped on every change, so a renderer can skip unchanged layers */
    this.version = 0;
  }

  /** Highlight `indices` (added to any AI highlight there already). */
  setAi(indices, color) {
    for (const i of indices) this.ai.add(i);
    this.aiColor = color;
    this.version++;
  }

  /** Drop the AI highlight only. */
  clearAi() {
    if (this.ai.size === 0) return;
    this.ai.clear();
    this.aiColor = null;
    this.version++;
  }

  setHover(i) { if (this.hover !== i) { this.hover = i; this.version++; } }

  toggleLocked(i) {
    if (this.locked.has(i)) this.locked.delete(i); else this.locked.add(i);
    this.version++;
  }

  /** "locked", "hover", "ai" or "none" (strongest first). */
  stateOf(i) {
    if (this.locked.has(i)) return "locked";
    if (this.hover === i) return "hover";
    if (this.ai.has(i)) return "ai";
    return "none";
  }
}

/**
 * entity_id → index over `entities` (an array of `{entity_id}`), built
 * once per loaded array and cached on it.
 */
const indexCache = new WeakMap();
export function entityIndex(entities) {
  let m = indexCache.get(entities);
  if (!m) {
    m = new Map();
    entities.forEach((e, i) => { if (e && e.entity_id) m.set(e.entity_id, i); });
    indexCache.set(entities, m);
  }
  return m;
}

let lastContext = null;
let state = {
  executed: false, run_id: null, summary: null, highlighted: {}, filtered: {},
  layers_shown: [], focus: null, notes: [], error: null, duration_ms: 0, at: null,
};

/** Refuse the plan before touching the map: the backend's own rules. */
function checkPlan(actions) {
  if (!Array.isArray(actions)) return "the plan has no action list";
  for (const [i, a] of actions.entries()) {
    if (!a || typeof a !== "object") return `action ${i} is not an object`;
    if (!ACTION_TYPES.includes(a.type)) return `action ${i}: unknown action type ${JSON.stringify(String(a.type))}`;
    const dom = a.type === "show_layer" ? a.layer : a.domain;
    const needsDomain = a.type === "show_layer" || a.type === "highlight_entities" || a.type === "filter_entities";
    if ((needsDomain || dom !== undefined) && !DOMAINS.includes(dom)) {
      return `action ${i}: unknown domain ${JSON.stringify(String(dom))}`;
    }
    if (a.type === "highlight_entities") {
      if (!Array.isArray(a.entity_ids)) return `action ${i}: entity_ids is not a list`;
      if (a.entity_ids.length > MAX_HIGHLIGHT_IDS) {
        return `action ${i}: ${a.entity_ids.length} ids, more than ${MAX_HIGHLIGHT_IDS}`;
      }
    }
  }
  return null;
}

function clearAll(context, domains) {
  for (const d of domains || DOMAINS) context.highlights(d)?.clearAi();
}

/**
 * Run `plan` (`{actions, run_id?, summary?, matched_entities?,
 * missing_data?, additive?}`, i.e. an EarthCommandResponse) on `context`.
 *
 * Returns the execution summary (also kept for
 * getEarthCommandExecutionState()): `{ok, run_id, summary, highlighted:
 * {domain: count}, filtered: {domain: count}, layers_shown, focus, notes,
 * error, duration_ms}`. `ok: false` with `error` when the plan was refused;
 * the map is then unchanged.
 */
export function executeEarthActionPlan(plan, context) {
  const t0 = typeof performance !== "undefined" ? performance.now() : Date.now();
  const actions = plan && plan.actions;
  const refusal = checkPlan(actions);
  if (refusal) {
    state = Object.assign({}, state, { ok: false, error: refusal, at: new Date().toISOString() });
    return state;
  }
  lastContext = context;
  const notes = [];
  const highlighted = {};
  const filtered = {};
  const shown = [];
  let focus = null;
  let panel = null;

  // 1. The previous AI highlight goes, unless the plan adds to it.
  if (!plan.additive) clearAll(context);

  // 2. Layers: the ones named, and the layer of every domain acted on.
  const want = new Map();
  for (const a of actions) {
    if (a.type === "show_layer") want.set(a.layer, a.enabled !== false);
    else if ((a.type === "highlight_entities" || a.type === "filter_entities") && !want.has(a.domain)) want.set(a.domain, true);
  }
  for (const a of actions) {
    if ((a.type === "highlight_entities" || a.type === "filter_entities") && want.get(a.domain) === false) {
      notes.push(`${a.domain}: layer turned on to show the ${a.type === "filter_entities" ? "filter" : "highlight"}`);
      want.set(a.domain, true);
    }
  }
  for (const [layer, on] of want) {
    context.setLayer(layer, on);
    if (on) shown.push(layer);
  }

  // 3. Filters and highlights.
  for (const a of actions) {
    if (a.type === "clear_highlight") {
      clearAll(context, a.domain ? [a.domain] : null);
    } else if (a.type === "filter_entities") {
      const ents = context.entities(a.domain) || [];
      const idx = entityIndex(ents);
      const picked = (plan.matched_entities || []).filter((m) => m.domain === a.domain)
        .map((m) => idx.get(m.entity_id)).filter((i) => i !== undefined);
      context.setFilter(a.domain, picked);
      filtered[a.domain] = picked.length;
    } else if (a.type === "highlight_entities") {
      const ents = context.entities(a.domain) || [];
      const idx = entityIndex(ents);
      const indices = [];
      const unknown = [];
      for (const id of a.entity_ids) {
        const i = idx.get(id);
        if (i === undefined) unknown.push(id); else indices.push(i);
      }
      if (unknown.length) {
        notes.push(`${unknown.length} ${a.domain} id(s) not on the map, skipped: ${unknown.slice(0, 5).join(", ")}${unknown.length > 5 ? ", …" : ""}`);
      }
      const color = a.style && COLOR_RE.test(String(a.style.color)) ? a.style.color : DOMAIN_COLORS[a.domain];
      context.highlights(a.domain).setAi(indices, color);
      highlighted[a.domain] = (highlighted[a.domain] || 0) + indices.length;
    }
  }

  // 4. Focus.
  for (const a of actions) {
    if (a.type !== "focus_view") continue;
    const f = { lat: a.lat, lon: a.lon, altitude_km: a.altitude_km, region: a.region, entity_id: a.entity_id };
    if ((typeof f.lat !== "number" || typeof f.lon !== "number") && f.entity_id) {
      const m = (plan.matched_entities || []).find((x) => x.entity_id === f.entity_id);
      if (m && typeof m.lat === "number") { f.lat = m.lat; f.lon = m.lon; }
    }
    if (typeof f.lat === "number" && typeof f.lon === "number") { context.focus(f); focus = f; } else notes.push("focus_view without coordinates, ignored");
  }

  // 5. The result panel.
  const count = Object.values(highlighted).reduce((s, n) => s + n, 0);
  for (const a of actions) {
    if (a.type === "open_result_panel") panel = a;
  }
  const items = panel && Array.isArray(panel.items) ? panel.items.slice(0, 20) : [];
  context.showResult({
    title: panel ? String(panel.title ?? "") : "",
    items,
    count,
    filtered,
    summary: plan.summary ?? "",
    missing_data: Array.isArray(plan.missing_data) ? plan.missing_data : [],
    notes,
    run_id: plan.run_id ?? null,
  });
  if (typeof context.redraw === "function") context.redraw();

  // 6. The execution summary.
  const t1 = typeof performance !== "undefined" ? performance.now() : Date.now();
  state = {
    ok: true, executed: true, run_id: plan.run_id ?? null, summary: plan.summary ?? null,
    highlighted, filtered, layers_shown: shown, focus, notes, error: null,
    duration_ms: t1 - t0, at: new Date().toISOString(),
  };
  return state;
}

/**
 * Clear every AI command highlight (hover and locked selections stay) on
 * `context`, default the last one a plan ran on. Returns the new state.
 */
export function clearEarthCommandHighlights(context) {
  const c = context || lastContext;
  if (c) {
    clearAll(c);
    if (typeof c.redraw === "function") c.redraw();
  }
  state = Object.assign({}, state, { highlighted: {}, cleared_at: new Date().toISOString() });
  return state;
}

/** The last execution summary (see executeEarthActionPlan). */
export function getEarthCommandExecutionState() {
  return JSON.parse(JSON.stringify(state));
}
