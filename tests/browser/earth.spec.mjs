// The Earth page in a real chromium: AI commands run their plans on the
// map (the satellite layer on, exactly the returned ids highlighted, the
// count in the panel; compute centers with the missing-data note),
// ordinary search never calls the command endpoint, a denied microphone
// says so, a spoken command (chromium's fake capture playing an espeak-ng
// WAV) is transcribed by the ASR stand-in and executed, with the
// transcription step on its run; wake listening uploads nothing until the
// wake word (set in the panel, kept in localStorage) is heard; markup in
// names and summaries is shown as text.
//
// Env: BENCHLINK_URL, BENCHLINK_TOKEN (super_admin), SPEECH_WAV (the WAV
// chromium captures), SPOKEN_TEXT (what the ASR stand-in answers).

import { run, openPage, signIn, screenshot, check, checkClean, env, http, BASE } from "./lib.mjs";

const MARKUP = "<img src=x onerror=alert(1)><b>bold</b>";
const WAKE = "你好地球";

// Chromium has no on-device speech model here: a stand-in for the
// browser's recognizer (installed before the page's scripts) that reports
// on-device recognition and hears what the spec says with __hear(text).
// The page's own code decides what to do with what it hears.
function standInRecognizer() {
  class Recognizer {
    static async available(opts) { return opts && opts.processLocally ? "available" : "unavailable"; }
    constructor() { this.running = false; window.__sr = this; }
    start() { this.running = true; window.__srStarts = (window.__srStarts || 0) + 1; }
    stop() { this.running = false; }
    abort() { this.running = false; }
  }
  window.SpeechRecognition = Recognizer;
  window.__hear = (text) => {
    const r = window.__sr;
    if (!r || !r.running || !r.onresult) return false;
    r.onresult({ resultIndex: 0, results: [[{ transcript: text }]] });
    return true;
  };
}

async function highlightedIds(page, domain) {
  return page.evaluate((d) => {
    const m = window.__earthMap;
    const ents = m.entities(d);
    return [...m.highlights(d).ai].map((i) => ents[i].entity_id).sort();
  }, domain);
}

async function command(page, text) {
  await page.fill("#earth-q", text);
  const resp = page.waitForResponse((r) => r.url().endsWith("/api/v1/agents/earth/command") && r.request().method() === "POST");
  await page.click("#earth-ai");
  const json = await (await resp).json();
  await page.waitForFunction((id) => document.querySelector("#ai-result")?.dataset.runId === id, json.run_id, { timeout: 10_000 });
  return json;
}

run("earth", async (t) => {
  const origin = new URL(BASE()).origin;
  await t.context.addInitScript(standInRecognizer);
  const { page, watch } = await openPage(t.context);
  const requests = [];
  page.on("request", (r) => requests.push(`${r.method()} ${new URL(r.url()).pathname}`));

  await t.step("sign in on the Earth page; the map and its layers load", async () => {
    await signIn(page, env("BENCHLINK_TOKEN"), "#/earth");
    await page.waitForSelector("#page[data-earth-ready]", { timeout: 30_000 });
    const status = await page.textContent("#earth-status");
    check(!status.includes("not loaded"), `layers: ${status}`);
    check(await page.$("#layer-satellites") !== null, "a satellites toggle");
    check((await page.textContent(".earth-attribution")).includes("Natural Earth"), "the map's attribution is shown");
  });

  await t.step("on a 420 px wide screen the map keeps the width and the panel goes under it", async () => {
    await page.setViewportSize({ width: 420, height: 860 });
    await page.waitForFunction(() => {
      const c = document.querySelector("canvas.earth-canvas");
      return c && c.width >= 360 && c.width === c.clientWidth;
    }, null, { timeout: 5000 });
    const m = await page.evaluate(() => ({
      page: document.documentElement.scrollWidth,
      map: document.querySelector("canvas.earth-canvas").getBoundingClientRect().bottom,
      panel: document.querySelector(".earth-panel").getBoundingClientRect().top,
    }));
    check(m.page <= 420 && m.panel >= m.map, `narrow layout: ${JSON.stringify(m)}`);
    await screenshot(page, "earth-narrow");
    await page.setViewportSize({ width: 1440, height: 900 });
    await page.waitForFunction(() => document.querySelector("canvas.earth-canvas").width > 900, null, { timeout: 5000 });
  });

  await t.step("高亮所有北斗卫星 with AI: satellite layer on, exactly the returned ids highlighted, the count shown", async () => {
    check(!(await page.isChecked("#layer-satellites")), "the satellite layer starts off");
    await page.fill("#earth-q", "高亮所有北斗卫星");
    await page.waitForSelector("#earth-ai.suggested", { timeout: 2_000 });
    const json = await command(page, "高亮所有北斗卫星");
    const hl = json.actions.find((a) => a.type === "highlight_entities");
    check(hl && hl.domain === "satellites", `plan: ${JSON.stringify(json.actions.map((a) => a.type))}`);
    const want = [...hl.entity_ids].sort();
    check(want.length === 50, `the shipped data has 50 BeiDou satellites, the API returned ${want.length}`);
    check(await page.isChecked("#layer-satellites"), "the satellite layer is on");
    const got = await highlightedIds(page, "satellites");
    check(JSON.stringify(got) === JSON.stringify(want), `highlighted ${got.length} ids, not the API's ${want.length}`);
    check((await page.textContent("#ai-count")).includes(`已高亮 ${want.length} 个对象`), "the panel count");
    check(await page.$$eval("#ai-items li", (l) => l.length) === Math.min(20, json.actions.find((a) => a.type === "open_result_panel").items.length), "the first 20 entities listed");
    check(await page.getAttribute("#earth-run-link", "href") === `#/runs/${json.run_id}`, "a link to the run");
    await page.waitForTimeout(300);
    await screenshot(page, "earth-beidou");
  });

  await t.step("显示中国大陆的算力中心: the compute centers highlighted, with the missing-data note", async () => {
    const json = await command(page, "显示中国大陆的算力中心");
    const hl = json.actions.find((a) => a.type === "highlight_entities");
    check(hl && hl.domain === "compute_centers" && hl.entity_ids.length > 0, `plan: ${JSON.stringify(json.actions)}`);
    check(await page.isChecked("#layer-compute_centers"), "the compute-center layer is on");
    // Exactly the returned ids the layer has (a record without a position
    // is not on the map; the executor names those in a note).
    const onMap = new Set(await page.evaluate(() => window.__earthMap.entities("compute_centers").map((e) => e.entity_id)));
    const want = [...hl.entity_ids].filter((id) => onMap.has(id)).sort();
    const got = await highlightedIds(page, "compute_centers");
    check(got.length > 0 && JSON.stringify(got) === JSON.stringify(want), `highlighted ${got.length}, want ${want.length} of ${hl.entity_ids.length}`);
    if (want.length < hl.entity_ids.length) {
      check((await page.textContent("#exec-notes")).includes(`${hl.entity_ids.length - want.length} compute_centers id(s) not on the map`), "the skipped ids are noted");
    }
    check((await page.textContent("#ai-count")).includes(`已高亮 ${want.length} 个对象`), "the panel count");
    check((await highlightedIds(page, "satellites")).length === 0, "the previous command's highlight is cleared");
    check(json.missing_data.length > 0, "the API gives a missing_data note");
    const notes = await page.textContent("#missing-data");
    check(notes.includes(json.missing_data[0]), `missing data shown: ${notes}`);
    await screenshot(page, "earth-compute-cn");
  });

  await t.step("clear highlight keeps a locked selection", async () => {
    await page.evaluate(() => window.__earthMap.highlights("compute_centers").toggleLocked(0));
    await page.click("#earth-clear");
    check((await highlightedIds(page, "compute_centers")).length === 0, "AI highlight cleared");
    check(await page.evaluate(() => window.__earthMap.highlights("compute_centers").locked.has(0)), "the locked marker stays locked");
    await page.evaluate(() => window.__earthMap.highlights("compute_centers").toggleLocked(0));
  });

  await t.step("ordinary search stays local: no command request", async () => {
    const before = requests.length;
    await page.fill("#earth-q", "BEIDOU");
    await page.press("#earth-q", "Enter");
    await page.waitForSelector("#search-results li", { timeout: 5_000 });
    check((await page.textContent("#search-results")).includes("BEIDOU"), "local results");
    const sent = requests.slice(before);
    check(!sent.some((r) => r.includes("/agents/")), `search sent: ${sent.join(", ")}`);
    check(!(await page.$("#earth-ai.suggested")), "a plain keyword does not suggest AI mode");
  });

  await t.step("markup in entity names and summaries is rendered as text", async () => {
    await page.route("**/api/v1/agents/earth/command", async (route) => {
      const resp = await route.fetch();
      const json = await resp.json();
      json.summary = `${json.summary} ${MARKUP}`;
      for (const a of json.actions) if (a.type === "open_result_panel") { a.title = MARKUP; if (a.items[0]) a.items[0].label = MARKUP; }
      json.missing_data = [MARKUP];
      await route.fulfill({ response: resp, json });
    });
    await command(page, "高亮所有北斗卫星");
    await page.unroute("**/api/v1/agents/earth/command");
    check((await page.textContent("#ai-title")) === MARKUP, "title as text");
    check((await page.textContent("#ai-summary")).includes(MARKUP), "summary as text");
    check((await page.textContent("#ai-items li")).includes(MARKUP), "label as text");
    check(await page.$$eval("#earth-results img, #earth-results b", (x) => x.length) === 0, "no element made from the markup");
    check(watch.dialogs.length === 0, "no script ran");
  });

  await t.step("a denied microphone says so; text keeps working", async () => {
    await t.context.clearPermissions();
    await page.click("#earth-mic");
    await page.waitForFunction(() => document.querySelector("#earth-voice-msg")?.textContent.length > 0, null, { timeout: 5_000 });
    check((await page.textContent("#earth-voice-msg")) === "麦克风权限未开启，仍可输入文字指令", `message: ${await page.textContent("#earth-voice-msg")}`);
    await screenshot(page, "earth-mic-denied");
  });

  await t.step("wake listening on, no wake word heard: nothing is uploaded, nothing recorded", async () => {
    await t.context.grantPermissions(["microphone"], { origin });
    check(await page.evaluate(() => window.__srStarts || 0) === 0, "nothing listens before voice wake is enabled");
    await page.fill("#wake-word", WAKE);
    await page.press("#wake-word", "Tab");
    check(await page.evaluate(() => localStorage.getItem("benchlink.earth.wake_word")) === WAKE, "the wake word is kept in localStorage");
    const before = requests.length;
    await page.check("#wake-enable");
    await page.waitForFunction(() => window.__srStarts > 0, null, { timeout: 5_000 });
    check((await page.textContent("#wake-state")).includes(WAKE), `state: ${await page.textContent("#wake-state")}`);
    for (const heard of ["今天天气不错", "小星球", "高亮所有北斗卫星"]) {
      check(await page.evaluate((x) => window.__hear(x), heard), "the recognizer is listening");
      await page.waitForTimeout(700);
    }
    await page.waitForTimeout(1_500);
    const sent = requests.slice(before);
    check(!sent.some((r) => r.includes("/speech/transcriptions")), `uploads before the wake word: ${sent.join(", ")}`);
    check(await page.$$eval("#earth-mic.recording", (x) => x.length) === 0, "not recording");
  });

  await t.step("the wake word starts one recording: transcribed, executed, its run shows the transcription step", async () => {
    const up = page.waitForResponse((r) => r.url().endsWith("/api/v1/agents/speech/transcriptions"), { timeout: 20_000 });
    const cmd = page.waitForResponse((r) => r.url().endsWith("/api/v1/agents/earth/command"), { timeout: 25_000 });
    check(await page.evaluate((x) => window.__hear(x), `${WAKE}`), "the recognizer is listening");
    await page.waitForSelector("#earth-mic.recording", { timeout: 5_000 });
    const tr = await (await up).json();
    check(tr.text === env("SPOKEN_TEXT"), `transcription: ${JSON.stringify(tr)}`);
    const json = await (await cmd).json();
    await page.waitForFunction((id) => document.querySelector("#ai-result")?.dataset.runId === id, json.run_id, { timeout: 10_000 });
    const want = [...json.actions.find((a) => a.type === "highlight_entities").entity_ids].sort();
    check(want.length === 50, `the spoken command found ${want.length}`);
    check(JSON.stringify(await highlightedIds(page, "satellites")) === JSON.stringify(want), "the spoken command's ids highlighted");
    check((await page.textContent("#earth-voice-msg")).includes(env("SPOKEN_TEXT")), "the transcription is shown");
    await screenshot(page, "earth-spoken");
    await page.uncheck("#wake-enable");
    check((await page.textContent("#wake-state")) === "off", "listening turned off");
    const detail = await http("GET", `/api/v1/agents/runs/${json.run_id}`, env("BENCHLINK_TOKEN"));
    const steps = detail.json.steps.map((s) => `${s.step_type}:${s.name}`);
    check(steps[0] === "transcription:speech.transcription", `steps: ${steps}`);
    check(detail.json.run.input.source === "speech", `input: ${JSON.stringify(detail.json.run.input)}`);
    await page.click("#earth-run-link");
    await page.waitForSelector(".earth .earth-text", { timeout: 10_000 });
    check((await page.textContent(".earth .earth-text")).includes(env("SPOKEN_TEXT")), "the run page shows the transcription");
    await screenshot(page, "earth-spoken-run");
  });

  checkClean(watch, "Earth page");
}, { args: ["--use-fake-device-for-media-stream", `--use-file-for-fake-audio-capture=${env("SPEECH_WAV")}`] });
