/*
 * app.js: the dspark fleet dashboard. Plain browser JavaScript, no build step;
 * works from a web server (`dspark dashboard`) or opened from disk.
 *
 * Connects to the broker over MQTT over WebSockets with mqtt.js (the vendored
 * vendor/mqtt.min.js, global `mqtt`) and only subscribes: retained status and
 * telemetry of every node, rollout events and alerts (dspark/v1/alert/<node>:
 * a badge per node while its latest alert is raised). It never publishes.
 *
 * Fleet percentiles are computed by merging the nodes' "window" histograms
 * (the same fine bucket layout on every node, see ds/metrics.h): counts of
 * equal upper bounds are added, then the quantile is read off the merged
 * buckets exactly as ds_hist_quantile does. Percentiles are never averaged.
 *
 * Ages are the nodes' own: a node's age is now minus the newest "ts" it
 * wrote (noteTs), never when this page heard of it, and a node that stopped
 * reporting is shown stale. A field that says how something went ("ok") is
 * read as written: a missing one is an unknown outcome, never a success.
 *
 * URL parameters: broker (connects at once), insecure=1 (ticks "plain ws://").
 * Credentials come from the form only: a user or password in the URL would sit
 * in the browser's history, proxies' logs and Referer headers, so it is
 * ignored, taken out of the address bar and warned about.
 * Plain ws:// carries the password and every prompt in clear text: the page
 * connects to a ws:// broker on another host than this machine only when told
 * to ("plain ws://" ticked, for a lab); the default for a page served from
 * another host is wss://HOST:9443 (deploy/mosquitto/edge.conf).
 */
'use strict';

const HIST = ['queue_ms', 'ttft_ms', 'total_ms'];
const KEEP = 300;                 // points kept per series (5 min at 1 s)
const STEP = Math.pow(2, 1 / 8);  // fine bucket ratio (DS_HIST_SUB = 8)
const nodes = new Map();          // name -> {name, role, state, seen, skew, tel, series}
const fleetSeries = newSeries();
const events = [];
let client = null;

function newSeries() {
  const s = { t: [], req: [], tok: [] };
  for (const h of HIST) for (const q of ['p50', 'p90', 'p99']) s[h + '.' + q] = [];
  return s;
}

function push(series, key, v) {
  const a = series[key];
  a.push(v);
  if (a.length > KEEP) a.shift();
}

function get(o, path) {
  for (const k of path.split('.')) {
    if (o == null || typeof o !== 'object') return undefined;
    o = o[k];
  }
  return o;
}

// An edge's weighted routing (telemetry "routing"): each center's share of
// the weight and the requests this edge sent it, and where the center
// verifies drafts its speculation session slots free for this edge's next
// open (an open skips a center with none while another has one); shown as
// the OVF cell's title.
function routeText(t) {
  const cs = get(t, 'routing.centers');
  if (!Array.isArray(cs) || !cs.length) return '';
  return `routing ${get(t, 'routing.mode') || '?'}: ` + cs.map(c =>
    `${c.name} ${fmt(100 * (c.share || 0), 0)} % (weight ${fmt(c.weight || 0, 0)}, sent ${c.sent ?? 0}` +
    (typeof c.spec_sessions === 'number' ? `, spec ${c.spec_free ?? 0}/${c.spec_sessions} free` : '') +
    `${c.chosen_by_weight ? '' : ', not chosen'})`).join('; ');
}

function num(o, path) {
  const v = get(o, path);
  return typeof v === 'number' && isFinite(v) ? v : null;
}

/* ---- histograms ---- */

/* Merge window histograms {le: [...], counts: [...], count} into one map. */
function mergeHists(hists) {
  const m = new Map();
  let count = 0, min = Infinity, max = -Infinity;
  for (const h of hists) {
    if (!h || !Array.isArray(h.le) || !Array.isArray(h.counts)) continue;
    if (h.count > 0 && typeof h.min === 'number') min = Math.min(min, h.min);
    if (h.count > 0 && typeof h.max === 'number') max = Math.max(max, h.max);
    for (let i = 0; i < h.le.length && i < h.counts.length; i++) {
      const k = String(h.le[i]);
      m.set(k, (m.get(k) || 0) + h.counts[i]);
      count += h.counts[i];
    }
  }
  const buckets = [...m.entries()].map(([le, c]) => ({ hi: Number(le), c })).sort((a, b) => a.hi - b.hi);
  return { buckets, count, min: isFinite(min) ? min : 0, max: isFinite(max) ? max : Infinity };
}

/* The q-quantile of merged buckets, as ds_hist_quantile: the bucket holding
 * rank q*count, linear inside it, its bounds narrowed to the fleet's
 * [min, max]; a bucket's lower bound is its upper bound / 2^(1/8) (0 for the
 * first fine bucket, whose upper bound is 0.01 ms). */
function quantile(merged, q) {
  if (!merged.count) return null;
  const rank = q * merged.count;
  let cum = 0;
  for (const b of merged.buckets) {
    if (cum + b.c < rank) { cum += b.c; continue; }
    let lo = b.hi <= 0.01 ? 0 : b.hi / STEP, hi = b.hi;
    lo = Math.max(lo, merged.min);
    hi = Math.min(hi, merged.max);
    if (hi < lo) hi = lo;
    const f = Math.min(1, Math.max(0, (rank - cum) / b.c));
    return Math.min(Math.max(lo + f * (hi - lo), merged.min), merged.max);
  }
  const last = merged.buckets[merged.buckets.length - 1];
  return last ? last.hi : null;
}

/* ---- formatting ---- */

function fmt(v, digits) {
  if (v == null) return '-';
  if (digits === undefined) digits = Math.abs(v) >= 100 ? 0 : Math.abs(v) >= 10 ? 1 : 2;
  return v.toFixed(digits);
}

function ago(ms) {
  if (!ms) return '-';
  const s = Math.max(0, (Date.now() - ms) / 1000);
  return s < 90 ? s.toFixed(0) + ' s ago' : s < 5400 ? (s / 60).toFixed(0) + ' min ago' : (s / 3600).toFixed(1) + ' h ago';
}

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('data-')) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const k of kids) if (k != null) e.append(k instanceof Node ? k : String(k));
  return e;
}

/* ---- charts (plain canvas) ---- */

function drawLines(canvas, lines, unit) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 240, h = canvas.clientHeight || 60;
  canvas.width = w * dpr;
  canvas.height = h * dpr;
  const g = canvas.getContext('2d');
  g.scale(dpr, dpr);
  g.clearRect(0, 0, w, h);
  let max = 0;
  for (const l of lines) for (const v of l.data) if (v != null && v > max) max = v;
  if (max <= 0) max = 1;
  g.strokeStyle = '#2a3038';
  g.beginPath(); g.moveTo(0, h - 0.5); g.lineTo(w, h - 0.5); g.stroke();
  for (const l of lines) {
    g.strokeStyle = l.color;
    g.lineWidth = 1.5;
    g.beginPath();
    let started = false;
    const n = l.data.length;
    l.data.forEach((v, i) => {
      if (v == null) { started = false; return; }
      const x = n > 1 ? (i / (n - 1)) * (w - 1) : w - 1;
      const y = h - 2 - (v / max) * (h - 14);
      if (started) g.lineTo(x, y); else g.moveTo(x, y);
      started = true;
    });
    g.stroke();
  }
  g.fillStyle = '#7d8792';
  g.font = '10px sans-serif';
  g.fillText('max ' + fmt(max) + (unit ? ' ' + unit : ''), 2, 10);
}

const PCOLORS = { p50: '#3fb950', p90: '#d29922', p99: '#f85149' };

function chartBox(id, title) {
  let box = document.getElementById(id);
  if (!box) {
    box = el('div', { class: 'chart', id }, el('div', { class: 't' }, el('span', {}, title), el('span', { class: 'v' })),
      el('canvas'));
    document.getElementById('fleet-charts').append(box);
  }
  return box;
}

function drawFleetCharts() {
  const s = fleetSeries;
  const last = (k) => s[k][s[k].length - 1];
  for (const hname of HIST) {
    const box = chartBox('chart-' + hname, hname.replace('_ms', '') + ' p50/p90/p99 ms');
    box.querySelector('.v').textContent = ['p50', 'p90', 'p99'].map((q) => fmt(last(hname + '.' + q))).join(' / ');
    drawLines(box.querySelector('canvas'), ['p50', 'p90', 'p99'].map((q) => ({ data: s[hname + '.' + q], color: PCOLORS[q] })), 'ms');
  }
  for (const [k, t] of [['req', 'requests/s'], ['tok', 'tokens/s']]) {
    const box = chartBox('chart-' + k, t);
    box.querySelector('.v').textContent = fmt(last(k));
    drawLines(box.querySelector('canvas'), [{ data: s[k], color: '#58a6ff' }]);
  }
}

/* ---- model ---- */

function nodeOf(name) {
  let n = nodes.get(name);
  if (!n) {
    n = { name, role: '', state: '', seen: 0, skew: null, tel: null, series: newSeries(), alerts: {} };
    nodes.set(name, n);
  }
  return n;
}

const seenEvents = new Set();

/* A rollout event from the rollout topic or from a node's telemetry
 * (rollout_events, so a page opened later still shows recent ones); each once. */
function addRollout(node, j) {
  const key = [node, j.ts, j.event, j.model, j.version, j.reason].join('|');
  if (seenEvents.has(key)) return;
  seenEvents.add(key);
  const t = j.ts ? new Date(j.ts).toISOString().slice(11, 19) : '';
  // Only an explicit true is success: an event without "ok" (an older node) is of unknown outcome.
  const outcome = j.ok === true ? 'ok' : j.ok === false ? 'refused' : 'outcome unknown';
  const li = addEvent(`${t} ${node} ${j.event} ${j.model} ${j.version}: ${outcome}: ${j.reason}`, j.ok !== true);
  li.dataset.outcome = outcome;
  li.dataset.node = node;
}

function addEvent(text, bad) {
  events.push({ text, bad });
  if (events.length > 200) events.shift();
  const ol = document.getElementById('events');
  const li = el('li', { class: bad ? 'bad' : '' }, text);
  ol.prepend(li);
  while (ol.children.length > 200) ol.lastChild.remove();
  return li;
}

/* A node's own time (its status, telemetry and alert ts, Unix ms): the newest is when it last
 * spoke, however late this page heard of it (a retained message of a node
 * dead for an hour is an hour old). A live message also measures how far
 * its clock is off this browser's. */
const SKEW_MS = 2000;
function noteTs(n, j, retained) {
  if (typeof j.ts !== 'number' || !(j.ts > 0)) return;
  if (j.ts > n.seen || !retained) n.seen = j.ts;   // a live one is its word now, even behind
  if (!retained) n.skew = Date.now() - j.ts;
}

/* Stale: not offline, yet nothing for 3 telemetry periods (+2 s) by its own clock. */
function isStale(n) {
  if (n.state === 'offline' || !n.seen) return false;
  const iv = num(n.tel, 'interval_s') || 5;
  return Date.now() - n.seen > (3 * iv + 2) * 1000;
}

function skewed(n) { return n.skew != null && Math.abs(n.skew) > SKEW_MS; }

function onMessage(topic, payload, retained) {
  if (!payload || !payload.length) return;       // a cleared retained message
  let j;
  try { j = JSON.parse(new TextDecoder().decode(payload)); } catch (e) { return; }
  if (!j || typeof j !== 'object') return;
  const parts = topic.split('/');
  const kind = parts[2], name = parts.slice(3).join('/');
  if (kind === 'status') {
    const n = nodeOf(name);
    n.state = j.state || n.state;
    n.role = j.role || n.role;
    noteTs(n, j, retained);
  } else if (kind === 'telemetry') {
    const n = nodeOf(name);
    n.tel = j;
    n.role = j.role || n.role;
    noteTs(n, j, retained);
    if (Array.isArray(j.rollout_events)) for (const e of j.rollout_events) addRollout(name, e);
  } else if (kind === 'rollout') {
    addRollout(j.node || name, j);
  } else if (kind === 'alert') {
    // schemas/alert.schema.json; only an alert about the node its topic names counts.
    if (j.node !== name || typeof j.check !== 'string' || (j.state !== 'raised' && j.state !== 'cleared')) return;
    const n = nodeOf(name);
    n.role = n.role || j.role;
    n.alerts[j.check] = { state: j.state, message: String(j.message || ''), ts: j.ts };
    noteTs(n, j, true);     // its last word too (an offline last will has ts 0); no skew measure
    const key = [name, j.ts, j.state, j.check].join('|');
    if (seenEvents.has(key)) return;
    seenEvents.add(key);
    const t = j.ts ? new Date(j.ts).toISOString().slice(11, 19) : '';
    addEvent(`${t} alert ${name} ${j.check} ${j.state}: ${j.message || ''}`, j.state === 'raised');
  }
}

/* ---- rendering, once a second ---- */

/* The checks whose latest alert message says raised. */
function openAlerts(n) {
  return Object.keys(n.alerts).filter((c) => n.alerts[c].state === 'raised').sort();
}

function isUp(n) { return n.state !== 'offline' && !isStale(n); }

function sample() {
  const up = [...nodes.values()].filter(isUp);
  let req = 0, tok = 0;
  for (const n of up) {
    const r = num(n.tel, 'rates.requests_per_s') || 0, t = num(n.tel, 'rates.tokens_per_s') || 0;
    req += r;
    tok += t;
  }
  push(fleetSeries, 'req', req);
  push(fleetSeries, 'tok', tok);
  for (const hname of HIST) {
    const merged = mergeHists(up.map((n) => get(n.tel, 'window.' + hname)));
    for (const q of ['p50', 'p90', 'p99']) push(fleetSeries, hname + '.' + q, quantile(merged, Number(q.slice(1)) / 100));
  }
  for (const n of nodes.values()) {
    push(n.series, 'req', isUp(n) ? num(n.tel, 'rates.requests_per_s') : null);
    push(n.series, 'total_ms.p99', isUp(n) ? num(n.tel, 'window.total_ms.p99') : null);
  }
  return { up: up.length, req, tok };
}

function pcts(tel, h) {
  const w = get(tel, 'window.' + h);
  const src = w && w.count ? w : get(tel, 'latency.' + h);
  if (!src) return '-';
  return ['p50', 'p90', 'p99'].map((q) => fmt(num(src, q))).join(' / ');
}

function render() {
  const f = sample();
  const all = [...nodes.values()].sort((a, b) => a.name.localeCompare(b.name));
  document.getElementById('k-up').textContent = `${f.up} / ${all.length}`;
  document.getElementById('k-req').textContent = fmt(f.req, 1);
  document.getElementById('k-tok').textContent = fmt(f.tok, 1);
  let queued = 0, ovfNum = 0, ovfDen = 0, specA = 0, specN = 0;
  for (const n of all.filter(isUp)) {
    for (const t of ['high', 'normal', 'low']) queued += num(n.tel, 'queues.' + t) || 0;
    const o = num(n.tel, 'rates.overflow_ratio'), r = num(n.tel, 'rates.requests_per_s') || 0;
    if (o != null && n.role === 'edge') { ovfNum += o * Math.max(r, 1e-9); ovfDen += Math.max(r, 1e-9); }
    const a = num(n.tel, 'spec.acceptance') ?? num(n.tel, 'speculation.acceptance');
    if (a != null) { specA += a; specN++; }
  }
  document.getElementById('k-queue').textContent = String(queued);
  const p99 = fleetSeries['total_ms.p99'][fleetSeries['total_ms.p99'].length - 1];
  document.getElementById('k-p99').textContent = p99 == null ? '-' : fmt(p99) + ' ms';
  document.getElementById('k-ovf').textContent = ovfDen ? fmt(100 * ovfNum / ovfDen, 1) + ' %' : '-';
  document.getElementById('k-spec').textContent = specN ? fmt(100 * specA / specN, 1) + ' %' : '-';
  const open = all.reduce((c, n) => c + openAlerts(n).length, 0);
  const ka = document.getElementById('k-alerts');
  ka.textContent = String(open);
  ka.dataset.open = String(open);
  drawFleetCharts();

  const tb = document.querySelector('#nodes tbody');
  tb.replaceChildren();
  const errTotals = new Map();
  const mt = document.querySelector('#models tbody');
  mt.replaceChildren();
  for (const n of all) {
    const t = n.tel;
    const q = ['high', 'normal', 'low'].map((k) => num(t, 'queues.' + k) ?? '-').join('/');
    let errs = 0;
    for (const [code, c] of Object.entries(get(t, 'errors') || {})) {
      errs += c;
      if (!errTotals.has(code)) errTotals.set(code, []);
      if (c) errTotals.get(code).push([n.name, c]);
    }
    const kvUsed = num(t, 'kv.used_blocks'), kvTotal = num(t, 'kv.total_blocks');
    const alerts = openAlerts(n);
    const badges = el('td', { class: 'alert' }, ...alerts.map((c) =>
      el('span', { class: 'badge', title: n.alerts[c].message }, c)));
    if (!alerts.length) badges.textContent = '-';
    const spark = el('canvas');
    const state = isStale(n) ? 'stale' : n.state;
    const seen = el('td', { class: 'seen' }, ago(n.seen) + (skewed(n) ? ' (clock skew)' : ''));
    if (skewed(n)) seen.title = `its clock is ${fmt(Math.abs(n.skew) / 1000, 1)} s ${n.skew > 0 ? 'behind' : 'ahead of'} this browser's: its age is off as much`;
    const tr = el('tr', { 'data-node': n.name, 'data-state': state || 'unknown', 'data-role': n.role },
      el('td', { class: 'name' }, n.name), el('td', { class: 'role' }, n.role || '?'),
      el('td', { class: 'state' }, state || '?'), badges, seen,
      el('td', { class: 'num req' }, isUp(n) ? fmt(num(t, 'rates.requests_per_s'), 2) : '-'),
      el('td', { class: 'num tok' }, isUp(n) ? fmt(num(t, 'rates.tokens_per_s'), 1) : '-'),
      el('td', { class: 'num queue' }, q),
      el('td', { class: 'num lat-queue' }, pcts(t, 'queue_ms')),
      el('td', { class: 'num lat-ttft' }, pcts(t, 'ttft_ms')),
      el('td', { class: 'num lat-total' }, pcts(t, 'total_ms')),
      el('td', { class: 'num errors' }, String(errs)),
      el('td', { class: 'num kv' }, kvTotal ? `${kvUsed}/${kvTotal} (${fmt(100 * kvUsed / kvTotal, 0)} %)` : '-'),
      el('td', { class: 'num ovf', title: routeText(t) }, n.role === 'edge' && num(t, 'rates.overflow_ratio') != null ? fmt(100 * num(t, 'rates.overflow_ratio'), 1) + ' %' : '-'),
      el('td', { class: 'num spec' }, num(t, 'spec.acceptance') != null ? fmt(100 * num(t, 'spec.acceptance'), 1) + ' %' : '-'),
      el('td', { class: 'spark' }, spark));
    const p99 = num(t, 'window.total_ms.p99') ?? num(t, 'latency_ms.p99');
    tr.setAttribute('data-p99', p99 == null ? '' : String(p99));
    tr.setAttribute('data-req', String(num(t, 'rates.requests_per_s') ?? ''));
    tr.setAttribute('data-alert', alerts.join(' '));
    tb.append(tr);
    drawLines(spark, [{ data: n.series['total_ms.p99'], color: '#f85149' }]);
    for (const m of get(t, 'models') || []) {
      const vers = Array.isArray(m.versions) && m.versions.length ? m.versions : [{ version: m.version, state: 'active' }];
      for (const v of vers)
        mt.append(el('tr', { 'data-model': m.name, 'data-version': v.version },
          el('td', {}, n.name), el('td', {}, m.name), el('td', { class: 'version' }, v.version),
          el('td', {}, m.precision), el('td', {}, v.state + (v.pct != null && v.state === 'canary' ? ` ${v.pct}%` : '')),
          el('td', { class: 'num' }, v.served ?? '-'), el('td', { class: 'num' }, v.errors ?? '-')));
    }
  }
  const et = document.querySelector('#errors tbody');
  et.replaceChildren();
  for (const [code, list] of [...errTotals.entries()].sort()) {
    const total = list.reduce((a, [, c]) => a + c, 0);
    et.append(el('tr', { 'data-code': code }, el('td', {}, code), el('td', { class: 'num' }, total),
      el('td', {}, list.map(([nn, c]) => `${nn}: ${c}`).join(', '))));
  }
}

/* ---- connection ---- */

function setConn(state, text) {
  const c = document.getElementById('conn');
  c.dataset.state = state;
  c.textContent = text || state;
}

/* True for a host name that stays on this machine. */
function isLoopback(host) {
  const h = host.replace(/^\[|\]$/g, '').toLowerCase();
  return h === 'localhost' || h === '::1' || /^127\.\d+\.\d+\.\d+$/.test(h);
}

/* Why the page will not connect to url ('' when it will): not ws:// or
 * wss://, or plain ws:// to another host without allowPlain. */
function brokerProblem(url, allowPlain) {
  let u;
  try { u = new URL(url); } catch (e) { return 'not a URL: ' + url; }
  if (u.protocol !== 'ws:' && u.protocol !== 'wss:') return 'the broker URL must start with wss:// (or ws:// on this machine)';
  if (u.username || u.password) return 'credentials in the broker URL: type them in the user and password fields';
  if (u.protocol === 'ws:' && !isLoopback(u.hostname) && !allowPlain)
    return 'plain ws:// to ' + u.hostname + ' sends the password and every prompt in clear text: ' +
      'use wss://' + u.host.replace(/:\d+$/, '') + ':9443, or tick "plain ws://" (a lab only)';
  return '';
}

/* The broker the form offers first, for a page at (protocol, hostname). */
function defaultBroker(protocol, hostname) {
  if (!protocol.startsWith('http') || isLoopback(hostname)) return 'ws://127.0.0.1:9001';
  return 'wss://' + hostname + ':9443';
}

function connect(url, user, password, allowPlain) {
  const why = brokerProblem(url, allowPlain);
  if (why) { setConn('error', why); return; }
  if (client) client.end(true);
  nodes.clear();
  setConn('connecting', 'connecting to ' + url);
  const opts = { clean: true, reconnectPeriod: 2000, connectTimeout: 8000, protocolVersion: 5,
    clientId: 'dspark-dashboard-' + Math.random().toString(16).slice(2, 10) };
  if (user) opts.username = user;
  if (password) opts.password = password;
  client = mqtt.connect(url, opts);
  client.on('connect', () => {
    setConn('connected', 'connected to ' + url);
    client.subscribe(['dspark/v1/status/+', 'dspark/v1/telemetry/+', 'dspark/v1/rollout/+', 'dspark/v1/alert/+'], { qos: 0 });
  });
  client.on('message', (topic, payload, packet) => onMessage(topic, payload, !!(packet && packet.retain)));
  client.on('reconnect', () => setConn('connecting', 'reconnecting to ' + url));
  client.on('close', () => { if (document.getElementById('conn').dataset.state === 'connected') setConn('disconnected'); });
  client.on('error', (e) => setConn('error', String(e && e.message || e)));
}

function main() {
  const p = new URLSearchParams(location.search);
  const b = document.getElementById('broker'), u = document.getElementById('user'), pw = document.getElementById('password');
  const plain = document.getElementById('insecure');
  b.value = p.get('broker') || defaultBroker(location.protocol, location.hostname);
  plain.checked = p.get('insecure') === '1';
  const leaked = p.has('password') || p.has('user');
  if (leaked) {                      // never used; out of the address bar at once
    p.delete('password');
    p.delete('user');
    const q = p.toString();
    history.replaceState(null, '', location.pathname + (q ? '?' + q : '') + location.hash);
  }
  document.getElementById('connect').addEventListener('submit', (e) => {
    e.preventDefault();
    connect(b.value.trim(), u.value, pw.value, plain.checked);
  });
  if (typeof mqtt === 'undefined') { setConn('error', 'vendor/mqtt.min.js did not load'); return; }
  if (leaked) setConn('error', 'a user or password in the URL is ignored: type them in the form');
  else if (p.get('broker')) connect(b.value, '', '', plain.checked);
  render();
  setInterval(render, 1000);
}

if (typeof document !== 'undefined') main();
if (typeof module !== 'undefined') module.exports = { brokerProblem, defaultBroker, isLoopback };   // tests (node)
