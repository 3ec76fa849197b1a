// The real e2b JS SDK against an OUTER `osr serve` whose only provider is
// the e2b adapter, pointed at a FAKE E2B (a second `osr serve` playing E2B
// with its E2B front door, and a TLS data plane as E2B's envd domain). The
// SDK talks only to the outer gateway (E2B_API_URL) and the outer data plane
// (E2B_SANDBOX_URL) with the outer's token; the outer data plane passes the
// envd traffic to the fake with the fake's own envdAccessToken. Run by
// test_e2b_provider.py; every check throws on a mismatch and the last line
// printed on success is "E2B-PROVIDER-OK <sandboxId>".
'use strict';
const assert = require('assert');
const { Sandbox, CommandExitError } = require('e2b');

const step = (s) => console.log('step: ' + s);

async function main() {
  step('create');
  const sbx = await Sandbox.create({ metadata: { suite: 'e2b-provider' }, timeoutMs: 240000 });
  console.log('SANDBOX ' + sbx.sandboxId);

  step('commands.run');
  const out = [];
  const r = await sbx.commands.run('echo hello-from-$((40+2)); echo oops >&2', {
    onStdout: (d) => out.push(d),
  });
  assert.strictEqual(r.exitCode, 0);
  assert.strictEqual(r.stdout, 'hello-from-42\n');
  assert.strictEqual(r.stderr, 'oops\n');
  assert.strictEqual(out.join(''), 'hello-from-42\n');

  step('failing command');
  let failed = null;
  try {
    await sbx.commands.run('exit 7');
  } catch (e) {
    failed = e;
  }
  assert.ok(failed instanceof CommandExitError, String(failed));
  assert.strictEqual(failed.exitCode, 7);

  step('files');
  const path = '/tmp/osr-e2b-provider.txt';
  const body = 'through two OSRs\n'.repeat(1000);
  await sbx.files.write(path, body);
  assert.strictEqual(await sbx.files.read(path), body);
  assert.strictEqual(await sbx.files.exists(path), true);
  const cat = await sbx.commands.run('wc -c < ' + path);
  assert.strictEqual(cat.stdout.trim(), String(body.length));
  await sbx.files.write('/tmp/from-sdk.txt', 'written by the sdk');
  console.log('FILE-WRITTEN /tmp/from-sdk.txt');

  step('getInfo');
  const info = await sbx.getInfo();
  assert.strictEqual(info.sandboxId, sbx.sandboxId);
  assert.strictEqual(info.metadata.suite, 'e2b-provider');

  step('isRunning');
  assert.strictEqual(await sbx.isRunning(), true);
  console.log('E2B-PROVIDER-OK ' + sbx.sandboxId);
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : e);
  process.exit(1);
});
