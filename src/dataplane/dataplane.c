/*
 * osr-dataplane core: the HTTP server, token checks, key loading, Redis
 * revocations and shutdown. Forwarding lives in proxy.c, routing in route.c.
 *
 * Every request is decided locally: route -> scope -> token (signature,
 * expiry, key id: offline, with the keyring in memory) -> revocation list ->
 * claims allow this sandbox/scope/port -> the agent endpoint named by the
 * token. Nothing here calls the gateway, so streams keep running and new
 * ones connect while it is down. A refused request is answered here and no
 * byte of it reaches the sandbox.
 */
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/redis.h"
#include "dataplane/dp_int.h"
#include "dataplane/exec.h"
#include "dataplane/exec_mux.h"
#include "token/cache.h"
#include "net/addr.h"
#include "net/tls.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/text.h"

#define MOD              OSR_DP_MOD
#define DP_KEYS_JSON_MAX (1024 * 1024)
#define DP_REVOKE_MAX    100000
#define DP_REVOKE_TTL_S  86400 /* longer than any token lifetime */
/* Verified tokens remembered (~1 KiB each): far more than the clients one
 * data plane serves at once hold distinct tokens. */
#define DP_TOKEN_CACHE_MAX 4096

static int64_t now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec;
}

/* ---- answers ---------------------------------------------------------------- */

static int is_rpc_path(osr_iovec_t p)
{
  return p.len > 1 && memchr(p.base + 1, '.', p.len - 1) != NULL &&
         memchr(p.base + 1, '/', p.len - 1) != NULL;
}

static const char *connect_code(int status)
{
  switch (status) {
  case 400:
    return "invalid_argument";
  case 401:
    return "unauthenticated";
  case 403:
    return "permission_denied";
  case 404:
    return "not_found";
  case 501:
    return "unimplemented";
  default:
    return "unavailable";
  }
}

void osr__dp_error(osr_http_req_t *req, int status, const char *sid, const char *msg)
{
  json_t *j;
  /* The unknown/unreachable sandbox answer is E2B's proxy shape (the SDK
   * maps 502 to "not running"); auth failures on Connect RPC paths use the
   * Connect error shape envd itself would send, so SDK errors read right. */
  if (status != 502 && req->path.len > 0 && is_rpc_path(req->path))
    j = json_pack("{s:s,s:s}", "code", connect_code(status), "message", msg);
  else if (sid != NULL)
    j = json_pack("{s:s,s:s,s:i}", "sandboxId", sid, "message", msg, "code", status);
  else
    j = json_pack("{s:i,s:s}", "code", status, "message", msg);
  char *s = j != NULL ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  if (s == NULL || osr_http_send(req, status, "application/json", s, strlen(s)) != 0)
    osr_http_abort(req);
  osr_json_free(s);
}

void osr__dp_error_typed(osr_http_req_t *req, int status, const char *sid, const char *type,
                         const char *msg)
{
  json_t *j = json_pack("{s:i,s:s,s:s}", "code", status, "type", type, "message", msg);
  if (j != NULL && sid != NULL)
    json_object_set_new(j, "sandboxId", json_string(sid));
  char *s = j != NULL ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  if (s == NULL || osr_http_send(req, status, "application/json", s, strlen(s)) != 0)
    osr_http_abort(req);
  osr_json_free(s);
}

static void refuse(osr_dataplane_t *dp, osr_http_req_t *req, int status, const char *sid,
                   const char *why)
{
  dp->n_refused++;
  osr__dp_count(dp, DP_KIND_NONE, status);
  OSR_LOG_INFO(MOD, "%s: %.*s %.*s refused %d: %s", req->peer, (int)req->method.len,
               req->method.base, (int)req->path.len, req->path.base, status, why);
  osr__dp_error(req, status, sid, why);
}

/* ---- requests ---------------------------------------------------------------- */

static void on_request(osr_http_req_t *req, void *data)
{
  osr_dataplane_t *dp = data;
  dp->n_requests++;
  if (dp->stopping) {
    osr__dp_error(req, 503, NULL, "the data plane is shutting down");
    return;
  }
  dp_route_t rt;
  /* The exec console (exec.c) has its own paths; it needs scope exec. */
  int rv = osr__dp_exec_route(req, &rt);
  int exec = rv == 1;
  if (rv == 0)
    rv = osr__dp_route(req, dp->cfg.domain, &rt);
  else if (exec)
    rv = 0;
  if (rv == OSR_ENOENT && req->path.len == 8 && memcmp(req->path.base, "/metrics", 8) == 0 &&
      req->method.len == 3 && memcmp(req->method.base, "GET", 3) == 0) {
    osr__dp_metrics_answer(dp, req); /* only when no sandbox is named */
    return;
  }
  if (rv == OSR_ENOENT) {
    refuse(dp, req, 400, NULL,
           "no sandbox named: send E2b-Sandbox-Id and E2b-Sandbox-Port, use the host "
           "<port>-<sandboxId>.<domain> or the path /sbx/<sandboxId>/<port>/");
    return;
  }
  if (rv != 0) {
    refuse(dp, req, 400, NULL, "malformed sandbox id or port");
    return;
  }
  unsigned scope = OSR_SCOPE_EXEC;
  if (!exec && osr__dp_scope(rt.port, rt.path, &scope) != 0) {
    refuse(dp, req, 403, rt.sandbox_id, "this path is not reachable through the data plane");
    return;
  }
  osr_iovec_t tok;
  dp_tok_src_t src = osr__dp_token(req, &tok);
  if (src == DP_TOK_NONE) {
    osr__dp_count_auth(dp, 0);
    refuse(dp, req, 401, rt.sandbox_id, "missing access token");
    return;
  }
  if (dp->kr == NULL) {
    refuse(dp, req, 503, rt.sandbox_id, "signing keys not loaded yet");
    return;
  }
  osr_token_claims_t c;
  int64_t now = now_s();
  /* Cached: a full Ed25519 verify per request would cost ~50x the proxying
   * itself (token/cache.h); revocation is checked below either way. */
  rv = osr_token_cache_verify(dp->tcache, dp->kr, tok.base, tok.len, now, dp->cfg.token_leeway_s,
                              &c);
  if (rv == 0 && osr_revocations_contains(dp->rev, c.sandbox_id, now))
    rv = OSR_ETOKEN_REVOKED;
  if (rv != 0) {
    osr__dp_count_auth(dp, rv);
    refuse(dp, req, 401, rt.sandbox_id, osr_token_strerror(rv));
    return;
  }
  if (scope == 0) /* /health: any token of this sandbox */
    rv = strcmp(c.sandbox_id, rt.sandbox_id) == 0 ? 0 : OSR_ETOKEN_SANDBOX;
  else
    rv = osr_token_allows(&c, rt.sandbox_id, scope, rt.port);
  if (rv != 0) {
    osr__dp_count_auth(dp, rv);
    refuse(dp, req, 403, rt.sandbox_id, osr_token_strerror(rv));
    return;
  }
  char addr[OSR_ADDR_HOST_MAX + OSR_ADDR_PATH_MAX + 16];
  int tls = 0;
  /* Where it can have moved (resume, migration): the binding cache's. */
  const char *ep = osr__dp_endpoint_for(dp, c.sandbox_id);
  if (ep == NULL)
    ep = c.agent_endpoint;
  if (ep[0] == '\0' || osr__dp_endpoint(ep, addr, sizeof(addr), &tls) != 0 ||
      (tls && dp->client_tls == NULL)) {
    refuse(dp, req, 502, rt.sandbox_id, "The sandbox was not found");
    return;
  }
  /* A sandbox on a remote provider (E2B): its own envd, its own token. */
  dp_upstream_t up;
  int remote = osr__dp_upstream_open(dp, ep, c.sandbox_id, &up);
  if (remote < 0 || (remote > 0 && osr__dp_upstream_addr(&up, rt.port, addr, sizeof(addr)) != 0)) {
    OSR_LOG_WARN(MOD, "sandbox %s: its upstream credential cannot be opened (agent secret?)",
                 rt.sandbox_id);
    refuse(dp, req, 502, rt.sandbox_id, "The sandbox was not found");
    return;
  }
  if (exec && remote > 0) {
    refuse(dp, req, 501, rt.sandbox_id,
           "the exec console needs osr-agent; this sandbox runs on its provider's own envd");
    return;
  }
  if (exec) {
    /* Activity: the session's start only (exec.c does not hold an entry
     * for the session's lifetime yet, see docs/dataplane.md). */
    osr__dp_act_close(dp, osr__dp_act_open(dp, rt.sandbox_id));
    osr__dp_exec(dp, req, addr, tls, rt.sandbox_id);
    return;
  }
  char target[16384];
  if (osr__dp_target(rt.path, rt.query, target, sizeof(target)) < 0) {
    refuse(dp, req, 414, rt.sandbox_id, "request target too long");
    return;
  }
  OSR_LOG_DEBUG(MOD, "%s: %.*s %s -> %s port %u", req->peer, (int)req->method.len, req->method.base,
                target, addr, rt.port);
  if (remote > 0)
    osr__dp_forward_upstream(dp, req, addr, tls, rt.port, target, rt.sandbox_id, src, &up);
  else
    osr__dp_forward(dp, req, addr, tls, rt.port, target, rt.sandbox_id, src);
}

/* ---- keys ------------------------------------------------------------------- */

static void set_keyring(osr_dataplane_t *dp, osr_keyring_t *kr)
{
  osr_keyring_free(dp->kr_owned);
  dp->kr_owned = kr;
  dp->kr = kr;
}

typedef struct keys_work_s {
  uv_work_t w;
  osr_dataplane_t *dp;
  osr_keyring_t *kr;
  int rv;
  char err[256];
} keys_work_t;

/* Thread pool: reading key files must not block the loop (STYLE 21). */
static void keys_dir_work(uv_work_t *w)
{
  keys_work_t *k = osr_container_of(w, keys_work_t, w);
  k->kr = osr_keyring_new();
  k->rv = osr_keyring_load_dir(k->kr, k->dp->cfg.keys_dir, 0, k->err, sizeof(k->err));
}

static void keys_dir_done(uv_work_t *w, int status)
{
  keys_work_t *k = osr_container_of(w, keys_work_t, w);
  osr_dataplane_t *dp = k->dp;
  dp->keys_busy = 0;
  if (status == 0 && k->rv == 0 && !dp->stopping) {
    set_keyring(dp, k->kr);
  } else {
    if (k->rv != 0)
      OSR_LOG_WARN(MOD, "reloading keys from %s: %s (keeping the previous keys)", dp->cfg.keys_dir,
                   k->err);
    osr_keyring_free(k->kr);
  }
  osr_free(k);
  if (dp->stopping)
    osr__dp_maybe_finish(dp);
}

/* GET keys_url with the HTTP client; body capped. */
typedef struct keys_fetch_s {
  osr_dataplane_t *dp;
  osr_buf_t body;
  int status;
  char path[1024];
  char authority[300];
} keys_fetch_t;

static void keys_fetch_end(keys_fetch_t *f, int ok)
{
  osr_dataplane_t *dp = f->dp;
  dp->keys_busy = 0;
  if (ok && !dp->stopping) {
    osr_keyring_t *kr = osr_keyring_new();
    if (osr_keyring_add_public_json(kr, osr_buf_data(&f->body), f->body.len) == 0) {
      set_keyring(dp, kr);
      OSR_LOG_DEBUG(MOD, "keys loaded from %s", dp->cfg.keys_url);
    } else {
      OSR_LOG_WARN(MOD, "keys from %s: not a key list (keeping the previous keys)",
                   dp->cfg.keys_url);
      osr_keyring_free(kr);
    }
  }
  osr_buf_dispose(&f->body);
  osr_free(f);
  if (dp->stopping)
    osr__dp_maybe_finish(dp);
}

static void kf_on_response(osr_http_creq_t *r, int status, const osr_http_header_t *h, size_t n,
                           void *data)
{
  (void)r;
  (void)h;
  (void)n;
  ((keys_fetch_t *)data)->status = status;
}

static void kf_on_body(osr_http_creq_t *r, const osr_iovec_t *chunk, int status, void *data)
{
  keys_fetch_t *f = data;
  if (status == 0) {
    if (osr_buf_append(&f->body, chunk->base, chunk->len) != 0)
      osr_http_creq_cancel(r);
    return;
  }
  osr_http_client_close(r->client); /* one request per connection: simple */
  if (status != OSR_EOF || f->status != 200)
    OSR_LOG_WARN(MOD, "fetching keys from %s: %s", f->dp->cfg.keys_url,
                 status != OSR_EOF ? osr_strerror(status) : "not HTTP 200");
  keys_fetch_end(f, status == OSR_EOF && f->status == 200);
}

static const osr_http_client_events_t kf_events = {kf_on_response, kf_on_body};

static void kf_connected(osr_http_client_t *c, int status, void *data)
{
  keys_fetch_t *f = data;
  if (status != 0) {
    OSR_LOG_WARN(MOD, "fetching keys from %s: %s", f->dp->cfg.keys_url, osr_strerror(status));
    keys_fetch_end(f, 0);
    return;
  }
  osr_http_client_req_t rq = {"GET", f->path, f->authority, NULL, 0, 0};
  osr_http_creq_t *r;
  if (osr_http_client_request(c, &rq, &kf_events, f, &r) != 0) {
    osr_http_client_close(c);
    keys_fetch_end(f, 0);
  }
}

static void keys_refresh(osr_dataplane_t *dp)
{
  if (dp->keys_busy || dp->stopping || dp->cfg.keyring != NULL)
    return;
  if (dp->cfg.keys_dir != NULL) {
    keys_work_t *k = osr_xcalloc(1, sizeof(*k));
    k->dp = dp;
    if (uv_queue_work(dp->loop, &k->w, keys_dir_work, keys_dir_done) != 0) {
      osr_free(k);
      return;
    }
    dp->keys_busy = 1;
    return;
  }
  if (dp->cfg.keys_url == NULL)
    return;
  const char *u = dp->cfg.keys_url;
  int tls = strncmp(u, "https://", 8) == 0;
  const char *hp = u + (tls ? 8 : 7);
  size_t hn = strcspn(hp, "/");
  keys_fetch_t *f = osr_xcalloc(1, sizeof(*f));
  f->dp = dp;
  osr_buf_init(&f->body, DP_KEYS_JSON_MAX);
  osr_str_copy(f->path, sizeof(f->path), hp[hn] != '\0' ? hp + hn : "/");
  snprintf(f->authority, sizeof(f->authority), "%.*s", (int)hn, hp);
  char addr[320];
  snprintf(addr, sizeof(addr), "%.*s", (int)hn, hp);
  osr_addr_t a;
  if (osr_addr_parse(addr, &a) != 0)
    snprintf(addr, sizeof(addr), "%.*s:%d", (int)hn, hp, tls ? 443 : 80);
  osr_http_client_opts_t o;
  memset(&o, 0, sizeof(o));
  o.tls = tls ? dp->client_tls : NULL;
  o.connect_timeout_ms = 5000;
  o.idle_timeout_ms = 10000;
  if (osr_http_client_connect(dp->loop, addr, &o, kf_connected, f) != 0) {
    OSR_LOG_WARN(MOD, "bad --keys-url %s", u);
    osr_buf_dispose(&f->body);
    osr_free(f);
    return;
  }
  dp->keys_busy = 1;
}

static void on_keys_timer(uv_timer_t *t)
{
  keys_refresh(t->data);
}

static void on_pool_timer(uv_timer_t *t)
{
  osr_dataplane_t *dp = t->data;
  osr__dp_pools_sweep(dp, UINT64_MAX);
  osr__dp_mux_sweep(dp, dp->cfg.exec_mux_idle_ms);
}

/* ---- revocations -------------------------------------------------------------- */

/* The gateway publishes an invalidation when a binding is killed, expires
 * or is lost (today it publishes for nothing else), so every id seen here
 * is revoked at once. "*" (the subscriber reconnected and may have missed
 * messages) cannot name ids: tokens' short lifetimes bound that window. */
static void on_invalidate(const char *sandbox_id, void *data)
{
  osr_dataplane_t *dp = data;
  if (strcmp(sandbox_id, "*") == 0) {
    OSR_LOG_INFO(MOD, "redis: invalidations may have been missed during an outage");
    return;
  }
  osr_revocations_add(dp->rev, sandbox_id, now_s());
  osr__dp_endpoint_forget(dp, sandbox_id);
  osr__dp_upstream_forget(dp, sandbox_id);
  OSR_LOG_INFO(MOD, "revoked tokens of sandbox %s", sandbox_id);
}

/* ---- start / stop ------------------------------------------------------------- */

static char *dup_into(char **w, const char *s)
{
  if (s == NULL)
    return NULL;
  size_t n = strlen(s) + 1;
  char *r = *w;
  memcpy(r, s, n);
  *w += n;
  return r;
}

static void copy_config(osr_dataplane_t *dp, const osr_dataplane_config_t *cfg)
{
  const char *strs[] = {cfg->keys_dir,    cfg->keys_url,   cfg->redis_url, cfg->redis_prefix,
                        cfg->domain,      cfg->tls_cert,   cfg->tls_key,   cfg->gateway_url,
                        cfg->gateway_key, cfg->metrics_key};
  size_t total = 0;
  for (size_t i = 0; i < OSR_ARRAY_SIZE(strs); i++)
    total += strs[i] != NULL ? strlen(strs[i]) + 1 : 0;
  for (size_t i = 0; i < cfg->nlisten && i < OSR_DP_MAX_LISTEN; i++)
    total += strlen(cfg->listen[i]) + 1;
  dp->strings = osr_xmalloc(total + 1);
  char *w = dp->strings;
  dp->cfg = *cfg;
  dp->cfg.keys_dir = dup_into(&w, cfg->keys_dir);
  dp->cfg.keys_url = dup_into(&w, cfg->keys_url);
  dp->cfg.redis_url = dup_into(&w, cfg->redis_url);
  dp->cfg.redis_prefix = dup_into(&w, cfg->redis_prefix);
  dp->cfg.domain = dup_into(&w, cfg->domain);
  dp->cfg.tls_cert = dup_into(&w, cfg->tls_cert);
  dp->cfg.tls_key = dup_into(&w, cfg->tls_key);
  dp->cfg.gateway_url = dup_into(&w, cfg->gateway_url);
  dp->cfg.gateway_key = dup_into(&w, cfg->gateway_key);
  dp->cfg.metrics_key = dup_into(&w, cfg->metrics_key);
  for (size_t i = 0; i < cfg->nlisten && i < OSR_DP_MAX_LISTEN; i++)
    dp->cfg.listen[i] = dup_into(&w, cfg->listen[i]);
  if (cfg->agent_secret != NULL) {
    memcpy(dp->agent_secret, cfg->agent_secret, sizeof(dp->agent_secret));
    dp->cfg.agent_secret = dp->agent_secret;
  }
  if (dp->cfg.keys_refresh_ms == 0)
    dp->cfg.keys_refresh_ms = 60000;
  if (dp->cfg.max_conns == 0)
    dp->cfg.max_conns = 10000;
  if (dp->cfg.max_body == 0)
    dp->cfg.max_body = 1ull << 40;
  /* Enough for the connections a busy client set keeps in flight: with
   * fewer idle slots than concurrent requests, every burst closes the
   * surplus and the next one pays a fresh connect (and, on a unix agent,
   * a descriptor handshake): 32 made 5.7 % of the requests of 50 keep-alive
   * clients open a new upstream connection. */
  if (dp->cfg.pool_idle_max == 0)
    dp->cfg.pool_idle_max = 256;
  if (dp->cfg.upstream_idle_ms == 0)
    dp->cfg.upstream_idle_ms = 300000;
  if (dp->cfg.exec_mux_conns == 0)
    dp->cfg.exec_mux_conns = 64;
  if (dp->cfg.exec_mux_sessions == 0)
    dp->cfg.exec_mux_sessions = 512;
  if (dp->cfg.exec_mux_idle_ms == 0)
    dp->cfg.exec_mux_idle_ms = 30000;
  if (dp->cfg.token_leeway_s == 0)
    dp->cfg.token_leeway_s = 5;
  if (dp->cfg.activity_interval_ms == 0)
    dp->cfg.activity_interval_ms = 5000;
  if (dp->cfg.activity_max == 0)
    dp->cfg.activity_max = 100000;
  if (dp->cfg.endpoint_ttl_ms == 0)
    dp->cfg.endpoint_ttl_ms = 2000;
}

static void dp_free(osr_dataplane_t *dp)
{
  if (dp->tls != NULL)
    osr_tls_ctx_unref(dp->tls);
  if (dp->client_tls != NULL)
    osr_tls_ctx_unref(dp->client_tls);
  osr_keyring_free(dp->kr_owned);
  osr_revocations_free(dp->rev);
  osr__dp_activity_free(dp);
  osr__dp_endpoint_free(dp);
  osr__dp_upstream_free(dp);
  if (dp->cfg.gateway_key != NULL)
    OPENSSL_cleanse((char *)dp->cfg.gateway_key, strlen(dp->cfg.gateway_key));
  osr_token_cache_free(dp->tcache);
  OPENSSL_cleanse(dp->agent_secret, sizeof(dp->agent_secret));
  osr_free(dp->strings);
  osr_free(dp);
}

int osr_dataplane_start(uv_loop_t *loop, const osr_dataplane_config_t *cfg, osr_dataplane_t **out)
{
  int rv = 0;
  if (cfg->nlisten == 0 || cfg->nlisten > OSR_DP_MAX_LISTEN ||
      (cfg->keyring == NULL && cfg->keys_dir == NULL && cfg->keys_url == NULL) ||
      ((cfg->tls_cert == NULL) != (cfg->tls_key == NULL))) {
    OSR_LOG_ERROR(MOD,
                  "need --listen, one of --keys-dir/--keys-url, and --tls-cert with --tls-key");
    return OSR_EINVAL;
  }
  osr_dataplane_t *dp = osr_xcalloc(1, sizeof(*dp));
  dp->loop = loop;
  copy_config(dp, cfg);
  dp->rev = osr_revocations_new(DP_REVOKE_MAX, DP_REVOKE_TTL_S);
  dp->tcache = osr_token_cache_new(DP_TOKEN_CACHE_MAX);

  if (cfg->keyring != NULL) {
    dp->kr = cfg->keyring;
  } else if (dp->cfg.keys_dir != NULL) {
    /* Start-up: a synchronous read is allowed (STYLE 21 is about the
     * running loop); refreshes go through the thread pool. */
    char err[256] = "";
    osr_keyring_t *kr = osr_keyring_new();
    rv = osr_keyring_load_dir(kr, dp->cfg.keys_dir, 0, err, sizeof(err));
    if (rv != 0) {
      OSR_LOG_ERROR(MOD, "loading keys from %s: %s", dp->cfg.keys_dir, err);
      osr_keyring_free(kr);
      goto out;
    }
    set_keyring(dp, kr);
  }
  /* Client TLS (https agent endpoints, https keys URL): system CA store. */
  {
    static const char *const alpn[] = {"http/1.1"};
    osr_tls_client_opts_t co = {NULL, 0, alpn, 1, NULL, NULL};
    if (osr_tls_ctx_new_client(&co, &dp->client_tls) != 0) {
      OSR_LOG_WARN(MOD, "no client TLS context: https agent endpoints will fail");
      dp->client_tls = NULL;
    }
  }
  if (dp->cfg.tls_cert != NULL) {
    static const char *const alpn[] = {"h2", "http/1.1"};
    osr_tls_server_opts_t so = {dp->cfg.tls_cert, dp->cfg.tls_key, alpn, 2};
    if ((rv = osr_tls_ctx_new_server(&so, &dp->tls)) != 0) {
      OSR_LOG_ERROR(MOD, "TLS certificate %s / key %s: %s", dp->cfg.tls_cert, dp->cfg.tls_key,
                    osr_strerror(rv));
      goto out;
    }
  }
  osr_http_server_opts_t so;
  memset(&so, 0, sizeof(so));
  so.handler.on_request = on_request;
  so.data = dp;
  so.limits.max_conns = dp->cfg.max_conns;
  so.limits.max_body = dp->cfg.max_body; /* streamed, never buffered */
  so.limits.idle_timeout_ms = 300000;    /* undici keeps connections 300 s */
  for (size_t i = 0; i < dp->cfg.nlisten; i++) {
    osr_http_server_t *srv = osr_http_server_new(loop, &so);
    dp->srv[dp->nsrv++] = srv;
    if ((rv = osr_http_server_listen(srv, dp->cfg.listen[i], dp->tls)) != 0) {
      OSR_LOG_ERROR(MOD, "listen %s: %s", dp->cfg.listen[i], osr_strerror(rv));
      goto out;
    }
    OSR_LOG_INFO(MOD, "listening on %s (port %d)%s", dp->cfg.listen[i],
                 osr_http_server_port(srv, 0), dp->tls != NULL ? " with TLS" : "");
  }
  if (dp->cfg.redis_url != NULL) {
    osr_redis_opts_t ro;
    memset(&ro, 0, sizeof(ro));
    ro.url = dp->cfg.redis_url;
    ro.prefix = dp->cfg.redis_prefix;
    if ((rv = osr_redis_new(loop, &ro, &dp->redis)) != 0) {
      OSR_LOG_ERROR(MOD, "bad --redis %s", dp->cfg.redis_url);
      dp->redis = NULL;
      goto out;
    }
    if ((rv = osr_redis_subscribe(dp->redis, on_invalidate, dp)) != 0) {
      OSR_LOG_ERROR(MOD, "redis subscribe: %s", osr_strerror(rv));
      goto out;
    }
  }
  uv_timer_init(loop, &dp->keys_timer);
  uv_timer_init(loop, &dp->pool_timer);
  dp->keys_timer.data = dp->pool_timer.data = dp;
  if (cfg->keyring == NULL) {
    uv_timer_start(&dp->keys_timer, on_keys_timer,
                   dp->cfg.keys_dir != NULL ? dp->cfg.keys_refresh_ms : 0, dp->cfg.keys_refresh_ms);
  }
  uv_timer_start(&dp->pool_timer, on_pool_timer, 1000, 1000);
  osr__dp_activity_start(dp);
  *out = dp;
  return 0;

out:
  /* Nothing ran on the loop yet: servers close immediately, no requests. */
  if (dp->redis != NULL || dp->nsrv > 0) {
    dp->stopping = 1;
    dp->closing_handles = 1; /* released below */
    osr_dataplane_stop(dp, 0, NULL, NULL);
    return rv != 0 ? rv : OSR_EINVAL;
  }
  dp_free(dp);
  return rv != 0 ? rv : OSR_EINVAL;
}

int osr_dataplane_port(const osr_dataplane_t *dp, size_t n)
{
  return n < dp->nsrv ? osr_http_server_port(dp->srv[n], 0) : -1;
}

size_t osr_dataplane_nconns(const osr_dataplane_t *dp)
{
  size_t n = 0;
  for (size_t i = 0; i < dp->nsrv; i++)
    n += osr_http_server_nconns(dp->srv[i]);
  return n;
}

void osr__dp_maybe_finish(osr_dataplane_t *dp)
{
  if (dp->closing_handles > 0 || dp->nstreams > 0 || dp->nsplices > 0 || dp->keys_busy ||
      osr__dp_mux_busy(dp))
    return;
  osr__dp_pools_sweep(dp, 0);
  osr__dp_mux_sweep(dp, 0);
  OSR_LOG_INFO(MOD, "stopped: %llu requests, %llu refused, %llu forwarded, %llu upstream failures",
               (unsigned long long)dp->n_requests, (unsigned long long)dp->n_refused,
               (unsigned long long)dp->n_forwarded, (unsigned long long)dp->n_upstream_fail);
  void (*cb)(void *) = dp->stop_cb;
  void *data = dp->stop_data;
  dp_free(dp);
  if (cb != NULL)
    cb(data);
}

static void on_handle_closed(uv_handle_t *h)
{
  osr_dataplane_t *dp = h->data;
  dp->closing_handles--;
  osr__dp_maybe_finish(dp);
}

static void on_redis_closed(void *data)
{
  osr_dataplane_t *dp = data;
  dp->closing_handles--;
  osr__dp_maybe_finish(dp);
}

static void on_server_closed(osr_http_server_t *srv, void *data)
{
  osr_dataplane_t *dp = data;
  (void)srv;
  /* Past the grace period: tunnels spliced after an upgrade are not HTTP
   * exchanges the server tracks, so close them now. */
  if (--dp->srv_open == 0) {
    osr__dp_splices_close(dp);
    osr__dp_execs_close(dp);
  }
  dp->closing_handles--;
  osr__dp_maybe_finish(dp);
}

void osr_dataplane_stop(osr_dataplane_t *dp, uint64_t grace_ms, void (*cb)(void *data), void *data)
{
  int from_start = dp->stopping; /* a failed start: handles not initialised */
  dp->stopping = 1;
  dp->stop_cb = cb;
  dp->stop_data = data;
  dp->closing_handles += (int)dp->nsrv;
  dp->srv_open = dp->nsrv;
  if (!from_start) {
    dp->closing_handles += 2;
    uv_close((uv_handle_t *)&dp->keys_timer, on_handle_closed);
    uv_close((uv_handle_t *)&dp->pool_timer, on_handle_closed);
  }
  osr__dp_pools_sweep(dp, 0);
  osr__dp_mux_sweep(dp, 0);
  osr__dp_activity_stop(dp); /* before Redis closes: a send in flight ends with it */
  if (dp->redis != NULL) {
    dp->closing_handles++;
    osr_redis_close(dp->redis, on_redis_closed, dp);
    dp->redis = NULL;
  }
  /* Exec sessions are long-lived: end them now with a status rather than
   * wait out the grace period (their processes keep running). */
  osr__dp_execs_close(dp);
  for (size_t i = 0; i < dp->nsrv; i++)
    osr_http_server_close(dp->srv[i], grace_ms, on_server_closed, dp);
  if (from_start)
    dp->closing_handles--; /* the start path's own hold */
  osr__dp_maybe_finish(dp);
}
