// Benchmark of the console's Earth page (scripts/bench-earth.sh runs it
// against a fresh registry with the shipped Earth data):
// - from the Earth command's response to its highlights drawn, for a
//   500-id plan (高亮所有星链卫星: the matches are cut at 500), median of
//   RUNS commands; the page stamps both times (window.__earthLast);
// - frames per second while the satellite layer animates, over SECONDS.
// Env: BENCHLINK_URL, BENCHLINK_TOKEN; RUNS (5), SECONDS (5).

import { env, launch, openPage, signIn, check } from "./lib.mjs";

const RUNS = Number(process.env.RUNS || 5);
const SECONDS = Number(process.env.SECONDS || 5);
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const browser = await launch();
try {
  const { page, watch } = await openPage(browser.context);
  await signIn(page, env("BENCHLINK_TOKEN"), "#/earth");
  await page.waitForSelector("#page[data-earth-ready]", { timeout: 60_000 });
  const sats = await page.evaluate(() => window.__earthMap.entities("satellites").length);
  const times = [];
  let ids = 0;
  for (let i = 0; i < RUNS; i++) {
    await page.fill("#earth-q", "高亮所有星链卫星");
    const resp = page.waitForResponse((r) => r.url().endsWith("/api/v1/agents/earth/command"));
    await page.click("#earth-ai");
    const run = (await (await resp).json()).run_id;
    await page.waitForFunction((id) => document.querySelector("#ai-result")?.dataset.runId === id, run, { timeout: 30_000 });
    const last = await page.evaluate(() => ({ ms: window.__earthLast.drawn_ms - window.__earthLast.response_ms, n: window.__earthMap.drawn.highlighted }));
    times.push(last.ms);
    ids = last.n;
  }
  check(ids === 500, `the worst case draws 500 highlighted satellites, drew ${ids}`);
  const fps = await page.evaluate(async (s) => {
    const m = window.__earthMap;
    const f0 = m.frames, t0 = performance.now();
    await new Promise((r) => setTimeout(r, s * 1000));
    return ((m.frames - f0) * 1000) / (performance.now() - t0);
  }, SECONDS);
  console.log(`Earth page, ${sats} satellites loaded:`);
  console.log(`  command response to ${ids} highlights drawn: median ${median(times).toFixed(1)} ms of ${RUNS} (${times.map((x) => x.toFixed(1)).join(", ")}); target < 100 ms`);
  console.log(`  satellite layer animating: ${fps.toFixed(1)} frames/s over ${SECONDS} s; target >= 30`);
  check(watch.pageErrors.length === 0, `page errors: ${watch.pageErrors.join("; ")}`);
} finally {
  await browser.close();
}
