// openai.test.js: integration.http's client half (tests/integration/test_http.c
// starts mosquitto, a dspark-center and a dspark-edge with [http] listen, then
// runs this). The official `openai` npm client (pinned in package-lock.json)
// against the edge's OpenAI-compatible API:
//   models list; chat and completions, non-streamed and streamed (role delta,
//   content deltas, finish_reason chunk, usage chunk, [DONE]), the streamed
//   text equal to the non-streamed one (greedy); unknown fields named in
//   X-Dspark-Ignored-Fields; one error of each status: 400 (n = 2, bad JSON),
//   404 (unknown model), 429 (the client's [sched] client_max), 503 with
//   Retry-After (the edge's queue full, route edge); an abort that frees the
//   slot: the queued request starts within a few steps of the abort, measured
//   against the step time of the same run; route center answered by the
//   dspark-center through the edge over MQTT.
// argv: base URL (http://127.0.0.1:PORT/v1), model name.
// Prints PASS on success; any failure throws (exit 1).
'use strict';
const assert = require('assert');
const OpenAI = require('openai');

const [base, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 60000 });

function log(...a) { process.stdout.write(a.join(' ') + '\n'); }
const now = () => Number(process.hrtime.bigint()) / 1e6;

async function expectStatus(p, status, what) {
  try {
    await p;
  } catch (e) {
    assert.strictEqual(e.status, status, `${what}: status ${e.status}, expected ${status}: ${e.message}`);
    return e;
  }
  throw new Error(`${what}: no error, expected ${status}`);
}

// A stream whose first content delta has come: {stream, ctl, chunks, times}.
async function openStream(params, opts = {}) {
  const ctl = new AbortController();
  const stream = await client.chat.completions.create({ model, stream: true, ...params }, { signal: ctl.signal, ...opts });
  const it = stream[Symbol.asyncIterator]();
  const s = { stream, ctl, it, chunks: [], times: [] };
  for (;;) {
    const r = await it.next();
    assert.ok(!r.done, 'stream ended before its first delta');
    s.chunks.push(r.value);
    s.times.push(now());
    if (r.value.choices[0] && r.value.choices[0].delta.content) return s;
  }
}

async function drain(s) {
  try {
    for (;;) {
      const r = await s.it.next();
      if (r.done) return;
      s.chunks.push(r.value);
      s.times.push(now());
    }
  } catch (e) {
    if (e.name !== 'AbortError' && !/abort/i.test(e.message)) throw e;
  }
}

async function main() {
  // Models.
  const models = await client.models.list();
  const m = models.data.find((x) => x.id === model);
  assert.ok(m, 'model listed: ' + JSON.stringify(models.data));
  assert.strictEqual(m.object, 'model');
  assert.ok(m.dspark && m.dspark.version, 'version listed');
  const one = await client.models.retrieve(model);
  assert.strictEqual(one.id, model);
  log('models ok:', JSON.stringify(m));

  // Chat, non-streamed, with an unknown field named back in a header.
  const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Tell me a story' }];
  const { data: chat, response } = await client.chat.completions
    .create({ model, messages, max_tokens: 24, temperature: 0, logit_bias: { 1: 1 }, frequency_penalty: 0 })
    .withResponse();
  assert.strictEqual(chat.object, 'chat.completion');
  assert.ok(chat.id.startsWith('chatcmpl-'));
  assert.strictEqual(chat.choices.length, 1);
  assert.strictEqual(chat.choices[0].message.role, 'assistant');
  assert.ok(chat.choices[0].message.content.length > 0, 'content');
  assert.ok(['stop', 'length'].includes(chat.choices[0].finish_reason));
  assert.ok(chat.usage.prompt_tokens > 0 && chat.usage.completion_tokens > 0);
  assert.strictEqual(chat.usage.total_tokens, chat.usage.prompt_tokens + chat.usage.completion_tokens);
  assert.strictEqual(chat.dspark.served_by.tier, 'edge');
  assert.strictEqual(response.headers.get('x-dspark-ignored-fields'), 'logit_bias, frequency_penalty');
  log('chat ok:', JSON.stringify(chat.choices[0].message.content));

  // Chat, streamed: role first, deltas, a finish_reason chunk, usage, the same text.
  const st = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0, stream: true,
                                                    stream_options: { include_usage: true } });
  const chunks = [];
  for await (const c of st) chunks.push(c);
  assert.strictEqual(chunks[0].choices[0].delta.role, 'assistant', 'role delta first');
  const fin = chunks.findIndex((c) => c.choices.length && c.choices[0].finish_reason);
  assert.ok(fin > 0, 'a finish_reason chunk');
  assert.strictEqual(chunks[fin].choices[0].finish_reason, chat.choices[0].finish_reason);
  const usage = chunks[chunks.length - 1];
  assert.strictEqual(usage.choices.length, 0, 'usage chunk last, no choices');
  assert.deepStrictEqual(usage.usage, chat.usage);
  const streamed = chunks.map((c) => (c.choices.length && c.choices[0].delta.content) || '').join('');
  assert.strictEqual(streamed, chat.choices[0].message.content, 'streamed text = non-streamed text (greedy)');
  for (const c of chunks) assert.strictEqual(c.object, 'chat.completion.chunk');
  log('chat stream ok:', chunks.length, 'chunks');

  // Completions, both ways.
  const comp = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 16, temperature: 0 });
  assert.strictEqual(comp.object, 'text_completion');
  assert.ok(comp.choices[0].text.length > 0);
  const cst = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 16, temperature: 0,
                                               stream: true });
  let ctext = '';
  let cfin = null;
  for await (const c of cst) {
    if (c.choices.length) ctext += c.choices[0].text;
    if (c.choices.length && c.choices[0].finish_reason) cfin = c.choices[0].finish_reason;
  }
  assert.strictEqual(ctext, comp.choices[0].text);
  assert.strictEqual(cfin, comp.choices[0].finish_reason);
  log('completions ok:', JSON.stringify(comp.choices[0].text));

  // 400: n = 2, and a body that is not JSON.
  let e = await expectStatus(client.chat.completions.create({ model, messages, n: 2 }), 400, 'n = 2');
  assert.strictEqual(e.error.param, 'n');
  assert.strictEqual(e.error.type, 'invalid_request_error');
  const bad = await fetch(base + '/chat/completions', { method: 'POST', body: '{"model": ', headers: { 'content-type': 'application/json' } });
  assert.strictEqual(bad.status, 400);
  assert.ok((await bad.json()).error.message.length > 0);
  e = await expectStatus(client.chat.completions.create({ model, messages, temperature: 7 }), 400, 'temperature 7');
  assert.strictEqual(e.error.param, 'temperature');
  // 404: a model not served here.
  e = await expectStatus(client.chat.completions.create({ model: 'no-such-model', messages }), 404, 'unknown model');
  assert.strictEqual(e.error.code, 'model_not_found');
  log('400, 404 ok');

  // 429: user "q" holds [sched] client_max = 2 requests (high: both slots run
  // them); its third is refused.
  const slow = { messages, max_tokens: 200, temperature: 0 };
  const q1 = await openStream({ ...slow, user: 'q', dspark: { route: 'edge', priority: 'high' } });
  const q2 = await openStream({ ...slow, user: 'q', dspark: { route: 'edge', priority: 'high' } });
  e = await expectStatus(client.chat.completions.create({ model, messages, max_tokens: 2, user: 'q' }), 429, 'over quota');
  assert.strictEqual(e.error.code, 'rate_limit_exceeded');
  q1.ctl.abort();
  q2.ctl.abort();
  await Promise.all([drain(q1), drain(q2)]);
  log('429 ok');

  // Abort frees the slot. Normal requests have one slot here ([batch]
  // max_active 2, reserve_high 1): A runs, B waits for it; A's abort must let
  // B start within a few steps, not after A's 200 tokens.
  const a = await openStream({ ...slow, user: 'a', dspark: { route: 'edge' } });
  for (let i = 0; i < 6; i++) {
    const r = await a.it.next();
    a.chunks.push(r.value);
    a.times.push(now());
  }
  const step = (a.times[a.times.length - 1] - a.times[1]) / (a.times.length - 2);
  const bStream = client.chat.completions.create({ model, stream: true, ...slow, max_tokens: 8, user: 'b',
                                                   dspark: { route: 'edge' } }).catch((err) => err);
  // The stream's headers wait for B's first token: B is queued behind A until the abort.
  await new Promise((r) => setTimeout(r, Math.max(10 * step, 200)));
  const t0 = now();
  a.ctl.abort();
  await drain(a);
  const bStart = await (async () => {
    const s = await bStream;
    if (s instanceof Error) throw s;
    for await (const c of s) if (c.choices.length && c.choices[0].delta.content) return now();
    throw new Error('B had no content');
  })();
  const waited = bStart - t0;
  log(`abort: step ${step.toFixed(1)} ms, B started ${waited.toFixed(1)} ms after A's abort ` +
      `(A had ${200 - a.chunks.length} tokens left, ${((200 - a.chunks.length) * step).toFixed(0)} ms)`);
  assert.ok(step > 5, 'the step ([model] delay) is measurable');
  assert.ok(waited < 4 * step + 150, `B waited ${waited} ms after the abort, more than ~4 steps of ${step} ms`);
  assert.ok(waited < (200 - a.chunks.length) * step / 4, 'B did not wait for A to end');

  // 503 with Retry-After: the edge's normal queue (2) full behind its one
  // slot, route edge (no center takes it).
  const held = [];
  for (let i = 0; i < 1; i++) held.push(await openStream({ ...slow, user: 'h' + i, dspark: { route: 'edge' } }));
  const queued = [];
  for (let i = 0; i < 2; i++) {
    const ctl = new AbortController();
    queued.push({ ctl, p: client.chat.completions.create({ model, stream: true, ...slow, user: 'w' + i,
                                                           dspark: { route: 'edge' } }, { signal: ctl.signal })
      .catch((err) => err) });
  }
  // Wait until both are queued: /metrics says so.
  for (let i = 0; ; i++) {
    const txt = await (await fetch(base.replace(/\/v1$/, '') + '/metrics')).text();
    if (/dspark_queue_depth\{tier="normal"\} 2\b/.test(txt)) break;
    if (i > 500) throw new Error('the two requests were not queued: ' + txt.match(/dspark_queue_depth.*/g));
    await new Promise((r) => setTimeout(r, 10));
  }
  const over = await fetch(base + '/chat/completions', { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages, max_tokens: 2, user: 'x', dspark: { route: 'edge' } }) });
  assert.strictEqual(over.status, 503);
  assert.strictEqual(over.headers.get('retry-after'), '1');
  const ob = await over.json();
  assert.strictEqual(ob.error.code, 'overloaded');
  log('503 ok:', ob.error.message);
  for (const h of held) h.ctl.abort();
  for (const q of queued) q.ctl.abort();
  await Promise.all(held.map(drain));
  await Promise.all(queued.map((q) => q.p));

  // route center: served by the dspark-center, through the edge over MQTT.
  const cc = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0,
                                                    dspark: { route: 'center', priority: 'high' } });
  assert.strictEqual(cc.dspark.served_by.tier, 'center', JSON.stringify(cc.dspark));
  assert.ok(cc.choices[0].message.content.length > 0);
  const ccs = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0, stream: true,
                                                     dspark: { route: 'center' } });
  let cct = '';
  for await (const c of ccs) if (c.choices.length && c.choices[0].delta.content) cct += c.choices[0].delta.content;
  assert.strictEqual(cct, cc.choices[0].message.content, 'the center streams the same text');
  log('route center ok:', JSON.stringify(cc.dspark.served_by), JSON.stringify(cct));
  log('PASS');
}

main().catch((err) => {
  process.stderr.write('FAIL: ' + (err && err.stack ? err.stack : err) + '\n');
  process.exit(1);
});
