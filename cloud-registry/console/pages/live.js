// Live page: a running camera stream, frame by frame, for a holder of a
// lease on it. Reads GET /api/v1/capabilities/{id}/live (multipart MJPEG)
// with fetch + ReadableStream, so the token stays in the Authorization
// header; each JPEG part becomes an <img> from a blob URL (the previous
// one is revoked). "Stream ended" when the answer ends.

import { api } from "../api.js";
import { h, replace } from "../dom.js";

const CRLF2 = [13, 10, 13, 10];

function indexOf(buf, pat, from) {
  outer: for (let i = from; i + pat.length <= buf.length; i++) {
    for (let j = 0; j < pat.length; j++) if (buf[i + j] !== pat[j]) continue outer;
    return i;
  }
  return -1;
}

function concat(a, b) {
  const out = new Uint8Array(a.length + b.length);
  out.set(a, 0);
  out.set(b, a.length);
  return out;
}

/**
 * Split a multipart body into its parts as they arrive: `onPart(bytes)`
 * per part (Content-Length framed). Resolves when the body ends or the
 * closing boundary came.
 */
export async function readParts(body, boundary, onPart) {
  const reader = body.getReader();
  const enc = new TextEncoder();
  const close = enc.encode(`--${boundary}--`);
  let buf = new Uint8Array(0);
  for (;;) {
    let head;
    while ((head = indexOf(buf, CRLF2, 0)) < 0) {
      if (indexOf(buf, close, 0) >= 0) return;
      const { value, done } = await reader.read();
      if (done) return;
      buf = concat(buf, value);
    }
    const text = new TextDecoder().decode(buf.subarray(0, head));
    const m = /content-length:\s*(\d+)/i.exec(text);
    if (!m) return;
    const len = Number(m[1]);
    const start = head + 4;
    while (buf.length < start + len) {
      const { value, done } = await reader.read();
      if (done) return;
      buf = concat(buf, value);
    }
    onPart(buf.slice(start, start + len));
    buf = buf.slice(start + len);
  }
}

export default {
  path: "#/live/{id}",
  title: "Live",
  nav: false,
  render(root, params) {
    const id = params.id;
    const state = h("p", { class: "live-state", id: "live-state", role: "status" }, "connecting…");
    const img = h("img", { id: "live-frame", class: "live-frame", alt: `live view of ${id}` });
    const count = h("span", { id: "live-count", class: "muted" }, "0 frames");
    replace(root,
      h("h1", null, "Live: ", h("code", null, id)),
      h("p", null, h("a", { href: "#/lab" }, "← Lab"), " ", count),
      state,
      h("div", { class: "card live" }, img));
    const ctrl = new AbortController();
    let url = null;
    let frames = 0;
    (async () => {
      try {
        const resp = await api.stream(`capabilities/${encodeURIComponent(id)}/live`, ctrl.signal);
        const ct = resp.headers.get("content-type") || "";
        const b = /boundary=([^;]+)/.exec(ct);
        if (!b) throw new Error(`unexpected answer: ${ct}`);
        replace(state, "live");
        state.dataset.state = "live";
        await readParts(resp.body, b[1].trim(), (bytes) => {
          const next = URL.createObjectURL(new Blob([bytes], { type: "image/jpeg" }));
          img.src = next;
          if (url) URL.revokeObjectURL(url);
          url = next;
          frames += 1;
          replace(count, `${frames} frames`);
        });
        if (!ctrl.signal.aborted) {
          replace(state, "stream ended");
          state.dataset.state = "ended";
        }
      } catch (e) {
        if (ctrl.signal.aborted) return;
        replace(state, e.code === "no_live_stream" ? "no stream is running" : `cannot watch: ${e.message}`);
        state.dataset.state = e.code || "error";
      }
    })();
    return () => {
      ctrl.abort();
      if (url) URL.revokeObjectURL(url);
    };
  },
};
