/*
 * Admin API: API keys (tenants are implicit: a tenant exists while it has
 * a key) and the audit log.
 *
 *   POST   /v1/keys        admin  {tenant, name?, role?, format?} → 201, secret shown once
 *                          (format "e2b": the secret looks like e2b_<40 hex>, for E2B SDKs)
 *   GET    /v1/keys        admin: all keys or ?tenant=; tenant: its own keys
 *   DELETE /v1/keys/{id}   admin  revoke → 204
 *   GET    /v1/audit       the caller's tenant's events (admin: ?tenant= or all),
 *                          newest first, ?limit=1..1000 (100) &cursor=
 *
 * Key events are audited in the acting key's tenant log ("admin" for the
 * admin key) with the affected tenant and key id in the detail, because a
 * revocation only knows the key id.
 */
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/api_int.h"
#include "util/log.h"
#include "util/mem.h"

#define CURSOR_MAX 256

static const char *role_name(osr_role_t r)
{
  return r == OSR_ROLE_ADMIN ? "admin" : "tenant";
}

static json_t *key_json(const osr_api_key_t *k)
{
  char at[32];
  osr_gw_rfc3339(k->created_ms, at);
  json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:s}", "keyId", k->key_id, "tenant", k->tenant, "role",
                        role_name(k->role), "name", k->name, "createdAt", at);
  if (k->revoked_ms != 0) {
    osr_gw_rfc3339(k->revoked_ms, at);
    json_object_set_new(j, "revokedAt", json_string(at));
  }
  return j;
}

/* ---- POST /v1/keys ------------------------------------------------------- */

typedef struct key_create_s {
  osr_gw_call_t *call;
  osr_api_key_t key;
  char secret[OSR_KEY_LEN + 1];
} key_create_t;

static void on_key_put(int status, void *data)
{
  key_create_t *kc = data;
  osr_gw_call_t *call = kc->call;
  if (status == 0) {
    json_t *j = key_json(&kc->key);
    json_object_set_new(j, "key", json_string(kc->secret));
    osr_gw_reply(call, 201, j);
  } else {
    osr_gw_error_from(call, status, "create key");
  }
  osr__gw_audit_as(call->gw, call->auth.tenant, call->auth.key_id, "key.create", "",
                   status == 0 ? "ok" : "error",
                   json_pack("{s:s,s:s,s:s}", "tenant", kc->key.tenant, "keyId", kc->key.key_id,
                             "role", role_name(kc->key.role)));
  /* The secret exists nowhere else now; do not leave it in freed memory. */
  OPENSSL_cleanse(kc->secret, sizeof(kc->secret));
  osr_free(kc);
  osr_gw_call_release(call);
}

void osr_gw_keys_create(osr_gw_call_t *call)
{
  const json_t *b = call->body;
  if (b == NULL) {
    osr_gw_error(call, 400, "invalid_request",
                 "body required: {\"tenant\": ..., \"name\"?, \"role\"?}", NULL);
    return;
  }
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)b, k, v)
  {
    if (strcmp(k, "tenant") != 0 && strcmp(k, "name") != 0 && strcmp(k, "role") != 0 &&
        strcmp(k, "format") != 0) {
      char msg[160];
      snprintf(msg, sizeof(msg), "unknown field '%.100s'", k);
      osr_gw_error(call, 400, "invalid_request", msg, json_pack("{s:s}", "field", k));
      return;
    }
  }
  const json_t *jt = json_object_get(b, "tenant");
  if (!json_is_string(jt) || !osr__gw_tenant_valid(json_string_value(jt))) {
    osr_gw_error(call, 400, "invalid_request",
                 "'tenant' must be a string of 1..63 characters [A-Za-z0-9._-]",
                 json_pack("{s:s}", "field", "tenant"));
    return;
  }
  const json_t *jn = json_object_get(b, "name");
  if (jn != NULL && (!json_is_string(jn) || json_string_length(jn) >= OSR_NAME_MAX)) {
    osr_gw_error(call, 400, "invalid_request", "'name' must be a string of at most 63 bytes",
                 json_pack("{s:s}", "field", "name"));
    return;
  }
  const json_t *jr = json_object_get(b, "role");
  osr_role_t role = OSR_ROLE_TENANT;
  if (jr != NULL) {
    const char *r = json_string_value(jr);
    if (r != NULL && strcmp(r, "admin") == 0) {
      role = OSR_ROLE_ADMIN;
    } else if (r == NULL || strcmp(r, "tenant") != 0) {
      osr_gw_error(call, 400, "invalid_request", "'role' must be \"tenant\" or \"admin\"",
                   json_pack("{s:s}", "field", "role"));
      return;
    }
  }

  const json_t *jf = json_object_get(b, "format");
  const char *prefix = OSR_KEY_PREFIX;
  if (jf != NULL) {
    const char *f = json_string_value(jf);
    if (f != NULL && strcmp(f, "e2b") == 0) {
      prefix = OSR_KEY_PREFIX_E2B;
    } else if (f == NULL || strcmp(f, "osr") != 0) {
      osr_gw_error(call, 400, "invalid_request", "'format' must be \"osr\" or \"e2b\"",
                   json_pack("{s:s}", "field", "format"));
      return;
    }
  }

  key_create_t *kc = osr_xcalloc(1, sizeof(*kc));
  kc->call = call;
  osr__gw_key_new_prefixed(prefix, kc->secret, kc->key.hash, kc->key.key_id);
  snprintf(kc->key.tenant, sizeof(kc->key.tenant), "%s", json_string_value(jt));
  snprintf(kc->key.name, sizeof(kc->key.name), "%s", jn != NULL ? json_string_value(jn) : "");
  kc->key.role = role;
  kc->key.created_ms = osr_now_ms();
  osr_gw_call_hold(call);
  int rv = osr_store_key_put(call->gw->store, &kc->key, on_key_put, kc);
  if (rv != 0)
    on_key_put(rv, kc);
}

/* ---- GET /v1/keys -------------------------------------------------------- */

/* The tenant a listing is for: a tenant key sees only its own tenant (asking
 * for another is 403); an admin key sees ?tenant= or everything (NULL).
 * Returns 0, or answers the call and returns -1. */
static int scope_tenant(osr_gw_call_t *call, char tenant[OSR_TENANT_MAX], const char **out)
{
  int n = osr_gw_query(call, "tenant", tenant, OSR_TENANT_MAX);
  if (n == OSR_ETOOLARGE || (n >= 0 && !osr__gw_tenant_valid(tenant))) {
    osr_gw_error(call, 400, "invalid_request", "'tenant' is not a valid tenant name",
                 json_pack("{s:s}", "field", "tenant"));
    return -1;
  }
  if (call->auth.role == OSR_ROLE_ADMIN) {
    *out = n >= 0 ? tenant : NULL;
    return 0;
  }
  if (n >= 0 && strcmp(tenant, call->auth.tenant) != 0) {
    osr_gw_error(call, 403, "forbidden", "a tenant key sees only its own tenant", NULL);
    return -1;
  }
  *out = call->auth.tenant;
  return 0;
}

static void on_key_list(int status, const osr_api_key_t *k, size_t n, void *data)
{
  osr_gw_call_t *call = data;
  if (status != 0) {
    osr_gw_error_from(call, status, "list keys");
  } else {
    json_t *items = json_array();
    for (size_t i = 0; i < n; i++)
      json_array_append_new(items, key_json(&k[i]));
    osr_gw_reply(call, 200, json_pack("{s:o}", "items", items));
  }
  osr_gw_call_release(call);
}

void osr_gw_keys_list(osr_gw_call_t *call)
{
  char tbuf[OSR_TENANT_MAX];
  const char *tenant;
  if (scope_tenant(call, tbuf, &tenant) != 0)
    return;
  osr_gw_call_hold(call);
  int rv = osr_store_key_list(call->gw->store, tenant, on_key_list, call);
  if (rv != 0)
    on_key_list(rv, NULL, 0, call);
}

/* ---- DELETE /v1/keys/{id} ------------------------------------------------ */

static void on_key_revoked(int status, void *data)
{
  osr_gw_call_t *call = data;
  if (status == 0) {
    osr_gw_auth_forget(call->gw, call->path_id);
    osr_gw_reply(call, 204, NULL);
  } else {
    osr_gw_error_from(call, status, "revoke key");
  }
  if (status != OSR_ENOTFOUND)
    osr__gw_audit_as(call->gw, call->auth.tenant, call->auth.key_id, "key.revoke", "",
                     status == 0 ? "ok" : "error", json_pack("{s:s}", "keyId", call->path_id));
  osr_gw_call_release(call);
}

void osr_gw_keys_revoke(osr_gw_call_t *call)
{
  osr_gw_call_hold(call);
  int rv = osr_store_key_revoke(call->gw->store, call->path_id, osr_now_ms(), on_key_revoked, call);
  if (rv != 0)
    on_key_revoked(rv, call);
}

/* ---- GET /v1/audit ------------------------------------------------------- */

static void on_audit(int status, const osr_audit_event_t *ev, size_t n, const char *next_cursor,
                     void *data)
{
  osr_gw_call_t *call = data;
  if (status != 0) {
    osr_gw_error_from(call, status, "audit");
    osr_gw_call_release(call);
    return;
  }
  json_t *items = json_array();
  for (size_t i = 0; i < n; i++) {
    char at[32];
    osr_gw_rfc3339(ev[i].at_ms, at);
    json_t *detail = NULL;
    if (ev[i].detail_json != NULL && ev[i].detail_json[0] != '\0')
      detail = json_loads(ev[i].detail_json, 0, NULL);
    json_array_append_new(items, json_pack("{s:I,s:s,s:s,s:s,s:s,s:s,s:s,s:o}", "seq",
                                           (json_int_t)ev[i].seq, "at", at, "tenant", ev[i].tenant,
                                           "actor", ev[i].actor, "action", ev[i].action,
                                           "sandboxId", ev[i].sandbox_id, "outcome", ev[i].outcome,
                                           "detail", detail != NULL ? detail : json_object()));
  }
  osr_gw_reply(call, 200,
               json_pack("{s:o,s:o}", "items", items, "nextCursor",
                         next_cursor != NULL ? json_string(next_cursor) : json_null()));
  osr_gw_call_release(call);
}

void osr_gw_audit_list(osr_gw_call_t *call)
{
  char tbuf[OSR_TENANT_MAX], lbuf[16], cursor[CURSOR_MAX];
  const char *tenant;
  if (scope_tenant(call, tbuf, &tenant) != 0)
    return;
  size_t limit = 100;
  int n = osr_gw_query(call, "limit", lbuf, sizeof(lbuf));
  if (n != -1) {
    char *end;
    unsigned long v = n > 0 ? strtoul(lbuf, &end, 10) : 0;
    if (n <= 0 || *end != '\0' || v < 1 || v > 1000) {
      osr_gw_error(call, 400, "invalid_request", "'limit' must be an integer from 1 to 1000",
                   json_pack("{s:s}", "field", "limit"));
      return;
    }
    limit = v;
  }
  n = osr_gw_query(call, "cursor", cursor, sizeof(cursor));
  if (n == OSR_ETOOLARGE) {
    osr_gw_error(call, 400, "invalid_request", "'cursor' is not a cursor from a previous page",
                 json_pack("{s:s}", "field", "cursor"));
    return;
  }
  osr_gw_call_hold(call);
  int rv =
      osr_store_audit_list(call->gw->store, tenant, n > 0 ? cursor : NULL, limit, on_audit, call);
  if (rv != 0)
    on_audit(rv, NULL, 0, NULL, call);
}
