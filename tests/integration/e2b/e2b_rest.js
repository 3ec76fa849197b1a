// The real e2b JS SDK against OSR's E2B front door (control plane only).
// Run by test_e2b.py with E2B_API_URL / E2B_API_KEY set; OSR_E2B_MODULE
// names the SDK package ("e2b" = 2.51.0, "e2b-2_7" = 2.7.0, which creates
// through POST /sandboxes). Every check throws on a mismatch; the last line
// printed on success is E2B-REST-OK.
'use strict';
const assert = require('assert');
const mod = process.env.OSR_E2B_MODULE || 'e2b';
const { Sandbox } = require(mod);

const tag = 'probe-' + process.pid + '-' + Date.now();
const step = (s) => console.log('step: ' + s);

async function expectReject(p, pred, what) {
  let err = null;
  try {
    await p;
  } catch (e) {
    err = e;
  }
  assert.ok(err, what + ': expected an error, got success');
  assert.ok(pred(err), what + ': unexpected error ' + (err && err.name) + ': ' + (err && err.message));
}

const isNotFound = (e) => /NotFound/.test(e.name) || /NotFound/.test(e.constructor.name);

async function main() {
  step('create');
  // Keys and values with characters the list filter's encoding must survive.
  const odd = { 'a b&c': 'd=e f%20+g' };
  const a = await Sandbox.create('base', { metadata: { probe: tag, n: '1', ...odd }, envs: { A: '1' }, timeoutMs: 120000 });
  assert.match(a.sandboxId, /^[a-z0-9]{20}$/);
  const b = await Sandbox.create({ metadata: { probe: tag, n: '2' } });
  assert.notStrictEqual(a.sandboxId, b.sandboxId);
  const other = await Sandbox.create({ metadata: { probe: 'other-' + tag } });

  step('getInfo');
  const info = await Sandbox.getInfo(a.sandboxId);
  assert.strictEqual(info.sandboxId, a.sandboxId);
  assert.strictEqual(info.templateId, 'base');
  assert.strictEqual(info.state, 'running');
  assert.deepStrictEqual(info.metadata, { probe: tag, n: '1', ...odd });
  const life = info.endAt.getTime() - info.startedAt.getTime();
  assert.ok(life > 100000 && life <= 125000, 'lifetime from timeoutMs 120000: ' + life);

  step('list with a metadata filter, one per page');
  const pager = Sandbox.list({ query: { metadata: { probe: tag } }, limit: 1 });
  const seen = [];
  for (let i = 0; i < 10 && pager.hasNext; i++) {
    const items = await pager.nextItems();
    assert.ok(items.length <= 1, 'limit 1 gave ' + items.length);
    for (const it of items) {
      assert.strictEqual(it.metadata.probe, tag);
      assert.strictEqual(it.state, 'running');
      seen.push(it.sandboxId);
    }
  }
  assert.strictEqual(pager.hasNext, false);
  assert.deepStrictEqual(seen.slice().sort(), [a.sandboxId, b.sandboxId].sort());
  const withOdd = await Sandbox.list({ query: { metadata: { probe: tag, ...odd } } }).nextItems();
  assert.deepStrictEqual(withOdd.map((x) => x.sandboxId), [a.sandboxId]);
  const all = await Sandbox.list({ query: { metadata: { probe: 'other-' + tag } } }).nextItems();
  assert.deepStrictEqual(all.map((x) => x.sandboxId), [other.sandboxId]);

  step('setTimeout');
  await Sandbox.setTimeout(a.sandboxId, 30000);
  const info2 = await Sandbox.getInfo(a.sandboxId);
  const left = info2.endAt.getTime() - Date.now();
  assert.ok(left > 0 && left <= 31000, 'setTimeout(30000) left ' + left + ' ms');

  step('connect');
  const c = await Sandbox.connect(a.sandboxId, { timeoutMs: 90000 });
  assert.strictEqual(c.sandboxId, a.sandboxId);
  const info3 = await Sandbox.getInfo(a.sandboxId);
  assert.ok(info3.endAt.getTime() - Date.now() > 60000, 'connect extends the lifetime');

  step('kill');
  assert.strictEqual(await Sandbox.kill(a.sandboxId), true);
  assert.strictEqual(await Sandbox.kill(a.sandboxId), false);
  assert.strictEqual(await Sandbox.kill('aaaaaaaaaaaaaaaaaaaa'), false);
  assert.strictEqual(await Sandbox.kill('no-such-sandbox'), false);
  await b.kill(); // the instance method returns void in 2.7 and true in 2.51
  assert.strictEqual(await Sandbox.kill(b.sandboxId), false);
  assert.strictEqual(await Sandbox.kill(other.sandboxId), true);
  const left2 = await Sandbox.list({ query: { metadata: { probe: tag } } }).nextItems();
  assert.deepStrictEqual(left2, []);

  step('not found');
  await expectReject(Sandbox.getInfo(a.sandboxId), isNotFound, 'getInfo of a killed sandbox');
  await expectReject(Sandbox.setTimeout(a.sandboxId, 10000), isNotFound, 'setTimeout of a killed sandbox');
  await expectReject(Sandbox.connect(a.sandboxId), isNotFound, 'connect to a killed sandbox');
  await expectReject(Sandbox.getInfo('bbbbbbbbbbbbbbbbbbbb'), isNotFound, 'getInfo of an unknown sandbox');

  step('wrong API key');
  const bad = { apiKey: 'e2b_' + '0'.repeat(40) };
  await expectReject(Sandbox.create(bad), (e) => e.name === 'AuthenticationError', 'create with a wrong key');
  await expectReject(Sandbox.list(bad).nextItems(), (e) => e.name === 'AuthenticationError', 'list with a wrong key');
  console.log('E2B-REST-OK ' + mod);
}

main().catch((e) => {
  console.error('FAILED:', e && e.stack ? e.stack : e);
  process.exit(1);
});
