// The console's shell: sign-in, navigation by role, the hash router.
//
// Each page module exports `default {path, title, render(root, params)}`;
// `render` may return a cleanup function, called when the page is left.
// A path like "#/leases/{id}" matches "#/leases/abc" with params {id: "abc"}.

import { api, events } from "./api.js";
import { h, clear, replace } from "./dom.js";
import lab from "./pages/lab.js";
import lease from "./pages/lease.js";
import eventsPage from "./pages/events.js";
import sessions, { detail as session } from "./pages/sessions.js";
import audits, { detail as audit } from "./pages/audits.js";
import runs, { detail as run } from "./pages/runs.js";
import proposals from "./pages/proposals.js";
import live from "./pages/live.js";
import earth from "./pages/earth.js";

/** Every page, in navigation order; pages without `nav: false` are in the bar. */
export const PAGES = [
  lab,
  earth,
  lease,
  eventsPage,
  sessions, session,
  audits, audit,
  runs, run,
  proposals,
  live,
];

const root = document.getElementById("app");
let cleanup = null;

function match(hash) {
  const want = hash.split("?")[0].split("/");
  for (const page of PAGES) {
    const parts = page.path.split("/");
    if (parts.length !== want.length) continue;
    const params = {};
    let ok = true;
    parts.forEach((p, i) => {
      if (!ok) return;
      const m = /^\{(\w+)\}$/.exec(p);
      if (m) {
        if (!want[i]) ok = false;
        else params[m[1]] = decodeURIComponent(want[i]);
      } else if (p !== want[i]) ok = false;
    });
    if (ok) return { page, params };
  }
  return null;
}

function leave() {
  if (cleanup) {
    try { cleanup(); } catch (e) { console.error(e); }
    cleanup = null;
  }
}

function signInPage(message) {
  leave();
  events.stop();
  const input = h("input", {
    type: "password", id: "token", name: "token", autocomplete: "off",
    placeholder: "bearer token", required: true, spellcheck: "false",
  });
  const err = h("p", { class: "error", id: "signin-error", role: "alert" }, message || "");
  const form = h("form", {
    class: "signin", id: "signin",
    on: {
      submit: async (e) => {
        e.preventDefault();
        const tok = input.value.trim();
        if (!tok) return;
        replace(err, "Checking…");
        try {
          await api.signIn(tok);
          input.value = "";
          start();
        } catch (ex) {
          replace(err, ex.status === 401 ? "This token is not valid." : `Cannot sign in: ${ex.message}`);
        }
      },
    },
  },
  h("h1", null, "Benchlink console"),
  h("label", { for: "token" }, "Token"),
  input,
  h("button", { type: "submit", class: "primary" }, "Sign in"),
  h("p", { class: "hint" }, "The token stays in this tab only (sessionStorage) and is sent to this registry alone."),
  err);
  replace(root, form);
  input.focus();
}

function shell() {
  const nav = h("nav", { class: "nav" },
    PAGES.filter((p) => p.nav !== false).map((p) =>
      h("a", { href: p.path, class: "nav-link", dataset: { path: p.path } }, p.title)));
  const status = h("span", { class: "stream-status", id: "stream-status" }, "");
  const who = h("span", { class: "who" },
    h("span", { class: "principal", id: "principal" }, api.principal),
    " ",
    h("span", { class: `role role-${api.role}`, id: "role" }, api.role));
  const out = h("button", { type: "button", id: "signout", class: "link", on: { click: () => { api.signOut(); location.hash = "#/lab"; signInPage(); } } }, "Sign out");
  const header = h("header", { class: "top" },
    h("a", { href: "#/lab", class: "brand" }, "Benchlink"), nav, h("span", { class: "spacer" }), status, who, out);
  const main = h("main", { id: "page" });
  replace(root, header, main);
  events.onStatus((s) => {
    status.textContent = s === "live" ? "● live" : s === "stopped" ? "" : `○ ${s}`;
    status.className = `stream-status stream-${s}`;
  });
  return main;
}

let main = null;

function route() {
  if (!api.signedIn) { signInPage(); return; }
  if (!main || !main.isConnected) main = shell();
  const hash = location.hash || "#/lab";
  const m = match(hash);
  leave();
  clear(main);
  for (const k of Object.keys(main.dataset)) delete main.dataset[k];
  for (const a of document.querySelectorAll(".nav-link")) {
    const p = a.dataset.path;
    a.classList.toggle("active", hash === p || hash.startsWith(p + "/"));
  }
  if (!m) {
    main.appendChild(h("div", { class: "empty" }, h("h2", null, "Not found"), h("p", null, "No page at ", h("code", null, hash), ".")));
    return;
  }
  document.title = `${m.page.title} · Benchlink`;
  try {
    const c = m.page.render(main, m.params);
    if (typeof c === "function") cleanup = c;
  } catch (e) {
    console.error(e);
    main.appendChild(h("p", { class: "error" }, `This page failed: ${e.message}`));
  }
}

function start() {
  main = null;
  events.start();
  if (!location.hash) location.hash = "#/lab";
  route();
}

api.onUnauthenticated = () => {
  api.signOut();
  signInPage("The token was refused (revoked or expired). Sign in again.");
};

window.addEventListener("hashchange", () => { if (api.signedIn) route(); });

(async () => {
  try {
    if (await api.restore()) { start(); return; }
  } catch (e) {
    signInPage(e.status === 401 ? "" : `Cannot reach the registry: ${e.message}`);
    return;
  }
  signInPage();
})();
