// qgpu-dask viewer: the browser half of the interactive 4D-STEM viewer.
//
// One plain ES module, used two ways: as an anywidget front end (render) and by the standalone page
// (mount + websocketTransport). The messages are those of qgpu_dask/view/protocol.py: JSON asks out,
// answers in as a JSON header plus binary buffers (little-endian typed arrays).

const SVG_NS = "http://www.w3.org/2000/svg";
const CSS_SIDE = 400; // CSS pixels on the longest side of the image, pattern and phase image
const AXIS_PX = 36; // CSS pixels for the tick labels left of a picture
const TILE_SIDE = 120; // CSS pixels on the longest side of a grid tile
const EXPORT_SIDE = 512; // pixels on the longest side of each exported panel
const SAMPLE_MAX = 65536; // values looked at for percentiles
const GRAB_PX = 4; // CSS pixels within which an edge is grabbed
const STALL_MS = 20000; // an ask unanswered this long no longer blocks its channel
const PLAY_MS = 300;
const MODES = ["detector", "com_row", "com_col", "dpc", "ssb"];
const OPTICS_MODES = ["dpc", "ssb"]; // the server refuses these without Optics (state.py)
const DETECTOR_KINDS = ["disk", "annulus", "sector", "rectangle", "polygon"];
const PHASE_METHODS = ["ssb", "direct-phase", "direct-complex", "parallax"]; // phase.METHODS, until the state names them
const PHASE_UPSAMPLINGS = ["auto", 1, 2, 3];
const SPECTRUM_SIDE = 160; // CSS pixels on the longest side of the power spectrum
const SLIDER_STEPS = 500; // about this many slider steps over a C10 or C12 range (a round step)
const NUDGE = 10; // Shift + arrow moves a slider this many steps

// --- wire ------------------------------------------------------------------------------------------

// dtype names of protocol.WIRE_TYPES -> [typed array, bytes per element]
const WIRE = {
  uint8: [Uint8Array, 1], uint16: [Uint16Array, 2], uint32: [Uint32Array, 4], uint64: [BigUint64Array, 8],
  int16: [Int16Array, 2], int32: [Int32Array, 4], int64: [BigInt64Array, 8],
  float32: [Float32Array, 4], float64: [Float64Array, 8],
};

// The numbers of one answer buffer (ArrayBuffer, DataView or typed array), copied into a fresh aligned
// ArrayBuffer first; 64-bit integers become a Float64Array of Numbers (exact below 2**53).
export function decodeArray(buffer, dtype, shape) {
  const spec = WIRE[dtype];
  if (!spec) throw new Error(`unknown dtype ${dtype}`);
  const count = shape.reduce((a, b) => a * b, 1);
  const bytes = count * spec[1];
  const source = buffer instanceof ArrayBuffer ? buffer : buffer.buffer;
  const offset = buffer instanceof ArrayBuffer ? 0 : buffer.byteOffset;
  const available = buffer instanceof ArrayBuffer ? buffer.byteLength : buffer.byteLength;
  if (available < bytes) throw new Error(`a ${dtype} ${shape.join("x")} array needs ${bytes} bytes, got ${available}`);
  const array = new spec[0](source.slice(offset, offset + bytes));
  return spec[1] === 8 && dtype !== "float64" ? Float64Array.from(array, Number) : array;
}

// One WebSocket frame: uint32 LE header length | JSON header (space padded) | 8-byte aligned buffers.
export function unframe(data) {
  const length = new DataView(data).getUint32(0, true);
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(data, 4, length)));
  const buffers = [];
  let at = 4 + length;
  for (const size of header.buffers || []) {
    at = Math.ceil(at / 8) * 8; // already aligned by the protocol; rounding keeps us safe if not
    buffers.push(data.slice(at, at + size));
    at += size;
  }
  return [header, buffers];
}

// A transport over a WebSocket: asks as JSON text frames (queued until open), answers as binary frames.
export function websocketTransport(url) {
  const answerers = new Set();
  const closers = new Set();
  const queue = [];
  let closed = null;
  const ws = new WebSocket(url);
  ws.binaryType = "arraybuffer";
  ws.addEventListener("open", () => {
    for (const ask of queue.splice(0)) ws.send(JSON.stringify(ask));
  });
  ws.addEventListener("message", (event) => {
    let answer;
    try {
      answer = typeof event.data === "string" ? [JSON.parse(event.data), []] : unframe(event.data);
    } catch (err) {
      answer = [{ type: "error", seq: null, ask: "frame", message: `unreadable answer: ${err.message}` }, []];
    }
    for (const cb of answerers) cb(...answer);
  });
  ws.addEventListener("close", (event) => {
    closed = { code: event.code, reason: event.reason };
    for (const cb of closers) cb(closed);
  });
  return {
    send(ask) {
      if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(ask));
      else if (ws.readyState === WebSocket.CONNECTING) queue.push(ask);
    },
    onAnswer(cb) { answerers.add(cb); return () => answerers.delete(cb); },
    onClose(cb) { closers.add(cb); if (closed) cb(closed); return () => closers.delete(cb); },
    close() { ws.close(); },
  };
}

// anywidget: custom messages both ways; buffers arrive as DataViews.
export function render({ model, el }) {
  const answerers = new Set();
  const onMessage = (msg, buffers = []) => {
    const copies = buffers.map((b) => (b instanceof ArrayBuffer ? b : b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength)));
    for (const cb of answerers) cb(msg, copies);
  };
  model.on("msg:custom", onMessage);
  const viewer = mount(el, {
    send: (ask) => model.send(ask),
    onAnswer(cb) { answerers.add(cb); return () => answerers.delete(cb); },
  });
  return () => {
    model.off("msg:custom", onMessage);
    viewer.destroy();
  };
}

export default { render };

// --- colour ----------------------------------------------------------------------------------------

// Control points (evenly spaced) of each colour map, interpolated to 256 entries.
const CMAPS = {
  gray: ["#000000", "#ffffff"],
  viridis: ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"],
  inferno: ["#000004", "#1f0c48", "#550f6d", "#88226a", "#ba3655", "#e35933", "#f98e09", "#f9cb35", "#fcffa4"],
  magma: ["#000004", "#1c1044", "#4f127b", "#812581", "#b5367a", "#e55064", "#fb8761", "#fec287", "#fcfdbf"],
};
const lutCache = new Map();

// 256 colours packed as RGBA in a Uint32 (little-endian: the bytes of ImageData).
function lutOf(name) {
  if (lutCache.has(name)) return lutCache.get(name);
  const points = (CMAPS[name] || CMAPS.gray).map((hex) => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16)));
  const lut = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    const x = (i / 255) * (points.length - 1);
    const k = Math.min(Math.floor(x), points.length - 2);
    const f = x - k;
    const [r, g, b] = [0, 1, 2].map((j) => Math.round(points[k][j] + f * (points[k + 1][j] - points[k][j])));
    lut[i] = ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0;
  }
  lutCache.set(name, lut);
  return lut;
}

// Percentiles (0..100) of the finite values of a subsample of at most SAMPLE_MAX values.
function percentiles(values, ps) {
  const stride = Math.max(1, Math.ceil(values.length / SAMPLE_MAX));
  const sample = new Float64Array(Math.ceil(values.length / stride));
  let m = 0;
  for (let i = 0; i < values.length; i += stride) {
    const v = values[i];
    if (Number.isFinite(v)) sample[m++] = v;
  }
  if (m === 0) return ps.map(() => 0);
  const sorted = sample.subarray(0, m).sort();
  return ps.map((p) => {
    const x = (Math.min(100, Math.max(0, p)) / 100) * (m - 1);
    const k = Math.floor(x);
    return k + 1 < m ? sorted[k] + (x - k) * (sorted[k + 1] - sorted[k]) : sorted[k];
  });
}

// Exact finite min and max.
function extent(values) {
  let lo = Infinity, hi = -Infinity;
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  return lo <= hi ? [lo, hi] : [0, 0];
}

// Paint values (rows x cols) into a canvas of that pixel size through a colour map; NaN is transparent.
function paint(canvas, values, rows, cols, cmap, lo, hi, gamma = 1) {
  if (canvas.width !== cols) canvas.width = cols;
  if (canvas.height !== rows) canvas.height = rows;
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(cols, rows);
  const out = new Uint32Array(image.data.buffer);
  const lut = lutOf(cmap);
  const span = hi > lo ? hi - lo : 1;
  const g = gamma > 0 ? gamma : 1;
  for (let i = 0; i < rows * cols; i++) {
    const v = values[i];
    if (v !== v) continue; // NaN
    let t = (v - lo) / span;
    t = t <= 0 ? 0 : t >= 1 ? 1 : g === 1 ? t : Math.pow(t, g);
    out[i] = lut[(t * 255 + 0.5) | 0];
  }
  ctx.putImageData(image, 0, 0);
}

// --- numbers and text -------------------------------------------------------------------------------

const r2 = (x) => Math.round(x * 100) / 100;
const mod360 = (a) => ((a % 360) + 360) % 360;
const fmt = (x, d = 2) => (Number.isInteger(x) ? String(x) : x.toFixed(d));

// The exact value as text: integers and float64 as they are; float32 with its shortest round-trip digits.
function valueText(v, dtype) {
  if (v === undefined) return "";
  if (dtype !== "float32" || !Number.isFinite(v)) return String(v);
  for (let p = 1; p <= 9; p++) {
    const s = v.toPrecision(p);
    if (Math.fround(Number(s)) === v) return String(Number(s));
  }
  return String(v);
}

// A round length (1, 2 or 5 times a power of ten) near `target`.
function niceLength(target) {
  const p = 10 ** Math.floor(Math.log10(target));
  let best = p;
  for (const m of [1, 2, 5, 10]) if (Math.abs(Math.log(m * p / target)) < Math.abs(Math.log(best / target))) best = m * p;
  return Number(best.toPrecision(3));
}

function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

// --- detectors -------------------------------------------------------------------------------------
// Detector coordinates are (row, col) in detector pixels, pixel centres at integers; on screen a point is
// at ((col + 0.5) * s, (row + 0.5) * s) CSS pixels for a scale of s CSS pixels a detector pixel.

const rad = (deg) => (deg * Math.PI) / 180;
const dist = (a, b) => Math.hypot(a[0] - b[0], a[1] - b[1]);
// point at radius R and angle deg (counter-clockwise from +col, rows pointing down)
const polar = (c, R, deg) => [c[0] - R * Math.sin(rad(deg)), c[1] + R * Math.cos(rad(deg))];
const angleOf = (c, p) => mod360((Math.atan2(-(p[0] - c[0]), p[1] - c[1]) * 180) / Math.PI);

function inArc(deg, start, stop) {
  if (stop - start >= 360) return true;
  const a = mod360(deg), s = mod360(start), e = mod360(stop);
  return s <= e ? a >= s && a < e : a >= s || a < e;
}

function insidePolygon(p, vertices) {
  let inside = false;
  for (let i = 0, j = vertices.length - 1; i < vertices.length; j = i++) {
    const [r0, c0] = vertices[j], [r1, c1] = vertices[i];
    if (r0 > p[0] !== r1 > p[0] && p[1] < c0 + ((p[0] - r0) * (c1 - c0)) / (r1 - r0)) inside = !inside;
  }
  return inside;
}

function rectCorners(d) {
  return [[d.top, d.left], [d.top, d.right], [d.bottom, d.right], [d.bottom, d.left]];
}

// A sensible detector of `kind` on the bright-field disk (or the pattern's centre).
function defaultDetector(kind, detShape, calibration) {
  const [rows, cols] = detShape;
  const center = calibration?.bf_center ? calibration.bf_center.map(r2) : [(rows - 1) / 2, (cols - 1) / 2];
  const R = calibration?.bf_radius ? r2(calibration.bf_radius) : Math.max(1, r2(Math.min(rows, cols) / 8));
  const edge = Math.max(2, Math.min(rows, cols) / 2 - 1);
  switch (kind) {
    case "disk": return { kind, center, radius: R };
    case "annulus": return { kind, center, inner: r2(1.2 * R), outer: r2(Math.max(1.2 * R + 1, Math.min(3 * R, edge))) };
    case "sector": return { kind, center, inner: r2(0.5 * R), outer: r2(1.5 * R), start_deg: 315, stop_deg: 45 };
    case "rectangle": return { kind, top: r2(center[0] - R), left: r2(center[1] - R), bottom: r2(center[0] + R), right: r2(center[1] + R) };
    case "polygon":
      return { kind, vertices: [0, 1, 2, 3, 4].map((k) => polar(center, R, 90 + 72 * k).map(r2)) };
    default: throw new Error(`unknown detector kind ${kind}`);
  }
}

// What a pointer at p grabs: {part, index?} or null. tol is GRAB_PX in detector pixels.
function hitTest(d, p, tol) {
  if (!d) return null;
  if (d.kind === "polygon") {
    let best = null;
    d.vertices.forEach((v, index) => {
      const e = dist(v, p);
      if (e <= 1.5 * tol && (!best || e < best.e)) best = { part: "vertex", index, e };
    });
    if (best) return best;
    return insidePolygon(p, d.vertices) ? { part: "move" } : null;
  }
  if (d.kind === "rectangle") {
    const inside = p[0] >= d.top && p[0] <= d.bottom && p[1] >= d.left && p[1] <= d.right;
    const near = p[0] >= d.top - tol && p[0] <= d.bottom + tol && p[1] >= d.left - tol && p[1] <= d.right + tol;
    const onEdge = near && Math.min(Math.abs(p[0] - d.top), Math.abs(p[0] - d.bottom), Math.abs(p[1] - d.left), Math.abs(p[1] - d.right)) <= tol;
    if (onEdge) {
      const corners = rectCorners(d).map((c) => dist(c, p));
      return { part: "corner", index: corners.indexOf(Math.min(...corners)) };
    }
    return inside ? { part: "move" } : null;
  }
  const r = dist(p, d.center);
  if (d.kind === "disk") {
    if (Math.abs(r - d.radius) <= tol) return { part: "outer" };
    return r < d.radius ? { part: "move" } : null;
  }
  const a = angleOf(d.center, p);
  const arc = d.kind === "annulus" || inArc(a, d.start_deg, d.stop_deg);
  if (arc && Math.abs(r - d.outer) <= tol) return { part: "outer" };
  if (arc && d.inner > 0 && Math.abs(r - d.inner) <= tol) return { part: "inner" };
  if (d.kind === "sector" && d.stop_deg - d.start_deg < 360 && r >= d.inner - tol && r <= d.outer + tol) {
    for (const part of ["start_deg", "stop_deg"]) {
      const off = rad(a - d[part]);
      if (Math.cos(off) > 0 && Math.abs(r * Math.sin(off)) <= tol) return { part };
    }
  }
  if (d.kind === "annulus") return r < d.outer ? { part: "move" } : null; // the hole moves it too
  return arc && r >= d.inner && r <= d.outer ? { part: "move" } : null;
}

// The detector after dragging `grab` (taken at p0 on d0) to p.
function dragTo(d0, grab, p0, p) {
  const d = structuredClone(d0);
  const dr = p[0] - p0[0], dc = p[1] - p0[1];
  switch (grab.part) {
    case "move":
      if (d.center) d.center = [d0.center[0] + dr, d0.center[1] + dc];
      if (d.kind === "rectangle") Object.assign(d, { top: d0.top + dr, bottom: d0.bottom + dr, left: d0.left + dc, right: d0.right + dc });
      if (d.vertices) d.vertices = d0.vertices.map(([r, c]) => [r + dr, c + dc]);
      break;
    case "outer":
      if (d.kind === "disk") d.radius = Math.max(0.5, dist(p, d.center));
      else d.outer = Math.max(d.inner + 0.5, dist(p, d.center));
      break;
    case "inner":
      d.inner = Math.min(Math.max(0, dist(p, d.center)), d.outer - 0.5);
      break;
    case "start_deg":
    case "stop_deg": // an angle in 0..360; a stop below the start wraps through 0
      d[grab.part] = angleOf(d.center, p);
      break;
    case "corner": {
      const [row, col] = p;
      if (grab.index < 2) d.top = row; else d.bottom = row;
      if (grab.index === 0 || grab.index === 3) d.left = col; else d.right = col;
      [d.top, d.bottom] = [Math.min(d.top, d.bottom), Math.max(d.top, d.bottom, Math.min(d.top, d.bottom) + 0.5)];
      [d.left, d.right] = [Math.min(d.left, d.right), Math.max(d.left, d.right, Math.min(d.left, d.right) + 0.5)];
      break;
    }
    case "vertex":
      d.vertices[grab.index] = p.slice();
      break;
  }
  return tidy(d);
}

// Snap a centre to the bright-field disk within 3 px, a disk radius to its radius within 2 px.
function snapped(d, calibration) {
  if (!calibration?.bf_center || !d.center) return d;
  const out = { ...d };
  if (dist(d.center, calibration.bf_center) <= 3) out.center = calibration.bf_center.slice();
  if (d.kind === "disk" && calibration.bf_radius && Math.abs(d.radius - calibration.bf_radius) <= 2) out.radius = calibration.bf_radius;
  return tidy(out);
}

// Numbers rounded to 0.01 pixel (degrees to 0.1), so asks and readouts stay short.
function tidy(d) {
  const out = { ...d };
  for (const k of ["radius", "inner", "outer", "top", "left", "bottom", "right"]) if (k in out) out[k] = r2(out[k]);
  for (const k of ["start_deg", "stop_deg"]) if (k in out) out[k] = Math.round(out[k] * 10) / 10;
  if (out.center) out.center = out.center.map(r2);
  if (out.vertices) out.vertices = out.vertices.map((v) => v.map(r2));
  return out;
}

function describeDetector(d) {
  if (!d) return "no detector";
  const c = d.center ? `centre (${fmt(d.center[0])}, ${fmt(d.center[1])})` : "";
  switch (d.kind) {
    case "disk": return `disk  ${c}  radius ${fmt(d.radius)} px`;
    case "annulus": return `annulus  ${c}  inner ${fmt(d.inner)}  outer ${fmt(d.outer)} px`;
    case "sector": return `sector  ${c}  inner ${fmt(d.inner)}  outer ${fmt(d.outer)} px  angles ${fmt(d.start_deg, 1)}° → ${fmt(d.stop_deg, 1)}°`;
    case "rectangle": return `rectangle  rows ${fmt(d.top)}–${fmt(d.bottom)}  cols ${fmt(d.left)}–${fmt(d.right)}`;
    case "polygon": return `polygon  ${d.vertices.length} vertices  ${d.vertices.map((v) => `(${fmt(v[0], 1)}, ${fmt(v[1], 1)})`).join(" ")}`;
    default: return JSON.stringify(d);
  }
}

// --- overlays: one description drawn both as SVG (on screen) and on a canvas (exports) ---------------
// An item is {d: SVG path data in CSS pixels, stroke, fill, width, halo} or {text, x, y}.

const circlePath = (x, y, r) => `M${x + r} ${y}A${r} ${r} 0 1 0 ${x - r} ${y}A${r} ${r} 0 1 0 ${x + r} ${y}Z`;
const DET_STYLE = { stroke: "#ff4d4d", fill: "rgba(255,77,77,0.16)", width: 1.5, halo: true };
const MARK_STYLE = { stroke: "#00e5ff", fill: "none", width: 1.5, halo: true };
const HANDLE_STYLE = { stroke: "#ff4d4d", fill: "#ffffff", width: 1 };

function detectorItems(d, s) {
  if (!d) return [];
  const xy = ([r, c]) => [(c + 0.5) * s, (r + 0.5) * s];
  if (d.kind === "rectangle") {
    const [x0, y0] = xy([d.top, d.left]), [x1, y1] = xy([d.bottom, d.right]);
    return [{ d: `M${x0} ${y0}H${x1}V${y1}H${x0}Z`, ...DET_STYLE },
      ...rectCorners(d).map((c) => ({ d: circlePath(...xy(c), 3), ...HANDLE_STYLE }))];
  }
  if (d.kind === "polygon") {
    const pts = d.vertices.map(xy);
    return [{ d: `M${pts.map((p) => p.join(" ")).join("L")}Z`, ...DET_STYLE },
      ...pts.map((p) => ({ d: circlePath(...p, 3), ...HANDLE_STYLE }))];
  }
  const [x, y] = xy(d.center);
  const centre = { d: `M${x - 4} ${y}H${x + 4}M${x} ${y - 4}V${y + 4}`, ...DET_STYLE, fill: "none" };
  if (d.kind === "disk") return [{ d: circlePath(x, y, d.radius * s), ...DET_STYLE }, centre];
  const ring = circlePath(x, y, d.outer * s) + (d.inner > 0 ? circlePath(x, y, d.inner * s) : "");
  if (d.kind === "annulus" || d.stop_deg - d.start_deg >= 360) return [{ d: ring, ...DET_STYLE }, centre];
  const span = mod360(d.stop_deg - d.start_deg);
  if (span === 0) return [centre];
  const large = span > 180 ? 1 : 0;
  const at = (R, deg) => xy(polar(d.center, R, deg)).join(" ");
  const R = d.outer * s, r = d.inner * s;
  // outer arc counter-clockwise on screen (SVG sweep 0), back along the inner arc (sweep 1)
  const path = `M${at(d.outer, d.start_deg)}A${R} ${R} 0 ${large} 0 ${at(d.outer, d.stop_deg)}` +
    `L${at(d.inner, d.stop_deg)}A${r} ${r} 0 ${large} 1 ${at(d.inner, d.start_deg)}Z`;
  return [{ d: path, ...DET_STYLE }, centre];
}

function markItems(mark, s) {
  if (!mark) return [];
  if (mark.rect) {
    const [top, left, bottom, right] = mark.rect;
    return [{ d: `M${left * s} ${top * s}H${right * s}V${bottom * s}H${left * s}Z`, ...MARK_STYLE }];
  }
  const x = (mark.cursor[1] + 0.5) * s, y = (mark.cursor[0] + 0.5) * s;
  const a = Math.max(3, s / 2 + 2), b = a + 7;
  return [{ d: `M${x - b} ${y}H${x - a}M${x + a} ${y}H${x + b}M${x} ${y - b}V${y - a}M${x} ${y + a}V${y + b}`, ...MARK_STYLE }];
}

// A scale bar of a round length near a fifth of the width (units per pixel `step`), bottom left.
function scaleBarItems(cols, rows, s, step, unit) {
  if (!(step > 0)) return [];
  let length = niceLength((cols * step) / 5);
  const px = (length / step) * s;
  let label = `${length} ${unit}`;
  if (unit === "Å" && length >= 10) label = `${Number((length / 10).toPrecision(3))} nm`;
  const x = 10, y = rows * s - 12;
  return [{ d: `M${x} ${y}h${px}v4h${-px}Z`, stroke: "#000", fill: "#fff", width: 1 }, { text: label, x, y: y - 5 }];
}

// --- axes and colour bars ----------------------------------------------------------------------------

// About four ticks at round values along an axis of n pixels, pixel k at (k - origin) * step in the axis's
// units: each {at: the fraction of the axis's length (pixel centres at (k + 0.5) / n), label}; never closer
// than `least` units (whole pixels on a pixel axis).
function axisTicks(n, step, origin, least = 0) {
  const first = -origin * step, last = (n - 1 - origin) * step;
  if (!(last > first)) return [{ at: 0.5, label: tickText(first, 1) }];
  const spacing = Math.max(least, niceLength((last - first) / 4));
  const ticks = [];
  for (let k = Math.ceil(first / spacing - 1e-9); k * spacing <= last + 1e-9 * spacing; k++) {
    ticks.push({ at: ((k * spacing) / step + origin + 0.5) / n, label: tickText(k * spacing, spacing) });
  }
  return ticks;
}

// A tick's value with the decimals its spacing needs (no "-0").
const tickText = (v, spacing) => (Math.abs(v) < spacing / 1e6 ? "0" : v.toFixed(Math.max(0, -Math.floor(Math.log10(spacing)))));

// A colour bar's end value: integers as they are, else four significant digits.
const barText = (v) => (Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(4))));
const RAMP = Float32Array.from({ length: 256 }, (_, i) => i);

function svgItems(svg, items) {
  svg.replaceChildren();
  for (const it of items) {
    if (it.text !== undefined) {
      svg.append(svgEl("text", { x: it.x, y: it.y, fill: "#fff", stroke: "#000", "stroke-width": 3, "paint-order": "stroke", "font-size": 12, "font-family": "sans-serif" }, it.text));
      continue;
    }
    if (it.halo) svg.append(svgEl("path", { d: it.d, fill: "none", stroke: "rgba(0,0,0,0.6)", "stroke-width": it.width + 2 }));
    svg.append(svgEl("path", { d: it.d, fill: it.fill, stroke: it.stroke, "stroke-width": it.width, "fill-rule": "evenodd" }));
  }
}

function canvasItems(ctx, items) {
  for (const it of items) {
    if (it.text !== undefined) {
      ctx.font = "13px sans-serif";
      ctx.lineWidth = 3;
      ctx.strokeStyle = "#000";
      ctx.strokeText(it.text, it.x, it.y);
      ctx.fillStyle = "#fff";
      ctx.fillText(it.text, it.x, it.y);
      continue;
    }
    const path = new Path2D(it.d);
    if (it.fill !== "none") { ctx.fillStyle = it.fill; ctx.fill(path, "evenodd"); }
    if (it.halo) { ctx.strokeStyle = "rgba(0,0,0,0.6)"; ctx.lineWidth = it.width + 2; ctx.stroke(path); }
    ctx.strokeStyle = it.stroke;
    ctx.lineWidth = it.width;
    ctx.stroke(path);
  }
}

// --- DOM helpers -----------------------------------------------------------------------------------

function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v == null || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  node.append(...children.flat().filter((c) => c != null));
  return node;
}

function svgEl(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function download(name, blob) {
  const url = URL.createObjectURL(blob);
  const a = h("a", { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

const STYLE = `
.qv { font: 13px system-ui, sans-serif; color: #222; display: flex; flex-direction: column; gap: 8px; }
.qv [hidden] { display: none !important; }
.qv button.on { background: #2b6cb0; color: #fff; }
.qv button, .qv select, .qv input { font: inherit; }
.qv input[type=number] { width: 4em; }
.qv-bar { display: flex; flex-wrap: wrap; align-items: center; gap: 6px; }
.qv-bar .sep { width: 1px; height: 20px; background: #ccc; margin: 0 4px; }
.qv-panels { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
.qv-panel { display: flex; flex-direction: column; gap: 6px; width: ${CSS_SIDE + AXIS_PX}px; }
.qv-panel.wide { width: ${2 * (CSS_SIDE + AXIS_PX) + 16}px; }
.qv-pictures { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
.qv-picture { display: flex; flex-direction: column; gap: 4px; width: ${CSS_SIDE + AXIS_PX}px; }
.qv-frame { display: grid; grid-template-columns: ${AXIS_PX}px auto; grid-template-rows: auto 16px; align-self: flex-start; }
.qv-axis { position: relative; font-size: 10px; color: #555; }
.qv-tick { position: absolute; white-space: nowrap; }
.qv-axis.rows .qv-tick { right: 5px; transform: translateY(-50%); }
.qv-axis.rows .qv-tick::after { content: ""; position: absolute; right: -5px; top: 50%; width: 3px; border-top: 1px solid #888; }
.qv-axis.cols .qv-tick { top: 3px; transform: translateX(-50%); }
.qv-axis.cols .qv-tick::before { content: ""; position: absolute; left: 50%; top: -3px; height: 3px; border-left: 1px solid #888; }
.qv-axis-unit { font-size: 10px; color: #555; text-align: right; padding: 3px 5px 0 0; }
.qv-colourbar { display: flex; align-items: center; gap: 6px; font-size: 11px; font-family: ui-monospace, monospace; }
.qv-colourbar canvas { width: 140px; height: 10px; border: 1px solid #888; image-rendering: auto; }
.qv-panel-body { display: flex; flex-direction: column; gap: 6px; }
.qv-slider { display: grid; grid-template-columns: 4.5em 1fr 5.5em; align-items: center; gap: 6px; }
.qv-slider input[type=range] { width: 100%; }
.qv-slider input[type=number] { width: 5.5em; }
.qv-message { padding: 8px; background: #fff8e1; border: 1px solid #e2c675; border-radius: 3px; }
.qv-spectrum canvas { image-rendering: pixelated; background: #111; }
.qv-stage { position: relative; background: #111; align-self: flex-start; }
.qv-stage canvas { display: block; image-rendering: pixelated; }
.qv-stage svg { position: absolute; left: 0; top: 0; touch-action: none; }
.qv-grid { display: flex; flex-wrap: wrap; gap: 6px; max-width: ${CSS_SIDE + 40}px; }
.qv-tile { display: flex; flex-direction: column; align-items: center; cursor: pointer; font-size: 11px; }
.qv-tile canvas { image-rendering: pixelated; background: #111; border: 2px solid transparent; }
.qv-tile.current canvas { border-color: #2b6cb0; }
.qv-readout { font-family: ui-monospace, monospace; font-size: 12px; min-height: 1.3em; white-space: pre-wrap; }
.qv-status { min-height: 1.3em; }
.qv-status .error, .qv-status .closed { color: #c53030; font-weight: 600; }
.qv-status .live { color: #2f855a; }
.qv-status .busy { color: #2b6cb0; }
.qv-loading { width: ${CSS_SIDE}px; height: ${CSS_SIDE / 2}px; display: flex; align-items: center; justify-content: center; gap: 8px; color: #ddd; }
.qv-loading::before { content: ""; width: 14px; height: 14px; border: 2px solid #666; border-top-color: #ddd; border-radius: 50%; animation: qv-spin 0.8s linear infinite; }
@keyframes qv-spin { to { transform: rotate(360deg); } }
.qv-loading.stopped::before { display: none; }
.qv-label { font-weight: 600; min-height: 1.3em; }
`;

// --- the viewer ------------------------------------------------------------------------------------

// Which answer channel(s) an ask occupies: images (and grids) on one, patterns on another, the phase panel's
// asks on a third (the server answers each channel's newest ask).
const CHANNELS_OF = {
  detector: ["image"], mode: ["image"], grid: ["image"], index: ["image", "pattern"], cursor: ["pattern"], region: ["pattern"],
  phase: ["phase"], fit: ["phase"], reset: ["phase"], phase_grid: ["phase"],
};
// The channels an error frees: an index ask's phase image comes on the phase channel too (where the panel
// shows one), though the ask does not wait for that channel.
const ERROR_FREES = { ...CHANNELS_OF, index: ["image", "pattern", "phase"] };
const PHASE_ASKS = ["phase", "fit", "reset", "phase_grid"];
const IMAGE_UNITS = { detector: "counts", com_row: "CoM row (px)", com_col: "CoM column (px)", dpc: "iCoM phase (rad)", ssb: "SSB phase (rad)" };

export function mount(el, transport, options = {}) {
  const { dashboardLink = true } = options;

  // ---- what is shown --------------------------------------------------------
  const S = {
    state: null, detector: null, detShape: null, calibration: null, optics: null,
    names: [], index: 0, mark: null, // mark: {cursor:[r,c]} or {rect:[t,l,b,r], op}
    image: null, pattern: null, grid: null, // {values, rows, cols, header}
    gridOn: false, regionTool: false, closed: null, error: null, live: null, info: "connecting…",
    drag: null, play: null,
  };
  // the phase panel
  const P = {
    controls: { method: "ssb", upsampling: "auto", strength: 0.1, c10_A: 0, c12_A: 0, phi12_deg: 0, spectrum: false }, // as shown
    accepted: null, // the controls the server took last: the panel returns to them when it refuses an ask
    asked: false, // the panel's first ask is made (its first image, or the server's word on missing optics)
    image: null, grid: null, // {values, header} of the phase answer (grid) drawn
    gridOn: false, goOn: null, // goOn: the controls a slow CPU preparation waits to be let go on with
    doing: "", // what the phase channel computes, for the status line
  };
  const hooks = {
    lastImage: null, lastPattern: null, lastGrid: null, lastPhase: null, lastPhaseGrid: null,
    drawn: { image: 0, pattern: 0, grid: 0, phase: 0, phaseGrid: 0 }, errors: [], timings: [], phaseTimings: [],
    detector: null, state: null, phaseControls: { ...P.controls },
    asked: {}, // ask type -> the seq of its newest ask
  };

  // ---- DOM ------------------------------------------------------------------
  const sel = (role, values, value) => h("select", { "data-role": role }, values.map((v) => h("option", { value: v, selected: v === value }, v)));
  const num = (role, value, step, title) => h("input", { type: "number", "data-role": role, value, step, title });
  const btn = (role, text, title) => h("button", { type: "button", "data-role": role, title }, text);
  const readout = (role) => h("div", { "data-role": role, class: "qv-readout" });

  // A stage framed by tick labels (rows down the left edge, columns along the bottom, the unit in the corner).
  function framed(stage, role) {
    const rows = h("div", { class: "qv-axis rows", "data-role": `${role}-axis-rows` });
    const cols = h("div", { class: "qv-axis cols", "data-role": `${role}-axis-cols` });
    const unit = h("div", { class: "qv-axis-unit", "data-role": `${role}-axis-unit` });
    return { box: h("div", { class: "qv-frame" }, rows, stage, unit, cols), rows, cols, unit };
  }

  // A colour bar: the colour map from the low end (left) to the high end, each labelled, then what it shows.
  function colourBar(role) {
    const canvas = h("canvas", { "data-role": `${role}-colourbar`, width: 256, height: 1 });
    const lo = h("span", { "data-role": `${role}-colourbar-min` }), hi = h("span", { "data-role": `${role}-colourbar-max` });
    const caption = h("span", { "data-role": `${role}-colourbar-label` });
    return { box: h("div", { class: "qv-colourbar" }, lo, canvas, hi, caption), canvas, lo, hi, caption };
  }

  // A picture: its canvas under an SVG overlay on a stage (with a loading indicator until it is first
  // drawn), framed by axes, a colour bar below.
  function picture(role, loading) {
    const view = {
      canvas: h("canvas", { "data-role": role, width: 1, height: 1 }),
      svg: svgEl("svg", { "data-role": `${role}-overlay` }),
      loading: loading ? h("div", { "data-role": `${role}-loading`, class: "qv-loading" }, loading) : null,
      bar: colourBar(role),
    };
    view.stage = h("div", { class: "qv-stage" }, view.loading, view.canvas, view.svg);
    view.frame = framed(view.stage, role);
    view.box = h("div", { class: "qv-picture" }, view.frame.box, view.bar.box);
    return view;
  }
  const imageView = picture("image", "loading the image…");
  const patternView = picture("pattern", "loading the pattern…");
  const phaseView = picture("phase", "loading the phase image…");
  const amplitudeView = picture("phase-amplitude");
  amplitudeView.box.hidden = true;

  // a C10, C12 or phi12 slider with its numeric entry (which may go beyond the slider's range)
  const slider = (key, label, unit) => ({
    key, label, unit,
    range: h("input", { type: "range", "data-role": `phase-${key}`, min: -1, max: 1, step: 1, value: 0, title: `${label}: arrow keys step, Shift + arrow ${NUDGE} steps` }),
    entry: h("input", { type: "number", "data-role": `phase-${key}-entry`, step: "any", title: `${label} in ${unit}: any value the server takes` }),
  });

  const ui = {
    acqLabel: h("span", { "data-role": "index-label" }),
    index: h("input", { type: "range", "data-role": "index", min: 0, max: 0, value: 0, step: 1 }),
    play: btn("play", "▶", "play the series (every 300 ms)"),
    grid: btn("grid", "grid", "every acquisition's image of this detector"),
    region: btn("tool-region", "region", "drag on the image: the pattern of a scan region"),
    tools: Object.fromEntries(DETECTOR_KINDS.map((k) => [k, btn(`tool-${k}`, k, `a ${k} detector`)])),
    snap: h("input", { type: "checkbox", "data-role": "snap", checked: true }),
    png: btn("export-png", "PNG", "download image and pattern as one PNG"),
    html: btn("export-html", "HTML", "download a self-contained HTML report"),
    dashboard: h("a", { "data-role": "dashboard", target: "_blank", rel: "noopener", hidden: true }, "Dask dashboard"),
    status: h("div", { "data-role": "status", class: "qv-status" }),
    image: imageView.canvas,
    imageSvg: imageView.svg,
    gridBox: h("div", { "data-role": "grid-view", class: "qv-grid", hidden: true }),
    cmap: sel("cmap", Object.keys(CMAPS), "gray"),
    lo: num("contrast-low", 0.5, 0.1, "low percentile"),
    hi: num("contrast-high", 99.5, 0.1, "high percentile"),
    gamma: num("gamma", 1, 0.1, "gamma: colour = t ** gamma"),
    mode: sel("mode", MODES, "detector"),
    op: sel("region-op", ["sum", "mean", "max"], "sum"),
    imageHover: readout("image-hover"),
    imageInfo: readout("image-info"),
    pattern: patternView.canvas,
    patternSvg: patternView.svg,
    scale: sel("pattern-scale", ["linear", "log"], "log"),
    patternHover: readout("pattern-hover"),
    patternLabel: h("div", { "data-role": "pattern-label", class: "qv-label" }),
    imageLoading: imageView.loading,
    patternLoading: patternView.loading,
    detText: readout("detector-text"),
  };
  const ph = {
    label: h("div", { "data-role": "phase-label", class: "qv-label" }),
    message: h("div", { "data-role": "phase-message", class: "qv-message", hidden: true }),
    method: sel("phase-method", PHASE_METHODS, "ssb"),
    upsampling: sel("phase-upsampling", PHASE_UPSAMPLINGS, "auto"),
    strength: num("phase-strength", 0.1, 0.01, "direct ptychography's regularization (> 0)"),
    sliders: [slider("c10_A", "C10", "Å"), slider("c12_A", "C12", "Å"), slider("phi12_deg", "phi12", "°")],
    fit: btn("phase-fit", "fit", "fit C10, C12, phi12 and the rotation on the acquisition shown"),
    reset: btn("phase-reset", "reset", "the sliders back to the fit (or to the optics given)"),
    spectrum: h("input", { type: "checkbox", "data-role": "phase-spectrum" }),
    grid: btn("phase-grid", "grid", "every acquisition's phase image with these sliders"),
    goOn: btn("phase-go-on", "go on", "compute it on the CPU worker anyway"),
    start: readout("phase-start"),
    spectrumCanvas: h("canvas", { "data-role": "phase-spectrum-image", width: 1, height: 1 }),
    gridBox: h("div", { "data-role": "phase-grid-view", class: "qv-grid", hidden: true }),
    hover: readout("phase-hover"),
    info: readout("phase-info"),
  };
  ph.goOn.hidden = true;
  ph.spectrumBox = h("div", { class: "qv-spectrum", "data-role": "phase-spectrum-box", hidden: true }, ph.spectrumCanvas,
    h("div", { class: "qv-readout" }, "power spectrum (log10)"));
  ph.pictures = h("div", { class: "qv-pictures" }, phaseView.box, amplitudeView.box);
  ph.body = h("div", { "data-role": "phase-controls", class: "qv-panel-body" },
    h("div", { class: "qv-bar" }, "method", ph.method, "upsampling", ph.upsampling, "strength", ph.strength),
    ...ph.sliders.map((s) => h("label", { class: "qv-slider" }, `${s.label} (${s.unit})`, s.range, s.entry)),
    h("div", { class: "qv-bar" }, ph.fit, ph.reset, h("label", {}, ph.spectrum, " spectrum"), ph.grid, ph.goOn),
    ph.start);
  ph.panel = h("div", { class: "qv-panel", "data-role": "phase-panel" }, ph.label, ph.message, ph.pictures, ph.gridBox,
    ph.spectrumBox, ph.hover, ph.info, ph.body);

  const sep = () => h("span", { class: "sep" });
  const root = h("div", { class: "qv" },
    h("style", {}, STYLE),
    h("div", { class: "qv-bar" },
      ui.acqLabel, ui.index, ui.play, ui.grid, sep(), ui.region, sep(), ...Object.values(ui.tools),
      h("label", {}, ui.snap, " snap"), sep(), ui.png, ui.html, ui.dashboard),
    ui.status,
    h("div", { class: "qv-panels" },
      h("div", { class: "qv-panel" }, imageView.box, ui.gridBox,
        h("div", { class: "qv-bar" }, "mode", ui.mode, "region op", ui.op),
        h("div", { class: "qv-bar" }, "map", ui.cmap, "percentiles", ui.lo, ui.hi, "γ", ui.gamma),
        ui.imageHover, ui.imageInfo),
      h("div", { class: "qv-panel" }, ui.patternLabel, patternView.box,
        h("div", { class: "qv-bar" }, "scale", ui.scale),
        ui.patternHover, ui.detText),
      ph.panel));
  el.append(root);

  // CSS pixels a data pixel for a rows x cols picture drawn CSS_SIDE on its longest side
  const scaleOf = (rows, cols) => CSS_SIDE / Math.max(rows, cols, 1);
  function sizeStage(canvas, svg, rows, cols) {
    const s = scaleOf(rows, cols);
    const w = `${cols * s}px`, hgt = `${rows * s}px`;
    canvas.style.width = w; canvas.style.height = hgt;
    svg.setAttribute("width", cols * s); svg.setAttribute("height", rows * s);
    return s;
  }

  // Tick labels of a rows x cols picture: pixel k at (k - origin) * step units (whole pixels without units).
  function drawAxes(frame, rows, cols, step, unit, origin = [0, 0]) {
    const scaled = step > 0;
    const [d, least] = scaled ? [step, 0] : [1, 1];
    const ticks = (n, o, side) => axisTicks(n, d, o, least).map((t) => h("span", { class: "qv-tick", style: `${side}: ${(t.at * 100).toFixed(3)}%` }, t.label));
    frame.rows.replaceChildren(...ticks(rows, scaled ? origin[0] : 0, "top"));
    frame.cols.replaceChildren(...ticks(cols, scaled ? origin[1] : 0, "left"));
    frame.unit.textContent = scaled ? unit : "px";
  }

  function drawColourBar(bar, lo, hi, caption, gamma = 1) {
    paint(bar.canvas, RAMP, 1, 256, ui.cmap.value, 0, 255, gamma);
    bar.lo.textContent = barText(lo);
    bar.hi.textContent = barText(hi);
    bar.caption.textContent = caption;
  }

  // ---- asks: one seq, at most one ask in flight a channel, the newest of each type waiting ------
  let seq = 0;
  // working: the server said it computes the ask in flight (a phase image or a fit may take longer than STALL_MS)
  const channels = Object.fromEntries(["image", "pattern", "phase"].map((c) => [c, { inflight: null, type: null, since: 0, working: false }]));
  const pending = new Map(); // ask type -> the newest unsent ask of that type
  const drawnSeq = { image: -Infinity, pattern: -Infinity, grid: -Infinity, phase: -Infinity, phaseGrid: -Infinity };
  const askedAt = new Map(); // seq -> performance.now() when an image or grid was asked
  const phaseAskedAt = new Map(); // the same for the phase channel's asks

  function ask(message) {
    // a phase ask gives only the controls it changes: a waiting one's changes go along with it
    const m = { ...(message.type === "phase" ? pending.get("phase") : null), ...message, seq: ++seq };
    if (m.type === "cursor") pending.delete("region"); // a cursor and a region replace each other
    if (m.type === "region") pending.delete("cursor");
    pending.delete(m.type);
    pending.set(m.type, m);
    hooks.asked[m.type] = m.seq;
    if (CHANNELS_OF[m.type].includes("image")) askedAt.set(m.seq, performance.now());
    if (CHANNELS_OF[m.type].includes("phase")) phaseAskedAt.set(m.seq, performance.now());
    flush();
    return m.seq;
  }

  // Send waiting asks in seq order; one blocked on a channel holds back later asks of that channel.
  function flush() {
    const now = performance.now();
    for (const c of Object.values(channels)) if (c.inflight != null && !c.working && now - c.since > STALL_MS) c.inflight = null;
    const blocked = new Set();
    for (const m of [...pending.values()].sort((a, b) => a.seq - b.seq)) {
      const names = CHANNELS_OF[m.type];
      if (names.some((c) => blocked.has(c) || channels[c].inflight != null)) {
        names.forEach((c) => blocked.add(c));
        continue;
      }
      pending.delete(m.type);
      for (const c of names) Object.assign(channels[c], { inflight: m.seq, type: m.type, since: now, working: false });
      if (names.includes("phase")) P.doing = S.state?.phase ? doingOf(m) : ""; // without optics it only asks how to give them
      transport.send(m);
    }
  }

  // An answer (or error) for `answerSeq` arrived on a channel: free it when it answers the ask in flight
  // (a pushed answer, seq null, also frees it: the server may have put it in place of ours).
  function settle(name, answerSeq) {
    const c = channels[name];
    if (c.inflight != null && (answerSeq == null || answerSeq >= c.inflight)) {
      c.inflight = null;
      flush();
    }
  }
  const busy = (type) => pending.has(type) || Object.values(channels).some((c) => c.inflight != null && c.type === type);

  // What the phase channel computes for ask m: said in the status line while it is busy.
  function doingOf(m) {
    const c = { ...P.controls, ...m };
    const one = (x) => (Number.isFinite(Number(x)) && x !== "" ? Number(x).toFixed(1) : String(x));
    switch (m.type) {
      case "phase": return `computing ${c.method} at C10 = ${one(c.c10_A)} Å, C12 = ${one(c.c12_A)} Å, phi12 = ${one(c.phi12_deg)}°`;
      case "fit": return "fitting the aberrations";
      case "reset": return "computing the image at the fit";
      default: return `computing ${c.method} of every acquisition`;
    }
  }

  // ---- status line ----------------------------------------------------------
  function renderStatus() {
    const parts = [];
    if (S.closed) parts.push(h("span", { class: "closed" }, `connection closed${S.closed.reason ? ` (${S.closed.reason})` : ""}`));
    if (S.error) parts.push(h("span", { class: "error" }, S.error.message));
    if (S.live) parts.push(h("span", { class: "live" }, `live: ${S.live.received}/${S.live.n_frames}`));
    const phase = channels.phase;
    if (phase.inflight != null && P.doing && !S.closed) { // with the seconds it has taken so far
      const seconds = Math.floor((performance.now() - phase.since) / 1000);
      parts.push(h("span", { class: "busy" }, `${P.doing} …${seconds ? ` ${seconds} s` : ""}`));
    }
    if (!parts.length && S.info) parts.push(h("span", {}, S.info));
    ui.status.replaceChildren(...parts.flatMap((p, i) => (i ? [" · ", p] : [p])));
  }

  // ---- drawing --------------------------------------------------------------
  const contrast = () => ({ lo: Number(ui.lo.value) || 0, hi: Number(ui.hi.value) || 100, gamma: Number(ui.gamma.value) || 1 });

  function drawImage() {
    if (!S.image) return;
    const { values, rows, cols, header } = S.image;
    const c = contrast();
    const [lo, hi] = percentiles(values, [c.lo, c.hi]);
    paint(ui.image, values, rows, cols, ui.cmap.value, lo, hi, c.gamma);
    ui.imageLoading.hidden = true;
    sizeStage(ui.image, ui.imageSvg, rows, cols);
    drawAxes(imageView.frame, rows, cols, S.optics?.scan_step_A, "Å");
    drawColourBar(imageView.bar, lo, hi, IMAGE_UNITS[header.mode] || header.mode, c.gamma);
    drawImageOverlay();
  }

  function drawImageOverlay() {
    if (!S.image) return;
    const { rows, cols } = S.image;
    const s = scaleOf(rows, cols);
    svgItems(ui.imageSvg, [...markItems(S.mark, s), ...scaleBarItems(cols, rows, s, S.optics?.scan_step_A, "Å")]);
  }

  // The pattern as drawn (log1p above its minimum on the log scale) and its range: [shown, lo, hi, min, max].
  function patternDisplay() {
    const { values } = S.pattern;
    const [min, max] = extent(values);
    if (ui.scale.value !== "log") return [values, min, max, min, max];
    const shown = new Float64Array(values.length);
    for (let i = 0; i < values.length; i++) shown[i] = Math.log1p(Math.max(0, values[i] - min));
    return [shown, 0, Math.log1p(max - min), min, max];
  }

  function drawPattern() {
    if (!S.pattern) return;
    const { rows, cols } = S.pattern;
    const [shown, lo, hi, min, max] = patternDisplay();
    paint(ui.pattern, shown, rows, cols, ui.cmap.value, lo, hi);
    ui.patternLoading.hidden = true;
    sizeStage(ui.pattern, ui.patternSvg, rows, cols);
    // angles from the bright-field disk's centre where the optics give the sampling
    const centre = S.calibration?.bf_center || [(rows - 1) / 2, (cols - 1) / 2];
    drawAxes(patternView.frame, rows, cols, S.optics?.det_sampling_mrad, "mrad", centre);
    drawColourBar(patternView.bar, min, max, ui.scale.value === "log" ? "counts (log scale)" : "counts");
    ui.patternLabel.textContent = patternLabel();
    drawPatternOverlay();
  }

  // What the pattern shown is of: the acquisition and the scan position (row, col), or the region's reduction.
  function patternLabel() {
    if (!S.pattern) return "";
    const { source = {}, index } = S.pattern.header;
    const name = S.names[index] ?? `acquisition ${index}`;
    if (source.rect) {
      const [top, left, bottom, right] = source.rect;
      return `${name}: ${source.op} over scan rows ${top}–${bottom - 1}, columns ${left}–${right - 1}`;
    }
    return source.cursor ? `${name}: scan position (${source.cursor[0]}, ${source.cursor[1]})` : name;
  }

  function drawPatternOverlay() {
    const shape = S.pattern ? [S.pattern.rows, S.pattern.cols] : S.detShape;
    if (!shape) return;
    const s = sizeStage(ui.pattern, ui.patternSvg, ...shape);
    svgItems(ui.patternSvg, [...detectorItems(S.detector, s), ...scaleBarItems(shape[1], shape[0], s, S.optics?.det_sampling_mrad, "mrad")]);
    ui.detText.textContent = describeDetector(S.detector);
    for (const [kind, b] of Object.entries(ui.tools)) b.classList.toggle("on", S.detector?.kind === kind);
  }

  // A grid answer's tiles in `box`, one contrast for all (they compare); a click on one shows that acquisition.
  function drawTiles(box, role, values, header, lo, hi, gamma) {
    const [n, rows, cols] = header.shape;
    const s = TILE_SIDE / Math.max(rows, cols, 1);
    const names = (header.names || []).join("\n");
    if (box.children.length !== n || box.dataset.names !== names) { // new tiles only for a new series
      const tiles = [];
      for (let k = 0; k < n; k++) {
        const canvas = h("canvas", { "data-role": role, "data-index": k });
        const name = header.names?.[k] ?? String(k);
        tiles.push(h("div", { class: `qv-tile${k === S.index ? " current" : ""}`, title: name, onclick: () => setIndex(k) }, canvas, h("span", {}, name)));
      }
      box.replaceChildren(...tiles);
      box.dataset.names = names;
    }
    for (const [k, tile] of [...box.children].entries()) {
      const canvas = tile.firstChild;
      paint(canvas, values.subarray(k * rows * cols, (k + 1) * rows * cols), rows, cols, ui.cmap.value, lo, hi, gamma);
      canvas.style.width = `${cols * s}px`; canvas.style.height = `${rows * s}px`;
    }
  }

  function drawGrid() {
    if (!S.grid) return;
    const c = contrast();
    const [lo, hi] = percentiles(S.grid.values, [c.lo, c.hi]);
    drawTiles(ui.gridBox, "grid-tile", S.grid.values, S.grid.header, lo, hi, c.gamma);
  }

  function markCurrentTiles() {
    for (const box of [ui.gridBox, ph.gridBox]) for (const [k, tile] of [...box.children].entries()) tile.classList.toggle("current", k === S.index);
  }

  // A loading indicator's text; it spins while something is on its way.
  function loadingSays(loading, text, spinning) {
    loading.textContent = text;
    loading.classList.toggle("stopped", !spinning);
  }

  function showGrid(on) {
    ui.gridBox.hidden = !on;
    imageView.box.hidden = on;
    ui.grid.classList.toggle("on", on);
  }

  // The layer `name` of a phase answer: [values, [min, max]], or null where the answer has none.
  function phaseLayer({ values, header }, name) {
    const k = header.layers.indexOf(name);
    const n = header.shape[1] * header.shape[2];
    return k < 0 ? null : [values.subarray(k * n, (k + 1) * n), header.ranges[k]];
  }

  // The phase answer drawn: the phase (and the amplitude) on the image's grid, u times finer than the scan,
  // with a scale bar and axes in Å and a colour bar over its min..max; the power spectrum small below.
  function drawPhase() {
    if (!P.image) return;
    const { header } = P.image;
    const [, rows, cols] = header.shape;
    for (const [name, view, caption] of [["phase", phaseView, "phase (rad)"], ["amplitude", amplitudeView, "amplitude"]]) {
      const layer = phaseLayer(P.image, name);
      view.box.hidden = !layer;
      if (name === "amplitude") ph.panel.classList.toggle("wide", Boolean(layer)); // side by side with the phase
      if (!layer) continue;
      const [values, [lo, hi]] = layer;
      paint(view.canvas, values, rows, cols, ui.cmap.value, lo, hi);
      const s = sizeStage(view.canvas, view.svg, rows, cols);
      svgItems(view.svg, scaleBarItems(cols, rows, s, header.pixel_A, "Å"));
      drawAxes(view.frame, rows, cols, header.pixel_A, "Å");
      drawColourBar(view.bar, lo, hi, caption);
    }
    phaseView.loading.hidden = true;
    const spectrum = phaseLayer(P.image, "spectrum");
    ph.spectrumBox.hidden = !spectrum;
    if (spectrum) {
      paint(ph.spectrumCanvas, spectrum[0], rows, cols, ui.cmap.value, ...spectrum[1]);
      const s = SPECTRUM_SIDE / Math.max(rows, cols, 1);
      ph.spectrumCanvas.style.width = `${cols * s}px`; ph.spectrumCanvas.style.height = `${rows * s}px`;
    }
    const st = header.steering;
    ph.label.textContent = `${header.name}: ${st.method}`;
    ph.info.textContent = `${rows}×${cols} float32 (upsampling ${header.upsampling}, pixel ${fmt(header.pixel_A, 3)} Å)\n` +
      `C10 ${fmt(st.c10_A, 1)} Å  C12 ${fmt(st.c12_A, 1)} Å  phi12 ${fmt(st.phi12_deg, 1)}°` +
      (st.method.startsWith("direct") ? `  strength ${st.strength}` : "");
  }

  function drawPhaseGrid() {
    if (!P.grid) return;
    const [lo, hi] = extent(P.grid.values);
    drawTiles(ph.gridBox, "phase-grid-tile", P.grid.values, P.grid.header, lo, hi, 1);
  }

  function drawAll() {
    drawImage();
    drawPattern();
    drawGrid();
    drawPhase();
    drawPhaseGrid();
  }

  // Time an ask once its pixels are on screen: asked, its answer received, drawn.
  let received = 0;
  function timed(answerSeq, asked = askedAt, timings = hooks.timings) {
    if (answerSeq == null) return;
    const at = asked.get(answerSeq), got = received;
    for (const k of asked.keys()) if (k <= answerSeq) asked.delete(k);
    if (at !== undefined) requestAnimationFrame(() => timings.push({ seq: answerSeq, asked: at, received: got, drawn: performance.now() }));
  }

  // lastImage / lastPattern / lastPhaseGrid records; their values become a plain Array only when read
  function record(header, values, extra) {
    let plain = null;
    return {
      seq: header.seq, ...extra, dtype: header.dtype, shape: header.shape,
      get values() { return plain || (plain = Array.from(values)); },
    };
  }

  // lastPhase: one layer's shape; `values` the phase, `amplitude` (direct complex; else null) as Arrays when read
  function phaseRecord(image) {
    const { header } = image;
    const plain = {};
    const layer = (name) => {
      if (!(name in plain)) plain[name] = phaseLayer(image, name) ? Array.from(phaseLayer(image, name)[0]) : null;
      return plain[name];
    };
    return {
      seq: header.seq, index: header.index, name: header.name, layers: header.layers, shape: header.shape.slice(1),
      ranges: header.ranges, steering: header.steering, upsampling: header.upsampling, pixel_A: header.pixel_A,
      get values() { return layer("phase"); },
      get amplitude() { return layer("amplitude"); },
    };
  }

  // ---- answers --------------------------------------------------------------
  const fresh = (kind, answerSeq) => answerSeq == null || answerSeq >= drawnSeq[kind];
  function clearErrorAfter(answerSeq) {
    if (S.error && answerSeq != null && (S.error.seq == null || answerSeq > S.error.seq)) S.error = null;
  }

  function onAnswer(header, buffers = []) {
    received = performance.now();
    try {
      switch (header.type) {
        case "state": return applyState(header);
        case "image": return onImage(header, buffers);
        case "pattern": return onPattern(header, buffers);
        case "grid": return header.of === "phase" ? onPhaseGrid(header, buffers) : onGrid(header, buffers);
        case "phase": return onPhase(header, buffers);
        case "progress": return onProgress(header);
        case "error": return onError(header);
        default: return undefined;
      }
    } catch (err) {
      S.error = { seq: null, message: `viewer: ${err.message}` };
      hooks.errors.push(S.error.message);
      renderStatus();
    } finally {
      renderStatus();
    }
  }

  // An answer's array, or null where an answer of its kind newer than it was drawn already; its channel is
  // freed either way.
  function accepted(kind, channel, header, buffers) {
    settle(channel, header.seq);
    if (!fresh(kind, header.seq)) return null;
    const values = decodeArray(buffers[0], header.dtype, header.shape);
    if (header.seq != null) drawnSeq[kind] = header.seq;
    return values;
  }

  function onImage(header, buffers) {
    const values = accepted("image", "image", header, buffers);
    if (!values) return;
    const [rows, cols] = header.shape;
    S.image = { values, rows, cols, header };
    S.info = "";
    drawImage();
    hooks.drawn.image++;
    hooks.lastImage = record(header, values, { detector: header.detector, mode: header.mode, index: header.index });
    ui.imageInfo.textContent = `${header.mode}  ${rows}×${cols} ${header.dtype}  min ${valueText(header.min)}  max ${valueText(header.max)}`;
    if (!busy("mode") && MODES.includes(header.mode)) ui.mode.value = header.mode;
    clearErrorAfter(header.seq);
    timed(header.seq);
  }

  function onPattern(header, buffers) {
    const values = accepted("pattern", "pattern", header, buffers);
    if (!values) return;
    const [rows, cols] = header.shape;
    S.pattern = { values, rows, cols, header };
    // the image's mark follows what the pattern is of, unless a newer ask is on its way
    if (!busy("cursor") && !busy("region") && !S.drag && header.source) {
      S.mark = header.source.rect ? { rect: header.source.rect, op: header.source.op } : header.source.cursor ? { cursor: header.source.cursor } : S.mark;
      drawImageOverlay();
    }
    drawPattern();
    hooks.drawn.pattern++;
    hooks.lastPattern = record(header, values, { source: header.source, index: header.index });
    clearErrorAfter(header.seq);
  }

  function onGrid(header, buffers) {
    const values = accepted("grid", "image", header, buffers); // a grid takes the images' channel
    if (!values) return;
    S.grid = { values, header };
    drawGrid();
    hooks.drawn.grid++;
    hooks.lastGrid = { seq: header.seq, shape: header.shape, names: header.names };
    clearErrorAfter(header.seq);
    timed(header.seq);
  }

  // A phase image: asked, pushed for a new acquisition of the series, or for a live one's new rows.
  function onPhase(header, buffers) {
    const values = accepted("phase", "phase", header, buffers);
    if (!values) return;
    P.image = { values, header };
    P.accepted = header.steering;
    if (!busy("phase")) showControls(header.steering);
    P.goOn = null;
    ph.goOn.hidden = true;
    drawPhase();
    hooks.drawn.phase++;
    hooks.lastPhase = phaseRecord(P.image);
    clearErrorAfter(header.seq);
    timed(header.seq, phaseAskedAt, hooks.phaseTimings);
  }

  function onPhaseGrid(header, buffers) {
    const values = accepted("phaseGrid", "phase", header, buffers);
    if (!values) return;
    P.grid = { values, header };
    drawPhaseGrid();
    hooks.drawn.phaseGrid++;
    hooks.lastPhaseGrid = record(header, values, { names: header.names, steering: header.steering });
    clearErrorAfter(header.seq);
    timed(header.seq, phaseAskedAt, hooks.phaseTimings);
  }

  // The server computes the phase channel's ask in flight: its answer will come, however long it takes (the
  // fit says which acquisition it fits).
  function onProgress(header) {
    if (header.seq == null || header.seq !== channels.phase.inflight) return;
    channels.phase.working = true;
    // an activity ("fitting the aberrations of a") as it is, a product ("ssb of a") being computed
    if (header.ask !== "phase") P.doing = /^\w+ing /.test(header.what) ? header.what : `computing ${header.what}`;
  }

  function onError(header) {
    if (header.seq != null) for (const c of ERROR_FREES[header.ask] || []) settle(c, header.seq);
    if (PHASE_ASKS.includes(header.ask) && S.state && !S.state.phase) { // no optics: the panel says how to give them
      ph.message.textContent = header.message;
      ph.message.hidden = false;
      return;
    }
    S.error = { seq: header.seq, message: header.message || "error" };
    hooks.errors.push(S.error.message);
    if (header.ask === "mode" && !busy("mode")) ui.mode.value = S.image?.header.mode || S.state?.mode || "detector";
    if (header.seconds != null) { // a slow CPU preparation waits for the user's word; the server took the controls
      P.goOn = P.accepted = header.steering;
      ph.goOn.hidden = false;
      if (!P.image) loadingSays(phaseView.loading, "not computed: 'go on' below computes it", false);
    } else if (header.ask === "phase" && !busy("phase") && P.accepted) showControls(P.accepted, true); // refused: back to what it took
  }

  // Take the server's state; what the user is changing right now (waiting asks, a drag) stays as is.
  function applyState(st) {
    S.state = hooks.state = st;
    S.names = st.acquisitions || [];
    S.detShape = st.shape ? [st.shape[2], st.shape[3]] : S.detShape;
    S.calibration = st.calibration || null;
    S.optics = st.optics || null;
    S.live = st.live || null;
    S.info = S.image ? "" : "loading the first image…";
    const n = S.names.length;
    if (!busy("index")) S.index = st.index ?? 0;
    ui.index.max = Math.max(0, n - 1);
    ui.index.value = S.index;
    ui.index.hidden = ui.play.hidden = n <= 1;
    if (n <= 1) stopPlay();
    ui.acqLabel.textContent = `${S.names[S.index] ?? ""} (${S.index + 1}/${n})`;
    for (const o of ui.mode.options) o.disabled = OPTICS_MODES.includes(o.value) && !S.optics;
    if (!busy("mode") && st.mode) ui.mode.value = st.mode;
    if (st.detector && !S.drag && !busy("detector")) setLocalDetector(st.detector);
    if (st.cursor && !busy("cursor") && !busy("region") && (!S.mark || S.mark.cursor)) S.mark = { cursor: st.cursor };
    const link = st.dashboard;
    ui.dashboard.hidden = !(dashboardLink && link);
    if (link) ui.dashboard.href = link;
    markCurrentTiles();
    ui.patternLabel.textContent = patternLabel();
    drawImageOverlay();
    drawPatternOverlay();
    applyPhaseState(st.phase);
  }

  // The phase panel from the state: without optics the server's word on how to give them (its answer to
  // one ask); else the sliders' ranges and, unless the user is moving them, the controls; its first image.
  function applyPhaseState(phase) {
    ph.body.hidden = !phase;
    ph.pictures.hidden = !phase || P.gridOn;
    if (phase) {
      ph.message.hidden = true;
      options(ph.method, phase.methods);
      options(ph.upsampling, phase.upsamplings);
      setRanges(phase);
      P.accepted = phase.steering;
      showControls(busy("phase") ? P.controls : phase.steering);
      ph.grid.hidden = S.names.length <= 1;
      if (ph.grid.hidden && P.gridOn) setPhaseGrid(false);
      const u = phase.uncertainties, s = phase.start;
      const pm = (key, scale = 1) => (u[key] != null && Number.isFinite(u[key]) ? ` ± ${fmt(u[key] * scale, 1)}` : "");
      ph.start.textContent = `${phase.fitted ? "fit" : "given"}: C10 ${fmt(s.c10_A, 1)}${pm("C10")} Å  C12 ${fmt(s.c12_A, 1)}${pm("C12")} Å  ` +
        `phi12 ${fmt(s.phi12_deg, 1)}${pm("phi12", 180 / Math.PI)}°  (limit ±${fmt(phase.limit_A, 0)} Å)`;
    }
    if (!P.asked) {
      P.asked = true;
      ask({ type: "phase" });
    }
  }

  // A select's options, where the server names others.
  function options(select, values) {
    if (!values || [...select.options].map((o) => o.value).join() === values.join()) return;
    const value = select.value;
    select.replaceChildren(...values.map((v) => h("option", { value: v }, v)));
    select.value = value;
  }

  // Slider ranges from the state (C10 and C12 about the fit, phi12 -90..90 degrees), at round steps, the ends
  // on whole steps inside the range.
  function setRanges(phase) {
    for (const [s, [lo, hi]] of [[ph.sliders[0], phase.c10_range], [ph.sliders[1], phase.c12_range], [ph.sliders[2], [-90, 90]]]) {
      const step = s.key === "phi12_deg" ? 0.5 : hi > lo ? niceLength((hi - lo) / SLIDER_STEPS) : 1;
      const whole = (k) => Number((k * step).toPrecision(12));
      Object.assign(s.range, { min: whole(Math.ceil(lo / step)), max: whole(Math.floor(hi / step)), step });
    }
  }

  // Show `controls` in the panel (the sliders snap to their steps; an entry being typed in keeps its text
  // unless `typed` says to replace it too).
  function showControls(controls, typed = false) {
    P.controls = { ...P.controls, ...controls };
    const c = P.controls, typing = typed ? null : el.ownerDocument.activeElement;
    ph.method.value = c.method;
    ph.upsampling.value = String(c.upsampling);
    if (typing !== ph.strength) ph.strength.value = c.strength;
    for (const s of ph.sliders) {
      s.range.value = c[s.key];
      if (typing !== s.entry) s.entry.value = typeof c[s.key] === "number" ? r2(c[s.key]) : c[s.key];
    }
    ph.spectrum.checked = Boolean(c.spectrum);
    ph.strength.disabled = !String(c.method).startsWith("direct");
    ph.upsampling.disabled = c.method === "ssb"; // SSB is on the scan grid
    hooks.phaseControls = { ...c };
  }

  // ---- changing what is shown (the UI and the test hooks go through these) ---------------
  function setLocalDetector(det) {
    S.detector = hooks.detector = tidy(det);
    drawPatternOverlay();
  }

  function setDetector(det) {
    setLocalDetector(det);
    // with the grid shown, one grid ask carries the detector (the single image is asked when the grid closes)
    if (S.gridOn) ask({ type: "grid", detector: S.detector });
    else ask({ type: "detector", detector: S.detector });
  }

  function setIndex(i) {
    const n = S.names.length || 1;
    S.index = Math.max(0, Math.min(n - 1, Math.round(i)));
    ui.index.value = S.index;
    ui.acqLabel.textContent = `${S.names[S.index] ?? ""} (${S.index + 1}/${n})`;
    markCurrentTiles();
    ask({ type: "index", index: S.index });
  }

  function setCursor(row, col) {
    S.mark = { cursor: [row, col] };
    drawImageOverlay();
    ask({ type: "cursor", row, col });
  }

  function setRegion(rect, op = ui.op.value) {
    ui.op.value = op;
    S.mark = { rect: rect.slice(), op };
    drawImageOverlay();
    ask({ type: "region", rect: rect.slice(), op });
  }

  function setMode(mode) {
    ui.mode.value = mode;
    ask({ type: "mode", mode });
  }

  function setGrid(on) {
    S.gridOn = Boolean(on);
    showGrid(S.gridOn);
    if (S.gridOn) ask({ type: "grid", detector: S.detector });
    // a grid ask may have taken the place of an image for a newer detector: ask it again if so
    else if (S.detector && JSON.stringify(S.image?.header.detector) !== JSON.stringify(S.detector)) ask({ type: "detector", detector: S.detector });
  }

  // Phase controls changed (by the panel or a test): shown at once, asked of the server (the grid's too).
  function setPhase(controls) {
    showControls(controls);
    ask({ type: "phase", ...controls });
    if (P.gridOn) ask({ type: "phase_grid" });
  }

  function fit() {
    ask({ type: "fit" });
  }

  function reset() {
    ask({ type: "reset" });
  }

  function setPhaseGrid(on) {
    P.gridOn = Boolean(on);
    ph.gridBox.hidden = !P.gridOn;
    ph.pictures.hidden = P.gridOn;
    ph.grid.classList.toggle("on", P.gridOn);
    if (P.gridOn) ask({ type: "phase_grid" });
  }

  function stopPlay() {
    if (S.play) clearInterval(S.play);
    S.play = null;
    ui.play.textContent = "▶";
    ui.play.classList.remove("on");
  }

  // ---- mouse on the image: click/drag the cursor, or drag a region ---------------------------
  // The data pixel [row, col] under the pointer on a rows x cols picture's overlay (clamped into it).
  function pixelAt(event, svg, rows, cols) {
    const s = scaleOf(rows, cols);
    const box = svg.getBoundingClientRect();
    const col = Math.floor((event.clientX - box.left) / s), row = Math.floor((event.clientY - box.top) / s);
    return [Math.max(0, Math.min(rows - 1, row)), Math.max(0, Math.min(cols - 1, col))];
  }
  const imagePixel = (event) => (S.image ? pixelAt(event, ui.imageSvg, S.image.rows, S.image.cols) : null);

  const on = (node, type, fn) => node.addEventListener(type, fn);
  const capture = (node, event) => {
    try { node.setPointerCapture(event.pointerId); } catch { /* a synthetic pointer: no capture */ }
  };
  on(ui.imageSvg, "pointerdown", (event) => {
    const p = imagePixel(event);
    if (!p || event.button !== 0) return;
    capture(ui.imageSvg, event);
    S.drag = { on: "image", start: p, last: p, region: S.regionTool };
    if (!S.regionTool) setCursor(...p);
  });
  on(ui.imageSvg, "pointermove", (event) => {
    const p = imagePixel(event);
    if (!p) return;
    const v = S.image.values[p[0] * S.image.cols + p[1]];
    ui.imageHover.textContent = `${p[0]}, ${p[1]}: ${valueText(v, S.image.header.dtype)}`;
    const d = S.drag;
    if (!d || d.on !== "image" || (p[0] === d.last[0] && p[1] === d.last[1])) return;
    d.last = p;
    if (d.region) {
      const [a, b] = [d.start, p];
      setRegion([Math.min(a[0], b[0]), Math.min(a[1], b[1]), Math.max(a[0], b[0]) + 1, Math.max(a[1], b[1]) + 1]);
    } else setCursor(...p);
  });
  const endImageDrag = () => {
    const d = S.drag;
    if (d?.on !== "image") return;
    S.drag = null;
    if (d.region && d.last[0] === d.start[0] && d.last[1] === d.start[1]) setCursor(...d.start); // a click: the cursor
  };
  on(ui.imageSvg, "pointerup", endImageDrag);
  on(ui.imageSvg, "pointercancel", endImageDrag);
  on(ui.imageSvg, "pointerleave", () => { ui.imageHover.textContent = ""; });

  // ---- mouse on the pattern: move and resize the detector -------------------------------------
  function patternPoint(event) {
    const shape = S.pattern ? [S.pattern.rows, S.pattern.cols] : S.detShape;
    if (!shape) return null;
    const s = scaleOf(...shape);
    const box = ui.patternSvg.getBoundingClientRect();
    return { p: [(event.clientY - box.top) / s - 0.5, (event.clientX - box.left) / s - 0.5], s };
  }
  const CURSORS = { move: "move", outer: "nwse-resize", inner: "nwse-resize", corner: "nwse-resize", vertex: "crosshair", start_deg: "grab", stop_deg: "grab" };

  on(ui.patternSvg, "pointerdown", (event) => {
    const at = patternPoint(event);
    if (!at || event.button !== 0) return;
    const grab = hitTest(S.detector, at.p, GRAB_PX / at.s);
    if (!grab) return;
    capture(ui.patternSvg, event);
    S.drag = { on: "pattern", grab, p0: at.p, d0: structuredClone(S.detector) };
  });
  on(ui.patternSvg, "pointermove", (event) => {
    const at = patternPoint(event);
    if (!at) return;
    const [row, col] = at.p;
    const kr = Math.round(row), kc = Math.round(col);
    if (S.pattern && kr >= 0 && kc >= 0 && kr < S.pattern.rows && kc < S.pattern.cols) {
      ui.patternHover.textContent = `${kr}, ${kc}: ${valueText(S.pattern.values[kr * S.pattern.cols + kc], S.pattern.header.dtype)}`;
    }
    const d = S.drag;
    if (d?.on === "pattern") {
      let det = dragTo(d.d0, d.grab, d.p0, at.p);
      if (ui.snap.checked) det = snapped(det, S.calibration);
      if (JSON.stringify(det) !== JSON.stringify(S.detector)) setDetector(det);
    } else {
      const grab = hitTest(S.detector, at.p, GRAB_PX / at.s);
      ui.patternSvg.style.cursor = grab ? CURSORS[grab.part] : "default";
    }
  });
  const endPatternDrag = () => { if (S.drag?.on === "pattern") S.drag = null; };
  on(ui.patternSvg, "pointerup", endPatternDrag);
  on(ui.patternSvg, "pointercancel", endPatternDrag);
  on(ui.patternSvg, "pointerleave", () => { ui.patternHover.textContent = ""; });

  // ---- mouse on the phase image: the phase (and amplitude) under the pointer ----------------------
  for (const view of [phaseView, amplitudeView]) {
    on(view.svg, "pointermove", (event) => {
      if (!P.image) return;
      const [, rows, cols] = P.image.header.shape;
      const [row, col] = pixelAt(event, view.svg, rows, cols);
      const at = (name) => phaseLayer(P.image, name)?.[0][row * cols + col];
      const amplitude = at("amplitude");
      const A = P.image.header.pixel_A;
      ph.hover.textContent = `${row}, ${col} (${r2(row * A)}, ${r2(col * A)} Å): phase ${valueText(at("phase"), "float32")} rad` +
        (amplitude === undefined ? "" : `  amplitude ${valueText(amplitude, "float32")}`);
    });
    on(view.svg, "pointerleave", () => { ph.hover.textContent = ""; });
  }

  // ---- toolbar and controls -------------------------------------------------------------------
  for (const [kind, b] of Object.entries(ui.tools)) {
    on(b, "click", () => {
      if (!S.detShape) return;
      setDetector(defaultDetector(kind, S.detShape, S.calibration));
    });
  }
  on(ui.region, "click", () => {
    S.regionTool = !S.regionTool;
    ui.region.classList.toggle("on", S.regionTool);
  });
  on(ui.index, "input", () => setIndex(Number(ui.index.value)));
  on(ui.play, "click", () => {
    if (S.play) return stopPlay();
    ui.play.textContent = "⏸";
    ui.play.classList.add("on");
    S.play = setInterval(() => setIndex((S.index + 1) % Math.max(1, S.names.length)), PLAY_MS);
  });
  on(ui.grid, "click", () => setGrid(!S.gridOn));
  on(ui.mode, "change", () => setMode(ui.mode.value));
  for (const input of [ui.cmap, ui.lo, ui.hi, ui.gamma]) on(input, "input", drawAll);
  on(ui.scale, "change", drawPattern);
  on(ui.png, "click", () => exportPng());
  on(ui.html, "click", () => exportHtml());

  // the phase panel's: a slider asks as it moves, an entry when its value is given (Enter, or leaving it)
  on(ph.method, "change", () => setPhase({ method: ph.method.value }));
  on(ph.upsampling, "change", () => setPhase({ upsampling: ph.upsampling.value === "auto" ? "auto" : Number(ph.upsampling.value) }));
  on(ph.strength, "change", () => setPhase({ strength: ph.strength.value === "" ? "" : Number(ph.strength.value) }));
  on(ph.spectrum, "change", () => setPhase({ spectrum: ph.spectrum.checked }));
  for (const s of ph.sliders) {
    on(s.range, "input", () => setPhase({ [s.key]: Number(s.range.value) }));
    on(s.range, "keydown", (event) => { // Shift + arrow: NUDGE steps (plain arrows step once, as range inputs do)
      const sign = { ArrowRight: 1, ArrowUp: 1, ArrowLeft: -1, ArrowDown: -1 }[event.key];
      if (!sign || !event.shiftKey) return;
      event.preventDefault();
      const before = s.range.value;
      s.range.value = Number(before) + sign * NUDGE * Number(s.range.step);
      if (s.range.value !== before) setPhase({ [s.key]: Number(s.range.value) });
    });
    // an entry's text that is no number goes as it is: the server's refusal says what it takes
    on(s.entry, "change", () => setPhase({ [s.key]: s.entry.value === "" ? s.entry.value : Number(s.entry.value) }));
  }
  on(ph.fit, "click", fit);
  on(ph.reset, "click", reset);
  on(ph.grid, "click", () => setPhaseGrid(!P.gridOn));
  on(ph.goOn, "click", () => {
    const controls = P.goOn;
    P.goOn = null;
    ph.goOn.hidden = true;
    if (!controls) return;
    if (!P.image) loadingSays(phaseView.loading, "loading the phase image…", true);
    ask({ type: "phase", ...controls, go_on: true });
  });

  // ---- exports ------------------------------------------------------------------------------
  // One panel: the canvas scaled up by whole-pixel blocks, with its overlay drawn at that scale.
  function panel(source, rows, cols, items) {
    const s = EXPORT_SIDE / Math.max(rows, cols, 1);
    const out = h("canvas", { width: Math.round(cols * s), height: Math.round(rows * s) });
    const ctx = out.getContext("2d");
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(source, 0, 0, out.width, out.height);
    canvasItems(ctx, items(s));
    return out;
  }

  function panels() {
    if (!S.image || !S.pattern) throw new Error("nothing drawn yet");
    const { rows, cols } = S.image, pr = S.pattern.rows, pc = S.pattern.cols;
    return [
      panel(ui.image, rows, cols, (s) => [...markItems(S.mark, s), ...scaleBarItems(cols, rows, s, S.optics?.scan_step_A, "Å")]),
      panel(ui.pattern, pr, pc, (s) => [...detectorItems(S.detector, s), ...scaleBarItems(pc, pr, s, S.optics?.det_sampling_mrad, "mrad")]),
    ];
  }

  const baseName = () => (S.names[S.index] || "qgpu-view").replace(/[^\w.-]+/g, "_");

  function exportPng() {
    try {
      const [a, b] = panels();
      const gap = 16;
      const out = h("canvas", { width: a.width + gap + b.width, height: Math.max(a.height, b.height) });
      const ctx = out.getContext("2d");
      ctx.fillStyle = "#fff";
      ctx.fillRect(0, 0, out.width, out.height);
      ctx.drawImage(a, 0, 0);
      ctx.drawImage(b, a.width + gap, 0);
      out.toBlob((blob) => download(`${baseName()}-${S.detector?.kind || "view"}.png`, blob), "image/png");
    } catch (err) {
      S.error = { seq: null, message: `export: ${err.message}` };
      renderStatus();
    }
  }

  function exportHtml() {
    try {
      const [a, b] = panels();
      const name = S.names[S.index] || "";
      const date = new Date().toISOString();
      const text = `<!doctype html>
<html><head><meta charset="utf-8"><title>qgpu-dask: ${escapeHtml(name)}</title>
<style>body{font-family:sans-serif;margin:24px}figure{display:inline-block;margin:0 16px 16px 0}
img{image-rendering:pixelated;max-width:${EXPORT_SIDE}px}pre{background:#f4f4f4;padding:8px}</style></head>
<body><h1>${escapeHtml(name)}</h1><p>Exported ${escapeHtml(date)} from the qgpu-dask viewer.</p>
<figure><img alt="virtual image" src="${a.toDataURL("image/png")}"><figcaption>Image (${escapeHtml(S.image.header.mode)})</figcaption></figure>
<figure><img alt="diffraction pattern" src="${b.toDataURL("image/png")}"><figcaption>Pattern (${escapeHtml(patternLabel())})</figcaption></figure>
<h2>Detector</h2><pre>${escapeHtml(JSON.stringify(S.detector, null, 2))}</pre></body></html>
`;
      download(`${baseName()}.html`, new Blob([text], { type: "text/html" }));
    } catch (err) {
      S.error = { seq: null, message: `export: ${err.message}` };
      renderStatus();
    }
  }

  // ---- hooks for tests and benchmarks -----------------------------------------------------------
  function canvasHash(role) {
    let hash = 0x811c9dc5;
    for (const canvas of root.querySelectorAll(`canvas[data-role="${role}"]`)) {
      const bytes = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
      for (let i = 0; i < bytes.length; i++) hash = Math.imul(hash ^ bytes[i], 0x01000193);
    }
    return hash >>> 0;
  }
  Object.assign(hooks, { setDetector, setIndex, setCursor, setRegion, setMode, setGrid, setPhase, fit, reset, setPhaseGrid, canvasHash });
  const registry = (window.qgpuViewers ||= []);
  registry.push(hooks);

  // ---- start ------------------------------------------------------------------------------------
  const unsubscribe = transport.onAnswer(onAnswer);
  const unclose = transport.onClose?.((info) => {
    S.closed = info || {};
    stopPlay();
    for (const loading of [ui.imageLoading, ui.patternLoading, phaseView.loading]) loadingSays(loading, "not loaded: the connection closed", false);
    renderStatus();
  });
  const stallTimer = setInterval(() => { // frees a channel whose answer never came; the phase channel's seconds tick
    flush();
    if (channels.phase.inflight != null) renderStatus();
  }, 500);
  renderStatus();
  transport.send({ type: "hello" });

  return {
    hooks,
    destroy() {
      stopPlay();
      clearInterval(stallTimer);
      if (typeof unsubscribe === "function") unsubscribe();
      if (typeof unclose === "function") unclose();
      const at = registry.indexOf(hooks);
      if (at >= 0) registry.splice(at, 1);
      root.remove();
    },
  };
}
