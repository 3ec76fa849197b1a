/* Unit tests for the per-thread block pool: reuse, bounds, thread exit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <string.h>

#include "util/blockpool.h"
#include "util/mem.h"

static void test_reuse_lifo(void **state)
{
  (void)state;
  char *a = osr_block_get(OSR_BLOCK_4K);
  char *b = osr_block_get(OSR_BLOCK_64K);
  assert_non_null(a);
  assert_non_null(b);
  memset(a, 1, osr_block_size(OSR_BLOCK_4K)); /* the whole size is usable */
  memset(b, 2, osr_block_size(OSR_BLOCK_64K));
  osr_block_put(OSR_BLOCK_4K, a);
  osr_block_put(OSR_BLOCK_64K, b);
  /* The most recently returned block comes back first (it is the one whose
   * pages are resident), and classes do not mix. */
  assert_ptr_equal(osr_block_get(OSR_BLOCK_64K), b);
  assert_ptr_equal(osr_block_get(OSR_BLOCK_4K), a);
  osr_block_put(OSR_BLOCK_4K, a);
  osr_block_put(OSR_BLOCK_64K, b);
  osr_block_put(OSR_BLOCK_4K, NULL); /* fine */
}

static void test_bounded(void **state)
{
  (void)state;
  enum { N = OSR_BLOCK_CACHE_MAX + 10 };
  static void *p[N];
  for (int i = 0; i < N; i++) {
    p[i] = osr_block_get(OSR_BLOCK_4K);
    assert_non_null(p[i]);
  }
  for (int i = 0; i < N; i++)
    osr_block_put(OSR_BLOCK_4K, p[i]); /* beyond the bound: freed (ASan: no leak) */
  /* All distinct blocks come back from the cache, at most the bound. */
  int cached = 0;
  for (int i = 0; i < N; i++) {
    void *q = osr_block_get(OSR_BLOCK_4K);
    for (int j = 0; j < N; j++) {
      if (q == p[j]) {
        cached++;
        break;
      }
    }
    p[i] = q;
  }
  assert_true(cached <= OSR_BLOCK_CACHE_MAX);
  assert_true(cached >= 1);
  for (int i = 0; i < N; i++)
    osr_block_put(OSR_BLOCK_4K, p[i]);
}

static void *thread_main(void *arg)
{
  (void)arg;
  for (int i = 0; i < 8; i++)
    osr_block_put(OSR_BLOCK_64K, osr_block_get(OSR_BLOCK_64K));
  osr_block_put(OSR_BLOCK_4K, osr_block_get(OSR_BLOCK_4K));
  return NULL; /* the thread's cache is freed at exit: LeakSanitizer checks */
}

static void test_thread_exit_frees(void **state)
{
  (void)state;
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, thread_main, NULL), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
}

/* A block may be resized like any allocation; it then leaves its class. */
static void test_realloc_and_free(void **state)
{
  (void)state;
  char *a = osr_block_get(OSR_BLOCK_4K);
  assert_non_null(a);
  char *b = osr_try_realloc(a, 3 * osr_block_size(OSR_BLOCK_4K));
  assert_non_null(b);
  osr_free(b);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reuse_lifo),
      cmocka_unit_test(test_bounded),
      cmocka_unit_test(test_thread_exit_frees),
      cmocka_unit_test(test_realloc_and_free),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
