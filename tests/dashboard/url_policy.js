#!/usr/bin/env node
/*
 * url_policy.js — dashboard.url_policy: which broker URLs the dashboard
 * (deploy/dashboard/app.js) connects to, run in node without a browser
 * (issue N4). Plain ws:// only to this machine unless "plain ws://" is ticked;
 * wss:// anywhere; credentials never in a URL; the default broker of a page
 * served from another host is wss://HOST:9443.
 * usage: node url_policy.js SOURCE_DIR
 */
'use strict';
const path = require('path');
const app = require(path.resolve(process.argv[2] || '.', 'deploy/dashboard/app.js'));

let failed = 0;
function check(ok, what) {
  console.log((ok ? 'ok   ' : 'FAIL ') + what);
  if (!ok) failed++;
}

const cases = [
  // url, allowPlain, refused?, text the refusal names
  ['ws://127.0.0.1:9001', false, false],
  ['ws://localhost:9001', false, false],
  ['ws://[::1]:9001', false, false],
  ['ws://127.0.0.2:9001/mqtt', false, false],
  ['wss://box.example.net:9443', false, false],
  ['wss://10.1.2.3:9443', false, false],
  ['ws://10.1.2.3:9001', false, true, 'clear text'],
  ['ws://box.example.net:9001', false, true, 'wss://box.example.net:9443'],
  ['ws://127.0.0.1.evil.example:9001', false, true, 'clear text'],
  ['ws://10.1.2.3:9001', true, false],
  ['wss://ops:secret@box.example.net:9443', false, true, 'credentials'],
  ['ws://ops:secret@127.0.0.1:9001', true, true, 'credentials'],
  ['mqtt://box.example.net:1883', true, true, 'wss://'],
  ['http://box.example.net:9001', true, true, 'wss://'],
  ['not a url', true, true, 'not a URL'],
];
for (const [url, allow, refused, text] of cases) {
  const why = app.brokerProblem(url, allow);
  check(refused ? why !== '' && why.includes(text) : why === '',
        `${url}${allow ? ' (plain ws:// ticked)' : ''}: ${why || 'connects'}`);
}
check(app.defaultBroker('http:', 'box.example.net') === 'wss://box.example.net:9443', 'served from box: wss://box:9443');
check(app.defaultBroker('https:', '10.1.2.3') === 'wss://10.1.2.3:9443', 'served from 10.1.2.3: wss');
check(app.defaultBroker('http:', '127.0.0.1') === 'ws://127.0.0.1:9001', 'served from loopback: the lab ws://');
check(app.defaultBroker('file:', '') === 'ws://127.0.0.1:9001', 'opened from disk: the lab ws://');
// The page never reads credentials from its URL (app.js main()).
const src = require('fs').readFileSync(path.resolve(process.argv[2] || '.', 'deploy/dashboard/app.js'), 'utf8');
check(!/p\.get\('(password|user)'\)/.test(src), 'app.js reads no user or password from the URL');
console.log(`${failed} failure(s)`);
process.exit(failed ? 1 : 0);
