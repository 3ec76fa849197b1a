/*
 * The connector is a small state machine: RESOLVING -> CONNECTING (address
 * i of n) -> HANDSHAKING -> done. It owns one timer for the overall
 * deadline. The request struct is freed when both the timer is closed and
 * no libuv request (getaddrinfo or connect) is outstanding.
 */
#include "net/connect.h"

#include <string.h>

#include "net/addr.h"
#include "net/tls.h"
#include "util/log.h"
#include "util/mem.h"

struct osr_connect_s {
  uv_loop_t *loop;
  osr_addr_t addr;
  osr_connect_opts_t opts;
  char *sni;
  osr_connect_cb cb;
  void *data;
  uv_getaddrinfo_t gai;
  uv_connect_t conn;
  uv_timer_t timer;
  uv_timer_t retry;     /* unix sockets: back-off after EAGAIN */
  int retry_open;
  uint64_t backoff_ms;
  struct addrinfo *ai_list;
  struct addrinfo *ai_next;
  osr_sock_t *sock;     /* the socket being connected, if any */
  int last_err;
  int pending;          /* outstanding libuv requests + open timer */
  int done;             /* cb already called */
  int resolving;        /* uv_getaddrinfo outstanding */
};

static void try_next(osr_connect_t *c);
static void retry_later(osr_connect_t *c);

static void maybe_free(osr_connect_t *c)
{
  if (c->pending != 0)
    return;
  if (c->ai_list != NULL)
    uv_freeaddrinfo(c->ai_list);
  if (c->opts.tls != NULL)
    osr_tls_ctx_unref(c->opts.tls);
  osr_free(c->sni);
  osr_free(c);
}

static void on_timer_closed(uv_handle_t *h)
{
  osr_connect_t *c = h->data;
  c->pending--;
  maybe_free(c);
}

static void finish(osr_connect_t *c, osr_sock_t *s, int status)
{
  if (c->done)
    return;
  c->done = 1;
  uv_close((uv_handle_t *)&c->timer, on_timer_closed);
  if (c->retry_open) {
    c->retry_open = 0;
    uv_close((uv_handle_t *)&c->retry, on_timer_closed);
  }
  if (status != 0 && c->sock != NULL) {
    c->sock->data = NULL;
    osr_sock_close(c->sock);
  }
  c->sock = NULL;
  c->cb(status == 0 ? s : NULL, status, c->data);
}

static void on_deadline(uv_timer_t *t)
{
  osr_connect_t *c = t->data;
  finish(c, NULL, OSR_ETIMEDOUT);
}

/* The handshake is not counted in `pending`: if finish() runs first
 * (deadline, cancel) it closes the socket, after which the handshake
 * callback can no longer fire, and it clears s->data in case it does. */
static void on_handshake(osr_sock_t *s, int status)
{
  osr_connect_t *c = s->data;
  s->data = NULL;
  if (c == NULL || c->done) {
    osr_sock_close(s);
    return;
  }
  c->sock = status == 0 ? NULL : s;
  finish(c, s, status);
  maybe_free(c);
}

static void on_connected(uv_connect_t *req, int status)
{
  osr_connect_t *c = req->data;
  osr_sock_t *s = c->sock;

  c->pending--;
  if (c->done) {
    /* Timed out or canceled meanwhile: finish() already closed the socket. */
    maybe_free(c);
    return;
  }
  if (status != 0) {
    c->last_err = status;
    c->sock = NULL;
    osr_sock_close(s);
    if (status == UV_EAGAIN && c->addr.is_unix) {
      /* The listener's backlog is full (a burst of connects): a unix
       * socket refuses at once instead of queueing like TCP's SYN retries,
       * so try again shortly, within the deadline. */
      retry_later(c);
      maybe_free(c);
      return;
    }
    try_next(c);
    maybe_free(c);
    return;
  }
  if (!(s->_flags & OSR_SOCK_F_IS_PIPE))
    osr_sock_set_nodelay(s, 1);
  if (c->opts.tls != NULL) {
    s->data = c;
    int rv = osr__sock_start_tls(s, c->opts.tls, 0, c->sni, 0, on_handshake);
    if (rv == 0)
      return; /* c->sock stays set until the handshake ends */
    finish(c, NULL, rv);
    maybe_free(c);
    return;
  }
  c->sock = NULL;
  finish(c, s, 0);
  maybe_free(c);
}

static int start_connect(osr_connect_t *c, const struct sockaddr *sa);

static void on_retry(uv_timer_t *t)
{
  osr_connect_t *c = t->data;
  if (c->done)
    return;
  int rv = start_connect(c, NULL);
  if (rv != 0)
    finish(c, NULL, rv);
}

static void retry_later(osr_connect_t *c)
{
  if (!c->retry_open) {
    uv_timer_init(c->loop, &c->retry);
    c->retry.data = c;
    c->retry_open = 1;
    c->pending++; /* until its close callback */
    c->backoff_ms = 1;
  } else if (c->backoff_ms < 64) {
    c->backoff_ms *= 2;
  }
  uv_timer_start(&c->retry, on_retry, c->backoff_ms, 0);
}

static int start_connect(osr_connect_t *c, const struct sockaddr *sa)
{
  osr_sock_t *s;
  int rv = osr__sock_new(c->loop, c->addr.is_unix, &s);
  if (rv != 0)
    return rv;
  c->conn.data = c;
  if (c->addr.is_unix) {
    uv_pipe_connect(&c->conn, &s->_h.pipe, c->addr.path, on_connected);
    rv = 0;
  } else {
    rv = uv_tcp_connect(&c->conn, &s->_h.tcp, sa, on_connected);
  }
  if (rv != 0) {
    osr_sock_close(s);
    return rv;
  }
  c->sock = s;
  c->pending++;
  return 0;
}

static void try_next(osr_connect_t *c)
{
  while (c->ai_next != NULL) {
    struct addrinfo *ai = c->ai_next;
    c->ai_next = ai->ai_next;
    if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6)
      continue;
    int rv = start_connect(c, ai->ai_addr);
    if (rv == 0)
      return;
    c->last_err = rv;
  }
  finish(c, NULL, c->last_err != 0 ? c->last_err : OSR_EDNS);
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
  osr_connect_t *c = req->data;
  c->pending--;
  c->resolving = 0;
  c->ai_list = res;
  if (c->done) {
    maybe_free(c);
    return;
  }
  if (status != 0) {
    OSR_LOG_DEBUG("connect", "resolve %s: %s", c->addr.host, uv_strerror(status));
    finish(c, NULL, status == UV_ECANCELED ? OSR_ECANCELED : OSR_EDNS);
    maybe_free(c);
    return;
  }
  c->ai_next = res;
  try_next(c);
  maybe_free(c);
}

int osr_connect(uv_loop_t *loop, const char *addr, const osr_connect_opts_t *opts,
                osr_connect_cb cb, void *data, osr_connect_t **req)
{
  osr_addr_t a;
  int rv = osr_addr_parse(addr, &a);
  if (rv != 0)
    return rv;

  osr_connect_t *c = osr_xcalloc(1, sizeof(*c));
  c->loop = loop;
  c->addr = a;
  c->cb = cb;
  c->data = data;
  if (opts != NULL)
    c->opts = *opts;
  if (c->opts.timeout_ms == 0)
    c->opts.timeout_ms = 10000;
  if (c->opts.tls != NULL) {
    osr_tls_ctx_ref(c->opts.tls);
    c->sni = osr_xstrdup(c->opts.sni != NULL ? c->opts.sni : a.host);
  }
  c->opts.sni = NULL;
  uv_timer_init(loop, &c->timer);
  c->timer.data = c;
  c->pending = 1;
  uv_timer_start(&c->timer, on_deadline, c->opts.timeout_ms, 0);

  if (a.is_unix) {
    rv = start_connect(c, NULL);
  } else {
    struct sockaddr_storage ss;
    if (osr_addr_to_sockaddr(&a, &ss) == 0) {
      rv = start_connect(c, (struct sockaddr *)&ss); /* numeric: no DNS */
    } else {
      struct addrinfo hints;
      char port[8];
      memset(&hints, 0, sizeof(hints));
      hints.ai_family = AF_UNSPEC;
      hints.ai_socktype = SOCK_STREAM;
      hints.ai_flags = AI_ADDRCONFIG;
      snprintf(port, sizeof(port), "%u", a.port);
      c->gai.data = c;
      rv = uv_getaddrinfo(loop, &c->gai, on_resolved, a.host, port, &hints);
      if (rv == 0) {
        c->pending++;
        c->resolving = 1;
      }
    }
  }
  if (rv != 0) {
    c->done = 1; /* the callback must not fire */
    uv_close((uv_handle_t *)&c->timer, on_timer_closed);
    return rv;
  }
  if (req != NULL)
    *req = c;
  return 0;
}

void osr_connect_cancel(osr_connect_t *c)
{
  if (c->done)
    return;
  if (c->resolving)
    uv_cancel((uv_req_t *)&c->gai); /* fails harmlessly once it runs */
  finish(c, NULL, OSR_ECANCELED);
}
