/* headwise head catalogue. Self-contained: no library, no network. The catalogue's JSON is in
 * #hw-catalogue; window.headwiseCatalogue exposes the state and a few helpers for scripting and
 * tests (sortBy, filter, visible, errors, ready). */
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("hw-catalogue").textContent);
  const META = DATA.meta, HEADS = DATA.heads;
  const SCORES = Object.keys(META.scores);
  const KINDS = META.kindOrder; // the kinds present, in the order of headwise.kinds.KINDS
  const BLUES = [[247, 251, 255], [222, 235, 247], [198, 219, 239], [158, 202, 225],
    [107, 174, 214], [66, 146, 198], [33, 113, 181], [8, 81, 156], [8, 48, 107]];
  const S = { sort: SCORES.includes("importance") ? "importance" : "max_weight", desc: true,
    kind: "all", text: "", min: null };
  const api = { meta: META, state: S, errors: [], ready: null };
  window.headwiseCatalogue = api;
  window.addEventListener("error", (e) => api.errors.push(String(e.message)));
  window.addEventListener("unhandledrejection", (e) => api.errors.push(String(e.reason)));

  const el = (tag, attrs, ...kids) => {
    const n = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") n.className = v; else if (k.startsWith("on")) n.addEventListener(k.slice(2), v);
      else n.setAttribute(k, v);
    }
    for (const c of kids) n.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return n;
  };
  const fmt = (v) => (v === null || v === undefined ? "–" : Math.abs(v) >= 100 ? v.toFixed(0) : v.toFixed(3));
  const idOf = (h) => `${h.kind}-L${h.layer}-H${h.head}`;
  function colour(t) { // t in [0, 1] -> Blues
    const x = Math.max(0, Math.min(1, t)) * (BLUES.length - 1), i = Math.min(BLUES.length - 2, Math.floor(x));
    const f = x - i, a = BLUES[i], b = BLUES[i + 1];
    return a.map((c, k) => Math.round(c + (b[k] - c) * f));
  }
  const css = (rgb) => `rgb(${rgb[0]},${rgb[1]},${rgb[2]})`;
  function range(name) {
    const vals = HEADS.map((h) => h.scores[name]).filter((v) => v !== null && v !== undefined);
    return vals.length ? [Math.min(...vals), Math.max(...vals)] : [0, 1];
  }

  function drawPattern(canvas, m) {
    const g = m.length, ctx = canvas.getContext("2d"), img = ctx.createImageData(g, g);
    let top = 0;
    for (const row of m) for (const v of row) top = Math.max(top, v);
    for (let i = 0; i < g; i++) for (let j = 0; j < g; j++) {
      const c = colour(top > 0 ? m[i][j] / top : 0), o = 4 * (i * g + j);
      img.data[o] = c[0]; img.data[o + 1] = c[1]; img.data[o + 2] = c[2]; img.data[o + 3] = 255;
    }
    canvas.width = g; canvas.height = g;
    ctx.putImageData(img, 0, 0);
  }
  function drawProfile(canvas, p) {
    const w = 150, h = 40, ctx = canvas.getContext("2d"), n = p.length, bw = w / n;
    canvas.width = w; canvas.height = h;
    const top = Math.max(...p, 1e-9), mid = (n - 1) / 2;
    for (let k = 0; k < n; k++) {
      const bh = (p[k] / top) * (h - 8);
      ctx.fillStyle = k === mid ? "#5f6877" : (k === 0 || k === n - 1) ? "#b3b9c2" : "#1d5fd1";
      ctx.fillRect(k * bw + 1, h - 6 - bh, Math.max(1, bw - 2), bh);
    }
    ctx.fillStyle = "#5f6877"; ctx.fillRect(0, h - 5, w, 1);
  }

  function row(h) {
    const tr = el("tr", { id: idOf(h), "data-kind": h.kind, "data-layer": h.layer, "data-head": h.head });
    tr.append(el("td", { class: "hc-left" }, `${h.kind} L${h.layer} H${h.head}`));
    for (const name of SCORES) {
      const v = h.scores[name], [lo, hi] = RANGES[name];
      const td = el("td", { class: "hc-num" + (v === null ? " hc-na" : ""), "data-score": name }, fmt(v));
      if (v !== null) td.append(el("span", { class: "hc-bar", style: `width:${Math.round(40 * (hi > lo ? (v - lo) / (hi - lo) : 0))}px` }));
      tr.append(td);
    }
    const pat = el("canvas", { class: "hc-pattern", title: "mean weights, positions scaled to each input's length (rows: queries)" });
    drawPattern(pat, h.pattern);
    tr.append(el("td", {}, pat));
    const prof = el("canvas", { class: "hc-profile", title: `mean weight per key offset -${META.window}..+${META.window} (grey: own position; ends: further)` });
    const pc = el("td", {});
    if (h.profile) { drawProfile(prof, h.profile); pc.append(prof); } else pc.append(el("span", { class: "hc-na" }, "–"));
    tr.append(pc);
    const toks = el("td", { class: "hc-left hc-tokens" });
    for (const t of h.top_tokens) {
      toks.append(el("span", { class: "hc-tok", title: `share ${(100 * t.share).toFixed(1)}%, lift ${t.lift === null ? "–" : t.lift.toFixed(2)}x over uniform, ${t.count} occurrences` },
        t.token, el("b", {}, `${(100 * t.share).toFixed(0)}%`)));
    }
    tr.append(toks);
    return tr;
  }

  function matches(h) {
    if (S.kind !== "all" && h.kind !== S.kind) return false;
    if (S.min !== null && !(h.scores[S.sort] !== null && h.scores[S.sort] >= S.min)) return false;
    const q = S.text.trim().toLowerCase();
    if (!q) return true;
    const name = `l${h.layer}h${h.head}`;
    if (/^(l\d+)?(h\d+)?$/.test(q)) {
      const [l, hd] = [q.match(/l(\d+)/), q.match(/h(\d+)/)];
      return (!l || +l[1] === h.layer) && (!hd || +hd[1] === h.head);
    }
    return name === q || h.top_tokens.some((t) => t.token.toLowerCase().includes(q));
  }
  function order() {
    const key = (h) => h.scores[S.sort];
    return HEADS.slice().sort((a, b) => {
      const x = key(a), y = key(b);
      if (x === null && y === null) return 0;
      if (x === null) return 1;
      if (y === null) return -1;
      return S.desc ? y - x : x - y;
    });
  }
  function render() {
    const visible = order().filter(matches);
    TBODY.replaceChildren(...visible.map((h) => ROWS.get(idOf(h))));
    for (const th of HEADROW.querySelectorAll("th[data-score]")) {
      th.setAttribute("aria-sort", th.dataset.score === S.sort ? (S.desc ? "descending" : "ascending") : "none");
    }
    COUNT.textContent = `${visible.length} of ${HEADS.length} heads`;
    drawGrids();
    api.lastRender = { sort: S.sort, desc: S.desc, visible: visible.map(idOf) };
  }
  function drawGrids() {
    GRIDS.replaceChildren();
    const [lo, hi] = RANGES[S.sort] || [0, 1];
    for (const kind of KINDS) {
      const heads = META.kinds[kind], box = el("div", { class: "hc-grid" });
      box.append(el("h2", {}, `${META.kindLabels[kind]} · ${S.sort}`));
      const table = el("table", {}), head = el("tr", {}, el("th", {}, ""));
      for (let h = 0; h < Math.max(...heads); h++) head.append(el("th", {}, `H${h}`));
      table.append(head);
      heads.forEach((n, l) => {
        const tr = el("tr", {}, el("th", {}, `L${l}`));
        for (let h = 0; h < n; h++) {
          const entry = HEADS.find((x) => x.kind === kind && x.layer === l && x.head === h);
          const v = entry.scores[S.sort], t = v === null || hi <= lo ? 0 : (v - lo) / (hi - lo);
          const td = el("td", { title: `${kind} L${l} H${h}: ${S.sort} ${fmt(v)}`, "data-cell": idOf(entry),
            onclick: () => jump(idOf(entry)) }, v === null ? "" : fmt(v).replace(/^0\./, "."));
          td.style.background = v === null ? "#eef0f3" : css(colour(t));
          td.style.color = t > 0.55 ? "#fff" : "#1f2430";
          tr.append(td);
        }
        table.append(tr);
      });
      box.append(table);
      GRIDS.append(box);
    }
  }
  function jump(id) {
    S.kind = "all"; S.text = ""; S.min = null; KIND.value = "all"; TEXT.value = ""; MIN.value = "";
    render();
    const tr = document.getElementById(id);
    tr.classList.add("hc-flash");
    tr.scrollIntoView({ block: "center" });
    setTimeout(() => tr.classList.remove("hc-flash"), 1500);
  }

  // ---- build the page
  const RANGES = Object.fromEntries(SCORES.map((s) => [s, range(s)]));
  document.title = META.title;
  const app = el("div", { class: "hc-app" });
  app.append(el("h1", {}, META.title));
  app.append(el("div", { class: "hc-sub" }, `${META.model} · ${META.dataset || "dataset"} · ${META.inputs} inputs in ${META.batches} batches · ` +
    `every number is a mean over all real query rows of the dataset`));
  const KIND = el("select", { "aria-label": "attention kind" }, el("option", { value: "all" }, "all kinds"),
    ...KINDS.map((k) => el("option", { value: k }, META.kindLabels[k])));
  const SORT = el("select", { "aria-label": "sort by" }, ...SCORES.map((s) => el("option", { value: s }, s)));
  const TEXT = el("input", { type: "search", placeholder: "L2, H3, L2H3 or a token", "aria-label": "filter" });
  const MIN = el("input", { type: "number", step: "0.05", placeholder: "min", style: "width:6em", "aria-label": "minimum score" });
  const COUNT = el("span", { class: "hc-count" });
  KIND.addEventListener("change", () => { S.kind = KIND.value; render(); });
  SORT.addEventListener("change", () => { S.sort = SORT.value; render(); });
  TEXT.addEventListener("input", () => { S.text = TEXT.value; render(); });
  MIN.addEventListener("input", () => { S.min = MIN.value === "" ? null : +MIN.value; render(); });
  app.append(el("div", { class: "hc-controls" }, el("label", {}, "kind", KIND), el("label", {}, "sort by", SORT),
    el("label", {}, "at least", MIN), el("label", {}, "filter", TEXT), COUNT));
  const GRIDS = el("div", { class: "hc-panel hc-grids" });
  app.append(GRIDS);
  const table = el("table", { class: "hc-table" });
  const HEADROW = el("tr", {}, el("th", { class: "hc-left" }, "head"));
  for (const s of SCORES) {
    HEADROW.append(el("th", { "data-score": s, title: META.scores[s], onclick: () => api.sortBy(s, s === S.sort ? !S.desc : true) }, s));
  }
  HEADROW.append(el("th", { class: "hc-left", title: "mean weights, positions scaled to each input's length" }, "pattern"),
    el("th", { class: "hc-left", title: "mean weight per key offset" }, `offsets ±${META.window}`),
    el("th", { class: "hc-left", title: "share of the head's attention per key token" }, "attends to most"));
  const TBODY = el("tbody", {});
  table.append(el("thead", {}, HEADROW), TBODY);
  app.append(el("div", { class: "hc-panel" }, table));
  document.body.append(app);
  const ROWS = new Map(HEADS.map((h) => [idOf(h), row(h)]));

  api.sortBy = (name, desc = true) => {
    if (!SCORES.includes(name)) throw new Error(`unknown score ${name}`);
    S.sort = name; S.desc = desc; SORT.value = name; render(); return api.lastRender.visible;
  };
  api.filter = ({ kind = S.kind, text = S.text, min = S.min } = {}) => {
    S.kind = kind; S.text = text; S.min = min; KIND.value = kind; TEXT.value = text; MIN.value = min === null ? "" : min;
    render(); return api.lastRender.visible;
  };
  api.visible = () => api.lastRender.visible;
  api.jump = jump;
  SORT.value = S.sort;
  render();
  api.ready = Promise.resolve(true);
})();
