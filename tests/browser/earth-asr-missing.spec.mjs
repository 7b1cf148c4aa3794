// The Earth page against a registry without speech recognition: a
// recorded instruction gets 503 asr_not_configured, the panel says
// 语音识别未配置, and a typed command still runs.
//
// Env: BENCHLINK_URL, BENCHLINK_TOKEN, SPEECH_WAV (the WAV chromium captures).

import { run, openPage, signIn, check, checkClean, env, BASE } from "./lib.mjs";

run("earth-asr-missing", async (t) => {
  await t.context.grantPermissions(["microphone"], { origin: new URL(BASE()).origin });
  const { page, watch } = await openPage(t.context);

  await t.step("sign in on the Earth page", async () => {
    await signIn(page, env("BENCHLINK_TOKEN"), "#/earth");
    await page.waitForSelector("#page[data-earth-ready]", { timeout: 30_000 });
  });

  await t.step("a recording gets 503 asr_not_configured and the panel says 语音识别未配置", async () => {
    const up = page.waitForResponse((r) => r.url().endsWith("/api/v1/agents/speech/transcriptions"), { timeout: 20_000 });
    await page.click("#earth-mic");
    await page.waitForSelector("#earth-mic.recording", { timeout: 5_000 });
    await page.click("#earth-mic");
    const resp = await up;
    check(resp.status() === 503, `transcription status ${resp.status()}`);
    check((await resp.json()).error.code === "asr_not_configured", "the error code");
    await page.waitForSelector("#earth-voice-msg[data-reason=asr_not_configured]", { timeout: 5_000 });
    check((await page.textContent("#earth-voice-msg")) === "语音识别未配置", `message: ${await page.textContent("#earth-voice-msg")}`);
  });

  await t.step("text commands keep working", async () => {
    await page.fill("#earth-q", "高亮所有北斗卫星");
    const resp = page.waitForResponse((r) => r.url().endsWith("/api/v1/agents/earth/command"));
    await page.click("#earth-ai");
    const json = await (await resp).json();
    await page.waitForFunction((id) => document.querySelector("#ai-result")?.dataset.runId === id, json.run_id, { timeout: 10_000 });
    check((await page.textContent("#ai-count")).includes("已高亮 50 个对象"), `count: ${await page.textContent("#ai-count")}`);
  });

  checkClean(watch, "Earth page without ASR");
}, { args: ["--use-fake-device-for-media-stream", `--use-file-for-fake-audio-capture=${env("SPEECH_WAV")}`] });
