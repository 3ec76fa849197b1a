// @kubernetes/client-node's Exec against the data plane as if it were a
// kube-apiserver: a kubeconfig whose cluster is the data plane URL and whose
// user is the binding token (sent as Bearer). argv[2] is JSON:
//   server, token, pod (the sandbox id), command (array), stdin (utf8 text or
//   null), tty (with a resizable stdout of rows x cols), rows, cols
// Prints one JSON line {stdout, stderr, status, error}.
import path from 'node:path';
import { PassThrough, Writable } from 'node:stream';
import { pathToFileURL } from 'node:url';

const nm = process.env.OSR_NODE_MODULES;
const k8s = await import(pathToFileURL(path.join(nm, '@kubernetes/client-node/dist/index.js')).href);
const o = JSON.parse(process.argv[2]);

const kc = new k8s.KubeConfig();
kc.loadFromOptions({
  clusters: [{ name: 'osr', server: o.server, skipTLSVerify: true }],
  users: [{ name: 'osr', token: o.token }],
  contexts: [{ name: 'osr', cluster: 'osr', user: 'osr' }],
  currentContext: 'osr',
});

function sink(resizable) {
  const chunks = [];
  const w = new Writable({ write(c, _e, cb) { chunks.push(c); cb(); } });
  if (resizable) { w.rows = o.rows; w.columns = o.cols; }
  w.text = () => Buffer.concat(chunks).toString('utf8');
  return w;
}

const stdout = sink(o.tty);
const stderr = sink(false);
let stdin = null;
if (o.stdin !== null && o.stdin !== undefined) stdin = new PassThrough();
const res = { stdout: '', stderr: '', status: null, error: null };
const done = new Promise((resolve) => {
  const exec = new k8s.Exec(kc);
  exec.exec('default', o.pod, 'main', o.command, stdout, stderr, stdin, !!o.tty, (st) => {
    res.status = st;
  }).then((ws) => {
    ws.on('close', () => resolve());
    // stdin, then end -> v5 close channel. With a tty, client-node queues
    // the initial resize through a Readable (emitted on a later tick):
    // give it a turn of the loop to go out first.
    if (stdin !== null) setTimeout(() => { stdin.write(o.stdin); stdin.end(); }, o.tty ? 300 : 0);
  }, (err) => { res.error = String(err && (err.message || err)); resolve(); });
});
const timer = setTimeout(() => { res.error = 'timeout'; finish(); }, 60000);
function finish() {
  clearTimeout(timer);
  res.stdout = stdout.text();
  res.stderr = stderr.text();
  console.log(JSON.stringify(res));
  process.exit(0);
}
await done;
finish();
