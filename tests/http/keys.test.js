// keys.test.js: integration.http_sec's third-party client half
// (tests/integration/http_malformed.py starts mosquitto and a dspark-edge with
// [http] keys_file, cert_file and key_file, then runs this with
// NODE_EXTRA_CA_CERTS naming the throwaway certificate). The official `openai`
// npm client (pinned in package-lock.json) over HTTPS:
//   a wrong apiKey is AuthenticationError (401); the good key lists models,
//   completes non-streamed and streamed (to [DONE]); past the key's quota the
//   next request is RateLimitError (429) with a Retry-After header.
// argv: base URL (https://localhost:PORT/v1), model name, the good key, its
// quota per minute. Prints PASS on success; any failure throws (exit 1).
'use strict';
const assert = require('assert');
const OpenAI = require('openai');

const [base, model, key, quotaText] = process.argv.slice(2);
const quota = Number(quotaText);
const mk = (apiKey) => new OpenAI({ baseURL: base, apiKey, maxRetries: 0, timeout: 30000 });

async function expectStatus(p, status, what) {
  try {
    await p;
  } catch (e) {
    assert.strictEqual(e.status, status, `${what}: status ${e.status}, expected ${status}: ${e.message}`);
    return e;
  }
  throw new Error(`${what}: no error, expected ${status}`);
}

(async () => {
  const params = { model, prompt: 'The dog', max_tokens: 2, temperature: 0 };
  const bad = await expectStatus(mk('dsk-not-a-key-00000000000000').completions.create(params), 401, 'a wrong key');
  assert.ok(bad instanceof OpenAI.AuthenticationError, 'a wrong key: AuthenticationError');
  const good = mk(key);
  let used = 0;
  const models = await good.models.list();
  used++;
  assert.ok(models.data.some((m) => m.id === model), `models list names ${model}`);
  const r = await good.completions.create(params);
  used++;
  assert.strictEqual(r.choices.length, 1);
  assert.ok(typeof r.choices[0].text === 'string' && r.choices[0].text.length > 0, 'a completion text');
  const stream = await good.completions.create({ ...params, stream: true });
  let chunks = 0;
  for await (const c of stream) chunks += c.choices.length ? 1 : 0;
  used++;
  assert.ok(chunks >= 1, 'streamed chunks over TLS');
  while (used < quota) {
    await good.completions.create(params);
    used++;
  }
  const over = await expectStatus(good.completions.create(params), 429, 'past the quota');
  assert.ok(over instanceof OpenAI.RateLimitError, 'past the quota: RateLimitError');
  assert.ok(Number(over.headers.get ? over.headers.get('retry-after') : over.headers['retry-after']) >= 1,
            'Retry-After on 429');
  process.stdout.write('PASS\n');
})().catch((e) => { process.stderr.write(`FAIL: ${e.stack || e}\n`); process.exit(1); });
