/*
 * HTTP/2 server on nghttp2: turns streams into osr_http_req_t requests for
 * the handler (see net/http.h). The connection mechanics (output batches,
 * backpressure, body flow control, stream lifetime) live in http2_conn.c;
 * this file is about requests: collecting and capping the header block,
 * validating it, answering what the handler must not see (400/413/414/431)
 * and mapping the request API onto streams.
 *
 * Entered from http_server.c for TLS connections that chose ALPN "h2", and
 * from http1.c when a cleartext connection starts with the h2c
 * prior-knowledge preface (still in s->input; nghttp2 checks it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/http2_int.h"
#include "util/log.h"
#include "util/mem.h"

typedef struct h2srv_s {
  osr__h2_conn_t c;
  osr_http_server_t *srv;
  const osr_http_server_opts_t *opts;
  char peer[64];
  int is_tls;
} h2srv_t;

/* One header field as offsets into the request's header bytes (the buffer
 * may move while the block is collected; pointers are made at the end). */
typedef struct hoff_s {
  uint32_t no, nl, vo, vl;
} hoff_t;

enum { PS_METHOD, PS_PATH, PS_SCHEME, PS_AUTHORITY, PS_COUNT };

typedef struct h2req_s {
  osr_http_req_t req; /* what the handler sees */
  osr__h2_stream_t st;
  h2srv_t *h;
  osr_buf_t hbuf; /* header names and values */
  hoff_t *hoffs;
  size_t nh, caph;
  hoff_t pseudo[PS_COUNT];
  unsigned have_pseudo;
  size_t hbytes;  /* names + values so far, pseudo-headers included */
  int reject;     /* HTTP status to answer instead of the handler */
  int dispatched; /* on_request was called */
  int head;
  uint64_t body_seen;
  osr_http_header_t *headers;
  osr_http_write_cb wcb;
  void *warg;
} h2req_t;

static const osr_http_req_ops_t h2_req_ops;

static h2req_t *req_of(osr__h2_stream_t *st)
{
  return osr_container_of(st, h2req_t, st);
}

/* ---- header block -------------------------------------------------------- */

static int store(h2req_t *r, const uint8_t *p, size_t n, uint32_t *off)
{
  *off = (uint32_t)r->hbuf.len;
  return osr_buf_append(&r->hbuf, p, n);
}

static int srv_on_begin_headers(osr__h2_conn_t *c, const nghttp2_frame *f)
{
  h2srv_t *h = c->owner;
  if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST)
    return 0;
  h2req_t *r = osr_xcalloc(1, sizeof(*r));
  r->h = h;
  const osr_http_limits_t *l = &c->limits;
  /* Everything we store is capped; past the caps we only count and answer
   * 414/431 at the end of the block. */
  osr_buf_init(&r->hbuf, l->max_header_bytes + l->max_url + 256);
  osr__h2_stream_attach(c, &r->st, f->hd.stream_id);
  return 0;
}

static int srv_on_header(osr__h2_conn_t *c, const nghttp2_frame *f, const uint8_t *name, size_t nl,
                         const uint8_t *value, size_t vl)
{
  static const char *const pseudo[PS_COUNT] = {":method", ":path", ":scheme", ":authority"};
  const osr_http_limits_t *l = &c->limits;
  osr__h2_stream_t *st = nghttp2_session_get_stream_user_data(c->ng, f->hd.stream_id);

  if (st == NULL || f->headers.cat != NGHTTP2_HCAT_REQUEST)
    return 0; /* trailers are not passed on */
  h2req_t *r = req_of(st);
  if (r->reject != 0)
    return 0;
  /* :path is capped by max_url, everything else by max_header_bytes. */
  int is_path = nl == 5 && memcmp(name, ":path", 5) == 0;
  r->hbytes += nl + (is_path ? 0 : vl);
  if (r->hbytes > l->max_header_bytes) {
    r->reject = 431;
    return 0;
  }
  if (nl != 0 && name[0] == ':') {
    for (int i = 0; i < PS_COUNT; i++) {
      if (strlen(pseudo[i]) != nl || memcmp(pseudo[i], name, nl) != 0)
        continue;
      if (i == PS_PATH && vl > l->max_url) {
        r->reject = 414;
        return 0;
      }
      if (store(r, value, vl, &r->pseudo[i].vo) != 0) {
        r->reject = 431;
        return 0;
      }
      r->pseudo[i].vl = (uint32_t)vl;
      r->have_pseudo |= 1u << i;
      return 0;
    }
    return 0; /* others (:protocol) are rejected by nghttp2 already */
  }
  if (r->nh >= l->max_headers) {
    r->reject = 431;
    return 0;
  }
  if (r->nh == r->caph) {
    size_t cap = r->caph ? r->caph * 2 : 16;
    if (cap > l->max_headers)
      cap = l->max_headers;
    hoff_t *p = osr_try_realloc(r->hoffs, cap * sizeof(*p));
    if (p == NULL) {
      r->reject = 431;
      return 0;
    }
    r->hoffs = p;
    r->caph = cap;
  }
  hoff_t *ho = &r->hoffs[r->nh];
  if (store(r, name, nl, &ho->no) != 0 || store(r, value, vl, &ho->vo) != 0) {
    r->reject = 431;
    return 0;
  }
  ho->nl = (uint32_t)nl;
  ho->vl = (uint32_t)vl;
  r->nh++;
  return 0;
}

static osr_iovec_t piece(h2req_t *r, uint32_t off, uint32_t len)
{
  return osr_iov(r->hbuf.base + r->hbuf.off + off, len);
}

/* Answer on the handler's behalf (no body) and stop the request body. */
static void reject(h2req_t *r, int status)
{
  osr__h2_conn_t *c = &r->h->c;
  char code[12];
  nghttp2_nv nva[2];
  size_t n = 0;

  snprintf(code, sizeof(code), "%03d", status);
  nva[n++] = (nghttp2_nv){(uint8_t *)":status", (uint8_t *)code, 7, 3, NGHTTP2_NV_FLAG_NONE};
  nva[n++] = (nghttp2_nv){(uint8_t *)"content-length", (uint8_t *)"0", 14, 1, NGHTTP2_NV_FLAG_NONE};
  r->req._responded = 1;
  if (r->st.status == 0)
    r->st.status = status == 413 ? OSR_ETOOLARGE : OSR_EHTTP;
  if (nghttp2_submit_response(c->ng, r->st.id, nva, n, NULL) != 0) {
    osr__h2_reset(&r->st, NGHTTP2_INTERNAL_ERROR, OSR_EHTTP);
    return;
  }
  /* RFC 9113 8.1: after a complete response the server may reset the
   * stream with NO_ERROR so the client stops sending the body. */
  r->st.flags |= OSR_H2_ST_RST_AFTER;
  osr__h2_flush(c);
}

static int parse_u64(osr_iovec_t v, uint64_t *out)
{
  uint64_t n = 0;
  if (v.len == 0 || v.len > 19)
    return -1;
  for (size_t i = 0; i < v.len; i++) {
    if (v.base[i] < '0' || v.base[i] > '9')
      return -1;
    n = n * 10 + (uint64_t)(v.base[i] - '0');
  }
  *out = n;
  return 0;
}

static int srv_on_headers(osr__h2_conn_t *c, const nghttp2_frame *f, osr__h2_stream_t *st)
{
  h2srv_t *h = c->owner;
  if (st == NULL || f->headers.cat != NGHTTP2_HCAT_REQUEST)
    return 0;
  h2req_t *r = req_of(st);
  osr_http_req_t *q = &r->req;

  if (r->reject == 0) {
    unsigned need = (1u << PS_METHOD) | (1u << PS_PATH) | (1u << PS_SCHEME);
    if ((r->have_pseudo & (1u << PS_METHOD)) && r->pseudo[PS_METHOD].vl == 7 &&
        memcmp(piece(r, r->pseudo[PS_METHOD].vo, 7).base, "CONNECT", 7) == 0)
      r->reject = 501; /* no tunnels here */
    else if ((r->have_pseudo & need) != need || r->pseudo[PS_PATH].vl == 0)
      r->reject = 400; /* nghttp2 checks this too; never trust a single layer */
  }
  q->content_length = -1;
  for (size_t i = 0; r->reject == 0 && i < r->nh; i++) {
    osr_iovec_t n = piece(r, r->hoffs[i].no, r->hoffs[i].nl);
    if (n.len == 14 && memcmp(n.base, "content-length", 14) == 0) {
      uint64_t cl;
      if (parse_u64(piece(r, r->hoffs[i].vo, r->hoffs[i].vl), &cl) != 0)
        r->reject = 400;
      else if (cl > c->limits.max_body)
        r->reject = 413;
      else
        q->content_length = (int64_t)cl;
    }
  }
  if (r->reject == 0 && r->nh != 0) {
    r->headers = osr_try_malloc(r->nh * sizeof(*r->headers));
    if (r->headers == NULL)
      r->reject = 431;
  }
  if (r->reject != 0) {
    OSR_LOG_DEBUG("http2", "%s stream %d rejected with %d", h->peer, st->id, r->reject);
    reject(r, r->reject);
    return 0;
  }

  /* The block is complete: hbuf no longer moves, so pointers are stable
   * until the request is freed. */
  for (size_t i = 0; i < r->nh; i++) {
    r->headers[i].name = piece(r, r->hoffs[i].no, r->hoffs[i].nl);
    r->headers[i].value = piece(r, r->hoffs[i].vo, r->hoffs[i].vl);
  }
  q->version = 20;
  q->method = piece(r, r->pseudo[PS_METHOD].vo, r->pseudo[PS_METHOD].vl);
  q->target = piece(r, r->pseudo[PS_PATH].vo, r->pseudo[PS_PATH].vl);
  q->path = q->target;
  q->query = osr_iov(q->target.base + q->target.len, 0);
  const char *qm = memchr(q->target.base, '?', q->target.len);
  if (qm != NULL) {
    q->path.len = (size_t)(qm - q->target.base);
    q->query = osr_iov(qm + 1, q->target.len - q->path.len - 1);
  }
  if (r->have_pseudo & (1u << PS_AUTHORITY)) {
    q->authority = piece(r, r->pseudo[PS_AUTHORITY].vo, r->pseudo[PS_AUTHORITY].vl);
  } else {
    q->authority = osr_iov("", 0);
    for (size_t i = 0; i < r->nh; i++) {
      if (r->headers[i].name.len == 4 && memcmp(r->headers[i].name.base, "host", 4) == 0)
        q->authority = r->headers[i].value;
    }
  }
  q->scheme = piece(r, r->pseudo[PS_SCHEME].vo, r->pseudo[PS_SCHEME].vl);
  st->rx_expect = q->content_length;
  q->headers = r->headers;
  q->num_headers = r->nh;
  q->expect_body = !(f->hd.flags & NGHTTP2_FLAG_END_STREAM) && q->content_length != 0;
  q->is_tls = h->is_tls;
  memcpy(q->peer, h->peer, sizeof(q->peer));
  q->sock = c->sock;
  q->server = h->srv;
  q->_ops = &h2_req_ops;
  r->head = q->method.len == 4 && memcmp(q->method.base, "HEAD", 4) == 0;
  r->dispatched = 1;
  h->opts->handler.on_request(q, h->opts->data);
  return 0;
}

/* ---- engine hooks -------------------------------------------------------- */

static void srv_on_body(osr__h2_stream_t *st, const osr_iovec_t *chunk, int status)
{
  h2req_t *r = req_of(st);
  osr_http_req_t *q = &r->req;

  if (!r->dispatched || q->on_body == NULL)
    return; /* read and discarded: the engine credits it at once */
  if (status == 0) {
    r->body_seen += chunk->len;
    if (r->body_seen > r->h->c.limits.max_body) {
      /* Over the cap without (or beyond) a content-length: answer 413 if
       * the handler has not started a response, else reset. The handler
       * learns it from on_body and on_done. */
      st->flags |= OSR_H2_ST_RX_DONE;
      if (!q->_responded)
        reject(r, 413);
      else
        osr__h2_reset(st, NGHTTP2_CANCEL, OSR_ETOOLARGE);
      st->status = OSR_ETOOLARGE;
      osr_iovec_t none = osr_iov(NULL, 0);
      q->on_body(q, &none, OSR_ETOOLARGE);
      return;
    }
  }
  q->on_body(q, chunk, status);
}

static void srv_on_write_done(osr__h2_stream_t *st, int status)
{
  h2req_t *r = req_of(st);
  osr_http_write_cb cb = r->wcb;
  void *arg = r->warg;
  r->wcb = NULL;
  r->warg = NULL;
  if (cb != NULL)
    cb(&r->req, status, arg);
}

static void srv_on_stream_done(osr__h2_stream_t *st, int status)
{
  h2req_t *r = req_of(st);
  if (r->dispatched) {
    /* "0 if the response was fully sent" (http.h). */
    int s = (st->flags & OSR_H2_ST_W_ENDED) && status != OSR_ECANCELED && status != OSR_ETOOLARGE
                ? 0
                : (status != 0 ? status : OSR_ECONNRESET);
    osr__http_req_done(&r->req, s);
  }
  osr_buf_dispose(&r->hbuf);
  osr_free(r->hoffs);
  osr_free(r->headers);
  osr_free(r);
}

static void srv_on_timeout(osr__h2_conn_t *c)
{
  int stalled = c->queued != 0;

  if (c->ng != NULL && nghttp2_session_get_remote_window_size(c->ng) <= 0)
    stalled = 1;
  for (osr__h2_stream_t *st = c->streams; st != NULL && !stalled; st = st->next) {
    if ((st->flags & OSR_H2_ST_W_ACTIVE) && !(st->flags & OSR_H2_ST_W_FRAMED) && c->ng != NULL &&
        nghttp2_session_get_stream_remote_window_size(c->ng, st->id) <= 0)
      stalled = 1;
  }
  /* Idle (no streams), or the peer stopped reading / stopped granting
   * window for a whole timeout: let it go. Streams waiting on the handler
   * keep the connection. */
  if (c->nstreams == 0 || stalled) {
    OSR_LOG_DEBUG("http2", "%s idle timeout (%zu streams)", ((h2srv_t *)c->owner)->peer,
                  c->nstreams);
    osr__h2_conn_fail(c, OSR_ETIMEDOUT, NGHTTP2_NO_ERROR, 1);
    return;
  }
  if (c->sock != NULL)
    osr_sock_set_idle_timeout(c->sock, c->limits.idle_timeout_ms);
}

static void srv_on_closed(osr__h2_conn_t *c)
{
  osr_free(c->owner);
}

static const osr__h2_hooks_t srv_hooks = {
    .on_begin_headers = srv_on_begin_headers,
    .on_header = srv_on_header,
    .on_headers = srv_on_headers,
    .on_body = srv_on_body,
    .on_write_done = srv_on_write_done,
    .on_stream_done = srv_on_stream_done,
    .on_timeout = srv_on_timeout,
    .on_closed = srv_on_closed,
};

/* ---- request API ----------------------------------------------------------- */

static int h2_respond(osr_http_req_t *req, int status, const osr_http_header_t *hs, size_t nh,
                      int64_t content_length)
{
  h2req_t *r = osr_container_of(req, h2req_t, req);
  osr__h2_conn_t *c = &r->h->c;
  const char *server = r->h->opts->server_name;
  char code[12], clen[24];
  size_t names = 0;

  if (status < 200)
    return OSR_EINVAL; /* interim responses are not offered */
  if (c->closed || c->closing || (r->st.flags & (OSR_H2_ST_NG_CLOSED | OSR_H2_ST_FINALIZED)))
    return OSR_ECLOSED;
  for (size_t i = 0; i < nh; i++)
    names += hs[i].name.len;
  /* nva and the lower-cased names in one allocation (sizes come from the
   * handler, but may echo peer data: try_ and fail the response). */
  size_t nmax = nh + 3;
  nghttp2_nv *nva = osr_try_malloc(nmax * sizeof(*nva) + names);
  if (nva == NULL)
    return OSR_ENOMEM;
  uint8_t *lower = (uint8_t *)(nva + nmax);
  size_t n = 0;

  snprintf(code, sizeof(code), "%03d", status);
  nva[n++] = (nghttp2_nv){(uint8_t *)":status", (uint8_t *)code, 7, 3, NGHTTP2_NV_FLAG_NONE};
  if (server != NULL)
    nva[n++] = (nghttp2_nv){(uint8_t *)"server", (uint8_t *)server, 6, strlen(server),
                            NGHTTP2_NV_FLAG_NONE};
  for (size_t i = 0; i < nh; i++) {
    if (osr__h2_forbidden_header(hs[i].name.base, hs[i].name.len))
      continue;
    osr__h2_lower(lower, hs[i].name.base, hs[i].name.len);
    nva[n++] = (nghttp2_nv){lower, (uint8_t *)hs[i].value.base, hs[i].name.len, hs[i].value.len,
                            NGHTTP2_NV_FLAG_NONE};
    lower += hs[i].name.len;
  }
  if (content_length >= 0 && status != 204 && status != 304) {
    int len = snprintf(clen, sizeof(clen), "%lld", (long long)content_length);
    nva[n++] = (nghttp2_nv){(uint8_t *)"content-length", (uint8_t *)clen, 14, (size_t)len,
                            NGHTTP2_NV_FLAG_NONE};
  }
  nghttp2_data_provider prd;
  osr__h2_data_provider(&r->st, &prd);
  int rv = nghttp2_submit_response(c->ng, r->st.id, nva, n, &prd);
  osr_free(nva);
  if (rv != 0) {
    r->st.flags &= ~OSR_H2_ST_HAS_PRD;
    return rv == NGHTTP2_ERR_NOMEM ? OSR_ENOMEM : OSR_EINVAL;
  }
  osr__h2_flush(c);
  return 0;
}

static int h2_write(osr_http_req_t *req, const osr_iovec_t *bufs, size_t nbufs, int end,
                    osr_http_write_cb cb, void *arg)
{
  h2req_t *r = osr_container_of(req, h2req_t, req);
  if (r->st.flags & OSR_H2_ST_W_ACTIVE)
    return OSR_EBUSY;
  r->wcb = cb;
  r->warg = arg;
  /* HEAD: the handler writes the body it would send; the peer gets none. */
  int rv = r->head ? osr__h2_write(&r->st, NULL, 0, end) : osr__h2_write(&r->st, bufs, nbufs, end);
  if (rv != 0) {
    r->wcb = NULL;
    r->warg = NULL;
  }
  return rv;
}

static void h2_hold(osr_http_req_t *req)
{
  osr__h2_hold(&osr_container_of(req, h2req_t, req)->st);
}

static void h2_release(osr_http_req_t *req)
{
  osr__h2_release(&osr_container_of(req, h2req_t, req)->st);
}

static void h2_abort(osr_http_req_t *req)
{
  h2req_t *r = osr_container_of(req, h2req_t, req);
  osr__h2_reset(&r->st, NGHTTP2_CANCEL, OSR_ECANCELED);
}

static const osr_http_req_ops_t h2_req_ops = {
    .respond = h2_respond,
    .write = h2_write,
    .hold = h2_hold,
    .release = h2_release,
    .abort = h2_abort,
    .upgrade = NULL, /* osr_http_upgrade() answers OSR_EINVAL on HTTP/2 */
};

/* ---- entry points ---------------------------------------------------------- */

static h2srv_t *server_new(osr_http_server_t *srv, osr_sock_t *s)
{
  h2srv_t *h = osr_xcalloc(1, sizeof(*h));
  h->srv = srv;
  h->opts = osr__http_server_opts(srv);
  if (osr__h2_conn_init(&h->c, s, 1, &h->opts->limits, &srv_hooks, h) != 0) {
    osr_free(h);
    return NULL;
  }
  return h;
}

void osr__http2_server_start(osr_http_server_t *srv, osr_sock_t *s)
{
  h2srv_t *h = server_new(srv, s);
  if (h == NULL) {
    osr_sock_close(s);
    return;
  }
  if (osr_sock_peername(s, h->peer, sizeof(h->peer)) != 0)
    snprintf(h->peer, sizeof(h->peer), "?");
  h->is_tls = osr_sock_is_tls(s);
  osr_sock_set_idle_timeout(s, h->c.limits.idle_timeout_ms);
  osr__h2_conn_start(&h->c);
}

osr__h2_conn_t *osr__http2_server_new_mem(osr_http_server_t *srv,
                                          void (*write)(void *ud, const osr_iovec_t *iov, size_t n),
                                          void *ud)
{
  h2srv_t *h = server_new(srv, NULL);
  if (h == NULL)
    return NULL;
  snprintf(h->peer, sizeof(h->peer), "memory");
  h->c.mem_write = write;
  h->c.mem_ud = ud;
  osr__h2_conn_start(&h->c);
  return &h->c;
}
