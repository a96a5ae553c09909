// lace explore: the page. Everything is drawn with DOM calls and textContent (no HTML from data).
"use strict";

const state = { info: null, query: null, inspect: null, selected: null, map: null };
const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

async function api(path, body) {
  const options = body === undefined ? {} : {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) };
  const response = await fetch(path, options);
  const payload = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (!response.ok) {
    showError(payload.error || `HTTP ${response.status}`);
    throw new Error(payload.error);
  }
  showError("");
  return payload;
}

function imageUrl(id) { return `/api/image/${Number(id)}`; }
function model() { return 0; }
function mapModel() { return Number($("map-model").value || 0); }

// ------------------------------------------------------------------ tabs
function openTab(name) {
  for (const tab of document.querySelectorAll(".tab")) tab.classList.toggle("active", tab.dataset.tab === name);
  for (const panel of document.querySelectorAll(".panel")) panel.hidden = panel.id !== `panel-${name}`;
  if (name === "map" && !state.map) loadMap();
  if (name === "compare") loadCompare();
}

// ------------------------------------------------------------------ grid and queries
async function search() {
  const result = await api(`/api/images?q=${encodeURIComponent($("search").value)}&limit=120`);
  const grid = $("grid");
  grid.replaceChildren();
  for (const item of result.items) {
    const figure = el("figure", { "data-id": item.id, title: item.caption, onclick: () => inspectImage(item.id) },
      el("img", { src: imageUrl(item.id), alt: item.caption, loading: "lazy" }), el("figcaption", {}, `#${item.id}`));
    if (item.id === state.selected) figure.classList.add("selected");
    grid.append(figure);
  }
}

async function inspect(query) {
  const payload = await api("/api/inspect", { model: model(), ...query });
  state.query = query;
  state.inspect = payload;
  state.selected = query.image ?? null;
  for (const figure of document.querySelectorAll(".grid figure"))
    figure.classList.toggle("selected", Number(figure.dataset.id) === state.selected);
  const box = $("query");
  box.replaceChildren();
  if (payload.image !== null) box.append(el("img", { src: imageUrl(payload.image), alt: "" }));
  box.append(el("div", {}, el("b", {}, payload.modality === "image" ? `image #${payload.image}` : "caption"),
    el("br"), payload.label));
  drawBars($("bars-query"), payload.bars || []);
  fillSources(payload.options || []);
  $("edit-result").hidden = true;
}

function inspectImage(id) { return inspect({ image: id }); }

// ------------------------------------------------------------------ bars
function drawBars(box, bars, reference) {
  box.replaceChildren();
  if (!bars.length) { box.append(el("span", {}, "no active atom")); return; }
  const top = Math.max(...bars.map((bar) => bar.weight), 1e-6);
  const before = new Map((reference || []).map((bar) => [bar.atom, bar.weight]));
  for (const bar of bars) {
    const changed = reference && Math.abs((before.get(bar.atom) || 0) - bar.weight) > 1e-3;
    const row = el("div", { class: `bar${bar.editable ? "" : " not-editable"}${changed ? " changed" : ""}`,
      "data-atom": bar.atom, title: `atom ${bar.atom}: ${bar.concept} (${bar.group}), aligned ${bar.aligned}, editable ${bar.editable}`,
      onclick: () => openAtom(bar.atom) },
      el("span", { class: "name" }, `${bar.concept} · ${bar.kind}${bar.editable ? "" : " (fixed)"} #${bar.atom}`),
      el("span", { class: "fill", style: `width:${Math.max(2, 160 * bar.weight / top)}px` }),
      el("span", { class: "value" }, bar.weight.toFixed(3)));
    box.append(row);
  }
}

// ------------------------------------------------------------------ edit form
function fillSources(options) {
  const form = $("edit-form");
  form.hidden = !options.length;
  const source = $("edit-source");
  source.replaceChildren(...options.map((option) => el("option", { value: option.concept },
    `${option.concept} (${option.group}, ${option.weight.toFixed(2)}${option.editable ? "" : ", weak"})`)));
  fillKinds();
}

function currentOption() {
  return (state.inspect.options || []).find((option) => option.concept === $("edit-source").value);
}

function fillKinds() {
  const option = currentOption();
  const kind = $("edit-kind");
  const previous = kind.value;
  const kinds = option ? Object.entries(option.targets)
    .filter(([name, targets]) => name === "attenuate" || targets.length).map(([name]) => name) : [];
  kind.replaceChildren(...kinds.map((name) => el("option", { value: name }, name)));
  if (kinds.includes(previous)) kind.value = previous;
  else if (kinds.includes("transplant")) kind.value = "transplant";
  fillTargets();
}

function fillTargets() {
  const option = currentOption();
  const targets = option ? option.targets[$("edit-kind").value] || [] : [];
  const select = $("edit-target");
  select.replaceChildren(...targets.map((name) => el("option", { value: name }, name)));
  select.disabled = !targets.length;
}

async function applyEdit(event) {
  event.preventDefault();
  const body = { model: model(), ...state.query, kind: $("edit-kind").value, source: $("edit-source").value,
    strength: Number($("edit-strength").value), k: 8 };
  if (!$("edit-target").disabled) body.target = $("edit-target").value;
  const result = await api("/api/edit", body);
  $("edit-result").hidden = false;
  const check = $("edit-check");
  check.replaceChildren(el("span", { class: result.passed_check ? "ok" : "fail" },
      `effect check ${result.passed_check ? "passed" : "failed"}`),
    ` · ${result.edit} at strength ${result.strength} · step ${result.record.step_size.toFixed(3)}` +
    ` · cosine to original: edit ${result.cosine_to_original.toFixed(3)}, random ${result.cosine_random_to_original.toFixed(3)}`);
  drawBars($("bars-before"), result.bars.before);
  drawBars($("bars-after"), result.bars.after, result.bars.before);
  drawBars($("bars-random"), result.bars.random, result.bars.before);
  for (const name of ["before", "after", "random"]) drawList(name, result);
}

function drawList(name, result) {
  const images = result.images[name], captions = result.captions[name];
  $(`share-${name}`).textContent = `'${result.concept}': images ${(100 * images.share).toFixed(0)}%, ` +
    `captions ${(100 * captions.share).toFixed(0)}%`;
  const thumbs = el("div", { class: "thumbs" },
    ...images.ids.map((id) => el("img", { src: imageUrl(id), alt: `image ${id}`, title: `image #${id}: inspect it`,
      "data-id": id, onclick: () => inspectImage(id).catch(() => {}) })));
  const list = el("ol", {}, ...captions.texts.map((text, i) => el("li", { "data-id": captions.ids[i],
    title: "inspect this caption", onclick: () => inspect({ caption_id: captions.ids[i] }).catch(() => {}) }, text)));
  $(`list-${name}`).replaceChildren(thumbs, list);
}

// ------------------------------------------------------------------ atoms
async function openAtom(atom) {
  openTab("atom");
  $("atom-id").value = atom;
  const page = await api(`/api/atom/${Number(atom)}?model=${model()}`);
  const box = $("atom-page");
  const top = Math.max(...page.histogram.image, ...page.histogram.text, 1);
  const bins = page.histogram.image.map((count, i) => [count, page.histogram.text[i]]);
  box.replaceChildren(
    el("h2", { id: "atom-title" }, `Atom ${page.atom} of ${page.n_atoms}: ${page.concept}`),
    el("table", {},
      el("tr", {}, el("th", {}, "type"), el("td", {}, `${page.kind} (${page.group})`)),
      el("tr", {}, el("th", {}, "alignment"), el("td", {},
        `${page.alignment.toFixed(3)} (tau_align ${page.tau_align.toFixed(3)}: ${page.aligned ? "aligned" : "not aligned"})`)),
      el("tr", {}, el("th", {}, "usage"), el("td", {},
        `${(100 * page.usage.image).toFixed(1)}% of images, ${(100 * page.usage.text).toFixed(1)}% of captions`))),
    el("h3", {}, "Non-zero codes (blue: images, orange: captions)"),
    el("div", { class: "hist" }, ...bins.flatMap(([image, text]) => [
      el("div", { style: `height:${80 * image / top}px`, title: `${image} images` }),
      el("div", { class: "text", style: `height:${80 * text / top}px`, title: `${text} captions` })])),
    el("h3", {}, "Images using it most"),
    el("div", { class: "atom-images" }, ...page.top_images.map((item) =>
      el("img", { src: imageUrl(item.id), title: `#${item.id} code ${item.code.toFixed(3)}: ${item.caption}`, alt: "" }))),
    el("h3", {}, "Captions using it most"),
    el("ol", {}, ...page.top_captions.map((item) => el("li", {}, `${item.text} (${item.code.toFixed(3)})`))),
    el("h3", {}, "Closest concept directions"),
    el("ol", { id: "atom-concepts" }, ...page.closest_concepts.map((item) =>
      el("li", {}, `${item.concept} (${item.kind}) cos ${item.cosine.toFixed(3)}`))));
}

// ------------------------------------------------------------------ geometry map
async function loadMap() {
  state.map = await api(`/api/map?model=${mapModel()}`);
  const map = state.map;
  for (const modality of ["image", "text"])
    $(`csv-${modality}`).href = `/api/neighbours.csv?modality=${modality}&model=${mapModel()}`;
  const drawn = map.item.length < map.n_items ? ` (${map.item.length} drawn: every hub and a sample)` : "";
  $("map-legend").textContent = `${map.method.toUpperCase()} of ${map.n_images} images (blue) and ` +
    `${map.n_items - map.n_images} captions (orange)${drawn}, each modality centred on its mean; red rings: hubs (in at least twice the mean number of the ` +
    `other side's top-${map.k} lists); dark outline: one-way top-1 neighbour. Click a point.`;
  drawMap();
}

function mapScale() {
  const map = state.map, canvas = $("map");
  const [minX, maxX] = [Math.min(...map.x), Math.max(...map.x)];
  const [minY, maxY] = [Math.min(...map.y), Math.max(...map.y)];
  const pad = 12;
  return (i) => [pad + (canvas.width - 2 * pad) * (map.x[i] - minX) / (maxX - minX || 1),
    pad + (canvas.height - 2 * pad) * (1 - (map.y[i] - minY) / (maxY - minY || 1))];
}

function drawMap(highlight = []) {
  const map = state.map, canvas = $("map"), context = canvas.getContext("2d");
  const at = mapScale();
  context.clearRect(0, 0, canvas.width, canvas.height);
  for (let i = 0; i < map.x.length; i++) {
    const [x, y] = at(i);
    context.fillStyle = map.item[i] < map.n_images ? "rgba(76,110,245,.7)" : "rgba(240,140,0,.6)";
    context.beginPath(); context.arc(x, y, map.hub[i] ? 4 : 2.5, 0, 2 * Math.PI); context.fill();
    if (map.one_way[i]) { context.strokeStyle = "rgba(30,30,30,.55)"; context.lineWidth = 0.8; context.stroke(); }
    if (map.hub[i]) { context.strokeStyle = "#c92a2a"; context.lineWidth = 1.5;
      context.beginPath(); context.arc(x, y, 6, 0, 2 * Math.PI); context.stroke(); }
  }
  for (const [i, colour] of highlight) {
    const [x, y] = at(i);
    context.strokeStyle = colour; context.lineWidth = 3;
    context.beginPath(); context.arc(x, y, 8, 0, 2 * Math.PI); context.stroke();
  }
}

async function clickMap(event) {
  const rect = $("map").getBoundingClientRect(), at = mapScale();
  const px = (event.clientX - rect.left) * $("map").width / rect.width;
  const py = (event.clientY - rect.top) * $("map").height / rect.height;
  let best = -1, bestDistance = Infinity;
  for (let i = 0; i < state.map.x.length; i++) {
    const [x, y] = at(i), distance = (x - px) ** 2 + (y - py) ** 2;
    if (distance < bestDistance) { best = i; bestDistance = distance; }
  }
  if (best >= 0) await openPoint(best);
}

async function openPoint(index) {
  const images = state.map.n_images, item = state.map.item[index];
  const modality = item < images ? "image" : "text", id = item < images ? item : item - images;
  const point = await api(`/api/point?modality=${modality}&id=${id}&model=${mapModel()}`);
  const drawnAt = new Map(state.map.item.map((global, i) => [global, i]));
  const at = (entry) => drawnAt.get(entry.modality === "image" ? entry.id : entry.id + images);
  const marks = (entries, colour) => entries.map((entry) => [at(entry), colour]).filter(([i]) => i !== undefined);
  drawMap([[index, "#000"], ...marks(point.forward, "#0ca678"), ...marks(point.reverse, "#be4bdb")]);
  const describe = (item) => `${item.modality} #${item.id}: ${item.label}`;
  $("point").replaceChildren(
    el("h2", { id: "point-title" }, `${modality === "image" ? "Image" : "Caption"} #${id}: ${point.label}`),
    el("p", {}, `${point.hub ? "A hub" : "Not a hub"}: ${point.why}.`,
      point.one_way ? " Its top-1 neighbour's own top-1 points elsewhere (one-way)." : " Its top-1 neighbour points back."),
    el("h3", {}, `Its top-${point.k} (green)`),
    el("ol", { id: "point-forward" }, ...point.forward.map((item) => el("li", {}, `${describe(item)} (${item.score.toFixed(3)})`))),
    el("h3", {}, `Listed by ${point.reverse.length} (purple)`),
    el("ol", { id: "point-reverse" }, ...point.reverse.slice(0, 50).map((item) => el("li", {}, describe(item)))));
}

// ------------------------------------------------------------------ compare
async function loadCompare() {
  const note = $("compare-note");
  if (state.info.models.length < 2) {
    note.textContent = "Start with a second model (--model2/--pretrained2) to compare two models side by side.";
  }
  if (state.selected === null) { note.textContent += " Pick an image first."; return; }
  const result = await api(`/api/compare/${state.selected}`);
  if (state.info.models.length >= 2) note.textContent = `Image #${result.image}: ${result.caption}`;
  const columns = result.models.map((entry, i) => {
    const bars = el("div", { class: "bars", id: `compare-bars-${i}` });
    if (entry.bars) drawBars(bars, entry.bars);
    return el("div", {}, el("h2", {}, entry.name),
      el("p", {}, `N_${entry.k} = ${entry.n_k}${entry.hub ? " (hub)" : ""}; ${entry.one_way ? "one-way" : "reciprocal"} top-1`),
      bars, el("h3", {}, "Nearest captions"),
      el("ol", {}, ...entry.captions.map((item) => el("li", { class: item.own ? "own" : "" }, item.text + (item.own ? " ✓" : "")))));
  });
  $("compare").replaceChildren(el("div", { class: "compare-grid" }, ...columns));
}

// ------------------------------------------------------------------ start
async function start() {
  state.info = await api("/api/info");
  const first = state.info.models[0];
  $("info").textContent = `${state.info.models.map((m) => m.name).join(" vs ")} · ${state.info.n_images} images · ` +
    `${state.info.n_captions} captions · ${first.atoms} atoms`;
  for (const tab of document.querySelectorAll(".tab")) tab.addEventListener("click", () => openTab(tab.dataset.tab));
  $("search").addEventListener("input", () => search().catch(() => {}));
  $("caption-form").addEventListener("submit", (event) => {
    event.preventDefault(); inspect({ caption: $("caption-input").value }).catch(() => {}); });
  $("edit-source").addEventListener("change", fillKinds);
  $("edit-kind").addEventListener("change", fillTargets);
  $("edit-strength").addEventListener("input", () => { $("edit-strength-value").textContent = $("edit-strength").value; });
  $("edit-form").addEventListener("submit", (event) => applyEdit(event).catch(() => {}));
  $("atom-form").addEventListener("submit", (event) => { event.preventDefault(); openAtom($("atom-id").value).catch(() => {}); });
  $("map").addEventListener("click", (event) => clickMap(event).catch(() => {}));
  $("map-model").replaceChildren(...state.info.models.map((m, i) => el("option", { value: i }, m.name)));
  $("map-model").addEventListener("change", () => { $("point").replaceChildren(); loadMap().catch(() => {}); });
  await search();
  document.body.dataset.ready = "1";
}

start().catch(() => {});
