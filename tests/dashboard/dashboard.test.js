// dashboard.test.js: integration.dashboard's browser half (test_ops.c runs it).
// Opens the real dashboard in headless Chromium and checks what a user sees.
// argv: page URL, broker ws:// URL, output folder.
// Protocol with test_ops.c over stdout lines / files in the output folder:
//   READY            both nodes listed online: start sending requests
//   RATES            both nodes showed non-zero requests/s: stop sending
//   (waits for OUT/expect.json: {"node": published window p99, ...})
//   STOP center-ops  p99s and a model version checked: stop the center
//   PASS             the center shown offline, the fleet p99 then the edge's
//                    own (merged buckets); edge-alert (wedged by the test,
//                    gone) shown with its engine_stalled badge and counted
//                    as the one open alert; KV use and the edge's speculation
//                    acceptance shown; edge-ops's refused control command
//                    shown refused (red); edge-dead (retained messages
//                    written an hour ago) shown stale, an hour old; then
//                    the page reloaded (a viewer restart) shows both the
//                    same, the refusal now from the telemetry alone;
//                    screenshot saved
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const puppeteer = require('puppeteer-core');

const [url, broker, out] = process.argv.slice(2);
const NODES = ['edge-ops', 'center-ops'];
const T = 60000;

function log(...a) { process.stdout.write(a.join(' ') + '\n'); }

async function waitFile(p, ms) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (fs.existsSync(p)) return JSON.parse(fs.readFileSync(p, 'utf8'));
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error('no ' + p);
}

// edge-dead is stale and an hour old by its own ts; edge-ops's refused
// control command is listed as refused, in red, never as ok.
async function checkStaleAndRefused(page, when) {
  await page.waitForFunction(() => {
    const r = document.querySelector('#nodes tr[data-node="edge-dead"]');
    return r && r.dataset.state === 'stale' && r.querySelector('.state').textContent === 'stale' &&
      /^(6\d|7[0-5]) min ago$/.test(r.querySelector('.seen').textContent);
  }, { timeout: T }).catch(async (e) => {
    log('NODES TABLE', await page.$eval('#nodes', (t) => t.innerText));
    throw e;
  });
  const dead = await page.$eval('#nodes tr[data-node="edge-dead"]', (r) => ({
    seen: r.querySelector('.seen').textContent, req: r.querySelector('.req').textContent,
    color: getComputedStyle(r.querySelector('.state')).color,
  }));
  if (dead.req !== '-') throw new Error('stale edge-dead shown with a rate: ' + dead.req);
  if (dead.color !== 'rgb(248, 81, 73)') throw new Error('stale state not red: ' + dead.color);
  await page.waitForFunction(() => [...document.querySelectorAll('#events li')].some((li) =>
    li.dataset.node === 'edge-ops' && /no trusted signer key/.test(li.textContent)), { timeout: T });
  const evs = await page.$$eval('#events li', (lis) => lis.filter((li) => li.dataset.node === 'edge-ops' &&
    /no trusted signer key/.test(li.textContent)).map((li) => ({ text: li.textContent, outcome: li.dataset.outcome,
    cls: li.className, color: getComputedStyle(li).color })));
  for (const e of evs)
    if (e.outcome !== 'refused' || / ok: /.test(e.text) || e.cls !== 'bad' || e.color !== 'rgb(248, 81, 73)')
      throw new Error('refused command shown as ' + JSON.stringify(e));
  log(`${when}: edge-dead ${dead.seen} (stale); refused command: ${evs[0].text}`);
}

(async () => {
  const udd = fs.mkdtempSync(path.join(os.tmpdir(), 'dspark-chromium-'));
  const browser = await puppeteer.launch({
    executablePath: '/usr/bin/chromium',
    headless: true,
    userDataDir: udd,
    args: ['--headless=new', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', '--allow-file-access-from-files'],
    defaultViewport: { width: 1500, height: 900 },
  });
  try {
    const page = await browser.newPage();
    page.on('console', (m) => log('console:', m.text()));
    page.on('pageerror', (e) => log('pageerror:', e.message));
    await page.goto(url + '?broker=' + encodeURIComponent(broker));
    await page.waitForFunction(() => document.getElementById('conn').dataset.state === 'connected', { timeout: T });
    await page.waitForFunction((nodes) => nodes.every((n) => {
      const r = document.querySelector(`#nodes tr[data-node="${n}"]`);
      return r && r.dataset.state === 'online' && r.querySelector('.state').textContent === 'online';
    }), { timeout: T }, NODES);
    log('READY');
    await page.waitForFunction((nodes) => nodes.every((n) => {
      const r = document.querySelector(`#nodes tr[data-node="${n}"]`);
      return r && parseFloat(r.querySelector('.req').textContent) > 0;
    }), { timeout: T, polling: 50 }, NODES).catch(async (e) => {
      log('NODES TABLE', await page.$eval('#nodes', (t) => t.innerText));
      throw e;
    });
    const fleetReq = await page.$eval('#k-req', (e) => e.textContent);
    log('RATES fleet req/s shown', fleetReq);
    const expect = await waitFile(path.join(out, 'expect.json'), T);
    // The third figure of "total p50/p90/p99" as shown, equal within rounding to the node's.
    await page.waitForFunction((exp) => Object.entries(exp).every(([n, want]) => {
      const r = document.querySelector(`#nodes tr[data-node="${n}"]`);
      if (!r) return false;
      const shown = parseFloat(r.querySelector('.lat-total').textContent.split('/')[2]);
      return Math.abs(shown - want) <= 0.006 * want + 0.006;
    }), { timeout: T }, expect);
    for (const n of Object.keys(expect)) {
      const shown = await page.$eval(`#nodes tr[data-node="${n}"] .lat-total`, (e) => e.textContent);
      log(`p99 ${n}: shown "${shown}", published ${expect[n]}`);
    }
    const fleetP99 = await page.$eval('#k-p99', (e) => e.textContent);
    if (!/\d/.test(fleetP99)) throw new Error('no fleet p99: ' + fleetP99);
    const version = await page.waitForFunction(() => {
      const c = document.querySelector('#models tr[data-model="stories"] .version');
      return c && c.textContent ? c.textContent : false;
    }, { timeout: T });
    log('model version shown', await version.jsonValue(), '; fleet p99', fleetP99);
    // The edge's routing weights (its telemetry's "routing") in the OVF cell's
    // title, while center-ops is up: once it stops, the edge drops it from the
    // table and the next telemetry has no weight for it. center-ops verifies
    // drafts ([spec] sessions = 4 by default, none open): its session slots too.
    const routeRe = /^routing weighted: .*center-ops \d+ % \(weight \d+, sent \d+, spec 4\/4 free/;
    try {
      await page.waitForFunction((re) => {
        const c = document.querySelector('#nodes tr[data-node="edge-ops"] .ovf');
        return c && new RegExp(re).test(c.title);
      }, { timeout: T }, routeRe.source);
    } catch (e) {
      const t = await page.$eval('#nodes tr[data-node="edge-ops"] .ovf', (c) => c.title).catch(() => '(no cell)');
      throw new Error('edge-ops routing weights not shown (OVF title): ' + t);
    }
    log('routing edge-ops', await page.$eval('#nodes tr[data-node="edge-ops"] .ovf', (e) => e.title));
    log('STOP center-ops');
    await page.waitForFunction(() => {
      const r = document.querySelector('#nodes tr[data-node="center-ops"]');
      return r && r.dataset.state === 'offline' && r.querySelector('.state').textContent === 'offline';
    }, { timeout: T });
    // With the edge alone up, the fleet p99 merged from its buckets is its own p99 (within rounding).
    await page.waitForFunction((want) => {
      const shown = parseFloat(document.getElementById('k-p99').textContent);
      return Math.abs(shown - want) <= 0.01 * want + 0.06;
    }, { timeout: T }, expect['edge-ops']);
    log('fleet p99 with the edge alone', await page.$eval('#k-p99', (e) => e.textContent));
    await page.waitForFunction(() => {
      const r = document.querySelector('#nodes tr[data-node="edge-alert"]');
      const b = r && r.querySelector('.alert .badge');
      return r && r.dataset.alert === 'engine_stalled' && b && b.textContent === 'engine_stalled' &&
        document.getElementById('k-alerts').textContent === '1';
    }, { timeout: T });
    log('alert shown: edge-alert', await page.$eval('#nodes tr[data-node="edge-alert"] .alert', (e) => e.textContent),
      '; open alerts', await page.$eval('#k-alerts', (e) => e.textContent));
    const okRow = await page.$eval('#nodes tr[data-node="edge-ops"]', (r) => r.dataset.alert);
    if (okRow !== '') throw new Error('edge-ops shown with an alert: ' + okRow);
    const kv = await page.$eval('#nodes tr[data-node="edge-ops"] .kv', (e) => e.textContent);
    if (!/^\d+\/\d+ \(\d+ %\)$/.test(kv)) throw new Error('edge-ops KV use not shown: ' + kv);
    log('KV edge-ops', kv);
    const spec = await page.$eval('#nodes tr[data-node="edge-ops"] .spec', (e) => e.textContent);
    if (!/^\d+(\.\d)? %$/.test(spec)) throw new Error('edge-ops speculation acceptance not shown: ' + spec);
    const kspec = await page.$eval('#k-spec', (e) => e.textContent);
    if (!/\d/.test(kspec)) throw new Error('no fleet speculation acceptance: ' + kspec);
    log('spec accept edge-ops', spec, '; fleet', kspec);
    const edgeState = await page.$eval('#nodes tr[data-node="edge-ops"]', (r) => r.dataset.state);
    if (edgeState !== 'online') throw new Error('edge shown ' + edgeState);
    await checkStaleAndRefused(page, 'first load');
    await page.reload();
    await page.waitForFunction(() => document.getElementById('conn').dataset.state === 'connected', { timeout: T });
    await checkStaleAndRefused(page, 'after a reload');
    await page.screenshot({ path: path.join(out, 'dashboard.png') });
    log('PASS');
  } finally {
    await browser.close();
    fs.rmSync(udd, { recursive: true, force: true });
  }
})().catch((e) => { log('ERROR', e && e.stack || e); process.exit(1); });
