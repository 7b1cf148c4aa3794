// Lab, Lease and Events pages against a running lab (tests/tests/console.rs
// starts one). Env: BENCHLINK_URL, BENCHLINK_TOKEN (admin), BENCHLINK_HW_TOKEN
// and BENCHLINK_CHIEF_TOKEN (two audit agents), BENCHLINK_EDGE_PID (the
// bench daemon, killed at the end), BENCHLINK_PROVIDER (its provider id).

import { run, env, openPage, signIn, screenshot, check, checkClean, http } from "./lib.mjs";

const ADMIN = env("BENCHLINK_TOKEN");
const HW = env("BENCHLINK_HW_TOKEN");
const CHIEF = env("BENCHLINK_CHIEF_TOKEN");
const EDGE_PID = Number(env("BENCHLINK_EDGE_PID"));
const PROVIDER = env("BENCHLINK_PROVIDER", "provider-demo-01");
const CAMERA = "cam-front-01";
const MIC = "mic-01";
const IMG = "<img src=x onerror=alert(1)>";
const JS = "javascript:alert(1)";

function lease(capabilityId, holder, extra = {}) {
  return Object.assign({
    capability_id: capabilityId,
    holder_type: "audit_agent",
    holder_ref: holder,
    project_id: "console-test",
    purpose: "console check",
    priority: 50,
    requested_duration_seconds: 120,
  }, extra);
}

/** Seconds in an age such as "850 ms", "12 s ago", "4 min 05 s". */
function secs(text) {
  const m = /(?:(\d+) min )?(\d+) (s|ms)/.exec(text || "");
  if (!m) throw new Error(`not an age: ${text}`);
  return (Number(m[1] || 0) * 60) + (m[3] === "ms" ? 0 : Number(m[2]));
}

const capRow = (id) => `#providers tr.cap[data-capability-id="${id}"]`;

await run("lab", async (t) => {
  const { page, watch } = await openPage(t.context);

  await t.step("sign-in page, then the lab lists the bench's capabilities online", async () => {
    await page.goto(`${env("BENCHLINK_URL")}/console/`);
    await page.waitForSelector("#token");
    await screenshot(page, "signin");
    await signIn(page, ADMIN);
    const card = `section.provider[data-provider-id="${PROVIDER}"]`;
    await page.waitForSelector(`${card}[data-online="true"]`, { timeout: 10_000 });
    const rows = await page.$$eval(`${card} tr.cap`, (trs) => trs.map((tr) => ({ id: tr.dataset.capabilityId, status: tr.dataset.status, offline: tr.classList.contains("offline") })));
    check(rows.length === 8, `expected the bench's 8 capabilities, got ${rows.length}: ${JSON.stringify(rows)}`);
    check(rows.every((r) => !r.offline && r.status !== "offline"), `a capability is offline: ${JSON.stringify(rows)}`);
    const types = await page.$$eval(`${card} td.type`, (tds) => tds.map((td) => td.parentElement.dataset.type));
    for (const w of ["camera", "microphone", "speaker", "serial_port", "relay", "programmable_power_supply", "thumb_robot", "screen_capture"]) {
      check(types.includes(w), `type group ${w} missing: ${types}`);
    }
    check(await page.$$eval("#token", (x) => x.length) === 0, "sign-in form still shown");
    const stored = await page.evaluate(() => ({ s: sessionStorage.getItem("benchlink.token"), l: Object.keys(localStorage).length, u: location.href }));
    check(stored.s === ADMIN && stored.l === 0 && !stored.u.includes(ADMIN), "token must be in sessionStorage only");
  });

  let hwLease;
  await t.step("a lease taken through the API shows its holder and countdown within 1 s", async () => {
    const r = await http("POST", "/api/v1/capability-leases/request", HW, lease(CAMERA, "audit:hw-auditor-01", { priority: 40 }));
    check(r.status === 201, `lease request: ${r.status} ${JSON.stringify(r.json)}`);
    hwLease = r.json.lease_id;
    const t0 = Date.now();
    await page.waitForSelector(`${capRow(CAMERA)} .holder[data-lease-id="${hwLease}"] .countdown`, { timeout: 1000 });
    const ms = Date.now() - t0;
    const txt = await page.textContent(`${capRow(CAMERA)} .holder[data-lease-id="${hwLease}"]`);
    check(txt.includes("audit:hw-auditor-01") && txt.includes("p40"), `holder cell: ${txt}`);
    const left = Number(await page.getAttribute(`${capRow(CAMERA)} .holder .countdown`, "data-ms-left"));
    check(left > 100_000 && left <= 120_000, `countdown ${left} ms, want about 120 s`);
    console.log(`     lease visible ${ms} ms after its grant answer`);
  });

  let chiefLease;
  await t.step("a preemption shows the grace period, then the hand-over", async () => {
    const r = await http("POST", "/api/v1/capability-leases/request", CHIEF, lease(CAMERA, "audit:chief-auditor-01", {
      priority: 90, preempt_if_needed: true, preempt_reason: "chief_audit", purpose: "chief audit",
    }));
    check(r.status === 201 || r.status === 202, `preempting request: ${r.status} ${JSON.stringify(r.json)}`);
    chiefLease = r.json.lease_id;
    await page.waitForSelector(`${capRow(CAMERA)} .holder[data-lease-id="${hwLease}"][data-status="grace_period"] .grace .countdown`, { timeout: 2000 });
    const txt = await page.textContent(capRow(CAMERA));
    check(txt.includes("grace"), `grace not shown: ${txt}`);
    if (r.status === 202) check(txt.includes("audit:chief-auditor-01"), `the waiting chief is not in the queue: ${txt}`);
    await screenshot(page, "lab-grace");
    await page.waitForSelector(`${capRow(CAMERA)} .holder[data-lease-id="${chiefLease}"] .countdown`, { timeout: 10_000 });
    check(await page.$(`${capRow(CAMERA)} .holder[data-lease-id="${hwLease}"]`) === null, "the preempted holder is still listed");
    check(await page.$(`${capRow(CAMERA)} .queued[data-lease-id="${chiefLease}"]`) === null, "the new holder is still queued");
  });

  await t.step("a request that must wait is in the queue with its priority and age", async () => {
    const r = await http("POST", "/api/v1/capability-leases/request", HW, lease(CAMERA, "audit:hw-auditor-01", { priority: 30, queue_timeout_seconds: 120, purpose: "after the chief" }));
    check(r.status === 202, `queued request: ${r.status} ${JSON.stringify(r.json)}`);
    const q = `${capRow(CAMERA)} .queued[data-lease-id="${r.json.lease_id}"]`;
    await page.waitForSelector(q, { timeout: 1000 });
    const txt = await page.textContent(q);
    check(txt.includes("audit:hw-auditor-01") && txt.includes("p30") && txt.includes("waiting"), `queue cell: ${txt}`);
    await page.waitForTimeout(1200);
    await screenshot(page, "lab");
  });

  await t.step("a request queued by selector waits in the queue of the capabilities it could take", async () => {
    const r = await http("POST", "/api/v1/capability-leases/request", HW, {
      capability_selector: { capability_type: "camera" },
      holder_type: "audit_agent", holder_ref: "audit:hw-auditor-01", project_id: "console-test",
      purpose: "any camera", priority: 35, requested_duration_seconds: 60, queue_timeout_seconds: 120,
    });
    check(r.status === 202 && r.json.capability_id === "", `selector request: ${r.status} ${JSON.stringify(r.json)}`);
    const q = `${capRow(CAMERA)} .queued.by-selector[data-lease-id="${r.json.lease_id}"]`;
    await page.waitForSelector(q, { timeout: 1000 });
    const txt = await page.textContent(q);
    check(txt.includes("audit:hw-auditor-01") && txt.includes("p35") && txt.includes("waiting") && txt.includes("by selector: camera (any of 1)"), `selector queue cell: ${txt}`);
    // Queue order: p35 by selector before the p30 request by id.
    const order = await page.$$eval(`${capRow(CAMERA)} .queue .queued`, (l) => l.map((x) => x.dataset.leaseId));
    check(order[0] === r.json.lease_id, `queue order: ${order}`);
    check(await page.$$(`${capRow(MIC)} .queued[data-lease-id="${r.json.lease_id}"]`).then((x) => x.length) === 0, "listed under a capability it cannot take");
    const age1 = await page.textContent(`${q} .age`);
    await page.waitForTimeout(2100);
    const age2 = await page.textContent(`${q} .age`);
    check(secs(age2) > secs(age1), `waiting age does not tick: ${age1}, then ${age2}`);
    await screenshot(page, "lab-selector-queue");
    // Gone once withdrawn.
    const rel = await http("POST", `/api/v1/capability-leases/${r.json.lease_id}/release`, HW, { reason: "no longer needed" });
    check(rel.status === 200, `withdraw: ${rel.status} ${JSON.stringify(rel.json)}`);
    await page.waitForSelector(q, { state: "detached", timeout: 2000 });
  });

  await t.step("the last heartbeat's age ticks while the page is open", async () => {
    const sel = `section.provider[data-provider-id="${PROVIDER}"] .heartbeat-age`;
    const a = secs(await page.textContent(sel));
    await page.waitForTimeout(2200);
    const b = secs(await page.textContent(sel));
    check(b > a, `heartbeat age ${a} s, then ${b} s`);
  });

  await t.step("markup in display_name, holder_ref and purpose renders as text", async () => {
    const pid = "provider-markup-01";
    let r = await http("POST", "/api/v1/capability-providers/register", ADMIN, {
      provider_id: pid, node_id: "markup-node", hostname: "markup.local", platform: "linux",
      gateway_version: "0.1.0", network_zone: "lan", labels: [], boot_id: "boot-markup",
    });
    check(r.status === 200, `register provider: ${r.status} ${JSON.stringify(r.json)}`);
    r = await http("POST", "/api/v1/capabilities/register", ADMIN, {
      provider_id: pid,
      capabilities: [{
        capability_id: "relay-markup-01", capability_type: "relay", display_name: `${IMG} ${JS}`,
        lease_mode: "exclusive", preemptible: true, supported_actions: ["switch_on", "switch_off"],
      }],
    });
    check(r.status === 200, `register capability: ${r.status} ${JSON.stringify(r.json)}`);
    r = await http("POST", "/api/v1/capability-leases/request", ADMIN, lease("relay-markup-01", IMG, { holder_type: "human_operator", purpose: `${JS} ${IMG}` }));
    check(r.status === 201, `markup lease: ${r.status} ${JSON.stringify(r.json)}`);
    const markupLease = r.json.lease_id;
    await page.waitForSelector(`${capRow("relay-markup-01")} .holder[data-lease-id="${markupLease}"]`, { timeout: 5000 });
    const row = await page.textContent(capRow("relay-markup-01"));
    check(row.includes(`${IMG} ${JS}`), `display name not shown literally: ${row}`);
    check(row.includes(IMG), "holder_ref not shown literally");
    check(await page.$$eval("#providers img", (x) => x.length) === 0, "an <img> element was created from data");
    check(await page.$$eval("a[href^='javascript']", (x) => x.length) === 0, "a javascript: link exists");
    await page.click(`${capRow("relay-markup-01")} .holder a.holder-ref`);
    await page.waitForSelector("#lease-purpose");
    check((await page.textContent("#lease-purpose")) === `${JS} ${IMG}`, "purpose not shown literally");
    check((await page.textContent("#lease-holder")) === IMG, "holder_ref not shown literally on the lease page");
    await page.waitForTimeout(300);
    checkClean(watch, "markup");
  });

  await t.step("the lease page shows the timeline of the preempted lease", async () => {
    await page.goto(`${env("BENCHLINK_URL")}/console/#/leases/${hwLease}`);
    await page.waitForSelector('#lease-timeline li[data-event-type="lease_preempted"]', { timeout: 10_000 });
    const types = await page.$$eval("#lease-timeline li", (lis) => lis.map((li) => li.dataset.eventType));
    for (const want of ["lease_requested", "lease_granted", "lease_preempt_requested", "lease_preempted"]) {
      check(types.includes(want), `timeline lacks ${want}: ${types.join(",")}`);
    }
    check(types.indexOf("lease_granted") < types.indexOf("lease_preempted"), `timeline out of order: ${types}`);
    const text = await page.textContent("#lease-timeline");
    check(text.includes("chief_audit"), "preempt reason missing");
    check(text.includes(chiefLease), "the preempting lease is not named");
    check((await page.textContent("#lease-status")).includes("revoked"), "status is not revoked");
    await screenshot(page, "lease");
  });

  await t.step("the events page tails live, filtered by type", async () => {
    await page.goto(`${env("BENCHLINK_URL")}/console/#/events`);
    await page.waitForSelector("#events-body");
    await page.waitForFunction(() => document.querySelector("#stream-status")?.textContent.includes("live"));
    // It opens with the recent past: the grants made before it opened are listed.
    await page.waitForSelector('#events-body tr[data-event-type="lease_granted"]', { state: "attached", timeout: 3000 });
    check((await page.textContent("#events-count")).includes("before this page opened"), "the count does not say what was replayed");
    await page.click('button[data-group="leases"]');
    const r = await http("POST", `/api/v1/capability-leases/${chiefLease}/release`, CHIEF, { reason: "done" });
    check(r.status === 200, `release: ${r.status}`);
    await page.waitForSelector(`#events-body tr[data-event-type="lease_released"]:not([hidden])`, { timeout: 3000 });
    // A provider event arrives but stays hidden by the filter.
    await http("POST", "/api/v1/capability-providers/register", ADMIN, {
      provider_id: "provider-markup-01", node_id: "markup-node", hostname: "markup.local", platform: "linux",
      gateway_version: "0.1.0", network_zone: "lan", labels: [], boot_id: "boot-markup-2",
    });
    await page.waitForSelector('#events-body tr[data-event-type="provider_registered"]', { state: "attached", timeout: 3000 });
    check(await page.$('#events-body tr[data-event-type="provider_registered"]:not([hidden])') === null, "a filtered-out type is shown");
    await page.click('button[data-group="all"]');
    await screenshot(page, "events");
  });

  await t.step("a viewer sees no action buttons and a forged call is refused", async () => {
    const v = await http("POST", "/api/v1/auth/tokens", ADMIN, { role: "viewer", name: "console-viewer" });
    check(v.status === 201, `viewer token: ${v.status}`);
    const r = await http("POST", "/api/v1/capability-leases/request", HW, lease(MIC, "audit:hw-auditor-01"));
    check(r.status === 201, `lease for the viewer to see: ${r.status} ${JSON.stringify(r.json)}`);
    const other = await t.context.newPage();
    await signIn(other, v.json.token);
    await other.waitForSelector(`${capRow(MIC)} .holder[data-lease-id="${r.json.lease_id}"]`, { timeout: 5000 });
    check((await other.textContent("#role")) === "viewer", "role not shown");
    check(await other.$$eval("button.action", (b) => b.length) === 0, "a viewer's lab page has action buttons");
    await other.goto(`${env("BENCHLINK_URL")}/console/#/leases/${r.json.lease_id}`);
    await other.waitForSelector("#lease-status .badge");
    check(await other.$$eval("button.action", (b) => b.length) === 0, "a viewer's lease page has action buttons");
    const forged = await other.evaluate(async (id) => {
      const resp = await fetch(`/api/v1/capability-leases/${id}/release`, {
        method: "POST",
        headers: { Authorization: `Bearer ${sessionStorage.getItem("benchlink.token")}`, "Content-Type": "application/json" },
        body: "{}",
      });
      return resp.status;
    }, r.json.lease_id);
    check(forged === 403, `a viewer's forged release answered ${forged}`);
    await other.close();
    // The admin does see the buttons.
    await page.goto(`${env("BENCHLINK_URL")}/console/#/lab`);
    await page.waitForSelector(`${capRow(MIC)} .holder button.action`, { timeout: 5000 });
    await page.waitForFunction(() => document.querySelector("#stream-status")?.textContent.includes("live"));
  });

  await t.step("after a dropped stream the page resumes with Last-Event-ID and misses nothing", async () => {
    await page.goto(`${env("BENCHLINK_URL")}/console/#/lab`);
    await page.waitForSelector(`${capRow("spk-01")}`);
    await page.waitForFunction(() => document.querySelector("#stream-status")?.textContent.includes("live"));
    // Offline stops new connections only: cut the open stream too.
    await t.context.setOffline(true);
    await page.evaluate(async () => { const { events } = await import("/console/api.js"); events.ctrl.abort(); });
    await page.waitForFunction(() => /reconnecting/.test(document.querySelector("#stream-status")?.textContent || ""), null, { timeout: 5000 });
    const r = await http("POST", "/api/v1/capability-leases/request", HW, lease("spk-01", "audit:hw-auditor-01", { purpose: "while the console was cut off" }));
    check(r.status === 201, `lease while offline: ${r.status} ${JSON.stringify(r.json)}`);
    await page.waitForTimeout(300);
    check(await page.$(`${capRow("spk-01")} .holder[data-lease-id="${r.json.lease_id}"]`) === null, "shown while the page was offline");
    await t.context.setOffline(false);
    await page.waitForSelector(`${capRow("spk-01")} .holder[data-lease-id="${r.json.lease_id}"]`, { timeout: 10_000 });
    await page.waitForFunction(() => document.querySelector("#stream-status")?.textContent.includes("live"));
  });

  await t.step("on a 420 px wide screen the bar wraps and the page does not overflow", async () => {
    await page.setViewportSize({ width: 420, height: 860 });
    await page.goto(`${env("BENCHLINK_URL")}/console/#/lab`);
    await page.waitForSelector(`section.provider[data-provider-id="${PROVIDER}"]`);
    const m = await page.evaluate(() => {
      const head = document.querySelector("header.top").getBoundingClientRect();
      const nav = document.querySelector("nav.nav").getBoundingClientRect();
      const signout = document.querySelector("#signout").getBoundingClientRect();
      return { page: document.documentElement.scrollWidth, navBottom: nav.bottom, headBottom: head.bottom, signoutRight: signout.right };
    });
    check(m.page <= 420, `the page is ${m.page} px wide at 420`);
    check(m.navBottom <= m.headBottom && m.signoutRight <= 420, `the bar overflows: ${JSON.stringify(m)}`);
    await screenshot(page, "lab-narrow");
    await page.setViewportSize({ width: 1440, height: 900 });
  });

  await t.step("killing the edge greys its capabilities out", async () => {
    process.kill(EDGE_PID, "SIGKILL");
    const t0 = Date.now();
    await page.waitForSelector(`section.provider.offline[data-provider-id="${PROVIDER}"]`, { timeout: 20_000 });
    console.log(`     provider greyed ${Date.now() - t0} ms after the kill`);
    const off = await page.$$eval(`section.provider[data-provider-id="${PROVIDER}"] tr.cap`, (trs) => trs.filter((t) => t.classList.contains("offline")).length);
    check(off === 8, `${off} of 8 rows greyed`);
    const opacity = await page.$eval(`section.provider[data-provider-id="${PROVIDER}"]`, (el) => getComputedStyle(el).opacity);
    check(Number(opacity) < 1, `offline card not greyed (opacity ${opacity})`);
    await screenshot(page, "lab-offline");
    checkClean(watch, "lab");
  });

  await t.step("sign-out forgets the token", async () => {
    await page.click("#signout");
    await page.waitForSelector("#token");
    check(await page.evaluate(() => sessionStorage.getItem("benchlink.token")) === null, "token kept after sign-out");
    await page.reload();
    await page.waitForSelector("#token");
  });
});
