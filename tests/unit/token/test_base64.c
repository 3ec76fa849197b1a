/*
 * base64url (no padding): RFC 4648 vectors in the url-safe alphabet, round
 * trips of every length and byte value, strictness (standard alphabet,
 * padding, whitespace, 1-mod-4 lengths, non-zero trailing bits), and the
 * capacity checks in both directions.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "util/base64.h"

static void test_vectors(void **state)
{
  (void)state;
  /* RFC 4648 section 10, padding removed. */
  static const char *const plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
  static const char *const enc[] = {"", "Zg", "Zm8", "Zm9v", "Zm9vYg", "Zm9vYmE", "Zm9vYmFy"};
  char out[64];
  uint8_t dec[64];
  for (size_t i = 0; i < 7; i++) {
    int n = osr_b64url_encode(plain[i], strlen(plain[i]), out, sizeof(out));
    assert_int_equal(n, (int)strlen(enc[i]));
    assert_string_equal(out, enc[i]);
    assert_int_equal(OSR_B64URL_ENC_LEN(strlen(plain[i])), strlen(enc[i]));
    n = osr_b64url_decode(enc[i], strlen(enc[i]), dec, sizeof(dec));
    assert_int_equal(n, (int)strlen(plain[i]));
    assert_memory_equal(dec, plain[i], (size_t)n);
  }
  /* The url-safe characters: 0xfb 0xff → "-_8" (standard: "+/8"). */
  const uint8_t b[] = {0xfb, 0xff};
  assert_int_equal(osr_b64url_encode(b, 2, out, sizeof(out)), 3);
  assert_string_equal(out, "-_8");
}

static void test_round_trip(void **state)
{
  (void)state;
  uint8_t in[300], dec[300];
  char enc[420];
  for (size_t i = 0; i < sizeof(in); i++)
    in[i] = (uint8_t)(i * 7 + 3);
  for (size_t len = 0; len <= sizeof(in); len++) {
    int n = osr_b64url_encode(in, len, enc, sizeof(enc));
    assert_int_equal(n, (int)OSR_B64URL_ENC_LEN(len));
    for (int k = 0; k < n; k++)
      assert_non_null(
          strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", enc[k]));
    int m = osr_b64url_decode(enc, (size_t)n, dec, sizeof(dec));
    assert_int_equal(m, (int)len);
    assert_true(OSR_B64URL_DEC_MAX((size_t)n) == len);
    assert_memory_equal(dec, in, len);
  }
}

static void test_strict(void **state)
{
  (void)state;
  uint8_t d[64];
  static const char *const bad[] = {
      "Zm9v+g", /* standard alphabet */
      "Zm9v/g", /* standard alphabet */
      "Zg==",   /* padding */
      "Zg=",    /* padding */
      "Zm9 v",  /* whitespace */
      "Zm9v\n", /* newline */
      "Z",      /* 1 mod 4 */
      "Zm9vY",  /* 1 mod 4 */
      "Zh",     /* non-zero trailing bits: only "Zg" encodes "f" */
      "Zm8",    /* fine: canonical "fo" (checked as good below) */
      "Zm9",    /* non-zero trailing bits */
      "Zm-",    /* non-zero trailing bits */
      "Zm9v.g", /* token separator */
  };
  for (size_t i = 0; i < OSR_ARRAY_SIZE(bad); i++) {
    int n = osr_b64url_decode(bad[i], strlen(bad[i]), d, sizeof(d));
    if (strcmp(bad[i], "Zm8") == 0)
      assert_int_equal(n, 2);
    else
      assert_int_equal(n, OSR_EINVAL);
  }
  /* An embedded NUL is not in the alphabet. */
  assert_int_equal(osr_b64url_decode("Zm\0v", 4, d, sizeof(d)), OSR_EINVAL);
  /* Every byte value outside the alphabet, in every position of a quad. */
  for (int c = 0; c < 256; c++) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '_')
      continue;
    for (int pos = 0; pos < 4; pos++) {
      char s[5] = "AAAA";
      s[pos] = (char)c;
      assert_int_equal(osr_b64url_decode(s, 4, d, sizeof(d)), OSR_EINVAL);
    }
  }
}

static void test_capacity(void **state)
{
  (void)state;
  char out[8];
  uint8_t d[3];
  /* "foobar" needs 8 characters + NUL. */
  assert_int_equal(osr_b64url_encode("foobar", 6, out, sizeof(out)), OSR_E2BIG);
  assert_string_equal(out, "");
  assert_int_equal(osr_b64url_encode("foobar", 6, out, 0), OSR_E2BIG);
  assert_int_equal(osr_b64url_encode("fooba", 5, out, sizeof(out)), 7);
  assert_int_equal(osr_b64url_decode("Zm9vYmFy", 8, d, sizeof(d)), OSR_E2BIG);
  assert_int_equal(osr_b64url_decode("Zm9v", 4, d, sizeof(d)), 3);
  assert_int_equal(osr_b64url_decode("", 0, d, 0), 0);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_vectors),
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_strict),
      cmocka_unit_test(test_capacity),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
