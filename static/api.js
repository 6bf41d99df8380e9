// api.js — talking to the people's HTTP JSON API: fetch, auth and errors in plain words.
//
// The browser session cookie (HttpOnly, set by /signin) rides along by itself. A person
// who pasted a personal token instead has it kept in sessionStorage and sent as
// "Authorization: Bearer …" on every request.

const TOKEN_KEY = "prickle.personal_token";

/** An API refusal: status, stable code, and a message fit to show the person. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

const signedOutHandlers = new Set();
let stepUpHandler = null;

// ---- lifecycle ----------------------------------------------------------------

/** The personal token this tab uses, or null for the session cookie. */
export function token() {
  try {
    return sessionStorage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
}

export function useToken(value) {
  sessionStorage.setItem(TOKEN_KEY, value);
}

export function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

/** fn() runs when a request finds the person signed out (401). */
export function onSignedOut(fn) {
  signedOutHandlers.add(fn);
  return () => signedOutHandlers.delete(fn);
}

/** fn(error) runs when the server asks this person to confirm it's them first (step_up_required, the
 *  server's decision); it resolves true once they did, and the refused request is sent once more. */
export function onStepUp(fn) {
  stepUpHandler = fn;
}

/** This tab's session was ended on purpose (signed out everywhere, or ``account_closed``): the page shows message. */
export function endedHere(message, code = "signed_out") {
  const error = new ApiError(401, code, message);
  for (const fn of signedOutHandlers) fn(error);
}

// ---- actions --------------------------------------------------------------------

/** One request; resolves to the JSON body or throws ApiError (after a "Confirm it's you" the page asked for). */
export async function request(method, path, body, options = {}) {
  try {
    return await send(method, path, body, options);
  } catch (err) {
    if (!(err instanceof ApiError) || err.code !== "step_up_required" || !stepUpHandler || options.stepUp === false) {
      throw err;
    }
    if (!(await stepUpHandler(err))) throw err;
    return send(method, path, body, options);
  }
}

async function send(method, path, body, { signal, quietAuth = false } = {}) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const personal = token();
  if (personal) headers.Authorization = `Bearer ${personal}`;
  let response;
  try {
    response = await fetch(path, {
      method, headers, signal, credentials: "same-origin", cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, "network", "Could not reach the Prickle server. Check that it is running, then try again.");
  }
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) {
    const error = new ApiError(response.status, data?.error?.code || `http_${response.status}`,
      plainWords(response.status, data?.error?.message));
    if (response.status === 401 && !quietAuth) for (const fn of signedOutHandlers) fn(error);
    throw error;
  }
  return data ?? {};
}

export const get = (path, options) => request("GET", path, undefined, options);
export const post = (path, body = {}, options) => request("POST", path, body, options);
export const del = (path, options) => request("DELETE", path, undefined, options);

/** Send one file's bytes as the request body (POST); onProgress(sent, total) as they go up. Resolves
 *  to the JSON answer or rejects with ApiError. XMLHttpRequest, for its upload progress events. */
export function upload(path, file, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", path);
    xhr.setRequestHeader("Accept", "application/json");
    const personal = token();
    if (personal) xhr.setRequestHeader("Authorization", `Bearer ${personal}`);
    xhr.upload.addEventListener("progress", (e) => onProgress?.(e.loaded, e.lengthComputable ? e.total : file.size));
    xhr.addEventListener("error", () => reject(new ApiError(0, "network",
      "Could not reach the Prickle server. Check that it is running, then try again.")));
    xhr.addEventListener("load", () => {
      let data = null;
      try {
        data = JSON.parse(xhr.responseText);
      } catch {
        data = null;
      }
      if (xhr.status >= 200 && xhr.status < 300) return resolve(data ?? {});
      const error = new ApiError(xhr.status, data?.error?.code || `http_${xhr.status}`,
        plainWords(xhr.status, data?.error?.message));
      if (xhr.status === 401) for (const fn of signedOutHandlers) fn(error);
      return reject(error);
    });
    xhr.send(file);
  });
}

/** POST body and take the file the server answers with: ``{blob, name}`` (the name from its
 *  Content-Disposition); a refusal rejects with ApiError, as request() does. */
export async function download(path, body) {
  const headers = { Accept: "application/zip, application/json", "Content-Type": "application/json" };
  const personal = token();
  if (personal) headers.Authorization = `Bearer ${personal}`;
  let response;
  try {
    response = await fetch(path, { method: "POST", headers, credentials: "same-origin", cache: "no-store",
      body: JSON.stringify(body) });
  } catch {
    throw new ApiError(0, "network", "Could not reach the Prickle server. Check that it is running, then try again.");
  }
  if (!response.ok) {
    const data = await response.json().catch(() => null);
    const error = new ApiError(response.status, data?.error?.code || `http_${response.status}`,
      plainWords(response.status, data?.error?.message));
    if (response.status === 401) for (const fn of signedOutHandlers) fn(error);
    throw error;
  }
  const disposition = response.headers.get("Content-Disposition") || "";
  return { blob: await response.blob(), name: /filename="([^"]+)"/.exec(disposition)?.[1] || "export.zip" };
}

/** Path segment escaping for IDs and slugs. */
export function seg(value) {
  return encodeURIComponent(value);
}

// ---- internal ---------------------------------------------------------------------

const FALLBACK = {
  400: "That was not accepted. Check the fields and try again.",
  401: "You are signed out. Open a new sign-in link to continue.",
  403: "You are not allowed to do that.",
  404: "That could not be found, or it is not in your projects.",
  405: "The server does not offer that here yet.",
  409: "That conflicts with something that already exists.",
  413: "That is too large to send.",
  421: "The server refused this address. Open Prickle at its public address.",
};

/** The server's message as a sentence, or a plain fallback for its status. */
function plainWords(status, message) {
  const text = (message || "").trim();
  if (!text) return FALLBACK[status] || `The server could not do that (error ${status}). Try again in a moment.`;
  const sentence = text[0].toUpperCase() + text.slice(1);
  return /[.!?)]$/.test(sentence) ? sentence : `${sentence}.`;
}
