/* headwise head view. Self-contained: no library, no network. Runs before the weight blocks are
 * parsed, so the model view (thumbnails from the JSON header) paints first; the detail view
 * inflates one head's weights (uint8 + per-row max, deflated, base64) when it is shown.
 * window.headwise exposes the state and a few helpers for scripting and tests. */
(function () {
  "use strict";
  const META = JSON.parse(document.getElementById("hw-meta").textContent);
  const KIND_ORDER = META.kindOrder; // every kind, in the order of headwise.kinds.KINDS
  const KINDS = KIND_ORDER.filter((k) => META.kinds[k]);
  const LEVELS = META.levels || 255;
  const ROW = 20, PAD = 10; // lines view: row height and top/bottom padding (CSS px)
  const ROLLOUT_JS_MAX = 256;
  const GEN_RGB = "#2b8a3e"; // generated tokens (after the prompt) // longest example whose rollout of a head subset is computed in the page
  const HEAD_COLOURS = ["#1f77b4", "#e8590c", "#2b8a3e", "#c92a2a", "#7048e8", "#8c564b",
    "#d6336c", "#5c677d", "#a68b00", "#0c8599", "#364fc7", "#5c940d"];
  const BLUES = [[247, 251, 255], [222, 235, 247], [198, 219, 239], [158, 202, 225],
    [107, 174, 214], [66, 146, 198], [33, 113, 181], [8, 81, 156], [8, 48, 107]];

  const maxHeads = Math.max(...KINDS.map((k) => Math.max(...META.kinds[k].heads.map((h) => h || 0))));
  const INITIAL = META.initial || { kind: KINDS[0], layer: firstLayer(KINDS[0]), head: 0 };
  const S = {
    kind: INITIAL.kind, example: 0, layer: INITIAL.layer, head: INITIAL.head, tab: "lines",
    // the lines view shows the selected head alone unless "all heads" is on (all at once is a hairball)
    allHeads: false,
    // thumbnails: "shared" = one colour scale for every head of the kind, "own" = each head's max
    thumbScale: META.thumbnailScale || "shared",
    active: new Array(maxHeads).fill(true), hover: null, cell: null, matrixMode: "head", gamma: 1,
    // colour scale of the matrix views: false = ÷ the matrix max, true = ÷ each row's max
    rowScale: { matrix: false, rollout: true },
    fusion: "mean", // rollout head fusion: mean (the paper), max or min
  };
  const hw = {
    meta: META, state: S, lastDraw: {}, dataLoaded: false, errors: [],
  };
  window.headwise = hw;
  let resolveReady;
  hw.ready = new Promise((r) => { resolveReady = r; });

  // ------------------------------------------------------------------ helpers
  function firstLayer(kind) {
    const i = META.kinds[kind].heads.findIndex((h) => h);
    return Math.max(0, i);
  }
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
  function headColour(h) {
    return h < HEAD_COLOURS.length ? HEAD_COLOURS[h] : `hsl(${(h * 47) % 360} 60% 42%)`;
  }
  function rgb(hex) {
    if (hex.startsWith("hsl")) {
      const c = document.createElement("canvas").getContext("2d");
      c.fillStyle = hex; hex = c.fillStyle;
    }
    const n = parseInt(hex.slice(1), 16);
    return [(n >> 16) & 255, (n >> 8) & 255, n & 255];
  }
  const HEAD_RGB = Array.from({ length: maxHeads }, (_, h) => rgb(headColour(h)));
  function lut(gamma) {
    const out = new Uint8ClampedArray(256 * 3);
    for (let v = 0; v < 256; v++) {
      const t = Math.pow(v / 255, gamma) * (BLUES.length - 1);
      const i = Math.min(BLUES.length - 2, Math.floor(t)), f = t - i;
      for (let c = 0; c < 3; c++) out[v * 3 + c] = BLUES[i][c] * (1 - f) + BLUES[i + 1][c] * f;
    }
    return out;
  }
  let LUT = lut(1);
  function display(tok) {
    const t = String(tok).replace(/\n/g, "⏎").replace(/\t/g, "⇥");
    return t.trim() === "" ? "␣".repeat(Math.max(1, t.length)) : t;
  }
  function tokensOf(side, b) { return META.tokens[side][b]; }
  function kindMeta() { return META.kinds[S.kind]; }
  function qTokens() { return tokensOf(kindMeta().query, S.example); }
  function kTokens() { return tokensOf(kindMeta().key, S.example); }
  function headsIn(layer) { return kindMeta().heads[layer] || 0; }
  /** grouped-query attention: query heads per key/value head (0: no grouping to show) */
  function groupOf(nHeads) { const g = kindMeta().kvHeads; return g ? nHeads / g : 0; }
  function groupTitle(k, per) { return `query heads H${k * per}–H${(k + 1) * per - 1} share key/value head ${k}`; }
  /** first generated token of a token side ("src"/"tgt") in this example, or null */
  function genStart(side) { const g = META.generatedStart; return g && side === "tgt" ? g[S.example] : null; }
  function activeHeads(layer) {
    const out = [];
    for (let h = 0; h < headsIn(layer); h++) if (S.active[h]) out.push(h);
    return out;
  }
  function fmt(x) {
    if (x === 0) return "0";
    const a = Math.abs(x);
    return a >= 0.01 ? x.toFixed(a >= 10 ? 1 : 3) : x.toExponential(1);
  }
  function setupCanvas(canvas, w, h) {
    const dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
    }
    canvas.style.width = w + "px"; canvas.style.height = h + "px";
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return ctx;
  }
  function fitText(ctx, text, width) {
    if (ctx.measureText(text).width <= width) return text;
    let lo = 0, hi = text.length;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (ctx.measureText(text.slice(0, mid) + "…").width <= width) lo = mid; else hi = mid - 1;
    }
    return text.slice(0, lo) + "…";
  }
  function b64bytes(s) {
    if (Uint8Array.fromBase64) return Uint8Array.fromBase64(s);
    const bin = atob(s), out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  // ------------------------------------------------------------------ weights (lazy, cached)
  let blocks = null;
  const cache = new Map(); // key -> Promise<Mat>, least recently used first
  const CACHE_LIMIT = 160;
  function matrix(key, nq, nk) {
    if (cache.has(key)) { const p = cache.get(key); cache.delete(key); cache.set(key, p); return p; }
    if (!blocks) {
      blocks = new Map();
      for (const s of document.querySelectorAll('script[type="application/octet-stream"]')) {
        blocks.set(s.dataset.key, s);
      }
    }
    const node = blocks.get(key);
    if (!node) return Promise.reject(new Error(`no stored weights for ${key}`));
    const p = (async () => {
      const raw = b64bytes(node.textContent.trim());
      const stream = new Blob([raw]).stream().pipeThrough(new DecompressionStream("deflate"));
      const buf = await new Response(stream).arrayBuffer();
      if (buf.byteLength !== nq * 4 + nq * nk) throw new Error(`bad block ${key}: ${buf.byteLength} bytes`);
      return makeMat(new Float32Array(buf.slice(0, nq * 4)), new Uint8Array(buf, nq * 4), nq, nk);
    })();
    cache.set(key, p);
    // keep at most ~256 MB of decoded heads (uint8 + a float32 copy once drawn as a matrix)
    const limit = Math.max(16, Math.min(CACHE_LIMIT, Math.floor(256e6 / (5 * nq * nk + 1))));
    while (cache.size > limit) cache.delete(cache.keys().next().value);
    return p;
  }
  function makeMat(rowmax, q, nq, nk) {
    const m = { nq, nk, rowmax, q, _dense: null, _top: null };
    m.w = (i, j) => q[i * nk + j] * rowmax[i] / LEVELS;
    m.dense = () => {
      if (!m._dense) {
        const d = new Float32Array(nq * nk);
        for (let i = 0; i < nq; i++) {
          const s = rowmax[i] / LEVELS, o = i * nk;
          for (let j = 0; j < nk; j++) d[o + j] = q[o + j] * s;
        }
        m._dense = d;
      }
      return m._dense;
    };
    m.top = (k) => { // per query row, the k keys with the largest weight
      if (m._top && m._top.k === k) return m._top.idx;
      const idx = new Int32Array(nq * k).fill(-1);
      for (let i = 0; i < nq; i++) {
        const o = i * nk, best = idx.subarray(i * k, i * k + k);
        for (let j = 0; j < nk; j++) {
          const v = q[o + j];
          if (v === 0) continue;
          let pos = k - 1;
          if (best[pos] >= 0 && q[o + best[pos]] >= v) continue;
          while (pos > 0 && (best[pos - 1] < 0 || q[o + best[pos - 1]] < v)) { best[pos] = best[pos - 1]; pos--; }
          best[pos] = j;
        }
      }
      m._top = { k, idx };
      return idx;
    };
    return m;
  }
  function headMatrix(kind, b, l, h) {
    const km = META.kinds[kind];
    return matrix(`w/${kind}/${b}/${l}/${h}`, tokensOf(km.query, b).length, tokensOf(km.key, b).length);
  }
  function rolloutMatrix(kind, b, l) {
    const n = tokensOf(META.kinds[kind].query, b).length;
    return matrix(`r/${kind}/${b}/${l}`, n, n);
  }

  // ------------------------------------------------------------------ layout
  const ui = {};
  function build() {
    const first = META.kinds[KINDS[0]];
    const nLayers = first.heads.length;
    const app = el("div", { class: "hw-app" });
    const kindSeg = el("div", { class: "hw-seg", id: "hw-kind", role: "group", "aria-label": "attention kind" });
    for (const k of KIND_ORDER) {
      const present = !!META.kinds[k];
      const label = META.kindShort[k];
      kindSeg.append(el("button", {
        "data-kind": k, disabled: !present, title: present ? META.kinds[k].label : `${label}: not in this model`,
        onclick: () => setKind(k), text: label,
      }));
    }
    const exSel = el("select", { id: "hw-example", onchange: (e) => setExample(+e.target.value) });
    for (let b = 0; b < META.examples; b++) {
      const side = META.kinds[KINDS[0]].query;
      const preview = tokensOf(side, b).slice(0, 8).map(display).join(" ");
      exSel.append(el("option", { value: b, text: `#${b}: ${preview}${tokensOf(side, b).length > 8 ? " …" : ""}` }));
    }
    const gammaSeg = el("div", { class: "hw-seg", id: "hw-gamma", role: "group", "aria-label": "contrast" },
      el("button", { "data-gamma": "1", onclick: () => setGamma(1), text: "linear", title: "colour ∝ weight" }),
      el("button", { "data-gamma": "0.5", onclick: () => setGamma(0.5), text: "√", title: "colour ∝ √weight: shows small weights" }));
    const sub = KINDS.map((k) => {
      const km = META.kinds[k];
      return `${km.label}: ${km.heads.length} layers × ${Math.max(...km.heads.map((h) => h || 0))} heads`;
    }).join(" · ") + (META.generatedStart ? " · green tokens were generated after the prompt" : "") +
      KINDS.filter((k) => META.kinds[k].kvHeads).map((k) => ` · ${META.kinds[k].kvHeads} key/value heads (grouped-query)`).slice(0, 1).join("");
    app.append(el("header", { class: "hw-header" },
      el("div", {}, el("h1", { text: META.title }), el("div", { class: "hw-sub", text: `${sub} · batch of ${META.examples}` })),
      el("div", { class: "hw-controls" },
        el("div", { class: "hw-field" }, el("span", { class: "hw-label", text: "Attention" }), kindSeg),
        el("div", { class: "hw-field" }, el("label", { class: "hw-label", for: "hw-example", text: "Example" }), exSel),
        el("div", { class: "hw-field" }, el("span", { class: "hw-label", text: "Contrast" }), gammaSeg))));

    ui.grid = el("div", { class: "hw-grid", id: "hw-grid" });
    ui.gridNote = el("div", { class: "hw-note" });
    ui.thumbScale = el("div", { class: "hw-seg", id: "hw-thumb-scale", role: "group", "aria-label": "thumbnail colour scale" },
      el("button", { "data-scale": "shared", onclick: () => setThumbScale("shared"), text: "shared scale", title: "every thumbnail of this kind on one scale: 0 to the largest weight of any head (a flat head looks flat)" }),
      el("button", { "data-scale": "own", onclick: () => setThumbScale("own"), text: "own max", title: "each thumbnail scaled to its own largest weight (shows the shape of weak heads)" }));
    ui.gridHint = el("p", { class: "hw-hint" });
    const model = el("section", { class: "hw-panel hw-model", "aria-label": "model view" },
      el("div", { class: "hw-panel-head" }, el("h2", { text: "Model view" }),
        el("div", { class: "hw-field" }, el("span", { class: "hw-label", text: "Thumbnails" }), ui.thumbScale)),
      ui.gridHint,
      el("div", { class: "hw-grid-wrap", id: "hw-grid-wrap" }, ui.grid), ui.gridNote);

    ui.title = el("h2", { id: "hw-detail-title" });
    ui.tabs = el("div", { class: "hw-seg hw-tabs", role: "tablist" });
    for (const [t, label] of [["lines", "Lines"], ["matrix", "Matrix"], ["rollout", "Rollout"]]) {
      ui.tabs.append(el("button", { "data-tab": t, role: "tab", onclick: () => setTab(t), text: label }));
    }
    ui.heads = el("div", { class: "hw-heads", id: "hw-heads" });
    ui.linesCanvas = el("canvas", { id: "hw-lines-canvas" });
    ui.linesSpacer = el("div");
    ui.linesScroll = el("div", { class: "hw-scroll", id: "hw-lines-scroll" }, ui.linesCanvas, ui.linesSpacer);
    ui.linesCaption = el("p", { class: "hw-caption" });
    ui.linesHead = el("div", { class: "hw-lines-head" }, el("span", { text: "query (attends from)" }), el("span", { text: "key (attended to)" }));
    ui.headMode = el("div", { class: "hw-seg", id: "hw-headmode", role: "group", "aria-label": "heads drawn" },
      el("button", { "data-all": "0", onclick: () => setAllHeads(false), text: "one head", title: "draw the selected head alone (click a grid cell or a head label to pick it)" }),
      el("button", { "data-all": "1", onclick: () => setAllHeads(true), text: "all heads", title: "draw every active head of the layer, one colour each" }));
    ui.lines = el("div", { class: "hw-view", id: "hw-lines" },
      el("div", { class: "hw-toolbar" }, el("span", { class: "hw-label", text: "Show" }), ui.headMode),
      ui.linesCaption, ui.linesHead, ui.linesScroll);

    ui.matrixCanvas = el("canvas", { id: "hw-matrix-canvas" });
    ui.matrixBox = el("div", { class: "hw-matrix-box" }, ui.matrixCanvas);
    ui.matrixMode = el("div", { class: "hw-seg", id: "hw-matrix-mode" },
      el("button", { "data-mode": "head", onclick: () => setMatrixMode("head"), text: "selected head" }),
      el("button", { "data-mode": "mean", onclick: () => setMatrixMode("mean"), text: "mean of active heads" }));
    ui.matrixBar = colorbar();
    ui.matrixCaption = el("p", { class: "hw-caption" });
    ui.matrix = el("div", { class: "hw-view", id: "hw-matrix" },
      el("div", { class: "hw-toolbar" }, el("span", { class: "hw-label", text: "Show" }), ui.matrixMode,
        el("span", { class: "hw-label", text: "Colour" }), scaleSeg("matrix")),
      ui.matrixCaption, ui.matrixBox, ui.matrixBar.node);

    ui.rollCanvas = el("canvas", { id: "hw-rollout-canvas" });
    ui.rollBox = el("div", { class: "hw-matrix-box" }, ui.rollCanvas);
    ui.rollBar = colorbar();
    ui.rollCaption = el("p", { class: "hw-caption" });
    ui.rollMessage = el("div", { class: "hw-message" });
    ui.rollFusion = el("div", { class: "hw-seg", id: "hw-fusion", title: "how the heads of a layer are fused before rolling out" },
      ...["mean", "max", "min"].map((f) => el("button", { "data-fusion": f, onclick: () => setFusion(f), text: f })));
    ui.rollTools = el("div", { class: "hw-toolbar" }, el("span", { class: "hw-label", text: "Heads fused by" }), ui.rollFusion,
      el("span", { class: "hw-label", text: "Colour" }), scaleSeg("rollout"));
    ui.rollout = el("div", { class: "hw-view", id: "hw-rollout" }, ui.rollTools, ui.rollCaption, ui.rollMessage, ui.rollBox, ui.rollBar.node);

    ui.readout = el("div", { class: "hw-readout", id: "hw-readout" });
    const detail = el("section", { class: "hw-panel hw-detail", "aria-label": "detail view" },
      el("div", { class: "hw-panel-head" }, ui.title, ui.tabs), ui.heads, ui.lines, ui.matrix, ui.rollout, ui.readout);
    ui.tip = el("div", { class: "hw-tip", id: "hw-tip" });
    app.append(el("main", { class: "hw-main" }, model, detail), ui.tip);
    document.body.prepend(app);
    sizeThumbs();

    let scrollQueued = false; // one redraw per frame however many scroll events arrive
    ui.linesScroll.addEventListener("scroll", () => {
      if (scrollQueued) return;
      scrollQueued = true;
      requestAnimationFrame(() => { scrollQueued = false; drawLines(); });
    });
    ui.linesCanvas.addEventListener("mousemove", onLinesMove);
    ui.linesCanvas.addEventListener("mouseleave", () => setHover(null));
    for (const [canvas, which] of [[ui.matrixCanvas, "matrix"], [ui.rollCanvas, "rollout"]]) {
      canvas.addEventListener("mousemove", (e) => onMatrixMove(e, which));
      canvas.addEventListener("mouseleave", () => { S.cell = null; ui.tip.style.display = "none"; setHover(null); });
    }
    window.addEventListener("resize", () => { sizeThumbs(); fitThumbs(); scheduleDetail(); });
  }
  /** Smaller thumbnails until every head's column fits the model view's panel (SmolLM2's 9
   * heads and 3 group gaps overflowed it at 1400 px, hiding H8); a grid that still does not fit
   * at MIN_THUMB px (a dozen heads and more) scrolls. */
  const MIN_THUMB = 26; // the importance value under a thumbnail still fits on one line
  function fitThumbs() {
    const wrap = document.getElementById("hw-grid-wrap");
    if (!wrap || !wrap.clientWidth) return;
    const room = () => wrap.clientWidth - 4; // the wrap's 2 px padding on each side
    let px = parseFloat(getComputedStyle(document.documentElement).getPropertyValue("--thumb")) || 64;
    const wide = () => Math.max(ui.grid.offsetWidth, ui.grid.scrollWidth); // chips may overhang
    while (px > MIN_THUMB && wide() > room()) {
      px -= 1;
      document.documentElement.style.setProperty("--thumb", px + "px");
    }
    hw.lastDraw.thumb = px;
  }
  function sizeThumbs() { // the grid takes about a third of the window, the detail view the rest
    const heads = Math.max(...kindMeta().heads.map((h) => h || 0));
    const gaps = Math.max(0, (kindMeta().kvHeads || 1) - 1) * 10; // the key/value groups' gap columns
    const avail = Math.max(200, (window.innerWidth || 1400) * 0.31 - 80 - gaps);
    const px = Math.max(30, Math.min(64, Math.floor(avail / heads) - 10));
    document.documentElement.style.setProperty("--thumb", px + "px");
  }

  function scaleSeg(view) {
    return el("div", { class: "hw-seg hw-scale", "data-view": view },
      el("button", { "data-row": "0", onclick: () => setRowScale(view, false), text: "÷ matrix max", title: "one colour scale for the whole matrix" }),
      el("button", { "data-row": "1", onclick: () => setRowScale(view, true), text: "÷ row max", title: "each query row scaled to its own largest value" }));
  }
  function colorbar() {
    const canvas = el("canvas", { width: 180, height: 10 });
    const lo = el("span", { text: "0" }), hi = el("span");
    const label = el("span", { text: "" });
    return { node: el("div", { class: "hw-colorbar" }, label, lo, canvas, hi), canvas, hi, label };
  }
  function paintColorbar(bar, max, label) {
    const ctx = bar.canvas.getContext("2d");
    const img = ctx.createImageData(180, 10);
    for (let x = 0; x < 180; x++) {
      const v = Math.round((x / 179) * 255);
      for (let y = 0; y < 10; y++) {
        const o = (y * 180 + x) * 4;
        img.data[o] = LUT[v * 3]; img.data[o + 1] = LUT[v * 3 + 1]; img.data[o + 2] = LUT[v * 3 + 2]; img.data[o + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
    bar.hi.textContent = fmt(max);
    bar.label.textContent = label;
  }

  // ------------------------------------------------------------------ model view (grid)
  let observer = null;
  function renderGrid() {
    const km = kindMeta();
    const nLayers = km.heads.length, nHeads = Math.max(...km.heads.map((h) => h || 0));
    const per = groupOf(nHeads); // a thin gap column before each key/value head's group but the first
    const gap = (h) => (per && h > 0 && h % per === 0 ? [el("div", { class: "hw-gap" })] : []);
    ui.grid.replaceChildren();
    ui.grid.style.gridTemplateColumns = per
      ? "auto " + Array.from({ length: km.kvHeads }, (_, k) => (k ? "4px " : "") + `repeat(${per}, var(--thumb))`).join(" ")
      : `auto repeat(${nHeads}, var(--thumb))`;
    if (per) { // one header over each key/value head's query heads
      ui.grid.append(el("div", { class: "hw-corner", text: "key/value head" }));
      for (let k = 0; k < km.kvHeads; k++) {
        ui.grid.append(...gap(k * per), el("div", { class: "hw-group", "data-kv": k, style: `grid-column: span ${per}`, title: groupTitle(k, per), text: `KV${k}` }));
      }
    }
    ui.grid.append(el("div", { class: "hw-corner", text: "layer \\ head" }));
    for (let h = 0; h < nHeads; h++) ui.grid.append(...gap(h), headChip(h, "grid"));
    const imp = km.importance;
    let impMax = 0;
    if (imp) for (const row of imp) for (const v of row) if (v !== null) impMax = Math.max(impMax, Math.abs(v));
    const thumbs = km.thumbs[S.example];
    thumbTop = sharedThumbMax();
    ui.gridHint.textContent = "Rows = layers, columns = heads; thumbnails are max-pooled and coloured " +
      (S.thumbScale === "shared" ? `on one scale for all heads (0 to ${fmt(thumbTop)}, the largest weight of any head)` : "each to its own largest weight") +
      ". Click a cell to show that head alone; click a head label to switch it on/off, double-click to keep only it." +
      (km.kvHeads ? ` Grouped-query attention: the ${nHeads} query heads share ${km.kvHeads} key/value heads; each KV column group reads the same keys and values.` : "");
    const cells = [];
    for (let l = 0; l < nLayers; l++) {
      ui.grid.append(el("div", { class: "hw-rowlab", text: `L${l}` }));
      for (let h = 0; h < nHeads; h++) {
        ui.grid.append(...gap(h));
        const recorded = km.heads[l] !== null, exists = recorded && h < km.heads[l];
        const cell = el("div", {
          class: "hw-cell" + (exists ? "" : " hw-empty"), "data-layer": l, "data-head": h,
          title: exists ? `layer ${l}, head ${h}` + (imp && imp[l][h] !== null ? ` · importance ${fmt(imp[l][h])}` : "") : "",
        });
        if (!exists) {
          cell.append(el("div", { class: "hw-missing", text: recorded ? "pruned" : "not recorded" }));
        } else {
          const canvas = el("canvas", { "data-thumb": thumbs[l][h] });
          cell.append(canvas);
          cell.tabIndex = 0; // keyboard: Tab to a cell, Enter/Space to inspect it
          cell.setAttribute("role", "button");
          cell.setAttribute("aria-label", `layer ${l}, head ${h}`);
          cell.addEventListener("click", () => select(l, h));
          cell.addEventListener("keydown", (e) => {
            if (e.key === "Enter" || e.key === " ") { e.preventDefault(); select(l, h); }
          });
          cells.push(canvas);
          if (imp) {
            const v = imp[l][h];
            const pct = v === null || impMax === 0 ? 0 : (Math.abs(v) / impMax) * 100;
            cell.append(el("div", { class: "hw-imp" },
              el("div", { class: "hw-imp-bar" }, el("span", { style: `width:${pct.toFixed(1)}%` })),
              // one format for the whole grid, chosen in Python (viz/head_view.py: score_labels)
              el("span", { class: "hw-imp-val", text: v === null ? "–" : km.importanceLabels[l][h], title: v === null ? "no score" : `importance ${v}` })));
          }
        }
        ui.grid.append(cell);
      }
    }
    ui.gridNote.textContent = imp
      ? "Bars under each head: importance score ÷ the largest score of this attention kind (value shown)." +
        (META.importanceMethod ? ` Importance: ${META.importanceMethod}.` : " How these scores were made is not recorded.")
      : "";
    if (observer) observer.disconnect();
    if (cells.length <= 256 || !("IntersectionObserver" in window)) {
      for (const c of cells) drawThumb(c);
    } else { // big grids: draw thumbnails as they scroll into view
      observer = new IntersectionObserver((entries) => {
        for (const e of entries) if (e.isIntersecting) { drawThumb(e.target); observer.unobserve(e.target); }
      }, { root: document.getElementById("hw-grid-wrap"), rootMargin: "200px" });
      for (const c of cells) observer.observe(c);
    }
    hw.lastDraw.grid = { cells: cells.length, layers: nLayers, heads: nHeads, scale: S.thumbScale, top: thumbTop, kvHeads: km.kvHeads || null };
    refreshGridClasses();
    fitThumbs();
    fitImportanceLabels();
  }
  /** Importance values stay on one line inside their cell: smaller type, then fewer digits. */
  function fitImportanceLabels() {
    for (const label of ui.grid.querySelectorAll(".hw-imp-val")) {
      const fits = () => label.scrollWidth <= label.clientWidth + 0.5;
      const shrink = (smallest) => {
        for (let px = 10; px >= smallest; px -= 0.5) { label.style.fontSize = px + "px"; if (fits()) return true; }
        return false;
      };
      const v = Number(label.title.replace("importance ", ""));
      // all digits down to 8.5 px; then the compact form (the full value stays in the tooltip)
      if (!shrink(8.5) && Number.isFinite(v)) { label.textContent = compact(v); shrink(7); }
    }
  }
  function compact(x) { // 2 significant characters at most: 0.0065 -> "7e-3", 12.3 -> "12"
    if (x === 0) return "0";
    const a = Math.abs(x);
    if (a >= 1 && a < 100) return String(Math.round(x));
    if (a >= 0.1 && a < 1) return x.toFixed(1).replace(/^(-?)0\./, "$1.");
    const e = Math.floor(Math.log10(a)), m = Math.round(x / Math.pow(10, e));
    return `${m}e${e}`;
  }
  function parseThumb(spec) { // "{rows}x{cols}:{max}:{base64}", values ÷ the thumbnail's own max
    const a = spec.indexOf(":"), b = spec.indexOf(":", a + 1);
    const [r, c] = spec.slice(0, a).split("x").map(Number);
    return { r, c, max: Number(spec.slice(a + 1, b)), data: spec.slice(b + 1) };
  }
  function sharedThumbMax() { // the largest weight of any head of this kind and example
    let top = 0;
    for (const layer of kindMeta().thumbs[S.example]) {
      if (layer) for (const spec of layer) top = Math.max(top, parseThumb(spec).max);
    }
    return top;
  }
  let thumbTop = 1;
  function drawThumb(canvas) {
    const t = parseThumb(canvas.dataset.thumb), r = t.r, c = t.c;
    const q = b64bytes(t.data);
    const f = S.thumbScale === "shared" && thumbTop > 0 ? t.max / thumbTop : 1;
    canvas.width = c; canvas.height = r;
    const ctx = canvas.getContext("2d"), img = ctx.createImageData(c, r);
    for (let i = 0; i < q.length; i++) {
      const v = Math.round(q[i] * f) * 3, o = i * 4;
      img.data[o] = LUT[v]; img.data[o + 1] = LUT[v + 1]; img.data[o + 2] = LUT[v + 2]; img.data[o + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
    canvas.dataset.drawn = "1";
  }
  function headChip(h, where) {
    return el("button", {
      class: "hw-chip", "data-head": h, "data-where": where, "aria-pressed": String(S.active[h]),
      title: "click: show/hide this head · double-click: show only this head",
      onclick: (e) => {
        if (where === "detail" && S.tab === "lines" && !S.allHeads) pickHead(h);
        else if (e.detail <= 1) toggleHead(h);
      },
      ondblclick: () => solo(h),
    }, el("span", { class: "hw-dot", style: `background:${headColour(h)}` }), `H${h}`);
  }
  function refreshGridClasses() {
    for (const cell of ui.grid.querySelectorAll(".hw-cell")) {
      const l = +cell.dataset.layer, h = +cell.dataset.head;
      cell.classList.toggle("hw-selected", l === S.layer && h === S.head);
      cell.classList.toggle("hw-off", !S.active[h]);
    }
    const picking = S.tab === "lines" && !S.allHeads;
    for (const chip of document.querySelectorAll(".hw-chip")) {
      const h = +chip.dataset.head;
      chip.setAttribute("aria-pressed", String(picking && chip.dataset.where === "detail" ? h === S.head : S.active[h]));
    }
  }

  // ------------------------------------------------------------------ detail view
  function renderDetailChrome() {
    const km = kindMeta();
    ui.title.textContent = S.tab === "lines" ? (S.allHeads ? `Layer ${S.layer} · all active heads` : `Layer ${S.layer} · head ${S.head}`)
      : S.tab === "rollout" ? `Rollout through layer ${S.layer}`
        : S.matrixMode === "mean" ? `Layer ${S.layer} · mean of active heads` : `Layer ${S.layer} · head ${S.head}`;
    for (const b of ui.rollFusion.children) b.setAttribute("aria-pressed", String(b.dataset.fusion === S.fusion));
    for (const b of ui.tabs.children) b.setAttribute("aria-pressed", String(b.dataset.tab === S.tab));
    ui.heads.replaceChildren(el("span", { class: "hw-label", text: "Heads" }));
    const per = groupOf(headsIn(S.layer));
    for (let h = 0; h < headsIn(S.layer); h++) {
      if (per && h % per === 0) ui.heads.append(el("span", { class: "hw-kv-label", title: groupTitle(h / per, per), text: `KV${h / per}` }));
      ui.heads.append(headChip(h, "detail"));
    }
    for (const b of ui.headMode.children) b.setAttribute("aria-pressed", String((b.dataset.all === "1") === S.allHeads));
    for (const b of ui.thumbScale.children) b.setAttribute("aria-pressed", String(b.dataset.scale === S.thumbScale));
    ui.lines.hidden = S.tab !== "lines";
    ui.matrix.hidden = S.tab !== "matrix";
    ui.rollout.hidden = S.tab !== "rollout";
    for (const b of ui.matrixMode.children) b.setAttribute("aria-pressed", String(b.dataset.mode === S.matrixMode));
    for (const seg of document.querySelectorAll(".hw-scale")) {
      for (const b of seg.children) b.setAttribute("aria-pressed", String((b.dataset.row === "1") === S.rowScale[seg.dataset.view]));
    }
    for (const b of document.querySelectorAll("#hw-kind button")) b.setAttribute("aria-pressed", String(b.dataset.kind === S.kind));
    for (const b of document.querySelectorAll("#hw-gamma button")) b.setAttribute("aria-pressed", String(+b.dataset.gamma === S.gamma));
    document.getElementById("hw-example").value = String(S.example);
    const nq = qTokens().length, nk = kTokens().length;
    ui.linesCaption.textContent = `${km.label}, layer ${S.layer}: ` + (S.allHeads ? "one colour per active head." : `head ${S.head} alone ("all heads" draws every active head).`) +
      " Line opacity = weight ÷ the largest weight of its query row" +
      (nq > 48 || nk > 48 ? "; without hover only each query's strongest keys are drawn." : ".") +
      " Hover a query (left) to see what it attends to, a key (right) to see what attends to it." +
      (genStart(km.query) !== null ? ` Green tokens (from #${genStart(km.query)}, below the dashed line) were generated after the prompt.` : "");
    const sideName = (side) => (KINDS.length === 1 ? "tokens" : side === "src" ? "source" : "target");
    ui.linesHead.children[0].textContent = `query · ${sideName(km.query)} (${nq})`;
    ui.linesHead.children[1].textContent = `key · ${sideName(km.key)} (${nk})`;
    refreshGridClasses();
  }

  let detailPending = false, detailGen = 0, rendering = null;
  function scheduleDetail() {
    if (detailPending) return;
    detailPending = true;
    requestAnimationFrame(() => { detailPending = false; runRender(); });
  }
  function runRender() {
    const p = renderDetail().finally(() => { if (rendering === p) rendering = null; });
    rendering = p;
  }
  async function renderDetail() {
    renderDetailChrome();
    linesColW = null;
    if (!hw.dataLoaded) { ui.readout.innerHTML = '<span class="hw-loading">loading weights…</span>'; return; }
    const gen = ++detailGen;
    try {
      if (S.tab === "lines") await prepareLines(gen);
      else if (S.tab === "matrix") await prepareMatrix(gen);
      else await prepareRollout(gen);
    } catch (err) {
      report(err);
    }
    if (gen === detailGen) {
      if (S.tab !== "lines" && !S.hover) ui.readout.textContent = "Hover a cell to read its value.";
      resolveReady();
    }
  }
  function report(err) {
    hw.errors.push(String(err && err.stack || err));
    ui.readout.textContent = `Could not draw: ${err && err.message || err}`;
  }

  // ---- lines (BertViz-style), virtualised: only rows in view are drawn
  let lineMats = null; // [{h, mat}]
  let linesColW = null; // {q, k} token column widths, reset when the tokens change
  const TOKEN_FONT = "12.5px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
  async function prepareLines(gen) {
    const heads = S.allHeads ? activeHeads(S.layer) : [S.head];
    const mats = await Promise.all(heads.map((h) => headMatrix(S.kind, S.example, S.layer, h)));
    if (gen !== detailGen) return;
    lineMats = heads.map((h, i) => ({ h, mat: mats[i] }));
    // draw the selected head last, so it sits on top
    lineMats.sort((a, b) => (a.h === S.head) - (b.h === S.head));
    drawLines();
  }
  let scrollbarW = null;
  function scrollbarWidth() { // of a vertical scrollbar here (0 where scrollbars overlay)
    if (scrollbarW === null) {
      const probe = el("div", { style: "position:absolute;visibility:hidden;overflow:scroll;width:100px;height:100px" });
      document.body.append(probe);
      scrollbarW = probe.offsetWidth - probe.clientWidth;
      probe.remove();
    }
    return scrollbarW;
  }
  function linesGeometry() {
    const nq = qTokens().length, nk = kTokens().length;
    const total = PAD * 2 + Math.max(nq, nk) * ROW;
    const full = Math.max(360, (ui.lines.clientWidth || 602) - 2); // inside the box's border
    const height = Math.min(total, Math.max(260, window.innerHeight - 260));
    if (!linesColW) { // each token column as wide as its longest token (within limits)
      const ctx = ui.linesCanvas.getContext("2d");
      ctx.font = TOKEN_FONT;
      const widest = (toks) => {
        let longest = 0;
        for (const t of toks.slice(0, 4096)) longest = Math.max(longest, ctx.measureText(display(t)).width);
        return Math.max(90, Math.min(full * 0.34, longest + 46));
      };
      linesColW = { q: widest(qTokens()), k: widest(kTokens()) };
    }
    // the whole panel (long lines between far-apart tokens stay readable), less the vertical
    // scrollbar when the tokens scroll: it covered the key side's row numbers
    const width = full - (total > height ? scrollbarWidth() : 0);
    return { nq, nk, total, full, width, height, xl: linesColW.q, xr: width - linesColW.k };
  }
  function drawLines() {
    if (S.tab !== "lines" || !lineMats) return;
    const g = linesGeometry();
    ui.linesScroll.style.height = g.height + 2 + "px"; // + its border: 2 px less scrolled
    ui.linesScroll.style.width = g.full + 2 + "px";
    ui.linesHead.style.width = g.full + 2 + "px";
    ui.linesSpacer.style.height = Math.max(0, g.total - g.height) + "px";
    const ctx = setupCanvas(ui.linesCanvas, g.width, g.height);
    const top = ui.linesScroll.scrollTop;
    const yq = (i) => PAD + i * ROW + ROW / 2 - top;
    ctx.clearRect(0, 0, g.width, g.height);
    const hover = S.hover && (S.hover.side === "q" || S.hover.side === "k") ? S.hover : null;
    const many = g.nq > 48 || g.nk > 48;
    const k = many ? Math.max(1, Math.min(6, Math.floor(24000 / (g.nq * Math.max(1, lineMats.length))))) : 0;
    let edges = 0, sum = 0;
    const strength = new Float32Array(hover ? (hover.side === "q" ? g.nk : g.nq) : 0);
    const strengthHead = new Int32Array(strength.length).fill(-1);
    const highlighted = [];
    ctx.lineCap = "round";
    const inView = (y) => y > -ROW && y < g.height + ROW;
    for (const { h, mat } of lineMats) {
      const [r, gg, b] = HEAD_RGB[h];
      const line = (i, j, a, width) => {
        const y1 = yq(i), y2 = yq(j);
        if ((y1 < -ROW && y2 < -ROW) || (y1 > g.height + ROW && y2 > g.height + ROW)) return;
        ctx.strokeStyle = `rgba(${r},${gg},${b},${a.toFixed(3)})`;
        ctx.lineWidth = width;
        ctx.beginPath(); ctx.moveTo(g.xl + 6, y1); ctx.lineTo(g.xr - 6, y2); ctx.stroke();
        edges++;
      };
      if (hover && hover.side === "q") {
        const i = hover.index, o = i * mat.nk;
        for (let j = 0; j < mat.nk; j++) {
          const v = mat.q[o + j];
          if (v === 0) continue;
          const rel = v / LEVELS, a = Math.pow(rel, S.gamma);
          if (a > 0.02) line(i, j, Math.min(1, a * 0.9), 2);
          if (rel > strength[j]) { strength[j] = rel; strengthHead[j] = h; }
          const w = mat.w(i, j); sum += w;
          highlighted.push({ head: h, query: i, key: j, weight: w });
        }
      } else if (hover && hover.side === "k") {
        const j = hover.index;
        for (let i = 0; i < mat.nq; i++) {
          const v = mat.q[i * mat.nk + j];
          if (v === 0) continue;
          const rel = v / LEVELS, a = Math.pow(rel, S.gamma);
          if (a > 0.02) line(i, j, Math.min(1, a * 0.9), 2);
          if (rel > strength[i]) { strength[i] = rel; strengthHead[i] = h; }
          const w = mat.w(i, j); sum += w;
          highlighted.push({ head: h, query: i, key: j, weight: w });
        }
      } else {
        const first = Math.max(0, Math.floor((top - PAD) / ROW) - 1);
        const last = Math.min(mat.nq, Math.ceil((top + g.height - PAD) / ROW) + 1);
        const dim = lineMats.length > 1 ? 0.45 : 0.7;
        if (k) { // long sequences: the k strongest keys of every query row in view
          const idx = mat.top(k);
          for (let i = first; i < last; i++) {
            for (let t = 0; t < k; t++) {
              const j = idx[i * k + t];
              if (j < 0) break;
              const a = Math.pow(mat.q[i * mat.nk + j] / LEVELS, S.gamma) * dim;
              if (a > 0.03) line(i, j, a, 1);
            }
          }
        } else {
          for (let i = 0; i < mat.nq; i++) {
            for (let j = 0; j < mat.nk; j++) {
              const a = Math.pow(mat.q[i * mat.nk + j] / LEVELS, S.gamma) * dim;
              if (a > 0.03) line(i, j, a, 1);
            }
          }
        }
      }
    }
    // token boxes
    ctx.font = TOKEN_FONT;
    ctx.textBaseline = "middle";
    const drawSide = (tokens, side) => {
      const first = Math.max(0, Math.floor((top - PAD) / ROW));
      const last = Math.min(tokens.length, Math.ceil((top + g.height - PAD) / ROW) + 1);
      const bx = side === "q" ? 4 : g.xr + 2; // token box: [bx, bx + bw]
      const bw = side === "q" ? g.xl - 6 : g.width - 4 - bx;
      const gs = genStart(side === "q" ? kindMeta().query : kindMeta().key);
      if (gs !== null && gs < tokens.length) { // the prompt/generated boundary
        const y = yq(gs) - ROW / 2;
        ctx.save(); ctx.strokeStyle = GEN_RGB; ctx.setLineDash([4, 3]); ctx.lineWidth = 1.5;
        ctx.beginPath(); ctx.moveTo(bx, y); ctx.lineTo(bx + bw, y); ctx.stroke(); ctx.restore();
      }
      for (let i = first; i < last; i++) {
        const y = yq(i);
        const generated = gs !== null && i >= gs;
        if (generated) { ctx.fillStyle = "rgba(43, 138, 62, 0.13)"; roundRect(ctx, bx, y - ROW / 2 + 1.5, bw, ROW - 3, 4); ctx.fill(); }
        const isHover = hover && hover.side === side && hover.index === i;
        const other = hover && hover.side !== side ? strength[i] : 0;
        if (isHover) {
          ctx.fillStyle = "#1f2430";
          roundRect(ctx, bx, y - ROW / 2 + 1.5, bw, ROW - 3, 4); ctx.fill();
        } else if (other > 0.004) {
          const [r, gg, b] = HEAD_RGB[strengthHead[i]];
          ctx.fillStyle = `rgba(${r},${gg},${b},${(0.08 + 0.34 * Math.pow(other, S.gamma)).toFixed(3)})`;
          roundRect(ctx, bx, y - ROW / 2 + 1.5, bw, ROW - 3, 4); ctx.fill();
        }
        ctx.fillStyle = isHover ? "#ffffff" : generated ? GEN_RGB : "#1f2430";
        const label = fitText(ctx, display(tokens[i]), bw - 34);
        const pos = String(i);
        if (side === "q") {
          ctx.textAlign = "right"; ctx.fillText(label, bx + bw - 6, y);
          ctx.fillStyle = isHover ? "#c9d1dc" : "#9aa1ab"; ctx.textAlign = "left"; ctx.font = "10px system-ui, sans-serif";
          ctx.fillText(pos, bx + 5, y);
        } else {
          ctx.textAlign = "left"; ctx.fillText(label, bx + 6, y);
          ctx.fillStyle = isHover ? "#c9d1dc" : "#9aa1ab"; ctx.textAlign = "right"; ctx.font = "10px system-ui, sans-serif";
          ctx.fillText(pos, bx + bw - 5, y);
        }
        ctx.font = TOKEN_FONT;
      }
    };
    drawSide(qTokens(), "q");
    drawSide(kTokens(), "k");
    highlighted.sort((a, b) => b.weight - a.weight);
    hw.lastDraw.lines = {
      kind: S.kind, example: S.example, layer: S.layer, heads: lineMats.map((x) => x.h).sort((a, b) => a - b),
      hover: hover ? { ...hover } : null, edges, weightSum: sum, highlighted: highlighted.slice(0, 12),
      generatedStart: genStart(kindMeta().query),
    };
    updateReadout(highlighted);
  }
  function roundRect(ctx, x, y, w, h, r) {
    ctx.beginPath(); ctx.roundRect ? ctx.roundRect(x, y, w, h, r) : ctx.rect(x, y, w, h);
  }
  function canvasSignature(canvas) { // cheap checksum of the drawn pixels (tests compare these)
    const { width, height } = canvas;
    if (!width || !height) return 0;
    const copy = document.createElement("canvas"); // read a copy: the view's canvas stays GPU-friendly
    copy.width = width; copy.height = height;
    const ctx = copy.getContext("2d", { willReadFrequently: true });
    ctx.drawImage(canvas, 0, 0);
    const d = ctx.getImageData(0, 0, width, height).data;
    let s = 0;
    for (let i = 0; i < d.length; i += 4 * 7) s = (s * 31 + d[i] + 3 * d[i + 1] + 7 * d[i + 2] + 11 * d[i + 3]) % 2147483647;
    return s;
  }
  function onLinesMove(e) {
    const g = linesGeometry();
    const rect = ui.linesCanvas.getBoundingClientRect();
    const x = e.clientX - rect.left, y = e.clientY - rect.top + ui.linesScroll.scrollTop;
    const i = Math.floor((y - PAD) / ROW);
    const side = x < g.width / 2 ? "q" : "k";
    const n = side === "q" ? g.nq : g.nk;
    const inside = side === "q" ? x < g.xl + 8 : x > g.xr - 8;
    setHover(i >= 0 && i < n && inside ? { side, index: i } : null);
  }
  function updateReadout(highlighted) {
    const h = S.hover;
    if (!h || (h.side !== "q" && h.side !== "k")) {
      ui.readout.textContent = "Hover a token to see its weights; click a grid cell to change the layer.";
      return;
    }
    const toks = h.side === "q" ? qTokens() : kTokens();
    const other = h.side === "q" ? kTokens() : qTokens();
    const top = highlighted.slice(0, 5).map((x) =>
      `${display(other[h.side === "q" ? x.key : x.query])} (H${x.head} ${fmt(x.weight)})`).join(", ");
    ui.readout.innerHTML = "";
    ui.readout.append(el("b", { text: `${h.side === "q" ? "query" : "key"} #${h.index} “${display(toks[h.index])}”` }),
      document.createTextNode(h.side === "q" ? " attends most to: " : " is attended most by: "), document.createTextNode(top || "–"));
  }

  // ---- matrix + rollout views
  let matrixState = null, rollState = null;
  async function prepareMatrix(gen) {
    const heads = S.matrixMode === "mean" ? activeHeads(S.layer) : [S.head];
    const mats = await Promise.all(heads.map((h) => headMatrix(S.kind, S.example, S.layer, h)));
    if (gen !== detailGen) return;
    let values;
    const nq = qTokens().length, nk = kTokens().length;
    if (mats.length === 1) values = mats[0].dense();
    else {
      values = new Float32Array(nq * nk);
      for (const m of mats) { const d = m.dense(); for (let x = 0; x < d.length; x++) values[x] += d[x] / mats.length; }
    }
    const km = kindMeta();
    ui.matrixCaption.textContent = S.matrixMode === "mean"
      ? `${km.label}, layer ${S.layer}: mean over active heads ${heads.map((h) => "H" + h).join(", ") || "(none)"}. Rows = queries, columns = keys.`
      : `${km.label}, layer ${S.layer}, head ${S.head}. Rows = queries, columns = keys; each row sums to 1.`;
    matrixState = { values, nq, nk, rowTokens: qTokens(), colTokens: kTokens(), heads };
    drawMatrix(ui.matrixCanvas, ui.matrixBox, matrixState, ui.matrixBar, "weight");
    hw.lastDraw.matrix = { heads, nq, nk, max: matrixState.max };
  }
  async function prepareRollout(gen) {
    const km = kindMeta();
    const msg = km.rollout === null
      ? (km.query !== km.key ? "Rollout is defined for self-attention (queries and keys are the same tokens); pick Encoder self or Decoder self."
        : "Rollout was not computed for this file (head_view(..., rollout=True)).")
      : km.rollout.error;
    ui.rollMessage.hidden = !msg;
    ui.rollBox.hidden = !!msg;
    ui.rollBar.node.hidden = !!msg;
    ui.rollMessage.textContent = msg || "";
    if (msg) { ui.rollCaption.textContent = ""; hw.lastDraw.rollout = { message: msg }; return; }
    const n = qTokens().length;
    const heads = [];
    for (let l = 0; l <= S.layer; l++) heads.push(activeHeads(l));
    const allHeads = heads.every((hs, l) => hs.length === headsIn(l));
    let values, note = "";
    if (allHeads && S.fusion === "mean") { // the exact rollout computed in Python
      values = (await rolloutMatrix(S.kind, S.example, S.layer)).dense();
    } else if (heads.some((hs) => hs.length === 0)) {
      values = null; note = "No active head in some layer: switch a head on to roll out.";
    } else if (n > ROLLOUT_JS_MAX) {
      values = (await rolloutMatrix(S.kind, S.example, S.layer)).dense();
      note = `Head subsets and max/min fusion are rolled out in the page up to ${ROLLOUT_JS_MAX} tokens; ` +
        `this example has ${n}, so all heads are averaged.`;
    } else {
      values = await rolloutInPage(heads, n);
    }
    if (gen !== detailGen) return;
    const used = allHeads && S.fusion === "mean" || n > ROLLOUT_JS_MAX ? "all heads" : "active heads";
    const fusion = n > ROLLOUT_JS_MAX ? "mean" : S.fusion;
    ui.rollCaption.textContent = note || (`Attention rollout through layers 0–${S.layer} (Abnar & Zuidema 2020): per layer the ${used} are fused (${fusion}), ` +
      "the identity is added for the residual (0.5·A + 0.5·I), rows are renormalised, and the layers are multiplied. " +
      "Row i: how much of token i's representation after this layer comes from each input token. Pick the layer in the model view.");
    if (!values) { ui.rollBox.hidden = true; ui.rollBar.node.hidden = true; hw.lastDraw.rollout = { message: note }; return; }
    rollState = { values, nq: n, nk: n, rowTokens: qTokens(), colTokens: qTokens(), heads: [] };
    drawMatrix(ui.rollCanvas, ui.rollBox, rollState, ui.rollBar, "rollout");
    hw.lastDraw.rollout = { layer: S.layer, n, max: rollState.max, fusion, heads: used === "all heads" ? "all" : heads };
  }
  /** Rollout of the active heads with S.fusion, in float64 (only for n <= ROLLOUT_JS_MAX). */
  async function rolloutInPage(heads, n) {
    let R = null;
    for (let l = 0; l < heads.length; l++) {
      const mats = await Promise.all(heads[l].map((h) => headMatrix(S.kind, S.example, l, h)));
      const A = new Float64Array(n * n);
      const first = mats[0].dense();
      for (let x = 0; x < n * n; x++) A[x] = first[x];
      for (const m of mats.slice(1)) {
        const d = m.dense();
        for (let x = 0; x < n * n; x++) {
          if (S.fusion === "mean") A[x] += d[x];
          else if (S.fusion === "max") A[x] = Math.max(A[x], d[x]);
          else A[x] = Math.min(A[x], d[x]);
        }
      }
      for (let i = 0; i < n; i++) {
        let sum = 0;
        for (let j = 0; j < n; j++) {
          let v = S.fusion === "mean" ? A[i * n + j] / mats.length : A[i * n + j];
          v = 0.5 * v + (i === j ? 0.5 : 0);
          A[i * n + j] = v; sum += v;
        }
        for (let j = 0; j < n; j++) A[i * n + j] /= sum;
      }
      if (R === null) { R = A; continue; }
      const out = new Float64Array(n * n); // out = A @ R
      for (let i = 0; i < n; i++) {
        for (let k = 0; k < n; k++) {
          const a = A[i * n + k];
          if (a === 0) continue;
          const ro = k * n, oo = i * n;
          for (let j = 0; j < n; j++) out[oo + j] += a * R[ro + j];
        }
      }
      R = out;
    }
    return Float32Array.from(R);
  }
  function drawMatrix(canvas, box, st, bar, label) {
    const { values, nq, nk } = st;
    let max = 0;
    for (let x = 0; x < values.length; x++) if (values[x] > max) max = values[x];
    st.max = max;
    const rowScale = S.rowScale[label];
    const rowInv = new Float32Array(nq);
    for (let i = 0; i < nq; i++) {
      let m = 0;
      for (let j = 0; j < nk; j++) if (values[i * nk + j] > m) m = values[i * nk + j];
      rowInv[i] = rowScale ? (m > 0 ? 1 / m : 0) : (max > 0 ? 1 / max : 0);
    }
    const width = Math.max(320, box.clientWidth || 600);
    const avail = Math.max(240, Math.min(width, window.innerHeight - 300));
    const ctxm = canvas.getContext("2d");
    ctxm.font = "11.5px system-ui, sans-serif";
    // token labels while a cell is >= 4 px (every stride-th label when cells are small)
    let ml = 36, mt = 22;
    const fit = () => Math.min(30, Math.max(0, Math.min((width - ml - 8) / nk, (avail - mt) / nq)));
    let labels = fit() >= 4;
    if (labels) {
      const longest = (toks) => Math.min(130, Math.max(...toks.map((t) => ctxm.measureText(display(t)).width)) + 10);
      ml = longest(st.rowTokens) + 4; mt = longest(st.colTokens) + 4;
      if (fit() < 4) { labels = false; ml = 36; mt = 22; }
    }
    const cell = fit();
    const fontPx = Math.max(8, Math.min(11.5, cell - 1));
    const stride = Math.max(1, Math.ceil((fontPx + 1) / Math.max(cell, 1e-3)));
    // below one CSS pixel per cell, max-pool so that sharp peaks survive the downscale
    const pw = cell >= 1 ? nk : Math.max(1, Math.floor(width - ml - 8));
    const ph = cell >= 1 ? nq : Math.max(1, Math.floor((nq / nk) * pw));
    const dw = cell >= 1 ? cell * nk : pw, dh = cell >= 1 ? cell * nq : ph;
    const off = document.createElement("canvas");
    off.width = pw; off.height = ph;
    const octx = off.getContext("2d"), img = octx.createImageData(pw, ph);
    for (let r = 0; r < ph; r++) {
      const i0 = Math.floor((r * nq) / ph), i1 = Math.max(i0 + 1, Math.floor(((r + 1) * nq) / ph));
      for (let c = 0; c < pw; c++) {
        const j0 = Math.floor((c * nk) / pw), j1 = Math.max(j0 + 1, Math.floor(((c + 1) * nk) / pw));
        let v = 0;
        for (let i = i0; i < i1; i++) {
          const s = rowInv[i];
          for (let j = j0; j < j1; j++) { const x = values[i * nk + j] * s; if (x > v) v = x; }
        }
        const idx = Math.min(255, Math.round(v * 255)) * 3, o = (r * pw + c) * 4;
        img.data[o] = LUT[idx]; img.data[o + 1] = LUT[idx + 1]; img.data[o + 2] = LUT[idx + 2]; img.data[o + 3] = 255;
      }
    }
    octx.putImageData(img, 0, 0);
    const H = mt + dh + 24;
    const ctx = setupCanvas(canvas, Math.ceil(ml + dw + 8), Math.ceil(H));
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, ml, mt, dw, dh);
    ctx.strokeStyle = "#cdd3db"; ctx.lineWidth = 1; ctx.strokeRect(ml - 0.5, mt - 0.5, dw + 1, dh + 1);
    st.geom = { ml, mt, dw, dh, cellW: dw / nk, cellH: dh / nq };
    ctx.fillStyle = "#1f2430"; ctx.font = "11.5px system-ui, sans-serif";
    if (labels) {
      ctx.font = `${fontPx}px system-ui, sans-serif`;
      ctx.textAlign = "right"; ctx.textBaseline = "middle";
      for (let i = 0; i < nq; i += stride) ctx.fillText(fitText(ctx, display(st.rowTokens[i]), ml - 8), ml - 5, mt + (i + 0.5) * cell);
      ctx.save();
      for (let j = 0; j < nk; j += stride) {
        const dpr = window.devicePixelRatio || 1;
        ctx.setTransform(dpr, 0, 0, dpr, (ml + (j + 0.5) * cell) * dpr, (mt - 5) * dpr);
        ctx.rotate(-Math.PI / 2);
        ctx.textAlign = "left";
        ctx.fillText(fitText(ctx, display(st.colTokens[j]), mt - 8), 0, 0);
      }
      ctx.restore();
    } else {
      ctx.fillStyle = "#5f6877"; ctx.textBaseline = "alphabetic"; ctx.textAlign = "center";
      ctx.fillText("key position", ml + dw / 2, mt - 7);
      ctx.textAlign = "left"; ctx.fillText("0", ml, mt - 7);
      ctx.textAlign = "right"; ctx.fillText(String(nk - 1), ml + dw, mt - 7);
      ctx.save(); ctx.translate(ml - 8, mt + dh / 2); ctx.rotate(-Math.PI / 2); ctx.textAlign = "center";
      ctx.fillText("query position (0 at the top)", 0, 0); ctx.restore();
      ctx.textAlign = "right"; ctx.textBaseline = "bottom"; ctx.fillText(String(nq - 1), ml - 4, mt + dh);
      ctx.textBaseline = "top"; ctx.fillText("0", ml - 4, mt);
    }
    const gr = genStart(kindMeta().query), gc = genStart(kindMeta().key);
    if (gr !== null || gc !== null) { // the prompt/generated boundary, dashed
      ctx.save(); ctx.strokeStyle = GEN_RGB; ctx.setLineDash([4, 3]); ctx.lineWidth = 1.5; ctx.beginPath();
      if (gr !== null && gr < nq) { ctx.moveTo(ml, mt + (gr * dh) / nq); ctx.lineTo(ml + dw, mt + (gr * dh) / nq); }
      if (gc !== null && gc < nk) { ctx.moveTo(ml + (gc * dw) / nk, mt); ctx.lineTo(ml + (gc * dw) / nk, mt + dh); }
      ctx.stroke(); ctx.restore();
    }
    // hover cross-hair: a query row, a key column, or a cell
    const h = S.hover;
    ctx.strokeStyle = "rgba(232, 89, 12, 0.95)"; ctx.lineWidth = 1.5;
    const cw = dw / nk, ch = dh / nq;
    if (h && (h.side === "q" || h.side === "cell") && h.index < nq) ctx.strokeRect(ml, mt + h.index * ch, dw, Math.max(ch, 1.5));
    if (h && (h.side === "k" || h.side === "cell") && (h.side === "k" ? h.index : h.key) < nk) {
      const j = h.side === "k" ? h.index : h.key;
      ctx.strokeRect(ml + j * cw, mt, Math.max(cw, 1.5), dh);
    }
    if (rowScale) paintColorbar(bar, 1, label === "rollout" ? "rollout ÷ row max" : "weight ÷ row max");
    else paintColorbar(bar, max, label === "rollout" ? "rollout" : "weight");
  }
  function onMatrixMove(e, which) {
    const st = which === "matrix" ? matrixState : rollState;
    if (!st || !st.geom) return;
    const rect = e.target.getBoundingClientRect();
    const x = e.clientX - rect.left - st.geom.ml, y = e.clientY - rect.top - st.geom.mt;
    const j = Math.floor(x / st.geom.cellW), i = Math.floor(y / st.geom.cellH);
    if (i < 0 || j < 0 || i >= st.nq || j >= st.nk) { ui.tip.style.display = "none"; setHover(null); return; }
    const v = st.values[i * st.nk + j];
    ui.tip.textContent = `query #${i} “${display(st.rowTokens[i])}” → key #${j} “${display(st.colTokens[j])}”: ${which === "rollout" ? "rollout" : "weight"} ${fmt(v)}`;
    ui.tip.style.display = "block";
    ui.tip.style.left = Math.min(window.innerWidth - 370, e.clientX + 14) + "px";
    ui.tip.style.top = e.clientY + 14 + "px";
    setHover({ side: "cell", index: i, key: j });
    ui.readout.textContent = ui.tip.textContent;
  }

  // ------------------------------------------------------------------ state changes
  function setHover(h) {
    const same = (a, b) => (!a && !b) || (a && b && a.side === b.side && a.index === b.index && a.key === b.key);
    if (same(S.hover, h)) return;
    S.hover = h;
    if (S.tab === "lines") drawLines();
    else if (S.tab === "matrix" && matrixState) drawMatrix(ui.matrixCanvas, ui.matrixBox, matrixState, ui.matrixBar, "weight");
    else if (S.tab === "rollout" && rollState && !ui.rollBox.hidden) drawMatrix(ui.rollCanvas, ui.rollBox, rollState, ui.rollBar, "rollout");
  }
  function setKind(kind) {
    if (!META.kinds[kind] || kind === S.kind) return;
    S.kind = kind; S.hover = null;
    sizeThumbs();
    if (!kindMeta().heads[S.layer]) S.layer = firstLayer(kind);
    if (S.head >= headsIn(S.layer)) S.head = 0;
    renderGrid(); scheduleDetail();
  }
  function setExample(b) {
    if (b < 0 || b >= META.examples || b === S.example) return;
    S.example = b; S.hover = null;
    renderGrid(); scheduleDetail();
  }
  /** A grid cell: that layer, and that head alone in the lines and matrix views. */
  function select(layer, head) {
    if (!kindMeta().heads[layer] || head >= headsIn(layer)) return;
    S.layer = layer; S.head = head; S.allHeads = false; S.matrixMode = "head";
    if (!S.active[head]) S.active[head] = true;
    scheduleDetail();
  }
  function pickHead(h) { if (h < headsIn(S.layer)) { S.head = h; if (!S.active[h]) S.active[h] = true; scheduleDetail(); } }
  function setAllHeads(on) { S.allHeads = !!on; scheduleDetail(); }
  function setThumbScale(scale) { S.thumbScale = scale; renderGrid(); renderDetailChrome(); }
  function toggleHead(h) { S.active[h] = !S.active[h]; refreshGridClasses(); scheduleDetail(); }
  function solo(h) { S.active = S.active.map((_, i) => i === h); if (h < headsIn(S.layer)) S.head = h; refreshGridClasses(); scheduleDetail(); }
  function setTab(t) { S.tab = t; S.hover = null; scheduleDetail(); }
  function setMatrixMode(m) { S.matrixMode = m; scheduleDetail(); }
  function setRowScale(view, row) { S.rowScale[view] = row; scheduleDetail(); }
  function setFusion(f) { S.fusion = f; scheduleDetail(); }
  function setGamma(g) {
    S.gamma = g; LUT = lut(g);
    for (const c of ui.grid.querySelectorAll("canvas[data-drawn]")) drawThumb(c);
    scheduleDetail();
  }

  // ------------------------------------------------------------------ scripting / test API
  Object.assign(hw, {
    setKind, setExample, select, pickHead, setAllHeads, setThumbScale, toggleHead, solo, setTab, setMatrixMode, setGamma, setRowScale, setFusion,
    /** the matrix the rollout tab shows now, as nested arrays */
    rolloutShown: () => rollState && Array.from({ length: rollState.nq }, (_, i) =>
      Array.from(rollState.values.subarray(i * rollState.nk, (i + 1) * rollState.nk))),
    /** checksum of a view's canvas pixels ("lines" | "matrix" | "rollout"); tests compare them */
    signature: (view) => canvasSignature({ lines: ui.linesCanvas, matrix: ui.matrixCanvas, rollout: ui.rollCanvas }[view]),
    setHover: (side, index) => setHover(side === null ? null : { side, index }),
    /** viewport point of a token in the lines view (scrolls it into view first) */
    tokenPoint(side, index) {
      const g = linesGeometry();
      const y = PAD + index * ROW + ROW / 2;
      const sc = ui.linesScroll;
      if (y < sc.scrollTop + ROW || y > sc.scrollTop + g.height - ROW) { sc.scrollTop = Math.max(0, y - g.height / 2); drawLines(); }
      const rect = ui.linesCanvas.getBoundingClientRect();
      const x = side === "q" ? g.xl - 20 : g.xr + 20;
      return { x: rect.left + x, y: rect.top + y - sc.scrollTop };
    },
    /** decoded weights of one head as nested arrays (rows = queries) */
    async weights(kind, b, l, h) {
      const m = await headMatrix(kind, b, l, h), d = m.dense(), out = [];
      for (let i = 0; i < m.nq; i++) out.push(Array.from(d.subarray(i * m.nk, (i + 1) * m.nk)));
      return out;
    },
    async rollout(kind, b, l) {
      const m = await rolloutMatrix(kind, b, l), d = m.dense(), out = [];
      for (let i = 0; i < m.nq; i++) out.push(Array.from(d.subarray(i * m.nk, (i + 1) * m.nk)));
      return out;
    },
    /** resolves once no redraw is scheduled or running (scripts and tests await it) */
    async idle() {
      for (;;) {
        await new Promise((r) => requestAnimationFrame(() => r()));
        if (rendering) { await rendering.catch(() => {}); continue; }
        if (!detailPending) return;
      }
    },
    _dataLoaded() {
      hw.dataLoaded = true;
      performance.mark("headwise-data");
      runRender();
    },
  });

  window.addEventListener("error", (e) => hw.errors.push(String(e.message)));
  window.addEventListener("unhandledrejection", (e) => hw.errors.push(String(e.reason)));
  build();
  renderGrid();
  renderDetailChrome();
  performance.mark("headwise-grid");
  hw.ready.then(() => performance.mark("headwise-ready"));
})();
