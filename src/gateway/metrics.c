/*
 * Gateway metrics (metrics.h) in the Prometheus text exposition format
 * 0.0.4. Everything is updated and read on the loop thread, so there are no
 * locks. Label cardinality is bounded by construction: routes are the
 * router's patterns (never raw paths), methods outside a fixed list become
 * "other", providers are configured names and outcomes a fixed vocabulary.
 * Each series table still has a hard cap so a bug elsewhere can never make
 * the process grow without bound; samples for series past the cap are
 * dropped (and logged once).
 */
#include "gateway/metrics.h"

#include <stdio.h>
#include <string.h>

#include "cache/redis.h"
#include "gateway/providers.h"
#include "store/store.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/prom.h"

/* Seconds. Covers sub-millisecond API answers up to provider creates that
 * take tens of seconds (a cold VM or a Kubernetes pod). */
static const double buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                 0.25,   0.5,   1,      2.5,   5,    10,    30,   60};
#define NBUCKETS OSR_ARRAY_SIZE(buckets)

#define MAX_HTTP_SERIES   1024
#define MAX_ROUTES        64
#define MAX_CREATE_SERIES 512
#define MAX_REAPER_SERIES 32
#define LABEL_MAX         64

typedef struct hist_s {
  uint64_t bucket[NBUCKETS]; /* non-cumulative; summed when rendered */
  uint64_t count;
  double sum;
} hist_t;

typedef struct http_series_s {
  char route[LABEL_MAX];
  const char *method; /* one of the static names below */
  int code;
  uint64_t n;
} http_series_t;

typedef struct route_hist_s {
  char route[LABEL_MAX];
  hist_t h;
} route_hist_t;

typedef struct create_series_s {
  char provider[OSR_NAME_MAX];
  char outcome[32];
  uint64_t n;
} create_series_t;

typedef struct reaper_series_s {
  char action[32];
  uint64_t n;
} reaper_series_t;

struct osr_metrics_s {
  http_series_t http[MAX_HTTP_SERIES];
  size_t nhttp;
  route_hist_t routes[MAX_ROUTES];
  size_t nroutes;
  create_series_t creates[MAX_CREATE_SERIES];
  size_t ncreates;
  reaper_series_t reaper[MAX_REAPER_SERIES];
  size_t nreaper;
  uint64_t failovers;
  hist_t create_duration;
  uint64_t audit_failures;
  uint64_t sandboxes[8]; /* index = osr_binding_state_t */
  int sandboxes_known;
  int warned_full;
};

static const char *const methods[] = {"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"};

osr_metrics_t *osr_metrics_new(void)
{
  return osr_xcalloc(1, sizeof(osr_metrics_t));
}

void osr_metrics_free(osr_metrics_t *m)
{
  osr_free(m);
}

static void warn_full(osr_metrics_t *m, const char *what)
{
  if (!m->warned_full)
    OSR_LOG_WARN("metrics", "%s series table full; further series are dropped", what);
  m->warned_full = 1;
}

static void hist_observe(hist_t *h, double v)
{
  for (size_t i = 0; i < NBUCKETS; i++) {
    if (v <= buckets[i]) {
      h->bucket[i]++;
      break;
    }
  }
  /* Values above the last bound only count toward +Inf (= count). */
  h->count++;
  h->sum += v;
}

/* Copy a label value, truncated to the table's field size. */
static void copy_label(char *dst, size_t cap, const char *src)
{
  snprintf(dst, cap, "%s", src != NULL ? src : "");
}

void osr_metrics_http(osr_metrics_t *m, const char *route, const char *method, int code,
                      uint64_t duration_us)
{
  if (m == NULL)
    return;
  const char *meth = "other";
  for (size_t i = 0; i < OSR_ARRAY_SIZE(methods); i++)
    if (method != NULL && strcmp(method, methods[i]) == 0)
      meth = methods[i];
  if (route == NULL)
    route = "unmatched";

  size_t i;
  for (i = 0; i < m->nhttp; i++) {
    http_series_t *s = &m->http[i];
    if (s->code == code && s->method == meth && strcmp(s->route, route) == 0)
      break;
  }
  if (i == m->nhttp) {
    if (m->nhttp == MAX_HTTP_SERIES) {
      warn_full(m, "http_requests_total");
      goto hist;
    }
    copy_label(m->http[i].route, LABEL_MAX, route);
    m->http[i].method = meth;
    m->http[i].code = code;
    m->nhttp++;
  }
  m->http[i].n++;

hist:
  for (i = 0; i < m->nroutes; i++)
    if (strcmp(m->routes[i].route, route) == 0)
      break;
  if (i == m->nroutes) {
    if (m->nroutes == MAX_ROUTES) {
      warn_full(m, "http_request_duration_seconds");
      return;
    }
    copy_label(m->routes[i].route, LABEL_MAX, route);
    m->nroutes++;
  }
  hist_observe(&m->routes[i].h, (double)duration_us / 1e6);
}

void osr_metrics_create(osr_metrics_t *m, const char *provider, const char *outcome)
{
  if (m == NULL)
    return;
  provider = provider != NULL ? provider : "";
  outcome = outcome != NULL ? outcome : "unknown";
  for (size_t i = 0; i < m->ncreates; i++) {
    create_series_t *s = &m->creates[i];
    if (strcmp(s->provider, provider) == 0 && strcmp(s->outcome, outcome) == 0) {
      s->n++;
      return;
    }
  }
  if (m->ncreates == MAX_CREATE_SERIES) {
    warn_full(m, "creates_total");
    return;
  }
  create_series_t *s = &m->creates[m->ncreates++];
  copy_label(s->provider, sizeof(s->provider), provider);
  copy_label(s->outcome, sizeof(s->outcome), outcome);
  s->n = 1;
}

void osr_metrics_create_done(osr_metrics_t *m, int attempts, uint64_t duration_us)
{
  if (m == NULL)
    return;
  if (attempts > 1)
    m->failovers++;
  hist_observe(&m->create_duration, (double)duration_us / 1e6);
}

void osr_metrics_reaper(osr_metrics_t *m, const char *action)
{
  if (m == NULL || action == NULL)
    return;
  for (size_t i = 0; i < m->nreaper; i++) {
    if (strcmp(m->reaper[i].action, action) == 0) {
      m->reaper[i].n++;
      return;
    }
  }
  if (m->nreaper == MAX_REAPER_SERIES) {
    warn_full(m, "reaper_actions_total");
    return;
  }
  copy_label(m->reaper[m->nreaper].action, sizeof(m->reaper[0].action), action);
  m->reaper[m->nreaper++].n = 1;
}

void osr_metrics_audit_failure(osr_metrics_t *m)
{
  if (m != NULL)
    m->audit_failures++;
}

void osr_metrics_sandboxes(osr_metrics_t *m, const uint64_t *by_state, size_t n)
{
  if (m == NULL)
    return;
  memset(m->sandboxes, 0, sizeof(m->sandboxes));
  for (size_t i = 0; i < n && i < OSR_ARRAY_SIZE(m->sandboxes); i++)
    m->sandboxes[i] = by_state[i];
  m->sandboxes_known = 1;
}

/* ---- rendering ------------------------------------------------------------ */

#define put_lit(out, s) osr_buf_append((out), (s), sizeof(s) - 1)

/* Label values escape backslash, double quote and newline (util/prom.h). */
static int put_label(osr_buf_t *out, const char *v)
{
  return osr_prom_label(out, 0, v);
}

/* HELP and TYPE of the family osr_<name>. */
static int family(osr_buf_t *out, const char *name, const char *type, const char *help)
{
  char full[128];
  snprintf(full, sizeof(full), "osr_%s", name);
  return osr_prom_family(out, 0, full, type, help);
}

/* `labels` is the already-rendered label list without braces ("" = none);
 * the le label is appended to it. */
static int put_hist(osr_buf_t *out, const char *name, const char *labels, const hist_t *h)
{
  uint64_t cum = 0;
  int rv = 0;
  const char *sep = labels[0] != '\0' ? "," : "";
  for (size_t i = 0; i < NBUCKETS && rv == 0; i++) {
    cum += h->bucket[i];
    rv = osr_buf_appendf(out, "osr_%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, buckets[i],
                         (unsigned long long)cum);
  }
  if (rv == 0)
    rv = osr_buf_appendf(out, "osr_%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep,
                         (unsigned long long)h->count);
  if (rv == 0)
    rv = osr_buf_appendf(out, "osr_%s_sum%s%s%s %.9g\n", name, labels[0] ? "{" : "", labels,
                         labels[0] ? "}" : "", h->sum);
  if (rv == 0)
    rv = osr_buf_appendf(out, "osr_%s_count%s%s%s %llu\n", name, labels[0] ? "{" : "", labels,
                         labels[0] ? "}" : "", (unsigned long long)h->count);
  return rv;
}

/* Render one label pair `k="v"` (escaped) into a small scratch buffer. */
static int label_pair(osr_buf_t *tmp, const char *k, const char *v)
{
  osr_buf_consume(tmp, tmp->len);
  int rv = osr_buf_appendf(tmp, "%s=\"", k);
  if (rv == 0)
    rv = put_label(tmp, v);
  if (rv == 0)
    rv = osr_buf_append(tmp, "\"\0", 2);
  return rv;
}

static int render_providers(osr_gw_t *gw, osr_buf_t *out)
{
  int rv = family(out, "provider_breaker_state", "gauge",
                  "Circuit breaker state per provider: 0 closed, 1 open, 2 half-open.");
  size_t n = gw != NULL && gw->providers != NULL ? osr_providers_count(gw->providers) : 0;
  int64_t now = osr_now_ms();
  for (size_t i = 0; i < n && rv == 0; i++) {
    osr_provider_t *p = osr_providers_at(gw->providers, i);
    osr_provider_health_t *h = osr_providers_health(gw->providers, i);
    rv = put_lit(out, "osr_provider_breaker_state{provider=\"");
    if (rv == 0)
      rv = put_label(out, p->name);
    if (rv == 0)
      rv = osr_buf_appendf(out, "\"} %d\n", (int)osr_breaker_state(&h->breaker, now));
  }
  if (rv == 0)
    rv = family(out, "provider_create_latency_ewma_ms", "gauge",
                "Moving average of successful create latency per provider, in milliseconds.");
  for (size_t i = 0; i < n && rv == 0; i++) {
    osr_provider_t *p = osr_providers_at(gw->providers, i);
    osr_provider_health_t *h = osr_providers_health(gw->providers, i);
    rv = put_lit(out, "osr_provider_create_latency_ewma_ms{provider=\"");
    if (rv == 0)
      rv = put_label(out, p->name);
    if (rv == 0)
      rv = osr_buf_appendf(out, "\"} %.6g\n", h->latency_ewma_ms);
  }
  return rv;
}

int osr_metrics_render(osr_metrics_t *m, osr_gw_t *gw, osr_buf_t *out)
{
  osr_buf_t tmp;
  osr_buf_init(&tmp, 4096);
  int rv = family(out, "http_requests_total", "counter",
                  "API requests by route pattern, method and status code.");
  for (size_t i = 0; i < m->nhttp && rv == 0; i++) {
    const http_series_t *s = &m->http[i];
    rv = put_lit(out, "osr_http_requests_total{route=\"");
    if (rv == 0)
      rv = put_label(out, s->route);
    if (rv == 0)
      rv = osr_buf_appendf(out, "\",method=\"%s\",code=\"%d\"} %llu\n", s->method, s->code,
                           (unsigned long long)s->n);
  }
  if (rv == 0)
    rv = family(out, "http_request_duration_seconds", "histogram",
                "API request latency by route pattern, from headers received to answer sent.");
  for (size_t i = 0; i < m->nroutes && rv == 0; i++) {
    rv = label_pair(&tmp, "route", m->routes[i].route);
    if (rv == 0)
      rv = put_hist(out, "http_request_duration_seconds", osr_buf_data(&tmp), &m->routes[i].h);
  }

  if (rv == 0)
    rv = family(out, "creates_total", "counter",
                "Create attempts by provider and outcome (ok, capacity, rate_limited, timeout, "
                "unavailable, boot_failed, auth, invalid, ...).");
  for (size_t i = 0; i < m->ncreates && rv == 0; i++) {
    const create_series_t *s = &m->creates[i];
    rv = put_lit(out, "osr_creates_total{provider=\"");
    if (rv == 0)
      rv = put_label(out, s->provider);
    if (rv == 0)
      rv = put_lit(out, "\",outcome=\"");
    if (rv == 0)
      rv = put_label(out, s->outcome);
    if (rv == 0)
      rv = osr_buf_appendf(out, "\"} %llu\n", (unsigned long long)s->n);
  }
  rv = osr_prom_single(out, rv, "osr_create_failovers_total", "counter",
                       "Creates that needed more than one provider.", m->failovers);
  if (rv == 0)
    rv = family(out, "create_duration_seconds", "histogram",
                "Sandbox create latency end to end, as the client sees it.");
  if (rv == 0)
    rv = put_hist(out, "create_duration_seconds", "", &m->create_duration);

  if (rv == 0)
    rv = render_providers(gw, out);

  if (rv == 0)
    rv = family(out, "sandboxes", "gauge", "Sandboxes by state, as last counted by the reaper.");
  for (int st = OSR_BINDING_CREATING; st <= OSR_BINDING_LOST && rv == 0 && m->sandboxes_known; st++)
    rv = osr_buf_appendf(out, "osr_sandboxes{state=\"%s\"} %llu\n",
                         osr_binding_state_name((osr_binding_state_t)st),
                         (unsigned long long)m->sandboxes[st]);

  if (rv == 0)
    rv = family(out, "store_latency_seconds", "gauge",
                "Round-trip time of the last completed store call.");
  if (rv == 0 && gw != NULL && gw->store != NULL)
    rv = osr_buf_appendf(out, "osr_store_latency_seconds %.9g\n",
                         (double)osr_store_last_latency_us(gw->store) / 1e6);
  if (rv == 0)
    rv = family(out, "redis_latency_seconds", "gauge",
                "Round-trip time of the last completed Redis command.");
  if (rv == 0 && gw != NULL && gw->redis != NULL)
    rv = osr_buf_appendf(out, "osr_redis_latency_seconds %.9g\n",
                         (double)osr_redis_last_latency_us(gw->redis) / 1e6);
  rv = osr_prom_single(
      out, rv, "osr_redis_up", "gauge",
      "1 while the Redis command connection is up (0 when down or not configured).",
      (uint64_t)(gw != NULL && gw->redis != NULL && osr_redis_is_connected(gw->redis)));

  if (rv == 0)
    rv = family(out, "reaper_actions_total", "counter",
                "Reaper actions (ttl, idle, orphan, lost, ...).");
  for (size_t i = 0; i < m->nreaper && rv == 0; i++) {
    rv = put_lit(out, "osr_reaper_actions_total{action=\"");
    if (rv == 0)
      rv = put_label(out, m->reaper[i].action);
    if (rv == 0)
      rv = osr_buf_appendf(out, "\"} %llu\n", (unsigned long long)m->reaper[i].n);
  }
  rv = osr_prom_single(out, rv, "osr_audit_failures_total", "counter",
                       "Audit events that could not be written to the store.", m->audit_failures);
  osr_buf_dispose(&tmp);
  return rv;
}
