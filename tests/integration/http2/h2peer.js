// An independent HTTP/2 server for our client: node's built-in http2 module
// (h2c with http2.createServer, or TLS with ALPN h2 via createSecureServer).
// Usage: node h2peer.js [--tls CERT KEY]
// Prints "listening <port>". Routes:
//   GET  /hello            -> "hello from node\n"
//   GET  /bytes?n=N&seed=S -> N bytes of osrtest.pattern(N, S), content-length
//   POST /echo             -> the request body streamed back
//   POST /sink             -> {"bytes":N,"sha256":"..."} of the body
//   GET  /headers          -> JSON of the request headers
//   GET  /status/NNN       -> that status, empty body
//   GET  /slow?ms=M        -> "slow\n" after M ms
//   GET  /reset            -> the stream is reset (RST_STREAM) without a response
'use strict';
const http2 = require('http2');
const fs = require('fs');
const crypto = require('crypto');

function pattern(n, seed) {
  const blk = Buffer.alloc(251);
  for (let i = 0; i < 251; i++) blk[i] = (i * 31 + seed * 7 + 11) & 0xff;
  const out = Buffer.alloc(n);
  for (let off = 0; off < n; off += 251) blk.copy(out, off, 0, Math.min(251, n - off));
  return out;
}

function handler(req, res) {
  const u = new URL(req.url, 'http://x');
  const p = u.pathname;
  if (p === '/hello') {
    res.writeHead(200, {'content-type': 'text/plain'});
    res.end('hello from node\n');
  } else if (p === '/bytes') {
    const n = parseInt(u.searchParams.get('n') || '0', 10);
    const seed = parseInt(u.searchParams.get('seed') || '0', 10);
    res.writeHead(200, {'content-type': 'application/octet-stream', 'content-length': n});
    res.end(pattern(n, seed));
  } else if (p === '/echo') {
    res.writeHead(200, {'content-type': 'application/octet-stream'});
    req.pipe(res);
  } else if (p === '/sink') {
    const h = crypto.createHash('sha256');
    let n = 0;
    req.on('data', (c) => { n += c.length; h.update(c); });
    req.on('end', () => {
      res.writeHead(200, {'content-type': 'application/json'});
      res.end(JSON.stringify({bytes: n, sha256: h.digest('hex')}));
    });
  } else if (p === '/headers') {
    res.writeHead(200, {'content-type': 'application/json'});
    res.end(JSON.stringify(req.headers));
  } else if (p.startsWith('/status/')) {
    res.writeHead(parseInt(p.slice(8), 10));
    res.end();
  } else if (p === '/slow') {
    setTimeout(() => { res.writeHead(200); res.end('slow\n'); },
               parseInt(u.searchParams.get('ms') || '100', 10));
  } else if (p === '/reset') {
    req.stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR);
  } else {
    res.writeHead(404);
    res.end();
  }
}

const args = process.argv.slice(2);
let server;
if (args[0] === '--tls') {
  server = http2.createSecureServer({cert: fs.readFileSync(args[1]), key: fs.readFileSync(args[2])}, handler);
} else {
  server = http2.createServer({}, handler);
}
server.on('sessionError', () => {});
server.listen(0, '127.0.0.1', () => {
  console.log('listening ' + server.address().port);
});
process.on('SIGTERM', () => process.exit(0));
