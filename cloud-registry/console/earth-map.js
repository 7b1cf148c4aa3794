// The Earth page's world view: a 2D map (d3-geo equirectangular projection)
// drawn to a canvas, with the countries of Natural Earth (world-atlas
// TopoJSON through topojson-client) and one layer per domain. It is also
// the map context the action executor (earth-command-actions.js) runs on.
//
// The vendored libraries are classic scripts (/console/vendor/*.js, no
// eval) that define `window.d3` and `window.topojson`; loadVendor() adds
// them once. Nothing is fetched from another origin.

import { HighlightState } from "./earth-command-actions.js";

/** Layers in drawing order: key, domain, label, API path. */
export const LAYERS = [
  { key: "cables", domain: "cables", label: "Cables", path: "cables" },
  { key: "landing_points", domain: "cables", label: "Landing points", path: "landing-points" },
  { key: "compute_centers", domain: "compute_centers", label: "Compute centers", path: "compute-centers" },
  { key: "bgp", domain: "bgp", label: "BGP events", path: "bgp-events" },
  { key: "vessels", domain: "vessels", label: "Vessels", path: "vessels" },
  { key: "news", domain: "news", label: "News", path: "news" },
  { key: "satellites", domain: "satellites", label: "Satellites", path: "satellites" },
];

const RAD = Math.PI / 180;

const BASE_COLORS = {
  cables: "rgba(244,114,182,0.45)", landing_points: "#be185d", compute_centers: "#b45309",
  bgp: "#dc2626", vessels: "#059669", news: "#7c3aed", satellites: "rgba(148,163,184,0.75)",
};

let vendorLoad = null;
function script(src) {
  return new Promise((resolve, reject) => {
    const s = document.createElement("script");
    s.src = src;
    s.onload = resolve;
    s.onerror = () => reject(new Error(`cannot load ${src} (the map files are installed by scripts/setup.sh)`));
    document.head.appendChild(s);
  });
}

/** Load d3-array, d3-geo and topojson-client once; resolves to {d3, topojson}. */
export function loadVendor() {
  if (!vendorLoad) {
    vendorLoad = (async () => {
      await script("/console/vendor/d3-array.min.js");
      await script("/console/vendor/d3-geo.min.js");
      await script("/console/vendor/topojson-client.min.js");
      return { d3: window.d3, topojson: window.topojson };
    })();
    vendorLoad.catch(() => { vendorLoad = null; });
  }
  return vendorLoad;
}

function nameOf(p, id) {
  const n = p && (p.name ?? p.title ?? p.label ?? p.object_name);
  return n === undefined || n === null ? id : String(n);
}

/** Point of a feature: [lon, lat] of a Point, else the first coordinate. */
function pointOf(g) {
  if (!g) return null;
  if (g.type === "Point") return g.coordinates;
  if (g.type === "MultiPoint" || g.type === "LineString") return g.coordinates[0];
  if (g.type === "MultiLineString" || g.type === "Polygon") return g.coordinates[0]?.[0];
  return null;
}

/**
 * The map: `new EarthMap(canvas, {d3, topojson, world})`, then
 * `setLayerData(key, featureCollection)`. Implements the executor's map
 * context (entities, highlights, setLayer, setFilter, focus, showResult,
 * redraw); `onResult(panel)` and `onLayerChange(key, on)` are the page's
 * hooks.
 */
export class EarthMap {
  constructor(canvas, { d3, topojson, world }) {
    this.canvas = canvas;
    this.ctx = canvas.getContext("2d", { alpha: false });
    this.d3 = d3;
    this.countries = topojson.feature(world, world.objects.countries);
    this.borders = topojson.mesh(world, world.objects.countries, (a, b) => a !== b);
    this.layers = {};
    for (const l of LAYERS) {
      this.layers[l.key] = { ...l, on: false, entities: [], features: [], filter: null, loaded: false, error: null };
    }
    this.states = {};
    for (const l of LAYERS) this.states[l.domain] = this.states[l.domain] || new HighlightState();
    this.view = { lon: 0, lat: 0, k: 1 };
    this.onResult = null;
    this.onLayerChange = null;
    this.onHover = null;
    this.frames = 0;
    this.satMotion = null; // {from: [[lon,lat]], to: [[lon,lat]], t0, t1}
    this.animating = false;
    this.resize();
  }

  resize() {
    const w = this.canvas.clientWidth || 960;
    const hgt = Math.round(w / 2);
    this.canvas.width = w;
    this.canvas.height = hgt;
    this.project();
  }

  project() {
    const { d3 } = this;
    const w = this.canvas.width, hgt = this.canvas.height;
    const s = (w / (2 * Math.PI)) * this.view.k;
    this.s = s;
    this.tx = w / 2;
    this.ty = hgt / 2 + this.view.lat * RAD * s;
    this.projection = d3.geoEquirectangular().scale(s).rotate([-this.view.lon, 0]).translate([this.tx, this.ty]);
    this.base = null;
    this.cableCache = null;
    this.still = null;
  }

  // ---- the executor's map context ----------------------------------

  /** Loaded entities of a domain (cables: cables then landing points). */
  entities(domain) {
    if (domain === "cables") {
      const c = this.layers.cables.entities, p = this.layers.landing_points.entities;
      if (!this._cablesAll || this._cablesAll.c !== c || this._cablesAll.p !== p) this._cablesAll = { c, p, all: c.concat(p) };
      return this._cablesAll.all;
    }
    const l = this.layers[domain];
    return l ? l.entities : [];
  }

  highlights(domain) { return this.states[domain]; }

  setLayer(domain, on) {
    const keys = domain === "cables" ? ["cables", "landing_points"] : [domain];
    for (const k of keys) this.setLayerKey(k, on);
  }

  /** One layer by its key (the page's toggles; `landing_points` apart from `cables`). */
  setLayerKey(key, on) {
    const l = this.layers[key];
    if (!l || l.on === on) return;
    l.on = on;
    this.cableCache = null;
    this.onLayerChange?.(key, on);
  }

  setFilter(domain, indices) {
    this.filterVersion = (this.filterVersion || 0) + 1;
    const set = indices ? new Set(indices) : null;
    if (domain === "cables") {
      const n = this.layers.cables.entities.length;
      this.layers.cables.filter = set ? new Set([...set].filter((i) => i < n)) : null;
      this.layers.landing_points.filter = set ? new Set([...set].filter((i) => i >= n).map((i) => i - n)) : null;
      this.cableCache = null;
    } else if (this.layers[domain]) this.layers[domain].filter = set;
  }

  focus(f) {
    const alt = typeof f.altitude_km === "number" ? f.altitude_km : 6000;
    this.view = { lon: f.lon, lat: f.lat, k: Math.max(1, Math.min(8, 20000 / Math.max(alt, 500))) };
    this.project();
  }

  showResult(panel) { this.onResult?.(panel); }

  redraw() { this.draw(); }

  // ---- data --------------------------------------------------------

  /** Keep a layer's GeoJSON FeatureCollection; entities are its features. */
  setLayerData(key, fc) {
    const l = this.layers[key];
    const feats = (fc && Array.isArray(fc.features) ? fc.features : []);
    l.features = feats;
    l.entities = feats.map((f, i) => {
      const p = f.properties || {};
      const id = p.entity_id ? String(p.entity_id) : `${l.domain}:index:${i}`;
      const pt = pointOf(f.geometry);
      return { entity_id: id, name: nameOf(p, id), lon: pt ? pt[0] : null, lat: pt ? pt[1] : null, properties: p, layer: key };
    });
    l.loaded = true;
    this.cableCache = null;
  }

  /** Satellites move: positions `from` now and `to` at `t1` (ms), interpolated per frame. */
  setSatelliteMotion(toFc, t0, t1) {
    const byId = new Map();
    for (const f of toFc.features || []) {
      const id = f.properties?.entity_id;
      const pt = pointOf(f.geometry);
      if (id && pt) byId.set(String(id), pt);
    }
    const ents = this.layers.satellites.entities;
    const n = ents.length;
    // From where they are drawn now (the end of the previous step, if any).
    const now = Float64Array.from(this.satPositions(t0));
    const from = new Float64Array(2 * n), delta = new Float64Array(2 * n);
    ents.forEach((e, i) => {
      const a0 = now[2 * i], a1 = now[2 * i + 1];
      const b = byId.get(e.entity_id) || [a0, a1];
      from[2 * i] = a0; from[2 * i + 1] = a1;
      let dl = b[0] - a0;
      if (dl > 180) dl -= 360; else if (dl < -180) dl += 360;
      delta[2 * i] = dl; delta[2 * i + 1] = b[1] - a1;
    });
    this.satMotion = { from, delta, t0, t1 };
  }

  /** Satellite positions at wall time `now` (ms): a Float64Array of lon, lat pairs. */
  satPositions(now) {
    const ents = this.layers.satellites.entities;
    const m = this.satMotion;
    const n = ents.length;
    if (!this._satPos || this._satPos.length !== 2 * n) this._satPos = new Float64Array(2 * n);
    const out = this._satPos;
    if (!m || m.from.length !== 2 * n) {
      for (let i = 0; i < n; i++) { out[2 * i] = ents[i].lon ?? NaN; out[2 * i + 1] = ents[i].lat ?? NaN; }
      return out;
    }
    const u = Math.max(0, Math.min(1, (now - m.t0) / (m.t1 - m.t0)));
    for (let i = 0; i < 2 * n; i += 2) {
      let lon = m.from[i] + m.delta[i] * u;
      if (lon > 180) lon -= 360; else if (lon < -180) lon += 360;
      out[i] = lon;
      out[i + 1] = m.from[i + 1] + m.delta[i + 1] * u;
    }
    return out;
  }

  /** Screen position of (lon, lat) in the equirectangular view, without allocating: sets this._x, this._y. */
  xy(lon, lat) {
    let l = lon - this.view.lon;
    if (l > 180) l -= 360; else if (l < -180) l += 360;
    this._x = this.tx + this.s * l * RAD;
    this._y = this.ty - this.s * lat * RAD;
  }

  // ---- drawing -----------------------------------------------------

  drawBase() {
    const { d3 } = this;
    const c = document.createElement("canvas");
    c.width = this.canvas.width; c.height = this.canvas.height;
    const g = c.getContext("2d");
    const path = d3.geoPath(this.projection, g);
    g.fillStyle = "#0b1626"; g.fillRect(0, 0, c.width, c.height);
    g.beginPath(); path(d3.geoGraticule10()); g.strokeStyle = "rgba(148,163,184,0.12)"; g.lineWidth = 0.5; g.stroke();
    g.beginPath(); path(this.countries); g.fillStyle = "#1e2b3f"; g.fill();
    g.beginPath(); path(this.borders); g.strokeStyle = "rgba(148,163,184,0.35)"; g.lineWidth = 0.5; g.stroke();
    this.base = c;
  }

  drawCables() {
    const { d3 } = this;
    const c = document.createElement("canvas");
    c.width = this.canvas.width; c.height = this.canvas.height;
    const g = c.getContext("2d");
    const path = d3.geoPath(this.projection, g);
    const l = this.layers.cables;
    const st = this.states.cables;
    if (l.on) {
      l.features.forEach((f, i) => {
        if (l.filter && !l.filter.has(i)) return;
        const s = st.stateOf(i);
        g.beginPath(); path(f.geometry);
        g.strokeStyle = s === "none" ? BASE_COLORS.cables : s === "ai" ? st.aiColor : "#fde047";
        g.lineWidth = s === "none" ? 0.8 : 2;
        g.stroke();
      });
    }
    this.cableCache = { canvas: c, version: st.version };
  }

  /** What the still part of the map depends on (all but the satellites). */
  stillKey() {
    const parts = [this.view.lon, this.view.lat, this.view.k, this.canvas.width, this.filterVersion || 0];
    for (const l of LAYERS) if (l.key !== "satellites") parts.push(l.on ? l.entities.length : -1);
    for (const d of ["cables", "compute_centers", "bgp", "vessels", "news"]) parts.push(this.states[d].version);
    return parts.join("|");
  }

  /** Draw one frame; returns the number of markers drawn. The map, the
   *  cables and every layer but the satellites are drawn once into a
   *  still canvas (again only when they change); a frame is that canvas
   *  and the satellites. */
  draw(now = Date.now()) {
    if (!this.base) this.drawBase();
    const key = this.stillKey();
    if (!this.still || this.still.key !== key) {
      const c = this.still?.canvas || document.createElement("canvas");
      c.width = this.canvas.width; c.height = this.canvas.height;
      const sg = c.getContext("2d", { alpha: false });
      sg.drawImage(this.base, 0, 0);
      if (this.layers.cables.on && this.layers.cables.features.length) {
        if (!this.cableCache || this.cableCache.version !== this.states.cables.version) this.drawCables();
        sg.drawImage(this.cableCache.canvas, 0, 0);
      }
      const n = this.paint(sg, ["landing_points", "compute_centers", "bgp", "vessels", "news"], now);
      this.still = { canvas: c, key, markers: n.markers, highlighted: n.highlighted };
    }
    const g = this.ctx;
    g.drawImage(this.still.canvas, 0, 0);
    const sat = this.layers.satellites.on ? this.paint(g, ["satellites"], now) : { markers: 0, highlighted: 0 };
    this.frames++;
    this.drawn = { markers: this.still.markers + sat.markers, highlighted: this.still.highlighted + sat.highlighted, at: now };
    return this.drawn.markers;
  }

  /** Paint the point layers `keys` on `g`: {markers, highlighted}. */
  paint(g, keys, now) {
    let n = 0;
    const w = this.canvas.width, hgt = this.canvas.height;
    const hot = [];
    const points = (key, positions) => {
      const l = this.layers[key];
      if (!l.on) return;
      const st = this.states[l.domain];
      const off = key === "landing_points" ? this.layers.cables.entities.length : 0;
      const size = key === "satellites" ? 2 : 4;
      const half = size / 2;
      const ents = l.entities;
      const plain = st.ai.size === 0 && st.locked.size === 0 && st.hover === null;
      g.fillStyle = BASE_COLORS[key];
      g.beginPath();
      for (let i = 0; i < ents.length; i++) {
        if (l.filter && !l.filter.has(i)) continue;
        const lon = positions ? positions[2 * i] : ents[i].lon;
        const lat = positions ? positions[2 * i + 1] : ents[i].lat;
        if (lon === null || lat === null || lon === undefined || Number.isNaN(lon)) continue;
        this.xy(lon, lat);
        const x = this._x, y = this._y;
        if (x < -5 || y < -5 || x > w + 5 || y > hgt + 5) continue;
        if (!plain) {
          const s = st.stateOf(i + off);
          if (s !== "none") { hot.push([x, y, s, st, size]); continue; }
        }
        g.rect(x - half, y - half, size, size);
        n++;
      }
      g.fill();
    };
    for (const k of keys) points(k, k === "satellites" ? this.satPositions(now) : null);
    // Highlighted, hovered and locked markers on top.
    // Batched by state and colour: one path for the halos, one for the dots.
    const groups = new Map();
    for (const m of hot) {
      const key = m[2] === "ai" ? `ai${m[3].aiColor}` : m[2];
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push(m);
    }
    for (const list of groups.values()) {
      const [, , s0, st0] = list[0];
      const ai = s0 === "ai";
      for (const pass of [0, 1]) {
        g.beginPath();
        for (const [x, y, , , size] of list) {
          const r = (ai ? size + 1.5 : size + 3) + (pass === 0 ? 3 : 0);
          g.moveTo(x + r, y);
          g.arc(x, y, r, 0, 2 * Math.PI);
        }
        g.fillStyle = pass === 0 ? (ai ? hexA(st0.aiColor, 0.28) : "rgba(253,224,71,0.3)") : (ai ? st0.aiColor : "#fde047");
        g.fill();
        if (pass === 1 && s0 === "locked") { g.strokeStyle = "#fff"; g.lineWidth = 1.5; g.stroke(); }
      }
      n += list.length;
    }
    return { markers: n, highlighted: hot.length };
  }

  /** Keep drawing each animation frame while satellites are shown. */
  startAnimation() {
    if (this.animating) return;
    this.animating = true;
    const tick = () => {
      if (!this.animating || !this.canvas.isConnected) { this.animating = false; return; }
      if (this.layers.satellites.on) this.draw();
      requestAnimationFrame(tick);
    };
    requestAnimationFrame(tick);
  }

  stopAnimation() { this.animating = false; }

  /** The nearest point entity of a shown layer within 7 px of (x, y): {key, domain, index, entity}. */
  pick(x, y) {
    let best = null, bd = 49;
    const now = Date.now();
    for (const key of ["compute_centers", "landing_points", "bgp", "vessels", "news", "satellites"]) {
      const l = this.layers[key];
      if (!l.on) continue;
      const pos = key === "satellites" ? this.satPositions(now) : null;
      const off = key === "landing_points" ? this.layers.cables.entities.length : 0;
      for (let i = 0; i < l.entities.length; i++) {
        if (l.filter && !l.filter.has(i)) continue;
        const lon = pos ? pos[2 * i] : l.entities[i].lon;
        const lat = pos ? pos[2 * i + 1] : l.entities[i].lat;
        if (lon === null || lon === undefined || Number.isNaN(lon)) continue;
        this.xy(lon, lat);
        const d = (this._x - x) ** 2 + (this._y - y) ** 2;
        if (d < bd) { bd = d; best = { key, domain: l.domain, index: i + off, entity: l.entities[i] }; }
      }
    }
    return best;
  }
}

function hexA(hex, a) {
  let s = String(hex || "#ffffff").slice(1);
  if (s.length === 3) s = s.split("").map((c) => c + c).join("");
  const n = parseInt(s, 16);
  return `rgba(${(n >> 16) & 255},${(n >> 8) & 255},${n & 255},${a})`;
}
