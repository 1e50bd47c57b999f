// segpipe studio's page: everything it shows and changes goes through the JSON API (api/...).
"use strict";

const $ = (id) => document.getElementById(id);
// the objects' colours: distinct hues (Trubetskoy's), those that little of the video's first frame
// lies near first, each next one the farthest from those taken before it, so that no mask takes
// the colour of what it covers or of another object's mask
const PALETTE = [[230, 25, 75], [60, 180, 75], [0, 130, 200], [245, 130, 48], [145, 30, 180],
  [70, 240, 240], [240, 50, 230], [210, 245, 60], [250, 190, 190], [0, 128, 128], [255, 225, 25],
  [170, 110, 40], [128, 0, 0], [170, 255, 195], [128, 128, 0], [0, 0, 128]];
const NEAR = 90; // (a frame's pixel this close to a colour, in RGB, makes it a worse choice)
let COLOURS = PALETTE;
const colour = (id) => COLOURS[(((id - 1) % COLOURS.length) + COLOURS.length) % COLOURS.length];
window.colourOf = colour; // (read by the tests)

function chooseColours(image) {
  const side = 64, g = new OffscreenCanvas(side, side).getContext("2d");
  g.drawImage(image, 0, 0, side, side);
  const px = g.getImageData(0, 0, side, side).data;
  const d2 = (p, q) => (p[0] - q[0]) ** 2 + (p[1] - q[1]) ** 2 + (p[2] - q[2]) ** 2;
  const near = PALETTE.map((c) => {
    let n = 0;
    for (let i = 0; i < px.length; i += 4) if (d2([px[i], px[i + 1], px[i + 2]], c) < NEAR * NEAR) n++;
    return Math.floor((100 * n) / (side * side)); // (in whole percents: under 1% is none)
  });
  const left = PALETTE.map((_, i) => i), taken = [];
  while (left.length) {
    const least = Math.min(...left.map((i) => near[i]));
    const apart = (i) => Math.min(Infinity, ...taken.map((c) => d2(c, PALETTE[i])));
    const pick = left.filter((i) => near[i] === least).reduce((a, b) => (apart(b) > apart(a) ? b : a));
    taken.push(PALETTE[pick]);
    left.splice(left.indexOf(pick), 1);
  }
  COLOURS = taken;
}

const S = {
  info: null, frame: 0, selected: 1, labels: new Map(), entries: [], steps: { undo: 0, redo: 0 },
  scores: { objects: [], scores: [], areas: [], tracked: [], flags: [] }, lost: [],
  image: null, tracked: null, previews: new Map(), playing: false, version: -1,
  drag: null, inFlight: null, shown: null, tool: "prompt", paint: null, hidden: new Set(), solo: null,
  cache: new Map(), // frame -> the promise of its image and masks (playback reads ahead)
};
window.studio = S; // read by the tests (and handy in the console)

async function api(path, options = {}) {
  let response;
  try {
    response = await fetch("api/" + path, options);
  } catch (e) { // no answer at all: the server is gone (the banner says so too)
    throw new Error("segpipe studio's server does not answer: start it again, the page reconnects");
  }
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try { message = (await response.json()).error || message; } catch (e) { /* not JSON */ }
    throw new Error(message);
  }
  return response;
}
const json = (body) => ({ method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });

function say(message) { $("error").textContent = $("error").title = message || ""; }
async function guarded(fn) {
  try { say(""); return await fn(); } catch (e) { say(e.message); }
}

// -- objects and prompts ----------------------------------------------------------------------
function objectIds() {
  const ids = new Set([...S.scores.objects, ...S.entries.map((e) => e.object), ...S.labels.keys()]);
  if (!ids.size) ids.add(1);
  return [...ids].sort((a, b) => a - b);
}

function drawObjects() {
  const box = $("objects");
  box.textContent = "";
  for (const id of objectIds()) {
    const b = document.createElement("button");
    const label = S.labels.get(id) || {};
    b.textContent = label.name ? `${id} ${label.name}` : id;
    b.dataset.object = id;
    b.style.background = `rgb(${colour(id).join(",")})`;
    b.classList.toggle("selected", id === S.selected);
    b.classList.toggle("hidden", S.hidden.has(id));
    const called = label.name ? `${label.name}${label.class ? ` (${label.class})` : ""}` : `object ${id}`;
    b.title = `${called} (h: ${S.hidden.has(id) ? "show" : "hide"} its masks)`;
    b.onclick = () => select(id);
    box.appendChild(b);
  }
  const label = S.labels.get(S.selected) || {};
  for (const [key, input] of [["name", $("object-name")], ["class", $("object-class")]]) {
    if (document.activeElement !== input) input.value = label[key] || "";
  }
}

function select(id) { S.selected = id; drawObjects(); draw(); }

// the objects' names and classes, kept in the store (an object exists from "+ object" on)
// the page's own changes of its prompts or names, counted as they start and as they end
// (odd: one in flight): a refresh that read them while one was under way read what it
// replaces, and keeps the page's instead
const CHANGES = { prompts: 0, labels: 0 };
async function changing(what, fn) {
  CHANGES[what] += 1;
  try { return await fn(); } finally { CHANGES[what] += 1; }
}

async function fresh(what, read) {
  const before = CHANGES[what];
  const got = await read();
  return before % 2 === 0 && CHANGES[what] === before ? got : undefined;
}

async function loadLabels() {
  const got = await fresh("labels", async () => (await (await api("labels")).json()).objects);
  if (got !== undefined) S.labels = new Map(got.map((o) => [o.id, o]));
}

// names, classes or adds the objects in `objects` and forgets those in `remove` (the others keep
// theirs, whatever another tab named them meanwhile); the page then shows every object's, as the store holds them
async function patchLabels(objects, remove = []) {
  const response = await changing("labels", () => api("labels", {
    method: "PATCH", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ objects, remove }),
  }));
  S.labels = new Map((await response.json()).objects.map((o) => [o.id, o]));
  drawObjects();
}

async function nameSelected() {
  const label = { id: S.selected };
  const name = $("object-name").value.trim(), cls = $("object-class").value.trim();
  if (name) label.name = name;
  if (cls) label.class = cls;
  await patchLabels([label]);
}

// solo: only the selected object's masks shown (s again: every object's)
function toggleSolo() {
  S.solo = S.solo === S.selected ? null : S.selected;
  $("solo").classList.toggle("selected", S.solo !== null);
  draw();
}

function toggleOutline() {
  $("view-mode").value = $("view-mode").value === "outline" ? "fill" : "outline";
  draw();
}

function toggleHidden(id) {
  if (S.hidden.has(id)) S.hidden.delete(id); else S.hidden.add(id);
  drawObjects();
  draw();
}

async function addObject() {
  const id = Math.max(0, ...objectIds()) + 1, before = S.labels;
  S.labels = new Map([...S.labels, [id, { id }]]); // shown at once, then kept in the store
  select(id);
  try {
    await patchLabels([{ id }]);
  } catch (e) { // (a read-only studio, a job running: not added)
    S.labels = before;
    select(objectIds().includes(S.selected) ? S.selected : objectIds()[0]);
    throw e;
  }
}

async function setEntries(entries) {
  await changing("prompts", async () => {
    const response = await api("prompts", {
      method: "PUT", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ prompts: entries }),
    });
    showEntries((await response.json()).prompts);
  });
  await loadSteps();
}

function showEntries(entries) {
  S.entries = entries;
  drawObjects();
  drawStrips();
  drawPromptList();
  hint();
}

// what to do first, on a store with no prompt and nothing tracked
const HINT = "To start: click an object on the frame (Shift+click: a negative point; drag: a box), " +
  "check its preview, then Track (t). ? lists the keys.";
function hint() {
  const first = !S.entries.length && !S.scores.objects.length;
  if (first) $("flag-said").textContent = HINT;
  else if ($("flag-said").textContent === HINT) $("flag-said").textContent = "";
}

// a click or a box for the selected object on this frame: one entry per (object, frame), as
// SAM 2's demo sends all of a frame's clicks at once (a second entry would replace the first)
async function addPrompt(change) {
  const f = S.frame, o = S.selected;
  const entries = S.entries.map((e) => ({ ...e }));
  let entry = entries.find((e) => e.frame === f && e.object === o && !e.mask);
  if (!entry) {
    // the first click on a frame where the object is tracked refines its tracked mask: that
    // mask becomes the frame's mask prompt, the clicks follow (SAM 2 then decodes from its
    // logits, as its demo does after propagation)
    const tracked = !entries.some((e) => e.frame === f && e.object === o) && trackedMask(f, o);
    if (tracked) entries.push({ object: o, frame: f, mask: await maskDataUri(tracked) });
    entry = { object: o, frame: f };
    entries.push(entry);
  }
  if (change.point) {
    entry.points = [...(entry.points || []), change.point];
    entry.labels = [...(entry.labels || []), change.label];
  } else {
    entry.box = change.box;
  }
  await setEntries(entries);
  await preview(f, o);
}

async function preview(f, o) {
  const key = `${f}:${o}`;
  const none = () => { S.previews.delete(key); warn(key, null); draw(); };
  if (!S.entries.some((e) => e.frame === f && e.object === o)) return none();
  const started = performance.now();
  const response = await api("preview", json({ frame: f, object: o }));
  // (204: its prompts there went meanwhile: an edit under way, another tab's)
  if (response.status === 204) return none();
  const bitmap = await createImageBitmap(await response.blob());
  S.previews.set(key, { mask: pixelValues(bitmap), score: Number(response.headers.get("X-Object-Score")) });
  S.previewMs = performance.now() - started;
  warn(key, JSON.parse(response.headers.get("X-Change") || "null"));
  draw();
  document.body.dataset.previewed = key;
}

// a correction that moves a tracked object's mask drastically (say onto another target) is
// said before Track carries it through the video
function warn(key, change) {
  const [f, o] = key.split(":");
  if (change && change.drastic) {
    const moved = change.shift === null ? "its mask empties" : `its centre moves ${change.shift} body lengths`;
    $("warning").textContent = $("warning").title = `object ${o} on frame ${f}: this correction changes its tracked mask drastically ` +
      `(overlap ${change.iou.toFixed(2)} with it; ${moved}): check it before Track`;
    document.body.dataset.warning = key;
  } else if (document.body.dataset.warning === key || !change) {
    $("warning").textContent = "";
    document.body.dataset.warning = "";
  }
}

// undo and redo go through the store's history: they outlive a reload, a tab, the studio
async function loadSteps() {
  S.steps = await (await api("history")).json();
  $("undo").disabled = !S.steps.undo;
  $("redo").disabled = !S.steps.redo;
  $("undo").title = S.steps.undo ? `undo the last change of the prompts (z): ${S.steps.undo} to undo` : "nothing to undo";
  $("redo").title = S.steps.redo ? `redo what undo took back (y): ${S.steps.redo} to redo` : "nothing to redo";
}

async function stepHistory(which) {
  try {
    await changing("prompts", async () => {
      const response = await api(which, json({}));
      showEntries((await response.json()).prompts);
    });
  } finally {
    await loadSteps(); // (a refused step may have been dropped)
  }
  await loadSteps();
  await previewHere();
}

async function previewHere() {
  if (document.body.dataset.warning) warn(document.body.dataset.warning, null);
  for (const key of [...S.previews.keys()]) if (key.startsWith(`${S.frame}:`)) S.previews.delete(key);
  const here = new Set(S.entries.filter((e) => e.frame === S.frame).map((e) => e.object));
  for (const o of here) await preview(S.frame, o);
  draw();
}

// -- the prompt list: every prompt, to jump to, move to another object, or delete alone ------
function describe(e) {
  const parts = [];
  if (e.box) parts.push("box");
  if (e.points) {
    const plus = e.labels.filter((l) => l).length, minus = e.labels.length - plus;
    parts.push(`${e.points.length} point${e.points.length > 1 ? "s" : ""} (${plus}+ ${minus}-)`);
  }
  if (e.mask) parts.push("mask");
  return parts.join(" + ");
}

function drawPromptList() {
  const list = $("prompt-list");
  list.textContent = "";
  const order = S.entries.map((e, i) => i).sort((a, b) => S.entries[a].frame - S.entries[b].frame || S.entries[a].object - S.entries[b].object || a - b);
  for (const i of order) {
    const e = S.entries[i];
    const li = document.createElement("li");
    li.dataset.index = i;
    li.classList.toggle("here", e.frame === S.frame);
    const go = document.createElement("button");
    go.className = "go";
    go.textContent = `frame ${e.frame}`;
    go.title = `go to frame ${e.frame}`;
    go.onclick = () => goFrame(e.frame);
    const kind = document.createElement("span");
    kind.textContent = describe(e);
    const move = document.createElement("select");
    move.className = "move";
    move.title = "the object this prompt is for";
    for (const id of objectIds()) {
      const option = document.createElement("option");
      option.value = id;
      option.textContent = (S.labels.get(id) || {}).name ? `${id} ${S.labels.get(id).name}` : `object ${id}`;
      move.append(option);
    }
    move.value = e.object;
    move.style.borderLeft = `6px solid rgb(${colour(e.object).join(",")})`;
    move.onchange = () => guarded(() => moveOne(i, Number(move.value)));
    const del = document.createElement("button");
    del.className = "delete";
    del.textContent = "\u00d7";
    del.title = "delete this prompt";
    del.onclick = () => guarded(() => deleteOne(i));
    li.append(move, go, kind, del);
    list.append(li);
  }
  $("prompt-count").textContent = S.entries.length ? `(${S.entries.length})` : "";
}

async function deleteOne(i) {
  await setEntries(S.entries.filter((_, j) => j !== i));
  await previewHere();
}

async function moveOne(i, object) {
  await setEntries(S.entries.map((e, j) => (j === i ? { ...e, object } : e)));
  await previewHere();
}

async function deleteObject() {
  await setEntries(S.entries.filter((e) => e.object !== S.selected));
  if (S.labels.has(S.selected)) await patchLabels([], [S.selected]);
  for (const k of [...S.previews.keys()]) if (k.endsWith(`:${S.selected}`)) S.previews.delete(k);
  draw();
}

// -- brush and eraser: edit the selected object's mask on this frame; the edited mask
// becomes that frame's mask prompt (SAM 2's add_new_mask), previewed like a click ----------
function setTool(tool) {
  S.tool = tool;
  for (const t of ["prompt", "brush", "eraser"]) $(`tool-${t}`).classList.toggle("selected", t === tool);
}

// the object's tracked mask on frame f as 0/255, if it is shown now and not empty
function trackedMask(f, o) {
  const slot = S.scores.objects.indexOf(o);
  if (!S.tracked || slot < 0 || S.shown !== f) return null;
  const out = Uint8Array.from(S.tracked, (v) => (v === slot + 1 ? 255 : 0));
  return out.some((v) => v) ? out : null;
}

function shownMask(f, o) {
  const W = S.info.width, H = S.info.height;
  const p = S.previews.get(`${f}:${o}`);
  if (p) return Uint8Array.from(p.mask, (v) => (v ? 255 : 0));
  return trackedMask(f, o) || new Uint8Array(W * H);
}

function dab(at) {
  const W = S.info.width, H = S.info.height, r = Number($("radius").value);
  const [cx, cy] = at, value = S.tool === "brush" ? 255 : 0;
  for (let y = Math.max(0, Math.floor(cy - r)); y <= Math.min(H - 1, Math.ceil(cy + r)); y++) {
    for (let x = Math.max(0, Math.floor(cx - r)); x <= Math.min(W - 1, Math.ceil(cx + r)); x++) {
      if ((x + 0.5 - cx) ** 2 + (y + 0.5 - cy) ** 2 <= r * r) S.paint.mask[y * W + x] = value;
    }
  }
  S.previews.set(`${S.paint.frame}:${S.paint.object}`, { mask: S.paint.mask, score: null });
  draw();
}

async function maskDataUri(mask) {
  const W = S.info.width, H = S.info.height;
  const c = new OffscreenCanvas(W, H), g = c.getContext("2d");
  const image = g.createImageData(W, H);
  for (let i = 0; i < W * H; i++) {
    image.data.fill(mask[i] ? 255 : 0, 4 * i, 4 * i + 3);
    image.data[4 * i + 3] = 255;
  }
  g.putImageData(image, 0, 0);
  const blob = await c.convertToBlob({ type: "image/png" });
  const bytes = new Uint8Array(await blob.arrayBuffer());
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return "data:image/png;base64," + btoa(text);
}

async function commitPaint() {
  const { frame: f, object: o, mask } = S.paint;
  S.paint = null;
  const entries = S.entries.filter((e) => !(e.frame === f && e.object === o));
  entries.push({ object: o, frame: f, mask: await maskDataUri(mask) });
  await setEntries(entries);
  await preview(f, o);
}

// -- frames and masks -----------------------------------------------------------------------
// a PNG's pixel values: grey PNGs (previews) the R channel; the tracked masks' PNG, with
// `wide`, R + 256 G = 1 + the object's slot (0: none)
function pixelValues(bitmap, wide = false) {
  const c = new OffscreenCanvas(bitmap.width, bitmap.height);
  const g = c.getContext("2d");
  g.drawImage(bitmap, 0, 0);
  const rgba = g.getImageData(0, 0, bitmap.width, bitmap.height).data;
  const out = wide ? new Uint16Array(bitmap.width * bitmap.height) : new Uint8Array(bitmap.width * bitmap.height);
  for (let i = 0; i < out.length; i++) out[i] = rgba[4 * i] + (wide ? 256 * rgba[4 * i + 1] : 0);
  return out;
}

// frame n's image and masks, fetched once while they are wanted: playback asks for the
// frames ahead while it shows this one (at most AHEAD, dropped once shown or passed)
const AHEAD = 8;
function fetchFrame(n) {
  if (!S.cache.has(n)) {
    const got = Promise.all([
      api(`frames/${n}.jpg`).then((r) => r.blob()).then(createImageBitmap),
      api(`masks/${n}.png`).then(async (r) => pixelValues( // (read out ahead too)
        await createImageBitmap(await r.blob()), r.headers.get("X-Mask-Format") === "rgb")),
    ]);
    got.catch(() => S.cache.delete(n));
    S.cache.set(n, got);
  }
  return S.cache.get(n);
}

function readAhead(n) {
  for (const f of [...S.cache.keys()]) if (f < n || f > n + AHEAD) S.cache.delete(f);
  for (let f = n + 1; f <= Math.min(n + AHEAD, S.info.frames - 1); f++) fetchFrame(f);
}

async function loadFrame(n) {
  const [image, values] = await fetchFrame(n);
  if (!S.playing) S.cache.clear(); // (stepping or scrubbing: masks may change meanwhile)
  else S.cache.delete(n);
  S.image = image;
  S.tracked = values;
  S.shown = n;
  draw();
  document.body.dataset.frame = n;
  return true;
}

// one frame load in flight at a time; a scrub asks for the latest frame wanted, not every one
// it passed over
async function goFrame(n) {
  if (!S.info) return;
  n = Math.max(0, Math.min(S.info.frames - 1, n));
  S.frame = n;
  $("scrub").value = n;
  $("frame").value = n;
  history.replaceState(null, "", `?frame=${n}`);
  follow(n);
  drawStrips();
  for (const li of $("prompt-list").children) li.classList.toggle("here", S.entries[li.dataset.index]?.frame === n);
  if (S.inFlight) return S.inFlight;
  S.inFlight = (async () => {
    await null; // S.inFlight is this promise before the loop runs (and before it ends)
    try {
      while (S.shown !== S.frame) if ((await guarded(() => loadFrame(S.frame))) !== true) break;
    } finally {
      S.inFlight = null;
    }
  })();
  return S.inFlight;
}

function draw() {
  const canvas = $("view");
  if (!S.image || !S.info) return;
  const W = S.info.width, H = S.info.height;
  const g = canvas.getContext("2d");
  g.drawImage(S.image, 0, 0, W, H);
  const overlay = g.getImageData(0, 0, W, H);
  const px = overlay.data;
  const alpha = Number($("opacity").value);
  const slots = S.scores.objects;
  const shown = new Set(); // objects whose preview replaces their tracked mask here
  for (const key of S.previews.keys()) {
    const [f, o] = key.split(":").map(Number);
    if (f === S.frame) shown.add(o);
  }
  const outline = $("view-mode").value === "outline";
  const visible = (id) => !S.hidden.has(id) && (S.solo === null || S.solo === id);
  if (S.tracked) {
    const value = S.tracked;
    for (let i = 0; i < W * H; i++) {
      const v = value[i];
      if (!v) continue;
      const id = slots[v - 1];
      if (id === undefined || shown.has(id) || !visible(id)) continue;
      if (!outline) tint(px, i, colour(id), alpha);
      else if (edge(value, i, W, H)) tint(px, i, colour(id), 1);
    }
  }
  for (const [key, p] of S.previews) {
    const [f, o] = key.split(":").map(Number);
    if (f !== S.frame || !visible(o)) continue;
    for (let i = 0; i < W * H; i++) {
      if (!p.mask[i]) continue;
      if (!outline) tint(px, i, colour(o), alpha);
      else if (edge(p.mask, i, W, H)) tint(px, i, colour(o), 1);
    }
  }
  g.putImageData(overlay, 0, 0);
  const r = markerRadius();
  for (const e of S.entries) {
    if (e.frame !== S.frame) continue;
    const rgb = `rgb(${colour(e.object).join(",")})`;
    g.strokeStyle = rgb;
    g.lineWidth = Math.max(2, r / 2);
    if (e.box) g.strokeRect(e.box[0], e.box[1], e.box[2] - e.box[0], e.box[3] - e.box[1]);
    (e.points || []).forEach(([x, y], j) => marker(g, x, y, r, rgb, e.labels[j] === 1));
  }
  if (S.drag && S.drag.moved) {
    g.strokeStyle = "#fff";
    g.setLineDash([4, 3]);
    const [x0, y0] = S.drag.start, [x1, y1] = S.drag.now;
    g.strokeRect(x0, y0, x1 - x0, y1 - y0);
    g.setLineDash([]);
  }
  const s = scoreAt(S.selected, S.frame);
  $("score").textContent = s === null ? "" : `object ${S.selected} score ${s.toFixed(2)}`;
}

// a pixel of a mask (values: 0 none, else who) on its outline: a 4-neighbour is another's
function edge(value, i, W, H) {
  const v = value[i], x = i % W;
  return x === 0 || x === W - 1 || i < W || i >= W * (H - 1)
    || value[i - 1] !== v || value[i + 1] !== v || value[i - W] !== v || value[i + W] !== v;
}

// a point prompt: a disc in its object's colour, ringed white with a "+" where positive,
// black with a "-" where negative, of a 7 screen pixel radius whatever the video's size
function markerRadius() {
  const shown = $("view").getBoundingClientRect().width || S.info.width;
  return Math.max(3, (7 * S.info.width) / shown);
}

function marker(g, x, y, r, rgb, positive) {
  const ink = positive ? "#fff" : "#000";
  g.fillStyle = rgb;
  g.strokeStyle = ink;
  g.lineWidth = r / 2;
  g.beginPath(); g.arc(x, y, r, 0, 2 * Math.PI); g.fill(); g.stroke();
  g.lineWidth = Math.max(1, r / 3);
  g.beginPath();
  g.moveTo(x - r / 2, y); g.lineTo(x + r / 2, y);
  if (positive) { g.moveTo(x, y - r / 2); g.lineTo(x, y + r / 2); }
  g.stroke();
}

function tint(px, i, rgb, a) {
  px[4 * i] = (1 - a) * px[4 * i] + a * rgb[0];
  px[4 * i + 1] = (1 - a) * px[4 * i + 1] + a * rgb[1];
  px[4 * i + 2] = (1 - a) * px[4 * i + 2] + a * rgb[2];
}

// -- the timeline's strips: where each object is tracked and present, its prompts, and where
// it may be lost (the server's flags: its score falls below zero, its area jumps, its mask
// vanishes) -----------------------------------------------------------------------------------
function scoreAt(id, f) {
  const slot = S.scores.objects.indexOf(id);
  return slot < 0 ? null : S.scores.scores[slot][f];
}

const FLAG_COLOURS = {
  absent: "#ff1744", vanished: "#ffea00", area: "#ff9100", jump: "#d500f9", iou: "#00e5ff", overlap: "#ffffff",
};

function findLost() {
  const lost = new Set();
  S.scores.flags.forEach((flags) => flags.forEach(([f]) => lost.add(f)));
  S.lost = [...lost].sort((a, b) => a - b);
}

// each object's row: its flags in a band at the top, its strip in the middle, its prompts'
// ticks in a band at the bottom (a tick never hides a flag), its name in a column at the left
const STRIP = { row: 30, left: 90, flags: [0, 6], strip: [8, 22], prompts: [24, 30] };
window.stripGeometry = STRIP; // (read by the tests)

// the frames the strips show: all of them, or a window zoomed into (+ and - around the
// frame shown, Ctrl + the wheel around the pointer; 0: all again), slid along to the frame
// shown when it goes out of it
function span() {
  return S.span ?? [0, S.info.frames];
}

function follow(n) {
  if (!S.span) return;
  const [a, b] = S.span;
  if (n < a) S.span = [n, n + b - a];
  if (n >= b) S.span = [n + 1 - (b - a), n + 1];
}

function zoom(factor, around = S.frame) {
  const T = S.info.frames, [a, b] = span(), n = b - a;
  const m = Math.max(Math.min(T, 10), Math.min(T, Math.round(n / factor)));
  if (m >= T) S.span = null;
  else {
    const start = Math.max(0, Math.min(T - m, Math.round(around - ((around - a) * m) / n)));
    S.span = [start, start + m];
  }
  drawStrips();
}

// the strips at the canvas's own width: each pixel column stands for the frames under it
// (present there if its lowest score is above zero), so an hour of video fits
function drawStrips() {
  const canvas = $("strips");
  if (!S.info) return;
  fromHereButtons();
  const ids = objectIds(), [a, b] = span(), T = b - a, { row: ROW, left } = STRIP;
  canvas.dataset.span = `${a}:${b}`;
  canvas.width = Math.max(left + 1, canvas.clientWidth);
  canvas.height = ROW * ids.length;
  canvas.style.height = `${canvas.height}px`;
  const g = canvas.getContext("2d"), Wc = canvas.width - left;
  const x = (f) => left + Math.floor(((f - a) * Wc) / T), w = Math.max(1, Math.floor(Wc / T));
  const shown = (f) => f >= a && f < b;
  const band = (r, [top, bottom]) => [r * ROW + top, bottom - top];
  g.clearRect(0, 0, canvas.width, canvas.height);
  ids.forEach((id, r) => {
    g.fillStyle = `rgb(${colour(id).join(",")})`;
    g.fillRect(0, r * ROW + 4, 4, ROW - 8);
    g.fillStyle = id === S.selected ? "#fff" : "#aaa";
    g.font = "12px system-ui, sans-serif";
    g.textBaseline = "middle";
    g.fillText(called(id).slice(0, 12), 8, r * ROW + ROW / 2, left - 12);
    const slot = S.scores.objects.indexOf(id);
    if (slot >= 0) {
      const scores = S.scores.scores[slot];
      const [y, h] = band(r, STRIP.strip);
      for (let px = 0; px < Wc; px++) {
        const f0 = a + Math.floor((px * T) / Wc), f1 = Math.max(f0 + 1, a + Math.floor(((px + 1) * T) / Wc));
        let low = null;
        for (let f = f0; f < f1; f++) if (scores[f] !== null && (low === null || scores[f] < low)) low = scores[f];
        if (low === null) continue;
        g.fillStyle = low > 0 ? `rgb(${colour(id).join(",")})` : "#444";
        g.fillRect(left + px, y, 1, h);
      }
      const [fy, fh] = band(r, STRIP.flags);
      for (const [f, kind] of S.scores.flags[slot]) {
        if (!shown(f)) continue;
        g.fillStyle = FLAG_COLOURS[kind];
        g.fillRect(x(f), fy, Math.max(2, w), fh);
      }
    }
    const [py, ph] = band(r, STRIP.prompts);
    g.fillStyle = "#fff";
    for (const e of S.entries) if (e.object === id && shown(e.frame)) g.fillRect(x(e.frame), py, Math.max(2, w), ph);
  });
  g.fillStyle = "rgba(255,255,255,0.6)";
  if (shown(S.frame)) g.fillRect(x(S.frame), 0, 1, canvas.height);
  if (canvas.height !== S.stripsHeight) { S.stripsHeight = canvas.height; fit(); } // (the frame's room)
}

// the frame and object under a point of the strips (null left of them)
function stripAt(e) {
  const c = $("strips"), r = c.getBoundingClientRect(), [a, b] = span();
  const px = ((e.clientX - r.left) / r.width) * c.width - STRIP.left;
  if (px < 0) return null;
  const f = Math.min(b - 1, a + Math.floor((px * (b - a)) / (c.width - STRIP.left)));
  const id = objectIds()[Math.floor(((e.clientY - r.top) / r.height) * c.height / STRIP.row)];
  return { f, id };
}

// what the strips show under the pointer: frame, score, area and flags there
function stripDetails(e) {
  const at = stripAt(e);
  if (!at || at.id === undefined) { $("strips").title = ""; return; }
  const slot = S.scores.objects.indexOf(at.id);
  const parts = [`${called(at.id)}, frame ${at.f}`];
  if (slot >= 0 && S.scores.scores[slot][at.f] !== null) {
    parts.push(`score ${S.scores.scores[slot][at.f].toFixed(2)}`, `area ${S.scores.areas[slot][at.f]} px`);
    for (const [f, kind, reason] of S.scores.flags[slot]) if (f === at.f) parts.push(`${kind}: ${reason}`);
  } else {
    parts.push("not tracked");
  }
  $("strips").title = parts.join("; ");
}

function jumpLost(step) {
  const next = step > 0 ? S.lost.find((f) => f > S.frame) : [...S.lost].reverse().find((f) => f < S.frame);
  if (next === undefined) return;
  goFrame(next);
  sayFlags(next);
}

// what was flagged on frame f, and why (after [ or ], or a click in the flag list)
function sayFlags(f) {
  const said = [];
  S.scores.objects.forEach((id, slot) => {
    for (const [frame, kind, reason] of S.scores.flags[slot]) if (frame === f) said.push(`${called(id)}: ${kind}, ${reason}`);
  });
  $("flag-said").textContent = said.length ? `frame ${f}: ${said.join("; ")}` : "";
}

function called(id) {
  const label = S.labels.get(id) || {};
  return label.name ? `${id} ${label.name}` : `object ${id}`;
}

// the flag list: every flag by object, its reason, a link to its frame
function drawFlagList() {
  const list = $("flag-list");
  list.textContent = "";
  let n = 0;
  S.scores.objects.forEach((id, slot) => {
    for (const [frame, kind, reason] of S.scores.flags[slot]) {
      const li = document.createElement("li");
      li.dataset.frame = frame;
      li.dataset.object = id;
      const go = document.createElement("button");
      go.className = "go";
      go.textContent = `frame ${frame}`;
      go.onclick = () => { goFrame(frame); sayFlags(frame); };
      const mark = document.createElement("span");
      mark.className = "mark";
      mark.style.background = FLAG_COLOURS[kind];
      const what = document.createElement("span");
      what.textContent = `${called(id)}: ${kind}`;
      what.title = reason;
      li.title = `${called(id)}, frame ${frame}: ${kind}, ${reason}`;
      li.append(mark, go, what);
      list.append(li);
      n += 1;
    }
  });
  $("flag-count").textContent = n ? `(${n})` : "";
}

// -- tracking --------------------------------------------------------------------------------
async function refresh() {
  const version = S.version;
  S.scores = await (await api("scores")).json();
  const entries = await fresh("prompts", async () => (await (await api("prompts")).json()).prompts);
  if (entries !== undefined) S.entries = entries;
  await loadLabels();
  await loadSteps();
  drawPromptList();
  findLost();
  drawFlagList();
  hint();
  drawObjects();
  drawStrips();
  S.shown = null; // the masks may have changed: load the frame again
  S.cache.clear();
  await goFrame(S.frame);
  document.body.dataset.refreshed = version; // (what the page shows is the server's then)
}

function showProgress(p) {
  const tracking = p.kind === "track";
  const rate = p.rate ? `, ${p.rate} frames/s, ${p.eta ?? "?"} s left` : "";
  const doing = tracking ? `tracking${p.phase ? ` (${p.phase})` : ""}` : p.kind;
  const text = {
    idle: "",
    running: p.total ? `${doing}: ${p.done}/${p.total} frames${rate}`
      : p.done ? `${doing}: ${p.done} frames` : `${doing}...`,
    done: p.kind === "decode" ? "" : p.message || (tracking ? `tracked ${p.total} frames` : "done"),
    cancelled: p.message,
    interrupted: p.message,
    failed: `failed: ${p.message}`,
  }[p.state];
  $("progress").textContent = text;
  $("progress").title = text;
  const running = p.state === "running";
  $("cancel").disabled = !running;
  $("cancel").title = running ? "stop after the chunk in flight" : "nothing is running";
  document.body.dataset.job = p.state;
  document.body.dataset.runs = p.runs;
}

// The server's events: a lost connection shows a banner (and the last progress is no longer
// shown as under way); the browser reconnects by itself, and the page then loads what the
// server has (a restarted server's tracking says where it stopped).
function connected(ok) {
  if (!ok && document.body.dataset.connection !== "lost") {
    $("progress").textContent = "";
    document.body.dataset.job = "unknown";
  }
  document.body.dataset.connection = ok ? "ok" : "lost";
  $("connection").hidden = ok;
}

function listen() {
  const events = new EventSource("api/events");
  events.onopen = () => {
    if (document.body.dataset.connection === "lost") S.version = -1; // reload all it has
    connected(true);
  };
  events.onerror = () => {
    connected(false);
    if (events.readyState === EventSource.CLOSED) setTimeout(listen, 2000); // it gave up
  };
  events.onmessage = async (m) => {
    const p = JSON.parse(m.data);
    $("store").textContent = S.info.store + (p.read_only ? " (read-only)" : "");
    if (p.read_only !== S.readOnly) { S.readOnly = p.read_only; say(p.read_only || ""); }
    if (p.state === "done" && S.lastState === "running") S.previews.clear(); // tracked now
    S.lastState = p.state;
    S.said = p; // the latest: shown once what it says is on the page (a job's end after
    if (p.version !== S.version) { //  its last chunk's strips)
      S.version = p.version;
      S.refreshing = guarded(refresh);
    }
    await S.refreshing; // (a refresh under way: what this says waits for it)
    if (S.said === p) showProgress(p);
  };
}

// -- input -----------------------------------------------------------------------------------
function videoPoint(e) {
  const c = $("view"), r = c.getBoundingClientRect();
  return [Math.round(((e.clientX - r.left) / r.width) * S.info.width * 10) / 10,
    Math.round(((e.clientY - r.top) / r.height) * S.info.height * 10) / 10];
}

function wire() {
  const view = $("view");
  view.addEventListener("contextmenu", (e) => e.preventDefault());
  view.addEventListener("mousedown", (e) => {
    if (S.tool !== "prompt") {
      S.paint = { frame: S.frame, object: S.selected, mask: shownMask(S.frame, S.selected) };
      dab(videoPoint(e));
      return;
    }
    S.drag = { start: videoPoint(e), now: videoPoint(e), at: [e.clientX, e.clientY], moved: false, negative: e.shiftKey || e.button === 2 };
  });
  view.addEventListener("mousemove", (e) => {
    if (S.paint) { dab(videoPoint(e)); return; }
    if (!S.drag) return;
    S.drag.now = videoPoint(e);
    const [dx, dy] = [e.clientX - S.drag.at[0], e.clientY - S.drag.at[1]]; // screen pixels
    if (Math.abs(dx) + Math.abs(dy) > 6) S.drag.moved = true;
    if (S.drag.moved) draw();
  });
  window.addEventListener("mouseup", (e) => {
    if (S.paint) { guarded(commitPaint); return; }
    const d = S.drag;
    S.drag = null;
    if (!d || e.target !== view && !d.moved) return;
    if (d.moved) {
      const [x0, y0] = d.start, [x1, y1] = d.now;
      guarded(() => addPrompt({ box: [Math.min(x0, x1), Math.min(y0, y1), Math.max(x0, x1), Math.max(y0, y1)] }));
    } else {
      guarded(() => addPrompt({ point: d.start, label: d.negative ? 0 : 1 }));
    }
  });
  $("scrub").addEventListener("input", (e) => goFrame(Number(e.target.value)));
  $("frame").addEventListener("change", (e) => { e.target.blur(); goFrame(Number(e.target.value)); });
  $("play").onclick = togglePlay;
  $("add-object").onclick = () => guarded(addObject);
  for (const id of ["object-name", "object-class"]) $(id).addEventListener("change", () => guarded(nameSelected));
  $("delete-object").onclick = () => guarded(deleteObject);
  $("undo").onclick = () => guarded(() => stepHistory("undo"));
  $("redo").onclick = () => guarded(() => stepHistory("redo"));
  $("track").onclick = () => guarded(track);
  $("find").onclick = () => guarded(findConcepts);
  $("track-forward").onclick = () => guarded(() => trackFromHere(true));
  $("track-backward").onclick = () => guarded(() => trackFromHere(false));
  $("cancel").onclick = () => guarded(() => api("cancel", json({})));
  $("export").onclick = () => guarded(() => api("export", json({ format: $("export-format").value })));
  $("opacity").oninput = draw;
  $("view-mode").onchange = draw;
  $("solo").onclick = toggleSolo;
  for (const t of ["prompt", "brush", "eraser"]) $(`tool-${t}`).onclick = () => setTool(t);
  $("help-button").onclick = () => { $("help").hidden = !$("help").hidden; };
  $("strips").addEventListener("click", (e) => {
    const at = stripAt(e);
    if (at) goFrame(at.f);
  });
  $("strips").addEventListener("mousemove", stripDetails);
  $("strips").addEventListener("wheel", (e) => {
    const at = stripAt(e);
    if (!at || !(e.ctrlKey || e.metaKey)) return; // (a plain wheel scrolls the objects' rows)
    e.preventDefault();
    S.wheel = (S.wheel ?? 0) + e.deltaY; // (a notch of a wheel: 100; a pinch: many small ones)
    if (Math.abs(S.wheel) < 100) return;
    zoom(S.wheel < 0 ? 2 : 0.5, at.f);
    S.wheel = 0;
  }, { passive: false });
  $("upload").addEventListener("change", async (e) => {
    const file = e.target.files[0];
    if (!file) return;
    await guarded(async () => {
      let parsed;
      try { parsed = JSON.parse(await file.text()); } catch (err) { throw new Error(`${file.name} is not JSON`); }
      await setEntries(Array.isArray(parsed) ? parsed : parsed.prompts);
      if (parsed.objects) await patchLabels(parsed.objects);
    });
    e.target.value = "";
  });
  window.addEventListener("keydown", (e) => {
    const t = e.target;
    const typing = (t.tagName === "INPUT" && t.type !== "range") || t.tagName === "SELECT" || t.tagName === "TEXTAREA" || t.isContentEditable;
    if (typing || e.ctrlKey || e.metaKey || e.altKey) return;
    const step = e.shiftKey ? 10 : 1;
    const keys = {
      ArrowRight: () => goFrame(S.frame + step), ArrowLeft: () => goFrame(S.frame - step),
      Home: () => goFrame(0), End: () => goFrame(S.info.frames - 1), " ": togglePlay,
      "[": () => jumpLost(-1), "]": () => jumpLost(1), n: () => guarded(addObject),
      p: () => setTool("prompt"), b: () => setTool("brush"), e: () => setTool("eraser"),
      h: () => toggleHidden(S.selected), s: toggleSolo, o: toggleOutline,
      z: () => guarded(() => stepHistory("undo")), y: () => guarded(() => stepHistory("redo")),
      Z: () => guarded(() => stepHistory("redo")), t: () => guarded(track), Delete: () => guarded(deleteObject),
      "+": () => zoom(2), "=": () => zoom(2), "-": () => zoom(0.5), 0: () => { S.span = null; drawStrips(); },
      "?": () => { $("help").hidden = !$("help").hidden; }, Escape: () => { $("help").hidden = true; },
    };
    if (/^[1-9]$/.test(e.key)) {
      const id = objectIds()[Number(e.key) - 1];
      if (id !== undefined) select(id);
    } else if (keys[e.key]) {
      keys[e.key]();
    } else {
      return;
    }
    e.preventDefault();
  });
}

async function track() {
  await api("track", json({ direction: $("direction").value, frames: [0, null] }));
}

// every instance of the phrases in the concept box (`segpipe track --concept`)
async function findConcepts() {
  const concepts = $("concept").value.split(",").map((c) => c.trim());
  await api("track", json({ concepts }));
}

// "track from here": the tracking window of `segpipe track --frames A:B`, forward from this
// frame to the frame in the box (empty: the end), or backward to it (empty: frame 0). A pass
// starts where SAM 2's would: forward from the later of this frame and the earliest prompt,
// backward from the earlier; so each button is offered only where its pass starts here.
function fromHereButtons() {
  const first = Math.min(...S.entries.map((e) => e.frame));
  $("track-forward").disabled = !S.entries.length || S.frame < first;
  $("track-backward").disabled = !S.entries.length || S.frame > first;
}

async function trackFromHere(forward) {
  const to = $("to-frame").value === "" ? null : Number($("to-frame").value);
  const frames = forward ? [S.frame, to === null ? null : to + 1] : [to ?? 0, S.frame + 1];
  await api("track", json({ direction: forward ? "forward" : "reverse", frames }));
}

async function togglePlay() {
  S.playing = !S.playing;
  $("play").innerHTML = S.playing ? "&#10074;&#10074;" : "&#9654;";
  while (S.playing && S.frame < S.info.frames - 1) {
    const began = performance.now();
    readAhead(S.frame + 1);
    await goFrame(S.frame + 1);
    const wait = 1000 / S.info.fps - (performance.now() - began);
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
  }
  S.playing = false;
  S.cache.clear();
  $("play").innerHTML = "&#9654;";
}

// the frame as large as the page allows, at the video's aspect
function fit() {
  if (!S.info || !S.info.width) return;
  const main = $("stage"), c = $("view");
  const scale = Math.min(main.clientWidth / S.info.width, main.clientHeight / S.info.height);
  c.style.width = `${Math.floor(S.info.width * scale)}px`;
  c.style.height = `${Math.floor(S.info.height * scale)}px`;
}

// a store being decoded (segpipe studio clip.mp4): the decode's progress, then the store.
// Meanwhile Cancel works and every other control is disabled, saying why.
async function decoded() {
  $("store").textContent = S.info.store;
  document.body.dataset.decoding = "1";
  const controls = [...document.querySelectorAll("header button, header input, header select, footer button, footer input")]
    .filter((c) => c.id !== "cancel" && c.id !== "help-button" && !c.disabled);
  const titles = controls.map((c) => c.title);
  for (const c of controls) { c.disabled = true; c.title = "available once the video is decoded"; }
  $("cancel").onclick = () => guarded(() => api("cancel", json({})));
  $("help-button").onclick = () => { $("help").hidden = !$("help").hidden; };
  await new Promise((resolve) => {
    const events = new EventSource("api/events");
    events.onopen = () => connected(true);
    events.onerror = () => connected(false); // (the browser reconnects: the page reloads then)
    events.onmessage = (m) => {
      const p = JSON.parse(m.data);
      if (p.kind !== "decode") return;
      showProgress(p);
      if (p.state === "failed" || p.state === "cancelled") {
        say(`${p.message} (reload the page to decode on)`);
        document.body.dataset.decoding = p.state;
      }
      if (p.state === "done") { events.close(); resolve(); }
    };
  });
  document.body.dataset.decoding = "0";
  controls.forEach((c, i) => { c.disabled = false; c.title = titles[i]; });
  S.info = await (await api("info")).json();
}

async function main() {
  S.info = await (await api("info")).json();
  if (S.info.decoding) await decoded();
  $("store").textContent = S.info.store + (S.info.read_only ? " (read-only)" : "");
  if (S.info.read_only) say(S.info.read_only);
  const canvas = $("view");
  canvas.width = S.info.width;
  canvas.height = S.info.height;
  fit();
  window.addEventListener("resize", fit);
  $("scrub").max = S.info.frames - 1;
  $("frame").max = S.info.frames - 1;
  $("of").textContent = `/ ${S.info.frames - 1}`;
  $("direction").value = S.info.direction;
  for (const [name, label] of S.info.formats) {  // the export formats registered
    const option = document.createElement("option");
    option.value = name;
    option.textContent = label;
    $("export-format").append(option);
  }
  wire();
  setTool("prompt");
  $("radius").value = Math.max(2, Math.round(S.info.width / 40));
  const asked = Number(new URLSearchParams(location.search).get("frame"));
  S.frame = Number.isInteger(asked) ? Math.max(0, Math.min(S.info.frames - 1, asked)) : 0;
  try { // (before the first draw; no frame 0 to see: the palette's own order)
    chooseColours(await createImageBitmap(await (await api("frames/0.jpg")).blob()));
  } catch (e) { COLOURS = PALETTE; }
  await refresh();
  S.selected = objectIds()[0];
  drawObjects();
  await goFrame(S.frame);
  listen();
  document.body.dataset.ready = "1";
}

guarded(main);
