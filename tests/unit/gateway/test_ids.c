/* Unit tests for sandbox ids (osr_sandbox_id_new, gw_util.c): the format
 * every consumer relies on (20 characters of [a-z0-9], a letter first), the
 * time prefix that makes later ids sort later, and the random part. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gateway/gw.h"

#define N 20000

static const char alphabet[] = "0123456789abcdefghijklmnopqrstuvwxyz";

static int64_t now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The time an id's first 8 characters carry, in unix ms. */
static int64_t id_time_ms(const char *id)
{
  int64_t v = id[0] - 'a';
  for (int i = 1; i < 8; i++)
    v = v * 36 + (int64_t)(strchr(alphabet, id[i]) - alphabet);
  return v + 1704067200000LL; /* 2024-01-01T00:00:00Z */
}

static int cmp_id(const void *a, const void *b)
{
  return strcmp((const char *)a, (const char *)b);
}

static void test_format(void **state)
{
  (void)state;
  char id[21];
  for (int k = 0; k < 1000; k++) {
    memset(id, 'X', sizeof(id));
    osr_sandbox_id_new(id);
    assert_int_equal(strlen(id), 20);
    assert_true(id[0] >= 'a' && id[0] <= 'z');
    assert_int_equal(strspn(id, alphabet), 20);
  }
}

/* The prefix is the creation time: within the clock reads around it, and
 * an id made 2 ms later sorts after the earlier one. */
static void test_time_order(void **state)
{
  (void)state;
  char a[21], b[21];
  int64_t t0 = now_ms();
  osr_sandbox_id_new(a);
  int64_t t1 = now_ms();
  assert_true(id_time_ms(a) >= t0 && id_time_ms(a) <= t1);
  for (int k = 0; k < 20; k++) {
    usleep(2000);
    osr_sandbox_id_new(b);
    assert_true(strcmp(a, b) < 0);
    assert_true(id_time_ms(b) > id_time_ms(a));
    memcpy(a, b, sizeof(a));
  }
}

/* N ids made as fast as possible (many share a millisecond): all distinct,
 * and every character of the alphabet appears at each random position. */
static void test_random_part(void **state)
{
  (void)state;
  char (*ids)[21] = calloc(N, sizeof(*ids));
  int seen[12][36];
  assert_non_null(ids);
  memset(seen, 0, sizeof(seen));
  for (int k = 0; k < N; k++) {
    osr_sandbox_id_new(ids[k]);
    for (int i = 8; i < 20; i++)
      seen[i - 8][strchr(alphabet, ids[k][i]) - alphabet]++;
  }
  qsort(ids, N, sizeof(*ids), cmp_id);
  for (int k = 1; k < N; k++)
    assert_true(strcmp(ids[k - 1], ids[k]) != 0);
  /* N / 36 = 555 expected per cell; a uniform draw falls under 400 with
   * probability far below 1e-9 per cell. */
  for (int i = 0; i < 12; i++)
    for (int c = 0; c < 36; c++)
      assert_true(seen[i][c] > 400);
  free(ids);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_format),
      cmocka_unit_test(test_time_order),
      cmocka_unit_test(test_random_part),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
