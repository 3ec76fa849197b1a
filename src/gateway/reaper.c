/*
 * The reaper (see reaper.h for what it enforces). One pass is a chain of
 * asynchronous steps on the loop thread, one store or provider call at a
 * time, so a pass never floods the store or a provider and never blocks:
 *
 *   0. stale creates: bindings still creating after stale_creating_ms, of
 *      any gateway, are resolved like recovery at start does (adopt what
 *      the provider has under their label, fail the rest; shared code in
 *      create.c, osr__resolve_creating), audited "reap.stale_creating".
 *      This is what cleans up after a gateway that died and never came
 *      back, since recovery at start only takes a gateway's own rows;
 *   1. snapshot the live bindings (creating, running, paused), page by page
 *      (on a pass that does not list the providers, only those whose TTL or
 *      idle timeout has passed: the store filters);
 *   2. count bindings per state for the sandboxes{state} gauge (one
 *      GROUP BY in the store);
 *   3. TTL and idle: for each expired live binding, re-read it (a timeout
 *      extension or a kill may have happened since the snapshot), destroy
 *      the provider resource, mark it ended;
 *   4. per provider (on the first pass, then every reconcile_interval_ms):
 *      list the resources carrying our label; each one without
 *      a live binding on that provider (fresh read) is an orphan and is
 *      destroyed; each running/paused binding of the snapshot whose resource
 *      is missing is re-read and, if it still points at that resource, is
 *      marked lost. The listing is matched against the snapshot inside the
 *      adapter's callback; only the resources that match no snapshot entry
 *      (rare: orphans, creates newer than the snapshot) are kept, as ids,
 *      for the fresh reads, so a pass holds no copy of the provider's list
 *      (about 1.6 KB per resource). An adapter with list_page() is walked
 *      one page (PROVIDER_PAGE resources) per call, each page matched as it
 *      arrives; one with only list() hands its whole list in one callback.
 *
 * No loop turn of a pass grows with the number of live sandboxes: the
 * snapshot is kept in fixed-size blocks with a hash index on the sandbox id
 * (appending a store page costs O(page), nothing is sorted), provider lists
 * come a page per call, and the scans over the snapshot (steps 3 and 4) stop
 * after SCAN_STEP entries and resume on the next loop turn (a zero timer, so
 * the loop polls for I/O in between). Only a list()-only adapter's answer is
 * still matched in one turn.
 *
 * Races with the API are settled by re-reading the binding right before
 * acting, and by the create flow's write order (the row names the provider
 * before the provider is called), so a resource being created is never
 * taken for an orphan.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "gateway/activity.h"
#include "gateway/metrics.h"
#include "gateway/reaper.h"
#include "gateway/sandboxes.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/text.h"

#define MOD "reaper"
#define PAGE 500
#define MAX_LIVE 200000
#define STATE_SLOTS 8
#define CHUNK         1024 /* snapshot entries per block */
#define SCAN_STEP     4096 /* snapshot entries examined per loop turn */
#define PROVIDER_PAGE 256  /* resources per list_page() call */

typedef struct live_s {
  char id[OSR_ID_MAX];
  char tenant[OSR_TENANT_MAX];
  char provider[OSR_NAME_MAX];
  char provider_id[128];
  osr_binding_state_t state;
  int64_t expires_ms, idle_timeout_ms, last_activity_ms;
  uint32_t hash; /* of id, for growing the index without rehashing ids */
  int seen;   /* its resource was in the provider's list */
  int acted;  /* ended by this pass */
} live_t;

/* A listed resource that matched no snapshot entry: read its binding. */
typedef struct unmatched_s {
  char provider_id[128];
  char sandbox_id[OSR_NAME_MAX];
} unmatched_t;

typedef struct once_s {
  void (*cb)(osr_reaper_t *r, int status, void *data);
  void *data;
  struct once_s *next;
} once_t;

struct osr_reaper_s {
  osr_gw_t *gw;
  uv_timer_t timer;
  uv_timer_t step; /* a pass's next step, on a later loop turn */
  void (*resume)(osr_reaper_t *r);
  int handles; /* open uv handles; r is freed at 0 */
  int running, stopping, again;
  int reconcile;               /* this pass lists the providers (step 4) */
  int reconciled_once;
  uint64_t reconcile_at;       /* uv_now of the last pass that listed them */
  void (*stop_cb)(void *data);
  void *stop_data;
  once_t *once;                /* waiting for the pass in progress */
  once_t *once_next;           /* waiting for the next pass */
  osr_gw_auth_t who;

  /* pass state */
  int64_t pass_start_ms;
  uint64_t pass_t0_us;         /* uv_hrtime of the pass's start, for the trace line */
  live_t **chunk;              /* the snapshot: entry i is chunk[i / CHUNK][i % CHUNK] */
  size_t nlive, nchunk_cap;
  uint32_t *index;        /* open addressing over ids: entry + 1, 0 = empty */
  size_t index_cap;       /* 0 or a power of two > 2 * nlive */
  uint64_t pages, yields; /* provider pages and scan yields of this pass */
  uint64_t max_step_us;   /* longest step of this pass (trace line) */
  uint64_t counts[STATE_SLOTS];
  char cursor[512];            /* a store page's, then a provider page's */
  size_t xi;                   /* expiry scan */
  const char *reason;          /* "ttl" | "idle" for xi */
  osr_binding_t cur;           /* fresh copy being acted on */
  size_t pi;                   /* provider */
  osr_provider_t *p;
  unmatched_t *res;            /* this provider's unmatched resources */
  size_t nres, rescap, ri;
  size_t li;                   /* lost scan */
};

static void pass_live_page(osr_reaper_t *r);
static void pass_count_page(osr_reaper_t *r);
static void pass_expire(osr_reaper_t *r);
static void pass_provider(osr_reaper_t *r);
static void pass_resource(osr_reaper_t *r);
static void pass_lost(osr_reaper_t *r);
static void pass_end(osr_reaper_t *r, int status);

static live_t *live_at(osr_reaper_t *r, size_t i)
{
  return &r->chunk[i / CHUNK][i % CHUNK];
}

static void index_put(uint32_t *index, size_t cap, uint32_t hash, uint32_t entry)
{
  size_t k = hash & (cap - 1);
  while (index[k] != 0)
    k = (k + 1) & (cap - 1);
  index[k] = entry + 1;
}

/* Append an entry to the snapshot: O(1) but for the index's doubling, which
 * moves 4-byte entries only (each entry keeps its hash). */
static live_t *live_add(osr_reaper_t *r, const char *id)
{
  if (r->nlive % CHUNK == 0) {
    size_t c = r->nlive / CHUNK;
    if (c == r->nchunk_cap) {
      r->nchunk_cap = r->nchunk_cap ? 2 * r->nchunk_cap : 16;
      r->chunk = osr_xrealloc(r->chunk, r->nchunk_cap * sizeof(*r->chunk));
    }
    r->chunk[c] = osr_xmalloc(CHUNK * sizeof(live_t));
  }
  if (2 * (r->nlive + 1) >= r->index_cap) {
    size_t cap = r->index_cap ? 2 * r->index_cap : 2 * CHUNK;
    uint32_t *index = osr_xcalloc(cap, sizeof(*index));
    for (size_t i = 0; i < r->nlive; i++)
      index_put(index, cap, live_at(r, i)->hash, (uint32_t)i);
    osr_free(r->index);
    r->index = index;
    r->index_cap = cap;
  }
  live_t *l = live_at(r, r->nlive);
  memset(l, 0, sizeof(*l));
  osr_str_copy(l->id, sizeof(l->id), id);
  l->hash = osr_fnv1a_str(l->id);
  index_put(r->index, r->index_cap, l->hash, (uint32_t)r->nlive);
  r->nlive++;
  return l;
}

static live_t *find_live(osr_reaper_t *r, const char *id)
{
  if (r->nlive == 0)
    return NULL;
  uint32_t h = osr_fnv1a_str(id);
  for (size_t k = h & (r->index_cap - 1); r->index[k] != 0; k = (k + 1) & (r->index_cap - 1)) {
    live_t *l = live_at(r, r->index[k] - 1);
    if (l->hash == h && strcmp(l->id, id) == 0)
      return l;
  }
  return NULL;
}

static void live_free(osr_reaper_t *r)
{
  for (size_t c = 0; c < (r->nlive + CHUNK - 1) / CHUNK; c++)
    osr_free(r->chunk[c]);
  osr_freep(&r->chunk);
  osr_freep(&r->index);
  r->nlive = r->nchunk_cap = r->index_cap = 0;
}

/* Time a step that may scale with its input (the trace line's "longest
 * step"): pass the value step_begin() returned. */
static uint64_t step_begin(void)
{
  return uv_hrtime() / 1000;
}

static void step_end(osr_reaper_t *r, uint64_t t0)
{
  uint64_t d = uv_hrtime() / 1000 - t0;
  if (d > r->max_step_us)
    r->max_step_us = d;
}

static void on_step(uv_timer_t *t)
{
  osr_reaper_t *r = t->data;
  if (r->stopping) {
    pass_end(r, 0);
    return;
  }
  uint64_t t0 = step_begin();
  r->resume(r);
  step_end(r, t0);
}

/* Go on with fn on a later loop turn, after the loop polled for I/O. */
static void yield(osr_reaper_t *r, void (*fn)(osr_reaper_t *r))
{
  r->yields++;
  r->resume = fn;
  uv_timer_start(&r->step, on_step, 0, 0);
}

static void audit(osr_reaper_t *r, const char *tenant, const char *action, const char *id,
                  const char *outcome, json_t *detail)
{
  snprintf(r->who.tenant, sizeof(r->who.tenant), "%s", tenant ? tenant : "");
  osr_gw_audit(r->gw, &r->who, action, id, outcome, detail);
  if (r->gw->metrics != NULL && strcmp(outcome, "ok") == 0)
    osr_metrics_reaper(r->gw->metrics, action + 5 /* after "reap." */);
}

/* ---- 1. live snapshot ---------------------------------------------------- */

static void live_listed(int status, const osr_binding_t *items, size_t n, const char *next,
                        void *data)
{
  osr_reaper_t *r = data;
  if (status != 0) {
    pass_end(r, status);
    return;
  }
  uint64_t t0 = step_begin();
  for (size_t i = 0; i < n && r->nlive < MAX_LIVE; i++) {
    live_t *l = live_add(r, items[i].id);
    osr_str_copy(l->tenant, sizeof(l->tenant), items[i].tenant);
    osr_str_copy(l->provider, sizeof(l->provider), items[i].provider);
    osr_str_copy(l->provider_id, sizeof(l->provider_id), items[i].provider_id);
    l->state = items[i].state;
    l->expires_ms = items[i].expires_ms;
    l->idle_timeout_ms = items[i].idle_timeout_ms;
    l->last_activity_ms = items[i].last_activity_ms;
  }
  step_end(r, t0);
  if (next != NULL && r->nlive < MAX_LIVE) {
    snprintf(r->cursor, sizeof(r->cursor), "%s", next);
    pass_live_page(r);
    return;
  }
  r->cursor[0] = '\0';
  pass_count_page(r);
}

static void pass_live_page(osr_reaper_t *r)
{
  osr_store_query_t q;
  memset(&q, 0, sizeof(q));
  q.state_mask = (1u << OSR_BINDING_CREATING) | (1u << OSR_BINDING_RUNNING) |
                 (1u << OSR_BINDING_PAUSED);
  q.limit = PAGE;
  q.cursor = r->cursor[0] ? r->cursor : NULL;
  /* A pass that does not list the providers needs only the bindings whose
   * TTL or idle timeout has passed; the store filters (O(due) rows to the
   * loop instead of O(live)). One due after the pass started is the next
   * pass's. */
  if (!r->reconcile)
    q.due_at_ms = r->pass_start_ms;
  /* Off the creates' path: the store's background worker (store.h). */
  q.background = 1;
  int rv = osr_store_list(r->gw->store, &q, live_listed, r);
  if (rv != 0)
    pass_end(r, rv);
}

/* ---- 2. counts per state --------------------------------------------------- */

static void counted(int status, const uint64_t *counts, size_t n, void *data)
{
  osr_reaper_t *r = data;
  /* A failed count leaves the gauges as they were rather than at zero. */
  if (status == 0 && r->gw->metrics != NULL) {
    for (size_t s = 0; s < n && s < STATE_SLOTS; s++)
      r->counts[s] = counts[s];
    osr_metrics_sandboxes(r->gw->metrics, r->counts, STATE_SLOTS);
  }
  r->xi = 0;
  pass_expire(r);
}

static void pass_count_page(osr_reaper_t *r)
{
  int rv = osr_store_count_by_state(r->gw->store, NULL, counted, r);
  if (rv != 0)
    counted(rv, NULL, 0, r);
}

/* ---- 3. TTL and idle ------------------------------------------------------ */

static const char *expiry_reason(int64_t now, osr_binding_state_t state, int64_t expires_ms,
                                 int64_t idle_ms, int64_t last_ms)
{
  if (state != OSR_BINDING_RUNNING && state != OSR_BINDING_PAUSED)
    return NULL;
  if (expires_ms > 0 && expires_ms <= now)
    return "ttl";
  if (idle_ms > 0 && last_ms > 0 && last_ms + idle_ms <= now)
    return "idle";
  return NULL;
}

/* End r->cur, which was read from the store as it is in r->cur now: a
 * compare-and-set on the state and version (updated_ms) read, like the
 * create's and recovery's updates. Between that read and this write the
 * reaper waited for a provider call, and meanwhile the row may have been
 * killed, extended (POST .../timeout, E2B connect), or ended by another
 * gateway's reaper: an unconditional write would overwrite that change
 * without seeing it (and audit an action on a row it no longer describes).
 * The loser gets OSR_ECONFLICT and leaves the row as it is; if the resource
 * is in fact gone, the next pass's reconciliation marks it lost. Touches
 * (data-plane activity) do not move updated_ms, so an idle reap that races
 * new traffic still wins: the resource was destroyed before the write. */
static int end_cur(osr_reaper_t *r, osr_binding_state_t to, const char *reason,
                   osr_store_done_cb cb)
{
  osr_store_update_opts_t o;
  memset(&o, 0, sizeof(o));
  o.if_state = r->cur.state;
  o.if_updated_ms = r->cur.updated_ms;
  int64_t now = osr_now_ms();
  /* Never write the version the condition compares against: an update in
   * the same millisecond as the read must still be a new version. */
  if (now <= r->cur.updated_ms)
    now = r->cur.updated_ms + 1;
  r->cur.state = to;
  r->cur.ended_ms = now;
  r->cur.updated_ms = now;
  snprintf(r->cur.end_reason, sizeof(r->cur.end_reason), "%s", reason);
  return osr_store_update_ex(r->gw->store, &r->cur, &o, cb, r);
}

static void expire_next(osr_reaper_t *r)
{
  osr_binding_dispose(&r->cur);
  osr_binding_init(&r->cur);
  r->xi++;
  pass_expire(r);
}

static void expire_stored(int status, void *data)
{
  osr_reaper_t *r = data;
  live_t *l = live_at(r, r->xi);
  if (status == 0) {
    l->acted = 1;
    osr__cache_invalidate(r->gw, r->cur.id);
    char action[16];
    snprintf(action, sizeof(action), "reap.%s", r->reason);
    audit(r, r->cur.tenant, action, r->cur.id, "ok",
          json_pack("{s:s,s:s}", "provider", r->cur.provider, "providerId", r->cur.provider_id));
  } else if (status == OSR_ECONFLICT) {
    OSR_LOG_INFO(MOD, "%s changed while its provider resource was destroyed; left as it is",
                 r->cur.id);
  } else {
    OSR_LOG_WARN(MOD, "ending %s: %s", r->cur.id, osr__err_text(status));
  }
  expire_next(r);
}

static void expire_destroyed(osr_provider_t *p, int status, void *data)
{
  osr_reaper_t *r = data;
  if (status != 0 && status != OSR_PERR_NOT_FOUND) {
    /* Keep the binding live so the next pass tries again. */
    OSR_LOG_WARN(MOD, "%s: destroying %s (%s) failed: %s", p ? p->name : "?", r->cur.provider_id,
                 r->cur.id, osr_provider_err_name(status));
    audit(r, r->cur.tenant, "reap.ttl", r->cur.id, osr_provider_err_name(status), NULL);
    expire_next(r);
    return;
  }
  int rv = end_cur(r, OSR_BINDING_ENDED, r->reason, expire_stored);
  if (rv != 0)
    expire_stored(rv, r);
}

static void expire_got(int status, const osr_binding_t *b, int created, void *data)
{
  osr_reaper_t *r = data;
  (void)created;
  if (status != 0) {
    expire_next(r);
    return;
  }
  r->reason = expiry_reason(osr_now_ms(), b->state, b->expires_ms, b->idle_timeout_ms,
                            b->last_activity_ms);
  if (r->reason == NULL) { /* extended or ended since the snapshot */
    expire_next(r);
    return;
  }
  osr_binding_copy(&r->cur, b);
  osr_provider_t *p = osr_providers_find(r->gw->providers, b->provider, NULL);
  if (p == NULL || b->provider_id[0] == '\0') {
    expire_destroyed(p, 0, r);
    return;
  }
  int rv = p->adapter->destroy(p, r->cur.provider_id, expire_destroyed, r);
  if (rv != 0)
    expire_destroyed(p, rv, r);
}

static void pass_expire(osr_reaper_t *r)
{
  int64_t now = osr_now_ms();
  for (size_t budget = SCAN_STEP; r->xi < r->nlive; budget--) {
    if (budget == 0) {
      yield(r, pass_expire);
      return;
    }
    live_t *l = live_at(r, r->xi);
    if (expiry_reason(now, l->state, l->expires_ms, l->idle_timeout_ms, l->last_activity_ms) ==
        NULL) {
      r->xi++;
      continue;
    }
    int rv = osr_store_get(r->gw->store, NULL, l->id, expire_got, r);
    if (rv != 0) {
      r->xi++;
      continue;
    }
    return;
  }
  if (!r->reconcile) {
    pass_end(r, 0);
    return;
  }
  r->pi = 0;
  pass_provider(r);
}

/* ---- 4. reconciliation ------------------------------------------------------ */

static void resource_next(osr_reaper_t *r)
{
  r->ri++;
  pass_resource(r);
}

static void orphan_destroyed(osr_provider_t *p, int status, void *data)
{
  osr_reaper_t *r = data;
  const unmatched_t *res = &r->res[r->ri];
  int ok = status == 0 || status == OSR_PERR_NOT_FOUND;
  audit(r, NULL, "reap.orphan", res->sandbox_id, ok ? "ok" : osr_provider_err_name(status),
        json_pack("{s:s,s:s}", "provider", p->name, "providerId", res->provider_id));
  resource_next(r);
}

static void orphan_got(int status, const osr_binding_t *b, int created, void *data)
{
  osr_reaper_t *r = data;
  const unmatched_t *res = &r->res[r->ri];
  const char *why = "";
  (void)created;
  if ((status != 0 && status != OSR_ENOTFOUND) || osr__create_in_flight(r->gw, res->sandbox_id) ||
      osr__resource_is_bound(status == 0 ? b : NULL, r->p->name, res->provider_id, &why)) {
    resource_next(r);
    return;
  }
  OSR_LOG_INFO(MOD, "%s: %s (%s) is an orphan: %s", r->p->name, res->provider_id, res->sandbox_id,
               why);
  int rv = r->p->adapter->destroy(r->p, res->provider_id, orphan_destroyed, r);
  if (rv != 0)
    orphan_destroyed(r->p, rv, r);
}

static void pass_resource(osr_reaper_t *r)
{
  while (r->ri < r->nres) {
    const unmatched_t *res = &r->res[r->ri];
    /* Not in the snapshot as this resource: read the binding now (it may
     * have been created after the snapshot) before calling it an orphan. */
    int rv = osr_store_get(r->gw->store, NULL, res->sandbox_id, orphan_got, r);
    if (rv != 0) {
      r->ri++;
      continue;
    }
    return;
  }
  r->li = 0;
  pass_lost(r);
}

static void lost_next(osr_reaper_t *r)
{
  osr_binding_dispose(&r->cur);
  osr_binding_init(&r->cur);
  r->li++;
  pass_lost(r);
}

static void lost_stored(int status, void *data)
{
  osr_reaper_t *r = data;
  if (status == 0) {
    osr__cache_invalidate(r->gw, r->cur.id);
    audit(r, r->cur.tenant, "reap.lost", r->cur.id, "ok",
          json_pack("{s:s,s:s}", "provider", r->cur.provider, "providerId", r->cur.provider_id));
  }
  lost_next(r);
}

static void lost_got(int status, const osr_binding_t *b, int created, void *data)
{
  osr_reaper_t *r = data;
  live_t *l = live_at(r, r->li);
  (void)created;
  /* Only if it still points at the resource the provider no longer has,
   * and did not change since before the provider was listed. */
  if (status != 0 || (b->state != OSR_BINDING_RUNNING && b->state != OSR_BINDING_PAUSED) ||
      strcmp(b->provider, l->provider) != 0 || strcmp(b->provider_id, l->provider_id) != 0 ||
      b->updated_ms > r->pass_start_ms) {
    lost_next(r);
    return;
  }
  osr_binding_copy(&r->cur, b);
  int rv = end_cur(r, OSR_BINDING_LOST, "lost", lost_stored);
  if (rv != 0)
    lost_stored(rv, r);
}

static void pass_lost(osr_reaper_t *r)
{
  for (size_t budget = SCAN_STEP; r->li < r->nlive; budget--) {
    if (budget == 0) {
      yield(r, pass_lost);
      return;
    }
    live_t *l = live_at(r, r->li);
    if (l->seen || l->acted || strcmp(l->provider, r->p->name) != 0 ||
        (l->state != OSR_BINDING_RUNNING && l->state != OSR_BINDING_PAUSED)) {
      r->li++;
      continue;
    }
    int rv = osr_store_get(r->gw->store, NULL, l->id, lost_got, r);
    if (rv != 0) {
      r->li++;
      continue;
    }
    return;
  }
  osr_freep(&r->res);
  r->nres = r->rescap = 0;
  r->pi++;
  pass_provider(r);
}

/* Cannot see the provider: decide nothing about it this pass. */
static void provider_failed(osr_reaper_t *r, osr_provider_t *p, int status)
{
  OSR_LOG_DEBUG(MOD, "listing %s: %s", p->name, osr_provider_err_name(status));
  osr_freep(&r->res);
  r->nres = r->rescap = 0;
  r->pi++;
  pass_provider(r);
}

/* Match listed resources against the snapshot now, while `res` is valid;
 * keep the rest (appended to r->res across pages). */
static void match_resources(osr_reaper_t *r, osr_provider_t *p, const osr_resource_t *res, size_t n)
{
  uint64_t t0 = step_begin();
  for (size_t i = 0; i < n; i++) {
    if (res[i].sandbox_id[0] == '\0')
      continue; /* not ours (no label) */
    live_t *l = find_live(r, res[i].sandbox_id);
    if (l != NULL && strcmp(l->provider, p->name) == 0 &&
        (l->state == OSR_BINDING_CREATING || l->provider_id[0] == '\0' ||
         strcmp(l->provider_id, res[i].provider_id) == 0)) {
      l->seen = 1;
      continue;
    }
    if (r->nres == r->rescap) {
      r->rescap = r->rescap ? 2 * r->rescap : 16;
      r->res = osr_xrealloc(r->res, r->rescap * sizeof(*r->res));
    }
    unmatched_t *u = &r->res[r->nres++];
    snprintf(u->provider_id, sizeof(u->provider_id), "%s", res[i].provider_id);
    snprintf(u->sandbox_id, sizeof(u->sandbox_id), "%s", res[i].sandbox_id);
  }
  step_end(r, t0);
}

static void provider_listed(osr_provider_t *p, int status, const osr_resource_t *res, size_t n,
                            void *data)
{
  osr_reaper_t *r = data;
  if (status != 0) {
    provider_failed(r, p, status);
    return;
  }
  r->pages++;
  match_resources(r, p, res, n);
  r->ri = 0;
  pass_resource(r);
}

static void provider_page(osr_provider_t *p, int status, const osr_resource_t *res, size_t n,
                          const char *next, void *data)
{
  osr_reaper_t *r = data;
  if (status == 0 && next != NULL && strlen(next) >= sizeof(r->cursor))
    status = OSR_PERR_UNAVAILABLE; /* a cursor the adapter contract does not allow */
  if (status != 0) {
    provider_failed(r, p, status);
    return;
  }
  if (r->stopping) {
    pass_end(r, 0);
    return;
  }
  r->pages++;
  match_resources(r, p, res, n);
  if (next != NULL) {
    /* The page's answer is the yield: the next one comes on a later turn. */
    snprintf(r->cursor, sizeof(r->cursor), "%s", next);
    int rv = p->adapter->list_page(p, r->cursor, PROVIDER_PAGE, provider_page, r);
    if (rv != 0)
      provider_failed(r, p, rv);
    return;
  }
  r->ri = 0;
  pass_resource(r);
}

static void pass_provider(osr_reaper_t *r)
{
  size_t np = osr_providers_count(r->gw->providers);
  while (r->pi < np && !r->stopping) {
    osr_provider_t *p = r->p = osr_providers_at(r->gw->providers, r->pi);
    r->nres = 0;
    r->cursor[0] = '\0';
    if ((p->info.flags & OSR_PROVIDER_F_NO_LABELS) == 0) {
      int rv = p->adapter->list_page != NULL
                   ? p->adapter->list_page(p, NULL, PROVIDER_PAGE, provider_page, r)
                   : p->adapter->list(p, provider_listed, r);
      if (rv == 0)
        return;
    }
    r->pi++;
  }
  pass_end(r, 0);
}

/* ---- pass driver ------------------------------------------------------------ */

static void on_timer_closed(uv_handle_t *h)
{
  osr_reaper_t *r = h->data;
  if (--r->handles > 0)
    return;
  void (*cb)(void *) = r->stop_cb;
  void *data = r->stop_data;
  osr_free(r);
  if (cb != NULL)
    cb(data);
}

static void close_handles(osr_reaper_t *r)
{
  uv_close((uv_handle_t *)&r->timer, on_timer_closed);
  uv_close((uv_handle_t *)&r->step, on_timer_closed);
}

static void pass_start(osr_reaper_t *r);

/* ---- 0. stale creates ------------------------------------------------------ */

static void stale_resolved(osr_gw_t *gw, int status, void *data)
{
  osr_reaper_t *r = data;
  (void)gw;
  /* A store error here fails the listing below the same way; go on so
   * TTLs are still enforced if only this step had trouble. */
  (void)status;
  if (r->stopping) {
    pass_end(r, 0);
    return;
  }
  pass_live_page(r);
}

/* A pass's transients (the snapshot, and in the adapters the provider's
 * list answer, its parsed tree and its resource array: ~4 KB per live
 * sandbox) are freed by now, but glibc returns only the free space at the
 * top of its heaps to the kernel, and any block still allocated above it
 * (a pooled I/O block, a create in flight) pins the rest: the gateway's RSS
 * kept the high-water of the last listing, 4 KB per tracked sandbox.
 * malloc_trim also releases the free pages below the top (madvise); its
 * cost scales with the free space, once per pass. */
static void release_heap(size_t nlive)
{
#ifdef __GLIBC__
  if (nlive >= 1000)
    (void)malloc_trim(64 * 1024);
#else
  (void)nlive;
#endif
}

static void pass_end(osr_reaper_t *r, int status)
{
  size_t nlive = r->nlive;
  if (status != 0)
    OSR_LOG_WARN(MOD, "pass failed: %s", osr__err_text(status));
  uv_timer_stop(&r->step);
  live_free(r);
  osr_freep(&r->res);
  r->nres = r->rescap = 0;
  uint64_t t_trim = uv_hrtime() / 1000;
  release_heap(nlive);
  /* Where a pass sits in a latency profile (OSR_LOG_LEVEL=trace), and how
   * it was cut into loop turns (debug: tests count the pages and yields). */
  OSR_LOG_TRACE(MOD,
                "pass at %" PRIu64 " ended at %" PRIu64 " (%zu %s, trim %" PRIu64
                " us, longest step %" PRIu64 " us)",
                r->pass_t0_us, t_trim, nlive, r->reconcile ? "live" : "due",
                uv_hrtime() / 1000 - t_trim, r->max_step_us);
  /* "N live": the whole snapshot; "N due": only expired ones were read. */
  OSR_LOG_DEBUG(MOD, "pass: %zu %s, %" PRIu64 " provider pages, %" PRIu64 " scan yields%s", nlive,
                r->reconcile ? "live" : "due", r->pages, r->yields,
                r->reconcile ? "" : " (providers not listed)");
  osr_binding_dispose(&r->cur);
  osr_binding_init(&r->cur);
  r->running = 0;
  once_t *o = r->once;
  r->once = NULL;
  while (o != NULL) {
    once_t *n = o->next;
    o->cb(r, status, o->data);
    osr_free(o);
    o = n;
  }
  if (r->stopping) {
    close_handles(r);
    return;
  }
  if (r->again) {
    r->again = 0;
    pass_start(r);
  }
}

static void activity_drained(void *data)
{
  osr_reaper_t *r = data;
  if (r->stopping) {
    pass_end(r, 0);
    return;
  }
  osr__resolve_creating(r->gw, 0, stale_resolved, r);
}

static void pass_start(osr_reaper_t *r)
{
  if (r->running || r->stopping)
    return;
  if (r->gw->store == NULL) {
    r->running = 1;
    r->once = r->once_next;
    r->once_next = NULL;
    pass_end(r, OSR_EUNAVAILABLE);
    return;
  }
  r->running = 1;
  r->once = r->once_next;
  r->once_next = NULL;
  /* Listing every provider is the heavy part of a pass, for the provider
   * (a page per 256 resources: a real API's rate limit) and for the
   * gateway, so it runs only every reconcile_interval_ms; TTL and idle
   * timeouts are enforced on every pass. The first pass (reconciliation at
   * start) and the passes someone waits for list always. */
  uint64_t now = uv_now(r->gw->loop);
  r->reconcile = !r->reconciled_once || r->once != NULL ||
                 now - r->reconcile_at >= osr_reaper_reconcile_ms(r->gw->cfg);
  if (r->reconcile) {
    r->reconciled_once = 1;
    r->reconcile_at = now;
  }
  r->pass_start_ms = osr_now_ms();
  r->pass_t0_us = uv_hrtime() / 1000;
  r->pages = r->yields = r->max_step_us = 0;
  memset(r->counts, 0, sizeof(r->counts));
  r->cursor[0] = '\0';
  /* Activity the data planes left in Redis goes into the store first, so
   * the idle decisions of this pass see every report made before it. */
  osr__gw_activity_drain(r->gw, activity_drained, r);
}

static void on_tick(uv_timer_t *t)
{
  osr_reaper_t *r = t->data;
  /* A pass still running when the next tick comes is not doubled up. */
  pass_start(r);
}

int osr_reaper_start(osr_gw_t *gw, osr_reaper_t **out)
{
  osr_reaper_t *r = osr_xcalloc(1, sizeof(*r));
  r->gw = gw;
  osr_binding_init(&r->cur);
  osr__auth_system(&r->who, "reaper", NULL);
  int rv = uv_timer_init(gw->loop, &r->timer);
  if (rv != 0) {
    osr_free(r);
    return rv;
  }
  (void)uv_timer_init(gw->loop, &r->step); /* cannot fail once the first did */
  r->timer.data = r->step.data = r;
  r->handles = 2;
  uint64_t every = osr_reaper_interval_ms(gw->cfg);
  /* The first pass runs at once: reconciliation at start. */
  uv_timer_start(&r->timer, on_tick, 0, every);
  *out = r;
  return 0;
}

void osr_reaper_run_once(osr_reaper_t *r, void (*cb)(osr_reaper_t *r, int status, void *data),
                         void *data)
{
  /* Ride on the next complete pass: if one is running, it started before
   * this call, so another one follows it. */
  if (cb != NULL) {
    once_t *o = osr_xcalloc(1, sizeof(*o));
    o->cb = cb;
    o->data = data;
    o->next = r->once_next;
    r->once_next = o;
  }
  if (r->running)
    r->again = 1;
  else
    pass_start(r);
}

void osr_reaper_stop(osr_reaper_t *r, void (*cb)(void *data), void *data)
{
  r->stopping = 1;
  r->stop_cb = cb;
  r->stop_data = data;
  uv_timer_stop(&r->timer);
  if (!r->running)
    close_handles(r);
}
