/* Unit tests for osr_buf_t: invariants, caps, compaction, allocation failure. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "util/buf.h"
#include "util/mem.h"

static void check_invariants(const osr_buf_t *b)
{
  assert_true(b->off + b->len <= b->cap);
  assert_true(b->cap <= b->max);
  assert_true((b->base == NULL) == (b->cap == 0));
  if (b->len == 0)
    assert_int_equal(b->off, 0);
}

static void test_append_consume(void **state)
{
  (void)state;
  osr_buf_t b;
  osr_buf_init(&b, 1 << 20);
  check_invariants(&b);
  assert_int_equal(osr_buf_append(&b, "hello ", 6), 0);
  assert_int_equal(osr_buf_appendf(&b, "%s %d", "world", 42), 0);
  check_invariants(&b);
  assert_int_equal(b.len, 14);
  assert_memory_equal(osr_buf_data(&b), "hello world 42", 14);
  osr_buf_consume(&b, 6);
  check_invariants(&b);
  assert_memory_equal(osr_buf_data(&b), "world 42", 8);
  osr_buf_consume(&b, 8);
  check_invariants(&b); /* empty rewinds */
  osr_buf_dispose(&b);
  check_invariants(&b);
}

static void test_cap_enforced(void **state)
{
  (void)state;
  osr_buf_t b;
  char big[5000];
  memset(big, 'x', sizeof(big));
  osr_buf_init(&b, 4096);
  assert_int_equal(osr_buf_append(&b, big, 4096), 0);
  assert_int_equal(osr_buf_append(&b, "y", 1), OSR_ETOOLARGE);
  assert_int_equal(b.len, 4096); /* unchanged on error */
  osr_buf_consume(&b, 100);
  /* Consumed space is reused by compaction, still within the cap. */
  assert_int_equal(osr_buf_append(&b, big, 100), 0);
  check_invariants(&b);
  assert_int_equal(osr_buf_append(&b, big, 1), OSR_ETOOLARGE);
  osr_buf_dispose(&b);

  osr_buf_init(&b, 10);
  assert_int_equal(osr_buf_append(&b, big, 11), OSR_ETOOLARGE);
  assert_int_equal(osr_buf_append(&b, big, 10), 0);
  assert_int_equal(b.cap, 10);
  osr_buf_dispose(&b);
}

static void test_reserve_commit_and_growth(void **state)
{
  (void)state;
  osr_buf_t b;
  osr_iovec_t tail;
  osr_buf_init(&b, 1 << 24);
  size_t total = 0;
  for (int i = 0; i < 100; i++) {
    assert_int_equal(osr_buf_reserve(&b, 10000, &tail), 0);
    assert_true(tail.len >= 10000);
    memset(tail.base, i & 0xff, 10000);
    osr_buf_commit(&b, 10000);
    total += 10000;
    check_invariants(&b);
  }
  assert_int_equal(b.len, total);
  for (int i = 0; i < 100; i++)
    assert_int_equal((unsigned char)osr_buf_data(&b)[i * 10000 + 9999], i & 0xff);
  osr_buf_dispose(&b);
}

static void test_oom_leaves_buffer_intact(void **state)
{
  (void)state;
  osr_buf_t b;
  osr_buf_init(&b, 1 << 20);
  assert_int_equal(osr_buf_append(&b, "abc", 3), 0);
  osr_mem_fail_after(1);
  char big[8192] = {0};
  assert_int_equal(osr_buf_append(&b, big, sizeof(big)), OSR_ENOMEM);
  assert_int_equal(b.len, 3);
  assert_memory_equal(osr_buf_data(&b), "abc", 3);
  check_invariants(&b);
  assert_int_equal(osr_buf_append(&b, big, sizeof(big)), 0);
  osr_buf_dispose(&b);
}

static void test_release_and_swap(void **state)
{
  (void)state;
  osr_buf_t a, c;
  size_t len;
  osr_buf_init(&a, 100);
  osr_buf_init(&c, 200);
  assert_int_equal(osr_buf_append(&a, "xxdata", 6), 0);
  osr_buf_consume(&a, 2);
  osr_buf_swap(&a, &c);
  assert_int_equal(a.len, 0);
  assert_int_equal(c.len, 4);
  assert_int_equal(c.max, 100);
  char *p = osr_buf_release(&c, &len);
  assert_int_equal(len, 4);
  assert_memory_equal(p, "data", 4);
  osr_free(p);
  check_invariants(&c);
  osr_buf_dispose(&a);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_append_consume),
      cmocka_unit_test(test_cap_enforced),
      cmocka_unit_test(test_reserve_commit_and_growth),
      cmocka_unit_test(test_oom_leaves_buffer_intact),
      cmocka_unit_test(test_release_and_swap),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
