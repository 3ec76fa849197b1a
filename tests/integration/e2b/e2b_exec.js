// The real e2b JS SDK end to end against `osr serve`: the control plane
// (E2B_API_URL) creates a sandbox on the local provider, and every envd call
// (commands, files) goes through OSR's data plane (E2B_SANDBOX_URL) to
// osr-agent inside the sandbox. Run by test_e2b_exec.py; every check throws
// on a mismatch; the last line printed on success is E2B-EXEC-OK.
'use strict';
const assert = require('assert');
const { Sandbox, CommandExitError } = require('e2b');

const step = (s) => console.log('step: ' + s);

async function main() {
  step('create');
  const sbx = await Sandbox.create('base', { envs: { OSR_E2E: 'yes' }, timeoutMs: 300000 });
  try {
    step('run with callbacks');
    const out = [];
    const err = [];
    const r = await sbx.commands.run('echo hi; echo oops 1>&2; echo $OSR_E2E', {
      onStdout: (d) => out.push(d),
      onStderr: (d) => err.push(d),
    });
    assert.strictEqual(r.exitCode, 0);
    assert.strictEqual(r.stdout, 'hi\nyes\n');
    assert.strictEqual(r.stderr, 'oops\n');
    assert.strictEqual(out.join(''), 'hi\nyes\n');
    assert.strictEqual(err.join(''), 'oops\n');

    step('failing command');
    let failed = null;
    try {
      await sbx.commands.run('echo bad; exit 7');
    } catch (e) {
      failed = e;
    }
    assert.ok(failed instanceof CommandExitError, 'expected CommandExitError, got ' + failed);
    assert.strictEqual(failed.exitCode, 7);
    assert.strictEqual(failed.stdout, 'bad\n');

    step('background + stdin + kill');
    const bg = await sbx.commands.run('cat', { background: true, stdin: true });
    await sbx.commands.sendStdin(bg.pid, 'ping\n');
    for (let i = 0; i < 100 && !bg.stdout.includes('ping'); i++)
      await new Promise((res) => setTimeout(res, 50));
    assert.strictEqual(bg.stdout, 'ping\n');
    assert.strictEqual(await sbx.commands.kill(bg.pid), true);

    step('files');
    await sbx.files.makeDir('/tmp/osr-e2e');
    await sbx.files.write('/tmp/osr-e2e/a.txt', 'hello file');
    assert.strictEqual(await sbx.files.read('/tmp/osr-e2e/a.txt'), 'hello file');
    assert.strictEqual(await sbx.files.exists('/tmp/osr-e2e/a.txt'), true);
    const names = (await sbx.files.list('/tmp/osr-e2e')).map((e) => e.name);
    assert.deepStrictEqual(names, ['a.txt']);
    await sbx.files.remove('/tmp/osr-e2e/a.txt');
    assert.strictEqual(await sbx.files.exists('/tmp/osr-e2e/a.txt'), false);
  } finally {
    step('kill');
    assert.strictEqual(await sbx.kill(), true);
  }
  console.log('E2B-EXEC-OK');
}

main().catch((e) => {
  console.error('FAILED:', e && e.stack ? e.stack : e);
  process.exit(1);
});
