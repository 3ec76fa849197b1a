/*
 * The E2B-compatible front door: E2B's control-plane REST API (contract:
 * shared/reference/e2b-contract.md §2, docs/e2b-compat.md) on top of OSR's
 * own sandbox model, so that unmodified E2B SDK code pointed at the gateway
 * (E2B_API_URL) creates, lists and kills OSR sandboxes on whichever
 * provider placement picks.
 *
 * Two techniques, chosen per route:
 *   - Translate and delegate. Create, kill and timeout rewrite the E2B body
 *     into the OSR one and run the OSR handler (api_sandboxes.c/create.c),
 *     so failover, idempotency, audit and the store discipline stay in one
 *     place. The answer is turned back into E2B's shape by the call's
 *     reshape hook (api.h), which the router also sets for its own errors.
 *   - Native. List, get, connect, pause and metrics have E2B semantics OSR's
 *     routes do not (a killed sandbox is 404, list defaults to live ones,
 *     connect extends and resumes), so they read the binding themselves.
 *
 * Errors are always Content-Type application/json with
 * {"code":<status>,"message":"..."}: the SDKs branch on the body's integer
 * code (a kill answered 404 without {"code":404} throws instead of
 * returning false). OSR's typed error object rides along under "error".
 *
 * E2B fields without an OSR counterpart (allow_internet_access, network,
 * autoPause) are accepted and recorded, not enforced: they are kept as a
 * JSON string under the reserved metadata key "osr.e2b" (so they persist
 * with the binding and GET /sandboxes/{id} reports them), and hidden from
 * E2B's view of the metadata.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "agent/agent.h" /* OSR_AGENT_ENVD_VERSION */
#include "gateway/api.h"
#include "gateway/providers.h"
#include "gateway/sandboxes.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/text.h"

#define MOD "e2b"

/* The metadata key holding the E2B-only create fields. */
#define E2B_META_KEY "osr.e2b"
/* E2B's SDKs default to a 300 s lifetime, and 2.51 omits the field. */
#define E2B_DEFAULT_TIMEOUT_S 300
/* List filters: as many metadata pairs as OSR's own list accepts. */
#define E2B_LIST_META_MAX 16
#define E2B_CURSOR_MAX    256

/* The domain the SDK builds <port>-<id>.<domain> hosts from (getHost), or
 * "" for null. One gateway per process: set once by osr_gw_e2b_init. */
static char g_domain[256];

/* ------------------------------------------------------------------------ */
/* Configuration                                                             */

/* The domain is configuration (e2b.domain / OSR_E2B_DOMAIN / --e2b-domain,
 * checked by config.c, which also derives it from the data-plane URL when
 * unset): read once here so every answer shares one buffer. */
int osr_gw_e2b_init(osr_gw_t *gw)
{
  g_domain[0] = '\0';
  if (gw->cfg == NULL)
    return 0;
  return osr_gw_e2b_domain(gw->cfg, g_domain, sizeof(g_domain));
}

int osr_gw_e2b_path(const char *path, size_t len)
{
  if (len >= 10 && memcmp(path, "/sandboxes", 10) == 0 && (len == 10 || path[10] == '/'))
    return 1;
  return len >= 4 && memcmp(path, "/v2/", 4) == 0;
}

/* ------------------------------------------------------------------------ */
/* Answers                                                                   */

static json_t *domain_json(void)
{
  return g_domain[0] ? json_string(g_domain) : json_null();
}

/* An E2B error raised here, with the OSR typed error beside it as on every
 * E2B error (the reshape hook turns it into E2B's shape). */
static void e2b_error(osr_gw_call_t *call, int status, const char *message)
{
  const char *code = status == 400   ? "invalid_request"
                     : status == 404 ? "not_found"
                     : status == 409 ? "conflict"
                     : status == 501 ? "not_implemented"
                     : status == 502 ? "provider_error"
                                     : "internal";
  osr_gw_error(call, status, code, message, NULL);
}

static void not_found(osr_gw_call_t *call)
{
  char msg[96];
  snprintf(msg, sizeof(msg), "sandbox \"%.40s\" not found", call->path_id);
  e2b_error(call, 404, msg);
}

json_t *osr_gw_e2b_reshape_error(osr_gw_call_t *call, int *status, json_t *body, const char **hname,
                                 char *hval, size_t hval_len)
{
  (void)call;
  (void)hname;
  (void)hval;
  (void)hval_len;
  json_t *err = body != NULL ? json_object_get(body, "error") : NULL;
  if (*status < 400 || !json_is_object(err))
    return body;
  const char *code = json_string_value(json_object_get(err, "code"));
  const char *state = json_string_value(json_object_get(err, "state"));
  /* OSR answers 409 for an operation on a sandbox that has ended; to E2B a
   * sandbox that is gone is simply not found. */
  if (*status == 409 && code != NULL && strcmp(code, "conflict") == 0 && state != NULL &&
      (strcmp(state, "ended") == 0 || strcmp(state, "failed") == 0 || strcmp(state, "lost") == 0))
    *status = 404;
  json_t *msg = json_object_get(err, "message");
  json_t *out = json_pack("{s:i,s:O,s:O}", "code", *status, "message",
                          json_is_string(msg) ? msg : json_string("error"), "error", err);
  json_decref(body);
  return out;
}

/* ------------------------------------------------------------------------ */
/* The binding as E2B shows it                                               */

static int is_live(const osr_binding_t *b)
{
  return b->state == OSR_BINDING_RUNNING || b->state == OSR_BINDING_PAUSED ||
         b->state == OSR_BINDING_CREATING;
}

static json_t *time_json(int64_t ms)
{
  char buf[32];
  osr_gw_rfc3339(ms > 0 ? ms : 0, buf);
  return json_string(buf);
}

/* The user's metadata (without our reserved key) and, if `extra` is not
 * NULL, the recorded E2B-only fields (a new reference or NULL). */
static json_t *split_metadata(const osr_binding_t *b, json_t **extra)
{
  json_t *m = b->metadata_json ? json_loads(b->metadata_json, 0, NULL) : NULL;
  if (!json_is_object(m)) {
    json_decref(m);
    m = json_object();
  }
  const char *x = json_string_value(json_object_get(m, E2B_META_KEY));
  if (extra != NULL)
    *extra = x != NULL ? json_loads(x, 0, NULL) : NULL;
  json_object_del(m, E2B_META_KEY);
  return m;
}

/* ListedSandbox (contract §2): every required field present. */
static json_t *listed_json(const osr_binding_t *b)
{
  json_t *g = b->granted_json ? json_loads(b->granted_json, 0, NULL) : NULL;
  json_int_t vcpus = json_integer_value(json_object_get(g, "vcpus"));
  json_int_t mem = json_integer_value(json_object_get(g, "minMemoryMiB"));
  json_decref(g);
  return json_pack(
      "{s:s,s:s,s:s,s:o,s:o,s:s,s:I,s:I,s:i,s:s,s:o}", "sandboxID", b->id, "templateID",
      b->template_id[0] ? b->template_id : "base", "clientID", b->provider[0] ? b->provider : "osr",
      "startedAt", time_json(b->created_ms), "endAt", time_json(b->expires_ms), "state",
      b->state == OSR_BINDING_PAUSED ? "paused" : "running", "cpuCount", vcpus, "memoryMB", mem,
      "diskSizeMB", 0, "envdVersion", OSR_AGENT_ENVD_VERSION, "metadata", split_metadata(b, NULL));
}

/* Answer `body` (stolen) with "envdAccessToken": a binding token granting
 * everything (as the create answer's), signed on the thread pool
 * (osr__token_mint_async). Without a token (the sandbox's TTL is over, no
 * key) the field is left out, as E2B does for a sandbox without access
 * control: the SDK then sends no X-Access-Token. */
typedef struct tok_reply_s {
  osr_gw_call_t *call; /* held */
  int status;
  json_t *body;
  char id[OSR_ID_MAX];
} tok_reply_t;

static void tok_reply_minted(int status, const char *tok, const osr_token_claims_t *claims,
                             void *data)
{
  tok_reply_t *t = data;
  (void)claims;
  if (status != 0)
    OSR_LOG_WARN(MOD, "sandbox %s: no token: %s", t->id, osr_token_strerror(status));
  else
    json_object_set_new(t->body, "envdAccessToken", json_string(tok));
  osr_gw_reply(t->call, t->status, t->body);
  osr_gw_call_release(t->call);
  osr_free(t);
}

static void reply_with_token(osr_gw_call_t *call, int status, json_t *body, const osr_binding_t *b)
{
  osr__token_req_t tr;
  memset(&tr, 0, sizeof(tr));
  tr.scopes = OSR_SCOPE_ALL;
  tr.all_ports = 1;
  tok_reply_t *t = osr_xmalloc(sizeof(*t));
  t->call = call;
  t->status = status;
  t->body = body;
  snprintf(t->id, sizeof(t->id), "%s", b->id);
  osr_gw_call_hold(call);
  int rv = osr__token_mint_async(call->gw, b, &tr, tok_reply_minted, t);
  if (rv != 0)
    tok_reply_minted(rv, NULL, NULL, t);
}

/* Sandbox (create/connect answer). `token` is stolen (NULL = omitted: the
 * SDK then sends no X-Access-Token). */
static json_t *sandbox_json(const char *id, const char *tpl, const char *provider, json_t *token)
{
  json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:o}", "sandboxID", id, "templateID",
                        tpl != NULL && tpl[0] ? tpl : "base", "clientID",
                        provider != NULL && provider[0] ? provider : "osr", "envdVersion",
                        OSR_AGENT_ENVD_VERSION, "domain", domain_json());
  if (token != NULL)
    json_object_set_new(j, "envdAccessToken", token);
  return j;
}

/* ------------------------------------------------------------------------ */
/* Reading one binding                                                       */

/* Straight from the store (osr__read_binding without the cache): E2B's
 * calls act on the state (kill, connect, pause), so a stale cache entry
 * would mislead. */
static void get_binding(osr_gw_call_t *call, osr__read_cb cb)
{
  osr__read_binding(call, 0, cb);
}

/* Common front of the native per-sandbox handlers: answers errors and
 * sandboxes that are gone; returns 1 if `b` is live. */
static int got_live(osr_gw_call_t *call, int status, const osr_binding_t *b)
{
  if (status == OSR_ENOTFOUND || (status == 0 && !is_live(b))) {
    not_found(call);
    return 0;
  }
  if (status != 0) {
    osr_gw_error_from(call, status, "sandbox");
    return 0;
  }
  return 1;
}

/* ------------------------------------------------------------------------ */
/* POST /sandboxes, POST /v2/sandboxes                                       */

static json_t *reshape_create(osr_gw_call_t *call, int *status, json_t *body, const char **hname,
                              char *hval, size_t hval_len)
{
  if (*status >= 300 || body == NULL)
    return osr_gw_e2b_reshape_error(call, status, body, hname, hval, hval_len);
  const char *id = json_string_value(json_object_get(body, "id"));
  if (id == NULL)
    return body;
  json_t *tok = json_object_get(body, "token");
  json_t *out =
      sandbox_json(id, json_string_value(json_object_get(body, "template")),
                   json_string_value(json_object_get(json_object_get(body, "binding"), "provider")),
                   json_is_string(tok) ? json_incref(tok) : NULL);
  /* E2B answers a create with 201 always; OSR's idempotent replay is 200. */
  *status = 201;
  json_decref(body);
  return out;
}

/* The OSR extras: the body's "osr" object, else the X-OSR-Capabilities /
 * X-OSR-Policy headers (JSON). Copies them into `ob`; returns 0 or answers
 * 400 and returns -1. */
static int osr_extras(osr_gw_call_t *call, const json_t *in, json_t *ob)
{
  const json_t *x = json_object_get(in, "osr");
  if (x != NULL) {
    if (!json_is_object(x)) {
      e2b_error(call, 400, "osr: must be an object {capabilities?, policy?}");
      return -1;
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)x, k, v)
    {
      if (strcmp(k, "capabilities") != 0 && strcmp(k, "policy") != 0) {
        char msg[160];
        snprintf(msg, sizeof(msg), "osr: unknown field \"%.100s\"", k);
        e2b_error(call, 400, msg);
        return -1;
      }
      json_object_set(ob, k, v);
    }
    return 0;
  }
  static const struct {
    const char *header, *field;
  } hs[] = {{"x-osr-capabilities", "capabilities"}, {"x-osr-policy", "policy"}};
  for (size_t i = 0; i < OSR_ARRAY_SIZE(hs); i++) {
    const osr_iovec_t *h = osr_http_req_header(call->req, hs[i].header);
    if (h == NULL)
      continue;
    json_t *j = json_loadb(h->base, h->len, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(j)) {
      json_decref(j);
      char msg[96];
      snprintf(msg, sizeof(msg), "%s: must be a JSON object", hs[i].header);
      e2b_error(call, 400, msg);
      return -1;
    }
    json_object_set_new(ob, hs[i].field, j);
  }
  return 0;
}

void osr_gw_e2b_create(osr_gw_call_t *call)
{
  const json_t *in = call->body;
  json_t *ob = json_object();
  json_t *v;
  char msg[160];

  /* templateID (required by the spec; "base", E2B's default, if absent). */
  v = json_object_get(in, "templateID");
  if (v != NULL && !json_is_string(v)) {
    json_decref(ob);
    e2b_error(call, 400, "templateID: must be a string");
    return;
  }
  json_object_set_new(ob, "template", json_string(v ? json_string_value(v) : "base"));

  v = json_object_get(in, "timeout");
  if (v != NULL && !json_is_null(v)) {
    if (!json_is_integer(v)) {
      json_decref(ob);
      e2b_error(call, 400, "timeout: must be an integer (seconds)");
      return;
    }
    json_object_set(ob, "timeoutSeconds", v);
  } else {
    json_object_set_new(ob, "timeoutSeconds", json_integer(E2B_DEFAULT_TIMEOUT_S));
  }
  if ((v = json_object_get(in, "envVars")) != NULL && !json_is_null(v))
    json_object_set(ob, "env", v);

  /* metadata, plus the E2B-only fields recorded under the reserved key. */
  json_t *meta = json_object_get(in, "metadata");
  if (meta != NULL && !json_is_null(meta)) {
    if (!json_is_object(meta)) {
      json_decref(ob);
      e2b_error(call, 400, "metadata: must be an object of strings");
      return;
    }
    if (json_object_get(meta, E2B_META_KEY) != NULL) {
      json_decref(ob);
      e2b_error(call, 400, "metadata: the key \"" E2B_META_KEY "\" is reserved");
      return;
    }
    meta = json_deep_copy(meta);
  } else {
    meta = NULL;
  }
  json_t *extra = json_object();
  static const struct {
    const char *in, *out;
  } rec[] = {{"allow_internet_access", "allowInternetAccess"},
             {"network", "network"},
             {"autoPause", "autoPause"},
             {"autoResume", "autoResume"}};
  for (size_t i = 0; i < OSR_ARRAY_SIZE(rec); i++)
    if ((v = json_object_get(in, rec[i].in)) != NULL && !json_is_null(v))
      json_object_set(extra, rec[i].out, v);
  if (json_object_size(extra) > 0) {
    char *s = json_dumps(extra, JSON_COMPACT | JSON_SORT_KEYS);
    if (s == NULL || strlen(s) > OSR_SBX_VALUE_MAX) {
      osr_json_free(s);
      json_decref(extra);
      json_decref(meta);
      json_decref(ob);
      snprintf(msg, sizeof(msg), "network: too large (at most %d bytes recorded)",
               OSR_SBX_VALUE_MAX);
      e2b_error(call, 400, msg);
      return;
    }
    if (meta == NULL)
      meta = json_object();
    json_object_set_new(meta, E2B_META_KEY, json_string(s));
    osr_json_free(s);
  }
  json_decref(extra);
  if (meta != NULL)
    json_object_set_new(ob, "metadata", meta);

  if (osr_extras(call, in, ob) != 0) {
    json_decref(ob);
    return;
  }
  /* Everything else E2B defines (secure, mcp, volumeMounts, ...) is
   * accepted and ignored (docs/e2b-compat.md). The OSR body replaces the
   * E2B one: it is what create.c hashes and stores for replays. */
  json_decref(call->body);
  call->body = ob;
  call->reshape = reshape_create;
  osr_gw_sandbox_create(call);
}

/* ------------------------------------------------------------------------ */
/* GET /sandboxes/{id}                                                       */

static void get_got(osr_gw_call_t *call, int status, const osr_binding_t *b)
{
  if (!got_live(call, status, b))
    return;
  json_t *j = listed_json(b);
  json_t *extra = NULL;
  json_decref(split_metadata(b, &extra));
  json_object_set_new(j, "domain", domain_json());
  json_t *ai = json_object_get(extra, "allowInternetAccess");
  json_object_set(j, "allowInternetAccess", json_is_boolean(ai) ? ai : json_true());
  if (json_object_get(extra, "network") != NULL)
    json_object_set(j, "network", json_object_get(extra, "network"));
  json_object_set_new(
      j, "lifecycle",
      json_pack("{s:s,s:b}", "onTimeout",
                json_is_true(json_object_get(extra, "autoPause")) ? "pause" : "kill", "autoResume",
                0));
  json_decref(extra);
  if (b->state != OSR_BINDING_CREATING)
    reply_with_token(call, 200, j, b);
  else
    osr_gw_reply(call, 200, j);
}

void osr_gw_e2b_get(osr_gw_call_t *call)
{
  get_binding(call, get_got);
}

/* ------------------------------------------------------------------------ */
/* GET /metrics: no per-sandbox metrics are collected yet                    */

static void metrics_got(osr_gw_call_t *call, int status, const osr_binding_t *b)
{
  if (got_live(call, status, b))
    osr_gw_reply(call, 200, json_array());
}

void osr_gw_e2b_metrics(osr_gw_call_t *call)
{
  get_binding(call, metrics_got);
}

/* ------------------------------------------------------------------------ */
/* DELETE /sandboxes/{id}                                                    */

static void kill_got(osr_gw_call_t *call, int status, const osr_binding_t *b)
{
  /* OSR's kill is idempotent (204 for an ended sandbox); E2B's answers 404
   * for one that is gone, and the SDK's kill() turns that into false. */
  if (!got_live(call, status, b))
    return;
  osr_gw_sandbox_delete(call);
}

void osr_gw_e2b_kill(osr_gw_call_t *call)
{
  get_binding(call, kill_got);
}

/* ------------------------------------------------------------------------ */
/* POST /sandboxes/{id}/timeout                                              */

static json_t *reshape_no_content(osr_gw_call_t *call, int *status, json_t *body,
                                  const char **hname, char *hval, size_t hval_len)
{
  if (*status >= 200 && *status < 300) {
    *status = 204;
    json_decref(body);
    return NULL;
  }
  return osr_gw_e2b_reshape_error(call, status, body, hname, hval, hval_len);
}

void osr_gw_e2b_timeout(osr_gw_call_t *call)
{
  json_t *t = json_object_get(call->body, "timeout");
  if (!json_is_integer(t) || json_integer_value(t) < 0) {
    e2b_error(call, 400, "the body must be {\"timeout\": <seconds>}");
    return;
  }
  /* E2B's setTimeout(ms) sends ceil(ms / 1000), 0 for < 1 ms; OSR's
   * smallest lifetime is 1 s. */
  json_int_t s = json_integer_value(t) > 0 ? json_integer_value(t) : 1;
  json_t *ob = json_pack("{s:I}", "timeoutSeconds", s);
  json_decref(call->body);
  call->body = ob;
  call->reshape = reshape_no_content;
  osr_gw_sandbox_timeout(call);
}

/* ------------------------------------------------------------------------ */
/* POST /sandboxes/{id}/connect and /pause: state changes                    */

typedef struct op_s {
  osr_gw_call_t *call;
  osr_binding_t b;
  int ok_status; /* 200 connected, 201 resumed, 204 paused */
  const char *action;
} op_t;

static op_t *op_new(osr_gw_call_t *call, const osr_binding_t *b)
{
  op_t *op = osr_xcalloc(1, sizeof(*op));
  op->call = call;
  osr_binding_init(&op->b);
  osr_binding_copy(&op->b, b);
  osr_gw_call_hold(call);
  return op;
}

static void op_free(op_t *op)
{
  osr_gw_call_release(op->call);
  osr_binding_dispose(&op->b);
  osr_free(op);
}

static void op_stored(int status, void *data)
{
  op_t *op = data;
  osr_gw_call_t *call = op->call;
  osr_gw_t *gw = call->gw;
  if (status != 0) {
    osr_gw_error_from(call, status, "recording the change");
    op_free(op);
    return;
  }
  osr__cache_put(gw, &op->b);
  char exp[32];
  osr_gw_rfc3339(op->b.expires_ms, exp);
  osr_gw_audit(gw, &call->auth, op->action, op->b.id, "ok", json_pack("{s:s}", "expiresAt", exp));
  if (op->ok_status == 204)
    osr_gw_reply(call, 204, NULL);
  else
    reply_with_token(call, op->ok_status,
                     sandbox_json(op->b.id, op->b.template_id, op->b.provider, NULL), &op->b);
  op_free(op);
}

static void op_store(op_t *op)
{
  op->b.updated_ms = osr_now_ms();
  osr_gw_t *gw = op->call->gw;
  int rv = gw->store ? osr_store_update(gw->store, &op->b, op_stored, op) : OSR_EUNAVAILABLE;
  if (rv != 0)
    op_stored(rv == OSR_ECLOSED ? OSR_EUNAVAILABLE : rv, op);
}

static void provider_failed(op_t *op, osr_provider_t *p, int status)
{
  char msg[200];
  if (status == OSR_PERR_NOT_FOUND) {
    not_found(op->call);
  } else {
    snprintf(msg, sizeof(msg), "provider %s could not %s the sandbox: %s", p->name,
             op->ok_status == 204 ? "pause" : "resume", osr_provider_err_name(status));
    e2b_error(op->call, 502, msg);
  }
  osr_gw_audit(op->call->gw, &op->call->auth, op->action, op->b.id, osr_provider_err_name(status),
               NULL);
  op_free(op);
}

/* The lifetime a connect leaves: now + timeout, but never shorter than it
 * already was (contract §10: connect only ever extends), within the
 * operator's maximum. */
static int64_t connect_expiry(osr_gw_t *gw, const osr_binding_t *b, int64_t timeout_s)
{
  int64_t maxt = gw->cfg->max_timeout_s ? gw->cfg->max_timeout_s : 86400;
  if (timeout_s > maxt)
    timeout_s = maxt;
  int64_t want = osr_now_ms() + timeout_s * 1000;
  return b->expires_ms > want ? b->expires_ms : want;
}

static int64_t connect_timeout_s(const osr_gw_call_t *call)
{
  json_t *t = json_object_get(call->body, "timeout");
  return json_is_integer(t) && json_integer_value(t) > 0 ? (int64_t)json_integer_value(t)
                                                         : E2B_DEFAULT_TIMEOUT_S;
}

static void resumed(osr_provider_t *p, int status, const osr_resource_t *res, void *data)
{
  op_t *op = data;
  if (status != 0) {
    provider_failed(op, p, status);
    return;
  }
  if (res != NULL && res->agent_endpoint[0] != '\0')
    snprintf(op->b.agent_endpoint, sizeof(op->b.agent_endpoint), "%s", res->agent_endpoint);
  op->b.state = OSR_BINDING_RUNNING;
  op->b.expires_ms = connect_expiry(op->call->gw, &op->b, connect_timeout_s(op->call));
  op_store(op);
}

static void connect_got(osr_gw_call_t *call, int status, const osr_binding_t *b)
{
  osr_gw_t *gw = call->gw;
  if (!got_live(call, status, b))
    return;
  if (b->state == OSR_BINDING_CREATING) {
    e2b_error(call, 409, "the sandbox is still being created; retry");
    return;
  }
  if (b->state == OSR_BINDING_RUNNING) {
    op_t *op = op_new(call, b);
    op->ok_status = 200;
    op->action = "e2b.connect";
    op->b.expires_ms = connect_expiry(gw, b, connect_timeout_s(call));
    op_store(op);
    return;
  }
  /* Paused: resume where the provider can. */
  osr_provider_t *p = osr_providers_find(gw->providers, b->provider, NULL);
  if (p == NULL || p->adapter->resume == NULL || b->provider_id[0] == '\0') {
    e2b_error(call, 409, "the sandbox is paused and its provider cannot resume it");
    return;
  }
  op_t *op = op_new(call, b);
  op->ok_status = 201;
  op->action = "e2b.resume";
  int rv = p->adapter->resume(p, b->provider_id, resumed, op);
  if (rv != 0)
    provider_failed(op, p, rv);
}

void osr_gw_e2b_connect(osr_gw_call_t *call)
{
  json_t *t = json_object_get(call->body, "timeout");
  if (t != NULL && !json_is_null(t) && (!json_is_integer(t) || json_integer_value(t) < 0)) {
    e2b_error(call, 400, "timeout: must be an integer (seconds)");
    return;
  }
  get_binding(call, connect_got);
}

static void paused(osr_provider_t *p, int status, void *data)
{
  op_t *op = data;
  if (status != 0) {
    provider_failed(op, p, status);
    return;
  }
  op->b.state = OSR_BINDING_PAUSED;
  op_store(op);
}

static void pause_got(osr_gw_call_t *call, int status, const osr_binding_t *b)
{
  osr_gw_t *gw = call->gw;
  if (!got_live(call, status, b))
    return;
  if (b->state == OSR_BINDING_PAUSED) {
    e2b_error(call, 409, "the sandbox is already paused");
    return;
  }
  if (b->state == OSR_BINDING_CREATING) {
    e2b_error(call, 409, "the sandbox is still being created; retry");
    return;
  }
  osr_provider_t *p = osr_providers_find(gw->providers, b->provider, NULL);
  if (p == NULL || p->adapter->pause == NULL || b->provider_id[0] == '\0') {
    char msg[160];
    snprintf(msg, sizeof(msg), "provider \"%.63s\" cannot pause sandboxes", b->provider);
    e2b_error(call, 501, msg);
    return;
  }
  op_t *op = op_new(call, b);
  op->ok_status = 204;
  op->action = "e2b.pause";
  int rv = p->adapter->pause(p, b->provider_id, paused, op);
  if (rv != 0)
    provider_failed(op, p, rv);
}

void osr_gw_e2b_pause(osr_gw_call_t *call)
{
  get_binding(call, pause_got);
}

/* ------------------------------------------------------------------------ */
/* GET /v2/sandboxes, GET /sandboxes                                         */

typedef struct list_s {
  osr_gw_call_t *call;
  char tenant[OSR_TENANT_MAX];
  char cursor[E2B_CURSOR_MAX];
  char mk[E2B_LIST_META_MAX][OSR_SBX_KEY_MAX + 1];
  char mv[E2B_LIST_META_MAX][OSR_SBX_VALUE_MAX + 1];
  const char *mkp[E2B_LIST_META_MAX], *mvp[E2B_LIST_META_MAX];
  size_t nmeta;
} list_t;

/* A key or value of the metadata filter: the JS SDK encodes each with
 * encodeURIComponent, then joins them with URLSearchParams (which encodes
 * again), so each piece is decoded twice. */
static int decode2(const char *s, size_t n, char *out, size_t outlen)
{
  char once[OSR_SBX_VALUE_MAX + 1];
  int m = osr_pct_decode(s, n, once, sizeof(once));
  return m < 0 ? -1 : osr_pct_decode(once, (size_t)m, out, outlen);
}

/* metadata=<k=v&k2=v2>: the query value (encoded once more by the HTTP
 * client) is decoded whole, split, and each piece decoded twice (contract
 * §10; verified against e2b 2.51.0 and 2.7.0 with spaces, '&' and '=' in
 * keys and values). */
static int parse_metadata(list_t *l, const char *v, size_t vn)
{
  char inner[4096];
  int in = osr_pct_decode(v, vn, inner, sizeof(inner));
  if (in < 0)
    return -1;
  size_t a = 0;
  while (a < (size_t)in) {
    size_t b = a;
    while (b < (size_t)in && inner[b] != '&')
      b++;
    if (b > a) {
      const char *eq = memchr(inner + a, '=', b - a);
      if (eq == NULL || l->nmeta >= E2B_LIST_META_MAX)
        return -1;
      size_t kn = (size_t)(eq - inner) - a;
      if (decode2(inner + a, kn, l->mk[l->nmeta], sizeof(l->mk[0])) <= 0 ||
          decode2(eq + 1, b - a - kn - 1, l->mv[l->nmeta], sizeof(l->mv[0])) < 0)
        return -1;
      l->mkp[l->nmeta] = l->mk[l->nmeta];
      l->mvp[l->nmeta] = l->mv[l->nmeta];
      l->nmeta++;
    }
    a = b + 1;
  }
  return 0;
}

/* state=running,paused (comma-joined, or repeated: openapi-fetch's form
 * style). Adds to *mask; -1 for an unknown state. */
static int parse_state(const char *v, size_t vn, unsigned *mask)
{
  char buf[128];
  if (osr_pct_decode(v, vn, buf, sizeof(buf)) < 0)
    return -1;
  char *save = NULL;
  for (char *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
    if (strcmp(t, "running") == 0)
      *mask |= (1u << OSR_BINDING_RUNNING) | (1u << OSR_BINDING_CREATING);
    else if (strcmp(t, "paused") == 0)
      *mask |= 1u << OSR_BINDING_PAUSED;
    else
      return -1;
  }
  return 0;
}

static json_t *reshape_list(osr_gw_call_t *call, int *status, json_t *body, const char **hname,
                            char *hval, size_t hval_len)
{
  if (*status != 200 || !json_is_object(body))
    return osr_gw_e2b_reshape_error(call, status, body, hname, hval, hval_len);
  /* list_done puts the next page's token beside the items; E2B sends it in
   * X-Next-Token (absent on the last page). */
  const char *next = json_string_value(json_object_get(body, "next"));
  if (next != NULL && strlen(next) < hval_len) {
    *hname = "x-next-token";
    snprintf(hval, hval_len, "%s", next);
  }
  json_t *items = json_incref(json_object_get(body, "items"));
  json_decref(body);
  return items;
}

static void list_done(int status, const osr_binding_t *items, size_t n, const char *next,
                      void *data)
{
  list_t *l = data;
  osr_gw_call_t *call = l->call;
  if (status != 0) {
    osr_gw_error_from(call, status == OSR_ECLOSED ? OSR_EUNAVAILABLE : status, "listing sandboxes");
  } else {
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++)
      json_array_append_new(arr, listed_json(&items[i]));
    osr_gw_reply(call, 200, json_pack("{s:o,s:s?}", "items", arr, "next", next));
  }
  osr_gw_call_release(call);
  osr_free(l);
}

void osr_gw_e2b_list(osr_gw_call_t *call)
{
  osr_gw_t *gw = call->gw;
  list_t *l = osr_xcalloc(1, sizeof(*l));
  osr_store_query_t q;
  memset(&q, 0, sizeof(q));
  l->call = call;
  q.limit = 100;
  const char *bad = NULL;

  const osr_iovec_t *qs = &call->req->query;
  size_t i = 0;
  while (i < qs->len && bad == NULL) {
    size_t j = i;
    while (j < qs->len && qs->base[j] != '&')
      j++;
    const char *p = qs->base + i;
    size_t n = j - i;
    const char *eq = memchr(p, '=', n);
    size_t kn = eq ? (size_t)(eq - p) : n;
    const char *v = eq ? eq + 1 : p + n;
    size_t vn = eq ? n - kn - 1 : 0;
#define KEY_IS(s) (kn == sizeof(s) - 1 && memcmp(p, s, kn) == 0)
    if (KEY_IS("state")) {
      if (parse_state(v, vn, &q.state_mask) != 0)
        bad = "state: a comma list of running, paused";
    } else if (KEY_IS("metadata")) {
      if (parse_metadata(l, v, vn) != 0)
        bad = "metadata: a URL-encoded k=v&k2=v2 (at most 16 pairs)";
    } else if (KEY_IS("limit")) {
      char buf[16];
      char *end = NULL;
      long lim = osr_pct_decode(v, vn, buf, sizeof(buf)) > 0 ? strtol(buf, &end, 10) : 0;
      if (end == NULL || *end != '\0' || lim < 1)
        bad = "limit: a positive integer";
      else
        q.limit = lim > 1000 ? 1000 : (size_t)lim;
    } else if (KEY_IS("nextToken")) {
      if (osr_pct_decode(v, vn, l->cursor, sizeof(l->cursor)) < 0)
        bad = "nextToken: not a token from a previous page";
      else if (l->cursor[0] != '\0')
        q.cursor = l->cursor;
    }
    /* Others (template, startedAfter, order, ...) are ignored. */
#undef KEY_IS
    i = j + 1;
  }
  if (bad != NULL) {
    osr_free(l);
    e2b_error(call, 400, bad);
    return;
  }
  /* E2B lists live sandboxes only: killed ones are gone. */
  if (q.state_mask == 0)
    q.state_mask =
        (1u << OSR_BINDING_RUNNING) | (1u << OSR_BINDING_CREATING) | (1u << OSR_BINDING_PAUSED);
  if (call->auth.role != OSR_ROLE_ADMIN) {
    snprintf(l->tenant, sizeof(l->tenant), "%s", call->auth.tenant);
    q.tenant = l->tenant;
  }
  q.meta_keys = l->mkp;
  q.meta_values = l->mvp;
  q.nmeta = l->nmeta;
  call->reshape = reshape_list;
  osr_gw_call_hold(call);
  int rv = gw->store ? osr_store_list(gw->store, &q, list_done, l) : OSR_EUNAVAILABLE;
  if (rv != 0)
    list_done(rv, NULL, 0, NULL, l);
}
