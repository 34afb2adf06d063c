/* headwise long-document view. Self-contained: no library, no network. Runs before the per-head
 * blocks are parsed, so the grid (thumbnails in the JSON header) paints first; a head's map,
 * received mass, top keys and exact rows are inflated (DecompressionStream) when it is opened.
 * Token text is only ever set with textContent. window.headwiseLong exposes state and helpers
 * for scripting and tests. */
(function () {
  "use strict";
  const META = JSON.parse(document.getElementById("hl-meta").textContent);
  const L = META.layers.length, H = META.heads, N = META.n, NB = META.blocks;
  const MB = META.mapBlocks, K = META.topk, DEC = META.decades;
  const BLUES = [[247, 251, 255], [222, 235, 247], [198, 219, 239], [158, 202, 225],
    [107, 174, 214], [66, 146, 198], [33, 113, 181], [8, 81, 156], [8, 48, 107]];
  const SCORES = Object.keys(META.scores);
  const init = META.initial;
  const S = { layer: init.layer, head: init.head, sort: init.sort, desc: true,
    qblock: NB - 1, colour: "received", tile: META.tiles.length ? 0 : null, row: -1 };
  const hw = { meta: META, state: S, errors: [], dataLoaded: false, lastDraw: {} };
  window.headwiseLong = hw;
  let resolveReady, resolveData;
  hw.ready = new Promise((r) => { resolveReady = r; });
  const dataPromise = new Promise((r) => { resolveData = r; });
  hw.dataLoadedPromise = dataPromise;

  // ------------------------------------------------------------------ helpers
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else if (v !== null && v !== undefined && v !== false) e.setAttribute(k, v === true ? "" : v);
    }
    for (const kid of kids) if (kid !== null && kid !== undefined) e.append(kid);
    return e;
  }
  const LUT = (() => {
    const out = new Uint8ClampedArray(256 * 3);
    for (let v = 0; v < 256; v++) {
      const t = v / 255 * (BLUES.length - 1), i = Math.min(BLUES.length - 2, Math.floor(t)), f = t - i;
      for (let c = 0; c < 3; c++) out[v * 3 + c] = BLUES[i][c] * (1 - f) + BLUES[i + 1][c] * f;
    }
    return out;
  })();
  const css = (q) => `rgb(${LUT[q * 3]},${LUT[q * 3 + 1]},${LUT[q * 3 + 2]})`;
  const logValue = (q, top) => (q > 0 ? top * Math.pow(10, (q - 1) / 254 * DEC - DEC) : 0);
  function logQ(v, top, decades) { // the page's own log scale for values it computes
    if (!(v > 0) || !(top > 0)) return 0;
    const t = (Math.log10(v / top) + decades) / decades;
    return t < 0 ? 0 : 1 + Math.round(Math.min(1, t) * 254);
  }
  function display(tok) {
    const t = String(tok).replace(/\n/g, "⏎").replace(/\t/g, "⇥");
    return t.trim() === "" ? "␣".repeat(Math.max(1, t.length)) : t;
  }
  const fmt = (v) => (v === null || v === undefined ? "–" : Math.abs(v) >= 100 ? v.toFixed(0)
    : Math.abs(v) >= 0.01 || v === 0 ? v.toFixed(3) : v.toExponential(1));
  const headName = (l, h) => `L${META.layers[l]} H${h}`;
  function b64bytes(s) {
    const bin = atob(s), out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  async function inflate(text) {
    const stream = new Blob([b64bytes(text.trim())]).stream()
      .pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer();
  }
  function paint(canvas, rows, cols, q) { // uint8 log-scale cells -> pixels
    canvas.width = cols; canvas.height = rows;
    const ctx = canvas.getContext("2d"), img = ctx.createImageData(cols, rows);
    for (let i = 0; i < rows * cols; i++) {
      const v = q[i] * 3;
      img.data[i * 4] = LUT[v]; img.data[i * 4 + 1] = LUT[v + 1];
      img.data[i * 4 + 2] = LUT[v + 2]; img.data[i * 4 + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
  }

  // ------------------------------------------------------------------ per-head data (lazy)
  let blocks = null;
  const cache = new Map();
  function block(key) {
    if (!blocks) {
      blocks = new Map();
      for (const s of document.querySelectorAll('script[type="application/octet-stream"]')) blocks.set(s.dataset.key, s);
    }
    const node = blocks.get(key);
    if (!node) throw new Error(`no stored data for ${key}`);
    return inflate(node.textContent);
  }
  function headData(l, h) {
    const key = `${l}/${h}`;
    if (!cache.has(key)) cache.set(key, (async () => {
      await dataPromise;
      const buf = await block(`m/${key}`);
      const nm = MB * MB, off = nm + N + ((4 - (nm + N) % 4) % 4);
      const d = { map: new Uint8Array(buf, 0, nm), recv: new Uint8Array(buf, nm, N),
        keys: new Int32Array(buf.slice(off, off + NB * K * 4)),
        mass: new Float32Array(buf.slice(off + NB * K * 4, off + NB * K * 8)), tiles: [] };
      if (META.tiles.length) d.tiles = parseTiles(await block(`t/${key}`));
      return d;
    })());
    if (cache.size > 64) cache.delete(cache.keys().next().value);
    return cache.get(key);
  }
  function parseTiles(buf) { // per tile: rowmax f32, counts u16, values u16, keys u16|u32
    const out = [], wide = N > 65536;
    let o = 0;
    for (const t of META.tiles) {
      const r = t.rows.length, rowmax = new Float32Array(buf.slice(o, o + 4 * r)); o += 4 * r;
      const counts = new Uint16Array(buf.slice(o, o + 2 * r)); o += 2 * r;
      let c = 0; for (const x of counts) c += x;
      const values = new Uint16Array(buf.slice(o, o + 2 * c)); o += 2 * c;
      const kb = wide ? 4 : 2;
      const keys = wide ? new Uint32Array(buf.slice(o, o + 4 * c)) : new Uint16Array(buf.slice(o, o + 2 * c));
      o += kb * c;
      out.push({ rowmax, counts, values, keys });
    }
    return out;
  }
  function tileRow(tile, row) { // dense weights of one exact row (row -1: mean of all rows)
    const w = new Float32Array(N), rows = row < 0 ? [...tile.counts.keys()] : [row];
    let start = 0; const starts = [];
    for (const c of tile.counts) { starts.push(start); start += c; }
    for (const r of rows) {
      const s = tile.rowmax[r] / 65535 / rows.length;
      for (let t = starts[r]; t < starts[r] + tile.counts[r]; t++) w[tile.keys[t]] += tile.values[t] * s;
    }
    return w;
  }

  // ------------------------------------------------------------------ page skeleton
  const ui = {};
  function build() {
    document.body.append(el("header", { class: "hl-head" },
      el("h1", { text: META.title }),
      el("p", { class: "hl-sub", text: `${N} tokens · ${L} layers × ${H} heads · blocks of ${META.block} tokens · masses on one log scale of ${DEC} decades` }),
      budgetNote()));
    ui.sort = el("select", { onchange: () => sortBy(ui.sort.value || null, S.desc) },
      el("option", { value: "", text: "layer order" }), ...SCORES.map((s) => el("option", { value: s, text: s })));
    ui.dir = el("button", { type: "button", text: "↓ high first", onclick: () => sortBy(S.sort, !S.desc) });
    ui.grid = el("div", { class: "hl-grid" });
    ui.title = el("h2", { class: "hl-title" });
    ui.scores = el("table", { class: "hl-scores" });
    ui.map = el("canvas", { class: "hl-map", width: 256, height: 256, onclick: mapClick });
    ui.dist = el("canvas", { class: "hl-dist", width: 420, height: 170 });
    ui.qb = el("input", { type: "range", min: 0, max: NB - 1, value: S.qblock, oninput: () => setQueryBlock(+ui.qb.value) });
    ui.qbLabel = el("span", { class: "hl-qb-label" });
    ui.colour = el("select", { onchange: () => setColour(ui.colour.value) },
      el("option", { value: "received", text: "received mass (every query)" }),
      el("option", { value: "topk", text: "top keys of the query block" }),
      META.tiles.length ? el("option", { value: "tile", text: "exact weights of a query row" }) : null);
    ui.topList = el("div", { class: "hl-toplist" });
    ui.tiles = tilesPanel();
    ui.strip = el("canvas", { class: "hl-strip", width: 1024, height: 14, onclick: stripClick });
    ui.status = el("div", { class: "hl-status", text: "hover a token" });
    ui.text = el("div", { class: "hl-text", onmouseover: textHover });
    document.body.append(el("main", { class: "hl-main" },
      el("section", { class: "hl-left" }, el("div", { class: "hl-controls" }, el("label", { text: "sort " }, ui.sort), ui.dir), ui.grid),
      el("section", { class: "hl-right" }, ui.title, ui.scores,
        el("div", { class: "hl-row" }, el("figure", {}, ui.map, el("figcaption", { text: "block map: query block (down) × key block (across); click a row to choose the query block" })),
          el("figure", {}, ui.dist, el("figcaption", { text: "distance profile: mass at query-key distance" }))),
        el("div", { class: "hl-controls" }, el("label", { text: "query block " }, ui.qb), ui.qbLabel),
        ui.topList, ui.tiles,
        el("div", { class: "hl-controls" }, el("label", { text: "colour the text by " }, ui.colour)))),
    el("section", { class: "hl-doc" }, ui.strip, ui.status, ui.text));
  }
  function budgetNote() {
    const b = META.budget;
    if (!b.coarsened && !b.over) return null;
    const rest = b.tileRest.length ? ` Exact rows keep their ${b.cap} largest weights per row (at most ${fmt(Math.max(...b.tileRest.flat(2)))} of a row's mass left out).` : "";
    return el("p", { class: "hl-budget", text: (b.over ? `This page exceeds its ${b.mb} MB budget even at its coarsest.` : `This page was coarsened to fit its ${b.mb} MB budget.`) + ` Block maps are shown in blocks of ${META.block * b.factor} tokens (profiled: ${META.block}).` + rest });
  }
  function tilesPanel() {
    if (!META.tiles.length) return null;
    ui.tileSel = el("select", { onchange: () => setTile(+ui.tileSel.value, -1) },
      ...META.tiles.map((t, i) => el("option", { value: i, text: `${t.label} (${t.rows.length} rows)` })));
    ui.rowSel = el("select", { onchange: () => setTile(S.tile, +ui.rowSel.value) });
    ui.tile = el("canvas", { class: "hl-tile", width: 1024, height: 64 });
    return el("div", { class: "hl-tiles" }, el("div", { class: "hl-controls" },
      el("label", { text: "exact rows " }, ui.tileSel), el("label", { text: " row " }, ui.rowSel)),
      ui.tile, el("div", { class: "hl-note", text: "exact weights (from the log-sum-exp) of each asked-for query row on every key; columns pooled by max" }));
  }
  function fillRows() {
    const t = META.tiles[S.tile];
    ui.rowSel.replaceChildren(el("option", { value: -1, text: "all rows (mean)" }),
      ...t.rows.map((p, i) => el("option", { value: i, text: `${p}: ${display(META.tokens[p])}` })));
    ui.rowSel.value = String(S.row);
  }
  function buildText() {
    const frag = document.createDocumentFragment();
    ui.spans = META.tokens.map((t, i) => { const s = el("span", { "data-i": i }); s.textContent = display(t); frag.append(s); return s; });
    ui.text.append(frag);
  }

  // ------------------------------------------------------------------ the grid
  let thumbs = null;
  async function loadThumbs() {
    const buf = new Uint8Array(await inflate(META.thumbs.data)), s = META.thumbs.size;
    thumbs = (l, h) => buf.subarray((l * H + h) * s * s, (l * H + h + 1) * s * s);
  }
  function order() {
    const cells = [];
    for (let l = 0; l < L; l++) for (let h = 0; h < H; h++) cells.push([l, h]);
    if (!S.sort) return cells;
    const sc = META.scores[S.sort], key = (c) => sc[c[0]][c[1]];
    return cells.sort((a, b) => { const x = key(a), y = key(b);
      if (x === null || y === null) return (x === null) - (y === null);
      return S.desc ? y - x : x - y; });
  }
  function renderGrid() {
    const s = META.thumbs.size, cells = order(), nodes = [];
    ui.grid.style.gridTemplateColumns = `repeat(${H}, 1fr)`;
    for (const [l, h] of cells) {
      const c = el("canvas", { class: "hl-thumb" });
      paint(c, s, s, thumbs(l, h));
      const score = S.sort ? META.scores[S.sort][l][h] : null;
      nodes.push(el("div", { class: "hl-cell" + (l === S.layer && h === S.head ? " hl-on" : ""), "data-layer": l, "data-head": h,
        title: SCORES.map((k) => `${k}: ${fmt(META.scores[k][l][h])}`).join("\n"), onclick: () => open(l, h) },
      c, el("span", { class: "hl-label", text: headName(l, h) + (S.sort ? ` ${fmt(score)}` : "") })));
    }
    ui.grid.replaceChildren(...nodes);
    hw.lastDraw.grid = { cells: nodes.length, sort: S.sort, desc: S.desc };
    return cells.map(([l, h]) => headName(l, h));
  }
  function sortBy(name, desc) {
    if (name !== null && !(name in META.scores)) throw new Error(`no score ${name}`);
    S.sort = name; S.desc = desc !== false;
    ui.sort.value = name || ""; ui.dir.textContent = S.desc ? "↓ high first" : "↑ low first";
    return renderGrid();
  }

  // ------------------------------------------------------------------ one head
  let drawing = Promise.resolve();
  function redraw() { drawing = drawing.then(drawHead).catch((e) => { hw.errors.push(String(e && e.stack || e)); }); return drawing; }
  function open(l, h) { S.layer = l; S.head = h; for (const c of ui.grid.children) c.classList.toggle("hl-on", +c.dataset.layer === l && +c.dataset.head === h); return redraw(); }
  function setQueryBlock(b) { S.qblock = Math.max(0, Math.min(NB - 1, b)); ui.qb.value = S.qblock; if (S.colour === "received") S.colour = "topk"; ui.colour.value = S.colour; return redraw(); }
  function setColour(mode) { S.colour = mode; ui.colour.value = mode; return redraw(); }
  function setTile(t, row) { S.tile = t; S.row = row; S.colour = "tile"; ui.colour.value = "tile"; fillRows(); return redraw(); }
  function mapClick(e) { const r = ui.map.getBoundingClientRect(); setQueryBlock(Math.floor((e.clientY - r.top) / r.height * NB)); }
  function stripClick(e) { const r = ui.strip.getBoundingClientRect(); scrollToToken(Math.floor((e.clientX - r.left) / r.width * N)); }
  function scrollToToken(i) { const s = ui.spans[Math.max(0, Math.min(N - 1, i))]; ui.text.scrollTop = s.offsetTop - ui.text.offsetTop - 40; }
  function textHover(e) {
    const i = e.target.dataset && e.target.dataset.i; if (i === undefined) return;
    const v = hw.lastDraw.values ? hw.lastDraw.values[i] : null;
    ui.status.textContent = `token ${i} “${display(META.tokens[i])}” · ${hw.lastDraw.colour}: ${fmt(v)}`;
  }
  async function drawHead() {
    const l = S.layer, h = S.head, d = await headData(l, h);
    ui.title.textContent = `Layer ${META.layers[l]}, head ${h}`;
    ui.scores.replaceChildren(el("tr", {}, ...SCORES.map((k) => el("th", { text: k }))),
      el("tr", {}, ...SCORES.map((k) => el("td", { text: fmt(META.scores[k][l][h]) }))));
    drawMap(d); drawDistance(l, h);
    const lo = S.qblock * META.block, hi = Math.min(N, lo + META.block) - 1;
    ui.qbLabel.textContent = `${S.qblock}: tokens ${lo}–${hi}`;
    const top = topKeys(d);
    ui.topList.replaceChildren(el("span", { text: `top keys of block ${S.qblock}: ` }),
      ...top.map(([j, m]) => el("button", { type: "button", class: "hl-key", text: `${j} “${display(META.tokens[j])}” ${fmt(m)}`, onclick: () => scrollToToken(j) })));
    if (ui.tile) drawTile(d);
    colourText(d, top, lo, hi);
    hw.lastDraw.head = { layer: l, head: h, qblock: S.qblock, colour: S.colour, top: top.map((t) => t[0]) };
  }
  function topKeys(d) {
    const out = [];
    for (let t = 0; t < K; t++) { const j = d.keys[S.qblock * K + t]; if (j >= 0) out.push([j, d.mass[S.qblock * K + t]]); }
    return out;
  }
  function drawMap(d) {
    const off = document.createElement("canvas"); paint(off, MB, MB, d.map);
    const ctx = ui.map.getContext("2d"), W = ui.map.width;
    ctx.imageSmoothingEnabled = false; ctx.clearRect(0, 0, W, W); ctx.drawImage(off, 0, 0, W, W);
    const y = Math.floor(S.qblock * MB / NB) * W / MB;
    ctx.strokeStyle = "#e8590c"; ctx.lineWidth = 2; ctx.strokeRect(1, y, W - 2, Math.max(2, W / MB));
  }
  function drawDistance(l, h) {
    const v = META.distance[l][h], E = META.distanceEdges, ctx = ui.dist.getContext("2d");
    const W = ui.dist.width, Hh = ui.dist.height - 30, bw = W / v.length, top = Math.max(...v, 1e-12);
    ctx.clearRect(0, 0, W, ui.dist.height); ctx.font = "10px sans-serif"; ctx.textAlign = "center";
    v.forEach((m, b) => {
      const y = Hh * (1 - m / top); ctx.fillStyle = "#2171b5"; ctx.fillRect(b * bw + 1, y + 10, bw - 2, Hh - y);
      ctx.fillStyle = "#333"; ctx.fillText(E[b + 1] - E[b] > 1 ? `${E[b]}` : `${E[b]}`, b * bw + bw / 2, Hh + 24);
      if (m >= 0.005) ctx.fillText(m.toFixed(2), b * bw + bw / 2, y + 8);
    });
  }
  function drawTile(d) {
    if (S.tile === null) return;
    const tile = d.tiles[S.tile], rows = tile.counts.length, W = Math.min(1024, N), per = N / W;
    const q = new Uint8Array(rows * W);
    for (let r = 0; r < rows; r++) {
      const w = tileRow(tile, r), top = tile.rowmax[r];
      for (let j = 0; j < N; j++) { const x = Math.floor(j / per), v = logQ(w[j], top, 4); if (v > q[r * W + x]) q[r * W + x] = v; }
    }
    paint(ui.tile, rows, W, q);
  }
  function colourText(d, top, lo, hi) {
    let values, q;
    if (S.colour === "received") {
      values = Array.from(d.recv, (x) => logValue(x, META.recvTop)); q = d.recv;
    } else if (S.colour === "topk") {
      values = new Float32Array(N); for (const [j, m] of top) values[j] = m;
      const t = Math.max(...values); q = Array.from(values, (v) => logQ(v, t, 3));
    } else {
      values = tileRow(d.tiles[S.tile], S.row);
      const t = Math.max(...values); q = Array.from(values, (v) => logQ(v, t, 4));
    }
    const keys = new Set(top.map((t) => t[0])), rows = S.colour === "tile" ? new Set(S.row < 0 ? META.tiles[S.tile].rows : [META.tiles[S.tile].rows[S.row]]) : null;
    for (let i = 0; i < N; i++) {
      const s = ui.spans[i]; s.style.backgroundColor = q[i] ? css(q[i]) : "";
      s.style.color = q[i] > 170 ? "#fff" : "";
      s.classList.toggle("hl-top", S.colour === "topk" && keys.has(i));
      s.classList.toggle("hl-query", rows ? rows.has(i) : S.colour === "topk" && i >= lo && i <= hi);
    }
    const strip = new Uint8Array(ui.strip.width), per = N / strip.length;
    for (let i = 0; i < N; i++) { const x = Math.floor(i / per); if (q[i] > strip[x]) strip[x] = q[i]; }
    paint(ui.strip, 1, strip.length, strip);
    hw.lastDraw.values = values; hw.lastDraw.colour = S.colour;
  }

  // ------------------------------------------------------------------ scripting / tests
  Object.assign(hw, {
    sortBy, open, setQueryBlock, setColour, setTile,
    idle: () => drawing,
    highlighted: () => ui.spans.flatMap((s, i) => (s.classList.contains("hl-top") ? [i] : [])),
    received: async (l, h) => Array.from((await headData(l, h)).recv, (x) => logValue(x, META.recvTop)),
    tileRow: async (l, h, t, row) => Array.from(tileRow((await headData(l, h)).tiles[t], row)),
    textOf: (i) => ui.spans[i].textContent,
    _dataLoaded() { hw.dataLoaded = true; resolveData(); performance.mark("headwise-data"); },
  });
  window.addEventListener("error", (e) => hw.errors.push(String(e.message)));
  window.addEventListener("unhandledrejection", (e) => hw.errors.push(String(e.reason)));
  build();
  loadThumbs().then(() => {
    renderGrid(); performance.mark("headwise-grid");
    if (S.sort) sortBy(S.sort, true);
    buildText(); if (ui.tile) fillRows();
    return redraw();
  }).then(() => { performance.mark("headwise-ready"); resolveReady(true); })
    .catch((e) => { hw.errors.push(String(e && e.stack || e)); resolveReady(false); });
})();
