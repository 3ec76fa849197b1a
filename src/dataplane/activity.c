/*
 * Activity reports: which sandboxes had data-plane traffic, told to the
 * gateway so its reaper can enforce idle timeouts (docs/dataplane.md,
 * "Activity").
 *
 * The table maps sandbox id -> dp_act_t. Streams and tunnels open and
 * close their sandbox's entry (dp_activity.h); that is the only work on the
 * hot path: one hash lookup per stream, none per byte. A timer ends each
 * interval: every entry with an open stream, a start/end since the last
 * report, or a failed earlier report goes into one batch, and entries with
 * nothing left are freed, so the table holds only sandboxes active in the
 * last interval (capped by activity_max; past the cap new sandboxes go
 * unreported and are counted, never the process grows).
 *
 * Transports, the first configured wins:
 *   activity_cb   `osr serve`: a direct call into the gateway (store touch);
 *   Redis         the hash "<prefix>activity" (osr_redis_activity_add),
 *                 drained by whichever gateway runs the reaper. A hash and
 *                 not pub/sub: a published message with no gateway
 *                 listening (restart, reconnect) is lost silently, whereas
 *                 the hash keeps the latest time per sandbox until some
 *                 gateway takes it, costs one field per sandbox however
 *                 often it is reported, and is applied once even with
 *                 several gateways;
 *   gateway_url   POST /v1/internal/activity with a JSON batch (also the
 *                 fallback when Redis refuses or fails a batch).
 *
 * Loss: a batch that fails is merged back into the table (retry_ms) and
 * goes out with the next interval, so a transport failure delays a report
 * by one interval and never drops it while the data plane runs. The
 * gateway kills at last_activity + idle, so a sandbox busy right up to now
 * is seen as busy up to one interval (plus the gateway's drain period)
 * late, and one failed report adds one more interval: that is the bound
 * docs/dataplane.md states.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "cache/redis.h"
#include "dataplane/dp_int.h"
#include "net/addr.h"
#include "util/log.h"
#include "util/mem.h"

#define MOD          OSR_DP_MOD
#define ACT_BUCKETS  4096 /* chains stay short up to ~16k active sandboxes */
#define ACT_HTTP_MAX 4096 /* entries per HTTP POST (~250 KiB of JSON) */

typedef enum act_via_e { VIA_NONE = 0, VIA_CB, VIA_REDIS, VIA_HTTP } act_via_t;

struct dp_activity_s {
  osr_dataplane_t *dp;
  uv_timer_t timer;
  act_via_t via;
  dp_act_t *buckets[ACT_BUCKETS];
  size_t count;
  int warned_full;
  /* the batch being sent (one at a time) */
  int sending;
  char (*ids)[OSR_DP_SID_MAX];
  const char **idp;
  int64_t *ms;
  size_t n, cap, off; /* off: next slice for Redis (1024 a command) */
  /* HTTP transport */
  char gw_addr[320];
  char gw_authority[300];
  char gw_path[512];
  int gw_tls;
  char *body;
  osr_http_client_t *client;
  osr_http_creq_t *creq;
  int http_status;
  /* stop */
  int stopping;
  int timer_open;
};

static int64_t wall_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static unsigned act_hash(const char *sid)
{
  return osr__dp_hash_str(sid) % ACT_BUCKETS;
}

static dp_act_t *act_get(dp_activity_t *a, const char *sid, int create)
{
  unsigned b = act_hash(sid);
  for (dp_act_t *e = a->buckets[b]; e != NULL; e = e->next)
    if (strcmp(e->sid, sid) == 0)
      return e;
  if (!create)
    return NULL;
  if (a->count >= a->dp->cfg.activity_max) {
    a->dp->m.act_dropped++;
    if (!a->warned_full)
      OSR_LOG_WARN(MOD, "activity table full (%zu sandboxes): some activity goes unreported",
                   a->count);
    a->warned_full = 1;
    return NULL;
  }
  dp_act_t *e = osr_xcalloc(1, sizeof(*e));
  snprintf(e->sid, sizeof(e->sid), "%s", sid);
  e->next = a->buckets[b];
  a->buckets[b] = e;
  a->count++;
  return e;
}

dp_act_t *osr__dp_act_open(osr_dataplane_t *dp, const char *sid)
{
  dp_activity_t *a = dp->activity;
  if (a == NULL)
    return NULL;
  dp_act_t *e = act_get(a, sid, 1);
  if (e != NULL) {
    e->open++;
    e->last_uv = uv_now(dp->loop) | 1; /* never 0, which means "none" */
  }
  return e;
}

void osr__dp_act_close(osr_dataplane_t *dp, dp_act_t *e)
{
  if (e == NULL)
    return;
  e->open--;
  e->last_uv = uv_now(dp->loop) | 1;
}

/* ---- collecting a batch ------------------------------------------------------ */

static void batch_push(dp_activity_t *a, const char *sid, int64_t at)
{
  if (a->n == a->cap) {
    size_t cap = a->cap ? a->cap * 2 : 256;
    a->ids = osr_xrealloc(a->ids, cap * sizeof(*a->ids));
    a->idp = osr_xrealloc(a->idp, cap * sizeof(*a->idp));
    a->ms = osr_xrealloc(a->ms, cap * sizeof(*a->ms));
    a->cap = cap;
  }
  snprintf(a->ids[a->n], sizeof(a->ids[a->n]), "%s", sid);
  a->ms[a->n] = at;
  a->n++;
}

/* Take every active entry into the batch and free the ones with nothing
 * left to report. The time reported is the latest start/end (or now while
 * a stream is open), converted from loop time to wall time. */
static void collect(dp_activity_t *a)
{
  uint64_t now_uv = uv_now(a->dp->loop);
  int64_t now = wall_ms();
  a->n = 0;
  for (size_t b = 0; b < ACT_BUCKETS; b++) {
    dp_act_t **pp = &a->buckets[b];
    while (*pp != NULL) {
      dp_act_t *e = *pp;
      int64_t at = e->retry_ms;
      if (e->open > 0)
        at = now;
      else if (e->last_uv != 0 && now - (int64_t)(now_uv - e->last_uv) > at)
        at = now - (int64_t)(now_uv - e->last_uv);
      e->last_uv = 0;
      e->retry_ms = 0;
      if (at > 0)
        batch_push(a, e->sid, at);
      if (e->open == 0) {
        *pp = e->next;
        a->count--;
        osr_free(e);
      } else {
        pp = &e->next;
      }
    }
  }
  for (size_t i = 0; i < a->n; i++)
    a->idp[i] = a->ids[i];
  a->off = 0;
}

/* A failed batch goes back into the table for the next interval. */
static void merge_back(dp_activity_t *a, size_t from)
{
  for (size_t i = from; i < a->n; i++) {
    dp_act_t *e = act_get(a, a->ids[i], 1);
    if (e != NULL && a->ms[i] > e->retry_ms)
      e->retry_ms = a->ms[i];
  }
}

static void send_done(dp_activity_t *a, int ok, size_t failed_from);
static void send_http(dp_activity_t *a);

/* ---- Redis ----------------------------------------------------------------- */

static void send_redis_slice(dp_activity_t *a);

static void on_redis_added(int status, void *data)
{
  dp_activity_t *a = data;
  if (status != 0) {
    OSR_LOG_DEBUG(MOD, "activity to redis: %s", osr_strerror(status));
    if (a->dp->cfg.gateway_url != NULL && !a->stopping) {
      send_http(a); /* the rest of the batch over HTTP */
      return;
    }
    send_done(a, 0, a->off);
    return;
  }
  size_t k =
      a->n - a->off < OSR_REDIS_ACTIVITY_BATCH_MAX ? a->n - a->off : OSR_REDIS_ACTIVITY_BATCH_MAX;
  a->off += k;
  if (a->off < a->n && !a->stopping)
    send_redis_slice(a);
  else
    send_done(a, a->off == a->n, a->off);
}

static void send_redis_slice(dp_activity_t *a)
{
  size_t k =
      a->n - a->off < OSR_REDIS_ACTIVITY_BATCH_MAX ? a->n - a->off : OSR_REDIS_ACTIVITY_BATCH_MAX;
  int rv = a->dp->redis != NULL ? osr_redis_activity_add(a->dp->redis, a->idp + a->off,
                                                         a->ms + a->off, k, on_redis_added, a)
                                : OSR_EUNAVAILABLE;
  if (rv != 0)
    on_redis_added(rv, a); /* same path as an asynchronous failure */
}

/* ---- HTTP ------------------------------------------------------------------ */

static void http_end(dp_activity_t *a, int ok)
{
  if (a->client != NULL) {
    osr_http_client_close(a->client);
    a->client = NULL;
  }
  osr_free(a->body);
  a->body = NULL;
  send_done(a, ok, a->off);
}

static void h_on_response(osr_http_creq_t *r, int status, const osr_http_header_t *h, size_t n,
                          void *data)
{
  (void)r;
  (void)h;
  (void)n;
  ((dp_activity_t *)data)->http_status = status;
}

static void h_on_body(osr_http_creq_t *r, const osr_iovec_t *chunk, int status, void *data)
{
  dp_activity_t *a = data;
  (void)r;
  (void)chunk;
  if (status == 0)
    return; /* the answer's body is not needed */
  a->creq = NULL;
  int ok = status == OSR_EOF && a->http_status == 204;
  if (!ok)
    OSR_LOG_WARN(MOD, "activity to %s: %s", a->dp->cfg.gateway_url,
                 status != OSR_EOF ? osr_strerror(status) : "gateway did not answer 204");
  /* Only the first ACT_HTTP_MAX entries went out in this request. */
  if (ok) {
    size_t k = a->n - a->off < ACT_HTTP_MAX ? a->n - a->off : ACT_HTTP_MAX;
    a->off += k;
    if (a->off < a->n && !a->stopping) {
      osr_http_client_close(a->client);
      a->client = NULL;
      osr_free(a->body);
      a->body = NULL;
      send_http(a);
      return;
    }
  }
  http_end(a, ok);
}

static const osr_http_client_events_t h_events = {h_on_response, h_on_body};

static void h_body_written(osr_http_creq_t *r, int status, void *arg)
{
  (void)r;
  (void)status;
  (void)arg; /* failures arrive through on_body */
}

static void h_connected(osr_http_client_t *c, int status, void *data)
{
  dp_activity_t *a = data;
  if (status != 0) {
    OSR_LOG_WARN(MOD, "activity to %s: %s", a->dp->cfg.gateway_url, osr_strerror(status));
    http_end(a, 0);
    return;
  }
  a->client = c;
  if (a->stopping) {
    http_end(a, 0);
    return;
  }
  char auth[600];
  snprintf(auth, sizeof(auth), "Bearer %s",
           a->dp->cfg.gateway_key != NULL ? a->dp->cfg.gateway_key : "");
  osr_http_header_t h[2] = {
      {osr_iov("content-type", 12), osr_iov("application/json", 16)},
      {osr_iov("authorization", 13), osr_iov(auth, strlen(auth))},
  };
  size_t blen = strlen(a->body);
  osr_http_client_req_t rq = {"POST", a->gw_path, a->gw_authority, h, 2, (int64_t)blen};
  a->http_status = 0;
  if (osr_http_client_request(c, &rq, &h_events, a, &a->creq) != 0) {
    a->creq = NULL;
    http_end(a, 0);
    return;
  }
  osr_iovec_t iov = osr_iov(a->body, blen);
  if (osr_http_creq_write(a->creq, &iov, 1, 1, h_body_written, a) != 0)
    osr_http_creq_cancel(a->creq); /* on_body follows with the error */
}

static void send_http(dp_activity_t *a)
{
  size_t k = a->n - a->off < ACT_HTTP_MAX ? a->n - a->off : ACT_HTTP_MAX;
  json_t *arr = json_array();
  for (size_t i = a->off; i < a->off + k; i++)
    json_array_append_new(arr, json_pack("{s:s,s:I}", "id", a->ids[i], "at", (json_int_t)a->ms[i]));
  json_t *doc = json_pack("{s:o}", "activity", arr);
  char *s = doc != NULL ? json_dumps(doc, JSON_COMPACT) : NULL;
  json_decref(doc);
  if (s == NULL) {
    send_done(a, 0, a->off);
    return;
  }
  a->body = osr_xstrdup(s);
  osr_json_free(s);
  osr_http_client_opts_t o;
  memset(&o, 0, sizeof(o));
  o.tls = a->gw_tls ? a->dp->client_tls : NULL;
  o.connect_timeout_ms = 2000;
  o.idle_timeout_ms = 5000;
  if (osr_http_client_connect(a->dp->loop, a->gw_addr, &o, h_connected, a) != 0) {
    osr_free(a->body);
    a->body = NULL;
    send_done(a, 0, a->off);
  }
}

/* ---- the interval -------------------------------------------------------------- */

static void maybe_stopped(dp_activity_t *a)
{
  if (!a->stopping || a->sending || a->timer_open)
    return;
  osr_dataplane_t *dp = a->dp;
  dp->closing_handles--;
  osr__dp_maybe_finish(dp);
}

static void send_done(dp_activity_t *a, int ok, size_t failed_from)
{
  osr_dataplane_t *dp = a->dp;
  if (ok) {
    dp->m.act_reports++;
  } else {
    dp->m.act_failed++;
    merge_back(a, failed_from);
  }
  a->sending = 0;
  maybe_stopped(a);
}

static void flush(dp_activity_t *a)
{
  if (a->sending)
    return; /* the previous batch is still out: its entries wait a tick */
  collect(a);
  a->dp->m.act_sandboxes += a->n;
  if (a->n == 0)
    return;
  switch (a->via) {
  case VIA_CB:
    for (size_t i = 0; i < a->n; i++)
      a->dp->cfg.activity_cb(a->dp->cfg.activity_data, a->ids[i], a->ms[i]);
    a->dp->m.act_reports++;
    return;
  case VIA_REDIS:
    a->sending = 1;
    send_redis_slice(a);
    return;
  case VIA_HTTP:
    a->sending = 1;
    send_http(a);
    return;
  default:
    return;
  }
}

static void on_timer(uv_timer_t *t)
{
  flush(t->data);
}

static int parse_gateway_url(dp_activity_t *a, const char *u)
{
  int tls = strncmp(u, "https://", 8) == 0;
  if (!tls && strncmp(u, "http://", 7) != 0)
    return OSR_EINVAL;
  const char *hp = u + (tls ? 8 : 7);
  size_t hn = strcspn(hp, "/");
  if (hn == 0 || hn >= sizeof(a->gw_authority))
    return OSR_EINVAL;
  const char *base = hp + hn;
  size_t bl = strlen(base);
  while (bl > 0 && base[bl - 1] == '/')
    bl--;
  snprintf(a->gw_path, sizeof(a->gw_path), "%.*s/v1/internal/activity", (int)bl, base);
  snprintf(a->gw_authority, sizeof(a->gw_authority), "%.*s", (int)hn, hp);
  snprintf(a->gw_addr, sizeof(a->gw_addr), "%.*s", (int)hn, hp);
  osr_addr_t ad;
  if (osr_addr_parse(a->gw_addr, &ad) != 0)
    snprintf(a->gw_addr, sizeof(a->gw_addr), "%.*s:%d", (int)hn, hp, tls ? 443 : 80);
  a->gw_tls = tls;
  return 0;
}

void osr__dp_activity_start(osr_dataplane_t *dp)
{
  dp_activity_t *a = osr_xcalloc(1, sizeof(*a));
  a->dp = dp;
  dp->activity = a;
  if (dp->cfg.activity_cb != NULL)
    a->via = VIA_CB;
  else if (dp->redis != NULL)
    a->via = VIA_REDIS;
  else if (dp->cfg.gateway_url != NULL)
    a->via = VIA_HTTP;
  if (dp->cfg.gateway_url != NULL && parse_gateway_url(a, dp->cfg.gateway_url) != 0) {
    OSR_LOG_WARN(MOD, "bad gateway URL %s: activity is not reported over HTTP",
                 dp->cfg.gateway_url);
    dp->cfg.gateway_url = NULL;
    if (a->via == VIA_HTTP)
      a->via = VIA_NONE;
  }
  static const char *const names[] = {"nowhere", "in process", "redis", "http"};
  if (a->via == VIA_NONE)
    OSR_LOG_WARN(MOD, "activity is reported nowhere (no Redis, no gateway URL): idle timeouts "
                      "count from create");
  else
    OSR_LOG_INFO(MOD, "activity reported every %llu ms via %s%s",
                 (unsigned long long)dp->cfg.activity_interval_ms, names[a->via],
                 a->via == VIA_REDIS && dp->cfg.gateway_url != NULL ? " (http fallback)" : "");
  uv_timer_init(dp->loop, &a->timer);
  a->timer.data = a;
  a->timer_open = 1;
  uv_timer_start(&a->timer, on_timer, dp->cfg.activity_interval_ms, dp->cfg.activity_interval_ms);
}

static void on_timer_closed(uv_handle_t *h)
{
  dp_activity_t *a = h->data;
  a->timer_open = 0;
  maybe_stopped(a);
}

void osr__dp_activity_stop(osr_dataplane_t *dp)
{
  dp_activity_t *a = dp->activity;
  if (a == NULL || a->stopping)
    return;
  /* In process the last interval costs nothing to report; remote
   * transports would make the stop wait on the network, so what happened
   * since the last tick is left out there (at most one interval). */
  if (a->via == VIA_CB)
    flush(a);
  a->stopping = 1;
  dp->closing_handles++;
  if (a->creq != NULL)
    osr_http_creq_cancel(a->creq); /* on_body(ECANCELED) ends the send */
  uv_close((uv_handle_t *)&a->timer, on_timer_closed);
}

void osr__dp_activity_free(osr_dataplane_t *dp)
{
  dp_activity_t *a = dp->activity;
  if (a == NULL)
    return;
  for (size_t b = 0; b < ACT_BUCKETS; b++) {
    dp_act_t *e = a->buckets[b];
    while (e != NULL) {
      dp_act_t *n = e->next;
      osr_free(e);
      e = n;
    }
  }
  osr_free(a->ids);
  osr_free(a->idp);
  osr_free(a->ms);
  osr_free(a->body);
  osr_free(a);
  dp->activity = NULL;
}
