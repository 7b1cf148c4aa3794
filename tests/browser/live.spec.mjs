// The live view in a real chromium: the holder of a camera lease whose
// stream runs opens it from the Lab row, frames arrive (the image decodes
// and changes at least twice), and after the lease is released the view
// says "stream ended" within 3 s.
//
// Env: BENCHLINK_URL, LIVE_TOKEN (the holder's token), LIVE_LEASE (its
// lease), LIVE_CAPABILITY (the streaming camera).

import { run, openPage, signIn, screenshot, check, checkClean, env, http } from "./lib.mjs";

/** A short fingerprint of the frame on screen (its pixels, via a canvas). */
function fingerprint() {
  const img = document.querySelector("#live-frame");
  if (!img || !img.complete || img.naturalWidth === 0) return null;
  const c = document.createElement("canvas");
  c.width = 64;
  c.height = 48;
  const g = c.getContext("2d");
  g.drawImage(img, 0, 0, c.width, c.height);
  const d = g.getImageData(0, 0, c.width, c.height).data;
  let hash = 0;
  for (let i = 0; i < d.length; i++) hash = (hash * 31 + d[i]) >>> 0;
  return `${img.naturalWidth}x${img.naturalHeight}:${hash}`;
}

run("live", async (t) => {
  const { page, watch } = await openPage(t.context);
  const cap = env("LIVE_CAPABILITY");

  await t.step("sign in on the lab page", () => signIn(page, env("LIVE_TOKEN"), "#/lab"));

  await t.step("the holder's lab row links to the live view", async () => {
    const link = `a.live-link[href="#/live/${cap}"]`;
    await page.waitForSelector(link, { timeout: 10_000 });
    await page.click(link);
    await page.waitForSelector("#live-frame", { timeout: 5_000 });
  });

  await t.step("frames arrive and the image changes at least twice", async () => {
    const seen = new Set();
    const deadline = Date.now() + 10_000;
    while (seen.size < 3 && Date.now() < deadline) {
      const f = await page.evaluate(fingerprint);
      if (f) seen.add(f);
      await page.waitForTimeout(150);
    }
    check(seen.size >= 3, `only ${seen.size} distinct frames in 10 s`);
    const w = await page.$eval("#live-frame", (i) => i.naturalWidth);
    check(w > 0, "the frame does not decode");
    await screenshot(page, "live");
  });

  await t.step("releasing the lease ends the view within 3 s", async () => {
    const r = await http("POST", `/api/v1/capability-leases/${env("LIVE_LEASE")}/release`, env("LIVE_TOKEN"), { reason: "live view test" });
    check(r.status === 200, `release: ${r.status} ${JSON.stringify(r.json)}`);
    const t0 = Date.now();
    await page.waitForSelector('#live-state[data-state="ended"]', { timeout: 3_000 });
    const text = await page.textContent("#live-state");
    check(text.includes("stream ended"), `state says: ${text}`);
    console.log(`     ended ${Date.now() - t0} ms after the release`);
    await screenshot(page, "live-ended");
  });

  checkClean(watch, "live view");
});
