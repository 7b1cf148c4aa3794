// The Sessions & evidence pages in a real chromium: the list filters and
// updates live, an image renders, an audio clip has a duration, a serial
// log shows the DUT's boot banner and can be searched, an MJPEG clip
// plays frame by frame, the sha256 badge says verified, and an artifact
// whose stored bytes were altered says mismatch.
//
// Env: BENCHLINK_URL, BENCHLINK_TOKEN (any reader), IMAGE_SESSION,
// AUDIO_SESSION, LOG_SESSION, CLIP_SESSION, TAMPERED_SESSION, TAMPERED_ARTIFACT,
// DUT_BANNER, LIVE_LEASE + LIVE_TOKEN (a console lease and its holder's
// token: the spec acts on it to see a new session arrive).

import { run, openPage, signIn, screenshot, check, checkClean, env, http } from "./lib.mjs";

const sel = (id) => `tr[data-session-id="${id}"]`;

/** Wait for the one artifact card of a session page to finish its check. */
async function verdict(page, type) {
  const card = `section.artifact[data-artifact-type="${type}"]`;
  await page.waitForSelector(`${card} .sha-badge:not([data-verify="pending"])`, { timeout: 15_000 });
  return page.$eval(`${card} .sha-badge`, (b) => ({ verify: b.dataset.verify, text: b.textContent }));
}

run("evidence", async (t) => {
  const { page, watch } = await openPage(t.context);
  const banner = env("DUT_BANNER");

  await t.step("sign in on the sessions page", () => signIn(page, env("BENCHLINK_TOKEN"), "#/sessions"));

  await t.step("the list shows the sessions and filters by status", async () => {
    for (const s of ["IMAGE_SESSION", "AUDIO_SESSION", "LOG_SESSION"]) await page.waitForSelector(sel(env(s)), { timeout: 10_000 });
    await page.selectOption("#filter-status", "failed");
    await page.waitForFunction((id) => !document.querySelector(`tr[data-session-id="${id}"]`), env("IMAGE_SESSION"), { timeout: 5_000 });
    await page.selectOption("#filter-status", "");
    await page.waitForSelector(sel(env("IMAGE_SESSION")), { timeout: 5_000 });
    await screenshot(page, "sessions");
  });

  await t.step("a new session appears within 2 s without a reload", async () => {
    const marker = await page.evaluate(() => { window.__noReload = Math.random(); return window.__noReload; });
    const r = await http("POST", `/api/v1/capability-leases/${env("LIVE_LEASE")}/actions`, env("LIVE_TOKEN"),
      { action: "read", params: { timeout_ms: 50 }, wait_ms: 0 });
    check(r.status === 200 || r.status === 202, `the action was refused: ${r.status} ${JSON.stringify(r.json)}`);
    await page.waitForSelector(sel(r.json.session_id), { timeout: 2_000 });
    check(await page.evaluate(() => window.__noReload) === marker, "the page reloaded");
  });

  await t.step("an image artifact renders and verifies", async () => {
    await page.goto(`${env("BENCHLINK_URL")}/console/#/sessions/${env("IMAGE_SESSION")}`);
    await page.waitForFunction(() => { const i = document.querySelector("img.artifact-image"); return i && i.complete && i.naturalWidth > 0; }, null, { timeout: 15_000 });
    const v = await verdict(page, "image");
    check(v.verify === "verified", `image badge: ${v.text}`);
    check(await page.isVisible(".session-input"), "the session's input is shown");
    check(await page.isVisible(".session-result"), "the session's result summary is shown");
    await screenshot(page, "session-image");
  });

  await t.step("an audio clip plays with a duration", async () => {
    await page.goto(`${env("BENCHLINK_URL")}/console/#/sessions/${env("AUDIO_SESSION")}`);
    const d = await page.waitForFunction(() => {
      const a = document.querySelector("audio.artifact-audio");
      return a && Number.isFinite(a.duration) && a.duration > 0 ? a.duration : null;
    }, null, { timeout: 15_000 });
    const secs = await d.jsonValue();
    check(secs > 0.5, `audio duration ${secs} s`);
    const v = await verdict(page, "audio_clip");
    check(v.verify === "verified", `audio badge: ${v.text}`);
    await screenshot(page, "session-audio");
  });

  await t.step("an MJPEG clip plays frame by frame with its keyframes", async () => {
    await page.goto(`${env("BENCHLINK_URL")}/console/#/sessions/${env("CLIP_SESSION")}`);
    await page.waitForFunction(() => { const i = document.querySelector(".clip img.artifact-frame"); return i && i.complete && i.naturalWidth > 0; }, null, { timeout: 15_000 });
    check(await page.$$eval(".clip img.keyframe", (k) => k.length) > 1, "keyframes shown");
    const v = await verdict(page, "video_clip");
    check(v.verify === "verified", `clip badge: ${v.text}`);
    const first = await page.$eval(".clip img.artifact-frame", (i) => i.src);
    await page.click(".clip button.play");
    await page.waitForFunction((s) => document.querySelector(".clip img.artifact-frame").src !== s, first, { timeout: 5_000 });
    await screenshot(page, "session-clip");
  });

  await t.step("a serial log shows the boot banner and can be searched", async () => {
    await page.goto(`${env("BENCHLINK_URL")}/console/#/sessions/${env("LOG_SESSION")}`);
    await page.waitForFunction((b) => document.querySelector("pre.serial-log")?.textContent.includes(b), banner, { timeout: 15_000 });
    const v = await verdict(page, "serial_log");
    check(v.verify === "verified", `log badge: ${v.text}`);
    await page.fill("input.log-search", "ready");
    await page.waitForSelector("pre.serial-log mark", { timeout: 3_000 });
    const shown = await page.$eval("pre.serial-log", (p) => p.textContent);
    check(shown.includes(banner), "the banner line stays when searching for it");
    await screenshot(page, "session-serial-log");
  });

  await t.step("altered stored bytes show mismatch", async () => {
    await page.goto(`${env("BENCHLINK_URL")}/console/#/sessions/${env("TAMPERED_SESSION")}`);
    const card = `section.artifact[data-artifact-id="${env("TAMPERED_ARTIFACT")}"]`;
    await page.waitForSelector(`${card} .sha-badge:not([data-verify="pending"])`, { timeout: 15_000 });
    const v = await page.$eval(`${card} .sha-badge`, (b) => ({ verify: b.dataset.verify, text: b.textContent }));
    check(v.verify === "mismatch" && v.text === "mismatch", `tampered badge: ${v.verify} ${v.text}`);
    const [stored, computed] = await page.$$eval(`${card} code.sha`, (c) => c.map((x) => x.textContent));
    check(stored !== computed && computed.length === 64, `stored ${stored} computed ${computed}`);
    await screenshot(page, "session-mismatch");
  });

  checkClean(watch, "evidence pages");
});
