// The Audit tasks pages in a real chromium: the request with its claim
// and status, the result's decision, confidence and findings by severity,
// links to the claim's lease and to the cited artifact's session, and
// markup in the objective and findings shown as text.
//
// Env: BENCHLINK_URL, BENCHLINK_TOKEN, AUDIT_ID, AUDIT_LEASE,
// IMAGE_ARTIFACT, IMAGE_SESSION, MARKUP (the markup put in the fields).

import { run, openPage, signIn, screenshot, check, checkClean, env } from "./lib.mjs";

run("audits", async (t) => {
  const { page, watch } = await openPage(t.context);
  const id = env("AUDIT_ID");
  const markup = env("MARKUP");

  await t.step("sign in on the audits page", () => signIn(page, env("BENCHLINK_TOKEN"), "#/audits"));

  await t.step("the list shows the request, its status and decision", async () => {
    const row = `tr[data-audit-id="${id}"]`;
    await page.waitForSelector(row, { timeout: 10_000 });
    const text = await page.$eval(row, (r) => r.textContent);
    check(text.includes("completed") && text.includes("fail"), `row: ${text}`);
    check(text.includes(markup), `the objective's markup is shown as text: ${text}`);
    await screenshot(page, "audits");
  });

  await t.step("the detail shows decision, confidence, findings by severity and links", async () => {
    await page.click(`tr[data-audit-id="${id}"] a`);
    await page.waitForSelector(".result .decision", { timeout: 10_000 });
    check((await page.textContent(".result .decision")).includes("fail"), "decision");
    check((await page.textContent(".result .confidence")).trim() === "82 %", "confidence");
    await page.waitForSelector(".findings.sev-critical .finding", { timeout: 5_000 });
    await page.waitForSelector(".findings.sev-low .finding", { timeout: 5_000 });
    const order = await page.$$eval(".findings", (f) => f.map((x) => x.className));
    check(order[0].includes("sev-critical"), `critical first: ${order}`);
    const title = await page.textContent(".findings.sev-critical .finding-title");
    check(title.includes(markup), `finding title as text: ${title}`);
    check(await page.$$eval(".finding img, .objective img, .result img", (x) => x.length) === 0, "no element was made from markup");
    await page.waitForSelector(`a.lease-link[href="#/leases/${env("AUDIT_LEASE")}"]`, { timeout: 5_000 });
    await page.waitForSelector(`a.artifact-link[href="#/sessions/${env("IMAGE_SESSION")}"]`, { timeout: 5_000 });
    await screenshot(page, "audit-detail");
  });

  await t.step("the cited artifact's link opens its session", async () => {
    await page.click(`a.artifact-link[href="#/sessions/${env("IMAGE_SESSION")}"] >> nth=0`);
    await page.waitForSelector(`section.artifact[data-artifact-id="${env("IMAGE_ARTIFACT")}"]`, { timeout: 10_000 });
  });

  await page.waitForTimeout(300);
  checkClean(watch, "audit pages");
});
