/*
 * GET /metrics on the data plane (Prometheus text format 0.0.4), in the
 * style of the gateway's (gateway/metrics.c): osr_ prefix, HELP and TYPE
 * for every family, counters named *_total. Every label value here comes
 * from a fixed vocabulary (route kinds, status classes, refusal reasons),
 * so unlike the gateway there is no label escaping and no series table:
 * plain arrays in the data plane object, bumped on the loop thread without
 * locks. The family/sample writers are shared with the gateway's file
 * (util/prom.h).
 *
 * Series (all osr_dataplane_*):
 *   connections                          gauge, open client connections
 *   streams / tunnels                    gauge, request streams / spliced upgrades
 *   requests_total{kind,class}           kind: none|envd|port|upgrade, class: 1xx..5xx
 *   auth_failures_total{reason}          missing|malformed|signature|expired|
 *                                        unknown_key|revoked|sandbox|scope|port
 *   upstream_errors_total                agent connect/tunnel/upstream failures
 *   bytes_in_total / bytes_out_total     request / response body bytes of streams
 *   activity_reports_total{result}       ok|failed batches; dropped = table full
 *   activity_sandboxes_total             sandbox reports in those batches
 *   endpoint_lookups_total{result}       ok|failed Redis reads, cached = TTL hits
 */
#include <string.h>

#include <openssl/crypto.h>

#include "dataplane/dp_int.h"
#include "dataplane/exec_mux.h"
#include "token/token.h"
#include "util/buf.h"
#include "util/mem.h"
#include "util/prom.h"

#define METRICS_MAX (256u * 1024)

static const char *const kind_names[DP_KIND_N] = {"none", "envd", "port", "upgrade"};
static const char *const class_names[6] = {"other", "1xx", "2xx", "3xx", "4xx", "5xx"};
static const char *const auth_names[DP_AUTH_N] = {"missing", "malformed",   "signature",
                                                  "expired", "unknown_key", "revoked",
                                                  "sandbox", "scope",       "port"};

void osr__dp_count(osr_dataplane_t *dp, dp_kind_t kind, int status)
{
  int c = status >= 100 && status < 600 ? status / 100 : 0;
  dp->m.requests[kind < DP_KIND_N ? kind : DP_KIND_NONE][c]++;
}

void osr__dp_count_auth(osr_dataplane_t *dp, int err)
{
  dp_auth_t r;
  switch (err) {
  case 0:
    r = DP_AUTH_MISSING;
    break;
  case OSR_ETOKEN_SIGNATURE:
    r = DP_AUTH_SIGNATURE;
    break;
  case OSR_ETOKEN_EXPIRED:
    r = DP_AUTH_EXPIRED;
    break;
  case OSR_ETOKEN_UNKNOWN_KEY:
    r = DP_AUTH_UNKNOWN_KEY;
    break;
  case OSR_ETOKEN_REVOKED:
    r = DP_AUTH_REVOKED;
    break;
  case OSR_ETOKEN_SANDBOX:
    r = DP_AUTH_SANDBOX;
    break;
  case OSR_ETOKEN_SCOPE:
    r = DP_AUTH_SCOPE;
    break;
  case OSR_ETOKEN_PORT:
    r = DP_AUTH_PORT;
    break;
  default:
    r = DP_AUTH_MALFORMED;
    break;
  }
  dp->m.auth_fail[r]++;
}

#define N(x) "osr_dataplane_" x

static int render(osr_dataplane_t *dp, osr_buf_t *out)
{
  const dp_metrics_t *m = &dp->m;
  int rv = osr_prom_single(out, 0, N("connections"), "gauge",
                           "Open client connections (all listeners).", osr_dataplane_nconns(dp));
  rv = osr_prom_single(out, rv, N("streams"), "gauge", "Request streams and upgrades in progress.",
                       dp->nstreams);
  rv = osr_prom_single(out, rv, N("tunnels"), "gauge",
                       "Spliced (upgraded, e.g. WebSocket) tunnels open.", dp->nsplices);
  rv = osr_prom_single(out, rv, N("exec_connections"), "gauge",
                       "Shared h2c connections to agents carrying exec sessions.",
                       osr__dp_mux_nconns(dp));
  rv = osr_prom_single(out, rv, N("exec_reattaches_total"), "counter",
                       "Exec output streams re-attached (process.Connect from the output offset) "
                       "after their shared connection died.",
                       m->exec_reattach);
  rv = osr_prom_family(out, rv, N("requests_total"), "counter",
                       "Requests answered, by route kind (none: no sandbox named) and status class.");
  for (int k = 0; k < DP_KIND_N && rv == 0; k++)
    for (int c = 0; c < 6 && rv == 0; c++)
      if (m->requests[k][c] != 0)
        rv = osr_buf_appendf(out, N("requests_total") "{kind=\"%s\",class=\"%s\"} %llu\n",
                             kind_names[k], class_names[c], (unsigned long long)m->requests[k][c]);
  rv = osr_prom_family(out, rv, N("auth_failures_total"), "counter",
                       "Requests refused 401/403, by reason.");
  for (int r = 0; r < DP_AUTH_N && rv == 0; r++)
    rv = osr_buf_appendf(out, N("auth_failures_total") "{reason=\"%s\"} %llu\n", auth_names[r],
                         (unsigned long long)m->auth_fail[r]);
  rv = osr_prom_single(out, rv, N("upstream_errors_total"), "counter",
                       "Agent connects, port tunnels and upstream exchanges that failed.",
                       dp->n_upstream_fail);
  rv = osr_prom_single(out, rv, N("bytes_in_total"), "counter",
                       "Request body bytes forwarded to sandboxes (not counting spliced tunnels).",
                       m->bytes_in);
  rv = osr_prom_single(out, rv, N("bytes_out_total"), "counter",
                       "Response body bytes forwarded to clients (not counting spliced tunnels).",
                       m->bytes_out);
  rv = osr_prom_family(out, rv, N("activity_reports_total"), "counter",
                       "Activity batches sent to the gateway (ok, failed: retried next interval) "
                       "and sandboxes left unreported because the activity table was full "
                       "(dropped).");
  rv = osr_prom_u64(out, rv, N("activity_reports_total") "{result=\"ok\"}", m->act_reports);
  rv = osr_prom_u64(out, rv, N("activity_reports_total") "{result=\"failed\"}", m->act_failed);
  rv = osr_prom_u64(out, rv, N("activity_reports_total") "{result=\"dropped\"}", m->act_dropped);
  rv = osr_prom_single(out, rv, N("activity_sandboxes_total"), "counter",
                       "Per-sandbox activity reports put into batches.", m->act_sandboxes);
  rv = osr_prom_family(out, rv, N("endpoint_lookups_total"), "counter",
                       "Agent endpoint refresh: Redis binding-cache reads (ok, failed) and "
                       "requests served from the in-process cache (cached).");
  rv = osr_prom_u64(out, rv, N("endpoint_lookups_total") "{result=\"ok\"}", m->ep_lookups);
  rv = osr_prom_u64(out, rv, N("endpoint_lookups_total") "{result=\"failed\"}", m->ep_lookup_fail);
  rv = osr_prom_u64(out, rv, N("endpoint_lookups_total") "{result=\"cached\"}", m->ep_from_cache);
  return rv;
}

/* Constant-time compare of the Authorization header with "Bearer <key>". */
static int authorised(const osr_dataplane_t *dp, const osr_http_req_t *req)
{
  if (dp->cfg.metrics_key == NULL)
    return 1;
  const osr_iovec_t *h = osr_http_req_header(req, "authorization");
  size_t kl = strlen(dp->cfg.metrics_key);
  if (h == NULL || h->len != kl + 7 || strncmp(h->base, "Bearer ", 7) != 0)
    return 0;
  return CRYPTO_memcmp(h->base + 7, dp->cfg.metrics_key, kl) == 0;
}

void osr__dp_metrics_answer(osr_dataplane_t *dp, osr_http_req_t *req)
{
  if (!authorised(dp, req)) {
    osr__dp_count(dp, DP_KIND_NONE, 401);
    osr__dp_error(req, 401, NULL, "GET /metrics needs Authorization: Bearer <metrics key>");
    return;
  }
  osr_buf_t out;
  osr_buf_init(&out, METRICS_MAX);
  osr__dp_count(dp, DP_KIND_NONE, 200); /* counted before rendering: it shows itself */
  if (render(dp, &out) != 0) {
    osr_buf_dispose(&out);
    osr__dp_error(req, 500, NULL, "metrics too large");
    return;
  }
  if (osr_http_send(req, 200, "text/plain; version=0.0.4; charset=utf-8", osr_buf_data(&out),
                    out.len) != 0)
    osr_http_abort(req);
  osr_buf_dispose(&out);
}
