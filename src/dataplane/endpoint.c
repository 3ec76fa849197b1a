/*
 * Agent endpoint refresh (docs/dataplane.md, "Endpoint refresh").
 *
 * A token names the agent endpoint its sandbox had when the token was
 * signed. Where that can change while the token lives (a resume on another
 * host, a migration) the gateway rewrites the binding in the Redis binding
 * cache, so with Redis configured the data plane asks the cache, and keeps
 * each answer in process for endpoint_ttl_ms (2 s) so a busy sandbox costs
 * one Redis read per TTL, not one per request.
 *
 * The lookup never holds a request: a request whose sandbox has no fresh
 * entry goes where the current knowledge says (the stale cached endpoint,
 * else the token's) while a background read refreshes it. New connections
 * therefore follow a changed endpoint within TTL + one Redis round trip,
 * and a Redis outage costs nothing but staleness. A cache entry that is
 * missing, malformed, ended or has no endpoint means "use the token's".
 *
 * Memory: at most DP_EP_MAX entries; when full, expired entries are
 * dropped, and if none is expired the whole cache is (a one-off burst of
 * Redis reads, never unbounded growth).
 */
#include <stdio.h>
#include <string.h>

#include "cache/redis.h"
#include "dataplane/dp_int.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/text.h"

#define MOD        OSR_DP_MOD
#define EP_BUCKETS 1024
#define DP_EP_MAX  20000

typedef struct ep_s {
  struct ep_s *next;
  char sid[OSR_DP_SID_MAX];
  char endpoint[1024]; /* "" = the cache has none: use the token's */
  uint64_t fetched;   /* uv_now of the answer; 0 = never answered */
  int busy;           /* a Redis read is in flight */
} ep_t;

struct dp_epcache_s {
  ep_t *buckets[EP_BUCKETS];
  size_t count;
};

typedef struct ep_lookup_s {
  osr_dataplane_t *dp;
  char sid[OSR_DP_SID_MAX];
} ep_lookup_t;

static unsigned ep_hash(const char *sid)
{
  return osr__dp_hash_str(sid) % EP_BUCKETS;
}

static ep_t *ep_find(dp_epcache_t *c, const char *sid)
{
  for (ep_t *e = c->buckets[ep_hash(sid)]; e != NULL; e = e->next)
    if (strcmp(e->sid, sid) == 0)
      return e;
  return NULL;
}

/* Drop entries: expired ones (all when `all`), never one with a read in
 * flight (its answer finds it by id). */
static void ep_prune(osr_dataplane_t *dp, dp_epcache_t *c, int all)
{
  uint64_t now = uv_now(dp->loop);
  for (size_t b = 0; b < EP_BUCKETS; b++) {
    ep_t **pp = &c->buckets[b];
    while (*pp != NULL) {
      ep_t *e = *pp;
      if (!e->busy && (all || now - e->fetched >= dp->cfg.endpoint_ttl_ms)) {
        *pp = e->next;
        c->count--;
        osr_free(e);
      } else {
        pp = &e->next;
      }
    }
  }
}

static void on_binding(int status, const osr_binding_t *b, void *data)
{
  ep_lookup_t *l = data;
  osr_dataplane_t *dp = l->dp;
  dp_epcache_t *c = dp->epcache;
  ep_t *e = c != NULL ? ep_find(c, l->sid) : NULL;
  if (e != NULL) {
    e->busy = 0;
    if (status == 0 || status == OSR_ENOTFOUND || status == OSR_EPROTO) {
      const char *ep = "";
      if (status == 0 && (b->state == OSR_BINDING_RUNNING || b->state == OSR_BINDING_PAUSED))
        ep = b->agent_endpoint;
      if (strcmp(e->endpoint, ep) != 0 && e->fetched != 0)
        OSR_LOG_INFO(MOD, "sandbox %s: agent endpoint now %s", l->sid, ep[0] ? ep : "(token's)");
      osr_str_copy(e->endpoint, sizeof(e->endpoint), ep);
      e->fetched = uv_now(dp->loop) | 1;
    } else {
      /* Redis down or slow: keep what we had; the next request retries. */
      dp->m.ep_lookup_fail++;
    }
  }
  osr_free(l);
}

const char *osr__dp_endpoint_for(osr_dataplane_t *dp, const char *sid)
{
  dp_epcache_t *c = dp->epcache;
  if (dp->redis == NULL || dp->stopping)
    return NULL;
  if (c == NULL)
    c = dp->epcache = osr_xcalloc(1, sizeof(*c));
  ep_t *e = ep_find(c, sid);
  uint64_t now = uv_now(dp->loop);
  if (e != NULL && e->fetched != 0 && now - e->fetched < dp->cfg.endpoint_ttl_ms) {
    dp->m.ep_from_cache++;
    return e->endpoint[0] ? e->endpoint : NULL;
  }
  if (e == NULL) {
    if (c->count >= DP_EP_MAX) {
      ep_prune(dp, c, 0);
      if (c->count >= DP_EP_MAX)
        ep_prune(dp, c, 1);
      if (c->count >= DP_EP_MAX)
        return NULL; /* every entry has a read in flight: skip the cache */
    }
    e = osr_xcalloc(1, sizeof(*e));
    osr_str_copy(e->sid, sizeof(e->sid), sid);
    unsigned b = ep_hash(sid);
    e->next = c->buckets[b];
    c->buckets[b] = e;
    c->count++;
  }
  if (!e->busy && osr_redis_is_connected(dp->redis)) {
    ep_lookup_t *l = osr_xcalloc(1, sizeof(*l));
    l->dp = dp;
    osr_str_copy(l->sid, sizeof(l->sid), sid);
    if (osr_redis_get_binding(dp->redis, sid, on_binding, l) == 0) {
      e->busy = 1;
      dp->m.ep_lookups++;
    } else {
      osr_free(l);
      dp->m.ep_lookup_fail++;
    }
  }
  return e->endpoint[0] ? e->endpoint : NULL;
}

void osr__dp_endpoint_forget(osr_dataplane_t *dp, const char *sid)
{
  dp_epcache_t *c = dp->epcache;
  if (c == NULL)
    return;
  ep_t *e = ep_find(c, sid);
  if (e != NULL && !e->busy)
    e->fetched = 0; /* stale: the next request reads Redis again */
}

void osr__dp_endpoint_free(osr_dataplane_t *dp)
{
  dp_epcache_t *c = dp->epcache;
  if (c == NULL)
    return;
  for (size_t b = 0; b < EP_BUCKETS; b++) {
    ep_t *e = c->buckets[b];
    while (e != NULL) {
      ep_t *n = e->next;
      osr_free(e);
      e = n;
    }
  }
  osr_free(c);
  dp->epcache = NULL;
}
