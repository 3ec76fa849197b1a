// A Kubernetes channel-protocol exec client on npm ws, for test_exec.py.
// argv[2] is a JSON object:
//   url            ws://.../exec?...
//   protocols      offered subprotocols (default v5 then v4)
//   headers        extra request headers (Authorization...)
//   stdin          base64 bytes to send on channel 0 (in 64 KiB messages)
//   stdinFile      or a file to send
//   closeStdin     v5: send [255, 0] after stdin
//   resize         [{Width, Height}] sent on channel 4 before stdin
//   pauseMs        stop reading the socket for this long after the first
//                  output message (slow reader), printing "paused" / "resumed"
//   stopAfter      close the WebSocket once this many output bytes arrived
//   outFile        write channel 1 bytes here
// Prints one JSON line: {protocol, status, stdoutLen, stdoutSha256,
// stdoutText (first 4 KiB), stderrText, info, closeCode, httpStatus, order}.
import { createRequire } from 'node:module';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';

const nm = process.env.OSR_NODE_MODULES;
const require = createRequire(path.join(nm, 'x.js'));
const WebSocket = require('ws');

const o = JSON.parse(process.argv[2]);
const protocols = o.protocols || ['v5.channel.k8s.io', 'v4.channel.k8s.io'];
const ws = new WebSocket(o.url, protocols, { headers: o.headers || {}, maxPayload: 64 << 20 });
const hash = crypto.createHash('sha256');
const res = { protocol: null, status: null, stdoutLen: 0, stderrText: '', info: null,
              closeCode: null, httpStatus: null, order: [] };
let head = Buffer.alloc(0);
let out = o.outFile ? fs.openSync(o.outFile, 'w') : null;
let paused = false;
let stopped = false;

function finish() {
  res.stdoutSha256 = hash.digest('hex');
  res.stdoutText = head.toString('latin1');
  if (out !== null) fs.closeSync(out);
  console.log(JSON.stringify(res));
  process.exit(0);
}

ws.on('unexpected-response', (req, r) => {
  res.httpStatus = r.statusCode;
  let body = '';
  r.on('data', (d) => { body += d; });
  r.on('end', () => { res.body = body; finish(); });
});
ws.on('error', (err) => { if (res.httpStatus === null) { res.error = err.message; finish(); } });
ws.on('open', () => {
  res.protocol = ws.protocol;
  for (const r of o.resize || []) ws.send(Buffer.concat([Buffer.from([4]), Buffer.from(JSON.stringify(r))]));
  let data = null;
  if (o.stdin) data = Buffer.from(o.stdin, 'base64');
  if (o.stdinFile) data = fs.readFileSync(o.stdinFile);
  if (data !== null) {
    for (let i = 0; i < data.length; i += 65536) {
      ws.send(Buffer.concat([Buffer.from([0]), data.subarray(i, i + 65536)]));
    }
  }
  if (o.closeStdin) ws.send(Buffer.from([255, 0]));
});
ws.on('message', (m, isBinary) => {
  if (!isBinary) {
    res.info = JSON.parse(m.toString());
    res.order.push('info');
    console.log('info ' + JSON.stringify(res.info)); // for tests waiting on the start
    return;
  }
  const ch = m[0];
  const p = m.subarray(1);
  if (res.order.length === 0 || res.order[res.order.length - 1] !== ch) res.order.push(ch);
  if (ch === 1) {
    res.stdoutLen += p.length;
    hash.update(p);
    if (head.length < 4096) head = Buffer.concat([head, p.subarray(0, 4096 - head.length)]);
    if (out !== null) fs.writeSync(out, p);
    if (o.pauseMs && !paused) {
      paused = true;
      ws._socket.pause();
      console.error('paused');
      setTimeout(() => { ws._socket.resume(); console.error('resumed'); }, o.pauseMs);
    }
    if (o.stopAfter && res.stdoutLen >= o.stopAfter && !stopped) { stopped = true; ws.close(); }
  } else if (ch === 2) {
    res.stderrText += p.toString('latin1');
  } else if (ch === 3) {
    res.status = JSON.parse(p.toString());
  } else {
    res.unexpected = ch;
  }
});
ws.on('close', (code) => { res.closeCode = code; finish(); });
setTimeout(() => { res.error = 'timeout'; finish(); }, (o.timeoutMs || 120000)).unref();
