// stream.js — one project's live events.
//
// With the session cookie the page listens to Server-Sent Events
// (GET /api/projects/{slug}/stream); the browser reconnects with Last-Event-ID, so
// nothing is missed. EventSource cannot send an Authorization header, so with a pasted
// personal token (or if the stream is refused) it long-polls GET …/events instead.
// Either way every event is handed out once, in seq order.
//
// The stream's first event, "ready" {seq}, says where it starts; open() resolves with that
// position, so a view loaded after it misses nothing. A position the server cannot continue
// (beyond its newest event after a restore, or older than it keeps) gets "resync" {seq, reason}
// first: the stream goes on from there and on("resync") listeners load their views again.

import { get, seg, token } from "./api.js";

const TYPES = ["message.posted", "task.updated", "approval.updated", "action.updated", "pulse.updated",
  "member.joined", "agent.added", "project.created", "moment.updated", "story.updated", "schedule.updated"];
const READY_WAIT = 4000; // ms open() waits for the stream's position before the page loads anyway
const FAR = 9007199254740991; // "after" beyond any seq: the events endpoint answers with the head

const listeners = new Map(); // type (or "*") -> Set of fn(event)
const statusListeners = new Set();
let current = null; // { slug, lastSeq, source, abort, closed }
let status = "off";

// ---- lifecycle ------------------------------------------------------------------

/** Start listening to a project (closing any other). Resolves, once the stream knows where it
 *  starts (or after READY_WAIT), to that outbox seq or null: load the view after this. */
export function open(slug) {
  close();
  let settle;
  const ready = new Promise((resolve) => { settle = resolve; });
  const timer = setTimeout(() => settle(null), READY_WAIT);
  current = {
    slug, lastSeq: null, source: null, abort: null, closed: false,
    ready: (seq) => { clearTimeout(timer); settle(seq); },
  };
  if (!token() && "EventSource" in window) listen(current);
  else poll(current);
  return ready;
}

/** The connection open now (an opaque object, compared by identity), or null. */
export function connection() {
  return current;
}

/** The project the stream listens to now, or null. */
export function openSlug() {
  return current?.slug ?? null;
}

export function close() {
  if (!current) return;
  current.closed = true;
  current.source?.close();
  current.abort?.abort();
  current = null;
  setStatus("off");
}

// ---- actions ----------------------------------------------------------------------

/** fn(event) for each event of a type ("*" for all; "resync" when the stream starts over at {seq}; "gone" when
 *  the project is no longer the person's to read); returns a function that stops it. */
export function on(type, fn) {
  if (!listeners.has(type)) listeners.set(type, new Set());
  listeners.get(type).add(fn);
  return () => listeners.get(type)?.delete(fn);
}

/** fn(status) when the connection changes: "connecting", "live", "reconnecting", "off". */
export function onStatus(fn) {
  statusListeners.add(fn);
  fn(status);
  return () => statusListeners.delete(fn);
}

// ---- callbacks -----------------------------------------------------------------------

function receive(conn, event) {
  if (conn.closed || conn !== current) return;
  if (conn.lastSeq != null && event.seq <= conn.lastSeq) return; // already handed out
  conn.lastSeq = event.seq;
  dispatch([event.type, "*"], event);
}

/** The server could not continue from lastSeq: go on from its newest seq and tell the views. */
function resync(conn, seq, reason) {
  if (conn.closed || conn !== current || !Number.isInteger(seq)) return;
  conn.lastSeq = seq;
  dispatch(["resync"], { type: "resync", seq, reason });
}

/** The project went out of the person's reach (deleted, or they were removed): on("gone") listeners hear it. */
function gone(conn) {
  if (conn.closed || conn !== current) return;
  dispatch(["gone"], { type: "gone", slug: conn.slug });
}

function dispatch(keys, event) {
  for (const key of keys) {
    for (const fn of listeners.get(key) || []) {
      try {
        fn(event);
      } catch (err) {
        console.error("stream listener failed", err);
      }
    }
  }
}

// ---- internal ---------------------------------------------------------------------------

/** The outbox position now, for long-polling: events "after" a seq beyond any answer with the head. */
async function head(conn) {
  const page = await get(`/api/projects/${seg(conn.slug)}/events?after=${FAR}&wait=0`);
  return Number.isInteger(page.last_seq) ? page.last_seq : 0;
}

function setStatus(next) {
  if (next === status) return;
  status = next;
  for (const fn of statusListeners) fn(status);
}

function listen(conn) {
  setStatus("connecting");
  const query = conn.lastSeq != null ? `?after=${conn.lastSeq}` : "";
  const source = new EventSource(`/api/projects/${seg(conn.slug)}/stream${query}`);
  conn.source = source;
  source.onopen = () => setStatus("live");
  source.addEventListener("resync", (message) => {
    if (conn.source !== source) return;
    try {
      const data = JSON.parse(message.data);
      resync(conn, data.seq, data.reason);
    } catch (err) {
      console.error("unreadable resync", err);
    }
  });
  source.addEventListener("ready", (message) => {
    if (conn.closed || conn.source !== source) return;
    let seq = null;
    try {
      seq = JSON.parse(message.data).seq;
    } catch {
      return;
    }
    if (!Number.isInteger(seq)) return;
    if (conn.lastSeq == null) {
      conn.lastSeq = seq;
    } else if (seq > conn.lastSeq) {
      // A reconnect with nothing received yet starts "from now": go back to where we were.
      source.close();
      listen(conn);
      return;
    }
    conn.ready?.(conn.lastSeq);
  });
  source.onerror = () => {
    if (conn.closed) return;
    if (source.readyState === EventSource.CLOSED) {
      // Refused outright (signed out, not a member, or no stream on this server): long-poll instead.
      source.close();
      conn.source = null;
      poll(conn);
    } else {
      setStatus("reconnecting");
    }
  };
  for (const type of TYPES) {
    source.addEventListener(type, (message) => {
      try {
        receive(conn, JSON.parse(message.data));
      } catch (err) {
        console.error("unreadable event", err);
      }
    });
  }
}

async function poll(conn) {
  setStatus("connecting");
  let delay = 1000;
  while (conn.lastSeq == null && !conn.closed) {
    try {
      conn.lastSeq = await head(conn);
    } catch (err) {
      if (err.status === 401 || err.status === 404) {
        setStatus("off");
        conn.ready?.(null);
        if (err.status === 404) gone(conn);
        return;
      }
      setStatus("reconnecting");
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 15000);
    }
  }
  if (conn.closed) return;
  conn.ready?.(conn.lastSeq);
  delay = 1000;
  let wait = 0; // the first answer comes at once and says the connection works
  setStatus("connecting");
  while (!conn.closed) {
    conn.abort = new AbortController();
    try {
      const page = await get(`/api/projects/${seg(conn.slug)}/events?after=${conn.lastSeq}&wait=${wait}`,
        { signal: conn.abort.signal });
      wait = 25;
      setStatus("live");
      delay = 1000;
      if (page.resync) resync(conn, page.last_seq, page.resync);
      for (const event of page.events || []) receive(conn, event);
      if (Number.isInteger(page.last_seq) && page.last_seq > conn.lastSeq) conn.lastSeq = page.last_seq;
    } catch (err) {
      if (conn.closed) return;
      if (err.status === 401 || err.status === 404) {
        setStatus("off");
        if (err.status === 404) gone(conn);
        return;
      }
      setStatus("reconnecting");
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 15000);
    }
  }
}
