/* Unit tests for the direct JSON writer (util/jsonw.h): every value it
 * writes is compared with what jansson's json_dumps(JSON_COMPACT) gives for
 * the same value, since that equality is the writer's whole contract. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "util/jsonw.h"
#include "util/mem.h"

/* The writer's text for one value, or NULL. Free with osr_free. */
static char *jw_str(const char *s)
{
  osr_jw_t w;
  size_t len;
  osr_jw_init(&w, 1 << 16);
  osr_jw_str(&w, s);
  char *out = osr_jw_release(&w, &len);
  assert_non_null(out);
  assert_int_equal(len, strlen(out));
  return out;
}

/* json_dumps of one value (taking the reference), compared with `got`. */
static void assert_dumps(json_t *v, const char *got)
{
  assert_non_null(v);
  char *want = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
  assert_non_null(want);
  assert_string_equal(got, want);
  osr_json_free(want);
  json_decref(v);
}

static void check_str(const char *s)
{
  char *got = jw_str(s);
  assert_dumps(json_string(s), got);
  osr_free(got);
}

/* Every byte from 0x01 to 0x7f alone, then all of them in one string:
 * the control bytes escaped (short forms and \u00XX in upper-case hex), the
 * quote and backslash escaped, '/' and 0x7f as they are (jansson escapes
 * '/' only with JSON_ESCAPE_SLASH and never 0x7f). 0x00 ends a C string:
 * test_strn_nul gives it to osr_jw_strn. */
static void test_str_ascii(void **state)
{
  (void)state;
  char all[128], one[2] = {0, 0};
  for (int ch = 1; ch < 0x80; ch++) {
    one[0] = (char)ch;
    check_str(one);
    all[ch - 1] = (char)ch;
  }
  all[127] = '\0';
  check_str(all);
  check_str("");
  check_str("\"\\\"\\\\/\\/");
  check_str("a\x1f"
            "b\x7f"
            "c\x01\x00 after the NUL");
  check_str("tab\there, nl\nthere, cr\rand \b\f");
}

/* osr_jw_strn against json_stringn: NUL bytes (\u0000) anywhere, and
 * every byte 0x00-0x7f in one string of 128 bytes. */
static void check_strn(const char *s, size_t n)
{
  osr_jw_t w;
  size_t len;
  osr_jw_init(&w, 1 << 12);
  osr_jw_strn(&w, s, n);
  char *got = osr_jw_release(&w, &len);
  assert_non_null(got);
  assert_int_equal(len, strlen(got));
  assert_dumps(json_stringn(s, n), got);
  osr_free(got);
}

static void test_strn_nul(void **state)
{
  (void)state;
  char all[128];
  for (int ch = 0; ch < 0x80; ch++)
    all[ch] = (char)ch;
  check_strn(all, sizeof(all));
  check_strn("\0", 1);
  check_strn("a\0b\0", 4);
  check_strn("\0\0\xc3\xa9\0", 5);
  check_strn("", 0);
  check_strn("abc", 2); /* only n bytes */
}

static void test_str_utf8(void **state)
{
  (void)state;
  check_str("h\xc3\xa9llo");                         /* 2 bytes */
  check_str("\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e"); /* 3 bytes */
  check_str("\xf0\x9f\x98\x80 smile");               /* 4 bytes */
  check_str("line\xe2\x80\xa8sep\xe2\x80\xa9para");  /* U+2028/9 stay raw */
  check_str("\xef\xbf\xbf\xf4\x8f\xbf\xbf");         /* U+FFFF, U+10FFFF */
}

/* Random strings of valid UTF-8 pieces and awkward ASCII (seeded, so a
 * failure reproduces). */
static void test_str_random(void **state)
{
  (void)state;
  static const char *const piece[] = {"a",
                                      "\"",
                                      "\\",
                                      "/",
                                      "\x01",
                                      "\x1f",
                                      "\n",
                                      "\t",
                                      "\x7f",
                                      " ",
                                      "\xc3\xa9",
                                      "\xe2\x82\xac",
                                      "\xf0\x9f\x98\x80",
                                      "0"};
  uint64_t x = 0x9e3779b97f4a7c15ull;
  char buf[256];
  for (int iter = 0; iter < 2000; iter++) {
    size_t n = 0;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    size_t pieces = (size_t)(x % 40);
    for (size_t i = 0; i < pieces; i++) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      const char *p = piece[x % (sizeof(piece) / sizeof(piece[0]))];
      size_t l = strlen(p);
      memcpy(buf + n, p, l);
      n += l;
    }
    buf[n] = '\0';
    check_str(buf);
  }
}

static void test_str_null(void **state)
{
  (void)state;
  char *got = jw_str(NULL);
  assert_dumps(json_null(), got);
  osr_free(got);
}

static void check_int(int64_t v)
{
  osr_jw_t w;
  size_t len;
  osr_jw_init(&w, 64);
  osr_jw_int(&w, v);
  char *got = osr_jw_release(&w, &len);
  assert_non_null(got);
  assert_dumps(json_integer((json_int_t)v), got);
  osr_free(got);
}

static void test_int(void **state)
{
  (void)state;
  check_int(0);
  check_int(INT64_MIN);
  check_int(INT64_MIN + 1);
  check_int(INT64_MAX);
  int64_t p = 1;
  for (int i = 0; i < 18; i++, p *= 10) {
    check_int(p - 1);
    check_int(p);
    check_int(p + 1);
    check_int(-p);
    check_int(-p - 1);
  }
}

static void test_bool(void **state)
{
  (void)state;
  osr_jw_t w;
  size_t len;
  osr_jw_init(&w, 64);
  osr_jw_lit(&w, "[");
  osr_jw_bool(&w, 1);
  osr_jw_lit(&w, ",");
  osr_jw_bool(&w, 0);
  osr_jw_lit(&w, ",");
  osr_jw_bool(&w, -7);
  osr_jw_lit(&w, "]");
  char *got = osr_jw_release(&w, &len);
  assert_non_null(got);
  assert_dumps(json_pack("[b,b,b]", 1, 0, -7), got);
  osr_free(got);
}

/* An object with nested structure, as callers write one (keys as literals
 * in insertion order), against json_pack of the same. */
static void test_object(void **state)
{
  (void)state;
  osr_jw_t w;
  size_t len;
  osr_jw_init(&w, 1024);
  osr_jw_lit(&w, "{\"s\":");
  osr_jw_str(&w, "x\"y");
  osr_jw_lit(&w, ",\"n\":");
  osr_jw_str(&w, NULL);
  osr_jw_lit(&w, ",\"o\":{\"i\":");
  osr_jw_int(&w, -42);
  osr_jw_lit(&w, ",\"b\":");
  osr_jw_bool(&w, 1);
  osr_jw_lit(&w, "},\"a\":[");
  osr_jw_int(&w, 1);
  osr_jw_lit(&w, ",");
  osr_jw_int(&w, 2);
  osr_jw_lit(&w, "],\"e\":[]}");
  char *got = osr_jw_release(&w, &len);
  assert_non_null(got);
  assert_int_equal(len, strlen(got));
  assert_dumps(json_pack("{s:s,s:s?,s:{s:I,s:b},s:[I,I],s:[]}", "s", "x\"y", "n", NULL, "o", "i",
                         (json_int_t)-42, "b", 1, "a", (json_int_t)1, (json_int_t)2, "e"),
               got);
  osr_free(got);
}

/* The cap counts the NUL added at release; one byte short fails, and the
 * failure is sticky (nothing later is written, release returns NULL). */
static void test_cap_sticky(void **state)
{
  (void)state;
  osr_jw_t w;
  size_t len = 99;
  osr_jw_init(&w, 6);
  osr_jw_str(&w, "abc"); /* 5 bytes + NUL: fits exactly */
  char *got = osr_jw_release(&w, &len);
  assert_non_null(got);
  assert_string_equal(got, "\"abc\"");
  assert_int_equal(len, 5);
  osr_free(got);

  osr_jw_init(&w, 5);
  osr_jw_str(&w, "abc"); /* the NUL does not fit */
  assert_null(osr_jw_release(&w, &len));

  osr_jw_init(&w, 4);
  osr_jw_str(&w, "abcdef");
  assert_int_not_equal(w.err, 0);
  osr_jw_lit(&w, "1");
  assert_null(osr_jw_release(&w, &len));
  /* EMPTY again: usable after release */
  osr_jw_lit(&w, "1");
  got = osr_jw_release(&w, &len);
  assert_non_null(got);
  assert_string_equal(got, "1");
  osr_free(got);

  osr_jw_init(&w, 64);
  osr_jw_lit(&w, "[1]");
  osr_jw_dispose(&w);
}

/* osr_jw_rfc3339 against gmtime_r + strftime for days across four
 * centuries (leap years, 1900 and 2100 rules) and every millisecond digit. */
static void test_rfc3339(void **state)
{
  (void)state;
  char got[32], want[32], date[24];
  for (int64_t day = 0; day < 146097 + 400; day += 7) {
    int64_t ms = day * 86400000 + (day * 7919 % 86400000);
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(want, sizeof(want), "%.19s.%03dZ", date, (int)(ms % 1000));
    osr_jw_rfc3339(ms, got);
    assert_string_equal(got, want);
  }
  osr_jw_rfc3339(-5, got);
  assert_string_equal(got, "1970-01-01T00:00:00.000Z");
  osr_jw_rfc3339(951782400999, got); /* 2000-02-29, a leap day of a century */
  assert_string_equal(got, "2000-02-29T00:00:00.999Z");
}

static void test_time(void **state)
{
  (void)state;
  osr_jw_t w;
  size_t len;
  osr_jw_init(&w, 128);
  osr_jw_lit(&w, "[");
  osr_jw_time(&w, 0);
  osr_jw_lit(&w, ",");
  osr_jw_time(&w, -1);
  osr_jw_lit(&w, ",");
  osr_jw_time(&w, 1700000000123);
  osr_jw_lit(&w, "]");
  char *got = osr_jw_release(&w, &len);
  assert_non_null(got);
  assert_string_equal(got, "[null,null,\"2023-11-14T22:13:20.123Z\"]");
  osr_free(got);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_str_ascii),  cmocka_unit_test(test_str_utf8),
      cmocka_unit_test(test_strn_nul),   cmocka_unit_test(test_str_random),
      cmocka_unit_test(test_str_null),   cmocka_unit_test(test_int),
      cmocka_unit_test(test_bool),       cmocka_unit_test(test_object),
      cmocka_unit_test(test_cap_sticky), cmocka_unit_test(test_rfc3339),
      cmocka_unit_test(test_time),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
