// Independent WebSocket server for osr-wsc tests: the npm `ws` package.
// Prints "listening <port>", then one line per event:
//   conn <protocol|->          a client connected
//   message text|binary <len> <sha256>
//   ping <payload> / pong <payload>
//   close <code> <reason>
// Behaviour: echoes every message with its type. Text commands:
//   "fragments"  -> sends one text message in three fragments ("part1part2part3")
//   "pings"      -> sends two pings ("p1", "p2"); the client's pongs are printed
//   "close:CODE" -> closes with CODE and reason "requested"
// Subprotocols: of the offered ones it picks the LAST it knows (echo.v1,
// chat.v2), so a client must report the server's choice, not its first offer.
'use strict';
const path = require('path');
const crypto = require('crypto');
const { WebSocketServer } = require(path.join(process.env.OSR_NODE_MODULES, 'ws'));

const known = ['echo.v1', 'chat.v2'];
const wss = new WebSocketServer({
  host: '127.0.0.1',
  port: 0,
  maxPayload: 64 * 1024 * 1024,
  perMessageDeflate: false,
  handleProtocols: (protocols) => {
    const offered = [...protocols].filter((p) => known.includes(p));
    return offered.length ? offered[offered.length - 1] : false;
  },
});
const sha = (b) => crypto.createHash('sha256').update(b).digest('hex');

wss.on('listening', () => console.log('listening ' + wss.address().port));
wss.on('connection', (ws) => {
  console.log('conn ' + (ws.protocol || '-'));
  ws.on('message', (data, isBinary) => {
    console.log(`message ${isBinary ? 'binary' : 'text'} ${data.length} ${sha(data)}`);
    const s = isBinary ? '' : data.toString();
    if (s === 'fragments') {
      ws.send('part1', { fin: false });
      ws.send('part2', { fin: false });
      ws.send('part3', { fin: true });
    } else if (s === 'pings') {
      ws.ping('p1');
      ws.ping('p2');
    } else if (s.startsWith('close:')) {
      ws.close(parseInt(s.slice(6), 10), 'requested');
    } else {
      ws.send(data, { binary: isBinary });
    }
  });
  ws.on('pong', (d) => console.log('pong ' + d.toString()));
  ws.on('ping', (d) => console.log('ping ' + d.toString()));
  ws.on('close', (code, reason) => console.log(`close ${code} ${reason.toString()}`));
  ws.on('error', (e) => console.log('error ' + e.message));
});
