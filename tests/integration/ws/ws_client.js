// Independent WebSocket client for tests against osr-testd: the npm `ws`
// package, driven by a JSON plan on the command line:
//   node ws_client.js URL '{"protocols":[...], "ca": "ca.pem", "steps":[...]}'
// Steps run in order:
//   {"text": "str"}                     send a text message
//   {"binary": N, "seed": S}            send pattern(N, S) (as tests/lib/osrtest.py)
//   {"raw_text_hex": "c328"}            send these bytes as a TEXT frame, unvalidated
//   {"fragments": ["a","b"], "binary": false}  one message in several frames
//   {"ping": "payload"}
//   {"wait": K}                         wait until K messages were received
//   {"close": [code, "reason"]}
// Prints one JSON object per event: open, message, ping, pong, close, error.
'use strict';
const path = require('path');
const crypto = require('crypto');
const WebSocket = require(path.join(process.env.OSR_NODE_MODULES, 'ws'));

const url = process.argv[2];
const plan = JSON.parse(process.argv[3] || '{}');
const out = (o) => console.log(JSON.stringify(o));
const sha = (b) => crypto.createHash('sha256').update(b).digest('hex');
function pattern(n, seed) {
  const blk = Buffer.alloc(251);
  for (let i = 0; i < 251; i++) blk[i] = (i * 31 + seed * 7 + 11) & 0xff;
  const b = Buffer.alloc(n);
  for (let off = 0; off < n; off += 251) blk.copy(b, off, 0, Math.min(251, n - off));
  return b;
}

const timer = setTimeout(() => { out({ event: 'timeout' }); process.exit(3); },
                         (plan.timeout || 60) * 1000);
const ws = new WebSocket(url, plan.protocols || [], {
  perMessageDeflate: false,
  maxPayload: 64 * 1024 * 1024,
  ca: plan.ca ? require('fs').readFileSync(plan.ca) : undefined,
});
let received = 0;
let step = 0;
let waiting = null;

function run() {
  while (step < (plan.steps || []).length) {
    const s = plan.steps[step];
    if (s.wait !== undefined) {
      if (received < s.wait) { waiting = s.wait; return; }
      step++;
      continue;
    }
    step++;
    if (s.text !== undefined) ws.send(s.text);
    else if (s.binary !== undefined && s.fragments === undefined) ws.send(pattern(s.binary, s.seed || 0));
    else if (s.raw_text_hex !== undefined) ws.send(Buffer.from(s.raw_text_hex, 'hex'), { binary: false });
    else if (s.fragments !== undefined) {
      s.fragments.forEach((f, i) => ws.send(f, { binary: !!s.binary, fin: i === s.fragments.length - 1 }));
    } else if (s.ping !== undefined) ws.ping(s.ping);
    else if (s.close !== undefined) ws.close(s.close[0], s.close[1]);
  }
}

ws.on('open', () => { out({ event: 'open', protocol: ws.protocol }); run(); });
ws.on('message', (data, isBinary) => {
  received++;
  const m = { event: 'message', type: isBinary ? 'binary' : 'text', len: data.length, sha: sha(data) };
  if (!isBinary && data.length <= 256) m.text = data.toString();
  out(m);
  if (waiting !== null && received >= waiting) { waiting = null; run(); }
});
ws.on('ping', (d) => out({ event: 'ping', data: d.toString() }));
ws.on('pong', (d) => out({ event: 'pong', data: d.toString() }));
ws.on('unexpected-response', (req, res) => {
  out({ event: 'unexpected-response', status: res.statusCode, headers: res.headers });
  clearTimeout(timer);
  process.exit(0);
});
ws.on('error', (e) => out({ event: 'error', message: e.message }));
ws.on('close', (code, reason) => {
  out({ event: 'close', code: code, reason: reason.toString() });
  clearTimeout(timer);
});
