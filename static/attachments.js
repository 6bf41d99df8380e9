// attachments.js — images and files that go with a message in your private room: the composer's
// picker, paste and drop, the strip of what will go (each upload's progress), and how a posted
// message shows them (thumbnails that open full size, file cards with a download link).
//
// What may go up is the server's rule: each file is sent as soon as it is chosen, and the server
// reads its type from its bytes and says why it refuses one; that reason is shown beside the
// composer. The picker's `accept` is only a hint for the browser's file chooser.

import { upload, seg, token } from "./api.js";
import { h, showError, clearError, announce } from "./ui.js";

const ACCEPT = "image/png,image/jpeg,image/webp,application/pdf,text/plain,text/markdown,text/csv,"
  + ".pdf,.txt,.md,.markdown,.csv";

const FILE_KIND = { "application/pdf": "PDF document", "text/plain": "Text", "text/markdown": "Markdown", "text/csv": "CSV" };

/** A paperclip, drawn with DOM calls (nothing in this page is set as HTML). */
function paperclip() {
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  for (const [k, v] of Object.entries({ viewBox: "0 0 24 24", width: "20", height: "20", "aria-hidden": "true",
    focusable: "false" })) svg.setAttribute(k, v);
  const path = document.createElementNS(NS, "path");
  for (const [k, v] of Object.entries({ fill: "none", stroke: "currentColor", "stroke-width": "2",
    "stroke-linecap": "round", "stroke-linejoin": "round",
    d: "M21 11.5l-8.6 8.6a5.5 5.5 0 0 1-7.8-7.8l8.6-8.6a3.7 3.7 0 0 1 5.2 5.2l-8.6 8.6a1.8 1.8 0 0 1-2.6-2.6l8-8" })) {
    path.setAttribute(k, v);
  }
  svg.append(path);
  return svg;
}

// ---- lifecycle: the composer's part ------------------------------------------------------------

/** Attaching to a message of the room `slug`: {button, input, strip} to place in the composer,
 *  ready() (the IDs to post once every upload is done, or null when one failed meanwhile),
 *  count(), clear(). Errors go to `error`; files dropped on `dropTarget` or pasted into
 *  `textarea` are attached too. */
export function createAttachments({ slug, error, dropTarget, textarea }) {
  const input = h("input", { type: "file", multiple: true, accept: ACCEPT, class: "attach-input", hidden: true,
    tabindex: "-1", "aria-hidden": "true" });
  const button = h("button", { type: "button", class: "attach-button", title: "Attach images or files",
    "aria-label": "Attach images or files" }, paperclip());
  const strip = h("ul", { class: "attach-strip", "aria-label": "Attachments to send", hidden: true });
  const state = { slug, error, strip, items: [] };

  button.addEventListener("click", () => input.click());
  input.addEventListener("change", () => {
    add(state, [...input.files]);
    input.value = ""; // the same file may be chosen again
  });
  textarea.addEventListener("paste", (e) => {
    const files = [...(e.clipboardData?.files || [])];
    if (!files.length) return; // plain text pastes as usual
    e.preventDefault();
    add(state, files);
  });
  const carriesFiles = (e) => [...(e.dataTransfer?.types || [])].includes("Files");
  dropTarget.addEventListener("dragover", (e) => {
    if (!carriesFiles(e)) return;
    e.preventDefault();
    e.dataTransfer.dropEffect = "copy";
    dropTarget.classList.add("drop-here");
  });
  dropTarget.addEventListener("dragleave", (e) => {
    if (!dropTarget.contains(e.relatedTarget)) dropTarget.classList.remove("drop-here");
  });
  dropTarget.addEventListener("drop", (e) => {
    dropTarget.classList.remove("drop-here");
    if (!carriesFiles(e)) return;
    e.preventDefault();
    add(state, [...e.dataTransfer.files]);
  });

  return {
    button,
    input,
    strip,
    count: () => state.items.length,
    uploading: () => state.items.some((i) => !i.attachment),
    async ready() {
      let failed = false;
      for (;;) { // files added while we wait are waited for too
        const waiting = state.items.filter((i) => !i.attachment);
        if (!waiting.length) break;
        await Promise.all(waiting.map((i) => i.done));
        failed ||= waiting.some((i) => i.failed && !i.takenOut);
      }
      return failed ? null : state.items.map((i) => i.attachment.id); // null: a reason is shown, nothing is sent
    },
    clear() {
      for (const item of [...state.items]) remove(state, item);
    },
  };
}

// ---- actions ------------------------------------------------------------------------------------

/** Put each file in the strip and send it up at once; the server's answer replaces the guess. */
function add(state, files) {
  for (const file of files) {
    const name = file.name || "pasted image";
    const item = { file, attachment: null, failed: null, url: null };
    // A preview of what was chosen; what it really is the server reads from the bytes.
    if (file.type.startsWith("image/")) item.url = URL.createObjectURL(file);
    const thumb = item.url ? h("img", { class: "attach-thumb", src: item.url, alt: "" })
      : h("span", { class: "attach-thumb attach-icon", text: extension(name) });
    const size = h("span", { class: "attach-size", text: sizeText(file.size) });
    const progress = h("progress", { class: "attach-progress", max: "100", value: "0",
      "aria-label": `Uploading ${name}` });
    const close = h("button", { type: "button", class: "attach-remove", "aria-label": `Remove ${name}`, text: "×" });
    item.el = h("li", { class: "attach-item uploading", dataset: { name } }, thumb,
      h("span", { class: "attach-meta" }, h("span", { class: "attach-name", text: name }), size, progress), close);
    close.addEventListener("click", () => {
      item.takenOut = true;
      remove(state, item);
      announce(`${name} removed`);
      document.querySelector(".room-foot .composer textarea")?.focus();
    });
    state.items.push(item);
    state.strip.append(item.el);
    state.strip.hidden = false;
    const path = `/api/projects/${seg(state.slug)}/attachments?name=${encodeURIComponent(name)}`;
    item.done = upload(path, file, (sent, total) => {
      progress.value = total ? Math.floor((sent * 100) / total) : 0;
    }).then(({ attachment }) => {
      item.attachment = attachment;
      item.el.classList.remove("uploading");
      item.el.dataset.id = attachment.id;
      progress.remove();
      size.textContent = describe(attachment);
      clearError(state.error);
    }, (err) => {
      item.failed = err;
      if (item.takenOut) return; // taken out meanwhile: nothing to say
      remove(state, item);
      showError(state.error, `${name} was not attached: ${err.message}`);
    });
  }
}

function remove(state, item) {
  item.el.remove();
  if (item.url) URL.revokeObjectURL(item.url);
  state.items = state.items.filter((i) => i !== item);
  state.strip.hidden = !state.items.length;
}

// ---- rendering a message's attachments ------------------------------------------------------------

/** A message's attachments: image thumbnails (a click opens the image whole) and file cards. */
export function renderAttachments(attachments) {
  const images = attachments.filter((a) => a.kind === "image");
  return h("div", { class: "msg-attachments" }, attachments.map((a) => (a.kind === "image"
    ? imageThumb(a, images.indexOf(a) + 1, images.length) : fileCard(a))));
}

function imageThumb(a, n, of) {
  const label = of > 1 ? `Image ${n} of ${of}` : "Image";
  const img = h("img", { alt: `${label}, ${a.width}×${a.height}`, width: String(a.width), height: String(a.height),
    loading: "lazy", decoding: "async" });
  show(img, a);
  const open = h("button", { type: "button", class: "att-image", title: "Open full size",
    "aria-label": `Open ${label.toLowerCase()} full size (${a.width}×${a.height}, ${sizeText(a.byte_size)})` }, img);
  open.addEventListener("click", () => openViewer(a, label, open));
  return open;
}

function fileCard(a) {
  const download = h("a", { class: "att-download", href: address(a.id), download: a.name,
    "aria-label": `Download ${a.name}`, text: "Download" });
  if (token()) { // the link alone carries no personal token: fetch with it, then save
    download.addEventListener("click", async (e) => {
      e.preventDefault();
      const url = await objectUrl(a.id);
      const save = h("a", { href: url, download: a.name, hidden: true });
      document.body.append(save);
      save.click();
      save.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60_000);
    });
  }
  return h("div", { class: "att-file" },
    h("span", { class: "att-file-icon", "aria-hidden": "true", text: extension(a.name) }),
    h("span", { class: "att-file-text" }, h("span", { class: "att-file-name", text: a.name }),
      h("span", { class: "att-file-kind", text: describe(a) })),
    download);
}

/** The image whole, in a dialog over the page; Escape or Close ends it and focus goes back. */
function openViewer(a, label, from) {
  const img = h("img", { alt: `${label}, ${a.width}×${a.height}`, width: String(a.width), height: String(a.height) });
  show(img, a);
  const close = h("button", { type: "button", class: "small", text: "Close" });
  const tab = h("a", { href: address(a.id), target: "_blank", rel: "noopener", text: "Open in a new tab" });
  const dialog = h("dialog", { class: "att-viewer", "aria-label": label },
    h("div", { class: "att-viewer-bar" },
      h("span", { class: "muted small", text: `${a.width}×${a.height} · ${sizeText(a.byte_size)}` }),
      token() ? null : tab, close),
    h("div", { class: "att-viewer-image" }, img));
  close.addEventListener("click", () => dialog.close());
  dialog.addEventListener("click", (e) => { if (e.target === dialog) dialog.close(); }); // the backdrop
  dialog.addEventListener("close", () => {
    dialog.remove();
    from.focus();
  });
  document.body.append(dialog);
  dialog.showModal();
  close.focus();
}

// ---- internal -------------------------------------------------------------------------------------

function address(id) {
  return `/api/attachments/${seg(id)}`;
}

/** Point an <img> at an attachment: its address, or (signed in with a personal token) a copy
 *  fetched with that token. */
function show(img, a) {
  if (!token()) {
    img.src = address(a.id);
    return;
  }
  objectUrl(a.id).then((url) => { img.src = url; }, () => { img.alt += " (could not be loaded)"; });
}

async function objectUrl(id) {
  const response = await fetch(address(id), { headers: { Authorization: `Bearer ${token()}` }, credentials: "same-origin" });
  if (!response.ok) throw new Error(`error ${response.status}`);
  return URL.createObjectURL(await response.blob());
}

/** "PNG image · 40×30 · 2 KiB", "PDF document · 12 KiB": what the server says it is. */
function describe(a) {
  if (a.kind === "image") {
    return `${a.content_type.split("/")[1].toUpperCase()} image · ${a.width}×${a.height} · ${sizeText(a.byte_size)}`;
  }
  return `${FILE_KIND[a.content_type] || a.content_type} · ${sizeText(a.byte_size)}`;
}

function extension(name) {
  const dot = name.lastIndexOf(".");
  return dot > 0 ? name.slice(dot + 1, dot + 5).toUpperCase() : "FILE";
}

export function sizeText(bytes) {
  if (bytes < 1024) return bytes === 1 ? "1 byte" : `${bytes} bytes`;
  if (bytes < 1024 * 1024) return `${Math.round(bytes / 1024)} KiB`;
  return `${(bytes / (1024 * 1024)).toFixed(1)} MiB`;
}
