/* Unit tests for the streaming multipart/form-data parser: split points,
 * pauses, delimiter look-alikes inside data, malformed input, caps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "agent/multipart.c"

typedef struct sink_s {
  char names[4][64];
  char data[4][256];
  size_t len[4];
  int parts, ends;
  int pause_every; /* pause after every n-th callback (0: never) */
  int ncb;
} sink_t;

static int maybe_pause(sink_t *s)
{
  s->ncb++;
  return s->pause_every != 0 && s->ncb % s->pause_every == 0;
}

static int on_part(osr_mp_t *mp, const char *name, const char *filename)
{
  sink_t *s = mp->data;
  (void)name;
  snprintf(s->names[s->parts], sizeof(s->names[0]), "%s", filename);
  s->parts++;
  return maybe_pause(s);
}

static int on_data(osr_mp_t *mp, const char *d, size_t n)
{
  sink_t *s = mp->data;
  assert_true(s->parts > 0);
  assert_true(n <= OSR_MP_MAX_SPAN);
  memcpy(s->data[s->parts - 1] + s->len[s->parts - 1], d, n);
  s->len[s->parts - 1] += n;
  return maybe_pause(s);
}

static int on_end(osr_mp_t *mp)
{
  sink_t *s = mp->data;
  s->ends++;
  return maybe_pause(s);
}

static const osr_mp_events_t ev = {on_part, on_data, on_end};

static const char body[] =
    "preamble\r\n"
    "--B0und\r\n"
    "Content-Disposition: form-data; name=\"file\"; filename=\"/home/user/a \\\"q\\\".txt\"\r\n"
    "Content-Type: text/plain\r\n"
    "\r\n"
    "one\r\n--B0un\r\n--B0\r\r\n\r\n-"
    "\r\n--B0und\r\n"
    "Content-Disposition: form-data; name=\"file\"; filename=\"b.bin\"\r\n"
    "\r\n"
    "\r\n"
    "\r\n--B0und--\r\n"
    "epilogue";

static void run(size_t step, int pause_every)
{
  osr_mp_t mp;
  sink_t s;
  memset(&s, 0, sizeof(s));
  s.pause_every = pause_every;
  static const char ct[] = "multipart/form-data; charset=utf-8; boundary=\"B0und\"";
  assert_int_equal(osr_mp_init(&mp, ct, sizeof(ct) - 1, &ev, &s), 0);
  size_t n = sizeof(body) - 1, off = 0;
  int guard = 0;
  while (off < n) {
    size_t len = n - off < step ? n - off : step;
    long used = osr_mp_feed(&mp, body + off, len);
    assert_true(used >= 0 && (size_t)used <= len);
    if (pause_every == 0)
      assert_int_equal((size_t)used, len);
    off += (size_t)used;
    assert_true(++guard < 100000);
  }
  assert_true(mp.done);
  assert_int_equal(s.parts, 2);
  assert_int_equal(s.ends, 2);
  assert_string_equal(s.names[0], "/home/user/a \"q\".txt");
  assert_string_equal(s.names[1], "b.bin");
  static const char d0[] = "one\r\n--B0un\r\n--B0\r\r\n\r\n-";
  assert_int_equal(s.len[0], sizeof(d0) - 1);
  assert_memory_equal(s.data[0], d0, sizeof(d0) - 1);
  assert_int_equal(s.len[1], 2);
  assert_memory_equal(s.data[1], "\r\n", 2);
}

static void test_all_splits(void **state)
{
  (void)state;
  for (size_t step = 1; step <= sizeof(body); step++) {
    run(step, 0);
    run(step, 1);
    run(step, 3);
  }
}

static void test_bad(void **state)
{
  (void)state;
  osr_mp_t mp;
  sink_t s;
  memset(&s, 0, sizeof(s));
  assert_int_equal(osr_mp_init(&mp, "text/plain", 10, &ev, &s), OSR_EINVAL);
  assert_int_equal(osr_mp_init(&mp, "multipart/form-data", 19, &ev, &s), OSR_EINVAL);
  assert_int_equal(osr_mp_init(&mp, "multipart/form-data; boundary=", 30, &ev, &s), OSR_EINVAL);
  char longb[200];
  int n = snprintf(longb, sizeof(longb), "multipart/form-data; boundary=%0100d", 1);
  assert_int_equal(osr_mp_init(&mp, longb, (size_t)n, &ev, &s), OSR_EINVAL);
  /* Garbage after a delimiter. */
  assert_int_equal(osr_mp_init(&mp, "multipart/form-data; boundary=x", 31, &ev, &s), 0);
  assert_int_equal(osr_mp_feed(&mp, "--xZ", 4), OSR_EHTTP);
  /* A header block over the cap. */
  assert_int_equal(osr_mp_init(&mp, "multipart/form-data; boundary=x", 31, &ev, &s), 0);
  assert_int_equal(osr_mp_feed(&mp, "--x\r\n", 5), 5);
  static char hdr[OSR_MP_MAX_HEADER + 10];
  memset(hdr, 'a', sizeof(hdr));
  assert_int_equal(osr_mp_feed(&mp, hdr, sizeof(hdr)), OSR_ETOOLARGE);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_splits),
      cmocka_unit_test(test_bad),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
