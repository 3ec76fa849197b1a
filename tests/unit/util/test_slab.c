/* Unit tests for the page-backed slab: zeroed objects, reuse, pages mapped
 * and unmapped as objects come and go, one empty page kept. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "util/slab.h"

#define OBJ      120 /* rounded to 128: 31 per page after the 64-byte header */
#define PER_PAGE 31

static void test_zeroed_distinct_reused(void **state)
{
  (void)state;
  osr_slab_t s = {.size = OBJ};
  char *a = osr_slab_alloc(&s);
  char *b = osr_slab_alloc(&s);
  assert_non_null(a);
  assert_non_null(b);
  assert_ptr_not_equal(a, b);
  for (size_t i = 0; i < OBJ; i++)
    assert_int_equal(a[i], 0);
  assert_true((uintptr_t)a % 16 == 0);
  assert_true(b >= a + 128 || a >= b + 128); /* no overlap */
  memset(a, 0x5a, OBJ);
  osr_slab_free(&s, a);
  char *c = osr_slab_alloc(&s); /* the freed object, zeroed again */
  assert_ptr_equal(c, a);
  for (size_t i = 0; i < OBJ; i++)
    assert_int_equal(c[i], 0);
  osr_slab_free(&s, c);
  osr_slab_free(&s, b);
  osr_slab_free(&s, NULL);
  assert_int_equal(s.npages, 1); /* the empty page is kept as the spare */
}

static void test_pages_follow_objects(void **state)
{
  (void)state;
  enum { N = PER_PAGE * 10 };
  static char *o[N];
  osr_slab_t s = {.size = OBJ};
  for (size_t i = 0; i < N; i++) {
    o[i] = osr_slab_alloc(&s);
    assert_non_null(o[i]);
    memset(o[i], (int)(i & 0xff), OBJ);
  }
  assert_int_equal(s.npages, 10); /* full pages, nothing wasted */
  /* Every object kept its bytes: none overlaps another. */
  for (size_t i = 0; i < N; i++)
    for (size_t j = 0; j < OBJ; j++)
      assert_int_equal((unsigned char)o[i][j], i & 0xff);
  /* Free one object per page: every page is partly used, all stay. */
  for (size_t i = 0; i < N; i += PER_PAGE)
    osr_slab_free(&s, o[i]);
  assert_int_equal(s.npages, 10);
  /* New objects fill those holes before any page is mapped. */
  for (size_t i = 0; i < N; i += PER_PAGE) {
    o[i] = osr_slab_alloc(&s);
    assert_non_null(o[i]);
  }
  assert_int_equal(s.npages, 10);
  /* Free everything: pages are unmapped as they empty, but one. */
  for (size_t i = 0; i < N; i++)
    osr_slab_free(&s, o[i]);
  assert_int_equal(s.npages, 1);
  /* The spare serves the next object without a new mapping. */
  char *x = osr_slab_alloc(&s);
  assert_non_null(x);
  assert_int_equal(s.npages, 1);
  osr_slab_free(&s, x);
  assert_int_equal(s.npages, 1);
}

static void test_spare_pages_bound_the_churn(void **state)
{
  (void)state;
  enum { N = PER_PAGE * 6 };
  static char *o[N];
  osr_slab_t s = {.size = OBJ, .max_spare = 3};
  for (int round = 0; round < 3; round++) {
    for (size_t i = 0; i < N; i++)
      o[i] = osr_slab_alloc(&s);
    assert_int_equal(s.npages, 6);
    for (size_t i = 0; i < N; i++)
      osr_slab_free(&s, o[i]);
    /* Three empty pages stay mapped, the rest is unmapped. */
    assert_int_equal(s.npages, 3);
    assert_int_equal(s.nspare, 3);
  }
  /* A swing within the spares maps nothing new. */
  for (size_t i = 0; i < PER_PAGE * 3; i++)
    o[i] = osr_slab_alloc(&s);
  assert_int_equal(s.npages, 3);
  assert_int_equal(s.nspare, 0);
  for (size_t i = 0; i < PER_PAGE * 3; i++)
    osr_slab_free(&s, o[i]);
  assert_int_equal(s.npages, 3);
}

static void test_bad_sizes(void **state)
{
  (void)state;
  osr_slab_t z = {.size = 0};
  assert_null(osr_slab_alloc(&z));
  osr_slab_t big = {.size = 4096};
  assert_null(osr_slab_alloc(&big));
  assert_int_equal(big.npages, 0);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_zeroed_distinct_reused),
      cmocka_unit_test(test_pages_follow_objects),
      cmocka_unit_test(test_spare_pages_bound_the_churn),
      cmocka_unit_test(test_bad_sizes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
