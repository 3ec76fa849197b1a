/*
 * Generic HTTP client entry points: connect, pick the protocol (ALPN "h2"
 * or prior knowledge -> HTTP/2, else HTTP/1.1) and dispatch the request API
 * to the protocol's ops table.
 */
#include <string.h>

#include "net/connect.h"
#include "net/http.h"
#include "net/addr.h"
#include "util/mem.h"

typedef struct connecting_s {
  osr_http_client_t base; /* template copied into the protocol client */
  int h2_prior_knowledge;
  osr_http_client_connect_cb cb;
  void *data;
} connecting_t;

static void on_connected(osr_sock_t *s, int status, void *data)
{
  connecting_t *cn = data;
  osr_http_client_t *c = NULL;

  if (status == 0) {
    const char *alpn = osr_sock_alpn(s);
    int h2 = alpn != NULL ? strcmp(alpn, "h2") == 0 : cn->h2_prior_knowledge;
    status = h2 ? osr__http2_client_new(s, &cn->base, &c) : osr__http1_client_new(s, &cn->base, &c);
  }
  cn->cb(status == 0 ? c : NULL, status, cn->data);
  osr_free(cn->base.authority);
  osr_free(cn);
}

int osr_http_client_connect(uv_loop_t *loop, const char *addr, const osr_http_client_opts_t *opts,
                            osr_http_client_connect_cb cb, void *data)
{
  osr_http_client_opts_t o;
  osr_connect_opts_t co;
  osr_addr_t a;

  if (opts != NULL)
    o = *opts;
  else
    memset(&o, 0, sizeof(o));
  int rv = osr_addr_parse(addr, &a);
  if (rv != 0)
    return rv;

  connecting_t *cn = osr_xcalloc(1, sizeof(*cn));
  cn->base.loop = loop;
  cn->base.limits = o.limits;
  osr_http_limits_defaults(&cn->base.limits);
  cn->base.idle_timeout_ms = o.idle_timeout_ms != 0 ? o.idle_timeout_ms : 60000;
  if (a.is_unix) {
    cn->base.authority = osr_xstrdup("localhost");
  } else {
    char auth[OSR_ADDR_HOST_MAX + 16];
    int v6 = strchr(a.host, ':') != NULL;
    snprintf(auth, sizeof(auth), v6 ? "[%s]:%u" : "%s:%u", a.host, a.port);
    cn->base.authority = osr_xstrdup(auth);
  }
  cn->h2_prior_knowledge = o.tls == NULL && o.h2_prior_knowledge;
  cn->cb = cb;
  cn->data = data;

  memset(&co, 0, sizeof(co));
  co.timeout_ms = o.connect_timeout_ms;
  co.tls = o.tls;
  co.sni = o.sni;
  rv = osr_connect(loop, addr, &co, on_connected, cn, NULL);
  if (rv != 0) {
    osr_free(cn->base.authority);
    osr_free(cn);
  }
  return rv;
}

int osr_http_client_version(const osr_http_client_t *c)
{
  return c->_ops->version;
}

uint32_t osr_http_client_max_streams(const osr_http_client_t *c)
{
  return c->_ops->max_streams != NULL ? c->_ops->max_streams(c) : 1;
}

int osr_http_client_peer_ready(const osr_http_client_t *c)
{
  return c->_ops->peer_ready != NULL ? c->_ops->peer_ready(c) : 1;
}

int osr_http_client_request(osr_http_client_t *c, const osr_http_client_req_t *req,
                            const osr_http_client_events_t *ev, void *data, osr_http_creq_t **out)
{
  return c->_ops->request(c, req, ev, data, out);
}

int osr_http_creq_write(osr_http_creq_t *r, const osr_iovec_t *bufs, size_t nbufs, int end,
                        osr_http_creq_write_cb cb, void *arg)
{
  return r->client->_ops->write(r, bufs, nbufs, end, cb, arg);
}

void osr_http_creq_hold(osr_http_creq_t *r)
{
  r->client->_ops->hold(r);
}

void osr_http_creq_release(osr_http_creq_t *r)
{
  r->client->_ops->release(r);
}

uint64_t osr_http_creq_raw_avail(osr_http_creq_t *r)
{
  return r->client->_ops->raw_avail != NULL ? r->client->_ops->raw_avail(r) : 0;
}

osr_sock_t *osr_http_creq_raw_take(osr_http_creq_t *r, uint64_t n)
{
  return r->client->_ops->raw_take(r, n);
}

void osr_http_creq_raw_done(osr_http_creq_t *r)
{
  r->client->_ops->raw_done(r);
}

void osr_http_creq_cancel(osr_http_creq_t *r)
{
  r->client->_ops->cancel(r);
}

void osr_http_client_close(osr_http_client_t *c)
{
  c->_ops->close(c);
}
