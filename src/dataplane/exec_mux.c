/*
 * Shared h2c connections to agent endpoints for exec sessions (see
 * exec_mux.h for the contract, docs/dataplane.md for the operator's view).
 *
 * Table: endpoints hashed by connect address, each with a list of
 * connections. A connection is "connecting" (client NULL, waiters queued)
 * or "open" (client set). Which one a new lease goes to: the first whose
 * lease count is below its capacity, so connections fill one after the
 * other and the last ones go idle first when load drops.
 *
 * Capacity of a connection = min(exec_mux_sessions, max_streams / 2),
 * where max_streams is what the agent allows (its SETTINGS); until those
 * SETTINGS arrived nghttp2 assumes 100, and a connection still connecting
 * counts with that too. A burst of sessions at a new endpoint therefore
 * spreads over several connections instead of queueing streams inside
 * nghttp2 beyond what the agent allows, where they would wait for other
 * sessions to end.
 *
 * Lifetime: the mux owns each client and closes it only when it has no
 * leases (idle timeout, dead, stop). A session's requests on it end before
 * the session releases its lease (exec.c), so no request outlives its
 * client.
 */
#include <stdio.h>
#include <string.h>

#include "dataplane/exec_mux.h"
#include "util/log.h"
#include "util/mem.h"

#define MOD               OSR_DP_MOD
#define DP_MUX_BUCKETS    64
#define DP_MUX_REFUSED_MS 60000
#define DP_MUX_CONNECT_MS 10000
/* Streams nghttp2 lets a client open before the peer's SETTINGS arrive. */
#define DP_MUX_PRE_SETTINGS_STREAMS 100

typedef struct dp_muxep_s dp_muxep_t;

struct dp_muxconn_s {
  dp_muxep_t *ep;
  dp_muxconn_t *next;        /* ep->conns */
  osr_http_client_t *client; /* NULL while connecting */
  dp_mux_lease_t *waiters;   /* leases waiting for the connect (FIFO) */
  dp_mux_lease_t **wtail;
  size_t nlease; /* attached + waiting */
  uint64_t idle_since;
};

struct dp_muxep_s {
  dp_muxep_t *next; /* bucket */
  dp_mux_t *mux;
  char *addr;
  dp_muxconn_t *conns;
  size_t nconns;
  uint64_t refused_until; /* loop time; 0 = speaks h2c (as far as we know) */
};

struct dp_mux_s {
  osr_dataplane_t *dp;
  dp_muxep_t *buckets[DP_MUX_BUCKETS];
  size_t nconns;
  size_t nconnecting; /* connect callbacks still to come (stop waits) */
};

static unsigned ep_hash(const char *addr)
{
  return osr__dp_hash_str(addr) % DP_MUX_BUCKETS;
}

static dp_mux_t *mux_get(osr_dataplane_t *dp)
{
  if (dp->mux == NULL) {
    dp->mux = osr_xcalloc(1, sizeof(*dp->mux));
    dp->mux->dp = dp;
  }
  return dp->mux;
}

static dp_muxep_t *ep_find(dp_mux_t *m, const char *addr, int create)
{
  unsigned b = ep_hash(addr);
  for (dp_muxep_t *ep = m->buckets[b]; ep != NULL; ep = ep->next)
    if (strcmp(ep->addr, addr) == 0)
      return ep;
  if (!create)
    return NULL;
  dp_muxep_t *ep = osr_xcalloc(1, sizeof(*ep));
  ep->mux = m;
  ep->addr = osr_xstrdup(addr);
  ep->next = m->buckets[b];
  m->buckets[b] = ep;
  return ep;
}

static void ep_free(dp_muxep_t *ep)
{
  dp_muxep_t **pp = &ep->mux->buckets[ep_hash(ep->addr)];
  while (*pp != ep)
    pp = &(*pp)->next;
  *pp = ep->next;
  osr_free(ep->addr);
  osr_free(ep);
}

static uint32_t conn_capacity(const osr_dataplane_t *dp, const dp_muxconn_t *mc)
{
  uint32_t streams =
      mc->client != NULL ? osr_http_client_max_streams(mc->client) : DP_MUX_PRE_SETTINGS_STREAMS;
  uint32_t cap = streams / 2;
  if (cap > dp->cfg.exec_mux_sessions)
    cap = (uint32_t)dp->cfg.exec_mux_sessions;
  return cap;
}

static int conn_is_dead(const dp_muxconn_t *mc)
{
  return mc->client != NULL && osr_http_client_max_streams(mc->client) == 0;
}

/* Unlink and close a connection without leases. */
static void conn_unlink(dp_muxconn_t *mc);

static void conn_close(dp_muxconn_t *mc)
{
  conn_unlink(mc);
  if (mc->client != NULL)
    osr_http_client_close(mc->client); /* frees itself once the socket is gone */
  mc->client = NULL;
  osr_free(mc);
}

static void conn_unlink(dp_muxconn_t *mc)
{
  dp_muxep_t *ep = mc->ep;
  dp_muxconn_t **pp = &ep->conns;
  while (*pp != mc)
    pp = &(*pp)->next;
  *pp = mc->next;
  ep->nconns--;
  ep->mux->nconns--;
}

static void on_connected(osr_http_client_t *c, int status, void *data)
{
  dp_muxconn_t *mc = data;
  dp_muxep_t *ep = mc->ep;
  osr_dataplane_t *dp = ep->mux->dp;
  ep->mux->nconnecting--;
  if (status == 0 && osr_http_client_version(c) != 20) {
    /* Cannot happen with prior knowledge; refuse rather than multiplex
     * sessions over one HTTP/1.1 connection. */
    osr_http_client_close(c);
    status = OSR_EPROTO;
  }
  if (status != 0) {
    OSR_LOG_DEBUG(MOD, "exec mux %s: connect: %s", ep->addr, osr_strerror(status));
    dp->n_upstream_fail++;
    conn_unlink(mc); /* a waiter's callback must not find it again */
  } else {
    mc->client = c;
    OSR_LOG_DEBUG(MOD, "exec mux %s: connection %zu up", ep->addr, ep->nconns);
  }
  /* Each waiter may release or acquire from its callback: take them off
   * the list one at a time. */
  while (mc->waiters != NULL) {
    dp_mux_lease_t *l = mc->waiters;
    mc->waiters = l->_next;
    if (mc->waiters == NULL)
      mc->wtail = &mc->waiters;
    l->_next = NULL;
    dp_mux_cb cb = l->_cb;
    l->_cb = NULL;
    if (status != 0) {
      l->_conn = NULL;
      mc->nlease--;
    } else {
      l->client = c;
    }
    cb(l, status);
  }
  if (status != 0) {
    osr_free(mc);
  } else if (mc->nlease == 0) {
    mc->idle_since = uv_now(dp->loop);
    if (dp->stopping)
      conn_close(mc);
  }
  if (dp->stopping)
    osr__dp_maybe_finish(dp); /* last: it may free dp */
}

static int conn_open(dp_muxep_t *ep, dp_muxconn_t **out)
{
  osr_dataplane_t *dp = ep->mux->dp;
  dp_muxconn_t *mc = osr_xcalloc(1, sizeof(*mc));
  mc->ep = ep;
  mc->wtail = &mc->waiters;
  osr_http_client_opts_t o;
  memset(&o, 0, sizeof(o));
  o.h2_prior_knowledge = 1;
  o.connect_timeout_ms = DP_MUX_CONNECT_MS;
  o.idle_timeout_ms = dp->cfg.upstream_idle_ms;
  o.limits.max_body = UINT64_MAX / 2; /* output streams are open-ended */
  osr_http_limits_defaults(&o.limits);
  /* Every session may hold a full stream window (a client that stopped
   * reading): the connection's credit covers all of them, so a held
   * stream never stalls the others (exec_mux.h). */
  uint64_t cw = (uint64_t)o.limits.h2_window * (dp->cfg.exec_mux_sessions + 1);
  o.limits.h2_conn_window = cw > INT32_MAX ? INT32_MAX : (uint32_t)cw;
  int rv = osr_http_client_connect(dp->loop, ep->addr, &o, on_connected, mc);
  if (rv != 0) {
    osr_free(mc);
    return rv;
  }
  mc->next = ep->conns;
  ep->conns = mc;
  ep->nconns++;
  ep->mux->nconns++;
  ep->mux->nconnecting++;
  *out = mc;
  return 0;
}

int osr__dp_mux_usable(osr_dataplane_t *dp, const char *addr, int tls)
{
  if (tls || dp->cfg.exec_mux_off)
    return 0;
  dp_muxep_t *ep = dp->mux != NULL ? ep_find(dp->mux, addr, 0) : NULL;
  return ep == NULL || ep->refused_until == 0 || uv_now(dp->loop) >= ep->refused_until;
}

int osr__dp_mux_acquire(osr_dataplane_t *dp, const char *addr, dp_mux_lease_t *l, dp_mux_cb cb)
{
  dp_mux_t *m = mux_get(dp);
  dp_muxep_t *ep = ep_find(m, addr, 1);
  dp_muxconn_t *pick = NULL;
  memset(l, 0, sizeof(*l));
  for (dp_muxconn_t *mc = ep->conns, *next; mc != NULL; mc = next) {
    next = mc->next;
    if (conn_is_dead(mc)) {
      if (mc->nlease == 0)
        conn_close(mc);
      continue;
    }
    if (pick == NULL && mc->nlease < conn_capacity(dp, mc))
      pick = mc;
  }
  if (pick == NULL) {
    if (ep->nconns >= dp->cfg.exec_mux_conns)
      return OSR_EBUSY;
    int rv = conn_open(ep, &pick);
    if (rv != 0) {
      if (ep->nconns == 0)
        ep_free(ep);
      return rv;
    }
  }
  pick->nlease++;
  l->_conn = pick;
  if (pick->client != NULL) {
    l->client = pick->client;
    return 1;
  }
  l->_cb = cb;
  *pick->wtail = l;
  pick->wtail = &l->_next;
  return 0;
}

int osr__dp_mux_is_leased(const dp_mux_lease_t *l)
{
  return l->_conn != NULL;
}

void osr__dp_mux_release(dp_mux_lease_t *l)
{
  dp_muxconn_t *mc = l->_conn;
  if (mc == NULL)
    return;
  if (l->client == NULL) {
    /* Still waiting: off the queue, its callback never fires. */
    dp_mux_lease_t **pp = &mc->waiters;
    while (*pp != NULL && *pp != l)
      pp = &(*pp)->_next;
    if (*pp == l) {
      *pp = l->_next;
      if (mc->wtail == &l->_next)
        mc->wtail = pp;
    }
  }
  memset(l, 0, sizeof(*l));
  if (--mc->nlease > 0)
    return;
  osr_dataplane_t *dp = mc->ep->mux->dp;
  mc->idle_since = uv_now(dp->loop);
  if (mc->client != NULL && (dp->stopping || conn_is_dead(mc)))
    conn_close(mc);
}

void osr__dp_mux_refused(osr_dataplane_t *dp, const char *addr)
{
  dp_muxep_t *ep = ep_find(mux_get(dp), addr, 1);
  if (ep->refused_until == 0)
    OSR_LOG_INFO(MOD, "exec: %s does not speak h2c; its sessions use HTTP/1.1 for %d s", addr,
                 DP_MUX_REFUSED_MS / 1000);
  ep->refused_until = uv_now(dp->loop) + DP_MUX_REFUSED_MS;
}

void osr__dp_mux_sweep(osr_dataplane_t *dp, uint64_t max_idle_ms)
{
  dp_mux_t *m = dp->mux;
  if (m == NULL)
    return;
  uint64_t now = uv_now(dp->loop);
  for (size_t b = 0; b < DP_MUX_BUCKETS; b++) {
    for (dp_muxep_t *ep = m->buckets[b], *enext; ep != NULL; ep = enext) {
      enext = ep->next;
      for (dp_muxconn_t *mc = ep->conns, *next; mc != NULL; mc = next) {
        next = mc->next;
        if (mc->client == NULL || mc->nlease > 0)
          continue; /* connecting (on_connected decides) or in use */
        if (max_idle_ms == 0 || conn_is_dead(mc) || now - mc->idle_since >= max_idle_ms)
          conn_close(mc);
      }
      if (max_idle_ms == 0 || (ep->refused_until != 0 && now >= ep->refused_until))
        ep->refused_until = 0;
      if (ep->conns == NULL && ep->refused_until == 0)
        ep_free(ep);
    }
  }
  if (dp->stopping && m->nconns == 0 && m->nconnecting == 0) {
    int empty = 1;
    for (size_t b = 0; b < DP_MUX_BUCKETS && empty; b++)
      empty = m->buckets[b] == NULL;
    if (empty) {
      osr_free(m);
      dp->mux = NULL;
    }
  }
}

size_t osr__dp_mux_nconns(const osr_dataplane_t *dp)
{
  return dp->mux != NULL ? dp->mux->nconns : 0;
}

int osr__dp_mux_busy(const osr_dataplane_t *dp)
{
  return dp->mux != NULL && dp->mux->nconnecting > 0;
}
