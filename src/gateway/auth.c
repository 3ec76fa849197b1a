/*
 * Authentication: `Authorization: Bearer <key>` → (tenant, key id, role).
 *
 * Keys are never stored, only their SHA-256 (store keys table), so a leaked
 * database does not leak credentials. Tenant keys are random (20 bytes, 160
 * bits), which is why a plain unsalted hash is enough: there is nothing to
 * brute-force from a dictionary.
 *
 * The admin key (cfg->admin_key or <data_dir>/admin.key) is not in the
 * store; gateway.c puts its hash in gw->admin_key_hash and we compare hashes
 * in constant time.
 *
 * Every API request authenticates, so a positive cache (hash → caller) in
 * front of the store saves a database round trip per request: at most
 * OSR_AUTH_CACHE_MAX entries living OSR_AUTH_CACHE_TTL_MS each. Unknown keys
 * are not cached (a negative cache would let a flood of random keys evict
 * the good ones). Revocation drops the key's entries at once in this
 * gateway; other gateways sharing the database see it within the TTL. A
 * generation counter, bumped on every revocation, keeps a lookup that was
 * in flight during a revocation from re-inserting the revoked key.
 */
#include <openssl/crypto.h>
#include <string.h>
#include <strings.h>

#include "gateway/api_int.h"
#include "util/log.h"
#include "util/mem.h"

#define NBUCKETS 4096 /* power of two */

typedef struct entry_s {
  struct entry_s *next;
  char hash[65];
  osr_gw_auth_t auth;
  int64_t expires_ms;
} entry_t;

struct osr_gw_api_s {
  entry_t *buckets[NBUCKETS];
  size_t n;
  uint64_t generation;
};

int osr__gw_auth_init(osr_gw_t *gw)
{
  gw->api = osr_xcalloc(1, sizeof(*gw->api));
  return 0;
}

static void cache_clear(osr_gw_api_t *a)
{
  for (size_t i = 0; i < NBUCKETS; i++) {
    entry_t *e = a->buckets[i];
    while (e != NULL) {
      entry_t *next = e->next;
      osr_free(e);
      e = next;
    }
    a->buckets[i] = NULL;
  }
  a->n = 0;
}

void osr__gw_auth_dispose(osr_gw_t *gw)
{
  if (gw->api == NULL)
    return;
  cache_clear(gw->api);
  osr_freep(&gw->api);
}

static size_t bucket_of(const char *hash)
{
  /* The hash is uniformly random hex: its first 3 digits index well. */
  size_t v = 0;
  for (int i = 0; i < 3; i++) {
    char c = hash[i];
    v = v * 16 + (size_t)(c <= '9' ? c - '0' : c - 'a' + 10);
  }
  return v & (NBUCKETS - 1);
}

static const entry_t *cache_get(osr_gw_api_t *a, const char *hash, int64_t now)
{
  entry_t **pp = &a->buckets[bucket_of(hash)];
  while (*pp != NULL) {
    entry_t *e = *pp;
    if (e->expires_ms <= now) { /* drop expired entries as we pass them */
      *pp = e->next;
      osr_free(e);
      a->n--;
      continue;
    }
    if (strcmp(e->hash, hash) == 0)
      return e;
    pp = &e->next;
  }
  return NULL;
}

/* Remove expired entries everywhere; used when the cache is full. */
static void cache_sweep(osr_gw_api_t *a, int64_t now)
{
  for (size_t i = 0; i < NBUCKETS; i++) {
    entry_t **pp = &a->buckets[i];
    while (*pp != NULL) {
      entry_t *e = *pp;
      if (e->expires_ms <= now) {
        *pp = e->next;
        osr_free(e);
        a->n--;
      } else {
        pp = &e->next;
      }
    }
  }
}

static void cache_put(osr_gw_api_t *a, const char *hash, const osr_gw_auth_t *auth, int64_t now)
{
  if (cache_get(a, hash, now) != NULL)
    return;
  if (a->n >= OSR_AUTH_CACHE_MAX) {
    cache_sweep(a, now);
    /* Still full of live entries: start over rather than keep an LRU list.
     * It costs one store round trip per active key, once. */
    if (a->n >= OSR_AUTH_CACHE_MAX)
      cache_clear(a);
  }
  entry_t *e = osr_xcalloc(1, sizeof(*e));
  memcpy(e->hash, hash, sizeof(e->hash));
  e->auth = *auth;
  e->expires_ms = now + OSR_AUTH_CACHE_TTL_MS;
  size_t b = bucket_of(hash);
  e->next = a->buckets[b];
  a->buckets[b] = e;
  a->n++;
}

void osr_gw_auth_forget(osr_gw_t *gw, const char *key_id)
{
  osr_gw_api_t *a = gw->api;
  if (a == NULL)
    return;
  a->generation++;
  for (size_t i = 0; i < NBUCKETS; i++) {
    entry_t **pp = &a->buckets[i];
    while (*pp != NULL) {
      entry_t *e = *pp;
      if (strcmp(e->auth.key_id, key_id) == 0) {
        *pp = e->next;
        osr_free(e);
        a->n--;
      } else {
        pp = &e->next;
      }
    }
  }
}

int osr__gw_hash_eq(const char *a, const char *b)
{
  return CRYPTO_memcmp(a, b, 64) == 0;
}

int osr__gw_tenant_valid(const char *s)
{
  size_t n = strlen(s);
  if (n == 0 || n >= OSR_TENANT_MAX)
    return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
      return 0;
  }
  return 1;
}

static void to_hex(const unsigned char *p, size_t n, char *out)
{
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = hex[p[i] >> 4];
    out[2 * i + 1] = hex[p[i] & 15];
  }
  out[2 * n] = '\0';
}

void osr__gw_key_new(char secret[OSR_KEY_LEN + 1], char hash[65], char key_id[24])
{
  osr__gw_key_new_prefixed(OSR_KEY_PREFIX, secret, hash, key_id);
}

void osr__gw_key_new_prefixed(const char *prefix, char secret[OSR_KEY_LEN + 1], char hash[65],
                              char key_id[24])
{
  unsigned char r[20], id[10];
  osr_random_bytes(r, sizeof(r));
  osr_random_bytes(id, sizeof(id));
  memcpy(secret, prefix, 4);
  to_hex(r, sizeof(r), secret + 4);
  osr_sha256_hex(secret, OSR_KEY_LEN, hash);
  key_id[0] = 'k';
  to_hex(id, sizeof(id), key_id + 1);
  OPENSSL_cleanse(r, sizeof(r));
}

static int is_tenant_key(const char *p, size_t n)
{
  if (n != OSR_KEY_LEN ||
      (memcmp(p, OSR_KEY_PREFIX, 4) != 0 && memcmp(p, OSR_KEY_PREFIX_E2B, 4) != 0))
    return 0;
  for (size_t i = 4; i < n; i++)
    if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
      return 0;
  return 1;
}

typedef struct lookup_s {
  osr_gw_call_t *call;
  void (*cb)(osr_gw_call_t *call, int status);
  uint64_t generation;
  char hash[65];
} lookup_t;

static void on_lookup(int status, const osr_api_key_t *k, void *data)
{
  lookup_t *l = data;
  osr_gw_call_t *call = l->call;
  osr_gw_t *gw = call->gw;
  if (status == 0 && k->revoked_ms != 0)
    status = OSR_ENOTFOUND;
  if (status == 0) {
    snprintf(call->auth.tenant, sizeof(call->auth.tenant), "%s", k->tenant);
    snprintf(call->auth.key_id, sizeof(call->auth.key_id), "%s", k->key_id);
    call->auth.role = k->role == OSR_ROLE_ADMIN ? OSR_ROLE_ADMIN : OSR_ROLE_TENANT;
    if (gw->api != NULL && gw->api->generation == l->generation)
      cache_put(gw->api, l->hash, &call->auth, osr_now_ms());
  }
  l->cb(call, status);
  osr_free(l);
  osr_gw_call_release(call);
}

osr__auth_result_t osr__gw_authenticate(osr_gw_call_t *call,
                                        void (*cb)(osr_gw_call_t *call, int status))
{
  osr_gw_t *gw = call->gw;
  const osr_iovec_t *h = osr_http_req_header(call->req, "authorization");
  const char *p;
  size_t n;
  if (h != NULL) {
    if (h->len < 7 || strncasecmp(h->base, "Bearer ", 7) != 0)
      return OSR__AUTH_MISSING;
    p = h->base + 7;
    n = h->len - 7;
  } else if ((h = osr_http_req_header(call->req, "x-api-key")) != NULL) {
    /* E2B's SDKs send the key in X-API-KEY (docs/e2b-compat.md). An
     * Authorization header, when present, wins. */
    p = h->base;
    n = h->len;
  } else {
    return OSR__AUTH_MISSING;
  }
  while (n > 0 && (*p == ' ' || *p == '\t')) {
    p++;
    n--;
  }
  while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t'))
    n--;
  if (n == 0 || n > 512)
    return OSR__AUTH_INVALID;

  char hash[65];
  osr_sha256_hex(p, n, hash);
  if (gw->admin_key_hash[0] != '\0' && osr__gw_hash_eq(hash, gw->admin_key_hash)) {
    snprintf(call->auth.tenant, sizeof(call->auth.tenant), "admin");
    snprintf(call->auth.key_id, sizeof(call->auth.key_id), "admin");
    call->auth.role = OSR_ROLE_ADMIN;
    return OSR__AUTH_OK;
  }
  /* Anything that cannot be one of our keys is refused without a store
   * round trip. */
  if (!is_tenant_key(p, n))
    return OSR__AUTH_INVALID;

  if (gw->api != NULL) {
    const entry_t *e = cache_get(gw->api, hash, osr_now_ms());
    if (e != NULL) {
      call->auth = e->auth;
      return OSR__AUTH_OK;
    }
  }
  if (gw->store == NULL)
    return OSR__AUTH_UNAVAILABLE;
  lookup_t *l = osr_xcalloc(1, sizeof(*l));
  l->call = call;
  l->cb = cb;
  l->generation = gw->api != NULL ? gw->api->generation : 0;
  memcpy(l->hash, hash, sizeof(hash));
  osr_gw_call_hold(call);
  int rv = osr_store_key_lookup(gw->store, hash, on_lookup, l);
  if (rv != 0) {
    osr_gw_call_release(call);
    osr_free(l);
    OSR_LOG_WARN("auth", "key lookup: %s", osr__gw_strerror(rv));
    return OSR__AUTH_UNAVAILABLE;
  }
  return OSR__AUTH_PENDING;
}
