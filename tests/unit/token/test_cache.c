/*
 * Verified-token cache (src/token/cache.c): a hit answers exactly what
 * osr_token_verify would (claims, expiry with leeway), forged tokens are
 * never served from it (every single-character change of a cached token
 * is verified and refused), a removed or replaced key fails closed for
 * cached tokens, the LRU bound holds and evicts the least recently used,
 * and a zero-sized cache just verifies.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "token/cache.h"
#include "token/token.h"

#define NOW 1700000000

static const uint8_t seed_a[32] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
                                   17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};
static const uint8_t seed_b[32] = {99, 98, 97, 96, 95, 94, 93, 92, 91, 90, 89, 88, 87, 86, 85, 84,
                                   83, 82, 81, 80, 79, 78, 77, 76, 75, 74, 73, 72, 71, 70, 69, 68};

static osr_keyring_t *ring(const char *kid, const uint8_t *seed)
{
  osr_keyring_t *kr = osr_keyring_new();
  assert_int_equal(osr_keyring_add_private(kr, kid, seed), 0);
  return kr;
}

/* A token for sandbox `sid`, valid [NOW, NOW + 600). */
static size_t mint(const osr_keyring_t *kr, const char *sid, char *out)
{
  osr_token_claims_t c;
  memset(&c, 0, sizeof(c));
  snprintf(c.sandbox_id, sizeof(c.sandbox_id), "%s", sid);
  snprintf(c.agent_endpoint, sizeof(c.agent_endpoint), "%s", "unix:/run/osr/a.sock");
  c.scopes = OSR_SCOPE_PORTS;
  c.all_ports = 1;
  c.iat = NOW;
  c.exp = NOW + 600;
  int n = osr_token_sign(kr, &c, out, OSR_TOKEN_MAX + 1);
  assert_true(n > 0);
  return (size_t)n;
}

static void test_hit_equals_verify(void **state)
{
  (void)state;
  osr_keyring_t *kr = ring("ka", seed_a);
  osr_token_cache_t *tc = osr_token_cache_new(16);
  char tok[OSR_TOKEN_MAX + 1];
  size_t n = mint(kr, "sbx1", tok);
  osr_token_claims_t want, got;
  assert_int_equal(osr_token_verify(kr, tok, n, NOW + 1, 0, &want), 0);
  for (int i = 0; i < 3; i++) {
    memset(&got, 0xa5, sizeof(got));
    assert_int_equal(osr_token_cache_verify(tc, kr, tok, n, NOW + 1 + i, 0, &got), 0);
    assert_memory_equal(&got, &want, sizeof(want));
  }
  assert_int_equal(osr_token_cache_misses(tc), 1);
  assert_int_equal(osr_token_cache_hits(tc), 2);
  assert_int_equal(osr_token_cache_size(tc), 1);
  /* NULL out is allowed. */
  assert_int_equal(osr_token_cache_verify(tc, kr, tok, n, NOW + 1, 0, NULL), 0);
  osr_token_cache_free(tc);
  osr_keyring_free(kr);
}

static void test_forgery_never_served(void **state)
{
  (void)state;
  osr_keyring_t *kr = ring("ka", seed_a);
  osr_token_cache_t *tc = osr_token_cache_new(16);
  char tok[OSR_TOKEN_MAX + 1], bad[OSR_TOKEN_MAX + 1];
  size_t n = mint(kr, "sbx1", tok);
  assert_int_equal(osr_token_cache_verify(tc, kr, tok, n, NOW + 1, 0, NULL), 0);
  static const char alphabet[] = "AQgw_-.9z";
  for (size_t i = 0; i < n; i++) {
    for (const char *a = alphabet; *a; a++) {
      if (tok[i] == *a)
        continue;
      memcpy(bad, tok, n);
      bad[i] = *a;
      int want = osr_token_verify(kr, bad, n, NOW + 1, 0, NULL);
      int got = osr_token_cache_verify(tc, kr, bad, n, NOW + 1, 0, NULL);
      assert_int_equal(got, want);
      /* A change in the base64 padding bits can decode to the same
       * bytes; every other change fails. */
      if (want == 0)
        continue;
      assert_true(got < 0);
    }
  }
  /* Every truncation (same prefix, shorter) is refused. */
  for (size_t l = 0; l < n; l++)
    assert_true(osr_token_cache_verify(tc, kr, tok, l, NOW + 1, 0, NULL) < 0);
  /* The real one still hits. */
  uint64_t hits = osr_token_cache_hits(tc);
  assert_int_equal(osr_token_cache_verify(tc, kr, tok, n, NOW + 1, 0, NULL), 0);
  assert_int_equal(osr_token_cache_hits(tc), hits + 1);
  osr_token_cache_free(tc);
  osr_keyring_free(kr);
}

static void test_expiry_on_hit(void **state)
{
  (void)state;
  osr_keyring_t *kr = ring("ka", seed_a);
  osr_token_cache_t *tc = osr_token_cache_new(16);
  char tok[OSR_TOKEN_MAX + 1];
  size_t n = mint(kr, "sbx1", tok);
  assert_int_equal(osr_token_cache_verify(tc, kr, tok, n, NOW + 1, 0, NULL), 0);
  /* Last valid second, then expired; leeway as in osr_token_verify. */
  assert_int_equal(osr_token_cache_verify(tc, kr, tok, n, NOW + 599, 0, NULL), 0);
  assert_int_equal(osr_token_cache_verify(tc, kr, tok, n, NOW + 604, 5, NULL), 0);
  assert_int_equal(osr_token_cache_verify(tc, kr, tok, n, NOW + 605, 5, NULL), OSR_ETOKEN_EXPIRED);
  assert_int_equal(osr_token_cache_size(tc), 0); /* dropped */
  assert_int_equal(osr_token_cache_verify(tc, kr, tok, n, NOW + 600, 0, NULL), OSR_ETOKEN_EXPIRED);
  /* Not valid yet (a clock that went back) is refused from the cache too. */
  assert_int_equal(osr_token_cache_verify(tc, kr, tok, n, NOW + 1, 0, NULL), 0);
  assert_int_equal(osr_token_cache_verify(tc, kr, tok, n, NOW - 10, 0, NULL), OSR_ETOKEN_EXPIRED);
  assert_int_equal(osr_token_verify(kr, tok, n, NOW - 10, 0, NULL), OSR_ETOKEN_EXPIRED);
  osr_token_cache_free(tc);
  osr_keyring_free(kr);
}

static void test_key_rotation_fails_closed(void **state)
{
  (void)state;
  osr_keyring_t *kr = ring("ka", seed_a);
  osr_token_cache_t *tc = osr_token_cache_new(16);
  char tok[OSR_TOKEN_MAX + 1];
  size_t n = mint(kr, "sbx1", tok);
  assert_int_equal(osr_token_cache_verify(tc, kr, tok, n, NOW + 1, 0, NULL), 0);
  /* A keyring without "ka": the cached token fails closed. */
  osr_keyring_t *other = ring("kb", seed_b);
  assert_int_equal(osr_token_cache_verify(tc, other, tok, n, NOW + 1, 0, NULL),
                   OSR_ETOKEN_UNKNOWN_KEY);
  assert_int_equal(osr_token_cache_size(tc), 0);
  /* Cached again, then "ka" replaced by a different key. */
  assert_int_equal(osr_token_cache_verify(tc, kr, tok, n, NOW + 1, 0, NULL), 0);
  osr_keyring_t *swapped = ring("ka", seed_b);
  assert_int_equal(osr_token_cache_verify(tc, swapped, tok, n, NOW + 1, 0, NULL),
                   OSR_ETOKEN_SIGNATURE);
  /* The same keyring rebuilt (a refresh of the same keys) still hits. */
  assert_int_equal(osr_token_cache_verify(tc, kr, tok, n, NOW + 1, 0, NULL), 0);
  osr_keyring_t *again = ring("ka", seed_a);
  uint64_t hits = osr_token_cache_hits(tc);
  assert_int_equal(osr_token_cache_verify(tc, again, tok, n, NOW + 1, 0, NULL), 0);
  assert_int_equal(osr_token_cache_hits(tc), hits + 1);
  /* Removing the key from a live keyring also fails closed. */
  assert_int_equal(osr_keyring_remove(again, "ka"), 0);
  assert_int_equal(osr_token_cache_verify(tc, again, tok, n, NOW + 1, 0, NULL),
                   OSR_ETOKEN_UNKNOWN_KEY);
  osr_keyring_free(again);
  osr_keyring_free(swapped);
  osr_keyring_free(other);
  osr_token_cache_free(tc);
  osr_keyring_free(kr);
}

static void test_lru_bound(void **state)
{
  (void)state;
  osr_keyring_t *kr = ring("ka", seed_a);
  osr_token_cache_t *tc = osr_token_cache_new(4);
  char tok[10][OSR_TOKEN_MAX + 1];
  size_t len[10];
  for (int i = 0; i < 10; i++) {
    char sid[16];
    snprintf(sid, sizeof(sid), "sbx%d", i);
    len[i] = mint(kr, sid, tok[i]);
  }
  for (int i = 0; i < 4; i++)
    assert_int_equal(osr_token_cache_verify(tc, kr, tok[i], len[i], NOW + 1, 0, NULL), 0);
  assert_int_equal(osr_token_cache_size(tc), 4);
  /* Touch 0: 1 is now the least recently used and goes first. */
  assert_int_equal(osr_token_cache_verify(tc, kr, tok[0], len[0], NOW + 1, 0, NULL), 0);
  assert_int_equal(osr_token_cache_verify(tc, kr, tok[4], len[4], NOW + 1, 0, NULL), 0);
  assert_int_equal(osr_token_cache_size(tc), 4);
  uint64_t m = osr_token_cache_misses(tc);
  osr_token_claims_t c;
  assert_int_equal(osr_token_cache_verify(tc, kr, tok[0], len[0], NOW + 1, 0, &c), 0);
  assert_string_equal(c.sandbox_id, "sbx0");
  assert_int_equal(osr_token_cache_misses(tc), m); /* 0 was kept */
  assert_int_equal(osr_token_cache_verify(tc, kr, tok[1], len[1], NOW + 1, 0, &c), 0);
  assert_string_equal(c.sandbox_id, "sbx1");
  assert_int_equal(osr_token_cache_misses(tc), m + 1); /* 1 had been evicted */
  for (int i = 0; i < 10; i++) {
    assert_int_equal(osr_token_cache_verify(tc, kr, tok[i], len[i], NOW + 1, 0, &c), 0);
    char sid[16];
    snprintf(sid, sizeof(sid), "sbx%d", i);
    assert_string_equal(c.sandbox_id, sid);
    assert_true(osr_token_cache_size(tc) <= 4);
  }
  osr_token_cache_clear(tc);
  assert_int_equal(osr_token_cache_size(tc), 0);
  osr_token_cache_free(tc);
  osr_keyring_free(kr);
}

static void test_disabled(void **state)
{
  (void)state;
  osr_keyring_t *kr = ring("ka", seed_a);
  osr_token_cache_t *tc = osr_token_cache_new(0);
  char tok[OSR_TOKEN_MAX + 1];
  size_t n = mint(kr, "sbx1", tok);
  for (int i = 0; i < 3; i++)
    assert_int_equal(osr_token_cache_verify(tc, kr, tok, n, NOW + 1, 0, NULL), 0);
  assert_int_equal(osr_token_cache_size(tc), 0);
  assert_int_equal(osr_token_cache_hits(tc), 0);
  assert_int_equal(osr_token_cache_verify(tc, kr, "x", 1, NOW + 1, 0, NULL), OSR_ETOKEN_MALFORMED);
  osr_token_cache_free(tc);
  osr_token_cache_free(NULL);
  osr_keyring_free(kr);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hit_equals_verify), cmocka_unit_test(test_forgery_never_served),
      cmocka_unit_test(test_expiry_on_hit),     cmocka_unit_test(test_key_rotation_fails_closed),
      cmocka_unit_test(test_lru_bound),         cmocka_unit_test(test_disabled),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
