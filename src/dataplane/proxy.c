/*
 * Forwarding: upstream connection pools, request streams, port tunnels and
 * spliced (upgraded) connections.
 *
 * A request stream (dp_stream_t) joins one server request (req) to one
 * client request (creq) on an upstream HTTP/1.1 connection:
 *   envd (port 49983)  a keep-alive connection to the agent's API;
 *   other ports        a tunnel: the agent's GET /_osr/ports/{port} with
 *                      Upgrade: osr-tcp, answered 101, then an HTTP/1.1
 *                      client runs on the raw tunnel socket.
 * Both kinds are pooled per (agent address, port) once an exchange ended
 * cleanly, so a busy SDK pays the connect (and tunnel handshake) once.
 *
 * Zero copy and backpressure (STYLE 14, 16): a request body chunk is held
 * where the server read it (osr_http_req_hold) until the upstream write
 * callback, and a response chunk is held in the upstream socket's input
 * (osr_http_creq_hold) until the client write callback. Each direction
 * therefore has at most one chunk in flight and both sockets stop reading
 * meanwhile: a slow reader stops the sandbox side and a slow sandbox stops
 * the client, with memory bounded by the sockets' input caps.
 *
 * Lifetime of a stream: it lives until (1) the server request is over
 * (on_done), (2) the client request is over (its final on_body), (3) no
 * acquire (connect or tunnel handshake) is pending and (4) no upstream write
 * callback is outstanding. Whichever comes last frees it (stream_maybe_free).
 * When the client goes away first the upstream request is cancelled, which
 * for a request on the wire closes that upstream connection (HTTP/1.1
 * cannot be resynchronised); when the upstream fails first the client gets a
 * 502 (nothing sent yet) or the exchange is aborted.
 *
 * Upgrades (WebSocket and anything else with Upgrade:) to a port get their
 * own tunnel: the request head is re-sent through it, the sandbox's answer
 * head is parsed, and on 101 the client is switched (osr_http_upgrade) and
 * the two sockets are spliced, each direction writing straight from the
 * source socket's input buffer and reading again only once written.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "dataplane/dp_int.h"
#include "net/splice.h"
#include "net/addr.h"
#include "net/connect.h"
#include "net/fdpass.h"
#include "util/blockpool.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/slab.h"
#include "util/text.h"

#define MOD OSR_DP_MOD
/** Idle pooled connections are closed after this long: the agent's own
 *  keep-alive timeout is 60 s; servers inside sandboxes (node: 5 s) may be
 *  shorter, so tunnels are kept briefly. */
#define DP_ENVD_IDLE_MS      30000
#define DP_TUNNEL_IDLE_MS    2000
#define DP_TUNNEL_TIMEOUT_MS 10000
#define DP_TUNNEL_HEAD_MAX   16384
#define DP_RESP_HEADERS_MAX  128

/* ========================================================================== */
/* Pools                                                                       */

typedef struct dp_conn_s {
  struct dp_conn_s *next;
  osr_http_client_t *c;
  uint64_t since; /* uv_now when it became idle */
} dp_conn_t;

/* Pool entries come and go once per proxied request: a page-backed slab
 * of this thread (the data plane's loop thread) instead of malloc/free. */
static __thread osr_slab_t conn_slab = {.size = sizeof(dp_conn_t), .max_spare = 4};

struct dp_pool_s {
  dp_pool_t *next;
  char addr[OSR_ADDR_HOST_MAX + OSR_ADDR_PATH_MAX + 16];
  uint16_t port;
  int tls;
  dp_conn_t *idle; /* most recently used first */
  size_t nidle;
  /* The agent's token for the sandbox last seen on this endpoint: one
   * HMAC-SHA256 (~10,000 instructions measured) per endpoint instead of one per
   * request. "" until computed. */
  char tok_sid[OSR_DP_SID_MAX];
  char agent_tok[65];
};

static unsigned pool_hash(const char *addr, uint16_t port)
{
  return osr_fnv1a_step(osr_fnv1a_str(addr), port) % DP_POOL_BUCKETS;
}

/* b = pool_hash(addr, port), which a request stream computes once for its
 * lookups (pool_get, pool_put, agent_token_for). */
static dp_pool_t *pool_find(osr_dataplane_t *dp, unsigned b, const char *addr, uint16_t port,
                            int tls, int create)
{
  for (dp_pool_t *p = dp->pools[b]; p != NULL; p = p->next)
    if (p->port == port && p->tls == tls && strcmp(p->addr, addr) == 0)
      return p;
  if (!create)
    return NULL;
  dp_pool_t *p = osr_xcalloc(1, sizeof(*p));
  osr_str_copy(p->addr, sizeof(p->addr), addr);
  p->port = port;
  p->tls = tls;
  p->next = dp->pools[b];
  dp->pools[b] = p;
  return p;
}

static osr_http_client_t *pool_get(osr_dataplane_t *dp, unsigned b, const char *addr, uint16_t port,
                                   int tls)
{
  dp_pool_t *p = pool_find(dp, b, addr, port, tls, 0);
  if (p == NULL || p->idle == NULL)
    return NULL;
  dp_conn_t *k = p->idle;
  p->idle = k->next;
  p->nidle--;
  osr_http_client_t *c = k->c;
  osr_slab_free(&conn_slab, k);
  return c;
}

static void pool_put(osr_dataplane_t *dp, unsigned b, const char *addr, uint16_t port, int tls,
                     osr_http_client_t *c)
{
  dp_pool_t *p = dp->stopping ? NULL : pool_find(dp, b, addr, port, tls, 1);
  if (p == NULL || p->nidle >= dp->cfg.pool_idle_max) {
    osr_http_client_close(c);
    return;
  }
  dp_conn_t *k = osr_slab_xalloc(&conn_slab);
  k->c = c;
  k->since = uv_now(dp->loop);
  k->next = p->idle;
  p->idle = k;
  p->nidle++;
}

static void gates_expire(osr_dataplane_t *dp, int all);

void osr__dp_pools_sweep(osr_dataplane_t *dp, uint64_t max_idle_ms)
{
  gates_expire(dp, max_idle_ms == 0);
  uint64_t now = uv_now(dp->loop);
  for (size_t b = 0; b < DP_POOL_BUCKETS; b++) {
    dp_pool_t **pp = &dp->pools[b];
    while (*pp != NULL) {
      dp_pool_t *p = *pp;
      uint64_t limit = p->port == OSR_DP_ENVD_PORT ? DP_ENVD_IDLE_MS : DP_TUNNEL_IDLE_MS;
      if (max_idle_ms < limit)
        limit = max_idle_ms;
      dp_conn_t **kp = &p->idle;
      while (*kp != NULL) {
        dp_conn_t *k = *kp;
        if (max_idle_ms == 0 || now - k->since >= limit) {
          *kp = k->next;
          p->nidle--;
          osr_http_client_close(k->c);
          osr_slab_free(&conn_slab, k);
        } else {
          kp = &k->next;
        }
      }
      if (p->idle == NULL) {
        *pp = p->next;
        osr_free(p);
      } else {
        pp = &p->next;
      }
    }
  }
}

/* The agent's token for `sid` into out ("" on failure), memoised in the
 * endpoint's pool (which the sweep frees when idle: then it is recomputed). */
static void agent_token_for(osr_dataplane_t *dp, unsigned b, const char *addr, uint16_t port,
                            int tls, const char *sid, char out[65])
{
  dp_pool_t *p = dp->stopping ? NULL : pool_find(dp, b, addr, port, tls, 1);
  if (p == NULL) {
    (void)osr_agent_token(dp->cfg.agent_secret, sid, out);
    return;
  }
  if (p->agent_tok[0] == '\0' || strcmp(p->tok_sid, sid) != 0) {
    if (osr_agent_token(dp->cfg.agent_secret, sid, p->agent_tok) != 0) {
      p->agent_tok[0] = '\0';
      out[0] = '\0';
      return;
    }
    osr_str_copy(p->tok_sid, sizeof(p->tok_sid), sid);
  }
  memcpy(out, p->agent_tok, sizeof(p->agent_tok));
}

/* ========================================================================== */
/* Connect cap per agent endpoint                                              */

/*
 * A burst of requests for one sandbox (1,000 streams at once) would open as
 * many upstream connections at once. A unix listener refuses connects
 * beyond its backlog (511) with EAGAIN, and one that is slow to accept
 * holds them queued and unanswered, so the cap bounds what one endpoint
 * has "opening" at a time: a connect and, until the agent answered, its
 * first exchange (the tunnel handshake; for envd the response head: a unix
 * connect completes while still queued in the backlog, so completion alone
 * says nothing about the agent having accepted it). Requests beyond the cap
 * wait in FIFO order and are let in as slots free; the wait is bounded
 * (DP_CONNECT_QUEUE waiters, DP_CONNECT_WAIT_MS, checked by the 1 s pool
 * timer) and ends in 503 {"type":"upstream_busy"}. Pooled connections skip
 * the gate: they cost the agent nothing new.
 */
#define DP_CONNECT_CAP     64
#define DP_CONNECT_QUEUE   4096
#define DP_CONNECT_WAIT_MS 5000

typedef struct dp_gate_s dp_gate_t;
typedef struct dp_waiter_s dp_waiter_t;

/** Slot granted (status 0), or the wait ended (OSR_ETIMEDOUT, OSR_ECANCELED
 *  at stop). Fires at most once per gate_enter that queued. */
typedef void (*dp_gate_cb)(dp_waiter_t *w, int status);

struct dp_waiter_s {
  dp_waiter_t *next, *prev;
  dp_gate_cb cb;
  uint64_t since;
};

struct dp_gate_s {
  dp_gate_t *next;
  unsigned active;      /* slots in use */
  int dispatching;      /* gate_leave's loop is running */
  dp_waiter_t *head, *tail;
  size_t nwait;
  char addr[OSR_ADDR_HOST_MAX + OSR_ADDR_PATH_MAX + 16];
};

static dp_gate_t *gate_get(osr_dataplane_t *dp, const char *addr)
{
  unsigned b = pool_hash(addr, 0);
  for (dp_gate_t *g = dp->gates[b]; g != NULL; g = g->next)
    if (strcmp(g->addr, addr) == 0)
      return g;
  dp_gate_t *g = osr_xcalloc(1, sizeof(*g));
  osr_str_copy(g->addr, sizeof(g->addr), addr);
  g->next = dp->gates[b];
  dp->gates[b] = g;
  return g;
}

static void gate_maybe_free(osr_dataplane_t *dp, dp_gate_t *g)
{
  if (g->active != 0 || g->nwait != 0 || g->dispatching)
    return;
  dp_gate_t **pp = &dp->gates[pool_hash(g->addr, 0)];
  while (*pp != g)
    pp = &(*pp)->next;
  *pp = g->next;
  osr_free(g);
}

static void gate_unlink(dp_gate_t *g, dp_waiter_t *w)
{
  if (w->prev != NULL)
    w->prev->next = w->next;
  else
    g->head = w->next;
  if (w->next != NULL)
    w->next->prev = w->prev;
  else
    g->tail = w->prev;
  w->next = w->prev = NULL;
  g->nwait--;
}

/* Take a slot of addr's gate: 1 = taken now, 0 = queued (cb fires later),
 * OSR_EBUSY = the queue is full. *gp is the gate either way (for leave and
 * cancel). */
static int gate_enter(osr_dataplane_t *dp, const char *addr, dp_waiter_t *w, dp_gate_cb cb,
                      dp_gate_t **gp)
{
  dp_gate_t *g = gate_get(dp, addr);
  *gp = g;
  if (g->active < DP_CONNECT_CAP && g->head == NULL) {
    g->active++;
    return 1;
  }
  if (g->nwait >= DP_CONNECT_QUEUE) {
    gate_maybe_free(dp, g);
    *gp = NULL;
    return OSR_EBUSY;
  }
  w->cb = cb;
  w->since = uv_now(dp->loop);
  w->next = NULL;
  w->prev = g->tail;
  if (g->tail != NULL)
    g->tail->next = w;
  else
    g->head = w;
  g->tail = w;
  g->nwait++;
  return 0;
}

/* Give a slot back and let waiters in, oldest first. A waiter's callback
 * may leave again at once (its connect failed synchronously): the nested
 * call only counts, this loop goes on, so the stack stays flat. */
static void gate_leave(osr_dataplane_t *dp, dp_gate_t *g)
{
  g->active--;
  if (g->dispatching)
    return;
  g->dispatching = 1;
  while (g->active < DP_CONNECT_CAP && g->head != NULL) {
    dp_waiter_t *w = g->head;
    gate_unlink(g, w);
    g->active++;
    w->cb(w, 0);
  }
  g->dispatching = 0;
  gate_maybe_free(dp, g);
}

static void gate_cancel(osr_dataplane_t *dp, dp_gate_t *g, dp_waiter_t *w)
{
  gate_unlink(g, w);
  gate_maybe_free(dp, g);
}

/* Waiters older than DP_CONNECT_WAIT_MS (all of them with `all`) are told
 * OSR_ETIMEDOUT / OSR_ECANCELED. */
static void gates_expire(osr_dataplane_t *dp, int all)
{
  uint64_t now = uv_now(dp->loop);
  for (size_t b = 0; b < DP_POOL_BUCKETS; b++) {
    dp_gate_t *g = dp->gates[b];
    while (g != NULL) {
      dp_gate_t *next = g->next;
      g->dispatching = 1; /* callbacks may leave: keep g */
      while (g->head != NULL && (all || now - g->head->since >= DP_CONNECT_WAIT_MS)) {
        dp_waiter_t *w = g->head;
        gate_unlink(g, w);
        w->cb(w, all ? OSR_ECANCELED : OSR_ETIMEDOUT);
      }
      g->dispatching = 0;
      gate_maybe_free(dp, g);
      g = next;
    }
  }
}

/* ========================================================================== */
/* Port tunnels: GET /_osr/ports/{port}, Upgrade: osr-tcp -> 101 -> raw bytes   */

typedef void (*tunnel_cb)(osr_sock_t *s, int status, int http_status, void *data);

static int name_is(osr_iovec_t n, const char *s);
static size_t parse_resp_headers(const char *p, const char *e, osr_http_header_t *h, size_t max);

typedef struct tunnel_s {
  osr_sock_t *s;
  tunnel_cb cb;
  void *data;
  int err;
  int http_status; /* the agent's answer when it was not 101 */
  /* The head to send, or NULL for the osr-tcp handshake only. Freed by the
   * write callback (it may outlive the tunnel_t). */
  char *extra;
  size_t extra_len;
  uint16_t port;
  char agent_tok[65]; /* for the agent's handshake check; "" = none */
  /* Descriptor passing (unix endpoints): the handshake asks for the
   * port's socket itself and is read by `fr` (net/fdpass.h). */
  int fdpass;
  osr_fdpass_recv_t *fr;
} tunnel_t;

static void tun_on_read(osr_sock_t *s, int status);
static void tun_on_close(osr_sock_t *s);
static void tun_on_timeout(osr_sock_t *s);
static const osr_sock_events_t tun_events = {tun_on_read, tun_on_close, tun_on_timeout, NULL};

static void tun_fail(tunnel_t *t, int err)
{
  if (t->err == 0)
    t->err = err;
  osr_sock_close(t->s); /* tun_on_close reports */
}

static void tun_on_close(osr_sock_t *s)
{
  tunnel_t *t = s->data;
  if (t->fr != NULL) {
    osr_fdpass_recv_stop(t->fr, 0);
    t->fr = NULL;
  }
  osr_free(t->extra);
  t->extra = NULL;
  t->cb(NULL, t->err != 0 ? t->err : OSR_ECONNRESET, t->http_status, t->data);
  osr_free(t);
}

static void tun_on_timeout(osr_sock_t *s)
{
  tun_fail(s->data, OSR_ETIMEDOUT);
}

static void free_written(osr_sock_t *s, int status, void *arg)
{
  (void)s;
  (void)status;
  osr_free(arg);
}

/* Find the end of an HTTP head ("\r\n\r\n") in [p, p+n). */
static const char *head_end(const char *p, size_t n)
{
  for (size_t i = 3; i < n; i++)
    if (p[i] == '\n' && p[i - 1] == '\r' && p[i - 2] == '\n' && p[i - 3] == '\r')
      return p + i + 1;
  return NULL;
}

static int status_of(const char *p, size_t n)
{
  if (n < 12 || memcmp(p, "HTTP/1.", 7) != 0 || p[8] != ' ')
    return -1;
  int v = 0;
  for (int i = 9; i < 12; i++) {
    if (p[i] < '0' || p[i] > '9')
      return -1;
    v = v * 10 + (p[i] - '0');
  }
  return v;
}

static void tun_on_read(osr_sock_t *s, int status)
{
  tunnel_t *t = s->data;
  if (status < 0) {
    tun_fail(t, status == OSR_EOF ? OSR_ECONNRESET : status);
    return;
  }
  const char *p = osr_buf_data(&s->input);
  const char *e = head_end(p, s->input.len);
  if (e == NULL) {
    if (s->input.len > DP_TUNNEL_HEAD_MAX)
      tun_fail(t, OSR_EPROTO);
    return;
  }
  int code = status_of(p, (size_t)(e - p));
  if (code != 101) {
    t->http_status = code;
    tun_fail(t, OSR_EHTTP);
    return;
  }
  osr_buf_consume(&s->input, (size_t)(e - p));
  osr_sock_read_stop(s);
  osr_sock_set_idle_timeout(s, 0);
  t->cb(s, 0, 101, t->data); /* the callee sets new events */
  osr_free(t);
}

static void nop_read(osr_sock_t *s, int status)
{
  (void)s;
  (void)status;
}
static void nop_close(osr_sock_t *s)
{
  (void)s;
}
static const osr_sock_events_t nop_events = {nop_read, nop_close, NULL, NULL};

/* The stream to the port is ready on `s` (the tunnel, or the passed socket):
 * send the held request head, if any, and hand `s` over. */
static void tun_ready(tunnel_t *t, osr_sock_t *s)
{
  if (t->extra != NULL) {
    osr_iovec_t iov = osr_iov(t->extra, t->extra_len);
    char *x = t->extra;
    t->extra = NULL;
    if (osr_sock_write(s, &iov, 1, free_written, x) != 0) {
      osr_free(x);
      tun_fail(t, OSR_ECONNRESET); /* s is t->s */
      return;
    }
  }
  osr_sock_set_idle_timeout(s, 0);
  t->cb(s, 0, 101, t->data); /* the callee sets new events */
  osr_free(t);
}

/* Is `v` listed as a header value "1" for `name` in the head [p, e)? */
static int head_has(const char *p, const char *e, const char *name)
{
  osr_http_header_t h[64];
  size_t n = parse_resp_headers(p, e, h, OSR_ARRAY_SIZE(h));
  for (size_t i = 0; i < n; i++)
    if (name_is(h[i].name, name) && h[i].value.len == 1 && h[i].value.base[0] == '1')
      return 1;
  return 0;
}

/* A hostile or broken agent: whatever it sent is closed, the request gets
 * a 502 (through tun_fail), and the event is logged. */
static void tun_refuse(tunnel_t *t, const char *why)
{
  char peer[128] = "";
  (void)osr_sock_peername(t->s, peer, sizeof(peer));
  OSR_LOG_WARN(MOD, "agent %s port %u: descriptor handshake refused: %s", peer, t->port, why);
  if (t->fr != NULL) {
    osr_fdpass_recv_stop(t->fr, 0);
    t->fr = NULL;
  }
  tun_fail(t, OSR_EPROTO);
}

/* The handshake answer, read with recvmsg (net/fdpass.h). After
 * "HTTP/1.1 101 ... osr-fd: 1" comes one tag byte: 'F' with the port's
 * socket attached, or 'T' for a byte tunnel. A 101 without osr-fd is an
 * agent that does not know the extension: a tunnel as before. */
static void tun_on_fdread(osr_fdpass_recv_t *r, int status, void *data)
{
  tunnel_t *t = data;
  osr_sock_t *s = t->s;
  (void)r;
  if (status != 0) {
    if (status == OSR_EPROTO) {
      tun_refuse(t, "bad control message (more than one descriptor, or truncated)");
      return;
    }
    osr_fdpass_recv_stop(t->fr, 0);
    t->fr = NULL;
    tun_fail(t, status == OSR_EOF ? OSR_ECONNRESET : status);
    return;
  }
  const char *p = osr_buf_data(&s->input);
  const char *e = head_end(p, s->input.len);
  if (e == NULL) {
    if (s->input.len > DP_TUNNEL_HEAD_MAX)
      tun_refuse(t, "answer head too large");
    else if (osr_fdpass_recv_fd(t->fr) >= 0)
      tun_refuse(t, "a descriptor inside the answer head");
    return;
  }
  int code = status_of(p, (size_t)(e - p));
  if (code != 101) {
    osr_fdpass_recv_stop(t->fr, 0);
    t->fr = NULL;
    t->http_status = code;
    tun_fail(t, OSR_EHTTP);
    return;
  }
  size_t hl = (size_t)(e - p);
  if (!head_has(p, e, "osr-fd")) {
    if (osr_fdpass_recv_fd(t->fr) >= 0) {
      tun_refuse(t, "a descriptor that was not announced");
      return;
    }
    osr_fdpass_recv_stop(t->fr, 0);
    t->fr = NULL;
    osr_buf_consume(&s->input, hl);
    tun_ready(t, s);
    return;
  }
  if (s->input.len == hl)
    return; /* the tag byte follows */
  char tag = p[hl];
  if (tag == 'T') {
    if (osr_fdpass_recv_fd(t->fr) >= 0) {
      tun_refuse(t, "a descriptor with the tunnel tag");
      return;
    }
    osr_fdpass_recv_stop(t->fr, 0);
    t->fr = NULL;
    osr_buf_consume(&s->input, hl + 1); /* bytes after the tag are the port's */
    tun_ready(t, s);
    return;
  }
  if (tag != 'F' || s->input.len != hl + 1) {
    tun_refuse(t, tag != 'F' ? "unknown tag" : "bytes after the descriptor tag");
    return;
  }
  int fd = osr_fdpass_recv_stop(t->fr, 1);
  t->fr = NULL;
  const char *why = NULL;
  if (fd < 0) {
    tun_refuse(t, "the descriptor tag came without a descriptor");
    return;
  }
  if (osr_fdpass_check_stream(fd, &why) != 0) {
    close(fd);
    tun_refuse(t, why);
    return;
  }
  osr_sock_t *ns = NULL;
  int rv = osr_fdpass_sock_open(s->loop, fd, &ns); /* takes fd */
  if (rv != 0) {
    tun_fail(t, rv);
    return;
  }
  osr_sock_set_events(ns, &tun_events, t);
  osr_sock_set_nodelay(ns, 1);
  /* The unix connection has done its job; the port's socket replaces it. */
  osr_buf_consume(&s->input, hl + 1);
  t->s = NULL;
  osr_sock_set_events(s, &nop_events, NULL);
  osr_sock_close(s);
  t->s = ns;
  tun_ready(t, ns);
}

static void tun_on_connected(osr_sock_t *s, int status, void *data)
{
  tunnel_t *t = data;
  if (status != 0) {
    osr_free(t->extra);
    t->cb(NULL, status, 0, t->data);
    osr_free(t);
    return;
  }
  t->s = s;
  osr_sock_set_events(s, &tun_events, t);
  osr_sock_set_nodelay(s, 1);
  osr_sock_set_idle_timeout(s, DP_TUNNEL_TIMEOUT_MS);
  char *head = osr_xmalloc(256);
  int n = snprintf(head, 256,
                   "GET /_osr/ports/%u HTTP/1.1\r\nhost: localhost\r\nupgrade: osr-tcp\r\n"
                   "connection: Upgrade\r\n%s%s%s%s\r\n",
                   t->port, t->agent_tok[0] ? "x-access-token: " : "", t->agent_tok,
                   t->agent_tok[0] ? "\r\n" : "", t->fdpass ? "osr-fd: 1\r\n" : "");
  osr_iovec_t iov = osr_iov(head, (size_t)n);
  if (osr_sock_write(s, &iov, 1, free_written, head) != 0) {
    osr_free(head);
    osr_free(t->extra);
    t->extra = NULL;
    tun_fail(t, OSR_ECONNRESET);
    return;
  }
  if (t->fdpass) {
    /* The answer decides where the held head goes (the passed socket or
     * the tunnel), so nothing more is sent before it. */
    if (osr_fdpass_recv_start(s, tun_on_fdread, t, &t->fr) != 0)
      tun_fail(t, OSR_ECONNRESET);
    return;
  }
  /* Bytes for the port itself may follow at once: the agent upgrades only
   * after its connect to the port succeeded and then forwards what is in
   * its input buffer, so sending them now saves a round trip. */
  if (t->extra != NULL) {
    iov = osr_iov(t->extra, t->extra_len);
    char *x = t->extra;
    t->extra = NULL;
    if (osr_sock_write(s, &iov, 1, free_written, x) != 0) {
      osr_free(x);
      tun_fail(t, OSR_ECONNRESET);
      return;
    }
  }
  if (osr_sock_read_start(s) != 0)
    tun_fail(t, OSR_ECONNRESET);
}

/* Open a tunnel to `port` through the agent at addr. `extra` (heap, taken)
 * is sent right after the handshake request. cb fires exactly once: with
 * the raw socket (status 0, reading stopped, events to be set by the
 * callee) or an error (OSR_EHTTP with the agent's status, e.g. 502 when the
 * port is closed). `agent_tok` (may be NULL) authenticates the handshake to
 * the agent; it is never sent through the tunnel to the port itself.
 * Returns 0 or an error and cb never fires. */
static int tunnel_open(osr_dataplane_t *dp, const char *addr, int tls, uint16_t port,
                       const char *agent_tok, char *extra, size_t extra_len, tunnel_cb cb,
                       void *data)
{
  tunnel_t *t = osr_xcalloc(1, sizeof(*t));
  osr_str_copy(t->agent_tok, sizeof(t->agent_tok), agent_tok != NULL ? agent_tok : "");
  t->cb = cb;
  t->data = data;
  t->port = port;
  t->extra = extra;
  t->extra_len = extra_len;
  /* Only a unix socket can carry a descriptor, and only an agent on this
   * host (the local provider's container class, the benchmark) listens on
   * one; the agent decides whether it really can (docs/agent.md). */
  t->fdpass = !tls && strncmp(addr, "unix:", 5) == 0;
  osr_connect_opts_t co = {DP_TUNNEL_TIMEOUT_MS, tls ? dp->client_tls : NULL, NULL};
  int rv = osr_connect(dp->loop, addr, &co, tun_on_connected, t, NULL);
  if (rv != 0) {
    t->extra = NULL; /* the caller keeps ownership on a synchronous error */
    osr_free(t);
  }
  return rv;
}

/* ========================================================================== */
/* Request streams                                                             */

struct dp_stream_s {
  osr_dataplane_t *dp;
  osr_http_req_t *req;       /* NULL once on_done fired */
  osr_http_creq_t *creq;     /* NULL once its final on_body fired */
  osr_http_client_t *client; /* the upstream connection in use */
  char addr[OSR_ADDR_HOST_MAX + OSR_ADDR_PATH_MAX + 16];
  char sid[OSR_DP_SID_MAX];
  char *target; /* target_small, or heap for a longer one */
  char target_small[128];
  uint16_t port;
  int tls;
  unsigned pool_b; /* pool_hash(addr, port) */
  dp_tok_src_t tok_src;
  char agent_tok[65]; /* the agent's token (osr_agent_token), "" = none */
  int64_t req_cl;     /* -1 chunked, 0 none, >0 exact */
  int acquiring;
  int from_pool;
  int retried;
  /* request body (client -> sandbox) */
  osr_iovec_t pending; /* held chunk waiting for the upstream request */
  int has_pending;
  int req_eof;       /* the client's body is complete */
  int req_body_sent; /* the upstream request body is complete */
  int body_started;  /* some body byte went upstream */
  int creq_writing;  /* an upstream write callback is outstanding */
  /* response (sandbox -> client) */
  int responded;
  int resp_writing;
  int end_pending; /* upstream response complete, last write in flight */
  int resp_ended;  /* the client's response was ended with its last body bytes */
  char *tail;      /* a copy of those bytes (pooled block) while they are written, or NULL */
  int64_t resp_left; /* Content-Length body bytes not yet relayed, -1 unknown */
  osr_splice_xfer_t *xfer; /* the body being spliced (resp_writing is set), or NULL */
  uint64_t xfer_len;
  dp_act_t *act;   /* activity entry of the sandbox (dp_activity.h), may be NULL */
  dp_upstream_t *up; /* a remote provider's sandbox (upstream.c), NULL = osr-agent */
  /* the endpoint's connect cap (gate_*): a slot held, or a place in line */
  dp_gate_t *gate;
  dp_waiter_t wait;
  int holds_slot;
  int waiting;
};

/* One stream per proxied request: from this thread's slab (a page-backed
 * free list) rather than a malloc/free pair per request. Four streams fill
 * a page, and with C keep-alive clients the live count swings between 0
 * and C within a loop turn: 64 spare pages (256 KiB at most, kept only
 * after such a swing; glibc would keep the freed chunks too) stop a swing
 * of up to 256 streams in flight, as many as the block pool's 4 KiB cache
 * serves, from mapping and unmapping pages per request (strace: 0.3
 * mmap+munmap per request at C = 50 with 4 spare pages, 0.3 at C = 200
 * with 32). */
_Static_assert(sizeof(dp_stream_t) <= 1024, "a stream fits a slab object");
static __thread osr_slab_t stream_slab = {.size = sizeof(dp_stream_t), .max_spare = 64};

static void stream_release_slot(dp_stream_t *st)
{
  if (st->holds_slot) {
    st->holds_slot = 0;
    gate_leave(st->dp, st->gate);
  }
}

static void stream_acquire(dp_stream_t *st);

static void stream_maybe_free(dp_stream_t *st)
{
  if (st->req != NULL || st->creq != NULL || st->acquiring || st->creq_writing || st->resp_writing)
    return;
  osr_dataplane_t *dp = st->dp;
  stream_release_slot(st);
  if (st->client != NULL) {
    osr_http_client_close(st->client);
    st->client = NULL;
  }
  osr__dp_act_close(dp, st->act);
  if (st->target != st->target_small)
    osr_free(st->target);
  if (st->up != NULL)
    memset(st->up, 0, sizeof(*st->up)); /* the provider's token */
  osr_free(st->up);
  osr_slab_free(&stream_slab, st);
  dp->nstreams--;
  if (dp->stopping)
    osr__dp_maybe_finish(dp);
}

static void upstream_failed(dp_stream_t *st, int status)
{
  st->dp->n_upstream_fail++;
  if (st->req == NULL)
    return;
  if (!st->responded) {
    OSR_LOG_DEBUG(MOD, "%s: upstream %s port %u: %s", st->req->peer, st->addr, st->port,
                  osr_strerror(status));
    st->responded = 1;
    osr__dp_count(st->dp, st->port == OSR_DP_ENVD_PORT ? DP_KIND_ENVD : DP_KIND_PORT, 502);
    osr__dp_error(st->req, 502, st->sid, "The sandbox was not found");
  } else {
    OSR_LOG_DEBUG(MOD, "upstream %s port %u failed mid-response: %s", st->addr, st->port,
                  osr_strerror(status));
    osr_http_abort(st->req);
  }
}

static int name_is(osr_iovec_t n, const char *s)
{
  return osr_ascii_ieq_lower(n.base, n.len, s, strlen(s)); /* s: lower case */
}

/* Is `name` listed in a Connection header value ("close, x-foo")? */
static int in_connection(const osr_iovec_t *conn, osr_iovec_t name)
{
  if (conn == NULL)
    return 0;
  const char *p = conn->base, *e = conn->base + conn->len;
  while (p < e) {
    while (p < e && (*p == ' ' || *p == ',' || *p == '\t'))
      p++;
    const char *q = p;
    while (q < e && *q != ',' && *q != ' ' && *q != '\t')
      q++;
    if (q > p && (size_t)(q - p) == name.len && strncasecmp(p, name.base, name.len) == 0)
      return 1;
    p = q;
  }
  return 0;
}

/* Hop-by-hop and framing headers (RFC 9110 7.6.1) never cross the proxy. */
static int hop_by_hop(osr_iovec_t n)
{
  /* By length first: this runs for every header both ways. */
  switch (n.len) {
  case 2:
    return name_is(n, "te");
  case 7:
    return name_is(n, "trailer") || name_is(n, "upgrade");
  case 10:
    return name_is(n, "connection") || name_is(n, "keep-alive");
  case 14:
    return name_is(n, "content-length") || name_is(n, "http2-settings");
  case 16:
    return name_is(n, "proxy-connection");
  case 17:
    return name_is(n, "transfer-encoding");
  default:
    return 0;
  }
}

/* The client's credential is for us, not for the sandbox. */
static int is_credential(const dp_stream_t *st, osr_iovec_t n)
{
  return name_is(n, "x-access-token") ||
         (st->tok_src == DP_TOK_BEARER && name_is(n, "authorization")) ||
         (st->up != NULL && (name_is(n, "e2b-traffic-access-token") ||
                             name_is(n, "e2b-sandbox-id") || name_is(n, "e2b-sandbox-port")));
}

/* ---- response: sandbox -> client ------------------------------------------- */

static void on_resp_end_written(osr_http_req_t *req, int status, void *arg)
{
  dp_stream_t *st = arg;
  (void)req;
  (void)status;
  st->resp_writing = 0;
  stream_maybe_free(st);
}

/* The upstream response is complete and no write to the client points into
 * the upstream connection's input any more: the connection can be reused
 * (or closed), and the client's response ended. */
static void upstream_done(dp_stream_t *st)
{
  osr_http_client_t *c = st->client;
  st->client = NULL;
  st->dp->n_forwarded++;
  if (c != NULL && st->req_body_sent && !st->creq_writing)
    pool_put(st->dp, st->pool_b, st->addr, st->port, st->tls, c);
  else if (c != NULL)
    osr_http_client_close(c);
  if (st->req != NULL && !st->resp_ended) {
    st->resp_writing = 1;
    int wrv = osr_http_write(st->req, NULL, 0, 1, on_resp_end_written, st);
    if (wrv != 0) {
      OSR_LOG_DEBUG(MOD, "response end: %s", osr_strerror(wrv));
      st->resp_writing = 0;
      osr_http_abort(st->req);
    }
  }
}

/* A spliced body (splice_body) ended: the rest of the response (its last
 * byte, then the end) comes through the parser as usual. */
static void on_body_spliced(osr_splice_xfer_t *x, int status, void *data)
{
  dp_stream_t *st = data;
  (void)x;
  st->xfer = NULL;
  st->resp_writing = 0;
  if (status == 0) {
    st->dp->m.bytes_out += st->xfer_len;
    if (st->resp_left > 0)
      st->resp_left -= (int64_t)st->xfer_len;
    osr_http_creq_raw_done(st->creq);
    return;
  }
  /* The sandbox ended mid-body, or either side failed: the client cannot
   * get the whole body (abort closes it), and the upstream connection is
   * out of step (cancel closes it). on_done and the final on_body follow. */
  OSR_LOG_DEBUG(MOD, "upstream %s port %u: spliced body: %s", st->addr, st->port,
                osr_strerror(status));
  osr_http_creq_cancel(st->creq); /* its final on_body comes later */
  if (st->req != NULL)
    osr_http_abort(st->req); /* on_done may run now; st lives on (creq) */
}

/* Stop a spliced body because one side went away (the other is ended by
 * the caller). */
static void stream_stop_xfer(dp_stream_t *st)
{
  if (st->xfer == NULL)
    return;
  osr_splice_xfer_cancel(st->xfer);
  st->xfer = NULL;
  st->resp_writing = 0;
}

/* After a chunk was written (so the head is out and the upstream input
 * holds nothing else): move the rest of a large Content-Length body with
 * splice(2), sandbox socket -> client socket, past user space (STYLE 16).
 * Only HTTP/1.1 over cleartext on both sides (the protocol layers decline
 * everything else: TLS, HTTP/2, chunked). Returns 1 if the splice runs. */
static int splice_body(dp_stream_t *st)
{
  if (st->req == NULL || !osr_splice_is_enabled())
    return 0;
  uint64_t n = osr_http_creq_raw_avail(st->creq);
  if (n < OSR_SPLICE_MIN_XFER)
    return 0;
  osr_sock_t *down = osr_http_raw_body(st->req, n);
  if (down == NULL)
    return 0;
  osr_sock_t *up = osr_http_creq_raw_take(st->creq, n);
  int rv =
      up != NULL ? osr_splice_xfer_start(up, down, n, on_body_spliced, st, &st->xfer) : OSR_EINVAL;
  if (rv != 0) {
    /* Both layers counted the bytes: the exchange cannot go on. */
    OSR_LOG_DEBUG(MOD, "splice body: %s", osr_strerror(rv));
    osr_http_abort(st->req);
    return 1;
  }
  st->xfer_len = n;
  st->resp_writing = 1; /* the splice writes to the client now */
  return 1;
}

static void on_resp_written(osr_http_req_t *req, int status, void *arg)
{
  dp_stream_t *st = arg;
  (void)req;
  st->resp_writing = 0;
  if (st->tail != NULL) {
    /* A copied last chunk: the upstream was not held for it. */
    osr_block_put(OSR_BLOCK_4K, st->tail);
    st->tail = NULL;
  } else if (status == 0 && st->creq != NULL) {
    if (!splice_body(st))
      osr_http_creq_release(st->creq); /* read the next chunk */
  } else if (status == 0 && st->end_pending) {
    st->end_pending = 0;
    upstream_done(st);
  }
  /* On error the request's on_done follows and cancels the upstream. */
  stream_maybe_free(st);
}

static void creq_on_response(osr_http_creq_t *r, int status, const osr_http_header_t *h, size_t n,
                             void *data)
{
  dp_stream_t *st = data;
  (void)r;
  if (st->req == NULL) {
    stream_release_slot(st);
    return;
  }
  osr_http_header_t out[DP_RESP_HEADERS_MAX];
  size_t k = 0;
  int64_t cl = -1;
  const osr_iovec_t *conn = NULL;
  for (size_t i = 0; i < n; i++)
    if (name_is(h[i].name, "connection"))
      conn = &h[i].value;
  /* The common "Connection: keep-alive" names only a header hop_by_hop
   * drops anyway: skip scanning it once per header. */
  if (conn != NULL && name_is(*conn, "keep-alive"))
    conn = NULL;
  for (size_t i = 0; i < n && k < DP_RESP_HEADERS_MAX; i++) {
    if (name_is(h[i].name, "content-length")) {
      /* Digits only (the parser checked them); 18 fit an int64_t. */
      const char *d = h[i].value.base;
      size_t len = h[i].value.len, j = 0;
      int64_t v = 0;
      while (j < len && j < 18 && d[j] >= '0' && d[j] <= '9')
        v = v * 10 + (d[j++] - '0');
      if (len > 0 && j == len)
        cl = v;
      continue;
    }
    if (hop_by_hop(h[i].name) || in_connection(conn, h[i].name) || name_is(h[i].name, "date"))
      continue;
    out[k++] = h[i];
  }
  st->responded = 1;
  st->resp_left = cl;
  stream_release_slot(st); /* the upstream has answered: it was accepted */
  osr__dp_count(st->dp, st->port == OSR_DP_ENVD_PORT ? DP_KIND_ENVD : DP_KIND_PORT, status);
  if (osr_http_respond(st->req, status, out, k, cl) != 0)
    osr_http_abort(st->req);
}

static void creq_on_body(osr_http_creq_t *r, const osr_iovec_t *chunk, int status, void *data)
{
  dp_stream_t *st = data;
  if (status == 0) {
    if (st->req == NULL || chunk->len == 0)
      return;
    st->dp->m.bytes_out += chunk->len;
    /* The last bytes of a Content-Length body end the client's response in
     * the same write: its completion ends the exchange (req_on_done leaves
     * the upstream request to finish on its own), with no empty write and
     * no loop turn of its own after the upstream message completes. If
     * they fit a pooled block they are copied, so the upstream is not held:
     * its message completes right after this callback and the connection
     * is back in the pool before the client's write even completed. */
    int end = 0;
    if (st->resp_left >= 0) {
      st->resp_left -= (int64_t)chunk->len;
      end = st->resp_left == 0;
    }
    osr_iovec_t out = *chunk;
    if (end && chunk->len <= osr_block_size(OSR_BLOCK_4K))
      st->tail = osr_block_get(OSR_BLOCK_4K);
    if (st->tail != NULL) {
      memcpy(st->tail, chunk->base, chunk->len);
      out = osr_iov(st->tail, chunk->len);
    } else {
      osr_http_creq_hold(r);
    }
    st->resp_writing = 1;
    st->resp_ended = end;
    int wrv = osr_http_write(st->req, &out, 1, end, on_resp_written, st);
    if (wrv != 0) {
      OSR_LOG_DEBUG(MOD, "response write: %s", osr_strerror(wrv));
      st->resp_writing = 0;
      st->resp_ended = 0;
      if (st->tail != NULL) {
        osr_block_put(OSR_BLOCK_4K, st->tail);
        st->tail = NULL;
      } else {
        osr_http_creq_release(r);
      }
      osr_http_abort(st->req);
    }
    return;
  }
  /* Final callback: the creq is freed when we return. A spliced body
   * reads its socket: stop it first (the connection failed, so the client
   * is aborted below). */
  stream_stop_xfer(st);
  st->creq = NULL;
  osr_http_client_t *c = st->client;
  st->client = NULL;
  if (status == OSR_EOF) {
    st->client = c;
    /* The last chunk may still be on its way to the client, pointing into
     * this connection's input: hand the connection back only after it
     * (a copied one points at st->tail instead). */
    if (st->resp_writing && st->tail == NULL)
      st->end_pending = 1;
    else
      upstream_done(st);
  } else {
    if (c != NULL)
      osr_http_client_close(c);
    /* A pooled connection the server had already closed: try once more on
     * a fresh one if nothing of the request body went out yet. */
    if (st->req != NULL && !st->responded && st->from_pool && !st->retried && !st->body_started &&
        status != OSR_ECANCELED) {
      st->retried = 1;
      stream_acquire(st);
    } else if (status != OSR_ECANCELED) {
      upstream_failed(st, status);
    }
  }
  stream_maybe_free(st);
}

static const osr_http_client_events_t creq_events = {creq_on_response, creq_on_body};

/* ---- request body: client -> sandbox ---------------------------------------- */

static void write_body_end(dp_stream_t *st);

static void on_creq_written(osr_http_creq_t *r, int status, void *arg)
{
  dp_stream_t *st = arg;
  (void)r;
  st->creq_writing = 0;
  if (status == 0 && st->req != NULL) {
    if (st->req_cl > 0 && st->req_eof)
      st->req_body_sent = 1;
    osr_http_req_release(st->req);
    if (st->req_eof && !st->req_body_sent)
      write_body_end(st);
  } else if (status != 0 && st->req != NULL && st->responded) {
    osr_http_abort(st->req);
  }
  stream_maybe_free(st);
}

static void on_creq_end_written(osr_http_creq_t *r, int status, void *arg)
{
  dp_stream_t *st = arg;
  (void)r;
  st->creq_writing = 0;
  if (status == 0)
    st->req_body_sent = 1;
  stream_maybe_free(st);
}

static void write_body_end(dp_stream_t *st)
{
  if (st->creq == NULL || st->creq_writing || st->req_body_sent)
    return;
  if (st->req_cl >= 0) {
    /* Content-Length bodies end with their last byte (http.h). */
    st->req_body_sent = 1;
    return;
  }
  st->creq_writing = 1;
  if (osr_http_creq_write(st->creq, NULL, 0, 1, on_creq_end_written, st) != 0) {
    st->creq_writing = 0;
    osr_http_creq_cancel(st->creq);
  }
}

static void write_body_chunk(dp_stream_t *st, const osr_iovec_t *chunk)
{
  st->creq_writing = 1;
  st->body_started = 1;
  if (osr_http_creq_write(st->creq, chunk, 1, 0, on_creq_written, st) != 0) {
    st->creq_writing = 0;
    osr_http_req_release(st->req);
    osr_http_creq_cancel(st->creq);
  }
}

static void req_on_body(osr_http_req_t *req, const osr_iovec_t *chunk, int status)
{
  dp_stream_t *st = req->data;
  if (status == 0) {
    if (chunk->len == 0 || st->req_cl == 0)
      return;
    st->dp->m.bytes_in += chunk->len;
    osr_http_req_hold(req); /* the chunk stays in the server's input */
    if (st->creq == NULL) {
      st->pending = *chunk; /* sent once the upstream request exists */
      st->has_pending = 1;
      return;
    }
    write_body_chunk(st, chunk);
    return;
  }
  if (status == OSR_EOF) {
    st->req_eof = 1;
    if (st->req_cl == 0)
      st->req_body_sent = 1;
    else if (st->creq != NULL && !st->creq_writing)
      write_body_end(st);
  }
  /* Errors: on_done follows. */
}

static void req_on_done(osr_http_req_t *req, int status)
{
  dp_stream_t *st = req->data;
  st->req = NULL;
  st->has_pending = 0;
  stream_stop_xfer(st); /* it writes to the client's socket */
  if (st->waiting) {
    st->waiting = 0;
    st->acquiring = 0;
    gate_cancel(st->dp, st->gate, &st->wait);
  }
  /* The client is gone (or the exchange ended): an upstream request still
   * running must not deliver into freed request memory. Cancel closes the
   * upstream connection if the request is on the wire; its final on_body
   * follows and frees the stream. A response that was relayed whole (its
   * last body bytes ended it) leaves nothing to deliver: the upstream
   * request only has its message end to parse, then goes back to the pool
   * (creq_on_body, upstream_done). */
  if (st->creq != NULL && !(status == 0 && st->resp_ended))
    osr_http_creq_cancel(st->creq);
  stream_maybe_free(st);
}

/* ---- issuing the upstream request ------------------------------------------- */

static int stream_issue(dp_stream_t *st)
{
  osr_http_req_t *req = st->req;
  size_t n = req->num_headers;
  /* The header array only lives for the call that writes the upstream
   * head (the client copies it there): on the stack unless it is long. */
  osr_http_header_t h_small[36];
  osr_http_header_t *h = h_small, *h_heap = NULL;
  if (n + 4 > sizeof(h_small) / sizeof(h_small[0])) {
    h = h_heap = osr_try_malloc((n + 4) * sizeof(*h));
    if (h == NULL)
      return OSR_ENOMEM;
  }
  const osr_iovec_t *conn = osr_http_req_header(req, "connection");
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    osr_iovec_t nm = req->headers[i].name;
    if (hop_by_hop(nm) || in_connection(conn, nm) || is_credential(st, nm) || name_is(nm, "host") ||
        name_is(nm, "expect") || (nm.len > 0 && nm.base[0] == ':'))
      continue;
    h[k++] = req->headers[i];
  }
  /* Only to the agent's own API: through a tunnel the request goes to the
   * sandbox's application, which must never see the agent's token. */
  if (st->port == OSR_DP_ENVD_PORT && st->agent_tok[0] != '\0') {
    h[k].name = osr_iov("X-Access-Token", 14);
    h[k].value = osr_iov(st->agent_tok, strlen(st->agent_tok));
    k++;
  }
  /* A remote provider's sandbox: its Host form and its own credential
   * (the client's was dropped above with the other credential headers);
   * envd gets X-Access-Token, other ports the traffic token if one is set,
   * as E2B's SDK sends them. */
  char up_auth[320], up_port[8];
  if (st->up != NULL) {
    const char *t = st->port == OSR_DP_ENVD_PORT ? st->up->token : st->up->traffic;
    if (t[0] != '\0') {
      h[k].name = st->port == OSR_DP_ENVD_PORT ? osr_iov("X-Access-Token", 14)
                                               : osr_iov("e2b-traffic-access-token", 24);
      h[k].value = osr_iov(t, strlen(t));
      k++;
    }
    snprintf(up_auth, sizeof(up_auth), "%u-%s", st->port, st->up->host);
    if (!st->up->by_host) {
      /* An override address (E2B_SANDBOX_URL's): E2B's proxy routes by
       * these there, as for the SDK; ours replace the client's, which name
       * OSR's sandbox id. */
      size_t dot = strcspn(st->up->host, ".");
      snprintf(up_port, sizeof(up_port), "%u", st->port);
      h[k].name = osr_iov("E2b-Sandbox-Id", 14);
      h[k].value = osr_iov(st->up->host, dot);
      k++;
      h[k].name = osr_iov("E2b-Sandbox-Port", 16);
      h[k].value = osr_iov(up_port, strlen(up_port));
      k++;
    }
  }
  char method[32];
  size_t ml = req->method.len < sizeof(method) - 1 ? req->method.len : sizeof(method) - 1;
  memcpy(method, req->method.base, ml);
  method[ml] = '\0';
  /* The authority is copied into the head by the call below: a stack copy
   * serves unless it is long. */
  char auth_small[256];
  char *auth_heap = NULL;
  const char *auth = NULL;
  if (st->up != NULL) {
    auth = up_auth;
  } else if (req->authority.len >= sizeof(auth_small)) {
    auth = auth_heap = osr_xstrndup(req->authority.base, req->authority.len);
  } else if (req->authority.len > 0) {
    memcpy(auth_small, req->authority.base, req->authority.len);
    auth_small[req->authority.len] = '\0';
    auth = auth_small;
  }
  osr_http_client_req_t cr = {
      .method = method,
      .target = st->target,
      .authority = auth,
      .headers = h,
      .nheaders = k,
      .content_length = st->req_cl,
  };
  int rv = osr_http_client_request(st->client, &cr, &creq_events, st, &st->creq);
  osr_free(h_heap);
  osr_free(auth_heap);
  return rv;
}

static void stream_acquired(dp_stream_t *st, osr_http_client_t *c, int status)
{
  st->acquiring = 0;
  if (status == 0 && (st->req == NULL || st->dp->stopping)) {
    pool_put(st->dp, st->pool_b, st->addr, st->port, st->tls, c);
    stream_maybe_free(st);
    return;
  }
  if (status != 0) {
    stream_release_slot(st);
    upstream_failed(st, status);
    stream_maybe_free(st);
    return;
  }
  st->client = c;
  int rv = stream_issue(st);
  if (rv != 0) {
    st->client = NULL;
    osr_http_client_close(c);
    st->creq = NULL;
    if (st->from_pool && rv == OSR_ECLOSED) {
      stream_acquire(st); /* a dead pooled connection: take another */
      return;
    }
    upstream_failed(st, rv);
    stream_maybe_free(st);
    return;
  }
  if (st->has_pending) {
    st->has_pending = 0;
    write_body_chunk(st, &st->pending);
  } else if (st->req_eof) {
    write_body_end(st);
  }
}

static void on_client_connected(osr_http_client_t *c, int status, void *data)
{
  stream_acquired(data, c, status);
}

static void on_tunnel_for_stream(osr_sock_t *s, int status, int http_status, void *data)
{
  dp_stream_t *st = data;
  stream_release_slot(st); /* the agent answered the handshake */
  if (status != 0) {
    if (http_status > 0)
      OSR_LOG_DEBUG(MOD, "tunnel to port %u refused by the agent: HTTP %d", st->port, http_status);
    stream_acquired(st, NULL, status);
    return;
  }
  osr_http_client_t base;
  memset(&base, 0, sizeof(base));
  base.loop = st->dp->loop;
  base.authority = (char *)"localhost";
  osr_http_limits_defaults(&base.limits);
  base.limits.max_body = UINT64_MAX / 2;
  base.idle_timeout_ms = st->dp->cfg.upstream_idle_ms;
  osr_http_client_t *c = NULL;
  int rv = osr__http1_client_new(s, &base, &c); /* closes s on error */
  stream_acquired(st, rv == 0 ? c : NULL, rv);
}

static void stream_connect(dp_stream_t *st);

/* Too many connects to this endpoint are in flight and the wait was too
 * long (or the line is full): a typed 503 the client can back off on. */
static void stream_busy(dp_stream_t *st)
{
  st->dp->n_upstream_fail++;
  if (st->req == NULL || st->responded)
    return;
  OSR_LOG_INFO(MOD, "%s: %s port %u: connect cap reached, 503", st->req->peer, st->addr, st->port);
  st->responded = 1;
  osr__dp_count(st->dp, st->port == OSR_DP_ENVD_PORT ? DP_KIND_ENVD : DP_KIND_PORT, 503);
  osr__dp_error_typed(st->req, 503, st->sid, "upstream_busy",
                      "too many connections to the sandbox are being opened; retry");
}

static void stream_gate_cb(dp_waiter_t *w, int status)
{
  dp_stream_t *st = osr_container_of(w, dp_stream_t, wait);
  st->waiting = 0;
  if (status == 0) {
    st->holds_slot = 1;
    if (st->req == NULL || st->dp->stopping) {
      st->acquiring = 0;
      stream_maybe_free(st); /* releases the slot */
      return;
    }
    stream_connect(st);
    return;
  }
  st->acquiring = 0;
  stream_busy(st);
  stream_maybe_free(st);
}

static void stream_acquire(dp_stream_t *st)
{
  osr_dataplane_t *dp = st->dp;
  /* A retry (st->retried) always takes a fresh connection. */
  osr_http_client_t *c = st->retried ? NULL : pool_get(dp, st->pool_b, st->addr, st->port, st->tls);
  if (c != NULL) {
    st->from_pool = 1;
    stream_acquired(st, c, 0);
    return;
  }
  st->from_pool = 0;
  st->acquiring = 1;
  if (!st->holds_slot) {
    int g = gate_enter(dp, st->addr, &st->wait, stream_gate_cb, &st->gate);
    if (g == 0) {
      st->waiting = 1; /* stream_gate_cb goes on */
      return;
    }
    if (g < 0) {
      st->acquiring = 0;
      stream_busy(st);
      stream_maybe_free(st);
      return;
    }
    st->holds_slot = 1;
  }
  stream_connect(st);
}

/* Open a fresh upstream connection (a slot of the gate is held). */
static void stream_connect(dp_stream_t *st)
{
  osr_dataplane_t *dp = st->dp;
  int rv;
  if (st->port == OSR_DP_ENVD_PORT || st->up != NULL) {
    osr_http_client_opts_t o;
    memset(&o, 0, sizeof(o));
    o.tls = st->tls ? dp->client_tls : NULL;
    o.connect_timeout_ms = DP_TUNNEL_TIMEOUT_MS;
    o.idle_timeout_ms = dp->cfg.upstream_idle_ms;
    o.limits.max_body = UINT64_MAX / 2; /* streamed: never buffered whole */
    rv = osr_http_client_connect(dp->loop, st->addr, &o, on_client_connected, st);
  } else {
    rv = tunnel_open(dp, st->addr, st->tls, st->port, st->agent_tok, NULL, 0, on_tunnel_for_stream,
                     st);
  }
  if (rv != 0) {
    st->acquiring = 0;
    upstream_failed(st, rv);
    stream_maybe_free(st);
  }
}

/* ========================================================================== */
/* Upgrades: one tunnel per request, then splice                               */

/* Upgraded tunnels are relayed by net/splice.c; the data plane only keeps
 * a list of them so a stop can close them all. */
struct dp_splice_s {
  osr_dataplane_t *dp;
  dp_splice_t *prev, *next;
  osr_splice_t *sp;
  dp_act_t *act; /* an open tunnel keeps its sandbox active (dp_activity.h) */
};

static void on_splice_closed(osr_splice_t *sp, void *data)
{
  dp_splice_t *w = data;
  osr_dataplane_t *dp = w->dp;
  (void)sp;
  if (w->prev != NULL)
    w->prev->next = w->next;
  else
    dp->splices = w->next;
  if (w->next != NULL)
    w->next->prev = w->prev;
  osr__dp_act_close(dp, w->act);
  osr_free(w);
  dp->nsplices--;
  if (dp->stopping)
    osr__dp_maybe_finish(dp);
}

void osr__dp_splices_close(osr_dataplane_t *dp)
{
  for (dp_splice_t *w = dp->splices; w != NULL; w = w->next)
    osr_splice_close(w->sp);
}

static dp_splice_t *splice_new(osr_dataplane_t *dp, osr_sock_t *upstream)
{
  dp_splice_t *w = osr_xcalloc(1, sizeof(*w));
  w->dp = dp;
  w->next = dp->splices;
  if (dp->splices != NULL)
    dp->splices->prev = w;
  dp->splices = w;
  dp->nsplices++;
  w->sp = osr_splice_new(upstream, on_splice_closed, w);
  return w;
}

typedef struct dp_upg_s {
  osr_dataplane_t *dp;
  osr_http_req_t *req;
  char sid[OSR_DP_SID_MAX];
  /* the endpoint's connect cap, as for streams: the tunnel is opened once
   * a slot is ours, and the slot is given back when the agent answered */
  dp_gate_t *gate;
  dp_waiter_t wait;
  int holds_slot;
  /* what tunnel_open needs, kept while waiting for a slot */
  char *head;
  size_t head_len;
  char addr[OSR_ADDR_HOST_MAX + OSR_ADDR_PATH_MAX + 16];
  int tls;
  uint16_t port;
  int remote; /* a remote provider's port: connect to addr directly, no agent */
} dp_upg_t;

static void upg_release_slot(dp_upg_t *u)
{
  if (u->holds_slot) {
    u->holds_slot = 0;
    gate_leave(u->dp, u->gate);
  }
}

static void upg_req_done(osr_http_req_t *req, int status)
{
  dp_upg_t *u = req->data;
  (void)status;
  u->req = NULL;
}

static void upg_free(dp_upg_t *u)
{
  osr_dataplane_t *dp = u->dp;
  upg_release_slot(u);
  osr_free(u->head);
  osr_free(u);
  dp->nstreams--;
  if (dp->stopping)
    osr__dp_maybe_finish(dp);
}

/* Parse the header lines of a response head [p, e) into h (slices). */
static size_t parse_resp_headers(const char *p, const char *e, osr_http_header_t *h, size_t max)
{
  size_t n = 0;
  const char *l = memchr(p, '\n', (size_t)(e - p));
  l = l != NULL ? l + 1 : e;
  while (l < e && n < max) {
    const char *nl = memchr(l, '\n', (size_t)(e - l));
    if (nl == NULL)
      break;
    const char *end = nl > l && nl[-1] == '\r' ? nl - 1 : nl;
    const char *colon = memchr(l, ':', (size_t)(end - l));
    if (colon != NULL && colon > l) {
      const char *v = colon + 1;
      while (v < end && (*v == ' ' || *v == '\t'))
        v++;
      const char *ve = end;
      while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
        ve--;
      h[n].name = osr_iov(l, (size_t)(colon - l));
      h[n].value = osr_iov(v, (size_t)(ve - v));
      if (!name_is(h[n].name, "date"))
        n++;
    }
    l = nl + 1;
  }
  return n;
}

static void on_upg_head_read(osr_sock_t *s, int status);
static void on_upg_close(osr_sock_t *s);
static const osr_sock_events_t upg_events = {on_upg_head_read, on_upg_close, NULL, NULL};

/* While waiting for the sandbox's answer head, the tunnel socket belongs to
 * the dp_upg_t. */
static void on_upg_close(osr_sock_t *s)
{
  dp_upg_t *u = s->data;
  if (u->req != NULL) {
    osr__dp_count(u->dp, DP_KIND_UPGRADE, 502);
    u->req->on_done = NULL;
    osr__dp_error(u->req, 502, u->sid, "the port closed the connection");
  }
  upg_free(u);
}

static void on_upg_head_read(osr_sock_t *s, int status)
{
  dp_upg_t *u = s->data;
  if (status < 0 || u->req == NULL) {
    osr_sock_close(s);
    return;
  }
  const char *p = osr_buf_data(&s->input);
  const char *e = head_end(p, s->input.len);
  if (e == NULL) {
    if (s->input.len > DP_TUNNEL_HEAD_MAX)
      osr_sock_close(s);
    return;
  }
  osr_http_req_t *req = u->req;
  int code = status_of(p, (size_t)(e - p));
  if (code != 101) {
    /* MVP: only switching answers are relayed on this path; anything else
     * (the server refused the upgrade) is reported, not streamed. */
    char msg[96];
    snprintf(msg, sizeof(msg), "the port answered the upgrade with HTTP %d", code);
    osr__dp_count(u->dp, DP_KIND_UPGRADE, 502);
    u->req = NULL;
    req->on_done = NULL;
    osr__dp_error(req, 502, u->sid, msg);
    osr_sock_close(s); /* on_upg_close frees u */
    return;
  }
  osr_http_header_t h[64];
  size_t n = parse_resp_headers(p, e, h, OSR_ARRAY_SIZE(h));
  osr_sock_read_stop(s);
  dp_splice_t *sp = splice_new(u->dp, s);
  sp->act = osr__dp_act_open(u->dp, u->sid);
  osr__dp_count(u->dp, DP_KIND_UPGRADE, 101);
  req->on_done = NULL;
  u->req = NULL;
  osr_splice_t *relay = sp->sp; /* sp may be freed once the relay closes */
  int rv = osr_http_upgrade(req, h, n, osr_splice_attach, relay); /* copies h */
  osr_buf_consume(&s->input, (size_t)(e - p));              /* after the copy: h pointed into it */
  u->dp->n_forwarded++;
  upg_free(u);
  if (rv != 0) {
    osr__dp_error(req, 502, NULL, "upgrade failed");
    osr_splice_attach(NULL, OSR_ECANCELED, relay);
  }
}

static void on_upg_tunnel(osr_sock_t *s, int status, int http_status, void *data)
{
  dp_upg_t *u = data;
  upg_release_slot(u); /* the agent answered (or never will) */
  if (status != 0) {
    u->dp->n_upstream_fail++;
    if (u->req != NULL) {
      osr__dp_count(u->dp, DP_KIND_UPGRADE, 502);
      u->req->on_done = NULL;
      osr__dp_error(u->req, 502, u->sid,
                    http_status == 502 ? "nothing listens on that port in the sandbox"
                                       : "The sandbox was not found");
    }
    upg_free(u);
    return;
  }
  if (u->req == NULL) {
    osr_sock_set_events(s, &upg_events, u);
    osr_sock_close(s);
    return;
  }
  osr_sock_set_events(s, &upg_events, u);
  osr_sock_set_idle_timeout(s, DP_TUNNEL_TIMEOUT_MS);
  osr_sock_read_start(s);
}

/* The request head as the sandbox sees it: our credential removed, the
 * rest (Connection, Upgrade, Sec-WebSocket-*) unchanged. For a remote
 * provider's sandbox (`up`), its Host form and its own credential instead,
 * as for plain requests (stream_head). */
static char *upgrade_head(const osr_http_req_t *req, const char *target, dp_tok_src_t src,
                          const dp_upstream_t *up, uint16_t port, size_t *len)
{
  osr_buf_t b;
  osr_buf_init(&b, 256 * 1024);
  int rv;
  if (up != NULL) {
    rv = osr_buf_appendf(&b, "%.*s %s HTTP/1.1\r\nhost: %u-%s\r\n", (int)req->method.len,
                         req->method.base, target, port, up->host);
    if (rv == 0 && up->traffic[0] != '\0')
      rv = osr_buf_appendf(&b, "e2b-traffic-access-token: %s\r\n", up->traffic);
    if (rv == 0 && !up->by_host)
      rv = osr_buf_appendf(&b, "e2b-sandbox-id: %.*s\r\ne2b-sandbox-port: %u\r\n",
                           (int)strcspn(up->host, "."), up->host, port);
  } else {
    rv = osr_buf_appendf(&b, "%.*s %s HTTP/1.1\r\nhost: %.*s\r\n", (int)req->method.len,
                         req->method.base, target, (int)req->authority.len, req->authority.base);
  }
  for (size_t i = 0; rv == 0 && i < req->num_headers; i++) {
    osr_iovec_t nm = req->headers[i].name;
    if (name_is(nm, "host") || name_is(nm, "x-access-token") ||
        (src == DP_TOK_BEARER && name_is(nm, "authorization")) ||
        (up != NULL && (name_is(nm, "e2b-traffic-access-token") || name_is(nm, "e2b-sandbox-id") ||
                        name_is(nm, "e2b-sandbox-port"))))
      continue;
    rv = osr_buf_appendf(&b, "%.*s: %.*s\r\n", (int)nm.len, nm.base, (int)req->headers[i].value.len,
                         req->headers[i].value.base);
  }
  if (rv == 0)
    rv = osr_buf_append(&b, "\r\n", 2);
  if (rv != 0) {
    osr_buf_dispose(&b);
    return NULL;
  }
  return osr_buf_release(&b, len);
}

static void on_upg_head_written(osr_sock_t *s, int status, void *arg)
{
  (void)s;
  (void)status; /* a failed write ends the read of the answer too */
  osr_free(arg);
}

/* A remote provider's port: connected straight to it (TLS as configured);
 * send the upgrade head, then read the answer as after an agent tunnel. */
static void on_upg_connected(osr_sock_t *s, int status, void *data)
{
  dp_upg_t *u = data;
  if (status != 0) {
    upg_release_slot(u);
    u->dp->n_upstream_fail++;
    if (u->req != NULL) {
      osr__dp_count(u->dp, DP_KIND_UPGRADE, 502);
      u->req->on_done = NULL;
      osr__dp_error(u->req, 502, u->sid, "the provider's sandbox could not be reached");
    }
    upg_free(u);
    return;
  }
  osr_iovec_t iov = osr_iov(u->head, u->head_len);
  if (osr_sock_write(s, &iov, 1, on_upg_head_written, u->head) == 0)
    u->head = NULL; /* the write callback frees it */
  else if (u->req != NULL) {
    /* closing reports 502 (on_upg_close) and frees u */
    osr_sock_set_events(s, &upg_events, u);
    osr_sock_close(s);
    upg_release_slot(u);
    return;
  }
  on_upg_tunnel(s, 0, 0, u);
}

/* Open the tunnel (a slot is held); answers the request on failure. */
static void upg_open(dp_upg_t *u)
{
  osr_dataplane_t *dp = u->dp;
  if (u->remote) {
    osr_connect_opts_t co = {DP_TUNNEL_TIMEOUT_MS, u->tls ? dp->client_tls : NULL, NULL};
    if (osr_connect(dp->loop, u->addr, &co, on_upg_connected, u, NULL) != 0) {
      if (u->req != NULL) {
        u->req->on_done = NULL;
        osr__dp_error(u->req, 502, u->sid, "the provider's sandbox could not be reached");
      }
      upg_free(u);
    }
    return;
  }
  char agent_tok[65] = "";
  if (dp->cfg.agent_secret != NULL)
    (void)osr_agent_token(dp->cfg.agent_secret, u->sid, agent_tok);
  char *head = u->head;
  u->head = NULL; /* tunnel_open takes it on success */
  int rv = tunnel_open(dp, u->addr, u->tls, u->port, agent_tok, head, u->head_len, on_upg_tunnel, u);
  if (rv != 0) {
    osr_free(head);
    if (u->req != NULL) {
      u->req->on_done = NULL;
      osr__dp_error(u->req, 502, u->sid, "The sandbox was not found");
    }
    upg_free(u);
  }
}

static void upg_gate_cb(dp_waiter_t *w, int status)
{
  dp_upg_t *u = osr_container_of(w, dp_upg_t, wait);
  if (status == 0) {
    u->holds_slot = 1;
    if (u->req == NULL || u->dp->stopping) {
      upg_free(u); /* the client went away while waiting */
      return;
    }
    upg_open(u);
    return;
  }
  u->dp->n_upstream_fail++;
  if (u->req != NULL) {
    osr__dp_count(u->dp, DP_KIND_UPGRADE, 503);
    u->req->on_done = NULL;
    osr__dp_error_typed(u->req, 503, u->sid, "upstream_busy",
                        "too many connections to the sandbox are being opened; retry");
  }
  upg_free(u);
}

static void forward_upgrade(osr_dataplane_t *dp, osr_http_req_t *req, const char *addr, int tls,
                            uint16_t port, const char *target, const char *sid,
                            dp_tok_src_t tok_src, const dp_upstream_t *up)
{
  size_t hl = 0;
  char *head = upgrade_head(req, target, tok_src, up, port, &hl);
  if (head == NULL) {
    osr__dp_error(req, 431, sid, "request head too large");
    return;
  }
  dp_upg_t *u = osr_xcalloc(1, sizeof(*u));
  u->dp = dp;
  u->req = req;
  osr_str_copy(u->sid, sizeof(u->sid), sid);
  dp->nstreams++;
  osr__dp_act_close(dp, osr__dp_act_open(dp, sid)); /* the attempt is activity too */
  req->data = u;
  req->on_done = upg_req_done;
  u->head = head;
  u->head_len = hl;
  osr_str_copy(u->addr, sizeof(u->addr), addr);
  u->tls = tls;
  u->port = port;
  u->remote = up != NULL;
  int g = gate_enter(dp, addr, &u->wait, upg_gate_cb, &u->gate);
  if (g == 0)
    return; /* upg_gate_cb goes on */
  if (g < 0) {
    upg_gate_cb(&u->wait, OSR_EBUSY);
    return;
  }
  u->holds_slot = 1;
  upg_open(u);
}

/* ========================================================================== */

static int wants_upgrade(const osr_http_req_t *req)
{
  return req->version == 11 && !req->expect_body && osr_http_req_header(req, "upgrade") != NULL;
}

static void forward(osr_dataplane_t *dp, osr_http_req_t *req, const char *addr, int tls,
                    uint16_t port, const char *target, const char *sid, dp_tok_src_t tok_src,
                    const dp_upstream_t *up)
{
  if (port != OSR_DP_ENVD_PORT && wants_upgrade(req)) {
    forward_upgrade(dp, req, addr, tls, port, target, sid, tok_src, up);
    return;
  }
  dp_stream_t *st = osr_slab_xalloc(&stream_slab);
  st->dp = dp;
  st->req = req;
  osr_str_copy(st->addr, sizeof(st->addr), addr);
  osr_str_copy(st->sid, sizeof(st->sid), sid);
  size_t tl = strlen(target);
  if (tl < sizeof(st->target_small)) {
    memcpy(st->target_small, target, tl + 1);
    st->target = st->target_small;
  } else {
    st->target = osr_xstrdup(target);
  }
  st->port = port;
  st->tls = tls;
  st->pool_b = pool_hash(addr, port);
  st->tok_src = tok_src;
  if (up != NULL) {
    st->up = osr_xmalloc(sizeof(*st->up));
    memcpy(st->up, up, sizeof(*up));
  } else if (dp->cfg.agent_secret != NULL) {
    agent_token_for(dp, st->pool_b, addr, port, tls, sid, st->agent_tok);
  }
  st->act = osr__dp_act_open(dp, sid);
  st->req_cl = !req->expect_body ? 0 : req->content_length >= 0 ? req->content_length : -1;
  if (st->req_cl == 0)
    st->req_body_sent = 1;
  dp->nstreams++;
  req->data = st;
  req->on_body = req_on_body;
  req->on_done = req_on_done;
  stream_acquire(st);
}

void osr__dp_forward(osr_dataplane_t *dp, osr_http_req_t *req, const char *addr, int tls,
                     uint16_t port, const char *target, const char *sid, dp_tok_src_t tok_src)
{
  forward(dp, req, addr, tls, port, target, sid, tok_src, NULL);
}

void osr__dp_forward_upstream(osr_dataplane_t *dp, osr_http_req_t *req, const char *addr, int tls,
                              uint16_t port, const char *target, const char *sid,
                              dp_tok_src_t tok_src, const dp_upstream_t *up)
{
  forward(dp, req, addr, tls, port, target, sid, tok_src, up);
}
