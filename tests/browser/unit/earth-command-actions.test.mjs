// Unit tests of the Earth command's action executor against a fake map
// context (node --test; scripts/test.sh runs them).

import { test } from "node:test";
import assert from "node:assert/strict";
import {
  executeEarthActionPlan, clearEarthCommandHighlights, getEarthCommandExecutionState,
  HighlightState, MAX_HIGHLIGHT_IDS, DOMAINS,
} from "../../../cloud-registry/console/earth-command-actions.js";

/** A map with `n` entities per domain, recording every call. */
function fakeMap(n = 10) {
  const data = {};
  const states = {};
  for (const d of DOMAINS) {
    const prefix = d === "satellites" ? "satellite:norad:" : d === "compute_centers" ? "compute_center:top500:" : `${d}:`;
    data[d] = Array.from({ length: n }, (_, i) => ({ entity_id: `${prefix}${1000 + i}`, name: `${d} ${i}` }));
    states[d] = new HighlightState();
  }
  const layers = {};
  const calls = [];
  return {
    data, states, layers, calls, panel: null, focused: null, filters: {},
    entities(d) { return data[d]; },
    highlights(d) { return states[d]; },
    setLayer(l, on) { calls.push(["setLayer", l, on]); layers[l] = on; },
    setFilter(d, idx) { calls.push(["setFilter", d]); this.filters[d] = idx; },
    focus(f) { calls.push(["focus"]); this.focused = f; },
    showResult(p) { calls.push(["showResult"]); this.panel = p; },
    redraw() { calls.push(["redraw"]); },
  };
}

const sat = (i) => `satellite:norad:${1000 + i}`;
const cc = (i) => `compute_center:top500:${1000 + i}`;

function beidouPlan(ids) {
  return {
    run_id: "agent_test1", summary: "已找到并高亮北斗卫星。",
    actions: [
      { type: "show_layer", layer: "satellites", enabled: true },
      { type: "highlight_entities", domain: "satellites", entity_ids: ids, style: { color: "#7dd3fc", mode: "glow" } },
      { type: "open_result_panel", title: "北斗卫星", items: ids.map((id) => ({ entity_id: id, label: id })) },
    ],
    matched_entities: [], missing_data: [],
  };
}

test("opens the satellite layer", () => {
  const m = fakeMap();
  const r = executeEarthActionPlan({ actions: [{ type: "show_layer", layer: "satellites", enabled: true }] }, m);
  assert.equal(r.ok, true);
  assert.equal(m.layers.satellites, true);
  assert.deepEqual(r.layers_shown, ["satellites"]);
});

test("a highlight alone turns its layer on first", () => {
  const m = fakeMap();
  executeEarthActionPlan({ actions: [{ type: "highlight_entities", domain: "satellites", entity_ids: [sat(1)] }] }, m);
  assert.equal(m.layers.satellites, true);
  const order = m.calls.map((c) => c[0]);
  assert.ok(order.indexOf("setLayer") < order.indexOf("showResult"));
});

test("highlights exactly the satellite ids, by index, with the plan's colour", () => {
  const m = fakeMap();
  const r = executeEarthActionPlan(beidouPlan([sat(2), sat(5), sat(7)]), m);
  assert.deepEqual([...m.states.satellites.ai].sort((a, b) => a - b), [2, 5, 7]);
  assert.equal(m.states.satellites.aiColor, "#7dd3fc");
  assert.equal(r.highlighted.satellites, 3);
  assert.equal(m.panel.count, 3);
  assert.equal(m.panel.title, "北斗卫星");
  assert.equal(m.panel.run_id, "agent_test1");
  assert.equal(getEarthCommandExecutionState().highlighted.satellites, 3);
});

test("highlights compute-center ids and passes missing_data to the panel", () => {
  const m = fakeMap();
  const r = executeEarthActionPlan({
    summary: "已找到 2 个中国大陆的算力中心。",
    actions: [
      { type: "show_layer", layer: "compute_centers", enabled: true },
      { type: "highlight_entities", domain: "compute_centers", entity_ids: [cc(0), cc(9)], style: { color: "url(x)" } },
    ],
    missing_data: ["some records say only China"],
  }, m);
  assert.deepEqual([...m.states.compute_centers.ai].sort((a, b) => a - b), [0, 9]);
  assert.equal(m.states.compute_centers.aiColor, "#f59e0b", "an invalid colour falls back to the domain's");
  assert.equal(m.layers.compute_centers, true);
  assert.equal(r.highlighted.compute_centers, 2);
  assert.deepEqual(m.panel.missing_data, ["some records say only China"]);
});

test("clearing keeps the locked selection and the hover", () => {
  const m = fakeMap();
  m.states.compute_centers.toggleLocked(4);
  m.states.compute_centers.setHover(3);
  executeEarthActionPlan({ actions: [{ type: "highlight_entities", domain: "compute_centers", entity_ids: [cc(1), cc(4)] }] }, m);
  assert.equal(m.states.compute_centers.stateOf(1), "ai");
  assert.equal(m.states.compute_centers.stateOf(4), "locked");
  clearEarthCommandHighlights();
  assert.equal(m.states.compute_centers.ai.size, 0);
  assert.deepEqual([...m.states.compute_centers.locked], [4]);
  assert.equal(m.states.compute_centers.hover, 3);
  assert.equal(m.states.compute_centers.stateOf(1), "none");
  // A clear_highlight action does the same.
  executeEarthActionPlan({ actions: [{ type: "highlight_entities", domain: "compute_centers", entity_ids: [cc(2)] }] }, m);
  executeEarthActionPlan({ additive: true, actions: [{ type: "clear_highlight", domain: "compute_centers" }] }, m);
  assert.equal(m.states.compute_centers.ai.size, 0);
  assert.deepEqual([...m.states.compute_centers.locked], [4]);
});

test("a new plan replaces the previous highlight; an additive plan keeps it", () => {
  const m = fakeMap();
  executeEarthActionPlan(beidouPlan([sat(1)]), m);
  executeEarthActionPlan({ actions: [{ type: "highlight_entities", domain: "compute_centers", entity_ids: [cc(3)] }] }, m);
  assert.equal(m.states.satellites.ai.size, 0, "the earlier satellite highlight is gone");
  assert.deepEqual([...m.states.compute_centers.ai], [3]);
  executeEarthActionPlan({ additive: true, actions: [{ type: "highlight_entities", domain: "satellites", entity_ids: [sat(8)] }] }, m);
  assert.deepEqual([...m.states.compute_centers.ai], [3], "additive keeps the compute centers");
  assert.deepEqual([...m.states.satellites.ai], [8]);
});

test("refuses an unknown action type and changes nothing", () => {
  const m = fakeMap();
  executeEarthActionPlan(beidouPlan([sat(1)]), m);
  const calls = m.calls.length;
  const r = executeEarthActionPlan({ actions: [
    { type: "show_layer", layer: "compute_centers", enabled: true },
    { type: "run_script", code: "alert(1)" },
  ] }, m);
  assert.equal(r.ok, false);
  assert.match(r.error, /unknown action type "run_script"/);
  assert.equal(m.calls.length, calls, "no map call for a refused plan");
  assert.deepEqual([...m.states.satellites.ai], [1], "the previous highlight stays");
  assert.equal(m.layers.compute_centers, undefined);
});

test("refuses an unknown domain", () => {
  const m = fakeMap();
  const r = executeEarthActionPlan({ actions: [{ type: "highlight_entities", domain: "aircraft", entity_ids: [] }] }, m);
  assert.equal(r.ok, false);
  assert.match(r.error, /unknown domain "aircraft"/);
  const r2 = executeEarthActionPlan({ actions: [{ type: "show_layer", layer: "weather", enabled: true }] }, m);
  assert.equal(r2.ok, false);
  assert.equal(m.calls.length, 0);
});

test("refuses more than 500 ids and accepts exactly 500", () => {
  const m = fakeMap(600);
  const ids = Array.from({ length: MAX_HIGHLIGHT_IDS + 1 }, (_, i) => sat(i));
  const r = executeEarthActionPlan(beidouPlan(ids), m);
  assert.equal(r.ok, false);
  assert.match(r.error, /501 ids, more than 500/);
  assert.equal(m.states.satellites.ai.size, 0);
  const ok = executeEarthActionPlan(beidouPlan(ids.slice(0, 500)), m);
  assert.equal(ok.ok, true);
  assert.equal(m.states.satellites.ai.size, 500);
});

test("ignores ids the map does not know, with a note", () => {
  const m = fakeMap();
  const r = executeEarthActionPlan(beidouPlan([sat(1), "satellite:norad:99999999", sat(2)]), m);
  assert.equal(r.ok, true);
  assert.equal(r.highlighted.satellites, 2);
  assert.equal(r.notes.length, 1);
  assert.match(r.notes[0], /1 satellites id\(s\) not on the map, skipped: satellite:norad:99999999/);
  assert.deepEqual(m.panel.notes, r.notes);
});

test("a filter shows only the matched entities of its domain; focus uses the entity's coordinates", () => {
  const m = fakeMap();
  executeEarthActionPlan({
    actions: [
      { type: "filter_entities", domain: "satellites", filters: { constellation: "starlink" } },
      { type: "focus_view", entity_id: sat(4) },
    ],
    matched_entities: [
      { entity_id: sat(4), domain: "satellites", name: "S4", lat: 10, lon: 20 },
      { entity_id: sat(6), domain: "satellites", name: "S6", lat: 11, lon: 21 },
      { entity_id: cc(1), domain: "compute_centers", name: "C1" },
    ],
  }, m);
  assert.deepEqual(m.filters.satellites, [4, 6]);
  assert.equal(m.layers.satellites, true);
  assert.equal(m.focused.lat, 10);
  assert.equal(m.focused.lon, 20);
});
