/*
 * The revocation list: sandbox ids killed recently, so that tokens for them
 * stop working at once instead of at their expiry.
 *
 * Entries live in a ring in insertion order (oldest first), indexed by an
 * open-addressing hash table with linear probing. Both are allocated once
 * at their cap, so a burst of kills can never grow memory: when the ring is
 * full the oldest entry goes, which is the one closest to expiring on its
 * own (every token for it dies at its exp anyway, at most ttl_s after the
 * kill). Lookups are O(1) on the data plane's connection path.
 *
 * Expired entries are dropped lazily from the head of the ring when new
 * ones are added; lookups check the time themselves, so a stale entry is
 * never reported.
 */
#include <string.h>

#include "token/token.h"
#include "util/mem.h"

#define ID_CAP 40 /* as osr_token_claims_t.sandbox_id */

typedef struct rev_entry_s {
  char id[ID_CAP];
  int64_t t; /* when revoked (unix seconds) */
} rev_entry_t;

struct osr_revocations_s {
  rev_entry_t *ring;
  size_t cap, head, n; /* ring slots, index of the oldest, entries held */
  uint32_t *slots;     /* hash index: ring index + 1, 0 = empty */
  size_t nslots;       /* power of two, >= 2 * cap */
  int64_t ttl_s;
  uint64_t evicted;
};

static uint64_t hash_id(const char *s)
{
  uint64_t h = 1469598103934665603ull; /* FNV-1a: ids are gateway-made, not hostile */
  for (; *s != '\0'; s++) {
    h ^= (unsigned char)*s;
    h *= 1099511628211ull;
  }
  return h;
}

osr_revocations_t *osr_revocations_new(size_t max_entries, int64_t ttl_s)
{
  if (max_entries == 0)
    max_entries = 1;
  if (max_entries > (1u << 24)) /* 16 M kills in one token lifetime is a bug */
    max_entries = 1u << 24;
  osr_revocations_t *r = osr_xcalloc(1, sizeof(*r));
  r->cap = max_entries;
  r->ring = osr_xcalloc(max_entries, sizeof(*r->ring));
  r->nslots = 4;
  while (r->nslots < 2 * max_entries)
    r->nslots <<= 1;
  r->slots = osr_xcalloc(r->nslots, sizeof(*r->slots));
  r->ttl_s = ttl_s > 0 ? ttl_s : 0;
  return r;
}

void osr_revocations_free(osr_revocations_t *r)
{
  if (r == NULL)
    return;
  osr_free(r->ring);
  osr_free(r->slots);
  osr_free(r);
}

/* Slot holding `id`, or the empty slot where it would go. */
static size_t probe(const osr_revocations_t *r, const char *id)
{
  size_t mask = r->nslots - 1;
  size_t i = (size_t)hash_id(id) & mask;
  /* The table is at most half full, so an empty slot always ends the walk. */
  while (r->slots[i] != 0 && strcmp(r->ring[r->slots[i] - 1].id, id) != 0)
    i = (i + 1) & mask;
  return i;
}

/* Remove the index entry at slot i, shifting back the entries that probed
 * past it (linear probing's deletion without tombstones). */
static void slot_delete(osr_revocations_t *r, size_t i)
{
  size_t mask = r->nslots - 1;
  size_t j = i;
  r->slots[i] = 0;
  for (;;) {
    j = (j + 1) & mask;
    if (r->slots[j] == 0)
      return;
    size_t home = (size_t)hash_id(r->ring[r->slots[j] - 1].id) & mask;
    /* Move j back into the hole unless its home lies cyclically in (i, j]. */
    int in_range = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (!in_range) {
      r->slots[i] = r->slots[j];
      r->slots[j] = 0;
      i = j;
    }
  }
}

static void pop_oldest(osr_revocations_t *r)
{
  rev_entry_t *e = &r->ring[r->head];
  size_t s = probe(r, e->id);
  if (r->slots[s] != 0)
    slot_delete(r, s);
  e->id[0] = '\0';
  r->head = (r->head + 1) % r->cap;
  r->n--;
}

static int expired(const osr_revocations_t *r, const rev_entry_t *e, int64_t now_s)
{
  /* now < t (the clock went back) keeps the entry: fail closed. */
  return now_s >= e->t && now_s - e->t >= r->ttl_s;
}

void osr_revocations_add(osr_revocations_t *r, const char *sandbox_id, int64_t now_s)
{
  if (r == NULL || sandbox_id == NULL || sandbox_id[0] == '\0' ||
      strnlen(sandbox_id, ID_CAP) >= ID_CAP)
    return;
  while (r->n > 0 && expired(r, &r->ring[r->head], now_s))
    pop_oldest(r);
  size_t s = probe(r, sandbox_id);
  if (r->slots[s] != 0) {
    /* Killed again (or the kill was published twice): extend in place. */
    rev_entry_t *e = &r->ring[r->slots[s] - 1];
    if (now_s > e->t)
      e->t = now_s;
    return;
  }
  if (r->n == r->cap) {
    pop_oldest(r);
    r->evicted++;
    s = probe(r, sandbox_id); /* the deletion may have moved slots */
  }
  size_t idx = (r->head + r->n) % r->cap;
  rev_entry_t *e = &r->ring[idx];
  memcpy(e->id, sandbox_id, strlen(sandbox_id) + 1);
  e->t = now_s;
  r->slots[s] = (uint32_t)idx + 1;
  r->n++;
}

int osr_revocations_contains(osr_revocations_t *r, const char *sandbox_id, int64_t now_s)
{
  if (r == NULL || sandbox_id == NULL || strnlen(sandbox_id, ID_CAP) >= ID_CAP)
    return 0;
  size_t s = probe(r, sandbox_id);
  if (r->slots[s] == 0)
    return 0;
  return !expired(r, &r->ring[r->slots[s] - 1], now_s);
}

size_t osr_revocations_count(const osr_revocations_t *r)
{
  return r != NULL ? r->n : 0;
}

uint64_t osr_revocations_evicted(const osr_revocations_t *r)
{
  return r != NULL ? r->evicted : 0;
}
