// The console's API client and event-stream client.
//
// The bearer token lives in sessionStorage under `benchlink.token` only: it
// is sent as `Authorization: Bearer`, never put in a URL, localStorage or a
// log line.

export const TOKEN_KEY = "benchlink.token";

/** An error answer of the API: `{"error": {"code", "message", "details"}}`. */
export class ApiError extends Error {
  constructor(status, code, message, details) {
    super(message || code || `HTTP ${status}`);
    this.name = "ApiError";
    this.status = status;
    this.code = code || "http_error";
    this.details = details ?? null;
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

function headers(extra) {
  const h = Object.assign({ Accept: "application/json" }, extra || {});
  const t = token();
  if (t) h.Authorization = `Bearer ${t}`;
  return h;
}

function url(path, query) {
  const base = path.startsWith("/") ? path : `/api/v1/${path}`;
  if (!query) return base;
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) {
    if (v === null || v === undefined || v === "") continue;
    q.set(k, String(v));
  }
  const s = q.toString();
  return s ? `${base}?${s}` : base;
}

async function failure(resp) {
  let body = null;
  try { body = await resp.json(); } catch (_) { /* not JSON */ }
  const e = body && body.error ? body.error : {};
  const err = new ApiError(resp.status, e.code, e.message || resp.statusText, e.details);
  if (resp.status === 401) api.onUnauthenticated?.(err);
  return err;
}

/** Roles allowed each console action (the API checks again). */
const ACTIONS = {
  lease: ["operator", "audit_agent", "admin", "super_admin"],
  act: ["operator", "audit_agent", "admin", "super_admin"],
  release_any: ["admin", "super_admin"],
  audit_request: ["operator", "audit_agent", "admin", "super_admin"],
  claim_audit: ["audit_agent", "super_admin"],
  apply_proposal: ["admin", "super_admin"],
  reject_proposal: ["admin", "super_admin"],
  auto_apply: ["super_admin"],
  earth_command: ["operator", "admin", "super_admin"],
  admin: ["admin", "super_admin"],
};

/**
 * The API: paths are `/api/...` or relative to `/api/v1/`
 * (`api.get("capabilities", {type: "camera"})`).
 */
export const api = {
  /** Role and principal of the signed-in token (after `signIn`/`restore`). */
  role: null,
  principal: null,
  /** Called with the ApiError of any 401 answer (the app signs out). */
  onUnauthenticated: null,

  /** GET → parsed JSON; throws ApiError. */
  async get(path, query) {
    const resp = await fetch(url(path, query), { headers: headers(), credentials: "omit" });
    if (!resp.ok) throw await failure(resp);
    return resp.json();
  },

  /** POST a JSON body → parsed JSON (null for an empty answer). */
  async post(path, body, extraHeaders) {
    const resp = await fetch(url(path), {
      method: "POST",
      headers: headers(Object.assign({ "Content-Type": "application/json" }, extraHeaders || {})),
      body: JSON.stringify(body ?? {}),
      credentials: "omit",
    });
    if (!resp.ok) throw await failure(resp);
    const text = await resp.text();
    return text ? JSON.parse(text) : null;
  },

  /** GET bytes → `{blob, headers}`. */
  async blob(path, query) {
    const resp = await fetch(url(path, query), { headers: headers({ Accept: "*/*" }), credentials: "omit" });
    if (!resp.ok) throw await failure(resp);
    return { blob: await resp.blob(), headers: resp.headers };
  },

  /** GET a streaming answer → the `Response` (its body unread), with the
   *  token in the header; throws ApiError for an error answer. `signal`
   *  aborts it. */
  async stream(path, signal) {
    const resp = await fetch(url(path), { headers: headers({ Accept: "*/*" }), credentials: "omit", signal });
    if (!resp.ok) throw await failure(resp);
    return resp;
  },

  /** Check `tok` with whoami; on success keep it in sessionStorage. */
  async signIn(tok) {
    const resp = await fetch("/api/v1/auth/whoami", {
      headers: { Accept: "application/json", Authorization: `Bearer ${tok}` },
      credentials: "omit",
    });
    if (!resp.ok) {
      let body = null;
      try { body = await resp.json(); } catch (_) { /* not JSON */ }
      const e = body && body.error ? body.error : {};
      throw new ApiError(resp.status, e.code, e.message || resp.statusText, e.details);
    }
    const who = await resp.json();
    sessionStorage.setItem(TOKEN_KEY, tok);
    api.role = who.role;
    api.principal = who.principal;
    return who;
  },

  /** Re-check a token already in sessionStorage; null when none or refused. */
  async restore() {
    const tok = token();
    if (!tok) return null;
    try {
      return await api.signIn(tok);
    } catch (e) {
      if (e.status === 401) sessionStorage.removeItem(TOKEN_KEY);
      throw e;
    }
  },

  /** Forget the token. */
  signOut() {
    sessionStorage.removeItem(TOKEN_KEY);
    api.role = null;
    api.principal = null;
  },

  get signedIn() {
    return token() !== null && api.role !== null;
  },
};

/** True when the signed-in role may do `action` (see ACTIONS). */
export function can(action) {
  const roles = ACTIONS[action];
  return !!(roles && api.role && roles.includes(api.role));
}

/**
 * A Server-Sent Events reader over fetch (EventSource cannot send the
 * Authorization header). Reconnects after a drop with `Last-Event-ID`, so
 * nothing is missed or repeated.
 */
export class EventStream {
  /** `query`: the stream's filters (`types`, `lease_id`, `after`...). */
  constructor(query) {
    this.query = query || {};
    this.lastId = null;
    this.subs = new Set();
    this.statusSubs = new Set();
    this.status = "idle";
    this.ctrl = null;
    this.stopped = true;
    this.retryMs = 500;
  }

  /** `fn(event)` for every event; returns the unsubscribe function. */
  subscribe(fn) {
    this.subs.add(fn);
    return () => this.subs.delete(fn);
  }

  /** `fn(status)`: "connecting", "live", "reconnecting", "stopped". */
  onStatus(fn) {
    this.statusSubs.add(fn);
    fn(this.status);
    return () => this.statusSubs.delete(fn);
  }

  setStatus(s) {
    this.status = s;
    for (const fn of this.statusSubs) { try { fn(s); } catch (e) { console.error(e); } }
  }

  start() {
    if (!this.stopped) return;
    this.stopped = false;
    this.loop();
  }

  stop() {
    this.stopped = true;
    if (this.ctrl) this.ctrl.abort();
    this.setStatus("stopped");
  }

  async loop() {
    while (!this.stopped) {
      this.setStatus(this.lastId === null ? "connecting" : "reconnecting");
      try {
        await this.once();
        this.retryMs = 500;
      } catch (e) {
        if (this.stopped) break;
        if (e instanceof ApiError && e.status === 401) { this.stop(); break; }
      }
      if (this.stopped) break;
      this.setStatus("reconnecting");
      await new Promise((r) => setTimeout(r, this.retryMs));
      this.retryMs = Math.min(this.retryMs * 2, 5000);
    }
  }

  async once() {
    this.ctrl = new AbortController();
    const extra = { Accept: "text/event-stream" };
    if (this.lastId !== null) extra["Last-Event-ID"] = String(this.lastId);
    const resp = await fetch(url("capability-events/stream", this.query), {
      headers: headers(extra),
      signal: this.ctrl.signal,
      credentials: "omit",
      cache: "no-store",
    });
    if (!resp.ok) throw await failure(resp);
    this.setStatus("live");
    this.retryMs = 500;
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += value;
      let m;
      while ((m = /\r?\n\r?\n/.exec(buf)) !== null) {
        const block = buf.slice(0, m.index);
        buf = buf.slice(m.index + m[0].length);
        this.block(block);
      }
    }
  }

  block(block) {
    let id = null, type = "message", data = [];
    for (const line of block.split(/\r?\n/)) {
      if (line.startsWith(":")) continue;
      const c = line.indexOf(":");
      const field = c < 0 ? line : line.slice(0, c);
      let value = c < 0 ? "" : line.slice(c + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "id") id = value;
      else if (field === "event") type = value;
      else if (field === "data") data.push(value);
    }
    if (id !== null && id !== "") this.lastId = id;
    if (data.length === 0) return;
    let ev;
    try { ev = JSON.parse(data.join("\n")); } catch (_) { return; }
    if (type === "stream_gap") return; // the server replays the range itself
    if (ev && ev.event_type === undefined) ev.event_type = type;
    for (const fn of this.subs) {
      try { fn(ev); } catch (e) { console.error(e); }
    }
  }
}

/**
 * `fn(key)` run at most once at a time per key: a call while one runs
 * makes it run once more afterwards (the latest state wins, nothing is
 * fetched twice in parallel).
 */
export function coalesced(fn) {
  const busy = new Map(); // key -> true when another run is due
  const go = async (key) => {
    if (busy.has(key)) { busy.set(key, true); return; }
    busy.set(key, false);
    try { await fn(key); } catch (e) { console.error(e); }
    const again = busy.get(key);
    busy.delete(key);
    if (again) go(key);
  };
  return go;
}

/** The app's one live stream of every event (started after sign-in). */
export const events = new EventStream({});
