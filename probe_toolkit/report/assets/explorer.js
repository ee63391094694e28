/* probe report: the patch explorer (plain JavaScript, no network, no libraries).
 *
 * Reads the JSON in <script id="probe-explorer-data"> (written by probe_toolkit/report/explorer.py):
 * 8-bit attention rows and cosines, base64, with every ranking computed exactly in Python.
 * Click a patch of the picture (or open the page at #patch=N, #patch=N&query=cls, &query=reg2)
 * and every store redraws: the row's mean over heads and each head (five largest weights
 * outlined), and the cosine map with the 3x3 window (wrap-around), its top k and the crop's top 8.
 *
 * Every store is drawn on its own 224 grid (rows x cols of patch size pixels): the picture and
 * #patch=N use the first store's grid, and each store follows the patch under that patch's
 * centre, a centre on a border going to the upper / left patch (report/patches.py, the same rule).
 * DINOv2's register tokens have their own rows (&query=regK), as the report's register figure.
 *
 * For tests and readers, the page state is public: window.probeExplorer.state (patch, query,
 * per-store patch, grid, top-5 keys, window, top k, digests of every drawn map) and data-patch /
 * data-query attributes on <body> and on the explorer's element.
 */
(function () {
  "use strict";
  var source = document.getElementById("probe-explorer-data");
  var root = document.getElementById("probe-explorer");
  if (!source || !root) { return; }
  var data = JSON.parse(source.textContent);

  function bytes(b64) {
    var s = atob(b64), out = new Uint8Array(s.length);
    for (var i = 0; i < s.length; i++) { out[i] = s.charCodeAt(i); }
    return out;
  }
  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) { node.textContent = text; }
    return node;
  }

  var R0 = data.grid[0], C0 = data.grid[1];
  function under(index, size, refSize) {  // row (or column) under the centre of row `index` of refSize-pixel patches
    return Math.ceil((2 * index + 1) * refSize / (2 * size)) - 1;
  }
  function patchIndices(b64, width) {  // patch indices: one byte each, or two (little-endian) on grids of 254 patches or more
    var raw = bytes(b64);
    if (width !== 2) { return raw; }
    var out = new Uint16Array(raw.length / 2);
    for (var i = 0; i < out.length; i++) { out[i] = raw[2 * i] | (raw[2 * i + 1] << 8); }
    return out;
  }
  var lut = { weight: bytes(data.lut.weight), cosine: bytes(data.lut.cosine) };
  var stores = data.stores.map(function (s) {
    var w = s.indexBytes;
    return {
      meta: s, R: s.rows, C: s.cols, N: s.rows * s.cols, CLS: w === 2 ? 65535 : 255,
      window: s.window ? patchIndices(s.window, w) : null,
      att: s.attention ? bytes(s.attention) : null,
      top: s.top ? patchIndices(s.top, w) : null,
      cos: s.cosine ? bytes(s.cosine) : null,
      topk: s.topk ? patchIndices(s.topk, w) : null,
      topCrop: s.topCrop ? patchIndices(s.topCrop, w) : null
    };
  });
  function followedPatch(s, patch) {  // the store's patch under the centre of the picture's patch; -1 when its grid leaves it unused
    var r = under(Math.floor(patch / C0), s.meta.size, data.size), c = under(patch % C0, s.meta.size, data.size);
    return (r >= 0 && r < s.R && c >= 0 && c < s.C) ? r * s.C + c : -1;
  }
  var anyClassToken = stores.some(function (s) { return s.meta.classToken && s.att; });
  var registers = Math.max.apply(null, [0].concat(stores.map(function (s) { return s.att ? s.meta.registers || 0 : 0; })));
  function knownQuery(q) { return q === "cls" ? anyClassToken : /^reg\d+$/.test(q) ? Number(q.slice(3)) < registers : q === "patch"; }

  // ---- drawing: one cell per patch, colours from matplotlib's own colour maps ----
  // a canvas knows its grid: data-rows / data-cols (patch p sits at row p / cols, column p % cols)
  function shape(canvas) { return { R: Number(canvas.dataset.rows), C: Number(canvas.dataset.cols) }; }
  function paint(canvas, values, table, lo, hi) {
    var g = shape(canvas), ctx = canvas.getContext("2d"), cell = canvas.width / g.C;
    for (var p = 0; p < g.R * g.C; p++) {
      var t = Math.max(0, Math.min(255, Math.round((values[p] - lo) / (hi - lo) * 255)));
      ctx.fillStyle = "rgb(" + table[3 * t] + "," + table[3 * t + 1] + "," + table[3 * t + 2] + ")";
      ctx.fillRect((p % g.C) * cell, Math.floor(p / g.C) * cell, Math.ceil(cell), Math.ceil(cell));
    }
  }
  function outline(canvas, p, colour, width, dash) {
    var g = shape(canvas);
    if (p < 0 || p >= g.R * g.C) { return; }
    var ctx = canvas.getContext("2d"), cell = canvas.width / g.C;
    ctx.save();
    ctx.strokeStyle = colour; ctx.lineWidth = width; ctx.setLineDash(dash || []);
    ctx.strokeRect((p % g.C) * cell + width / 2, Math.floor(p / g.C) * cell + width / 2, cell - width, cell - width);
    ctx.restore();
  }
  function dot(canvas, p, colour) {
    var g = shape(canvas), ctx = canvas.getContext("2d"), cell = canvas.width / g.C;
    ctx.beginPath();
    ctx.fillStyle = colour;
    ctx.arc((p % g.C + 0.5) * cell, (Math.floor(p / g.C) + 0.5) * cell, Math.max(2, cell / 7), 0, 2 * Math.PI);
    ctx.fill();
  }
  function cross(canvas, p) {
    var g = shape(canvas), ctx = canvas.getContext("2d"), cell = canvas.width / g.C, x = (p % g.C) * cell, y = Math.floor(p / g.C) * cell, m = cell * 0.25;
    ctx.save(); ctx.strokeStyle = "white"; ctx.lineWidth = Math.max(2, cell / 8);
    ctx.beginPath(); ctx.moveTo(x + m, y + m); ctx.lineTo(x + cell - m, y + cell - m);
    ctx.moveTo(x + cell - m, y + m); ctx.lineTo(x + m, y + cell - m); ctx.stroke(); ctx.restore();
  }
  function blank(canvas, text) {
    var ctx = canvas.getContext("2d");
    ctx.fillStyle = "#ddd"; ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.fillStyle = "#333"; ctx.font = "12px sans-serif"; ctx.textAlign = "center";
    ctx.fillText(text, canvas.width / 2, canvas.height / 2);
  }
  function digest(canvas) {  // FNV-1a over the pixels: changes whenever the drawing does
    var px = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data, h = 0x811c9dc5;
    for (var i = 0; i < px.length; i += 1) { h ^= px[i]; h = Math.imul(h, 0x01000193) >>> 0; }
    return h.toString(16);
  }

  function bar(table, left, right) {  // a colour scale drawn from the same table as the maps
    var box = el("span", { "class": "pe-scale" }), c = el("canvas", { width: "128", height: "10" }), ctx = c.getContext("2d");
    for (var x = 0; x < 128; x++) {
      var t = 2 * x;
      ctx.fillStyle = "rgb(" + table[3 * t] + "," + table[3 * t + 1] + "," + table[3 * t + 2] + ")";
      ctx.fillRect(x, 0, 1, 10);
    }
    box.appendChild(el("span", {}, left)); box.appendChild(c); box.appendChild(el("span", {}, right));
    return box;
  }
  function legend() {
    var box = el("div", { "class": "pe-legend" });
    box.appendChild(el("span", {}, "attention (each map to its own largest weight):"));
    box.appendChild(bar(lut.weight, "0", "max"));
    box.appendChild(el("span", {}, "cosine:"));
    box.appendChild(bar(lut.cosine, "−1", "+1"));
    box.appendChild(el("span", {}, "blue squares: five largest weights · dashed white: the patch · on the cosine map: × the patch, " +
      "dashed: its 3×3 window (wraps around), thick: the window's top k, dots: the crop's 8 most similar"));
    return box;
  }

  // ---- the page ----
  var controls = el("div", { "class": "pe-controls" });
  var readout = el("span", { "class": "pe-readout" });
  controls.appendChild(readout);
  var buttons = {};
  var queries = ["patch", "cls"];
  for (var rq = 0; rq < registers; rq++) { queries.push("reg" + rq); }
  queries.forEach(function (q) {
    if (!knownQuery(q)) { return; }
    var text = q === "patch" ? "the patch's row" : q === "cls" ? "the class token's row" : "register " + q.slice(3) + "'s row";
    var b = el("button", { type: "button", "data-query": q }, text);
    b.addEventListener("click", function () { setQuery(q); });
    buttons[q] = b; controls.appendChild(b);
  });
  root.appendChild(controls);
  root.appendChild(legend());
  var body = el("div", { "class": "pe-body" });
  root.appendChild(body);

  var picture = el("div", { "class": "pe-picture" });
  var cellPx = Math.floor(392 / Math.max(R0, C0));
  var imageCanvas = el("canvas", { width: String(cellPx * C0), height: String(cellPx * R0), id: "pe-image", "data-rows": String(R0),
                                   "data-cols": String(C0), "aria-label": "the followed image; click a patch" });
  picture.appendChild(imageCanvas);
  picture.appendChild(el("p", { "class": "pe-caption" }, data.image + (data.pictureNote ? " — " + data.pictureNote : "")));
  body.appendChild(picture);
  var img = null;
  if (data.picture) {
    img = new Image();
    img.onload = function () { drawPicture(); };
    img.src = data.picture;
  }

  function gridCanvas(s, side, attrs) {  // a map of the store's own grid, about `side` pixels on its longer edge
    var cell = Math.max(2, Math.round(side / Math.max(s.R, s.C)));
    attrs.width = String(cell * s.C); attrs.height = String(cell * s.R);
    attrs["data-rows"] = String(s.R); attrs["data-cols"] = String(s.C);
    return el("canvas", attrs);
  }
  var panels = el("div", { "class": "pe-stores" });
  body.appendChild(panels);
  var views = stores.map(function (s, i) {
    var box = el("div", { "class": "pe-store", "data-store": String(i) });
    box.appendChild(el("h4", {}, s.meta.label + (s.R ? " (" + s.R + " × " + s.C + " patches of " + s.meta.size + " px)" : "")));
    var v = { box: box, heads: [], captions: [] };
    v.where = el("p", { "class": "pe-where" }, "");
    box.appendChild(v.where);
    if (s.att) {
      var att = el("div", { "class": "pe-attention" });
      v.mean = gridCanvas(s, 196, { "class": "pe-mean" });
      var meanBox = el("figure", {});
      meanBox.appendChild(v.mean);
      v.meanCaption = el("figcaption", {}, "");
      meanBox.appendChild(v.meanCaption);
      att.appendChild(meanBox);
      var heads = el("div", { "class": "pe-heads" });
      for (var h = 0; h < s.meta.heads; h++) {
        var f = el("figure", {});
        var c = gridCanvas(s, 98, { "class": "pe-head", "data-head": String(h) });
        var cap = el("figcaption", {}, "");
        f.appendChild(c); f.appendChild(cap); heads.appendChild(f);
        v.heads.push(c); v.captions.push(cap);
      }
      att.appendChild(heads);
      box.appendChild(att);
    } else if (!s.meta.note) {
      box.appendChild(el("p", { "class": "note missing" }, "No last-block attention of this image in this store."));
    }
    if (s.cos) {
      var cf = el("figure", { "class": "pe-cosine" });
      v.cosine = gridCanvas(s, 196, { "class": "pe-cos" });
      v.cosineCaption = el("figcaption", {}, "");
      cf.appendChild(v.cosine); cf.appendChild(v.cosineCaption);
      box.appendChild(cf);
    } else if (!s.meta.note) {
      box.appendChild(el("p", { "class": "note missing" }, "No 224 tokens of this image in this store."));
    }
    if (s.meta.note) { box.appendChild(el("p", { "class": "note" }, s.meta.note)); }
    panels.appendChild(box);
    return v;
  });

  var state = { patch: data.patch, query: "patch", image: data.image, grid: [R0, C0], stores: {}, window: [], ready: false, picture: false };

  function drawPicture() {
    var ctx = imageCanvas.getContext("2d"), W = imageCanvas.width, H = imageCanvas.height;
    if (img && img.complete && img.naturalWidth) {  // the 224 view; the grid covers its first R0·size × C0·size pixels
      ctx.drawImage(img, 0, 0, W * data.view / (C0 * data.size), H * data.view / (R0 * data.size));
      state.picture = true;
    } else { blank(imageCanvas, img ? "" : "no picture of this image"); }
    ctx.save(); ctx.strokeStyle = "rgba(255,255,255,0.55)"; ctx.lineWidth = 1;
    for (var k = 1; k < C0; k++) { ctx.beginPath(); ctx.moveTo(k * cellPx + 0.5, 0); ctx.lineTo(k * cellPx + 0.5, H); ctx.stroke(); }
    for (var j = 1; j < R0; j++) { ctx.beginPath(); ctx.moveTo(0, j * cellPx + 0.5); ctx.lineTo(W, j * cellPx + 0.5); ctx.stroke(); }
    ctx.restore();
    outline(imageCanvas, state.patch, "#F0E442", 3);
  }

  function weight(s, h, q, key) {  // dequantised weight of row q (token index), key (token index)
    var T = s.meta.tokens;
    return s.att[(h * T + q) * T + key] / 255 * s.meta.rowMax[h * T + q];
  }
  function queryRow(s) {  // the row drawn for the current query (a token index), or a reason it has none
    var cls = s.meta.classToken ? 1 : 0;
    if (state.query === "cls") { return cls ? 0 : "this network has no class token"; }
    if (state.query.slice(0, 3) === "reg") {
      var r = Number(state.query.slice(3));
      return r < (s.meta.registers || 0) ? cls + r : "this network has no register " + r;
    }
    return s.meta.start + s.patch;
  }

  function drawStore(i) {
    var s = stores[i], v = views[i], N = s.N, st = { heads: [], top5: [], effective: [], grid: [s.R, s.C] };
    s.patch = s.R ? followedPatch(s, state.patch) : -1;
    st.patch = s.patch;
    if (v.where) {
      v.where.textContent = s.patch < 0 ? "" : "patch " + s.patch + " (row " + Math.floor(s.patch / s.C) + ", column " + (s.patch % s.C) + ")" +
        (i > 0 && (s.R !== R0 || s.C !== C0) ? ", the patch under the centre of the picture's patch " + state.patch : "");
    }
    if (s.att && s.patch >= 0) {
      var T = s.meta.tokens, H = s.meta.heads, isPatch = state.query === "patch";
      var q = queryRow(s);
      if (typeof q === "string") {
        blank(v.mean, "–");
        v.meanCaption.textContent = q;
        v.heads.forEach(function (c, h) { blank(c, "–"); v.captions[h].textContent = "head " + h; });
      } else {
        var mean = new Float32Array(N), start = s.meta.start;
        for (var h = 0; h < H; h++) {
          var row = new Float32Array(N), hi = 0;
          for (var p = 0; p < N; p++) { row[p] = weight(s, h, q, start + p); hi = Math.max(hi, row[p]); mean[p] += row[p] / H; }
          paint(v.heads[h], row, lut.weight, 0, hi > 0 ? hi : 1);
          var keys = [];
          for (var r = 0; r < 5; r++) {
            var key = s.top[(h * T + q) * 5 + r];
            keys.push(key === s.CLS ? -1 : key === s.CLS - 1 ? -2 : key);  // -2: a register token
            outline(v.heads[h], key >= s.CLS - 1 ? -1 : key, "#56B4E9", 2);
          }
          if (isPatch) { outline(v.heads[h], s.patch, "white", 1, [3, 2]); }
          var eff = s.meta.effective[h * T + q];
          v.captions[h].textContent = "head " + h + ": e^H " + eff.toFixed(1);
          st.top5.push(keys); st.effective.push(eff);
        }
        var mhi = 0;
        for (var j = 0; j < N; j++) { mhi = Math.max(mhi, mean[j]); }
        paint(v.mean, mean, lut.weight, 0, mhi > 0 ? mhi : 1);
        if (isPatch) { outline(v.mean, s.patch, "white", 2, [5, 3]); }
        var what = isPatch ? "patch " + s.patch : state.query === "cls" ? "class token" : "register " + state.query.slice(3);
        v.meanCaption.textContent = what + ": mean over " + H + " heads";
      }
      st.heads = v.heads.map(digest);
      st.mean = digest(v.mean);
    }
    if (s.cos && s.patch >= 0) {
      var a = s.patch, cosRow = new Float32Array(N);
      for (var k = 0; k < N; k++) { cosRow[k] = s.cos[a * N + k] / 127.5 - 1; }
      paint(v.cosine, cosRow, lut.cosine, -1, 1);
      var win = [], topk = [], crop = [], K = s.meta.k, inside = 0;
      for (var m = 0; m < 8; m++) { win.push(s.window[a * 8 + m]); outline(v.cosine, win[m], "black", 1, [4, 3]); }
      for (var t = 0; t < K; t++) { topk.push(s.topk[a * K + t]); outline(v.cosine, topk[t], "black", 3); }
      for (var c = 0; c < 8; c++) {
        crop.push(s.topCrop[a * 8 + c]); dot(v.cosine, crop[c], "black");
        if (win.indexOf(crop[c]) >= 0) { inside += 1; }
      }
      cross(v.cosine, a);
      v.cosineCaption.textContent = "cosine to patch " + a + "; window top " + K + ": " + topk.join(", ") + "; crop's top 8 in the window: " + inside + " of 8";
      st.cosine = digest(v.cosine); st.topk = topk; st.topCrop = crop; st.inWindow = inside; st.window = win;
    }
    state.stores[s.meta.label] = st;
  }

  function render() {
    drawPicture();
    var r = Math.floor(state.patch / C0), c = state.patch % C0;
    var what = state.query === "cls" ? " — showing the class token's row" : state.query === "patch" ? "" : " — showing register " + state.query.slice(3) + "'s row";
    readout.textContent = "patch " + state.patch + " (row " + r + ", column " + c + " of " + R0 + " × " + C0 + ")" + what;
    Object.keys(buttons).forEach(function (q) { buttons[q].classList.toggle("active", q === state.query); });
    for (var i = 0; i < stores.length; i++) { drawStore(i); }
    var first = stores.map(function (s) { return state.stores[s.meta.label]; }).filter(function (st) { return st.window; })[0];
    state.window = first ? first.window : [];
    document.body.setAttribute("data-patch", String(state.patch));
    document.body.setAttribute("data-query", state.query);
    root.setAttribute("data-patch", String(state.patch));
    root.setAttribute("data-query", state.query);
    state.ready = true;
  }

  function fragment() {
    var hash = "#patch=" + state.patch + (state.query !== "patch" ? "&query=" + state.query : "");
    if (location.hash !== hash) {
      try { history.replaceState(null, "", hash); } catch (e) { /* some file:// settings refuse; the state is still right */ }
    }
  }
  function select(patch) {
    patch = Math.floor(Number(patch));
    if (!(patch >= 0 && patch < R0 * C0)) { return false; }
    state.patch = patch; render(); fragment();
    return true;
  }
  function setQuery(query) {
    state.query = knownQuery(query) ? query : "patch";
    render(); fragment();
  }
  function applyFragment() {
    var m = /patch=(\d+)/.exec(location.hash), q = /query=(cls|patch|reg\d+)/.exec(location.hash);
    if (m && Number(m[1]) < R0 * C0) { state.patch = Number(m[1]); }
    if (q) { state.query = knownQuery(q[1]) ? q[1] : "patch"; }
    render();
  }

  function patchAt(event) {  // the picture's patch under the mouse
    var box = imageCanvas.getBoundingClientRect();
    var x = Math.floor((event.clientX - box.left) / box.width * C0), y = Math.floor((event.clientY - box.top) / box.height * R0);
    return Math.max(0, Math.min(R0 - 1, y)) * C0 + Math.max(0, Math.min(C0 - 1, x));
  }
  imageCanvas.addEventListener("click", function (event) { select(patchAt(event)); });
  imageCanvas.addEventListener("mousemove", function (event) { imageCanvas.title = "patch " + patchAt(event); });
  window.addEventListener("hashchange", applyFragment);

  window.probeExplorer = { state: state, select: select, setQuery: setQuery, data: data };
  applyFragment();
})();
