/*
 * Upstream credentials (src/token/agent.c, osr_upstream_seal/open): a seal
 * opens with the same agent token and sandbox id and with nothing else
 * (another sandbox's agent token, another sandbox id, any changed
 * character); the output is base64url that fits an agent endpoint; bounds
 * and bad arguments are refused; two seals of the same plaintext differ
 * (random nonce).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "token/token.h"

static const uint8_t secret[OSR_AGENT_SECRET_LEN] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11,
                                                     12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
                                                     23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

#define PLAIN "v1\nsbx123.e2b.example\nenvd-token-value\ntraffic-token"

static void test_roundtrip(void **state)
{
  (void)state;
  char tok[65], sealed[1024], out[OSR_UPSTREAM_PLAIN_MAX + 1];
  assert_int_equal(osr_agent_token(secret, "abcdefghij0123456789", tok), 0);
  int n =
      osr_upstream_seal(tok, "abcdefghij0123456789", PLAIN, strlen(PLAIN), sealed, sizeof(sealed));
  assert_true(n > 0);
  assert_int_equal((size_t)n, strlen(sealed));
  /* 12-byte nonce + plaintext + 16-byte tag, base64url without padding. */
  assert_int_equal((size_t)n,
                   (12 + strlen(PLAIN) + 16) * 4 / 3 + ((12 + strlen(PLAIN) + 16) % 3 ? 1 : 0));
  for (int i = 0; i < n; i++)
    assert_true(strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_",
                       sealed[i]) != NULL);
  assert_null(strstr(sealed, "envd-token"));
  int m = osr_upstream_open(tok, "abcdefghij0123456789", sealed, (size_t)n, out, sizeof(out));
  assert_int_equal(m, (int)strlen(PLAIN));
  assert_string_equal(out, PLAIN);
  /* A fresh nonce each time. */
  char again[1024];
  assert_int_equal(
      osr_upstream_seal(tok, "abcdefghij0123456789", PLAIN, strlen(PLAIN), again, sizeof(again)),
      n);
  assert_string_not_equal(again, sealed);
}

static void test_wrong_key_sandbox_or_bytes(void **state)
{
  (void)state;
  char tok[65], other[65], sealed[1024], out[OSR_UPSTREAM_PLAIN_MAX + 1];
  assert_int_equal(osr_agent_token(secret, "sandboxa000000000000", tok), 0);
  assert_int_equal(osr_agent_token(secret, "sandboxb000000000000", other), 0);
  int n =
      osr_upstream_seal(tok, "sandboxa000000000000", PLAIN, strlen(PLAIN), sealed, sizeof(sealed));
  assert_true(n > 0);
  /* Another sandbox's key, or the right key under another sandbox id. */
  assert_int_equal(
      osr_upstream_open(other, "sandboxa000000000000", sealed, (size_t)n, out, sizeof(out)),
      OSR_EINVAL);
  assert_string_equal(out, "");
  assert_int_equal(
      osr_upstream_open(tok, "sandboxb000000000000", sealed, (size_t)n, out, sizeof(out)),
      OSR_EINVAL);
  /* Every single-character change is refused. */
  for (int i = 0; i < n; i++) {
    char t[1024];
    memcpy(t, sealed, (size_t)n + 1);
    t[i] = t[i] == 'A' ? 'B' : 'A';
    int rv = osr_upstream_open(tok, "sandboxa000000000000", t, (size_t)n, out, sizeof(out));
    assert_true(rv < 0);
    assert_string_equal(out, "");
  }
  /* Truncated. */
  assert_true(
      osr_upstream_open(tok, "sandboxa000000000000", sealed, (size_t)n - 4, out, sizeof(out)) < 0);
  assert_true(osr_upstream_open(tok, "sandboxa000000000000", sealed, 10, out, sizeof(out)) < 0);
}

static void test_bounds_and_arguments(void **state)
{
  (void)state;
  char tok[65], sealed[1024], out[OSR_UPSTREAM_PLAIN_MAX + 1];
  char big[OSR_UPSTREAM_PLAIN_MAX + 2];
  assert_int_equal(osr_agent_token(secret, "s", tok), 0);
  memset(big, 'x', sizeof(big));
  assert_int_equal(
      osr_upstream_seal(tok, "s", big, OSR_UPSTREAM_PLAIN_MAX + 1, sealed, sizeof(sealed)),
      OSR_EINVAL);
  int n = osr_upstream_seal(tok, "s", big, OSR_UPSTREAM_PLAIN_MAX, sealed, sizeof(sealed));
  assert_true(n > 0);
  assert_int_equal(osr_upstream_open(tok, "s", sealed, (size_t)n, out, sizeof(out)),
                   OSR_UPSTREAM_PLAIN_MAX);
  /* Output too small, for either side. */
  assert_int_equal(osr_upstream_seal(tok, "s", PLAIN, strlen(PLAIN), sealed, 20), OSR_E2BIG);
  n = osr_upstream_seal(tok, "s", PLAIN, strlen(PLAIN), sealed, sizeof(sealed));
  assert_int_equal(osr_upstream_open(tok, "s", sealed, (size_t)n, out, 5), OSR_E2BIG);
  /* No agent token, a malformed one, no sandbox id, nothing to seal. */
  assert_int_equal(osr_upstream_seal(NULL, "s", PLAIN, 3, sealed, sizeof(sealed)), OSR_EINVAL);
  assert_int_equal(osr_upstream_seal("abc", "s", PLAIN, 3, sealed, sizeof(sealed)), OSR_EINVAL);
  assert_int_equal(osr_upstream_seal(tok, "", PLAIN, 3, sealed, sizeof(sealed)), OSR_EINVAL);
  assert_int_equal(osr_upstream_seal(tok, "s", PLAIN, 0, sealed, sizeof(sealed)), OSR_EINVAL);
  assert_int_equal(osr_upstream_open(tok, "s", "not base64!", 11, out, sizeof(out)), OSR_EINVAL);
}

/* osr_agent_key_token (pad states hashed once, the gateway's create path)
 * gives osr_agent_token's bytes for ids of every length from 1 to 200
 * (across SHA-256's 64-byte block boundaries), reusing one key, and the
 * same refusal of an empty id. */
static void test_agent_key_matches(void **state)
{
  (void)state;
  osr_agent_key_t *k = osr_agent_key_new(secret);
  assert_non_null(k);
  char id[201], want[65], got[65];
  for (size_t n = 1; n < sizeof(id); n++) {
    for (size_t i = 0; i < n; i++)
      id[i] = (char)('a' + ((i * 7 + n) % 26));
    id[n] = '\0';
    assert_int_equal(osr_agent_token(secret, id, want), 0);
    assert_int_equal(osr_agent_key_token(k, id, got), 0);
    assert_string_equal(got, want);
  }
  assert_int_equal(osr_agent_key_token(k, "", got), OSR_EINVAL);
  assert_string_equal(got, "");
  assert_int_equal(osr_agent_key_token(k, NULL, got), OSR_EINVAL);
  osr_agent_key_free(k);
  osr_agent_key_free(NULL);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip),
      cmocka_unit_test(test_agent_key_matches),
      cmocka_unit_test(test_wrong_key_sandbox_or_bytes),
      cmocka_unit_test(test_bounds_and_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
