/* Unit tests for the Connect envelope parser, error codes and base64. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "agent/connect.c"
#include "util/mem.h"

static size_t frame(uint8_t *out, uint8_t flags, const char *msg)
{
  size_t n = strlen(msg);
  osr_cx_frame_header(out, flags, (uint32_t)n);
  memcpy(out + 5, msg, n);
  return n + 5;
}

static void test_whole_and_split(void **state)
{
  (void)state;
  uint8_t buf[256];
  size_t n = frame(buf, 0, "{\"a\":1}");
  n += frame(buf + n, OSR_CX_FLAG_END_STREAM, "{}");
  /* Every split point, byte by byte feeding included, gives the same two
   * messages. */
  for (size_t step = 1; step <= n; step++) {
    osr_cx_parser_t p;
    osr_cx_parser_init(&p, 64);
    int got = 0;
    size_t off = 0;
    while (off < n) {
      size_t len = n - off < step ? n - off : step;
      size_t used = 0;
      osr_cx_msg_t m;
      int rv = osr_cx_parse(&p, buf + off, len, &used, &m);
      assert_true(rv >= 0);
      assert_true(used <= len);
      off += used;
      if (rv == 1) {
        if (got == 0) {
          assert_int_equal(m.flags, 0);
          assert_int_equal(m.len, 7);
          assert_memory_equal(m.data, "{\"a\":1}", 7);
        } else {
          assert_int_equal(m.flags, OSR_CX_FLAG_END_STREAM);
          assert_int_equal(m.len, 2);
          assert_memory_equal(m.data, "{}", 2);
        }
        got++;
      } else {
        assert_int_equal(used, len); /* 0: all consumed */
      }
    }
    assert_int_equal(got, 2);
    osr_cx_parser_dispose(&p);
  }
}

static void test_limits_and_flags(void **state)
{
  (void)state;
  uint8_t hdr[5];
  osr_cx_parser_t p;
  osr_cx_msg_t m;
  size_t used;
  /* Over the cap: refused from the header, before any allocation. */
  osr_cx_parser_init(&p, 16);
  osr_cx_frame_header(hdr, 0, 17);
  assert_int_equal(osr_cx_parse(&p, hdr, 5, &used, &m), OSR_ETOOLARGE);
  osr_cx_parser_dispose(&p);
  osr_cx_parser_init(&p, 16);
  osr_cx_frame_header(hdr, 0, 0xffffffffu);
  assert_int_equal(osr_cx_parse(&p, hdr, 5, &used, &m), OSR_ETOOLARGE);
  osr_cx_parser_dispose(&p);
  /* Compressed or unknown flags: protocol error. */
  for (unsigned f = 1; f < 256; f++) {
    if (f == OSR_CX_FLAG_END_STREAM)
      continue;
    osr_cx_parser_init(&p, 16);
    osr_cx_frame_header(hdr, (uint8_t)f, 1);
    assert_int_equal(osr_cx_parse(&p, hdr, 5, &used, &m), OSR_EPROTO);
    osr_cx_parser_dispose(&p);
  }
  /* Empty message. */
  osr_cx_parser_init(&p, 16);
  osr_cx_frame_header(hdr, OSR_CX_FLAG_END_STREAM, 0);
  assert_int_equal(osr_cx_parse(&p, hdr, 5, &used, &m), 1);
  assert_int_equal(m.len, 0);
  assert_true(osr_cx_parser_is_idle(&p) == 0);
  assert_int_equal(osr_cx_parse(&p, "", 0, &used, &m), 0);
  assert_true(osr_cx_parser_is_idle(&p));
  osr_cx_parser_dispose(&p);
}

static void test_alloc_failure(void **state)
{
  (void)state;
  uint8_t buf[64];
  size_t n = frame(buf, 0, "0123456789");
  osr_cx_parser_t p;
  osr_cx_msg_t m;
  size_t used;
  osr_cx_parser_init(&p, 64);
  osr_mem_fail_after(1);
  int rv = osr_cx_parse(&p, buf, n, &used, &m);
  osr_mem_fail_after(0);
  assert_int_equal(rv, OSR_ENOMEM);
  osr_cx_parser_dispose(&p);
}

static void test_codes(void **state)
{
  (void)state;
  assert_string_equal(osr_cx_code_name(OSR_CX_NOT_FOUND), "not_found");
  assert_int_equal(osr_cx_code_http_status(OSR_CX_NOT_FOUND), 404);
  assert_int_equal(osr_cx_code_http_status(OSR_CX_UNAUTHENTICATED), 401);
  assert_int_equal(osr_cx_code_http_status(OSR_CX_ALREADY_EXISTS), 409);
  assert_int_equal(osr_cx_code_http_status(OSR_CX_DEADLINE_EXCEEDED), 504);
  assert_string_equal(osr_cx_code_name((osr_cx_code_t)99), "unknown");
  assert_int_equal(osr_cx_code_from_errno(UV_ENOENT), OSR_CX_NOT_FOUND);
  assert_int_equal(osr_cx_code_from_errno(UV_EEXIST), OSR_CX_ALREADY_EXISTS);
  assert_int_equal(osr_cx_code_from_errno(UV_EIO), OSR_CX_INTERNAL);
}

static void test_base64(void **state)
{
  (void)state;
  char enc[64];
  uint8_t dec[64];
  static const char *vec[][2] = {{"", ""},
                                 {"f", "Zg=="},
                                 {"fo", "Zm8="},
                                 {"foo", "Zm9v"},
                                 {"foob", "Zm9vYg=="},
                                 {"fooba", "Zm9vYmE="},
                                 {"foobar", "Zm9vYmFy"}};
  for (size_t i = 0; i < OSR_ARRAY_SIZE(vec); i++) {
    size_t n = osr_b64_encode(vec[i][0], strlen(vec[i][0]), enc, 1);
    assert_int_equal(n, strlen(vec[i][1]));
    assert_memory_equal(enc, vec[i][1], n);
    long d = osr_b64_decode(vec[i][1], strlen(vec[i][1]), dec);
    assert_int_equal(d, (long)strlen(vec[i][0]));
    assert_memory_equal(dec, vec[i][0], (size_t)d);
  }
  /* Unpadded and URL-safe input are accepted (proto3 JSON). */
  assert_int_equal(osr_b64_decode("Zg", 2, dec), 1);
  assert_int_equal(osr_b64_decode("-_8", 3, dec), 2);
  assert_int_equal(dec[0], 0xfb);
  assert_int_equal(osr_b64_decode("Z", 1, dec), OSR_EINVAL);
  assert_int_equal(osr_b64_decode("Zm9v!", 5, dec), OSR_EINVAL);
  /* Round trip of all byte values. */
  uint8_t all[256], back[256];
  char e[400];
  for (int i = 0; i < 256; i++)
    all[i] = (uint8_t)i;
  size_t n = osr_b64_encode(all, 256, e, 0);
  assert_int_equal(osr_b64_decode(e, n, back), 256);
  assert_memory_equal(all, back, 256);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_whole_and_split), cmocka_unit_test(test_limits_and_flags),
      cmocka_unit_test(test_alloc_failure),   cmocka_unit_test(test_codes),
      cmocka_unit_test(test_base64),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
