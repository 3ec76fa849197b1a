// The real e2b JS SDK end to end against `osr serve`: the control plane
// (E2B_API_URL) creates a sandbox on the local provider, and every envd call
// (commands, files, pty) and in-sandbox port goes through OSR's data plane
// (E2B_SANDBOX_URL) to osr-agent inside the sandbox. Run by test_e2b_exec.py,
// once per isolation class (OSR_CLASS: the capability floor sent in the
// X-OSR-Capabilities header, then checked on OSR's own API). Every check
// throws on a mismatch; the last line printed on success is E2B-EXEC-OK.
'use strict';
const assert = require('assert');
const http = require('http');
const { Sandbox, CommandExitError } = require('e2b');

const CLASS = process.env.OSR_CLASS;
const API = process.env.E2B_API_URL;
const DP = new URL(process.env.E2B_SANDBOX_URL);
const KEY = process.env.E2B_API_KEY;
const HTTP_PORT = 8123; // the in-sandbox server getHost() reaches

const step = (s) => console.log('step: ' + s);
const sleep = (ms) => new Promise((res) => setTimeout(res, ms));

// One HTTP/1.1 request to the data plane's address with an explicit Host
// header (what wildcard DNS for *.<domain> would give a browser): resolves
// {status, body}.
function dpGet(host, headers) {
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: DP.hostname,
        port: DP.port,
        path: '/',
        method: 'GET',
        headers: Object.assign({ Host: host }, headers),
        agent: false,
        timeout: 20000,
      },
      (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString() }));
        res.on('error', reject);
      },
    );
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
    req.end();
  });
}

// The server inside the sandbox starts in the background: poll (bounded)
// until it answers through the data plane (502 while nothing listens).
async function getHostBody(sbx, token) {
  let last = null;
  for (let i = 0; i < 150; i++) {
    last = await dpGet(sbx.getHost(HTTP_PORT), { 'X-Access-Token': token });
    if (last.status === 200) return last.body;
    assert.strictEqual(last.status, 502, 'while the server starts: ' + JSON.stringify(last));
    await sleep(100);
  }
  throw new Error('the in-sandbox server never answered: ' + JSON.stringify(last));
}

// OSR's own API (same tenant key): the binding says which class it got.
async function osrBinding(id) {
  const r = await fetch(API + '/v1/sandboxes/' + id, { headers: { Authorization: 'Bearer ' + KEY } });
  assert.strictEqual(r.status, 200);
  return (await r.json()).binding;
}

async function commandsAndFiles(sbx) {
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
  for (let i = 0; i < 100 && !bg.stdout.includes('ping'); i++) await sleep(50);
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
}

async function ports(sbx, other) {
  step('getHost: a server inside the sandbox through the data plane');
  await sbx.files.write('/tmp/www/index.html', 'served from ' + sbx.sandboxId + '\n');
  await sbx.commands.run(
    'exec python3 -m http.server ' + HTTP_PORT + ' --bind 127.0.0.1 --directory /tmp/www',
    { background: true },
  );
  const host = sbx.getHost(HTTP_PORT);
  assert.strictEqual(host, HTTP_PORT + '-' + sbx.sandboxId + '.' + process.env.EXPECT_DOMAIN);
  assert.strictEqual(await getHostBody(sbx, sbx.envdAccessToken), 'served from ' + sbx.sandboxId + '\n');

  step('getHost: refused without a token and with another sandbox\'s token');
  const none = await dpGet(host, {});
  assert.strictEqual(none.status, 401, JSON.stringify(none));
  assert.ok(!none.body.includes('served from'));
  const wrong = await dpGet(host, { 'X-Access-Token': other.envdAccessToken });
  assert.strictEqual(wrong.status, 403, JSON.stringify(wrong));
  assert.ok(!wrong.body.includes('served from'));
  const forged = await dpGet(host, { 'X-Access-Token': sbx.envdAccessToken.slice(0, -4) + 'AAAA' });
  assert.strictEqual(forged.status, 401, JSON.stringify(forged));
}

// Output of a PTY session, with a bounded wait for a pattern.
function ptyCollector() {
  const dec = new TextDecoder();
  const c = { text: '' };
  c.onData = (d) => {
    c.text += dec.decode(d, { stream: true });
  };
  c.waitFor = async (re, what) => {
    for (let i = 0; i < 200; i++) {
      const m = c.text.match(re);
      if (m) return m;
      await sleep(50);
    }
    throw new Error('pty: no ' + what + ' in ' + JSON.stringify(c.text.slice(-2000)));
  };
  return c;
}

// A command other than bash on a pty: the same envd Start call that
// sbx.pty.create makes (through the SDK's own client), with another cmd.
// bash -i claims a terminal by itself, so only this shows that the agent
// made the pty the controlling terminal. Resolves {exitCode, text}.
async function ptyRun(sbx, cmd, args) {
  const events = sbx.pty.rpc.start(
    { process: { cmd, args, envs: {} }, pty: { size: { cols: 80, rows: 24 } } },
    { headers: { Authorization: 'Basic ' + Buffer.from('user:').toString('base64') }, timeoutMs: 60000 },
  );
  const dec = new TextDecoder();
  let text = '';
  for await (const ev of events) {
    const e = ev.event && ev.event.event;
    if (e && e.case === 'data' && e.value.output.case === 'pty')
      text += dec.decode(e.value.output.value, { stream: true });
    if (e && e.case === 'end') return { exitCode: e.value.exitCode, text };
  }
  throw new Error('pty process: no end event; output ' + JSON.stringify(text));
}

async function pty(sbx) {
  step('pty: a non-shell command gets the pty as its controlling terminal');
  const fg = await ptyRun(sbx, '/usr/bin/python3', [
    '-c',
    "import os; print('FG=%d PG=%d SID=%d' % (os.tcgetpgrp(0), os.getpgrp(), os.getsid(0)))",
  ]);
  assert.strictEqual(fg.exitCode, 0, JSON.stringify(fg));
  const m = fg.text.match(/FG=(\d+) PG=(\d+) SID=(\d+)/);
  assert.ok(m, JSON.stringify(fg));
  assert.strictEqual(m[1], m[2], 'the foreground group is the command\'s: ' + fg.text);
  assert.strictEqual(m[2], m[3], 'a session leader');
  const missing = await ptyRun(sbx, 'osr-no-such-command', []);
  assert.strictEqual(missing.exitCode, 127, JSON.stringify(missing));
  assert.match(missing.text, /osr-no-such-command/);


  step('pty.create: bash with job control, resize (+ SIGWINCH on container), kill');
  const enc = new TextEncoder();
  const out = ptyCollector();
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: out.onData, timeoutMs: 120000 });
  const send = (s) => sbx.pty.sendInput(term.pid, enc.encode(s));
  // Markers are split with quotes so the echoed command line never matches.
  await send("tty | sed 's/^/TT''Y=/'; stty size | sed 's/^/SI''ZE=/'\n");
  assert.match((await out.waitFor(/TTY=(\S+)/, 'TTY='))[1], /^\/dev\/pts\/\d+$/);
  assert.strictEqual((await out.waitFor(/SIZE=(\d+ \d+)/, 'SIZE='))[1], '24 80');

  // Job control: bash (-i, as the SDK starts it) takes the terminal and puts
  // a background job in a process group of its own; without a controlling
  // terminal it says "no job control in this shell" and runs the job in its
  // own group.
  await send("sleep 30 & echo \"J\"\"OB=$! PG=$(cut -d' ' -f5 /proc/$!/stat)\"; kill %1\n");
  const job = await out.waitFor(/JOB=(\d+) PG=(\d+)/, 'JOB=');
  assert.strictEqual(job[2], job[1], 'the background job leads its own process group: ' + out.text);
  assert.ok(!/no job control/.test(out.text), 'bash says: ' + out.text);

  if (CLASS === 'container') {
    // What the Linux kernel's terminal does for the foreground job and
    // gVisor 2022-12's does not (docs/agent.md): Ctrl-C typed into the
    // terminal interrupts it (ISIG: gVisor echoes ^C as a character), a
    // resize sends it SIGWINCH, and /dev/tty opens (gVisor: EIO).
    await send('sleep 30\n');
    await sleep(300);
    await send('\x03');
    await send("echo 'R''C='$?\n");
    assert.strictEqual((await out.waitFor(/RC=(\d+)/, 'RC='))[1], '130', out.text);
    await send("(: </dev/tty) && echo 'CT''TY=yes' || echo 'CT''TY=no'\n");
    assert.strictEqual((await out.waitFor(/CTTY=(\w+)/, 'CTTY='))[1], 'yes', out.text);
    await send(
      "sh -c 'trap \"stty size | sed s/^/WINCH=/; exit 0\" WINCH; echo WAI''TING; " +
        "i=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; echo NO-WIN\"CH\"'\n",
    );
    await out.waitFor(/WAITING/, 'WAITING');
    await sbx.pty.resize(term.pid, { cols: 100, rows: 30 });
    const winch = await out.waitFor(/WINCH=(\d+ \d+)|NO-WINCH/, 'WINCH=');
    assert.strictEqual(winch[1], '30 100', out.text);
  } else {
    await sbx.pty.resize(term.pid, { cols: 100, rows: 30 });
  }
  await send("stty size | sed 's/^/NEW''SIZE=/'\n");
  assert.strictEqual((await out.waitFor(/NEWSIZE=(\d+ \d+)/, 'NEWSIZE='))[1], '30 100');

  assert.strictEqual(await sbx.pty.kill(term.pid), true);
  let ended = null;
  try {
    await term.wait();
  } catch (e) {
    ended = e; // killed: CommandExitError with the signal
  }
  assert.ok(ended instanceof CommandExitError, 'pty ended by kill: ' + ended);
}

async function pauseResume(sbx) {
  step('pause');
  await sbx.files.write('/tmp/osr-e2e/before-pause.txt', 'kept');
  const pause = sbx.pause ? sbx.pause.bind(sbx) : sbx.betaPause.bind(sbx);
  assert.strictEqual(await pause(), true);
  assert.strictEqual((await sbx.getInfo()).state, 'paused');
  const paused = await Sandbox.list({ query: { state: ['paused'] } }).nextItems();
  assert.deepStrictEqual(paused.map((s) => s.sandboxId), [sbx.sandboxId]);

  step('connect resumes');
  const again = await Sandbox.connect(sbx.sandboxId);
  assert.strictEqual((await again.getInfo()).state, 'running');
  const r = await again.commands.run('cat /tmp/osr-e2e/before-pause.txt; echo " after"');
  assert.strictEqual(r.stdout, 'kept after\n');
  // The server started before the pause still answers.
  assert.strictEqual(await getHostBody(again, again.envdAccessToken),
    'served from ' + sbx.sandboxId + '\n');
  return again;
}

async function main() {
  assert.ok(CLASS === 'container' || CLASS === 'gvisor', 'OSR_CLASS');
  const opts = {
    envs: { OSR_E2E: 'yes' },
    timeoutMs: 300000,
    apiHeaders: { 'X-OSR-Capabilities': JSON.stringify({ isolation: CLASS }) },
  };
  step('create (' + CLASS + ')');
  const sbx = await Sandbox.create('base', opts);
  let other = null;
  try {
    const b = await osrBinding(sbx.sandboxId);
    assert.strictEqual(b.isolation, CLASS, JSON.stringify(b));
    assert.strictEqual(b.provider, 'local');
    await commandsAndFiles(sbx);
    other = await Sandbox.create('base', opts);
    await ports(sbx, other);
    await pty(sbx);
    await pauseResume(sbx);
  } finally {
    step('kill');
    if (other !== null) assert.strictEqual(await other.kill(), true);
    assert.strictEqual(await sbx.kill(), true);
  }
  console.log('E2B-EXEC-OK');
}

main().catch((e) => {
  console.error('FAILED:', e && e.stack ? e.stack : e);
  process.exit(1);
});
