/*
 * Verified-token cache (cache.h): a chained hash table over an intrusive
 * LRU list. Entries are found by a hash of the token's tail (the base64url
 * signature: random for every token the gateway signs, so a cheap hash of
 * 64 bytes spreads them as well as hashing all ~400) and confirmed by
 * comparing every byte, so two tokens never share an entry.
 *
 * The hash is seeded per cache. Only tokens that verified are inserted and
 * only the gateway can make those, so nobody can fill a chain on purpose;
 * the seed makes even that moot.
 */
#include "token/cache.h"

#include <openssl/rand.h>
#include <string.h>

#include "token/token_int.h"
#include "util/mem.h"

#define HASH_TAIL 64

typedef struct entry_s {
  struct entry_s *chain;               /* next in the bucket */
  struct entry_s *lru_prev, *lru_next; /* most recently used at the head */
  uint64_t hash;
  char *tok; /* a copy of the token bytes */
  size_t len;
  uint8_t pub[32]; /* the key that verified it */
  osr_token_claims_t claims;
} entry_t;

struct osr_token_cache_s {
  entry_t **buckets;
  size_t nbuckets; /* a power of two */
  size_t n, max;
  entry_t *lru_head, *lru_tail;
  uint64_t seed;
  uint64_t hits, misses;
};

static uint64_t hash_of(const osr_token_cache_t *tc, const char *tok, size_t len)
{
  /* FNV-1a over the tail and the length. */
  uint64_t h = 14695981039346656037ull ^ tc->seed;
  size_t from = len > HASH_TAIL ? len - HASH_TAIL : 0;
  for (size_t i = from; i < len; i++)
    h = (h ^ (unsigned char)tok[i]) * 1099511628211ull;
  h = (h ^ len) * 1099511628211ull;
  return h ^ (h >> 29);
}

osr_token_cache_t *osr_token_cache_new(size_t max_entries)
{
  osr_token_cache_t *tc = osr_xcalloc(1, sizeof(*tc));
  tc->max = max_entries;
  tc->nbuckets = 16;
  while (tc->nbuckets < max_entries && tc->nbuckets < ((size_t)1 << 24))
    tc->nbuckets <<= 1;
  tc->buckets = osr_xcalloc(tc->nbuckets, sizeof(*tc->buckets));
  if (RAND_bytes((uint8_t *)&tc->seed, sizeof(tc->seed)) != 1)
    tc->seed = (uint64_t)(uintptr_t)tc; /* still varies per process (ASLR) */
  return tc;
}

static void lru_unlink(osr_token_cache_t *tc, entry_t *e)
{
  if (e->lru_prev != NULL)
    e->lru_prev->lru_next = e->lru_next;
  else
    tc->lru_head = e->lru_next;
  if (e->lru_next != NULL)
    e->lru_next->lru_prev = e->lru_prev;
  else
    tc->lru_tail = e->lru_prev;
  e->lru_prev = e->lru_next = NULL;
}

static void lru_push_front(osr_token_cache_t *tc, entry_t *e)
{
  e->lru_prev = NULL;
  e->lru_next = tc->lru_head;
  if (tc->lru_head != NULL)
    tc->lru_head->lru_prev = e;
  tc->lru_head = e;
  if (tc->lru_tail == NULL)
    tc->lru_tail = e;
}

/* Unlink e from its bucket and the LRU list and free it. */
static void entry_remove(osr_token_cache_t *tc, entry_t *e)
{
  entry_t **pp = &tc->buckets[e->hash & (tc->nbuckets - 1)];
  while (*pp != e)
    pp = &(*pp)->chain;
  *pp = e->chain;
  lru_unlink(tc, e);
  osr_free(e->tok);
  osr_free(e);
  tc->n--;
}

void osr_token_cache_clear(osr_token_cache_t *tc)
{
  while (tc->lru_head != NULL)
    entry_remove(tc, tc->lru_head);
}

void osr_token_cache_free(osr_token_cache_t *tc)
{
  if (tc == NULL)
    return;
  osr_token_cache_clear(tc);
  osr_free(tc->buckets);
  osr_free(tc);
}

/* The expiry rule of osr_token_verify, for a cached hit. */
static int still_valid(const osr_token_claims_t *c, int64_t now_s, int64_t leeway_s)
{
  if (leeway_s < 0)
    leeway_s = 0;
  int64_t late, early;
  if (__builtin_sub_overflow(now_s, leeway_s, &late) || late >= c->exp)
    return 0;
  if (!__builtin_add_overflow(now_s, leeway_s, &early) && c->iat > early)
    return 0;
  return 1;
}

static void insert(osr_token_cache_t *tc, const char *tok, size_t len, uint64_t h,
                   const osr__key_t *key, const osr_token_claims_t *c)
{
  /* Tokens are at most OSR_TOKEN_MAX bytes, but the client chose this one:
   * an allocation failure only means it is not cached. */
  char *copy = osr_try_malloc(len);
  if (copy == NULL)
    return;
  entry_t *e = osr_try_malloc(sizeof(*e));
  if (e == NULL) {
    osr_free(copy);
    return;
  }
  memcpy(copy, tok, len);
  e->tok = copy;
  e->len = len;
  e->hash = h;
  memcpy(e->pub, key->pub, sizeof(e->pub));
  e->claims = *c;
  if (tc->n >= tc->max)
    entry_remove(tc, tc->lru_tail);
  entry_t **b = &tc->buckets[h & (tc->nbuckets - 1)];
  e->chain = *b;
  *b = e;
  e->lru_prev = e->lru_next = NULL;
  lru_push_front(tc, e);
  tc->n++;
}

int osr_token_cache_verify(osr_token_cache_t *tc, const osr_keyring_t *kr, const char *tok,
                           size_t len, int64_t now_s, int64_t leeway_s, osr_token_claims_t *out)
{
  if (tc == NULL || tc->max == 0 || tok == NULL || len == 0 || len > OSR_TOKEN_MAX)
    return osr_token_verify(kr, tok, len, now_s, leeway_s, out);
  uint64_t h = hash_of(tc, tok, len);
  entry_t *e = tc->buckets[h & (tc->nbuckets - 1)];
  while (e != NULL && !(e->hash == h && e->len == len && memcmp(e->tok, tok, len) == 0))
    e = e->chain;
  if (e != NULL) {
    const osr__key_t *key = osr__keyring_find(kr, e->claims.kid, strlen(e->claims.kid));
    if (key != NULL && memcmp(key->pub, e->pub, sizeof(e->pub)) == 0) {
      if (!still_valid(&e->claims, now_s, leeway_s)) {
        entry_remove(tc, e);
        return OSR_ETOKEN_EXPIRED;
      }
      tc->hits++;
      if (tc->lru_head != e) {
        lru_unlink(tc, e);
        lru_push_front(tc, e);
      }
      if (out != NULL)
        *out = e->claims;
      return 0;
    }
    /* The key it was verified with is gone or changed: verify afresh
     * (which fails closed on an unknown kid). */
    entry_remove(tc, e);
  }
  tc->misses++;
  osr_token_claims_t c;
  int rv = osr_token_verify(kr, tok, len, now_s, leeway_s, &c);
  if (rv != 0)
    return rv;
  const osr__key_t *key = osr__keyring_find(kr, c.kid, strlen(c.kid));
  if (key != NULL) /* always, since it verified */
    insert(tc, tok, len, h, key, &c);
  if (out != NULL)
    *out = c;
  return 0;
}

size_t osr_token_cache_size(const osr_token_cache_t *tc)
{
  return tc->n;
}

uint64_t osr_token_cache_hits(const osr_token_cache_t *tc)
{
  return tc->hits;
}

uint64_t osr_token_cache_misses(const osr_token_cache_t *tc)
{
  return tc->misses;
}
