/*
 * osr-testd: an HTTP/1.1 + HTTP/2 + WebSocket (+ TLS) server built on the OSR
 * network core, with routes that integration tests and benchmarks drive from
 * independent peers (curl, nghttp, h2load, openssl, node, wrk).
 *
 *   GET  /hello                     "hello world\n"
 *   POST /echo, PUT /echo           streams the request body back; each chunk
 *                                   is written from the receive buffer
 *                                   (hold/release: zero-copy, backpressure)
 *   GET  /bytes?n=N&seed=S          N pattern bytes with Content-Length
 *   GET  /stream?chunks=N&size=M&delay=MS   N chunks of M bytes, streamed
 *   GET  /headers                   JSON of the request head
 *   POST /sink                      JSON {"bytes":N,"sha256":"..."} of the body
 *   POST /hold-sync, /hold-later    {"bytes":N}; every body chunk is held and
 *                                   released at once / on a later loop turn
 *   GET  /status/NNN                empty response with that status
 *   GET  /stats                     JSON {"conns","requests","rss_kib"}
 *   GET  /ws                        WebSocket echo (subprotocols echo.v1,
 *                                   chat.v2; "close:CODE" closes with CODE;
 *                                   "ping" makes the server ping)
 *   GET  /wsv                       WebSocket echo, binary through
 *                                   osr_ws_sendv (3 pieces), text through
 *                                   osr_ws_send, in order
 *
 * Prints "listening <addr> <port>" per listener and "ready"; SIGTERM/SIGINT
 * drain gracefully ("drained") and exit 0.
 */
#include <jansson.h>
#include <malloc.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "net/http.h"
#include "net/sock.h"
#include "net/tls.h"
#include "net/ws.h"
#include "util/log.h"
#include "util/mem.h"

#define PATTERN_BLOCK 251
#define PATTERN_SPAN (64 * 1024)

/* Pattern bytes: byte i = (i*31 + seed*7 + 11) mod 256 over a 251-byte
 * period; tests/lib/osrtest.py pattern() computes the same. */
static char pattern_buf[256][PATTERN_SPAN + PATTERN_BLOCK];

static osr_http_server_t *server;
static uv_signal_t sig_term, sig_int;
static uint64_t nrequests;

static void fill_patterns(void)
{
  for (int seed = 0; seed < 256; seed++)
    for (size_t i = 0; i < sizeof(pattern_buf[0]); i++)
      pattern_buf[seed][i] = (char)(((i % PATTERN_BLOCK) * 31 + (size_t)seed * 7 + 11) & 0xff);
}

/* A view of `len` (<= PATTERN_SPAN) pattern bytes starting at stream offset `off`. */
static osr_iovec_t pattern_at(int seed, uint64_t off, size_t len)
{
  return osr_iov(pattern_buf[seed & 0xff] + off % PATTERN_BLOCK, len);
}

static int query_u64(const osr_http_req_t *req, const char *key, uint64_t *out)
{
  size_t klen = strlen(key);
  const char *p = req->query.base, *end = req->query.base + req->query.len;
  while (p < end) {
    const char *amp = memchr(p, '&', (size_t)(end - p));
    const char *e = amp != NULL ? amp : end;
    if ((size_t)(e - p) > klen && memcmp(p, key, klen) == 0 && p[klen] == '=') {
      uint64_t v = 0;
      for (const char *q = p + klen + 1; q < e; q++) {
        if (*q < '0' || *q > '9' || v > UINT64_MAX / 10)
          return -1;
        v = v * 10 + (uint64_t)(*q - '0');
      }
      *out = v;
      return 0;
    }
    p = e + 1;
  }
  return -1;
}

static int path_is(const osr_http_req_t *req, const char *p)
{
  size_t n = strlen(p);
  return req->path.len == n && memcmp(req->path.base, p, n) == 0;
}

static int method_is(const osr_http_req_t *req, const char *m)
{
  size_t n = strlen(m);
  return req->method.len == n && memcmp(req->method.base, m, n) == 0;
}

/* ---- per-request state ----------------------------------------------- */

typedef struct route_s {
  osr_http_req_t *req;
  uint64_t off, total;   /* /bytes, /stream progress */
  uint64_t chunks, size, delay, sent_chunks;
  int seed;
  int writing;
  int body_done;
  uv_timer_t *timer;
  EVP_MD_CTX *md;
  uint64_t sink_bytes;
} route_t;

static void on_timer_closed(uv_handle_t *h)
{
  osr_free(h);
}

static void route_done(osr_http_req_t *req, int status)
{
  route_t *r = req->data;
  (void)status;
  if (r == NULL)
    return;
  if (r->timer != NULL)
    uv_close((uv_handle_t *)r->timer, on_timer_closed);
  if (r->md != NULL)
    EVP_MD_CTX_free(r->md);
  osr_free(r);
  req->data = NULL;
}

static route_t *route_new(osr_http_req_t *req)
{
  route_t *r = osr_xcalloc(1, sizeof(*r));
  r->req = req;
  req->data = r;
  req->on_done = route_done;
  return r;
}

static void send_json(osr_http_req_t *req, int status, json_t *j)
{
  char *s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  osr_http_send(req, status, "application/json", s, strlen(s));
  free(s);
}

/* ---- /echo: zero-copy streaming echo ------------------------------------ */

static void echo_written(osr_http_req_t *req, int status, void *arg)
{
  route_t *r = arg;
  r->writing = 0;
  if (status != 0)
    return; /* the exchange failed; on_done follows */
  osr_http_req_release(req);
}

static void echo_on_body(osr_http_req_t *req, const osr_iovec_t *chunk, int status)
{
  route_t *r = req->data;
  if (status == 0) {
    if (chunk->len == 0)
      return;
    /* Keep the chunk in the receive buffer until it is written back: no copy,
     * and the client gets no more credit meanwhile. */
    osr_http_req_hold(req);
    r->writing = 1;
    if (osr_http_write(req, chunk, 1, 0, echo_written, r) != 0) {
      r->writing = 0;
      osr_http_req_release(req);
      osr_http_abort(req);
    }
    return;
  }
  if (status == OSR_EOF) {
    r->body_done = 1;
    if (osr_http_write(req, NULL, 0, 1, NULL, NULL) != 0)
      osr_http_abort(req);
    return;
  }
  osr_http_abort(req);
}

static void route_echo(osr_http_req_t *req)
{
  route_new(req);
  const osr_iovec_t *ct = osr_http_req_header(req, "content-type");
  osr_http_header_t h = {OSR_IOV_LIT("content-type"),
                         ct != NULL ? *ct : OSR_IOV_LIT("application/octet-stream")};
  req->on_body = echo_on_body;
  if (osr_http_respond(req, 200, &h, 1, req->content_length) != 0)
    osr_http_abort(req);
}

/* ---- /bytes and /stream ------------------------------------------------- */

static void bytes_next(osr_http_req_t *req, int status, void *arg);

static void bytes_pump(route_t *r)
{
  osr_iovec_t iov[16];
  size_t n = 0;
  uint64_t left = r->total - r->off, off = r->off;
  while (left > 0 && n < OSR_ARRAY_SIZE(iov)) {
    size_t len = left > PATTERN_SPAN ? PATTERN_SPAN : (size_t)left;
    iov[n++] = pattern_at(r->seed, off, len);
    off += len;
    left -= len;
  }
  r->off = off;
  if (osr_http_write(r->req, iov, n, left == 0, left == 0 ? NULL : bytes_next, r) != 0)
    osr_http_abort(r->req);
}

static void bytes_next(osr_http_req_t *req, int status, void *arg)
{
  (void)req;
  if (status == 0)
    bytes_pump(arg);
}

static void route_bytes(osr_http_req_t *req)
{
  uint64_t n = 0, seed = 0;
  if (query_u64(req, "n", &n) != 0 || n > (1ull << 40)) {
    osr_http_send(req, 400, "text/plain", "bad n\n", 6);
    return;
  }
  query_u64(req, "seed", &seed);
  route_t *r = route_new(req);
  r->total = n;
  r->seed = (int)(seed & 0xff);
  osr_http_header_t h = {OSR_IOV_LIT("content-type"), OSR_IOV_LIT("application/octet-stream")};
  if (osr_http_respond(req, 200, &h, 1, (int64_t)n) != 0) {
    osr_http_abort(req);
    return;
  }
  if (method_is(req, "HEAD") || n == 0) {
    osr_http_write(req, NULL, 0, 1, NULL, NULL);
    return;
  }
  bytes_pump(r);
}

static void stream_write_chunk(route_t *r);

static void stream_tick(uv_timer_t *t)
{
  stream_write_chunk(t->data);
}

static void stream_written(osr_http_req_t *req, int status, void *arg)
{
  route_t *r = arg;
  (void)req;
  if (status != 0)
    return;
  if (r->delay != 0)
    uv_timer_start(r->timer, stream_tick, r->delay, 0);
  else
    stream_write_chunk(r);
}

static void stream_write_chunk(route_t *r)
{
  osr_iovec_t iov[64];
  size_t n = 0;
  uint64_t left = r->size, off = r->off;
  while (left > 0 && n < OSR_ARRAY_SIZE(iov)) {
    size_t len = left > PATTERN_SPAN ? PATTERN_SPAN : (size_t)left;
    iov[n++] = pattern_at(r->seed, off, len);
    off += len;
    left -= len;
  }
  r->off = off;
  r->sent_chunks++;
  int last = r->sent_chunks == r->chunks;
  if (osr_http_write(r->req, iov, n, last, last ? NULL : stream_written, r) != 0)
    osr_http_abort(r->req);
}

static void route_stream(osr_http_req_t *req)
{
  uint64_t chunks = 1, size = 16, delay = 0, seed = 0;
  query_u64(req, "chunks", &chunks);
  query_u64(req, "size", &size);
  query_u64(req, "delay", &delay);
  query_u64(req, "seed", &seed);
  if (chunks == 0 || chunks > 1000000 || size == 0 || size > 4 * 1024 * 1024 || delay > 60000) {
    osr_http_send(req, 400, "text/plain", "bad stream parameters\n", 22);
    return;
  }
  route_t *r = route_new(req);
  r->chunks = chunks;
  r->size = size;
  r->delay = delay;
  r->seed = (int)(seed & 0xff);
  osr_http_header_t h = {OSR_IOV_LIT("content-type"), OSR_IOV_LIT("application/octet-stream")};
  if (osr_http_respond(req, 200, &h, 1, -1) != 0) {
    osr_http_abort(req);
    return;
  }
  if (delay != 0) {
    r->timer = osr_xmalloc(sizeof(*r->timer));
    uv_timer_init(uv_default_loop(), r->timer);
    r->timer->data = r;
  }
  stream_write_chunk(r);
}

/* ---- /hold-sync and /hold-later: body flow-control edge cases ------------ */

/* hold + release inside the same on_body callback, and a hold released from
 * a timer on a later loop turn (so the final chunk of a body is released
 * with nothing left to parse). Both answer {"bytes":N} at the end. */
static void hold_later_tick(uv_timer_t *t)
{
  route_t *r = t->data;
  osr_http_req_release(r->req);
}

static void hold_on_body(osr_http_req_t *req, const osr_iovec_t *chunk, int status)
{
  route_t *r = req->data;
  if (status == 0) {
    r->sink_bytes += chunk->len;
    osr_http_req_hold(req);
    if (r->timer == NULL)
      osr_http_req_release(req);
    else
      uv_timer_start(r->timer, hold_later_tick, 1, 0);
    return;
  }
  if (status != OSR_EOF) {
    osr_http_abort(req);
    return;
  }
  send_json(req, 200, json_pack("{s:I}", "bytes", (json_int_t)r->sink_bytes));
}

static void route_hold(osr_http_req_t *req, int later)
{
  route_t *r = route_new(req);
  if (later) {
    r->timer = osr_xmalloc(sizeof(*r->timer));
    uv_timer_init(uv_default_loop(), r->timer);
    r->timer->data = r;
  }
  req->on_body = hold_on_body;
}

/* ---- /sink, /headers, /stats, /status ----------------------------------- */

static void sink_on_body(osr_http_req_t *req, const osr_iovec_t *chunk, int status)
{
  route_t *r = req->data;
  if (status == 0) {
    r->sink_bytes += chunk->len;
    EVP_DigestUpdate(r->md, chunk->base, chunk->len);
    return;
  }
  if (status != OSR_EOF) {
    if (status == OSR_ETOOLARGE)
      osr_http_send(req, 413, "text/plain", "too large\n", 10);
    else
      osr_http_abort(req);
    return;
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  char hex[2 * EVP_MAX_MD_SIZE + 1];
  EVP_DigestFinal_ex(r->md, md, &mdlen);
  for (unsigned i = 0; i < mdlen; i++)
    snprintf(hex + 2 * i, 3, "%02x", md[i]);
  send_json(req, 200, json_pack("{s:I,s:s}", "bytes", (json_int_t)r->sink_bytes, "sha256", hex));
}

static void route_sink(osr_http_req_t *req)
{
  route_t *r = route_new(req);
  r->md = EVP_MD_CTX_new();
  EVP_DigestInit_ex(r->md, EVP_sha256(), NULL);
  req->on_body = sink_on_body;
}

static void route_headers(osr_http_req_t *req)
{
  json_t *h = json_object();
  for (size_t i = 0; i < req->num_headers; i++) {
    const osr_http_header_t *x = &req->headers[i];
    char name[256];
    size_t n = x->name.len < sizeof(name) - 1 ? x->name.len : sizeof(name) - 1;
    memcpy(name, x->name.base, n);
    name[n] = '\0';
    json_object_set_new(h, name, json_stringn(x->value.base, x->value.len));
  }
  json_t *j = json_pack("{s:s%,s:s%,s:i,s:s%,s:s%,s:I,s:o}", "method", req->method.base,
                        req->method.len, "target", req->target.base, req->target.len, "version",
                        req->version, "authority", req->authority.base, req->authority.len, "scheme",
                        req->scheme.base, req->scheme.len, "content_length",
                        (json_int_t)req->content_length, "headers", h);
  /* TLS details, so tests can check SNI and ALPN end to end. */
  const char *sni = osr_sock_sni(req->sock), *alpn = osr_sock_alpn(req->sock);
  json_object_set_new(j, "peer", json_string(req->peer));
  json_object_set_new(j, "tls", json_boolean(req->is_tls));
  json_object_set_new(j, "sni", sni != NULL ? json_string(sni) : json_null());
  json_object_set_new(j, "alpn", alpn != NULL ? json_string(alpn) : json_null());
  send_json(req, 200, j);
}

static long rss_kib(void)
{
  /* /proc reads do not block on disk; acceptable in this test peer. */
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long v = -1;
  if (f == NULL)
    return -1;
  while (fgets(line, sizeof(line), f) != NULL)
    if (strncmp(line, "VmRSS:", 6) == 0)
      v = strtol(line + 6, NULL, 10);
  fclose(f);
  return v;
}

static void route_stats(osr_http_req_t *req)
{
  send_json(req, 200,
            json_pack("{s:I,s:I,s:I}", "conns", (json_int_t)osr_http_server_nconns(server),
                      "requests", (json_int_t)nrequests, "rss_kib", (json_int_t)rss_kib()));
}

static void route_status(osr_http_req_t *req)
{
  int code = 0;
  const char *p = req->path.base + 8;
  size_t n = req->path.len - 8;
  for (size_t i = 0; i < n && i < 3; i++)
    code = p[i] >= '0' && p[i] <= '9' ? code * 10 + (p[i] - '0') : -1000;
  if (n != 3 || code < 200 || code > 599) {
    osr_http_send(req, 400, "text/plain", "bad status\n", 11);
    return;
  }
  osr_http_send(req, code, NULL, NULL, 0);
}

/* ---- /ws: WebSocket echo -------------------------------------------------- */

/* Per-connection echo state: at most one message waits while the client is
 * not reading (osr_ws_send said OSR_EAGAIN); reading stays paused until
 * on_writable sends it. */
typedef struct ws_echo_s {
  int op;
  char *pending;
  size_t pending_len;
  int has_pending;
} ws_echo_t;

static void ws_on_message(osr_ws_t *ws, int op, const osr_iovec_t *msg, void *data)
{
  ws_echo_t *e = data;
  if (op == OSR_WS_TEXT && msg->len > 6 && memcmp(msg->base, "close:", 6) == 0) {
    char num[8] = {0};
    memcpy(num, msg->base + 6, msg->len - 6 < sizeof(num) - 1 ? msg->len - 6 : sizeof(num) - 1);
    osr_ws_close(ws, (int)strtol(num, NULL, 10), "requested");
    return;
  }
  if (op == OSR_WS_TEXT && msg->len == 4 && memcmp(msg->base, "ping", 4) == 0) {
    osr_ws_ping(ws, "osr", 3);
    return;
  }
  int rv = osr_ws_send(ws, op, msg->base, msg->len);
  if (rv == OSR_EAGAIN) {
    /* The client is not reading: keep this message and stop reading. */
    e->pending = osr_xmalloc(msg->len ? msg->len : 1);
    memcpy(e->pending, msg->base, msg->len);
    e->pending_len = msg->len;
    e->op = op;
    e->has_pending = 1;
    osr_ws_read_stop(ws);
  }
}

static void ws_on_writable(osr_ws_t *ws, void *data)
{
  ws_echo_t *e = data;
  if (e->has_pending) {
    if (osr_ws_send(ws, e->op, e->pending, e->pending_len) == OSR_EAGAIN)
      return;
    osr_freep(&e->pending);
    e->has_pending = 0;
  }
  osr_ws_read_start(ws);
}

static void ws_on_close(osr_ws_t *ws, int code, const osr_iovec_t *reason, void *data)
{
  ws_echo_t *e = data;
  (void)ws;
  (void)reason;
  OSR_LOG_DEBUG("testd", "websocket closed %d", code);
  osr_free(e->pending);
  osr_free(e);
}

static const osr_ws_events_t ws_events = {
    .on_message = ws_on_message,
    .on_writable = ws_on_writable,
    .on_close = ws_on_close,
};

static void route_ws(osr_http_req_t *req)
{
  static const char *const protos[] = {"echo.v1", "chat.v2"};
  osr_ws_opts_t o;
  osr_ws_t *ws;
  memset(&o, 0, sizeof(o));
  o.subprotocols = protos;
  o.nsubprotocols = 2;
  o.max_message = 16 * 1024 * 1024;
  ws_echo_t *e = osr_xcalloc(1, sizeof(*e));
  if (osr_ws_accept(req, &o, &ws_events, e, &ws) != 0)
    osr_free(e); /* osr_ws_accept answered 400/426 itself */
}

/* ---- /wsv: WebSocket echo through osr_ws_sendv ------------------------------ */

/* Binary messages are echoed with osr_ws_sendv (by reference, in three
 * pieces), text ones with osr_ws_send (copied), in arrival order: the
 * order between the two send paths and the frame header of every length
 * are what the peer checks. Messages wait in a short FIFO (each an owned
 * copy: on_message's view ends with the call); above WSV_HIGH of them the
 * session stops reading. */
#define WSV_HIGH 4

typedef struct wsv_msg_s {
  struct wsv_msg_s *next;
  int op;
  size_t len;
  char data[];
} wsv_msg_t;

typedef struct wsv_s {
  osr_ws_t *ws;
  wsv_msg_t *head, *tail;
  size_t n;
  int inflight; /* head is the frame osr_ws_sendv holds */
} wsv_t;

static void wsv_pump(wsv_t *v);

static void wsv_pop(wsv_t *v)
{
  wsv_msg_t *m = v->head;
  v->head = m->next;
  if (v->head == NULL)
    v->tail = NULL;
  v->n--;
  osr_free(m);
}

static void wsv_free(wsv_t *v)
{
  while (v->head != NULL)
    wsv_pop(v);
  osr_free(v);
}

static void wsv_written(osr_ws_t *ws, int status, void *arg)
{
  wsv_t *v = arg;
  (void)ws;
  v->inflight = 0;
  wsv_pop(v);
  if (status == 0)
    wsv_pump(v);
}

static void wsv_pump(wsv_t *v)
{
  while (v->head != NULL && !v->inflight) {
    wsv_msg_t *m = v->head;
    int rv;
    if (m->op == OSR_WS_BINARY) {
      size_t a = m->len / 3, b = m->len - m->len / 3;
      osr_iovec_t iov[3] = {osr_iov(m->data, a), osr_iov(m->data + a, b - a),
                            osr_iov(m->data + b, m->len - b)};
      rv = osr_ws_sendv(v->ws, m->op, iov, 3, wsv_written, v);
      if (rv == 0) {
        v->inflight = 1;
        break;
      }
    } else {
      rv = osr_ws_send(v->ws, m->op, m->data, m->len);
      if (rv == 0) {
        wsv_pop(v);
        continue;
      }
    }
    if (rv != OSR_EAGAIN)
      OSR_LOG_ERROR("testd", "wsv send: %s", osr_strerror(rv));
    break; /* OSR_EAGAIN: on_writable resumes */
  }
  if (v->n < WSV_HIGH / 2)
    osr_ws_read_start(v->ws);
}

static void wsv_on_message(osr_ws_t *ws, int op, const osr_iovec_t *msg, void *data)
{
  wsv_t *v = data;
  wsv_msg_t *m = osr_xmalloc(sizeof(*m) + msg->len + 1);
  m->next = NULL;
  m->op = op;
  m->len = msg->len;
  if (msg->len != 0) /* an empty message may have no base */
    memcpy(m->data, msg->base, msg->len);
  if (v->tail != NULL)
    v->tail->next = m;
  else
    v->head = m;
  v->tail = m;
  if (++v->n >= WSV_HIGH)
    osr_ws_read_stop(ws);
  wsv_pump(v);
}

static void wsv_on_writable(osr_ws_t *ws, void *data)
{
  (void)ws;
  wsv_pump(data);
}

static void wsv_on_close(osr_ws_t *ws, int code, const osr_iovec_t *reason, void *data)
{
  (void)ws;
  (void)code;
  (void)reason;
  wsv_free(data); /* ws.h: a pending sendv callback fired before this */
}

static const osr_ws_events_t wsv_events = {
    .on_message = wsv_on_message,
    .on_writable = wsv_on_writable,
    .on_close = wsv_on_close,
};

static void route_wsv(osr_http_req_t *req)
{
  osr_ws_opts_t o;
  memset(&o, 0, sizeof(o));
  o.max_message = 16 * 1024 * 1024;
  wsv_t *v = osr_xcalloc(1, sizeof(*v));
  if (osr_ws_accept(req, &o, &wsv_events, v, &v->ws) != 0)
    osr_free(v);
}

/* ---- dispatch ---------------------------------------------------------------- */

static void on_request(osr_http_req_t *req, void *data)
{
  (void)data;
  nrequests++;
  int get = method_is(req, "GET") || method_is(req, "HEAD");
  if (path_is(req, "/hello") && get)
    osr_http_send(req, 200, "text/plain", "hello world\n", 12);
  else if (path_is(req, "/echo") && (method_is(req, "POST") || method_is(req, "PUT")))
    route_echo(req);
  else if (path_is(req, "/bytes") && get)
    route_bytes(req);
  else if (path_is(req, "/stream") && get)
    route_stream(req);
  else if (path_is(req, "/headers"))
    route_headers(req);
  else if (path_is(req, "/sink") && (method_is(req, "POST") || method_is(req, "PUT")))
    route_sink(req);
  else if (path_is(req, "/hold-sync") && method_is(req, "POST"))
    route_hold(req, 0);
  else if (path_is(req, "/hold-later") && method_is(req, "POST"))
    route_hold(req, 1);
  else if (path_is(req, "/stats") && get)
    route_stats(req);
  else if (req->path.len > 8 && memcmp(req->path.base, "/status/", 8) == 0)
    route_status(req);
  else if (path_is(req, "/ws") && method_is(req, "GET"))
    route_ws(req);
  else if (path_is(req, "/wsv") && method_is(req, "GET"))
    route_wsv(req);
  else
    osr_http_send(req, 404, "text/plain", "not found\n", 10);
}

/* ---- main --------------------------------------------------------------------- */

static void on_server_closed(osr_http_server_t *srv, void *data)
{
  (void)srv;
  (void)data;
  printf("drained\n");
  fflush(stdout);
  uv_close((uv_handle_t *)&sig_term, NULL);
  uv_close((uv_handle_t *)&sig_int, NULL);
}

static void on_signal(uv_signal_t *h, int signum)
{
  (void)signum;
  uv_signal_stop(&sig_term);
  uv_signal_stop(&sig_int);
  (void)h;
  osr_http_server_close(server, 5000, on_server_closed, NULL);
}

static void usage(void)
{
  fprintf(stderr,
          "usage: osr-testd [--listen ADDR]... [--tls-cert F --tls-key F] [--max-body N]\n"
          "                 [--max-headers N] [--max-header-bytes N] [--max-url N]\n"
          "                 [--header-timeout-ms N] [--idle-timeout-ms N] [--max-conns N]\n"
          "                 [--h2-window N] [--h2-max-streams N] [--log-level L] [--log-json]\n"
          "       osr-testd --sizes   (what an idle HTTP/1.1 connection allocates, then exit)\n");
  exit(2);
}

/* The structs an idle HTTP/1.1 keep-alive connection keeps, and the malloc
 * chunk each takes (usable size + glibc's 8-byte header). The connection
 * struct is a slab slot (16-byte multiple, net/http1.c) and goes once the
 * connection is parked. */
static void print_sizes(void)
{
  size_t sizes[2] = {OSR__SOCK_TCP_SIZE, sizeof(osr_sock_t)};
  const char *names[2] = {"socket (TCP)", "socket (unix)"};
  for (int i = 0; i < 2; i++) {
    void *m = osr_xmalloc(sizes[i]);
    printf("%-20s %4zu bytes, malloc chunk %4zu\n", names[i], sizes[i], malloc_usable_size(m) + 8);
    osr_free(m);
  }
  size_t c = osr__http1_conn_size();
  printf("%-20s %4zu bytes, slab slot    %4zu (none once parked: 0.5 s idle)\n",
         "HTTP/1.1 connection", c, (c + 15) & ~(size_t)15);
}

static uint64_t num_arg(const char *s)
{
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (*s == '\0' || *end != '\0')
    usage();
  return v;
}

int main(int argc, char **argv)
{
  const char *listen[16];
  size_t nlisten = 0;
  const char *cert = NULL, *key = NULL;
  osr_http_server_opts_t opts;
  memset(&opts, 0, sizeof(opts));
  opts.handler.on_request = on_request;
  opts.server_name = "osr-testd";

  if (argc == 2 && strcmp(argv[1], "--sizes") == 0) {
    print_sizes();
    return 0;
  }
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (i + 1 >= argc && strcmp(a, "--log-json") != 0)
      usage();
    if (strcmp(a, "--listen") == 0 && nlisten < OSR_ARRAY_SIZE(listen))
      listen[nlisten++] = argv[++i];
    else if (strcmp(a, "--tls-cert") == 0)
      cert = argv[++i];
    else if (strcmp(a, "--tls-key") == 0)
      key = argv[++i];
    else if (strcmp(a, "--max-body") == 0)
      opts.limits.max_body = num_arg(argv[++i]);
    else if (strcmp(a, "--max-headers") == 0)
      opts.limits.max_headers = (size_t)num_arg(argv[++i]);
    else if (strcmp(a, "--max-header-bytes") == 0)
      opts.limits.max_header_bytes = (size_t)num_arg(argv[++i]);
    else if (strcmp(a, "--max-url") == 0)
      opts.limits.max_url = (size_t)num_arg(argv[++i]);
    else if (strcmp(a, "--header-timeout-ms") == 0)
      opts.limits.header_timeout_ms = num_arg(argv[++i]);
    else if (strcmp(a, "--idle-timeout-ms") == 0)
      opts.limits.idle_timeout_ms = num_arg(argv[++i]);
    else if (strcmp(a, "--max-conns") == 0)
      opts.limits.max_conns = (size_t)num_arg(argv[++i]);
    else if (strcmp(a, "--h2-window") == 0)
      opts.limits.h2_window = (uint32_t)num_arg(argv[++i]);
    else if (strcmp(a, "--h2-max-streams") == 0)
      opts.limits.h2_max_streams = (uint32_t)num_arg(argv[++i]);
    else if (strcmp(a, "--log-level") == 0) {
      osr_log_level_t l;
      if (osr_log_parse_level(argv[++i], &l) != 0)
        usage();
      osr_log_set_level(l);
    } else if (strcmp(a, "--log-json") == 0)
      osr_log_set_json(1);
    else
      usage();
  }
  if (nlisten == 0)
    listen[nlisten++] = "127.0.0.1:0";
  if ((cert == NULL) != (key == NULL))
    usage();

  signal(SIGPIPE, SIG_IGN);
  fill_patterns();
  uv_loop_t *loop = uv_default_loop();

  osr_tls_ctx_t *tls = NULL;
  if (cert != NULL) {
    static const char *const alpn[] = {"h2", "http/1.1"};
    osr_tls_server_opts_t to = {cert, key, alpn, 2};
    int rv = osr_tls_ctx_new_server(&to, &tls); /* start-up: blocking load is fine */
    if (rv != 0) {
      fprintf(stderr, "osr-testd: TLS: %s\n", osr_strerror(rv));
      return 1;
    }
  }

  server = osr_http_server_new(loop, &opts);
  for (size_t i = 0; i < nlisten; i++) {
    int rv = osr_http_server_listen(server, listen[i], tls);
    if (rv != 0) {
      fprintf(stderr, "osr-testd: listen %s: %s\n", listen[i], osr_strerror(rv));
      return 1;
    }
    printf("listening %s %d\n", listen[i], osr_http_server_port(server, i));
  }
  if (tls != NULL)
    osr_tls_ctx_unref(tls); /* the listeners hold their own references */
  uv_signal_init(loop, &sig_term);
  uv_signal_init(loop, &sig_int);
  uv_signal_start(&sig_term, on_signal, SIGTERM);
  uv_signal_start(&sig_int, on_signal, SIGINT);
  printf("ready\n");
  fflush(stdout);

  uv_run(loop, UV_RUN_DEFAULT);
  uv_loop_close(loop);
  return 0;
}
