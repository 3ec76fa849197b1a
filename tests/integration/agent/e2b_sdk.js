// Drives osr-agent with the real e2b JS SDK (tests/package.json pins it).
// The control plane it talks to is a FAKE (test_e2b_sdk.py): it only hands
// out a sandbox record pointing the SDK's envd traffic at osr-agent.
// Any misbehaving call throws, and the process exits non-zero.
'use strict';
const assert = require('assert');
const { Sandbox, CommandExitError } = require('e2b');

const DIR = process.env.OSR_SDK_DIR;

async function main() {
  const sbx = await Sandbox.create('base');
  assert.ok(sbx.sandboxId, 'sandbox id');

  // Foreground command with streaming callbacks.
  let out = '', err = '';
  const r = await sbx.commands.run('echo hello; echo oops >&2; printf "%s" "$FOO"', {
    onStdout: (d) => { out += d; },
    onStderr: (d) => { err += d; },
    envs: { FOO: 'bar' },
    cwd: DIR,
  });
  assert.strictEqual(r.exitCode, 0);
  assert.strictEqual(r.stdout, 'hello\nbar');
  assert.strictEqual(out, 'hello\nbar');
  assert.strictEqual(err, 'oops\n');
  assert.strictEqual(r.stderr, 'oops\n');

  // A failing command: CommandExitError with the exit code.
  let threw = null;
  try {
    await sbx.commands.run('echo bad >&2; exit 3');
  } catch (e) {
    threw = e;
  }
  assert.ok(threw instanceof CommandExitError, 'CommandExitError, got ' + threw);
  assert.strictEqual(threw.exitCode, 3);
  assert.strictEqual(threw.stderr, 'bad\n');

  // Background command + kill.
  const h = await sbx.commands.run('sleep 100', { background: true });
  assert.ok(h.pid > 0, 'background pid');
  const listed = await sbx.commands.list();
  assert.ok(listed.some((p) => p.pid === h.pid), 'list shows the background process');
  assert.strictEqual(await h.kill(), true);
  let killedErr = null;
  try {
    await h.wait();
  } catch (e) {
    killedErr = e;
  }
  assert.ok(killedErr instanceof CommandExitError, 'killed command ends with CommandExitError');
  assert.strictEqual(killedErr.exitCode, -1);
  assert.strictEqual(await sbx.commands.kill(h.pid), false, 'kill of a gone pid is false');

  // stdin: sendStdin + closeStdin.
  const c = await sbx.commands.run('cat', { background: true, stdin: true });
  await sbx.commands.sendStdin(c.pid, 'abc\n');
  await sbx.commands.sendStdin(c.pid, 'def\n');
  await sbx.commands.closeStdin(c.pid);
  const cr = await c.wait();
  assert.strictEqual(cr.stdout, 'abc\ndef\n');

  // Files.
  const f = DIR + '/sub dir/ü file.txt';
  const info = await sbx.files.write(f, 'file data ✓');
  assert.strictEqual(info.path, f);
  assert.strictEqual(await sbx.files.read(f), 'file data ✓');
  const bin = new Uint8Array(256).map((_, i) => i);
  await sbx.files.write(DIR + '/bin.dat', bin.buffer);
  const back = await sbx.files.read(DIR + '/bin.dat', { format: 'bytes' });
  assert.deepStrictEqual(Array.from(back), Array.from(bin));
  const entries = await sbx.files.list(DIR + '/sub dir');
  assert.deepStrictEqual(entries.map((e) => e.name), ['ü file.txt']);
  assert.strictEqual(entries[0].type, 'file');
  assert.strictEqual(await sbx.files.exists(f), true);
  assert.strictEqual(await sbx.files.exists(DIR + '/nope'), false);
  assert.strictEqual(await sbx.files.makeDir(DIR + '/newdir/x'), true);
  assert.strictEqual(await sbx.files.makeDir(DIR + '/newdir/x'), false);
  const dinfo = await sbx.files.getInfo(DIR + '/newdir');
  assert.strictEqual(dinfo.type, 'dir');
  await sbx.files.rename(DIR + '/bin.dat', DIR + '/newdir/moved.dat');
  assert.strictEqual(await sbx.files.exists(DIR + '/newdir/moved.dat'), true);
  await sbx.files.remove(DIR + '/newdir');
  assert.strictEqual(await sbx.files.exists(DIR + '/newdir'), false);
  let nf = null;
  try {
    await sbx.files.read(DIR + '/missing.txt');
  } catch (e) {
    nf = e;
  }
  assert.ok(nf && nf.name === 'FileNotFoundError', 'FileNotFoundError, got ' + nf);

  await sbx.kill();
  console.log('SDK-OK');
}

main().catch((e) => {
  console.error('SDK-FAIL', e && e.stack ? e.stack : e);
  process.exit(1);
});
