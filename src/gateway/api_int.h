/*
 * Private seam between the API plumbing files: the router (api.c),
 * authentication (auth.c), the admin handlers (api_admin.c) and the audit
 * writer (audit.c). Nothing here is used outside those files.
 */
#ifndef OSR_GATEWAY_API_INT_H
#define OSR_GATEWAY_API_INT_H

#include "gateway/api.h"

/* The embedded OpenAPI document (generated from openapi.json at build time
 * by embed.py). NUL-terminated; len excludes the NUL. */
extern const char osr_openapi_json[];
extern const size_t osr_openapi_json_len;

/** Most keys the positive auth cache holds, and how long an entry lives. */
#define OSR_AUTH_CACHE_MAX    10000
#define OSR_AUTH_CACHE_TTL_MS 30000

/** A tenant key is "osr_" followed by 40 lower-case hex digits (20 random bytes). */
#define OSR_KEY_PREFIX "osr_"
#define OSR_KEY_LEN    44
/** Keys minted for E2B SDKs ({"format":"e2b"} on POST /v1/keys) look like
 *  E2B's own, "e2b_" + 40 hex digits (some SDK versions check the shape on
 *  the client); they map to a tenant like any other key. Same length. */
#define OSR_KEY_PREFIX_E2B "e2b_"

/** Outcome of the synchronous part of authentication. */
typedef enum osr__auth_result_e {
  OSR__AUTH_OK = 0,          /**< call->auth is filled */
  OSR__AUTH_PENDING = 1,     /**< a store lookup runs; the callback fires once */
  OSR__AUTH_MISSING = 2,     /**< no Authorization header, or not Bearer */
  OSR__AUTH_INVALID = 3,     /**< malformed or unknown key */
  OSR__AUTH_UNAVAILABLE = 4, /**< the store refused the lookup (closing) */
} osr__auth_result_t;

/**
 * Resolve the caller from `Authorization: Bearer <key>`, or, when that
 * header is absent, `X-API-KEY: <key>` (E2B's SDKs). The admin key is
 * recognised by hash (constant-time compare); tenant keys come from the
 * positive cache or a store lookup. On OSR__AUTH_PENDING the call is held
 * and cb(call, status) fires once with status 0 (call->auth filled),
 * OSR_ENOTFOUND (unknown or revoked key) or another store error; the hold is
 * released after cb returns.
 */
osr__auth_result_t osr__gw_authenticate(osr_gw_call_t *call,
                                        void (*cb)(osr_gw_call_t *call, int status));

/** Create / free gw->api (the auth cache). */
int osr__gw_auth_init(osr_gw_t *gw);
void osr__gw_auth_dispose(osr_gw_t *gw);

/** Make a fresh tenant key: secret "osr_<40 hex>", its SHA-256 hex, and a
 *  public id "k<20 hex>". */
void osr__gw_key_new(char secret[OSR_KEY_LEN + 1], char hash[65], char key_id[24]);
/** The same with another 4-character prefix (OSR_KEY_PREFIX_E2B). */
void osr__gw_key_new_prefixed(const char *prefix, char secret[OSR_KEY_LEN + 1], char hash[65],
                              char key_id[24]);

/** Constant-time equality of two 64-char hex digests. */
int osr__gw_hash_eq(const char *a, const char *b);

/** 1 if `s` is a valid tenant name: 1..63 chars of [A-Za-z0-9._-]. */
int osr__gw_tenant_valid(const char *s);

/** osr_strerror() that also knows the store's and providers' codes.
 *  (osr_strerror hands unknown codes to uv_strerror, which allocates a
 *  string it never frees for each unknown code.) Static storage. */
const char *osr__gw_strerror(int err);

/** Answer with a typed error plus one extra response header (Allow,
 *  WWW-Authenticate); hname NULL = none. */
void osr__gw_error_hdr(osr_gw_call_t *call, int status, const char *code, const char *message,
                       json_t *details, const char *hname, const char *hvalue);

/** Append an audit event as `actor` on behalf of `tenant` (the tenant whose
 *  log shows it; keys events go to the key's tenant). */
void osr__gw_audit_as(osr_gw_t *gw, const char *tenant, const char *actor, const char *action,
                      const char *sandbox_id, const char *outcome, json_t *detail);

#endif
