// Artifact previews and their in-browser sha256 check.
//
// `artifactView(art, bag)` returns a card for one artifact's metadata
// (`GET /api/v1/artifacts/{id}`): the bytes are fetched with the bearer
// token (api.blob), hashed with Web Crypto and compared with the stored
// `checksum` (badge "verified" / "mismatch"), then previewed by type:
// images inline, audio in a player, MJPEG clips played frame by frame (and
// their keyframes), serial logs as searchable text, JSON-ish types
// pretty-printed. Object URLs are recorded in `bag` and revoked by
// `revokeAll(bag)` when the page is left.

import { api } from "../api.js";
import { h, replace, fmtTime, fmtDuration } from "../dom.js";

// Page styles of the evidence, audit and run pages (same origin: CSP 'self').
if (!document.querySelector("link[data-pages-css]")) {
  const link = document.createElement("link");
  link.rel = "stylesheet";
  link.href = "/console/pages/pages.css";
  link.dataset.pagesCss = "1";
  document.head.appendChild(link);
}

/** Lowercase hex SHA-256 of an ArrayBuffer (Web Crypto). */
export async function sha256Hex(buf) {
  const d = await crypto.subtle.digest("SHA-256", buf);
  return Array.from(new Uint8Array(d), (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Human size: "812 B", "4.2 KiB", "1.3 MiB". */
export function fmtBytes(n) {
  if (n === null || n === undefined) return "—";
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

/** A JSON value pretty-printed in a <pre> (as text). */
export function jsonBlock(v, cls) {
  let s;
  try { s = JSON.stringify(v, null, 2); } catch (_) { s = String(v); }
  return h("pre", { class: ["json", cls] }, s === undefined ? "null" : s);
}

function objectUrl(bag, blob) {
  const u = URL.createObjectURL(blob);
  if (bag) bag.push(u);
  return u;
}

/** Revoke every object URL recorded in `bag`. */
export function revokeAll(bag) {
  for (const u of bag.splice(0)) URL.revokeObjectURL(u);
}

const JSONISH = new Set(["sensor_dump", "detection_json", "ocr_text", "transcript"]);

/** The card of one artifact; previews fill in once the bytes arrive. */
export function artifactView(art, bag) {
  const shaBadge = h("span", { class: "badge badge-unknown sha-badge", dataset: { verify: "pending" } }, "checking…");
  const preview = h("div", { class: "preview" }, art.uploaded ? h("p", { class: "muted" }, "Loading…") : h("p", { class: "muted" }, "Not uploaded yet: the bench has sent only the metadata."));
  const card = h("section", { class: "card artifact", dataset: { artifactId: art.artifact_id, artifactType: art.artifact_type } },
    h("div", { class: "card-head" },
      h("span", { class: "title" }, art.artifact_type),
      h("span", { class: "meta" }, h("code", null, art.artifact_id)),
      h("span", { class: "spacer" }),
      shaBadge),
    h("div", { class: "card-body" },
      h("dl", { class: "kv" },
        h("dt", null, "content type"), h("dd", null, art.content_type),
        h("dt", null, "size"), h("dd", null, fmtBytes(art.size_bytes)),
        h("dt", null, "captured"), h("dd", null, fmtTime(art.captured_at)),
        art.duration_ms != null ? [h("dt", null, "duration"), h("dd", null, fmtDuration(art.duration_ms))] : null,
        h("dt", null, "sha256 (stored)"), h("dd", null, h("code", { class: "sha stored-sha" }, art.checksum)),
        h("dt", null, "sha256 (computed)"), h("dd", null, h("code", { class: "sha computed-sha" }, "—"))),
      preview,
      art.metadata_json && Object.keys(art.metadata_json).length
        ? h("details", null, h("summary", null, "metadata"), jsonBlock(art.metadata_json)) : null));
  if (!art.uploaded) {
    shaBadge.dataset.verify = "absent";
    replace(shaBadge, "not uploaded");
    return card;
  }
  load(art, bag, card, shaBadge, preview).catch((e) => {
    shaBadge.dataset.verify = "error";
    shaBadge.className = "badge badge-error sha-badge";
    replace(shaBadge, "unavailable");
    replace(preview, h("p", { class: "error" }, `Cannot load the bytes: ${e.message}`));
  });
  return card;
}

async function load(art, bag, card, shaBadge, preview) {
  const { blob } = await api.blob(`artifacts/${encodeURIComponent(art.artifact_id)}/content`);
  const buf = await blob.arrayBuffer();
  if (globalThis.crypto && crypto.subtle) {
    const got = await sha256Hex(buf);
    const ok = got === String(art.checksum).toLowerCase();
    shaBadge.dataset.verify = ok ? "verified" : "mismatch";
    shaBadge.className = `badge sha-badge badge-${ok ? "verified" : "mismatch"}`;
    replace(shaBadge, ok ? "verified" : "mismatch");
    shaBadge.title = ok ? "the bytes hash to the stored sha256" : `the bytes hash to ${got}, not to the stored sha256`;
    replace(card.querySelector(".computed-sha"), got);
  } else {
    shaBadge.dataset.verify = "unsupported";
    replace(shaBadge, "cannot verify (no Web Crypto: open the console over https or localhost)");
  }
  const type = blob.type || art.content_type || "";
  replace(preview, render(art, buf, type, bag));
}

function render(art, buf, type, bag) {
  const t = art.artifact_type;
  if (t === "image" || type.startsWith("image/")) {
    return h("img", { class: "artifact-image", alt: `${t} ${art.artifact_id}`, src: objectUrl(bag, new Blob([buf], { type: type || "image/jpeg" })) });
  }
  if (t === "audio_clip" || type.startsWith("audio/")) {
    return h("audio", { class: "artifact-audio", controls: true, preload: "metadata", src: objectUrl(bag, new Blob([buf], { type: type || "audio/wav" })) });
  }
  if (t === "video_clip") {
    if (type.startsWith("video/")) {
      return h("video", { class: "artifact-video", controls: true, preload: "metadata", src: objectUrl(bag, new Blob([buf], { type })) });
    }
    const frames = mjpegFrames(buf, art.metadata_json?.boundary || boundaryOf(type));
    if (frames.length) return clipPlayer(frames, bag);
    return h("p", { class: "muted" }, `No frames could be read from this ${type} clip.`);
  }
  const text = new TextDecoder("utf-8", { fatal: false }).decode(buf);
  if (t === "serial_log" || type.startsWith("text/") && !JSONISH.has(t)) return logView(text);
  if (JSONISH.has(t) || type.includes("json")) {
    try { return jsonBlock(JSON.parse(text), "artifact-json"); } catch (_) { /* plain text */ }
  }
  return h("pre", { class: "artifact-text" }, text);
}

function boundaryOf(type) {
  const m = /boundary="?([^";]+)"?/i.exec(type || "");
  return m ? m[1] : "benchlink-frame";
}

/** Frames of a multipart/x-mixed-replace MJPEG stream: [{blob, ms}]. */
export function mjpegFrames(buf, boundary) {
  const bytes = new Uint8Array(buf);
  const dec = new TextDecoder("latin1");
  const open = `--${boundary}\r\n`;
  const frames = [];
  let pos = 0;
  while (pos < bytes.length && frames.length < 10000) {
    const head = dec.decode(bytes.subarray(pos, Math.min(bytes.length, pos + 1024)));
    if (!head.startsWith(open)) break;
    const end = head.indexOf("\r\n\r\n");
    if (end < 0) break;
    const headers = head.slice(open.length, end).split("\r\n");
    let len = -1, ms = 0;
    for (const line of headers) {
      const [k, ...v] = line.split(":");
      const val = v.join(":").trim();
      if (/^content-length$/i.test(k)) len = parseInt(val, 10);
      if (/^x-timestamp-ms$/i.test(k)) ms = parseInt(val, 10) || 0;
    }
    const start = pos + end + 4;
    if (!(len >= 0) || start + len > bytes.length) break;
    frames.push({ blob: new Blob([bytes.subarray(start, start + len)], { type: "image/jpeg" }), ms });
    pos = start + len + 2; // the part's CRLF
  }
  return frames;
}

function clipPlayer(frames, bag) {
  const urls = frames.map((f) => objectUrl(bag, f.blob));
  const img = h("img", { class: "artifact-frame", alt: "clip frame", src: urls[0] });
  const label = h("span", { class: "muted frame-label" }, `frame 1 of ${frames.length}`);
  let i = 0, timer = null;
  const show = (k) => { i = k; img.src = urls[k]; label.textContent = `frame ${k + 1} of ${frames.length} · ${fmtDuration(frames[k].ms)}`; };
  const play = h("button", { type: "button", class: "play", on: { click: () => {
    if (timer) { clearTimeout(timer); timer = null; play.textContent = "Play"; return; }
    play.textContent = "Pause";
    const step = () => {
      if (!img.isConnected) { timer = null; return; }
      const next = (i + 1) % frames.length;
      const wait = next === 0 ? 500 : Math.max(20, frames[next].ms - frames[i].ms);
      show(next);
      timer = setTimeout(step, wait);
    };
    timer = setTimeout(step, 50);
  } } }, "Play");
  // Up to eight keyframes, evenly spread.
  const n = Math.min(8, frames.length);
  const picks = Array.from({ length: n }, (_, k) => Math.floor(k * frames.length / n));
  const strip = h("div", { class: "keyframes" }, picks.map((k) =>
    h("img", { class: "keyframe", alt: `frame ${k + 1}`, src: urls[k], on: { click: () => show(k) } })));
  return h("div", { class: "clip" }, img, h("div", { class: "toolbar" }, play, label), strip);
}

/** A serial log as monospace text with a search box that keeps matching lines. */
export function logView(text) {
  const lines = text.split(/\r?\n/);
  const pre = h("pre", { class: "serial-log" });
  const count = h("span", { class: "muted" });
  const show = (q) => {
    const want = q.toLowerCase();
    const out = [];
    let hits = 0;
    for (const line of lines) {
      if (!want) { out.push(line, "\n"); continue; }
      const low = line.toLowerCase();
      let at = low.indexOf(want);
      if (at < 0) continue;
      hits++;
      let from = 0;
      while (at >= 0) {
        out.push(line.slice(from, at), h("mark", null, line.slice(at, at + want.length)));
        from = at + want.length;
        at = low.indexOf(want, from);
      }
      out.push(line.slice(from), "\n");
    }
    replace(pre, out);
    count.textContent = want ? `${hits} of ${lines.length} lines` : `${lines.length} lines`;
  };
  const input = h("input", { type: "search", class: "log-search", placeholder: "search the log", on: { input: (e) => show(e.target.value) } });
  show("");
  return h("div", { class: "log" }, h("div", { class: "toolbar" }, input, count), pre);
}
