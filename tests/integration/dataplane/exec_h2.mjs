// The data plane's HTTP exec stream (POST .../exec, docs/dataplane.md "Exec
// streams") from node's own clients: node:http2 (h2c) or node:http
// (HTTP/1.1, chunked request body). argv[2] is JSON:
//   port, path (with query), token, proto ('h2' | 'h1')
//   stdinFile     bytes to send on channel 0 (in 64 KiB frames)
//   resize        [{Width, Height}] sent first (channel 4)
//   endBody       end the request body after stdin (closes stdin); else the
//                 body stays open until the status arrives
//   closeFrame    send a [255, 0] close frame instead of ending the body
//   pauseMs       stop reading the response for this long after the first
//                 output frame (slow reader), printing "paused" / "resumed"
// Prints one JSON line {httpStatus, contentType, stdoutLen, stdoutSha256,
// stdoutText, stderrText, status, info, order}.
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import http2 from 'node:http2';

const o = JSON.parse(process.argv[2]);
const res = { httpStatus: null, contentType: null, stdoutLen: 0, stderrText: '', status: null,
              info: null, order: [] };
const hash = crypto.createHash('sha256');
let head = Buffer.alloc(0);
let pending = Buffer.alloc(0);
let paused = false;
let src = null; // the readable response body

function frame(ch, payload) {
  const h = Buffer.alloc(5);
  h.writeUInt32BE(payload.length + 1, 0);
  h[4] = ch;
  return Buffer.concat([h, payload]);
}

function finish() {
  res.stdoutSha256 = hash.digest('hex');
  res.stdoutText = head.toString('latin1');
  if (pending.length) res.trailing = pending.length;
  console.log(JSON.stringify(res));
  process.exit(0);
}

function onData(chunk) {
  pending = pending.length ? Buffer.concat([pending, chunk]) : chunk;
  while (pending.length >= 4) {
    const n = pending.readUInt32BE(0);
    if (pending.length < 4 + n) break;
    const ch = pending[4];
    const p = pending.subarray(5, 4 + n);
    pending = pending.subarray(4 + n);
    if (res.order.length === 0 || res.order[res.order.length - 1] !== ch) res.order.push(ch);
    if (ch === 1) {
      if (o.pauseMs && !paused) {
        paused = true;
        src.pause();
        console.error('paused');
        setTimeout(() => { src.resume(); console.error('resumed'); }, o.pauseMs);
      }
      res.stdoutLen += p.length;
      hash.update(p);
      if (head.length < 4096) head = Buffer.concat([head, p.subarray(0, 4096 - head.length)]);
    } else if (ch === 2) res.stderrText += p.toString('latin1');
    else if (ch === 3) { res.status = JSON.parse(p.toString()); if (!body.writableEnded) body.end(); }
    else if (ch === 5) {
      res.info = JSON.parse(p.toString());
      console.log('info ' + JSON.stringify(res.info)); // for tests waiting on the start
    }
    else res.unexpected = ch;
  }
}

const path = o.path + (o.path.includes('?') ? '&' : '?');
let body;
if (o.proto === 'h1') {
  body = http.request({ host: '127.0.0.1', port: o.port, method: 'POST', path,
                        headers: { 'x-access-token': o.token, 'transfer-encoding': 'chunked' } });
  body.on('response', (r) => {
    res.httpStatus = r.statusCode;
    res.contentType = r.headers['content-type'];
    src = r;
    r.on('data', onData);
    r.on('end', finish);
  });
  body.on('error', (e) => { res.error = e.message; finish(); });
  body.flushHeaders();
} else {
  const c = http2.connect('http://127.0.0.1:' + o.port);
  c.on('error', (e) => { res.error = e.message; finish(); });
  body = c.request({ ':method': 'POST', ':path': path, 'x-access-token': o.token });
  body.on('response', (h) => { res.httpStatus = h[':status']; res.contentType = h['content-type']; });
  src = body;
  body.on('data', onData);
  body.on('end', () => { c.close(); finish(); });
  body.on('error', (e) => { res.error = e.message; finish(); });
}
for (const r of o.resize || []) body.write(frame(4, Buffer.from(JSON.stringify(r))));
if (o.stdinFile) {
  const data = fs.readFileSync(o.stdinFile);
  for (let i = 0; i < data.length; i += 65536) body.write(frame(0, data.subarray(i, i + 65536)));
}
if (o.closeFrame) body.write(frame(255, Buffer.from([0])));
if (o.endBody) body.end();
setTimeout(() => { res.error = 'timeout'; finish(); }, o.timeoutMs || 120000).unref();
