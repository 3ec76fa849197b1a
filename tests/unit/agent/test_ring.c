/* Unit tests for the process output ring: offsets, eviction, stream tags,
 * wrap-around, room for the slowest reader. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "agent/ring.c"

/* Read everything from `off` into out (tags into kinds); returns bytes. */
static size_t drain(const osr_ring_t *r, uint64_t off, char *out, int *kinds, size_t max)
{
  size_t n = 0;
  for (;;) {
    osr_iovec_t iov[2];
    int kind = 0;
    long got = osr_ring_peek(r, off, max, &kind, iov);
    assert_true(got >= 0);
    if (got == 0)
      return n;
    assert_int_equal((size_t)got, iov[0].len + iov[1].len);
    memcpy(out + n, iov[0].base, iov[0].len);
    if (iov[1].len > 0)
      memcpy(out + n + iov[0].len, iov[1].base, iov[1].len);
    for (long i = 0; i < got; i++)
      kinds[n + (size_t)i] = kind;
    n += (size_t)got;
    off += (uint64_t)got;
  }
}

static void test_basic_tags(void **state)
{
  (void)state;
  osr_ring_t r;
  osr_ring_init(&r, 64, 8);
  osr_ring_append(&r, 1, "out1", 4);
  osr_ring_append(&r, 1, "out2", 4);
  osr_ring_append(&r, 2, "err", 3);
  osr_ring_append(&r, 1, "o", 1);
  assert_int_equal(r.start, 0);
  assert_int_equal(r.end, 12);
  char buf[64];
  int kinds[64];
  /* A peek never crosses a stream switch. */
  osr_iovec_t iov[2];
  int kind;
  assert_int_equal(osr_ring_peek(&r, 0, 100, &kind, iov), 8);
  assert_int_equal(kind, 1);
  assert_int_equal(osr_ring_peek(&r, 8, 100, &kind, iov), 3);
  assert_int_equal(kind, 2);
  assert_int_equal(osr_ring_peek(&r, 9, 1, &kind, iov), 1);
  assert_int_equal(drain(&r, 0, buf, kinds, 5), 12);
  assert_memory_equal(buf, "out1out2erro", 12);
  assert_int_equal(kinds[7], 1);
  assert_int_equal(kinds[8], 2);
  assert_int_equal(kinds[11], 1);
  assert_int_equal(osr_ring_peek(&r, 13, 1, &kind, iov), -1);
  assert_int_equal(osr_ring_peek(&r, 12, 1, &kind, iov), 0);
  osr_ring_dispose(&r);
}

static void test_eviction_and_wrap(void **state)
{
  (void)state;
  osr_ring_t r;
  osr_ring_init(&r, 10, 8);
  char big[100];
  for (int i = 0; i < 100; i++)
    big[i] = (char)('a' + i % 26);
  /* Byte by byte past the cap: offsets keep counting, the newest 10 stay. */
  for (int i = 0; i < 37; i++)
    osr_ring_append(&r, i % 3 == 0 ? 2 : 1, big + i, 1);
  assert_int_equal(r.end, 37);
  assert_int_equal(r.start, 27);
  osr_iovec_t iov[2];
  int kind;
  assert_int_equal(osr_ring_peek(&r, 26, 1, &kind, iov), -1);
  char out[16];
  int kinds[16];
  assert_int_equal(drain(&r, 27, out, kinds, 100), 10);
  assert_memory_equal(out, big + 27, 10);
  for (int i = 0; i < 10; i++)
    assert_int_equal(kinds[i], (27 + i) % 3 == 0 ? 2 : 1);
  /* One append larger than the ring keeps only its tail. */
  osr_ring_append(&r, 1, big, 25);
  assert_int_equal(r.end, 62);
  assert_int_equal(r.start, 52);
  assert_int_equal(drain(&r, 52, out, kinds, 3), 10);
  assert_memory_equal(out, big + 15, 10);
  osr_ring_dispose(&r);
}

static void test_segment_cap(void **state)
{
  (void)state;
  osr_ring_t r;
  osr_ring_init(&r, 1000, 4);
  /* Alternating streams: the segment table (4) fills before the bytes. */
  for (int i = 0; i < 20; i++)
    osr_ring_append(&r, 1 + i % 2, "xx", 2);
  assert_int_equal(r.end, 40);
  assert_true(r.start >= 32); /* at most 4 segments of 2 bytes kept */
  char out[64];
  int kinds[64];
  size_t n = drain(&r, r.start, out, kinds, 100);
  assert_int_equal(n, (size_t)(r.end - r.start));
  assert_int_equal(kinds[n - 1], 2);
  osr_ring_dispose(&r);
}

static void test_room(void **state)
{
  (void)state;
  osr_ring_t r;
  osr_ring_init(&r, 100, 8);
  assert_int_equal(osr_ring_room(&r, 0), 100);
  osr_ring_append(&r, 1, "0123456789", 10);
  assert_int_equal(osr_ring_room(&r, 0), 90);
  assert_int_equal(osr_ring_room(&r, 10), 100);
  assert_int_equal(osr_ring_room(&r, 5), 95);
  osr_ring_dispose(&r);
}

/* In-place appends (a read straight into the ring) keep offsets, tags and
 * eviction as osr_ring_append does, and never run past the wrap. */
static void test_tail_commit(void **state)
{
  (void)state;
  osr_ring_t r, ref;
  osr_ring_init(&r, 16, 4);
  osr_ring_init(&ref, 16, 4);
  const char *text = "abcdefghijklmnopqrstuvwxyz0123456789";
  size_t off = 0;
  int kind = 1;
  while (off < strlen(text)) {
    size_t len = 0;
    char *t = osr_ring_tail(&r, &len);
    assert_true(len >= 1 && len <= 16);
    assert_true(t + len == r.buf + r.cap); /* up to the wrap, no further */
    size_t n = len < 5 ? len : 5;
    if (off + n > strlen(text))
      n = strlen(text) - off;
    memcpy(t, text + off, n);
    osr_ring_commit(&r, kind, n);
    osr_ring_append(&ref, kind, text + off, n);
    off += n;
    kind = kind == 1 ? 2 : 1;
    assert_int_equal(r.start, ref.start);
    assert_int_equal(r.end, ref.end);
  }
  char a[64], b[64];
  int ka[64], kb[64];
  size_t na = drain(&r, r.start, a, ka, 64), nb = drain(&ref, ref.start, b, kb, 64);
  assert_int_equal(na, nb);
  assert_memory_equal(a, b, na);
  assert_memory_equal(ka, kb, na * sizeof(int));
  /* Nothing past the tail's length, nothing for 0. */
  size_t len = 0;
  (void)osr_ring_tail(&r, &len);
  uint64_t end = r.end;
  osr_ring_commit(&r, 1, len + 1);
  osr_ring_commit(&r, 1, 0);
  assert_int_equal(r.end, end);
  osr_ring_dispose(&r);
  osr_ring_dispose(&ref);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_basic_tags),
      cmocka_unit_test(test_eviction_and_wrap),
      cmocka_unit_test(test_segment_cap),
      cmocka_unit_test(test_room),
      cmocka_unit_test(test_tail_commit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
