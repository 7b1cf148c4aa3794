// Benchmark of the console's Lab page (scripts/bench-console.sh runs it
// against a fresh registry): registers PROVIDERS providers of 8
// capabilities each over HTTP, then measures
// - the first full render of #/lab (page load, sign-in check, the three
//   list fetches, the DOM of every row), median of RUNS reloads;
// - under RATE events/s for SECONDS (lease request, hold ~2 s, release:
//   4 events per cycle), the lag from each lease_granted event's time to
//   its holder row being in the DOM, and the event arrival lag.
// Env: BENCHLINK_URL, BENCHLINK_TOKEN (admin); PROVIDERS (500), RATE (200),
// SECONDS (10), RUNS (3).

import { env, launch, openPage, signIn, http, check } from "./lib.mjs";

const ADMIN = env("BENCHLINK_TOKEN");
const PROVIDERS = Number(process.env.PROVIDERS || 500);
const RATE = Number(process.env.RATE || 200);
const SECONDS = Number(process.env.SECONDS || 10);
const RUNS = Number(process.env.RUNS || 3);
const TYPES = [
  ["camera", ["snapshot"]], ["microphone", ["record_audio"]], ["speaker", ["play_tts"]],
  ["serial_port", ["read", "write"]], ["relay", ["switch_on", "switch_off"]],
  ["programmable_power_supply", ["power_on", "power_off"]], ["thumb_robot", ["tap"]],
  ["screen_capture", ["screenshot"]],
];

const pct = (xs, p) => {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const median = (xs) => pct(xs, 50);

async function pool(n, items, fn) {
  let i = 0;
  await Promise.all(Array.from({ length: n }, async () => {
    while (i < items.length) { const x = items[i++]; await fn(x); }
  }));
}

async function register() {
  const ids = Array.from({ length: PROVIDERS }, (_, i) => `bench-${String(i).padStart(4, "0")}`);
  const caps = [];
  await pool(16, ids, async (pid) => {
    let r = await http("POST", "/api/v1/capability-providers/register", ADMIN, {
      provider_id: pid, node_id: pid, hostname: `${pid}.lab`, platform: "linux",
      gateway_version: "0.1.0", network_zone: "lab", labels: [], boot_id: `boot-${pid}`,
    });
    check(r.status === 200, `register ${pid}: ${r.status} ${JSON.stringify(r.json)}`);
    const list = TYPES.map(([type, actions], k) => ({
      capability_id: `${pid}-${type.replace(/_/g, "-")}-${k}`, capability_type: type,
      display_name: `${type} ${k} of ${pid}`, lease_mode: "exclusive", preemptible: true,
      supported_actions: actions,
    }));
    r = await http("POST", "/api/v1/capabilities/register", ADMIN, { provider_id: pid, capabilities: list });
    check(r.status === 200, `capabilities of ${pid}: ${r.status} ${JSON.stringify(r.json)}`);
    for (const c of list) caps.push(c.capability_id);
  });
  return caps;
}

async function firstRender(page) {
  const t0 = Date.now();
  await page.reload();
  await page.waitForFunction((n) => document.querySelector("#page")?.dataset.rendered === "true"
    && document.querySelectorAll("#providers tr.cap").length === n, PROVIDERS * 8, { timeout: 120_000, polling: 50 });
  const wall = Date.now() - t0;
  const inPage = Number(await page.evaluate(() => document.querySelector("#page").dataset.renderMs));
  return { wall, inPage };
}

async function load(caps) {
  const cycles = RATE / 4;
  const interval = 1000 / cycles;
  const start = Date.now();
  const end = start + SECONDS * 1000;
  let i = 0, sent = 0, failed = 0;
  const inflight = [];
  while (Date.now() < end) {
    // Start as many cycles as the schedule says by now (timers drift).
    if (i >= Math.floor((Date.now() - start) / interval) + 1) {
      await new Promise((res) => setTimeout(res, 2));
      continue;
    }
    const cid = caps[(i++ * 7919) % caps.length];
    inflight.push((async () => {
      const r = await http("POST", "/api/v1/capability-leases/request", ADMIN, {
        capability_id: cid, holder_type: "human_operator", holder_ref: "bootstrap-admin",
        project_id: "bench", purpose: "console benchmark", priority: 50, requested_duration_seconds: 60,
      });
      if (r.status !== 201) { failed++; return; }
      sent++;
      await new Promise((res) => setTimeout(res, 2000));
      await http("POST", `/api/v1/capability-leases/${r.json.lease_id}/release`, ADMIN, {});
    })());
  }
  await Promise.all(inflight);
  return { sent, failed };
}

const browser = await launch();
try {
  const t0 = Date.now();
  const caps = await register();
  console.log(`registered ${PROVIDERS} providers, ${caps.length} capabilities in ${Date.now() - t0} ms`);
  const { page, watch } = await openPage(browser.context);
  await signIn(page, ADMIN, "#/lab");
  await page.waitForFunction(() => document.querySelector("#page")?.dataset.rendered === "true", null, { timeout: 120_000 });
  const renders = [];
  for (let r = 0; r < RUNS; r++) renders.push(await firstRender(page));
  await page.waitForFunction(() => document.querySelector("#stream-status")?.textContent.includes("live"), null, { timeout: 10_000 });

  await page.evaluate(async () => {
    const { events } = await import("/console/api.js");
    window.__bench = { arrival: [], rendered: [], missing: 0, count: 0, first: 0, last: 0, inWindow: 0 };
    const b = window.__bench;
    events.subscribe((ev) => {
      const now = Date.now();
      b.count++;
      if (!b.first) b.first = now;
      b.last = now;
      if (window.__benchEnd && now <= window.__benchEnd) b.inWindow++;
      const at = Date.parse(ev.occurred_at);
      b.arrival.push(now - at);
      if (ev.event_type !== "lease_granted") return;
      const sel = `.holder[data-lease-id="${ev.lease_id}"]`;
      const deadline = now + 10_000;
      const look = () => {
        if (document.querySelector(sel)) b.rendered.push(Date.now() - at);
        else if (Date.now() > deadline) b.missing++;
        else setTimeout(look, 5);
      };
      setTimeout(look, 0);
    });
  });
  await page.evaluate((ms) => { window.__benchEnd = Date.now() + ms; }, SECONDS * 1000);
  const { sent, failed } = await load(caps);
  await page.waitForTimeout(1500);
  const b = await page.evaluate(() => window.__bench);
  const rate = b.inWindow / SECONDS;
  console.log("");
  console.log(`Lab page, ${PROVIDERS} providers x 8 capabilities (${PROVIDERS * 8} rows):`);
  console.log(`  first full render (reload to every row in the DOM): median ${median(renders.map((r) => r.wall))} ms of ${RUNS} (${renders.map((r) => r.wall).join(", ")})`);
  console.log(`  of which fetch + build in the page: median ${median(renders.map((r) => r.inPage))} ms`);
  console.log(`Under load: ${rate.toFixed(0)} events/s for ${SECONDS} s (target ${RATE}; ${b.count} events in all); ${sent} leases granted, ${failed} refused`);
  console.log(`  event arrival lag (occurred_at to the page): p50 ${pct(b.arrival, 50)} ms, p95 ${pct(b.arrival, 95)} ms, max ${Math.max(...b.arrival)} ms`);
  console.log(`  grant to holder row in the DOM: p50 ${pct(b.rendered, 50)} ms, p95 ${pct(b.rendered, 95)} ms, max ${Math.max(...b.rendered)} ms; ${b.missing} never shown`);
  check(watch.pageErrors.length === 0, `page errors: ${watch.pageErrors.join("; ")}`);
} finally {
  await browser.close();
}
