/*
 * The API router: a method + path table with {id} segments, request bodies
 * collected with a cap and parsed as JSON objects, authentication, typed
 * errors, per-route metrics, and the small endpoints that belong to no other
 * module (health, readiness, version, OpenAPI, metrics).
 *
 * A request goes through these steps, each of which may answer early:
 *   1. route      unknown path → 404 not_found; known path, other method →
 *                 405 method_not_allowed with Allow.
 *   2. auth       routes other than health/version/openapi/signing keys need
 *                 `Authorization: Bearer <key>`; missing/unknown → 401 with
 *                 WWW-Authenticate; a tenant key on an admin route → 403.
 *   3. body       routes that take a body collect it (cap
 *                 cfg->max_request_body → 413); a non-empty body must be
 *                 `Content-Type: application/json` (415 invalid_request) and
 *                 a JSON object (400 invalid_request with jansson's text and
 *                 position). Chunked bodies and HTTP/2 DATA work alike.
 *   4. handler    the route's handler answers with osr_gw_reply/osr_gw_error.
 * Steps 2 and 3 run concurrently (a store lookup for the key while the body
 * arrives); the handler starts when both are done.
 *
 * Call lifetime: the call is reference counted. The HTTP exchange holds one
 * reference (dropped in on_done), every asynchronous operation another
 * (osr_gw_call_hold). So a store callback that completes after the client
 * went away still finds valid memory, sees call->req == NULL and drops its
 * answer.
 */
#include "gateway/api.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "gateway/api_int.h"
#include "gateway/metrics.h"
#include "osr_config.h"
#include "util/buf.h"
#include "util/log.h"
#include "gateway/activity.h"
#include "util/mem.h"
#include "util/text.h"

/* AUTH_E2B: a tenant key (Bearer or X-API-KEY) on an E2B route, whose
 * answers are reshaped into E2B's bodies (api_e2b.c). */
typedef enum auth_level_e {
  AUTH_NONE = 0,
  AUTH_TENANT = 1,
  AUTH_ADMIN = 2,
  AUTH_E2B = 3
} auth_level_t;

typedef struct route_s {
  const char *method;
  const char *pattern;
  osr_gw_handler_t handler;
  auth_level_t auth;
  int body; /* collects a JSON body */
} route_t;

static void h_healthz(osr_gw_call_t *call);
static void h_readyz(osr_gw_call_t *call);
static void h_version(osr_gw_call_t *call);
static void h_openapi(osr_gw_call_t *call);
static void h_metrics(osr_gw_call_t *call);

/* The route table. tests/integration/admin/test_admin.py parses the ROUTE
 * lines below and checks them against openapi.json, so keep one per line. */
#define ROUTE(m, p, h, a, b)                                                                       \
  {                                                                                                \
    m, p, h, a, b                                                                                  \
  }
static const route_t routes[] = {
    ROUTE("GET", "/healthz", h_healthz, AUTH_NONE, 0),
    ROUTE("GET", "/readyz", h_readyz, AUTH_NONE, 0),
    ROUTE("GET", "/version", h_version, AUTH_NONE, 0),
    ROUTE("GET", "/openapi.json", h_openapi, AUTH_NONE, 0),
    ROUTE("GET", "/metrics", h_metrics, AUTH_ADMIN, 0),
    ROUTE("POST", "/v1/sandboxes", osr_gw_sandbox_create, AUTH_TENANT, 1),
    ROUTE("GET", "/v1/sandboxes", osr_gw_sandbox_list, AUTH_TENANT, 0),
    ROUTE("GET", "/v1/sandboxes/{id}", osr_gw_sandbox_get, AUTH_TENANT, 0),
    ROUTE("DELETE", "/v1/sandboxes/{id}", osr_gw_sandbox_delete, AUTH_TENANT, 0),
    ROUTE("POST", "/v1/sandboxes/{id}/timeout", osr_gw_sandbox_timeout, AUTH_TENANT, 1),
    ROUTE("POST", "/v1/sandboxes/{id}/tokens", osr_gw_sandbox_tokens, AUTH_TENANT, 1),
    ROUTE("POST", "/v1/plan", osr_gw_plan, AUTH_TENANT, 1),
    ROUTE("GET", "/v1/providers", osr_gw_providers_get, AUTH_TENANT, 0),
    ROUTE("POST", "/v1/keys", osr_gw_keys_create, AUTH_ADMIN, 1),
    ROUTE("GET", "/v1/keys", osr_gw_keys_list, AUTH_TENANT, 0),
    /* Before /v1/keys/{id}, which "signing" would match too. */
    ROUTE("GET", "/v1/keys/signing", osr_gw_keys_signing, AUTH_NONE, 0),
    ROUTE("DELETE", "/v1/keys/{id}", osr_gw_keys_revoke, AUTH_ADMIN, 0),
    ROUTE("GET", "/v1/audit", osr_gw_audit_list, AUTH_TENANT, 0),
    /* Data planes report traffic for idle timeouts (gateway/activity.c). */
    ROUTE("POST", "/v1/internal/activity", osr_gw_activity_post, AUTH_ADMIN, 1),
    /* The E2B-compatible front door (api_e2b.c, docs/e2b-compat.md). */
    ROUTE("POST", "/sandboxes", osr_gw_e2b_create, AUTH_E2B, 1),
    ROUTE("GET", "/sandboxes", osr_gw_e2b_list, AUTH_E2B, 0),
    ROUTE("POST", "/v2/sandboxes", osr_gw_e2b_create, AUTH_E2B, 1),
    ROUTE("GET", "/v2/sandboxes", osr_gw_e2b_list, AUTH_E2B, 0),
    ROUTE("GET", "/sandboxes/{id}", osr_gw_e2b_get, AUTH_E2B, 0),
    ROUTE("DELETE", "/sandboxes/{id}", osr_gw_e2b_kill, AUTH_E2B, 0),
    ROUTE("POST", "/sandboxes/{id}/timeout", osr_gw_e2b_timeout, AUTH_E2B, 1),
    ROUTE("POST", "/sandboxes/{id}/connect", osr_gw_e2b_connect, AUTH_E2B, 1),
    ROUTE("POST", "/v2/sandboxes/{id}/connect", osr_gw_e2b_connect, AUTH_E2B, 1),
    ROUTE("POST", "/sandboxes/{id}/pause", osr_gw_e2b_pause, AUTH_E2B, 1),
    ROUTE("GET", "/sandboxes/{id}/metrics", osr_gw_e2b_metrics, AUTH_E2B, 0),
};

/* /metrics output cap: far above what bounded label sets can produce. */
#define METRICS_MAX (8u << 20)

typedef struct api_call_s {
  osr_gw_call_t call;
  const route_t *rt;
  char method[8]; /* for metrics: "GET", ... or "other" */
  int refs;
  int pending; /* auth lookup + body collection still running */
  int aborted; /* the exchange ended before the answer */
} api_call_t;

static api_call_t *api_call(osr_gw_call_t *call)
{
  return osr_container_of(call, api_call_t, call);
}

void osr_gw_call_hold(osr_gw_call_t *call)
{
  api_call(call)->refs++;
}

void osr_gw_call_release(osr_gw_call_t *call)
{
  api_call_t *ac = api_call(call);
  if (--ac->refs > 0)
    return;
  json_decref(call->body);
  call->body = NULL;
  osr_free(ac);
}

/* ---- answers -------------------------------------------------------------- */

typedef struct write_s {
  char *json; /* json_dumps result (jansson allocator) */
} write_t;

static void on_written(osr_http_req_t *req, int status, void *arg)
{
  write_t *w = arg;
  (void)req;
  (void)status;
  osr_json_free(w->json);
  osr_free(w);
}

static void account(api_call_t *ac, int status)
{
  osr_gw_call_t *call = &ac->call;
  uint64_t dur = uv_hrtime() / 1000 - call->started_us;
  osr_metrics_http(call->gw->metrics, call->route, ac->method, status, dur);
}

/* Send `json` (jansson-allocated, stolen; NULL = no body) with content type
 * `ctype` and up to two extra headers. The body is written without a copy
 * and freed in the write callback. */
static void send_body(api_call_t *ac, int status, const char *ctype, char *json, size_t len,
                      const char *hname, const char *hvalue)
{
  osr_http_req_t *req = ac->call.req;
  osr_http_header_t h[3];
  size_t nh = 0;
  if (json != NULL) {
    h[nh].name = OSR_IOV_LIT("content-type");
    h[nh++].value = osr_iov(ctype, strlen(ctype));
    /* Answers carry per-caller data (and once, a key's secret). */
    h[nh].name = OSR_IOV_LIT("cache-control");
    h[nh++].value = OSR_IOV_LIT("no-store");
  }
  if (hname != NULL) {
    h[nh].name = osr_iov(hname, strlen(hname));
    h[nh++].value = osr_iov(hvalue, strlen(hvalue));
  }
  int rv = osr_http_respond(req, status, h, nh, json != NULL ? (int64_t)len : 0);
  if (rv != 0) {
    osr_json_free(json);
    osr_http_abort(req);
    return;
  }
  if (json == NULL) {
    rv = osr_http_write(req, NULL, 0, 1, NULL, NULL);
    if (rv != 0)
      osr_http_abort(req);
    return;
  }
  write_t *w = osr_xmalloc(sizeof(*w));
  w->json = json;
  osr_iovec_t iov = osr_iov(json, len);
  rv = osr_http_write(req, &iov, 1, 1, on_written, w);
  if (rv != 0) {
    on_written(req, rv, w);
    osr_http_abort(req);
  }
}

/* Common tail of every answer: mark done, count, send (unless the client is
 * gone). Returns 1 if the caller should send. */
static int begin_answer(api_call_t *ac, int status)
{
  osr_gw_call_t *call = &ac->call;
  if (call->done) {
    OSR_LOG_WARN("api", "%s answered twice (bug)", call->route != NULL ? call->route : "?");
    return 0;
  }
  call->done = 1;
  if (ac->aborted || call->req == NULL)
    return 0;
  account(ac, status);
  return 1;
}

static void reply_hdr(osr_gw_call_t *call, int status, json_t *body, const char *hname,
                      const char *hvalue)
{
  api_call_t *ac = api_call(call);
  char hv[256];
  if (call->reshape != NULL && !call->done) {
    const char *rn = NULL;
    hv[0] = '\0';
    body = call->reshape(call, &status, body, &rn, hv, sizeof(hv));
    if (rn != NULL) {
      hname = rn;
      hvalue = hv;
    }
  }
  if (!begin_answer(ac, status)) {
    json_decref(body);
    return;
  }
  char *s = NULL;
  size_t len = 0;
  if (body != NULL && status != 204 && status != 304) {
    s = json_dumps(body, JSON_COMPACT);
    if (s == NULL) { /* out of memory */
      json_decref(body);
      osr_http_abort(call->req);
      return;
    }
    len = strlen(s);
  }
  json_decref(body);
  /* The write may complete synchronously and end the exchange; keep the
   * call alive until send_body returns. */
  osr_gw_call_hold(call);
  send_body(ac, status, "application/json", s, len, hname, hvalue);
  osr_gw_call_release(call);
}

void osr_gw_reply(osr_gw_call_t *call, int status, json_t *body)
{
  reply_hdr(call, status, body, NULL, NULL);
}

void osr_gw_reply_text(osr_gw_call_t *call, int status, char *json, size_t len)
{
  if (call->reshape != NULL && !call->done) {
    /* Reshapers work on trees. */
    json_t *body = json != NULL ? json_loadb(json, len, 0, NULL) : NULL;
    osr_free(json);
    reply_hdr(call, status, body, NULL, NULL);
    return;
  }
  api_call_t *ac = api_call(call);
  if (!begin_answer(ac, status)) {
    osr_free(json);
    return;
  }
  /* send_body frees with jansson's allocator; the text came from ours. */
  char *s = NULL;
  if (json != NULL && status != 204 && status != 304) {
    json_malloc_t jmalloc = NULL;
    json_get_alloc_funcs(&jmalloc, NULL);
    s = jmalloc != NULL ? jmalloc(len + 1) : NULL;
    if (s == NULL) {
      osr_free(json);
      osr_http_abort(call->req);
      return;
    }
    memcpy(s, json, len);
    s[len] = '\0';
  } else {
    len = 0;
  }
  osr_free(json);
  osr_gw_call_hold(call);
  send_body(ac, status, "application/json", s, len, NULL, NULL);
  osr_gw_call_release(call);
}

void osr__gw_error_hdr(osr_gw_call_t *call, int status, const char *code, const char *message,
                       json_t *details, const char *hname, const char *hvalue)
{
  json_t *err = json_object();
  if (details != NULL) {
    json_object_update(err, details);
    json_decref(details);
  }
  /* code and message win over details with the same names. */
  json_object_set_new(err, "code", json_string(code));
  json_object_set_new(err, "message", json_string(message != NULL ? message : code));
  json_t *body = json_object();
  json_object_set_new(body, "error", err);
  reply_hdr(call, status, body, hname, hvalue);
}

void osr_gw_error(osr_gw_call_t *call, int status, const char *code, const char *message,
                  json_t *details)
{
  osr__gw_error_hdr(call, status, code, message, details, NULL, NULL);
}

void osr_gw_error_from(osr_gw_call_t *call, int err, const char *what)
{
  char msg[256];
  const char *w = what != NULL ? what : "request";
  switch (err) {
  case OSR_EUNAVAILABLE:
    snprintf(msg, sizeof(msg), "%s: the store is unavailable, retry later", w);
    osr_gw_error(call, 503, "unavailable", msg, NULL);
    return;
  case OSR_ESHUTDOWN:
    snprintf(msg, sizeof(msg), "%s: the gateway is shutting down", w);
    osr_gw_error(call, 503, "unavailable", msg, NULL);
    return;
  case OSR_ENOTFOUND:
    snprintf(msg, sizeof(msg), "%s: not found", w);
    osr_gw_error(call, 404, "not_found", msg, NULL);
    return;
  case OSR_ECONFLICT:
    snprintf(msg, sizeof(msg), "%s: conflicts with an earlier request", w);
    osr_gw_error(call, 409, "idempotency_conflict", msg, NULL);
    return;
  case OSR_EINVAL:
    snprintf(msg, sizeof(msg), "%s: invalid request", w);
    osr_gw_error(call, 400, "invalid_request", msg, NULL);
    return;
  case OSR_ETOOLARGE:
    snprintf(msg, sizeof(msg), "%s: too large", w);
    osr_gw_error(call, 413, "payload_too_large", msg, NULL);
    return;
  case OSR_EACCES:
    snprintf(msg, sizeof(msg), "%s: forbidden", w);
    osr_gw_error(call, 403, "forbidden", msg, NULL);
    return;
  default:
    snprintf(msg, sizeof(msg), "%s: %s", w, osr__gw_strerror(err));
    osr_gw_error(call, 500, "internal", msg, NULL);
    return;
  }
}

/* ---- helpers -------------------------------------------------------------- */

const char *osr__gw_strerror(int err)
{
  switch (err) {
  case OSR_EUNAVAILABLE:
    return "store unavailable";
  case OSR_ECONFLICT:
    return "conflict";
  case OSR_ENOTFOUND:
    return "not found";
  default:
    break;
  }
  if (err <= OSR_PERR_CAPACITY && err >= OSR_PERR_UNSUPPORTED)
    return osr_provider_err_name(err);
  return osr_strerror(err);
}

void osr_gw_rfc3339(int64_t ms, char out[32])
{
  if (ms < 0)
    ms = 0;
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  char date[24];
  gmtime_r(&t, &tm);
  /* strftime keeps the compiler from doubting the field widths; years past
   * 9999 do not happen in practice and would only truncate. */
  strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out, 32, "%.19s.%03dZ", date, (int)(ms % 1000));
}

int osr_gw_query(const osr_gw_call_t *call, const char *name, char *out, size_t outlen)
{
  if (call->req == NULL || outlen == 0)
    return -1;
  const char *p = call->req->query.base;
  const char *end = p + call->req->query.len;
  size_t nlen = strlen(name);
  while (p < end) {
    const char *amp = memchr(p, '&', (size_t)(end - p));
    const char *pe = amp != NULL ? amp : end;
    const char *eq = memchr(p, '=', (size_t)(pe - p));
    const char *ke = eq != NULL ? eq : pe;
    if ((size_t)(ke - p) == nlen && memcmp(p, name, nlen) == 0) {
      size_t n = 0;
      for (const char *v = eq != NULL ? eq + 1 : pe; v < pe; v++) {
        int c = (unsigned char)*v;
        if (c == '%') {
          int hi = v + 2 < pe ? osr_hexval(v[1]) : -1;
          int lo = v + 2 < pe ? osr_hexval(v[2]) : -1;
          if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
            return OSR_ETOOLARGE;
          c = hi * 16 + lo;
          v += 2;
        }
        if (n + 1 >= outlen)
          return OSR_ETOOLARGE;
        out[n++] = (char)c;
      }
      out[n] = '\0';
      return (int)n;
    }
    p = pe + 1;
  }
  return -1;
}

/* ---- module state --------------------------------------------------------- */

/* gw->api is owned by auth.c (its cache); api.c only forwards. */
int osr_gw_api_init(osr_gw_t *gw)
{
  int rv = osr__gw_auth_init(gw);
  int rv2 = osr_gw_e2b_init(gw);
  return rv != 0 ? rv : rv2;
}

void osr_gw_api_dispose(osr_gw_t *gw)
{
  osr__gw_auth_dispose(gw);
}

/* ---- routing -------------------------------------------------------------- */

/* Match `path` against a pattern; {id} takes one segment of 1..39
 * characters [a-z0-9] (sandbox and key ids), copied to id. Anything else,
 * percent-encoding included, does not match: ids never need escaping. */
static int match(const char *pattern, const char *path, size_t plen, char id[OSR_ID_MAX])
{
  const char *p = path, *pend = path + plen;
  const char *q = pattern;
  while (*q != '\0') {
    if (strncmp(q, "{id}", 4) == 0) {
      size_t n = 0;
      while (p < pend && *p != '/') {
        char c = *p;
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) || n + 1 >= OSR_ID_MAX)
          return 0;
        id[n++] = c;
        p++;
      }
      if (n == 0)
        return 0;
      id[n] = '\0';
      q += 4;
      continue;
    }
    if (p == pend || *p != *q)
      return 0;
    p++;
    q++;
  }
  return p == pend;
}

static void step_done(api_call_t *ac);

static void on_auth(osr_gw_call_t *call, int status)
{
  api_call_t *ac = api_call(call);
  if (call->done)
    return;
  if (status == OSR_ENOTFOUND || status == OSR_EACCES) {
    osr__gw_error_hdr(call, 401, "unauthorized", "unknown or revoked API key", NULL,
                      "www-authenticate", "Bearer realm=\"osr\", error=\"invalid_token\"");
    return;
  }
  if (status != 0) {
    osr_gw_error_from(call, status, "authentication");
    return;
  }
  step_done(ac);
}

static int is_json_type(const osr_iovec_t *v)
{
  static const char ct[] = "application/json";
  size_t n = sizeof(ct) - 1;
  if (v == NULL || v->len < n || strncasecmp(v->base, ct, n) != 0)
    return 0;
  if (v->len == n)
    return 1;
  char c = v->base[n];
  return c == ';' || c == ' ' || c == '\t';
}

static void on_body(osr_http_req_t *req, osr_iovec_t body, int status)
{
  api_call_t *ac = req->data;
  osr_gw_call_t *call = &ac->call;
  if (call->done)
    return;
  if (status == OSR_ETOOLARGE) {
    char msg[96];
    snprintf(msg, sizeof(msg), "request body exceeds %zu bytes", call->gw->cfg->max_request_body);
    osr_gw_error(call, 413, "payload_too_large", msg, NULL);
    return;
  }
  if (status == OSR_ENOMEM) {
    osr_gw_error(call, 503, "unavailable", "out of memory reading the body", NULL);
    return;
  }
  if (status != 0)
    return; /* the exchange is ending; on_done follows */
  if (body.len > 0) {
    if (!is_json_type(osr_http_req_header(req, "content-type"))) {
      osr_gw_error(call, 415, "invalid_request", "the body must be Content-Type: application/json",
                   NULL);
      return;
    }
    json_error_t jerr;
    json_t *j = json_loadb(body.base, body.len, JSON_REJECT_DUPLICATES, &jerr);
    if (j == NULL) {
      char msg[256];
      snprintf(msg, sizeof(msg), "malformed JSON: %s", jerr.text);
      osr_gw_error(call, 400, "invalid_request", msg,
                   json_pack("{s:i,s:i,s:i}", "line", jerr.line, "column", jerr.column, "position",
                             jerr.position));
      return;
    }
    if (!json_is_object(j)) {
      json_decref(j);
      osr_gw_error(call, 400, "invalid_request", "the body must be a JSON object", NULL);
      return;
    }
    call->body = j;
  }
  step_done(ac);
}

/* Auth and body are both in: check the role, then run the handler. */
static void step_done(api_call_t *ac)
{
  osr_gw_call_t *call = &ac->call;
  if (--ac->pending > 0 || call->done)
    return;
  if (ac->rt->auth == AUTH_ADMIN && call->auth.role != OSR_ROLE_ADMIN) {
    osr_gw_error(call, 403, "forbidden", "this endpoint needs an admin key", NULL);
    return;
  }
  ac->rt->handler(call);
}

static void on_done(osr_http_req_t *req, int status)
{
  api_call_t *ac = req->data;
  osr_gw_call_t *call = &ac->call;
  (void)status;
  call->req = NULL;
  if (!call->done) {
    /* 499 (nginx's "client closed request") keeps aborted calls visible in
     * the request metrics without inventing a real status. */
    ac->aborted = 1;
    uint64_t dur = uv_hrtime() / 1000 - call->started_us;
    osr_metrics_http(call->gw->metrics, call->route, ac->method, 499, dur);
    if (call->on_abort != NULL)
      call->on_abort(call);
  }
  osr_gw_call_release(call);
}

void osr_gw_api_on_request(osr_http_req_t *req, void *data)
{
  osr_gw_t *gw = data;
  api_call_t *ac = osr_xcalloc(1, sizeof(*ac));
  osr_gw_call_t *call = &ac->call;
  call->gw = gw;
  call->req = req;
  call->started_us = uv_hrtime() / 1000;
  ac->refs = 1; /* the HTTP exchange's; dropped in on_done */
  req->data = ac;
  req->on_done = on_done;
  snprintf(ac->method, sizeof(ac->method), "%.*s",
           (int)(req->method.len < sizeof(ac->method) ? req->method.len : 0), req->method.base);

  /* 1. route */
  char allow[64] = "";
  const route_t *rt = NULL;
  int path_known = 0;
  for (size_t i = 0; i < OSR_ARRAY_SIZE(routes); i++) {
    char id[OSR_ID_MAX];
    if (!match(routes[i].pattern, req->path.base, req->path.len, id))
      continue;
    if (!path_known)
      call->route = routes[i].pattern;
    path_known = 1;
    size_t ml = strlen(routes[i].method);
    if (req->method.len == ml && memcmp(req->method.base, routes[i].method, ml) == 0) {
      rt = &routes[i];
      call->route = rt->pattern;
      memcpy(call->path_id, id, sizeof(call->path_id));
      break;
    }
    size_t al = strlen(allow);
    snprintf(allow + al, sizeof(allow) - al, "%s%s", al ? ", " : "", routes[i].method);
  }
  /* E2B's SDKs read errors from the body's integer code: everything under
   * E2B's prefixes answers in that shape, unknown paths included (an unknown
   * sandbox id that the {id} pattern refuses must still read as 404). */
  if ((rt != NULL && rt->auth == AUTH_E2B) ||
      (rt == NULL && osr_gw_e2b_path(req->path.base, req->path.len)))
    call->reshape = osr_gw_e2b_reshape_error;
  if (rt == NULL) {
    if (!path_known) {
      osr_gw_error(call, 404, "not_found", "no such endpoint", NULL);
    } else {
      char msg[96];
      snprintf(msg, sizeof(msg), "use %s", allow);
      osr__gw_error_hdr(call, 405, "method_not_allowed", msg, NULL, "allow", allow);
    }
    return;
  }
  ac->rt = rt;

  /* 2. auth (may go to the store) and 3. body, concurrently. pending
   * counts both plus this function's own step, so nothing dispatches
   * before the setup below is complete. */
  ac->pending = 1;
  if (rt->auth != AUTH_NONE) {
    ac->pending++;
    osr__auth_result_t ar = osr__gw_authenticate(call, on_auth);
    if (ar == OSR__AUTH_MISSING || ar == OSR__AUTH_INVALID) {
      osr__gw_error_hdr(call, 401, "unauthorized",
                        ar == OSR__AUTH_MISSING ? "missing `Authorization: Bearer <key>` (or `X-API-KEY: <key>`)"
                                                : "unknown or revoked API key",
                        NULL, "www-authenticate",
                        ar == OSR__AUTH_MISSING ? "Bearer realm=\"osr\""
                                                : "Bearer realm=\"osr\", error=\"invalid_token\"");
      return;
    }
    if (ar == OSR__AUTH_UNAVAILABLE) {
      osr_gw_error(call, 503, "unavailable", "cannot check the API key now, retry later", NULL);
      return;
    }
    if (ar == OSR__AUTH_OK)
      ac->pending--;
  }
  if (rt->body && (req->content_length > 0 || (req->content_length < 0 && req->expect_body))) {
    ac->pending++;
    int rv = osr_http_req_read_body(req, gw->cfg->max_request_body, on_body);
    if (rv != 0) {
      ac->pending--;
      on_body(req, osr_iov(NULL, 0), rv);
      return;
    }
  }
  step_done(ac);
}

/* ---- the router's own endpoints ------------------------------------------ */

static json_t *health_json(osr_gw_t *gw, const char *status)
{
  return json_pack("{s:s,s:s,s:s,s:I}", "status", status, "version", OSR_VERSION, "tls",
                   OSR_TLS_BACKEND, "uptime_ms", (json_int_t)(osr_now_ms() - gw->started_ms));
}

static void h_healthz(osr_gw_call_t *call)
{
  osr_gw_reply(call, 200, health_json(call->gw, "ok"));
}

/* Readiness asks the store for a key that cannot exist: "not found" proves
 * a full round trip to the database worked. */
static void on_ready_probe(int status, const osr_api_key_t *k, void *data)
{
  osr_gw_call_t *call = data;
  (void)k;
  if (call->gw->draining) {
    osr_gw_reply(call, 503, health_json(call->gw, "draining"));
  } else if (status == 0 || status == OSR_ENOTFOUND) {
    json_t *j = health_json(call->gw, "ok");
    json_object_set_new(j, "store", json_string("ok"));
    osr_gw_reply(call, 200, j);
  } else {
    json_t *j = health_json(call->gw, "unavailable");
    json_object_set_new(j, "store", json_string(osr__gw_strerror(status)));
    osr_gw_reply(call, 503, j);
  }
  osr_gw_call_release(call);
}

static void h_readyz(osr_gw_call_t *call)
{
  osr_gw_t *gw = call->gw;
  /* Readiness turns false while draining so load balancers stop sending. */
  if (gw->draining) {
    osr_gw_reply(call, 503, health_json(gw, "draining"));
    return;
  }
  if (gw->store == NULL) {
    osr_gw_reply(call, 503, health_json(gw, "starting"));
    return;
  }
  static const char probe[] = "0000000000000000000000000000000000000000000000000000000000000000";
  osr_gw_call_hold(call);
  int rv = osr_store_key_lookup(gw->store, probe, on_ready_probe, call);
  if (rv != 0)
    on_ready_probe(rv, NULL, call);
}

static void h_version(osr_gw_call_t *call)
{
  osr_gw_reply(call, 200, json_pack("{s:s,s:s}", "version", OSR_VERSION, "tls", OSR_TLS_BACKEND));
}

/* Raw (non-JSON) answer: the body is copied by osr_http_send. */
static void reply_raw(osr_gw_call_t *call, const char *ctype, const char *body, size_t len)
{
  api_call_t *ac = api_call(call);
  if (!begin_answer(ac, 200))
    return;
  osr_gw_call_hold(call);
  if (osr_http_send(call->req, 200, ctype, body, len) != 0)
    osr_http_abort(call->req);
  osr_gw_call_release(call);
}

static void h_openapi(osr_gw_call_t *call)
{
  reply_raw(call, "application/json", osr_openapi_json, osr_openapi_json_len);
}

static void h_metrics(osr_gw_call_t *call)
{
  osr_buf_t out;
  osr_buf_init(&out, METRICS_MAX);
  int rv = osr_metrics_render(call->gw->metrics, call->gw, &out);
  if (rv != 0) {
    osr_buf_dispose(&out);
    osr_gw_error_from(call, rv, "metrics");
    return;
  }
  reply_raw(call, "text/plain; version=0.0.4; charset=utf-8", osr_buf_data(&out), out.len);
  osr_buf_dispose(&out);
}
