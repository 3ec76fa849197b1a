/*
 * The HTTP server object: owns the listeners and picks the protocol for each
 * accepted connection. TLS connections go by ALPN ("h2" -> HTTP/2, anything
 * else -> HTTP/1.1); cleartext connections start as HTTP/1.1, whose parser
 * hands the connection to HTTP/2 when it sees the h2c prior-knowledge preface
 * (http1.c).
 */
#include <string.h>
#include <strings.h>

#include "net/http.h"
#include "net/listener.h"
#include "util/log.h"
#include "util/mem.h"

#define MAX_LISTENERS 16

struct osr_http_server_s {
  uv_loop_t *loop;
  osr_http_server_opts_t opts;
  osr_listener_t *listeners[MAX_LISTENERS];
  size_t nlisteners;
  size_t nclosing;
  void (*on_closed)(osr_http_server_t *srv, void *data);
  void *on_closed_data;
  int closing;
};

void osr_http_limits_defaults(osr_http_limits_t *l)
{
  if (l->max_url == 0)
    l->max_url = 8 * 1024;
  if (l->max_header_bytes == 0)
    l->max_header_bytes = 64 * 1024;
  if (l->max_headers == 0)
    l->max_headers = 100;
  if (l->max_body == 0)
    l->max_body = 64ull * 1024 * 1024;
  if (l->header_timeout_ms == 0)
    l->header_timeout_ms = 10000;
  if (l->idle_timeout_ms == 0)
    l->idle_timeout_ms = 60000;
  if (l->h2_max_streams == 0)
    l->h2_max_streams = 256;
  if (l->h2_window == 0)
    l->h2_window = 256 * 1024;
  if (l->max_conns == 0)
    l->max_conns = 10000;
}

osr_http_server_t *osr_http_server_new(uv_loop_t *loop, const osr_http_server_opts_t *opts)
{
  osr_http_server_t *srv = osr_xcalloc(1, sizeof(*srv));
  srv->loop = loop;
  srv->opts = *opts;
  osr_http_limits_defaults(&srv->opts.limits);
  return srv;
}

const osr_http_server_opts_t *osr__http_server_opts(const osr_http_server_t *srv)
{
  return &srv->opts;
}

osr_http_server_t *osr__http_server_of(const osr_http_server_opts_t *opts)
{
  return osr_container_of(opts, osr_http_server_t, opts);
}

static void on_accept(osr_listener_t *l, osr_sock_t *s)
{
  osr_http_server_t *srv = l->data;
  const char *alpn = osr_sock_alpn(s);

  if (alpn != NULL && strcmp(alpn, "h2") == 0)
    osr__http2_server_start(srv, s);
  else
    osr__http1_server_start(srv, s);
}

int osr_http_server_listen(osr_http_server_t *srv, const char *addr, osr_tls_ctx_t *tls)
{
  osr_listener_opts_t lo;
  osr_listener_t *l;

  if (srv->nlisteners == MAX_LISTENERS)
    return OSR_E2BIG;
  memset(&lo, 0, sizeof(lo));
  lo.max_conns = srv->opts.limits.max_conns;
  lo.tls = tls;
  lo.handshake_timeout_ms = srv->opts.limits.header_timeout_ms;
  int rv = osr_listener_new(srv->loop, addr, &lo, on_accept, srv, &l);
  if (rv != 0)
    return rv;
  srv->listeners[srv->nlisteners++] = l;
  return 0;
}

int osr_http_server_port(const osr_http_server_t *srv, size_t n)
{
  return n < srv->nlisteners ? osr_listener_port(srv->listeners[n]) : 0;
}

size_t osr_http_server_nconns(const osr_http_server_t *srv)
{
  size_t n = 0;
  for (size_t i = 0; i < srv->nlisteners; i++)
    n += osr_listener_nconns(srv->listeners[i]);
  return n;
}

static void on_listener_closed(osr_listener_t *l)
{
  osr_http_server_t *srv = l->data;
  if (--srv->nclosing != 0)
    return;
  if (srv->on_closed != NULL)
    srv->on_closed(srv, srv->on_closed_data);
  osr_free(srv);
}

void osr_http_server_close(osr_http_server_t *srv, uint64_t grace_ms,
                           void (*cb)(osr_http_server_t *srv, void *data), void *data)
{
  if (srv->closing)
    return;
  srv->closing = 1;
  srv->on_closed = cb;
  srv->on_closed_data = data;
  if (srv->nlisteners == 0) {
    if (cb != NULL)
      cb(srv, data);
    osr_free(srv);
    return;
  }
  srv->nclosing = srv->nlisteners;
  for (size_t i = 0; i < srv->nlisteners; i++)
    osr_listener_close(srv->listeners[i], grace_ms, on_listener_closed);
}

/* ---- request API: dispatch to the protocol ------------------------------ */

const osr_iovec_t *osr_http_req_header(const osr_http_req_t *req, const char *name)
{
  size_t n = strlen(name);
  for (size_t i = 0; i < req->num_headers; i++) {
    const osr_http_header_t *h = &req->headers[i];
    if (h->name.len == n && strncasecmp(h->name.base, name, n) == 0)
      return &h->value;
  }
  return NULL;
}

int osr_http_respond(osr_http_req_t *req, int status, const osr_http_header_t *headers,
                     size_t nheaders, int64_t content_length)
{
  if (req->_responded)
    return OSR_EINVAL;
  if (status < 100 || status > 999)
    return OSR_EINVAL;
  int rv = req->_ops->respond(req, status, headers, nheaders, content_length);
  if (rv == 0)
    req->_responded = 1;
  return rv;
}

int osr_http_write(osr_http_req_t *req, const osr_iovec_t *bufs, size_t nbufs, int end,
                   osr_http_write_cb cb, void *arg)
{
  if (!req->_responded)
    return OSR_EINVAL;
  return req->_ops->write(req, bufs, nbufs, end, cb, arg);
}

static void on_send_written(osr_http_req_t *req, int status, void *arg)
{
  (void)req;
  (void)status;
  osr_free(arg);
}

int osr_http_send(osr_http_req_t *req, int status, const char *content_type, const void *body,
                  size_t len)
{
  osr_http_header_t h[1];
  size_t nh = 0;
  if (content_type != NULL) {
    h[0].name = OSR_IOV_LIT("content-type");
    h[0].value = osr_iov(content_type, strlen(content_type));
    nh = 1;
  }
  int rv = osr_http_respond(req, status, h, nh, (int64_t)len);
  if (rv != 0)
    return rv;
  if (req->version < 20 && len <= sizeof(req->_send_small)) {
    /* An HTTP/1.x request outlives its last write (the connection frees it
     * only after the socket gave the write back), so a small body can be
     * copied into it instead of a block of its own. */
    if (len != 0)
      memcpy(req->_send_small, body, len);
    osr_iovec_t small = osr_iov(req->_send_small, len);
    return osr_http_write(req, &small, 1, 1, NULL, NULL);
  }
  char *copy = osr_try_malloc(len);
  if (copy == NULL) {
    osr_http_abort(req);
    return OSR_ENOMEM;
  }
  if (len != 0)
    memcpy(copy, body, len);
  osr_iovec_t iov = osr_iov(copy, len);
  rv = osr_http_write(req, &iov, 1, 1, on_send_written, copy);
  if (rv != 0)
    osr_free(copy);
  return rv;
}

osr_sock_t *osr_http_raw_body(osr_http_req_t *req, uint64_t len)
{
  if (!req->_responded || req->_ops->raw_body == NULL)
    return NULL;
  return req->_ops->raw_body(req, len);
}

void osr_http_req_hold(osr_http_req_t *req)
{
  req->_ops->hold(req);
}

void osr_http_req_release(osr_http_req_t *req)
{
  req->_ops->release(req);
}

void osr_http_abort(osr_http_req_t *req)
{
  req->_ops->abort(req);
}

int osr_http_upgrade(osr_http_req_t *req, const osr_http_header_t *headers, size_t nheaders,
                     osr_http_upgrade_cb cb, void *arg)
{
  if (req->_ops->upgrade == NULL || req->_responded)
    return OSR_EINVAL;
  int rv = req->_ops->upgrade(req, headers, nheaders, cb, arg);
  if (rv == 0)
    req->_responded = 1;
  return rv;
}

/* Whole-body collection: a small state block hangs off the request and is
 * freed by osr__http_req_done() with it. */
typedef struct full_body_s {
  osr_buf_t buf;
  osr_http_full_body_cb cb;
} full_body_t;

static void full_body_on_body(osr_http_req_t *req, const osr_iovec_t *chunk, int status)
{
  full_body_t *fb = req->_full_body;
  if (status == 0) {
    if (fb->cb == NULL)
      return; /* already failed; discard the rest */
    int rv = osr_buf_append(&fb->buf, chunk->base, chunk->len);
    if (rv == 0)
      return;
    status = rv;
  }
  osr_http_full_body_cb cb = fb->cb;
  fb->cb = NULL;
  if (cb != NULL)
    cb(req, osr_iov(osr_buf_data(&fb->buf), fb->buf.len), status == OSR_EOF ? 0 : status);
}

int osr_http_req_read_body(osr_http_req_t *req, size_t max, osr_http_full_body_cb cb)
{
  if (req->_full_body != NULL)
    return OSR_EINVAL;
  if (req->content_length > 0 && (uint64_t)req->content_length > max)
    return OSR_ETOOLARGE;
  full_body_t *fb = osr_xcalloc(1, sizeof(*fb));
  osr_buf_init(&fb->buf, max);
  fb->cb = cb;
  req->_full_body = fb;
  req->on_body = full_body_on_body;
  return 0;
}

void osr__http_req_done(osr_http_req_t *req, int status)
{
  full_body_t *fb = req->_full_body;
  if (req->on_done != NULL)
    req->on_done(req, status);
  if (fb != NULL) {
    osr_buf_dispose(&fb->buf);
    osr_free(fb);
    req->_full_body = NULL;
  }
}

const char *osr_http_reason(int status)
{
  switch (status) {
  case 100: return "Continue";
  case 101: return "Switching Protocols";
  case 200: return "OK";
  case 201: return "Created";
  case 202: return "Accepted";
  case 204: return "No Content";
  case 206: return "Partial Content";
  case 301: return "Moved Permanently";
  case 302: return "Found";
  case 304: return "Not Modified";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 403: return "Forbidden";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 408: return "Request Timeout";
  case 409: return "Conflict";
  case 411: return "Length Required";
  case 413: return "Content Too Large";
  case 414: return "URI Too Long";
  case 415: return "Unsupported Media Type";
  case 426: return "Upgrade Required";
  case 429: return "Too Many Requests";
  case 431: return "Request Header Fields Too Large";
  case 500: return "Internal Server Error";
  case 501: return "Not Implemented";
  case 502: return "Bad Gateway";
  case 503: return "Service Unavailable";
  case 504: return "Gateway Timeout";
  case 505: return "HTTP Version Not Supported";
  default: return "Unknown";
  }
}
