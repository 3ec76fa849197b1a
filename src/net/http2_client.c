/*
 * HTTP/2 client on nghttp2: many requests multiplexed on one connection
 * (TLS with ALPN "h2", or cleartext with prior knowledge). The connection
 * engine (http2_conn.c) does the I/O, zero-copy request bodies, hold/release
 * flow control for response bodies and stream lifetime; this file maps the
 * client API of net/http.h onto it and caps the response header block.
 *
 * Lifetime. A request ends with exactly one final on_body (OSR_EOF or an
 * error), delivered when nghttp2 closed the stream AND our own request body
 * is no longer referenced by a queued write; the request is freed right
 * after. The client struct lives until the user called
 * osr_http_client_close() AND the connection is gone, whichever is last; a
 * connection that died on its own leaves the struct in place so the user's
 * pointer stays valid (requests then fail with OSR_ECLOSED).
 */
#include <stdio.h>
#include <string.h>

#include "net/http2_int.h"
#include "util/log.h"
#include "util/mem.h"

typedef struct h2cli_s {
  osr_http_client_t super; /* first: the generic layer casts */
  osr__h2_conn_t c;
  int is_tls;
  int user_closed;
  int conn_gone;
} h2cli_t;

typedef struct hoff_s {
  uint32_t no, nl, vo, vl;
} hoff_t;

typedef struct h2creq_s {
  osr_http_creq_t super;
  osr__h2_stream_t st;
  h2cli_t *cl;
  osr_buf_t hbuf; /* the current response header block */
  hoff_t *hoffs;
  size_t nh, caph;
  size_t hbytes;
  int status;
  int too_large;
  int got_response;
  osr_http_creq_write_cb wcb;
  void *warg;
} h2creq_t;

static const osr_http_client_ops_t h2_client_ops;

static h2creq_t *creq_of(osr__h2_stream_t *st)
{
  return osr_container_of(st, h2creq_t, st);
}

/* Is this HEADERS frame a response head (final or interim), not trailers? */
static int is_response_block(const nghttp2_frame *f, const h2creq_t *r)
{
  return f->hd.type == NGHTTP2_HEADERS &&
         (f->headers.cat == NGHTTP2_HCAT_RESPONSE ||
          (f->headers.cat == NGHTTP2_HCAT_HEADERS && !r->got_response));
}

/* ---- hooks --------------------------------------------------------------- */

static int cli_on_begin_headers(osr__h2_conn_t *c, const nghttp2_frame *f)
{
  osr__h2_stream_t *st = nghttp2_session_get_stream_user_data(c->ng, f->hd.stream_id);
  if (st == NULL)
    return 0;
  h2creq_t *r = creq_of(st);
  if (is_response_block(f, r)) {
    osr_buf_consume(&r->hbuf, r->hbuf.len);
    r->nh = 0;
    r->hbytes = 0;
    r->status = 0;
    r->too_large = 0;
  }
  return 0;
}

static int cli_on_header(osr__h2_conn_t *c, const nghttp2_frame *f, const uint8_t *name, size_t nl,
                         const uint8_t *value, size_t vl)
{
  osr__h2_stream_t *st = nghttp2_session_get_stream_user_data(c->ng, f->hd.stream_id);
  const osr_http_limits_t *l = &c->limits;
  if (st == NULL)
    return 0;
  h2creq_t *r = creq_of(st);
  if (!is_response_block(f, r) || r->too_large)
    return 0;
  r->hbytes += nl + vl;
  if (r->hbytes > l->max_header_bytes) {
    r->too_large = 1;
    return 0;
  }
  if (nl != 0 && name[0] == ':') {
    if (nl == 7 && memcmp(name, ":status", 7) == 0 && vl == 3) {
      r->status = (value[0] - '0') * 100 + (value[1] - '0') * 10 + (value[2] - '0');
    }
    return 0; /* nghttp2 validated :status; no other pseudo-header exists */
  }
  if (r->nh >= l->max_headers) {
    r->too_large = 1;
    return 0;
  }
  if (r->nh == r->caph) {
    size_t cap = r->caph ? r->caph * 2 : 16;
    if (cap > l->max_headers)
      cap = l->max_headers;
    hoff_t *p = osr_try_realloc(r->hoffs, cap * sizeof(*p));
    if (p == NULL) {
      r->too_large = 1;
      return 0;
    }
    r->hoffs = p;
    r->caph = cap;
  }
  hoff_t *ho = &r->hoffs[r->nh];
  ho->no = (uint32_t)r->hbuf.len;
  ho->nl = (uint32_t)nl;
  if (osr_buf_append(&r->hbuf, name, nl) != 0) {
    r->too_large = 1;
    return 0;
  }
  ho->vo = (uint32_t)r->hbuf.len;
  ho->vl = (uint32_t)vl;
  if (osr_buf_append(&r->hbuf, value, vl) != 0) {
    r->too_large = 1;
    return 0;
  }
  r->nh++;
  return 0;
}

static int cli_on_headers(osr__h2_conn_t *c, const nghttp2_frame *f, osr__h2_stream_t *st)
{
  (void)c;
  if (st == NULL)
    return 0;
  h2creq_t *r = creq_of(st);
  if (!is_response_block(f, r))
    return 0; /* trailers: not passed on */
  if (r->too_large) {
    osr__h2_reset(st, NGHTTP2_CANCEL, OSR_ETOOLARGE);
    return 0;
  }
  if (r->status < 200)
    return 0; /* interim (1xx): wait for the final response */
  osr_http_header_t *hs = NULL;
  if (r->nh != 0) {
    hs = osr_try_malloc(r->nh * sizeof(*hs));
    if (hs == NULL) {
      osr__h2_reset(st, NGHTTP2_INTERNAL_ERROR, OSR_ENOMEM);
      return 0;
    }
  }
  const char *base = osr_buf_data(&r->hbuf);
  for (size_t i = 0; i < r->nh; i++) {
    hs[i].name = osr_iov(base + r->hoffs[i].no, r->hoffs[i].nl);
    hs[i].value = osr_iov(base + r->hoffs[i].vo, r->hoffs[i].vl);
  }
  r->got_response = 1;
  st->rx_expect = -1;
  for (size_t i = 0; i < r->nh; i++) {
    if (hs[i].name.len == 14 && memcmp(hs[i].name.base, "content-length", 14) == 0) {
      int64_t v = 0;
      size_t k;
      for (k = 0; k < hs[i].value.len && k < 18; k++) {
        char ch = hs[i].value.base[k];
        if (ch < '0' || ch > '9')
          break;
        v = v * 10 + (ch - '0');
      }
      if (k == hs[i].value.len && k != 0)
        st->rx_expect = v;
    }
  }
  if (r->super.ev->on_response != NULL)
    r->super.ev->on_response(&r->super, r->status, hs, r->nh, r->super.data);
  osr_free(hs);
  /* The head was valid during the call only: give the memory back. */
  osr_buf_dispose(&r->hbuf);
  osr_freep(&r->hoffs);
  r->nh = r->caph = 0;
  return 0;
}

static void cli_on_body(osr__h2_stream_t *st, const osr_iovec_t *chunk, int status)
{
  h2creq_t *r = creq_of(st);
  if (status == OSR_EOF && !r->got_response)
    status = OSR_EH2; /* closed cleanly but without a final response */
  if (r->super.ev->on_body != NULL)
    r->super.ev->on_body(&r->super, chunk, status, r->super.data);
}

static void cli_on_write_done(osr__h2_stream_t *st, int status)
{
  h2creq_t *r = creq_of(st);
  osr_http_creq_write_cb cb = r->wcb;
  void *arg = r->warg;
  r->wcb = NULL;
  r->warg = NULL;
  if (cb != NULL)
    cb(&r->super, status, arg);
}

static void cli_on_stream_done(osr__h2_stream_t *st, int status)
{
  h2creq_t *r = creq_of(st);
  (void)status;
  osr_buf_dispose(&r->hbuf);
  osr_free(r->hoffs);
  osr_free(r);
}

static void cli_free(h2cli_t *cl)
{
  osr_free(cl->super.authority);
  osr_free(cl);
}

static void cli_on_closed(osr__h2_conn_t *c)
{
  h2cli_t *cl = c->owner;
  cl->conn_gone = 1;
  if (cl->user_closed)
    cli_free(cl);
}

static const osr__h2_hooks_t cli_hooks = {
    .on_begin_headers = cli_on_begin_headers,
    .on_header = cli_on_header,
    .on_headers = cli_on_headers,
    .on_body = cli_on_body,
    .on_write_done = cli_on_write_done,
    .on_stream_done = cli_on_stream_done,
    .on_timeout = NULL, /* no bytes for idle_timeout_ms: fail with OSR_ETIMEDOUT */
    .on_closed = cli_on_closed,
};

/* ---- client API -------------------------------------------------------------- */

static int h2_request(osr_http_client_t *base, const osr_http_client_req_t *req,
                      const osr_http_client_events_t *ev, void *data, osr_http_creq_t **out)
{
  h2cli_t *cl = osr_container_of(base, h2cli_t, super);
  osr__h2_conn_t *c = &cl->c;
  const char *authority = req->authority != NULL ? req->authority : base->authority;
  size_t names = 0;

  if (req->method == NULL || req->target == NULL || req->target[0] == '\0' || ev == NULL)
    return OSR_EINVAL;
  if (cl->user_closed || c->closed || c->closing || c->close_req || c->ng == NULL ||
      !nghttp2_session_check_request_allowed(c->ng))
    return OSR_ECLOSED;
  for (size_t i = 0; i < req->nheaders; i++)
    names += req->headers[i].name.len;
  size_t nmax = req->nheaders + 5;
  nghttp2_nv *nva = osr_try_malloc(nmax * sizeof(*nva) + names);
  if (nva == NULL)
    return OSR_ENOMEM;
  uint8_t *lower = (uint8_t *)(nva + nmax);
  size_t n = 0;
  char clen[24];

#define NV(k, v, vl)                                                                               \
  (nghttp2_nv){(uint8_t *)(k), (uint8_t *)(v), sizeof(k) - 1, (vl), NGHTTP2_NV_FLAG_NONE}
  nva[n++] = NV(":method", req->method, strlen(req->method));
  nva[n++] = NV(":scheme", cl->is_tls ? "https" : "http", cl->is_tls ? 5 : 4);
  nva[n++] = NV(":authority", authority, strlen(authority));
  nva[n++] = NV(":path", req->target, strlen(req->target));
  for (size_t i = 0; i < req->nheaders; i++) {
    const osr_http_header_t *h = &req->headers[i];
    if (osr__h2_forbidden_header(h->name.base, h->name.len))
      continue;
    osr__h2_lower(lower, h->name.base, h->name.len);
    nva[n++] = (nghttp2_nv){lower, (uint8_t *)h->value.base, h->name.len, h->value.len,
                            NGHTTP2_NV_FLAG_NONE};
    lower += h->name.len;
  }
  if (req->content_length > 0) {
    int len = snprintf(clen, sizeof(clen), "%lld", (long long)req->content_length);
    nva[n++] = NV("content-length", clen, (size_t)len);
  }
#undef NV

  h2creq_t *r = osr_xcalloc(1, sizeof(*r));
  r->cl = cl;
  r->super.client = base;
  r->super.ev = ev;
  r->super.data = data;
  osr_buf_init(&r->hbuf, c->limits.max_header_bytes + 256);
  /* The final on_body is the last callback: EOF waits for the whole
   * exchange, including our request body, to be over. */
  r->st.flags |= OSR_H2_ST_EOF_AT_END;
  nghttp2_data_provider prd;
  if (req->content_length != 0)
    osr__h2_data_provider(&r->st, &prd);
  int32_t id =
      nghttp2_submit_request(c->ng, NULL, nva, n, req->content_length != 0 ? &prd : NULL, &r->st);
  osr_free(nva);
  if (id < 0) {
    osr_free(r);
    return id == NGHTTP2_ERR_NOMEM                     ? OSR_ENOMEM
           : id == NGHTTP2_ERR_STREAM_ID_NOT_AVAILABLE ? OSR_ECLOSED
                                                       : OSR_EINVAL;
  }
  osr__h2_stream_attach(c, &r->st, id);
  if (out != NULL)
    *out = &r->super;
  osr__h2_flush(c);
  return 0;
}

static int h2_creq_write(osr_http_creq_t *base, const osr_iovec_t *bufs, size_t nbufs, int end,
                         osr_http_creq_write_cb cb, void *arg)
{
  h2creq_t *r = osr_container_of(base, h2creq_t, super);
  if (r->st.flags & OSR_H2_ST_W_ACTIVE)
    return OSR_EBUSY;
  r->wcb = cb;
  r->warg = arg;
  int rv = osr__h2_write(&r->st, bufs, nbufs, end);
  if (rv != 0) {
    r->wcb = NULL;
    r->warg = NULL;
  }
  return rv;
}

static void h2_creq_hold(osr_http_creq_t *base)
{
  osr__h2_hold(&osr_container_of(base, h2creq_t, super)->st);
}

static void h2_creq_release(osr_http_creq_t *base)
{
  osr__h2_release(&osr_container_of(base, h2creq_t, super)->st);
}

static void h2_creq_cancel(osr_http_creq_t *base)
{
  h2creq_t *r = osr_container_of(base, h2creq_t, super);
  osr__h2_reset(&r->st, NGHTTP2_CANCEL, OSR_ECANCELED);
}

static void h2_client_close(osr_http_client_t *base)
{
  h2cli_t *cl = osr_container_of(base, h2cli_t, super);
  if (cl->user_closed)
    return;
  cl->user_closed = 1;
  if (cl->conn_gone) {
    cli_free(cl);
    return;
  }
  /* Outstanding requests fail with OSR_ECANCELED when the socket is gone
   * (http2_conn.c teardown), then cli_on_closed frees the client. */
  if (cl->c.close_status == 0 || !cl->c.close_req)
    cl->c.close_status = OSR_ECANCELED;
  osr__h2_conn_fail(&cl->c, OSR_ECANCELED, NGHTTP2_NO_ERROR, 1);
}

static uint32_t h2_max_streams(const osr_http_client_t *base)
{
  const h2cli_t *cl = osr_container_of(base, h2cli_t, super);
  const osr__h2_conn_t *c = &cl->c;
  if (cl->user_closed || c->closed || c->closing || c->close_req || c->ng == NULL ||
      !nghttp2_session_check_request_allowed(c->ng))
    return 0;
  return nghttp2_session_get_remote_settings(c->ng, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
}

static int h2_peer_ready(const osr_http_client_t *base)
{
  return osr_container_of(base, h2cli_t, super)->c.peer_settings;
}

static const osr_http_client_ops_t h2_client_ops = {
    .version = 20,
    .request = h2_request,
    .write = h2_creq_write,
    .hold = h2_creq_hold,
    .release = h2_creq_release,
    .cancel = h2_creq_cancel,
    .close = h2_client_close,
    .max_streams = h2_max_streams,
    .peer_ready = h2_peer_ready,
};

int osr__http2_client_new(osr_sock_t *s, const osr_http_client_t *base, osr_http_client_t **out)
{
  h2cli_t *cl = osr_xcalloc(1, sizeof(*cl));
  cl->super._ops = &h2_client_ops;
  cl->super.loop = base->loop != NULL ? base->loop : s->loop;
  cl->super.authority = osr_xstrdup(base->authority != NULL ? base->authority : "localhost");
  cl->super.limits = base->limits;
  osr_http_limits_defaults(&cl->super.limits);
  cl->super.idle_timeout_ms = base->idle_timeout_ms;
  cl->is_tls = osr_sock_is_tls(s);
  int rv = osr__h2_conn_init(&cl->c, s, 0, &cl->super.limits, &cli_hooks, cl);
  if (rv != 0) {
    cli_free(cl);
    osr_sock_close(s);
    return rv;
  }
  osr_sock_set_idle_timeout(s, cl->super.idle_timeout_ms);
  osr__h2_conn_start(&cl->c);
  *out = &cl->super;
  return 0;
}
