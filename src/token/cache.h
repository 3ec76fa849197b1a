/*
 * Verified-token cache: the data plane's answer to "an Ed25519 verify per
 * request".
 *
 * Verifying a binding token costs about 700,000 instructions (base64url,
 * msgpack and, above all, the Ed25519 signature check), roughly 50 times
 * what proxying a small request costs. A client sends the same token on
 * every request until it refreshes it, so the data plane remembers tokens
 * that verified: the key is the exact token bytes, the value the decoded
 * claims, and an entry is good until the token expires.
 *
 * What a cached answer still checks on every hit, so the cache never
 * accepts what osr_token_verify would refuse:
 *   - expiry and not-before, with the caller's `now` and leeway;
 *   - the signing key: the keyring passed in must still hold the token's
 *     kid with the same public key (a key removed or replaced by rotation
 *     fails the hit, and the token is verified afresh, i.e. fails closed).
 * Revocation is not the cache's business: the caller checks
 * osr_revocations_contains() after every verify, cached or not.
 *
 * Only successes are cached: a forged or expired token costs a full verify
 * every time (as without the cache). The cache is bounded (least recently
 * used entries are evicted) and holds a copy of each token, so memory is at
 * most max_entries * (sizeof(claims) + token length).
 *
 * Not locked: one cache per loop thread.
 */
#ifndef OSR_TOKEN_CACHE_H
#define OSR_TOKEN_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "token/token.h"

typedef struct osr_token_cache_s osr_token_cache_t;

/** A cache of at most `max_entries` verified tokens (0 disables caching:
 *  every call verifies). Never NULL (aborts on OOM: fixed-size control
 *  structure). Free with osr_token_cache_free. */
osr_token_cache_t *osr_token_cache_new(size_t max_entries);
void osr_token_cache_free(osr_token_cache_t *tc);

/** osr_token_verify with a memory: same arguments, same results. A hit
 *  rechecks expiry (now_s, leeway_s) and that `kr` still holds the token's
 *  key; a miss verifies and, on success, remembers the claims (evicting the
 *  least recently used entry when full). `out` (may be NULL) is written only
 *  on success. */
int osr_token_cache_verify(osr_token_cache_t *tc, const osr_keyring_t *kr, const char *tok,
                           size_t len, int64_t now_s, int64_t leeway_s, osr_token_claims_t *out);

/** Forget every entry (e.g. when the keyring was replaced). */
void osr_token_cache_clear(osr_token_cache_t *tc);

/** Entries held, and the hit/miss counters since creation (tests, logs). */
size_t osr_token_cache_size(const osr_token_cache_t *tc);
uint64_t osr_token_cache_hits(const osr_token_cache_t *tc);
uint64_t osr_token_cache_misses(const osr_token_cache_t *tc);

#endif
