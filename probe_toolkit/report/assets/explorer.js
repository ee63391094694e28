/* probe report: the patch explorer (plain JavaScript, no network, no libraries).
 *
 * Reads the JSON in <script id="probe-explorer-data"> (written by probe_toolkit/report/explorer.py):
 * 8-bit attention rows and cosines, base64, with every ranking computed exactly in Python.
 * Click a patch of the picture (or open the page at #patch=N, #patch=N&query=cls) and every
 * store redraws: the row's mean over heads and each head (five largest weights outlined), and
 * the cosine map with the 3x3 window (wrap-around), its top k and the crop's top 8.
 *
 * For tests and readers, the page state is public: window.probeExplorer.state (patch, query,
 * per-store top-5 keys, window, top k, digests of every drawn map) and data-patch / data-query
 * attributes on <body> and on the explorer's element.
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

  var G = data.grid, N = G * G, CLS = data.indexBytes === 2 ? 65535 : 255;
  function patchIndices(b64) {  // patch indices: one byte each, or two (little-endian) on grids of 255 patches or more
    var raw = bytes(b64);
    if (data.indexBytes !== 2) { return raw; }
    var out = new Uint16Array(raw.length / 2);
    for (var i = 0; i < out.length; i++) { out[i] = raw[2 * i] | (raw[2 * i + 1] << 8); }
    return out;
  }
  var lut = { weight: bytes(data.lut.weight), cosine: bytes(data.lut.cosine) };
  var windowTable = patchIndices(data.window);
  var stores = data.stores.map(function (s) {
    return {
      meta: s,
      att: s.attention ? bytes(s.attention) : null,
      top: s.top ? patchIndices(s.top) : null,
      cos: s.cosine ? bytes(s.cosine) : null,
      topk: s.topk ? patchIndices(s.topk) : null,
      topCrop: s.topCrop ? patchIndices(s.topCrop) : null
    };
  });
  var anyClassToken = stores.some(function (s) { return s.meta.classToken && s.att; });

  // ---- drawing: one cell per patch, colours from matplotlib's own colour maps ----
  function paint(canvas, values, table, lo, hi) {
    var ctx = canvas.getContext("2d"), cell = canvas.width / G;
    for (var p = 0; p < N; p++) {
      var t = Math.max(0, Math.min(255, Math.round((values[p] - lo) / (hi - lo) * 255)));
      ctx.fillStyle = "rgb(" + table[3 * t] + "," + table[3 * t + 1] + "," + table[3 * t + 2] + ")";
      ctx.fillRect((p % G) * cell, Math.floor(p / G) * cell, Math.ceil(cell), Math.ceil(cell));
    }
  }
  function outline(canvas, p, colour, width, dash) {
    if (p < 0 || p >= N) { return; }
    var ctx = canvas.getContext("2d"), cell = canvas.width / G;
    ctx.save();
    ctx.strokeStyle = colour; ctx.lineWidth = width; ctx.setLineDash(dash || []);
    ctx.strokeRect((p % G) * cell + width / 2, Math.floor(p / G) * cell + width / 2, cell - width, cell - width);
    ctx.restore();
  }
  function dot(canvas, p, colour) {
    var ctx = canvas.getContext("2d"), cell = canvas.width / G;
    ctx.beginPath();
    ctx.fillStyle = colour;
    ctx.arc((p % G + 0.5) * cell, (Math.floor(p / G) + 0.5) * cell, Math.max(2, cell / 7), 0, 2 * Math.PI);
    ctx.fill();
  }
  function cross(canvas, p) {
    var ctx = canvas.getContext("2d"), cell = canvas.width / G, x = (p % G) * cell, y = Math.floor(p / G) * cell, m = cell * 0.25;
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
  ["patch", "cls"].forEach(function (q) {
    if (q === "cls" && !anyClassToken) { return; }
    var b = el("button", { type: "button", "data-query": q }, q === "patch" ? "the patch's row" : "the class token's row");
    b.addEventListener("click", function () { setQuery(q); });
    buttons[q] = b; controls.appendChild(b);
  });
  root.appendChild(controls);
  root.appendChild(legend());
  var body = el("div", { "class": "pe-body" });
  root.appendChild(body);

  var picture = el("div", { "class": "pe-picture" });
  var cellPx = Math.floor(392 / G);
  var imageCanvas = el("canvas", { width: String(cellPx * G), height: String(cellPx * G), id: "pe-image", "aria-label": "the followed image; click a patch" });
  picture.appendChild(imageCanvas);
  picture.appendChild(el("p", { "class": "pe-caption" }, data.image + (data.pictureNote ? " — " + data.pictureNote : "")));
  body.appendChild(picture);
  var img = null;
  if (data.picture) {
    img = new Image();
    img.onload = function () { drawPicture(); };
    img.src = data.picture;
  }

  var panels = el("div", { "class": "pe-stores" });
  body.appendChild(panels);
  var views = stores.map(function (s, i) {
    var box = el("div", { "class": "pe-store", "data-store": String(i) });
    box.appendChild(el("h4", {}, s.meta.label));
    var v = { box: box, heads: [], captions: [] };
    if (s.att) {
      var att = el("div", { "class": "pe-attention" });
      v.mean = el("canvas", { width: String(G * 14), height: String(G * 14), "class": "pe-mean" });
      var meanBox = el("figure", {});
      meanBox.appendChild(v.mean);
      v.meanCaption = el("figcaption", {}, "");
      meanBox.appendChild(v.meanCaption);
      att.appendChild(meanBox);
      var heads = el("div", { "class": "pe-heads" });
      for (var h = 0; h < s.meta.heads; h++) {
        var f = el("figure", {});
        var c = el("canvas", { width: String(G * 7), height: String(G * 7), "class": "pe-head", "data-head": String(h) });
        var cap = el("figcaption", {}, "");
        f.appendChild(c); f.appendChild(cap); heads.appendChild(f);
        v.heads.push(c); v.captions.push(cap);
      }
      att.appendChild(heads);
      box.appendChild(att);
    } else {
      box.appendChild(el("p", { "class": "note missing" }, "No last-block attention of this image in this store."));
    }
    if (s.cos) {
      var cf = el("figure", { "class": "pe-cosine" });
      v.cosine = el("canvas", { width: String(G * 14), height: String(G * 14), "class": "pe-cos" });
      v.cosineCaption = el("figcaption", {}, "");
      cf.appendChild(v.cosine); cf.appendChild(v.cosineCaption);
      box.appendChild(cf);
    } else {
      box.appendChild(el("p", { "class": "note missing" }, "No 224 tokens of this image in this store."));
    }
    if (s.meta.note) { box.appendChild(el("p", { "class": "note" }, s.meta.note)); }
    panels.appendChild(box);
    return v;
  });

  var state = { patch: data.patch, query: "patch", image: data.image, grid: G, stores: {}, window: [], ready: false, picture: false };

  function drawPicture() {
    var ctx = imageCanvas.getContext("2d"), W = imageCanvas.width;
    if (img && img.complete && img.naturalWidth) { ctx.drawImage(img, 0, 0, W, W); state.picture = true; }
    else { blank(imageCanvas, img ? "" : "no picture of this image"); }
    ctx.save(); ctx.strokeStyle = "rgba(255,255,255,0.55)"; ctx.lineWidth = 1;
    for (var k = 1; k < G; k++) {
      ctx.beginPath(); ctx.moveTo(k * cellPx + 0.5, 0); ctx.lineTo(k * cellPx + 0.5, W); ctx.stroke();
      ctx.beginPath(); ctx.moveTo(0, k * cellPx + 0.5); ctx.lineTo(W, k * cellPx + 0.5); ctx.stroke();
    }
    ctx.restore();
    outline(imageCanvas, state.patch, "#F0E442", 3);
  }

  function weight(s, h, q, key) {  // dequantised weight of row q (token index), key (token index)
    var T = s.meta.tokens;
    return s.att[(h * T + q) * T + key] / 255 * s.meta.rowMax[h * T + q];
  }

  function drawStore(i) {
    var s = stores[i], v = views[i], st = { heads: [], top5: [], effective: [] };
    if (s.att) {
      var T = s.meta.tokens, start = s.meta.start, H = s.meta.heads;
      var useCls = state.query === "cls";
      if (useCls && !s.meta.classToken) {
        blank(v.mean, "no class token");
        v.meanCaption.textContent = "this network has no class token";
        v.heads.forEach(function (c, h) { blank(c, "–"); v.captions[h].textContent = "head " + h; });
      } else {
        var q = useCls ? 0 : start + state.patch;
        var mean = new Float32Array(N), rowValues = [];
        for (var h = 0; h < H; h++) {
          var row = new Float32Array(N), hi = 0;
          for (var p = 0; p < N; p++) { row[p] = weight(s, h, q, start + p); hi = Math.max(hi, row[p]); mean[p] += row[p] / H; }
          rowValues.push(row);
          paint(v.heads[h], row, lut.weight, 0, hi > 0 ? hi : 1);
          var keys = [];
          for (var r = 0; r < 5; r++) {
            var key = s.top[(h * T + q) * 5 + r];
            keys.push(key === CLS ? -1 : key === CLS - 1 ? -2 : key);  // -2: a register token
            outline(v.heads[h], key >= CLS - 1 ? -1 : key, "#56B4E9", 2);
          }
          if (!useCls) { outline(v.heads[h], state.patch, "white", 1, [3, 2]); }
          var eff = s.meta.effective[h * T + q];
          v.captions[h].textContent = "head " + h + ": e^H " + eff.toFixed(1);
          st.top5.push(keys); st.effective.push(eff);
        }
        var mhi = 0;
        for (var j = 0; j < N; j++) { mhi = Math.max(mhi, mean[j]); }
        paint(v.mean, mean, lut.weight, 0, mhi > 0 ? mhi : 1);
        if (!useCls) { outline(v.mean, state.patch, "white", 2, [5, 3]); }
        v.meanCaption.textContent = (useCls ? "class token" : "patch " + state.patch) + ": mean over " + H + " heads";
      }
      st.heads = v.heads.map(digest);
      st.mean = digest(v.mean);
    }
    if (s.cos) {
      var a = state.patch, cosRow = new Float32Array(N);
      for (var k = 0; k < N; k++) { cosRow[k] = s.cos[a * N + k] / 127.5 - 1; }
      paint(v.cosine, cosRow, lut.cosine, -1, 1);
      var win = [], topk = [], crop = [], K = s.meta.k, inside = 0;
      for (var m = 0; m < 8; m++) { win.push(windowTable[a * 8 + m]); outline(v.cosine, win[m], "black", 1, [4, 3]); }
      for (var t = 0; t < K; t++) { topk.push(s.topk[a * K + t]); outline(v.cosine, topk[t], "black", 3); }
      for (var c = 0; c < 8; c++) {
        crop.push(s.topCrop[a * 8 + c]); dot(v.cosine, crop[c], "black");
        if (win.indexOf(crop[c]) >= 0) { inside += 1; }
      }
      cross(v.cosine, a);
      v.cosineCaption.textContent = "cosine to patch " + a + "; window top " + K + ": " + topk.join(", ") + "; crop's top 8 in the window: " + inside + " of 8";
      st.cosine = digest(v.cosine); st.topk = topk; st.topCrop = crop; st.inWindow = inside;
      state.window = win;
    }
    state.stores[s.meta.label] = st;
  }

  function render() {
    drawPicture();
    var r = Math.floor(state.patch / G), c = state.patch % G;
    readout.textContent = "patch " + state.patch + " (row " + r + ", column " + c + ")" + (state.query === "cls" ? " — showing the class token's row" : "");
    Object.keys(buttons).forEach(function (q) { buttons[q].classList.toggle("active", q === state.query); });
    for (var i = 0; i < stores.length; i++) { drawStore(i); }
    document.body.setAttribute("data-patch", String(state.patch));
    document.body.setAttribute("data-query", state.query);
    root.setAttribute("data-patch", String(state.patch));
    root.setAttribute("data-query", state.query);
    state.ready = true;
  }

  function fragment() {
    var hash = "#patch=" + state.patch + (state.query === "cls" ? "&query=cls" : "");
    if (location.hash !== hash) {
      try { history.replaceState(null, "", hash); } catch (e) { /* some file:// settings refuse; the state is still right */ }
    }
  }
  function select(patch) {
    patch = Math.floor(Number(patch));
    if (!(patch >= 0 && patch < N)) { return false; }
    state.patch = patch; render(); fragment();
    return true;
  }
  function setQuery(query) {
    state.query = (query === "cls" && anyClassToken) ? "cls" : "patch";
    render(); fragment();
  }
  function applyFragment() {
    var m = /patch=(\d+)/.exec(location.hash), q = /query=(cls|patch)/.exec(location.hash);
    if (m && Number(m[1]) < N) { state.patch = Number(m[1]); }
    if (q) { state.query = (q[1] === "cls" && anyClassToken) ? "cls" : "patch"; }
    render();
  }

  imageCanvas.addEventListener("click", function (event) {
    var box = imageCanvas.getBoundingClientRect();
    var x = (event.clientX - box.left) / box.width * G, y = (event.clientY - box.top) / box.height * G;
    select(Math.min(G - 1, Math.floor(y)) * G + Math.min(G - 1, Math.floor(x)));
  });
  imageCanvas.addEventListener("mousemove", function (event) {
    var box = imageCanvas.getBoundingClientRect();
    var x = Math.floor((event.clientX - box.left) / box.width * G), y = Math.floor((event.clientY - box.top) / box.height * G);
    imageCanvas.title = "patch " + (y * G + x);
  });
  window.addEventListener("hashchange", applyFragment);

  window.probeExplorer = { state: state, select: select, setQuery: setQuery, data: data };
  applyFragment();
})();
