// structured.test.js: integration.grammar's HTTP half (tests/integration/
// test_grammar.c starts mosquitto, a dspark-center and a dspark-edge serving
// the trained t3M with [http] listen, writes schema0.json .. schema9.json into
// DIR, then runs this). The official `openai` npm client (pinned in
// package-lock.json) asks the edge's /v1/completions for N answers under
// response_format json_schema, greedy and sampled, every third one streamed,
// ten at a time; each answer is written to DIR/http<i>.json and printed as
// "LIST <schema index> <file>" for the caller to validate with
// python3-jsonschema. An unsupported keyword must be a 400 naming it.
// argv: base URL (http://127.0.0.1:PORT/v1), model name, DIR, N.
// Prints PASS on success; any failure throws (exit 1).
'use strict';
const assert = require('assert');
const fs = require('fs');
const path = require('path');
const OpenAI = require('openai');

const [base, model, dir, nArg] = process.argv.slice(2);
const n = Number(nArg);
const client = new OpenAI({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
const prompts = ['Once upon a time', 'The cat', 'Lily wanted to', 'One day, a big', 'Tom and Sue'];
const schemas = [...Array(10).keys()].map((k) => JSON.parse(fs.readFileSync(path.join(dir, `schema${k}.json`))));

function params(i) {
  const k = i % 10, round = Math.floor(i / 10);
  const temperature = round % 2 ? (round % 4 === 1 ? 0.8 : 1.5) : 0;
  return {
    model,
    prompt: prompts[(k + round) % prompts.length],
    max_tokens: 200,
    temperature,
    ...(temperature > 0 ? { top_p: 0.95 } : {}),
    seed: 2000 + i,
    response_format: { type: 'json_schema', json_schema: { name: `s${k}`, schema: schemas[k] } },
    dspark: { route: 'edge' },
  };
}

async function answer(i) {
  if (i % 3 !== 0) {
    const r = await client.completions.create(params(i));
    assert.strictEqual(r.choices[0].finish_reason, 'stop', `answer ${i}: finish_reason ${r.choices[0].finish_reason}`);
    return r.choices[0].text;
  }
  const stream = await client.completions.create({ ...params(i), stream: true });
  let text = '', finish = null;
  for await (const c of stream) {
    if (!c.choices[0]) continue;
    text += c.choices[0].text || '';
    if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
  }
  assert.strictEqual(finish, 'stop', `streamed answer ${i}: finish_reason ${finish}`);
  return text;
}

async function main() {
  for (let w = 0; w < n; w += 10) {
    const ids = [...Array(Math.min(10, n - w)).keys()].map((j) => w + j);
    const texts = await Promise.all(ids.map(answer));
    ids.forEach((i, j) => {
      const file = path.join(dir, `http${i}.json`);
      fs.writeFileSync(file, texts[j]);
      if (i < 10) process.stdout.write(`http schema ${i % 10}: ${texts[j]}\n`);
      process.stdout.write(`LIST\t${i % 10}\t${file}\n`);
    });
  }
  // An unsupported keyword: refused by name, before any compute.
  const bad = { type: 'object', properties: { x: { oneOf: [{ type: 'integer' }, { type: 'null' }] } } };
  try {
    await client.completions.create({ ...params(0), response_format: { type: 'json_schema', json_schema: { name: 'bad', schema: bad } } });
    throw new Error('oneOf: no error, expected 400');
  } catch (e) {
    assert.strictEqual(e.status, 400, `oneOf: status ${e.status}: ${e.message}`);
    assert.ok(/unsupported keyword 'oneOf' at \/properties\/x/.test(e.message), `oneOf: ${e.message}`);
    process.stdout.write(`http refused: ${e.message}\n`);
  }
  process.stdout.write('PASS\n');
}

main().catch((e) => {
  process.stderr.write(`structured.test.js: ${e.stack || e}\n`);
  process.exit(1);
});
