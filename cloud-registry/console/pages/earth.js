// Earth: `#/earth`. A world map with a toggle per layer (satellites,
// compute centers, cables with landing points, BGP events, vessels and
// news when their sources have rows) and the merged search panel:
// - ordinary keywords search the loaded entities locally (no request);
// - "使用 AI" always sends the text to POST /api/v1/agents/earth/command and
//   runs the returned plan with earth-command-actions.js; text with an
//   action word (高亮 显示 找出 聚焦 打开 筛选 隐藏 清除) suggests it;
// - the microphone records one instruction (MediaRecorder), uploads it to
//   POST /api/v1/agents/speech/transcriptions and runs the command with
//   the transcription;
// - voice wake: off until enabled; a wake word kept in localStorage
//   (default 小星球) heard by the browser's on-device speech recognition
//   starts one recording. No audio leaves the browser before the wake
//   word; without on-device recognition it falls back to click-to-record.
// Every API string is rendered as text.

import { api, ApiError } from "../api.js";
import { h, replace, clear } from "../dom.js";
import { EarthMap, LAYERS, loadVendor } from "../earth-map.js";
import { executeEarthActionPlan, clearEarthCommandHighlights, getEarthCommandExecutionState } from "../earth-command-actions.js";

if (!document.querySelector("link[data-earth-css]")) {
  const link = document.createElement("link");
  link.rel = "stylesheet";
  link.href = "/console/pages/earth.css";
  link.dataset.earthCss = "true";
  document.head.appendChild(link);
}

/** localStorage key of the wake word (the console's only localStorage use). */
export const WAKE_WORD_KEY = "benchlink.earth.wake_word";
export const DEFAULT_WAKE_WORD = "小星球";
/** Words that make a text look like a command rather than a search. */
export const ACTION_WORDS = ["高亮", "显示", "找出", "聚焦", "打开", "筛选", "隐藏", "清除"];
/** Longest recorded instruction, ms. */
const MAX_RECORD_MS = 5000;
const MSG_MIC_DENIED = "麦克风权限未开启，仍可输入文字指令";
const MSG_ASR_MISSING = "语音识别未配置";
/** Satellite positions are fetched for now and this far ahead, then interpolated. */
const SAT_STEP_MS = 60_000;
/** Animation speed: map seconds per real second. */
const SAT_SPEED = 20;

export function wakeWord() {
  try { return localStorage.getItem(WAKE_WORD_KEY) || DEFAULT_WAKE_WORD; } catch (_) { return DEFAULT_WAKE_WORD; }
}

export function looksLikeCommand(text) {
  return ACTION_WORDS.some((w) => text.includes(w));
}

function recognizerClass() {
  return window.SpeechRecognition || window.webkitSpeechRecognition || null;
}

/** True when the browser can recognise `lang` on this device (no audio sent away). */
async function onDeviceRecognition(lang) {
  const SR = recognizerClass();
  if (!SR || typeof SR.available !== "function") return false;
  try {
    const a = await SR.available({ langs: [lang], processLocally: true });
    return a === "available";
  } catch (_) { return false; }
}

export default {
  path: "#/earth",
  title: "Earth",
  render(root) {
    const status = h("p", { class: "earth-status", id: "earth-status", role: "status" });
    const clock = h("span", { class: "muted earth-clock", id: "earth-clock" });
    const canvas = h("canvas", { id: "earth-canvas", class: "earth-canvas", width: 960, height: 480 });
    const tip = h("div", { class: "earth-tip", id: "earth-tip", hidden: true });
    const toggles = h("div", { class: "earth-layers", id: "earth-layers" });
    const input = h("input", { type: "search", id: "earth-q", placeholder: "搜索或输入指令，例如：高亮所有北斗卫星", autocomplete: "off", spellcheck: "false" });
    const hint = h("p", { class: "earth-hint", id: "earth-hint" });
    const aiBtn = h("button", { type: "button", id: "earth-ai", class: "earth-ai" }, "使用 AI");
    const searchBtn = h("button", { type: "button", id: "earth-search" }, "搜索");
    const micBtn = h("button", { type: "button", id: "earth-mic", class: "earth-mic", title: "录一条语音指令" }, "语音");
    const voiceMsg = h("p", { class: "earth-voice-msg", id: "earth-voice-msg", role: "alert" });
    const wakeInput = h("input", { type: "text", id: "wake-word", value: wakeWord(), maxlength: 20, spellcheck: "false" });
    const wakeToggle = h("input", { type: "checkbox", id: "wake-enable" });
    const wakeState = h("span", { class: "muted", id: "wake-state" }, "off");
    const results = h("div", { class: "earth-results", id: "earth-results" });
    const attribution = h("p", { class: "earth-attribution muted" },
      "Map: Natural Earth (public domain) via world-atlas; d3-geo, topojson-client — see ",
      h("a", { href: "/console/NOTICE.txt" }, "NOTICE.txt"), ".");

    replace(root,
      h("div", { class: "earth-page" },
        h("div", { class: "earth-main" },
          h("div", { class: "toolbar" }, h("h2", null, "Earth"), toggles, clock),
          h("div", { class: "earth-stage" }, canvas, tip),
          status, attribution),
        h("aside", { class: "earth-panel card" },
          h("div", { class: "card-body" },
            h("div", { class: "earth-query" }, input, searchBtn, aiBtn, micBtn),
            hint, voiceMsg,
            h("div", { class: "earth-wake" },
              h("label", { for: "wake-word" }, "唤醒词 "), wakeInput, " ",
              h("label", null, wakeToggle, " 语音唤醒"), " ", wakeState),
            results))));

    let map = null;
    let resizer = null;
    let lastCommand = null;
    let recording = null;
    let recognizer = null;
    let disposed = false;
    const counts = {};

    // ---- map -------------------------------------------------------
    function drawToggles() {
      clear(toggles);
      for (const l of LAYERS) {
        if ((l.key === "vessels" || l.key === "news") && !counts[l.key]) continue;
        const box = h("input", { type: "checkbox", id: `layer-${l.key}`, dataset: { layer: l.key } });
        box.checked = !!map?.layers[l.key].on;
        box.addEventListener("change", () => {
          map.setLayerKey(l.key, box.checked);
          map.draw();
        });
        toggles.appendChild(h("label", { class: "layer-toggle" }, box, ` ${l.label}`,
          h("span", { class: "muted" }, counts[l.key] !== undefined ? ` (${counts[l.key]})` : "")));
      }
    }

    async function loadLayer(l) {
      const q = l.key === "satellites" ? { at: new Date().toISOString() } : undefined;
      try {
        const fc = await api.get(`visualization/geo/${l.path}`, q);
        map.setLayerData(l.key, fc);
        counts[l.key] = map.layers[l.key].entities.length;
        if (l.key === "satellites") {
          mapTime = Date.now();
          await stepSatellites();
        }
      } catch (e) {
        map.layers[l.key].error = e.message;
      }
    }

    // Satellites: positions one step (a minute of map time) ahead, drawn
    // moving there over SAT_STEP_MS / SAT_SPEED, then the next step.
    let mapTime = 0;
    let stepTimer = null;
    async function stepSatellites() {
      if (disposed || !map) return;
      const next = mapTime + SAT_STEP_MS;
      try {
        const ahead = await api.get("visualization/geo/satellites", { at: new Date(next).toISOString() });
        if (disposed) return;
        const t0 = Date.now();
        map.setSatelliteMotion(ahead, t0, t0 + SAT_STEP_MS / SAT_SPEED);
        mapTime = next;
        clock.textContent = `satellites at ${new Date(next).toISOString().slice(0, 19).replace("T", " ")} UTC (×${SAT_SPEED})`;
      } catch (_) { /* keep the last positions; try again next step */ }
      const wait = () => {
        stepTimer = setTimeout(() => {
          if (disposed) return;
          if (map.layers.satellites.on) stepSatellites(); else wait();
        }, SAT_STEP_MS / SAT_SPEED);
      };
      wait();
    }

    (async () => {
      try {
        const [{ d3, topojson }, world] = await Promise.all([
          loadVendor(),
          fetch("/console/vendor/countries-110m.json").then((r) => {
            if (!r.ok) throw new Error("the map file is missing (scripts/setup.sh installs it)");
            return r.json();
          }),
        ]);
        if (disposed) return;
        map = new EarthMap(canvas, { d3, topojson, world });
        map.onResult = showResult;
        map.onLayerChange = (key, on) => {
          const b = document.getElementById(`layer-${key}`);
          if (b) b.checked = on;
          if (key === "satellites" && on) map.startAnimation();
        };
        window.__earthMap = map;
        // A window resized (or a phone turned) redraws at the new width.
        resizer = new ResizeObserver(() => {
          if (map && canvas.clientWidth && canvas.clientWidth !== canvas.width) { map.resize(); map.draw(); }
        });
        resizer.observe(canvas);
        map.draw();
        status.textContent = "Loading layers…";
        await Promise.all(LAYERS.map(loadLayer));
        if (disposed) return;
        map.setLayer("compute_centers", true);
        map.setLayer("cables", true);
        drawToggles();
        // Vessels and news are optional sources: without rows they are simply not offered.
        const optional = (l) => l.key === "vessels" || l.key === "news";
        const errs = LAYERS.filter((l) => map.layers[l.key].error && !optional(l)).map((l) => `${l.label}: ${map.layers[l.key].error}`);
        status.textContent = LAYERS.filter((l) => counts[l.key] !== undefined).map((l) => `${l.label} ${counts[l.key]}`).join(" · ") +
          (errs.length ? ` — not loaded: ${errs.join("; ")}` : "");
        root.dataset.earthReady = "true";
        map.draw();
      } catch (e) {
        status.textContent = `The map cannot be shown: ${e.message}`;
        status.classList.add("error");
      }
    })();

    // Hover and a locked selection (click), kept apart from AI highlights.
    canvas.addEventListener("mousemove", (e) => {
      if (!map) return;
      const r = canvas.getBoundingClientRect();
      const hit = map.pick(e.clientX - r.left, e.clientY - r.top);
      for (const d of Object.keys(map.states)) map.states[d].setHover(hit && hit.domain === d ? hit.index : null);
      if (hit) {
        tip.hidden = false;
        replace(tip, h("b", null, hit.entity.name), h("br"), h("code", null, hit.entity.entity_id));
        tip.style.left = `${e.clientX - r.left + 12}px`;
        tip.style.top = `${e.clientY - r.top + 12}px`;
      } else tip.hidden = true;
      if (!map.layers.satellites.on) map.draw();
    });
    canvas.addEventListener("click", () => {
      if (!map) return;
      for (const d of Object.keys(map.states)) {
        const st = map.states[d];
        if (st.hover !== null) st.toggleLocked(st.hover);
      }
      map.draw();
    });

    // ---- search panel ----------------------------------------------
    input.addEventListener("input", () => {
      const cmd = looksLikeCommand(input.value);
      aiBtn.classList.toggle("suggested", cmd);
      hint.textContent = cmd ? "这像是一条指令：点“使用 AI”执行" : "";
    });
    input.addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); localSearch(); } });
    searchBtn.addEventListener("click", localSearch);
    aiBtn.addEventListener("click", () => runCommand({ input_text: input.value.trim(), source: "text" }));

    function localSearch() {
      const q = input.value.trim().toLowerCase();
      if (!map || !q) return;
      const found = [];
      for (const l of LAYERS) {
        for (const e of map.layers[l.key].entities) {
          if (e.name.toLowerCase().includes(q) || e.entity_id.toLowerCase().includes(q)) found.push([l, e]);
        }
      }
      replace(results, h("div", { class: "search-results", id: "search-results" },
        h("h3", null, `搜索结果 · ${found.length}`),
        h("ul", null, found.slice(0, 20).map(([l, e]) => h("li", { dataset: { entityId: e.entity_id } },
          h("button", { type: "button", class: "link-like", on: { click: () => {
            map.setLayer(l.key, true);
            if (typeof e.lat === "number") map.focus({ lat: e.lat, lon: e.lon, altitude_km: 3000 });
            map.draw();
          } } }, e.name), " ", h("span", { class: "muted" }, l.label)))),
        found.length > 20 ? h("p", { class: "muted" }, `列出前 20 个，共 ${found.length} 个`) : null));
    }

    function visibleLayers() {
      return map ? [...new Set(LAYERS.filter((l) => map.layers[l.key].on).map((l) => l.domain))] : [];
    }

    async function runCommand(body) {
      if (!body.input_text && !body.transcription_id) { hint.textContent = "请输入指令"; return; }
      lastCommand = body;
      replace(results, h("p", { class: "muted", id: "earth-running" }, "AI 指令执行中…"));
      aiBtn.disabled = true;
      try {
        const resp = await api.post("agents/earth/command", Object.assign({
          client_context: { visible_layers: visibleLayers(), locale: navigator.language || "zh-CN", viewport: { is_mobile: false } },
        }, body));
        const t0 = performance.now();
        if (!map) throw new Error("the map is not loaded");
        const r = executeEarthActionPlan(resp, map);
        if (!r.ok) throw new Error(`the plan was refused: ${r.error}`);
        window.__earthLast = { response_ms: t0, drawn_ms: performance.now(), state: getEarthCommandExecutionState() };
        if (resp.clarification_needed) showResult({ title: "需要澄清", items: [], count: 0, summary: resp.summary, missing_data: resp.missing_data || [], notes: [], run_id: resp.run_id });
      } catch (e) {
        replace(results, h("p", { class: "error", id: "earth-error" }, `AI 指令失败：${e.message}`));
      } finally {
        aiBtn.disabled = false;
      }
    }

    function showResult(p) {
      const clearBtn = h("button", { type: "button", id: "earth-clear" }, "清除高亮");
      clearBtn.addEventListener("click", () => {
        clearEarthCommandHighlights(map);
        count.textContent = "已清除高亮";
      });
      const rerun = h("button", { type: "button", id: "earth-rerun" }, "重新执行");
      rerun.addEventListener("click", () => { if (lastCommand) runCommand(lastCommand); });
      const count = h("p", { class: "ai-count", id: "ai-count" }, `已高亮 ${p.count} 个对象`);
      const filteredN = Object.values(p.filtered || {}).reduce((s, n) => s + n, 0);
      replace(results, h("div", { class: "ai-result", id: "ai-result", dataset: { runId: p.run_id || "" } },
        h("div", { class: "ai-badge" }, "AI 指令结果"),
        h("h3", { class: "ai-title", id: "ai-title" }, p.title || "AI 指令"),
        count,
        filteredN ? h("p", { class: "muted" }, `已筛选 ${filteredN} 个对象`) : null,
        p.summary ? h("p", { class: "ai-summary", id: "ai-summary" }, p.summary) : null,
        p.missing_data.length ? h("ul", { class: "missing-data", id: "missing-data" }, p.missing_data.map((m) => h("li", null, m))) : null,
        p.notes.length ? h("ul", { class: "exec-notes", id: "exec-notes" }, p.notes.map((m) => h("li", null, m))) : null,
        h("ol", { class: "ai-items", id: "ai-items" }, p.items.map((it) => h("li", { dataset: { entityId: String(it.entity_id) } },
          h("span", { class: "item-label" }, String(it.label ?? it.entity_id)), " ",
          it.subtitle ? h("span", { class: "muted item-subtitle" }, String(it.subtitle)) : null))),
        h("div", { class: "toolbar" }, clearBtn, rerun,
          p.run_id ? h("a", { href: `#/runs/${encodeURIComponent(p.run_id)}`, id: "earth-run-link" }, "查看 Agent Run") : null)));
    }

    // ---- speech ----------------------------------------------------
    async function recordOnce(origin) {
      if (recording) { recording.stop(); return; }
      voiceMsg.textContent = "";
      let stream;
      try {
        stream = await navigator.mediaDevices.getUserMedia({ audio: true });
      } catch (e) {
        voiceMsg.textContent = MSG_MIC_DENIED;
        voiceMsg.dataset.reason = e && e.name === "NotAllowedError" ? "denied" : "unavailable";
        return;
      }
      const chunks = [];
      const rec = new MediaRecorder(stream);
      recording = rec;
      micBtn.classList.add("recording");
      micBtn.textContent = "■ 停止";
      voiceMsg.textContent = origin === "wake" ? "已唤醒，请说指令…" : "录音中…";
      const timer = setTimeout(() => { if (rec.state === "recording") rec.stop(); }, MAX_RECORD_MS);
      rec.ondataavailable = (e) => { if (e.data && e.data.size) chunks.push(e.data); };
      rec.onstop = async () => {
        clearTimeout(timer);
        for (const t of stream.getTracks()) t.stop();
        recording = null;
        micBtn.classList.remove("recording");
        micBtn.textContent = "语音";
        if (disposed) return;
        const blob = new Blob(chunks, { type: rec.mimeType || "audio/webm" });
        await transcribeAndRun(blob);
        if (wakeToggle.checked) listenForWake();
      };
      rec.start();
    }

    async function transcribeAndRun(blob) {
      voiceMsg.textContent = "识别中…";
      const form = new FormData();
      const ext = (blob.type.split("/")[1] || "webm").split(";")[0];
      form.append("file", blob, `instruction.${ext}`);
      form.append("language", "zh");
      form.append("source", "earth_command");
      let tr;
      try {
        const resp = await fetch("/api/v1/agents/speech/transcriptions", {
          method: "POST", body: form, credentials: "omit",
          headers: { Accept: "application/json", Authorization: `Bearer ${sessionStorage.getItem("benchlink.token")}` },
        });
        if (!resp.ok) {
          let b = null;
          try { b = await resp.json(); } catch (_) { /* not JSON */ }
          throw new ApiError(resp.status, b?.error?.code, b?.error?.message || resp.statusText);
        }
        tr = await resp.json();
      } catch (e) {
        voiceMsg.textContent = e.code === "asr_not_configured" ? MSG_ASR_MISSING : `语音识别失败：${e.message}`;
        voiceMsg.dataset.reason = e.code || "error";
        return;
      }
      voiceMsg.textContent = `识别结果：${tr.text}`;
      voiceMsg.dataset.reason = "ok";
      input.value = tr.text;
      await runCommand({ input_text: tr.text, source: "speech", transcription_id: tr.metadata?.transcription_id ?? null });
    }

    micBtn.addEventListener("click", () => recordOnce("click"));

    // ---- wake word -------------------------------------------------
    wakeInput.addEventListener("change", () => {
      const w = wakeInput.value.trim() || DEFAULT_WAKE_WORD;
      wakeInput.value = w;
      try { localStorage.setItem(WAKE_WORD_KEY, w); } catch (_) { /* storage off */ }
    });

    function stopWake() {
      if (recognizer) { recognizer.onend = null; try { recognizer.abort(); } catch (_) { /* ended */ } recognizer = null; }
    }

    async function listenForWake() {
      stopWake();
      if (!wakeToggle.checked || disposed || recording) return;
      const SR = recognizerClass();
      if (!(await onDeviceRecognition("zh-CN"))) {
        wakeToggle.checked = false;
        wakeState.textContent = "off";
        voiceMsg.textContent = "此浏览器不能在本机识别唤醒词：请点击麦克风录音";
        voiceMsg.dataset.reason = "no_local_recognition";
        return;
      }
      const r = new SR();
      r.lang = "zh-CN";
      r.continuous = true;
      r.interimResults = true;
      r.processLocally = true;
      r.onresult = (ev) => {
        const word = wakeWord();
        for (let i = ev.resultIndex; i < ev.results.length; i++) {
          const text = ev.results[i][0]?.transcript || "";
          if (text.includes(word)) {
            stopWake();
            wakeState.textContent = "awake";
            recordOnce("wake");
            return;
          }
        }
      };
      r.onerror = (ev) => {
        if (ev.error === "not-allowed") { wakeToggle.checked = false; voiceMsg.textContent = MSG_MIC_DENIED; voiceMsg.dataset.reason = "denied"; }
      };
      r.onend = () => { if (recognizer === r && wakeToggle.checked) { try { r.start(); } catch (_) { /* restarting */ } } };
      recognizer = r;
      r.start();
      wakeState.textContent = `listening for “${wakeWord()}”`;
    }

    wakeToggle.addEventListener("change", () => {
      if (wakeToggle.checked) listenForWake();
      else { stopWake(); wakeState.textContent = "off"; }
    });

    return () => {
      disposed = true;
      stopWake();
      if (recording) recording.stop();
      if (map) map.stopAnimation();
      if (resizer) resizer.disconnect();
      clearTimeout(stepTimer);
      delete window.__earthMap;
    };
  },
};
