/* Unit tests for the word-at-a-time text checks and the bounded string
 * copy in util/text.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "util/text.h"

/* Every length from 0 to 40, at every offset of an 8-byte word, with one
 * CR, LF or NUL at every position (found) or none, among bytes that differ
 * from them by one bit or a borrow (0x0b, 0x0c, 0x0e, 0x01, 0x80, 0xff:
 * not found). */
static void test_has_crlf_nul(void **state)
{
  (void)state;
  static const unsigned char fill[] = {'a', 0x0b, 0x0c, 0x0e, 0x01, 0x80, 0xff, 0x8a, 0x8d, ' '};
  static const char bad[] = {'\r', '\n', '\0'};
  char buf[64];
  for (size_t off = 0; off < 8; off++) {
    for (size_t n = 0; n <= 40; n++) {
      for (size_t f = 0; f < sizeof(fill); f++) {
        memset(buf, (char)fill[f], sizeof(buf));
        for (size_t i = 0; i < n; i++)
          buf[off + i] = (char)fill[(f + i) % sizeof(fill)];
        assert_int_equal(osr_has_crlf_nul(buf + off, n), 0);
        for (size_t pos = 0; pos < n; pos++) {
          for (size_t b = 0; b < sizeof(bad); b++) {
            char keep = buf[off + pos];
            buf[off + pos] = bad[b];
            assert_int_equal(osr_has_crlf_nul(buf + off, n), 1);
            buf[off + pos] = keep;
          }
        }
        /* A bad byte just outside the span is not looked at. */
        buf[off + n] = '\n';
        assert_int_equal(osr_has_crlf_nul(buf + off, n), 0);
      }
    }
  }
}

/* osr_str_copy replaced snprintf(dst, size, "%s", src) on the create path:
 * the same bytes (truncation, terminator) and nothing past them written, for
 * every source length around every destination size. */
static void test_str_copy(void **state)
{
  (void)state;
  char src[40], want[48], got[48];
  for (size_t len = 0; len < sizeof(src); len++) {
    for (size_t i = 0; i < len; i++)
      src[i] = (char)('a' + (i % 26));
    src[len] = '\0';
    for (size_t size = 1; size <= 44; size++) {
      memset(want, 'x', sizeof(want));
      memset(got, 'x', sizeof(got));
      int n = snprintf(want, size, "%s", src);
      size_t copied = osr_str_copy(got, size, src);
      assert_memory_equal(got, want, sizeof(got));
      assert_int_equal(copied, (size_t)n < size ? (size_t)n : size - 1);
    }
  }
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_has_crlf_nul),
      cmocka_unit_test(test_str_copy),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
