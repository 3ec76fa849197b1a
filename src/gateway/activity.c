/*
 * Data-plane activity into the store (activity.h). Nothing here decides
 * anything: the reaper's idle rule reads last_activity_ms, which
 * osr_store_touch only moves forward, so reports may arrive late, twice or
 * out of order (several data planes, retries) without harm.
 */
#include "gateway/activity.h"

#include <string.h>

#include "cache/redis.h"
#include "util/log.h"
#include "util/mem.h"

#define MOD          "activity"
#define DRAIN_ROUNDS 64

static int valid_id(const char *id)
{
  size_t n = strnlen(id, OSR_ID_MAX);
  if (n == 0 || n >= OSR_ID_MAX)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= '0' && id[i] <= '9')))
      return 0;
  return 1;
}

static int64_t clamp(int64_t at_ms)
{
  int64_t now = osr_now_ms();
  return at_ms > now ? now : at_ms;
}

static void touched(int status, void *data)
{
  (void)data;
  if (status != 0)
    OSR_LOG_WARN(MOD, "recording activity: %s", osr_strerror(status));
}

static void cache_done(int status, void *data)
{
  (void)status; /* the cache is an accelerator: a miss here only means staleness */
  (void)data;
}

/* Reads of a binding may be answered from the Redis cache (api_sandboxes.c),
 * so the cached copies get the new time as well (best effort). */
static void cache_touch(osr_gw_t *gw, const char *const *ids, const int64_t *ms, size_t n)
{
  if (gw->redis == NULL || n == 0 || !osr_redis_is_connected(gw->redis))
    return;
  for (size_t i = 0; i < n; i += OSR_REDIS_ACTIVITY_BATCH_MAX) {
    size_t k = n - i < OSR_REDIS_ACTIVITY_BATCH_MAX ? n - i : OSR_REDIS_ACTIVITY_BATCH_MAX;
    (void)osr_redis_activity_cached(gw->redis, ids + i, ms + i, k, cache_done, NULL);
  }
}

void osr_gw_activity_report(osr_gw_t *gw, const char *sandbox_id, int64_t at_ms)
{
  if (gw->store == NULL || !valid_id(sandbox_id) || at_ms <= 0)
    return;
  int64_t at = clamp(at_ms);
  int rv = osr_store_touch(gw->store, sandbox_id, at, touched, NULL);
  if (rv != 0)
    OSR_LOG_WARN(MOD, "recording activity: %s", osr_strerror(rv));
  cache_touch(gw, &sandbox_id, &at, 1);
}

/* ---- POST /v1/internal/activity ------------------------------------------ */

typedef struct post_s {
  osr_gw_call_t *call;
  size_t pending;
  int failed;
} post_t;

static void post_touched(int status, void *data)
{
  post_t *p = data;
  if (status != 0)
    p->failed = status;
  if (--p->pending > 0)
    return;
  osr_gw_call_t *call = p->call;
  if (p->failed != 0)
    osr_gw_error_from(call, p->failed, "recording activity");
  else
    osr_gw_reply(call, 204, NULL);
  osr_free(p);
  osr_gw_call_release(call);
}

void osr_gw_activity_post(osr_gw_call_t *call)
{
  json_t *arr = json_is_object(call->body) ? json_object_get(call->body, "activity") : NULL;
  if (!json_is_array(arr) || json_array_size(arr) > OSR_GW_ACTIVITY_POST_MAX) {
    osr_gw_error(call, 400, "invalid_request",
                 "the body must be {\"activity\": [{\"id\": sandbox id, \"at\": unix ms}, ...]} "
                 "with at most 10000 entries",
                 NULL);
    return;
  }
  size_t n = json_array_size(arr);
  for (size_t i = 0; i < n; i++) {
    json_t *e = json_array_get(arr, i);
    json_t *id = json_object_get(e, "id"), *at = json_object_get(e, "at");
    if (!json_is_string(id) || !valid_id(json_string_value(id)) || !json_is_integer(at) ||
        json_integer_value(at) <= 0) {
      osr_gw_error(call, 400, "invalid_request",
                   "each activity entry needs \"id\" (a sandbox id) and \"at\" (unix ms > 0)",
                   NULL);
      return;
    }
  }
  if (n == 0) {
    osr_gw_reply(call, 204, NULL);
    return;
  }
  const char **ids = osr_xcalloc(n, sizeof(*ids));
  int64_t *ms = osr_xcalloc(n, sizeof(*ms));
  for (size_t i = 0; i < n; i++) {
    json_t *e = json_array_get(arr, i);
    ids[i] = json_string_value(json_object_get(e, "id"));
    ms[i] = clamp((int64_t)json_integer_value(json_object_get(e, "at")));
  }
  cache_touch(call->gw, ids, ms, n);
  post_t *p = osr_xcalloc(1, sizeof(*p));
  p->call = call;
  p->pending = 1; /* released after the loop: no answer while queueing */
  osr_gw_call_hold(call);
  for (size_t i = 0; i < n; i++) {
    p->pending++;
    int rv = osr_store_touch(call->gw->store, ids[i], ms[i], post_touched, p);
    if (rv != 0) {
      p->pending--;
      p->failed = rv;
    }
  }
  osr_free(ids);
  osr_free(ms);
  post_touched(0, p);
}

/* ---- Redis drain (the reaper, at the start of each pass) ------------------- */

typedef struct drain_s {
  osr_gw_t *gw;
  void (*done)(void *data);
  void *data;
  size_t pending; /* touches in flight + the drain itself */
  int rounds;
  int more; /* the last drain came back full: there may be more */
} drain_t;

static void drain_round(drain_t *d);

static void drain_step(drain_t *d)
{
  if (--d->pending > 0)
    return;
  if (d->more && d->rounds < DRAIN_ROUNDS) {
    drain_round(d);
    return;
  }
  void (*done)(void *) = d->done;
  void *data = d->data;
  osr_free(d);
  done(data);
}

static void drain_touched(int status, void *data)
{
  if (status != 0)
    OSR_LOG_WARN(MOD, "recording activity: %s", osr_strerror(status));
  drain_step(data);
}

static void drained(int status, const char *const *ids, const int64_t *ms, size_t n, void *data)
{
  drain_t *d = data;
  d->more = 0;
  if (status != 0) {
    /* Redis down or slow: the reports stay in the hash for the next pass. */
    OSR_LOG_DEBUG(MOD, "draining activity from redis: %s", osr_strerror(status));
  } else {
    d->more = n == OSR_REDIS_ACTIVITY_BATCH_MAX;
    cache_touch(d->gw, ids, ms, n);
    for (size_t i = 0; i < n; i++) {
      if (!valid_id(ids[i]) || d->gw->store == NULL)
        continue;
      d->pending++;
      if (osr_store_touch(d->gw->store, ids[i], clamp(ms[i]), drain_touched, d) != 0) {
        d->pending--;
        OSR_LOG_WARN(MOD, "recording activity of %s failed: it is lost", ids[i]);
      }
    }
  }
  drain_step(d);
}

static void drain_round(drain_t *d)
{
  d->rounds++;
  d->pending = 1;
  if (osr_redis_activity_drain(d->gw->redis, OSR_REDIS_ACTIVITY_BATCH_MAX, drained, d) != 0) {
    d->more = 0;
    drain_step(d);
  }
}

void osr__gw_activity_drain(osr_gw_t *gw, void (*done)(void *data), void *data)
{
  if (gw->redis == NULL || !osr_redis_is_connected(gw->redis)) {
    done(data);
    return;
  }
  drain_t *d = osr_xcalloc(1, sizeof(*d));
  d->gw = gw;
  d->done = done;
  d->data = data;
  drain_round(d);
}
