// Shared harness of the console's browser tests: launches Debian's
// chromium through playwright-core, signs in, records what must never
// happen (dialogs, page errors, requests to another origin) and writes
// screenshots to $SCREENSHOT_DIR (default target/console-screenshots).
//
// A spec is a node script: `await run("name", async (t) => {...})` exits 0
// when every check passed, 1 with the failed check's message otherwise.

import { chromium } from "playwright-core";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "..", "..");

/** Environment a spec needs; a missing variable fails the spec. */
export function env(name, fallback) {
  const v = process.env[name] ?? fallback;
  if (v === undefined || v === "") throw new Error(`environment variable ${name} is not set`);
  return v;
}

export const BASE = () => env("BENCHLINK_URL").replace(/\/$/, "");
export const SHOTS = process.env.SCREENSHOT_DIR || path.join(repo, "target", "console-screenshots");

/** Chromium's path: $CHROMIUM or /usr/bin/chromium. */
export function chromiumPath() {
  const p = process.env.CHROMIUM || "/usr/bin/chromium";
  if (!fs.existsSync(p)) throw new Error(`chromium not found at ${p} (install Debian's chromium package: scripts/setup.sh)`);
  return p;
}

/** A fresh headless chromium with its own profile directory; `extraArgs`
 *  are more command-line flags (e.g. chromium's fake media capture). */
export async function launch(extraArgs = []) {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "benchlink-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: chromiumPath(),
    headless: true,
    viewport: { width: 1440, height: 900 },
    args: [
      "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
      ...extraArgs,
    ],
  });
  return {
    context,
    async close() {
      await context.close().catch(() => {});
      fs.rmSync(profile, { recursive: true, force: true });
    },
  };
}

/**
 * A page watched for trouble: `t.dialogs`, `t.pageErrors`, `t.foreign`
 * (requests whose origin is not BENCHLINK_URL's), `t.consoleErrors`.
 */
export async function openPage(context) {
  const origin = new URL(BASE()).origin;
  const page = await context.newPage();
  const watch = { dialogs: [], pageErrors: [], foreign: [], consoleErrors: [] };
  page.on("dialog", async (d) => { watch.dialogs.push(`${d.type()}: ${d.message()}`); await d.dismiss().catch(() => {}); });
  page.on("pageerror", (e) => watch.pageErrors.push(String(e && e.message || e)));
  page.on("console", (m) => { if (m.type() === "error") watch.consoleErrors.push(m.text()); });
  page.on("request", (r) => {
    const u = r.url();
    if (u.startsWith("data:") || u.startsWith("blob:")) return;
    try {
      if (new URL(u).origin !== origin) watch.foreign.push(u);
    } catch (_) {
      watch.foreign.push(u);
    }
  });
  return { page, watch };
}

/** Open the console and sign in with `token`; waits for the shell. */
export async function signIn(page, token, hash = "#/lab") {
  await page.goto(`${BASE()}/console/${hash}`);
  await page.waitForSelector("#token", { timeout: 10_000 });
  await page.fill("#token", token);
  await page.click("#signin button[type=submit]");
  await page.waitForSelector("#signout", { timeout: 10_000 });
  await page.waitForFunction(() => document.querySelector("#stream-status")?.textContent.includes("live"), null, { timeout: 10_000 });
}

/** Full-page screenshot `name`.png in SHOTS; returns its path. */
export async function screenshot(page, name) {
  fs.mkdirSync(SHOTS, { recursive: true });
  const file = path.join(SHOTS, `${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  return file;
}

/** Throw `message` unless `cond`. */
export function check(cond, message) {
  if (!cond) throw new Error(message);
}

/** No dialog, page error or foreign request so far. */
export function checkClean(watch, where) {
  check(watch.dialogs.length === 0, `${where}: a dialog opened: ${watch.dialogs.join("; ")}`);
  check(watch.pageErrors.length === 0, `${where}: page error: ${watch.pageErrors.join("; ")}`);
  check(watch.foreign.length === 0, `${where}: request to another origin: ${watch.foreign.join(", ")}`);
}

/** JSON over the registry's HTTP API (for a spec's own set-up). */
export async function http(method, p, token, body) {
  const resp = await fetch(`${BASE()}${p}`, {
    method,
    headers: Object.assign({ Authorization: `Bearer ${token}` }, body ? { "Content-Type": "application/json" } : {}),
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await resp.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch (_) { json = text; }
  return { status: resp.status, json };
}

/**
 * Run a spec's steps (`opts.args`: extra chromium flags): `body(t)` gets
 * `{context, step(name, fn)}`; prints
 * each step, exits 0 when all pass and 1 at the first failure.
 */
export async function run(name, body, opts = {}) {
  let browser = null;
  let current = "launch";
  try {
    browser = await launch(opts.args || []);
    const t = {
      context: browser.context,
      async step(label, fn) {
        current = label;
        const t0 = Date.now();
        await fn();
        console.log(`ok   ${name}: ${label} (${Date.now() - t0} ms)`);
      },
    };
    await body(t);
    console.log(`pass ${name}`);
    await browser.close();
    process.exit(0);
  } catch (e) {
    console.error(`FAIL ${name}: ${current}: ${e && e.stack || e}`);
    if (browser) await browser.close();
    process.exit(1);
  }
}
