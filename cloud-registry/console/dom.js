// DOM helpers for the console. Every string becomes a text node: the
// console never parses markup from data (no innerHTML anywhere).

/**
 * Build an element.
 * h("a", {href: "#/lab", class: "nav", on: {click: fn}}, "Lab", child, [more])
 * - strings and numbers become text nodes; arrays are flattened; null,
 *   undefined and false are skipped;
 * - attrs: `class`, `dataset` (object), `on` (event -> handler), `href`
 *   only when it starts with `#` or `/` (anything else is dropped), any
 *   other attribute through setAttribute (`on*` attributes are dropped).
 */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") {
        el.className = Array.isArray(v) ? v.filter(Boolean).join(" ") : String(v);
      } else if (k === "dataset") {
        for (const [dk, dv] of Object.entries(v)) el.dataset[dk] = String(dv);
      } else if (k === "on") {
        for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
      } else if (k === "href" || k === "src") {
        const s = String(v);
        if (safeUrl(s)) el.setAttribute(k, s);
      } else if (/^on/i.test(k) || k === "style" || k === "srcdoc") {
        continue;
      } else if (v === true) {
        el.setAttribute(k, "");
      } else {
        el.setAttribute(k, String(v));
      }
    }
  }
  append(el, children);
  return el;
}

/** True for a same-origin reference: `#...`, `/...` (not `//`), or blob:. */
export function safeUrl(s) {
  if (s.startsWith("#")) return true;
  if (s.startsWith("/") && !s.startsWith("//")) return true;
  return s.startsWith("blob:");
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

/** Remove every child of `el`; returns `el`. */
export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

/** Replace the children of `el` with `children`. */
export function replace(el, ...children) {
  clear(el);
  append(el, children);
  return el;
}

/** An ISO timestamp as local `YYYY-MM-DD HH:MM:SS`; "—" when absent. */
export function fmtTime(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  const p = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ` +
    `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

/** An age in ms as "4 s ago", "3 min ago", "2 h ago"; "—" when absent. */
export function fmtAge(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "—";
  return `${fmtDuration(Math.max(0, ms))} ago`;
}

/** A duration in ms as "850 ms", "12 s", "4 min 05 s", "2 h 03 min". */
export function fmtDuration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "—";
  const neg = ms < 0;
  ms = Math.abs(ms);
  let out;
  if (ms < 1000) out = `${Math.round(ms)} ms`;
  else if (ms < 60_000) out = `${Math.floor(ms / 1000)} s`;
  else if (ms < 3_600_000) {
    const m = Math.floor(ms / 60_000);
    const s = Math.floor((ms % 60_000) / 1000);
    out = `${m} min ${String(s).padStart(2, "0")} s`;
  } else {
    const hr = Math.floor(ms / 3_600_000);
    const m = Math.floor((ms % 3_600_000) / 60_000);
    out = `${hr} h ${String(m).padStart(2, "0")} min`;
  }
  return neg ? `-${out}` : out;
}

/** A status badge: `<span class="badge badge-{status}">status</span>`. */
export function badge(status, text) {
  const s = String(status ?? "unknown");
  return h("span", { class: `badge badge-${s.replace(/[^a-z0-9_-]/gi, "")}`, dataset: { status: s } }, text ?? s.replace(/_/g, " "));
}

/** A table from headers and rows (arrays of cells: nodes or strings). */
export function table(headers, rows, attrs) {
  return h("table", Object.assign({ class: "grid" }, attrs || {}),
    h("thead", null, h("tr", null, headers.map((x) => h("th", null, x)))),
    h("tbody", null, rows));
}

/**
 * Countdowns: an element whose text is the time left until `untilIso`,
 * refreshed once a second by one shared timer (not a data poll).
 */
const ticking = new Set();
let timer = null;
export function countdown(untilIso, opts = {}) {
  const el = h("span", { class: "countdown" });
  el._until = new Date(untilIso).getTime();
  el._prefix = opts.prefix || "";
  tick1(el);
  ticking.add(el);
  if (!timer) timer = setInterval(tickAll, 1000);
  return el;
}
function tick1(el) {
  const left = el._until - Date.now();
  el.textContent = el._prefix + (left > 0 ? fmtDuration(left) : "0 s");
  el.classList.toggle("late", left <= 0);
  el.dataset.msLeft = String(Math.max(0, left));
}
function tickAll() {
  for (const el of ticking) {
    if (!el.isConnected) { ticking.delete(el); continue; }
    tick1(el);
  }
  for (const el of agers) {
    if (!el.isConnected) { agers.delete(el); continue; }
    el.textContent = el._fmt(Date.now() - el._since);
  }
  if (ticking.size === 0 && agers.size === 0) { clearInterval(timer); timer = null; }
}

/**
 * An element showing the age of `sinceIso` ("4 s ago"; with
 * `{ago: false}` just "4 s"), kept current like countdowns.
 */
const agers = new Set();
export function age(sinceIso, opts = {}) {
  const el = h("span", { class: "age" });
  if (!sinceIso) { el.textContent = "—"; return el; }
  el._since = new Date(sinceIso).getTime();
  el._fmt = opts.ago === false ? (ms) => fmtDuration(Math.max(0, ms)) : fmtAge;
  el.textContent = el._fmt(Date.now() - el._since);
  agers.add(el);
  if (!timer) timer = setInterval(tickAll, 1000);
  return el;
}
