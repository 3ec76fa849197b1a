/* Unit tests for the circuit breaker: every transition of the state machine
 * in breaker.h, driven by an explicit clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "gateway/breaker.h"

static osr_breaker_config_t cfg(uint32_t window, uint32_t min_req, double ratio, uint32_t consec,
                                uint64_t open_ms, uint64_t max_open_ms, uint32_t probes)
{
  osr_breaker_config_t c = {window, min_req, ratio, consec, open_ms, max_open_ms, probes};
  return c;
}

static void test_defaults(void **state)
{
  (void)state;
  osr_breaker_t b;
  osr_breaker_init(&b, NULL);
  assert_int_equal(b.cfg.window, 20);
  assert_int_equal(b.cfg.min_requests, 10);
  assert_true(b.cfg.failure_ratio == 0.5);
  assert_int_equal(b.cfg.consecutive_failures, 5);
  assert_int_equal(b.cfg.open_ms, 5000);
  assert_int_equal(b.cfg.max_open_ms, 60000);
  assert_int_equal(b.cfg.half_open_probes, 1);
  assert_int_equal(osr_breaker_state(&b, 0), OSR_BREAKER_CLOSED);
  assert_true(osr_breaker_allow(&b, 0));
  assert_string_equal(osr_breaker_state_name(OSR_BREAKER_HALF_OPEN), "half_open");
  /* A window larger than the ring is clamped. */
  osr_breaker_config_t c = cfg(100000, 0, 0, 0, 0, 0, 0);
  osr_breaker_init(&b, &c);
  assert_int_equal(b.cfg.window, OSR_BREAKER_WINDOW_MAX);
}

static void test_window_ratio_trips(void **state)
{
  (void)state;
  /* consecutive set high so only the ratio can trip. */
  osr_breaker_config_t c = cfg(10, 10, 0.5, 1000, 1000, 8000, 1);
  osr_breaker_t b;
  osr_breaker_init(&b, &c);
  int64_t t = 0;
  /* Alternate fail/ok: 9 outcomes (5 failures) are below min_requests. */
  for (int i = 0; i < 9; i++)
    osr_breaker_record(&b, i % 2 == 1, t);
  assert_int_equal(osr_breaker_state(&b, t), OSR_BREAKER_CLOSED);
  /* The 10th (a failure, 6/10 >= 0.5) trips it. */
  osr_breaker_record(&b, 0, t);
  assert_int_equal(osr_breaker_state(&b, t), OSR_BREAKER_OPEN);
  assert_int_equal(b.times_opened, 1);
  assert_false(osr_breaker_allow(&b, t + 999));
  assert_false(osr_breaker_peek(&b, t + 999));
  assert_int_equal(osr_breaker_open_until(&b, t + 10), 1000);
}

static void test_window_slides(void **state)
{
  (void)state;
  osr_breaker_config_t c = cfg(10, 10, 0.5, 1000, 1000, 8000, 1);
  osr_breaker_t b;
  osr_breaker_init(&b, &c);
  /* 4 failures, then many successes: the failures slide out of the window,
   * so 4 more failures later still stay below 5/10. */
  for (int i = 0; i < 4; i++)
    osr_breaker_record(&b, 0, 0);
  for (int i = 0; i < 20; i++)
    osr_breaker_record(&b, 1, 0);
  assert_int_equal(b.ring_failures, 0);
  for (int i = 0; i < 4; i++)
    osr_breaker_record(&b, 0, 0);
  assert_int_equal(osr_breaker_state(&b, 0), OSR_BREAKER_CLOSED);
  assert_int_equal(b.ring_failures, 4);
  osr_breaker_record(&b, 0, 0); /* 5/10 */
  assert_int_equal(osr_breaker_state(&b, 0), OSR_BREAKER_OPEN);
}

static void test_consecutive_trips(void **state)
{
  (void)state;
  osr_breaker_config_t c = cfg(20, 20, 0.9, 3, 1000, 8000, 1);
  osr_breaker_t b;
  osr_breaker_init(&b, &c);
  osr_breaker_record(&b, 0, 0);
  osr_breaker_record(&b, 0, 0);
  osr_breaker_record(&b, 1, 0); /* the run is broken */
  osr_breaker_record(&b, 0, 0);
  osr_breaker_record(&b, 0, 0);
  assert_int_equal(osr_breaker_state(&b, 0), OSR_BREAKER_CLOSED);
  osr_breaker_record(&b, 0, 0);
  assert_int_equal(osr_breaker_state(&b, 0), OSR_BREAKER_OPEN);
}

static void trip(osr_breaker_t *b, int64_t t)
{
  for (uint32_t i = 0; i < b->cfg.consecutive_failures; i++)
    osr_breaker_record(b, 0, t);
  assert_int_equal(osr_breaker_state(b, t), OSR_BREAKER_OPEN);
}

static void test_half_open_success_closes(void **state)
{
  (void)state;
  osr_breaker_config_t c = cfg(10, 10, 0.5, 2, 1000, 8000, 1);
  osr_breaker_t b;
  osr_breaker_init(&b, &c);
  trip(&b, 100);
  assert_int_equal(osr_breaker_state(&b, 1099), OSR_BREAKER_OPEN);
  assert_int_equal(osr_breaker_state(&b, 1100), OSR_BREAKER_HALF_OPEN);
  assert_true(osr_breaker_peek(&b, 1100));
  assert_true(osr_breaker_allow(&b, 1100)); /* reserves the one probe */
  assert_false(osr_breaker_allow(&b, 1101));
  assert_false(osr_breaker_peek(&b, 1101));
  osr_breaker_record(&b, 1, 1150);
  assert_int_equal(osr_breaker_state(&b, 1150), OSR_BREAKER_CLOSED);
  assert_int_equal(b.ring_len, 0); /* window cleared */
  assert_int_equal(b.current_open_ms, 1000);
  /* A single failure right after closing does not re-trip. */
  osr_breaker_record(&b, 0, 1200);
  assert_int_equal(osr_breaker_state(&b, 1200), OSR_BREAKER_CLOSED);
}

static void test_half_open_failure_doubles_capped(void **state)
{
  (void)state;
  osr_breaker_config_t c = cfg(10, 10, 0.5, 2, 1000, 3000, 1);
  osr_breaker_t b;
  osr_breaker_init(&b, &c);
  trip(&b, 0);
  int64_t t = 1000;
  assert_true(osr_breaker_allow(&b, t));
  osr_breaker_record(&b, 0, t); /* probe failed: open for 2000 */
  assert_int_equal(osr_breaker_state(&b, t), OSR_BREAKER_OPEN);
  assert_int_equal(b.current_open_ms, 2000);
  assert_int_equal(osr_breaker_state(&b, t + 1999), OSR_BREAKER_OPEN);
  t += 2000;
  assert_true(osr_breaker_allow(&b, t));
  osr_breaker_record(&b, 0, t); /* 4000 capped at 3000 */
  assert_int_equal(b.current_open_ms, 3000);
  t += 3000;
  assert_true(osr_breaker_allow(&b, t));
  osr_breaker_record(&b, 0, t);
  assert_int_equal(b.current_open_ms, 3000);
  assert_int_equal(b.times_opened, 4);
  /* Recovery resets the open time to the base. */
  t += 3000;
  assert_true(osr_breaker_allow(&b, t));
  osr_breaker_record(&b, 1, t);
  assert_int_equal(osr_breaker_state(&b, t), OSR_BREAKER_CLOSED);
  trip(&b, t);
  assert_int_equal(b.current_open_ms, 1000);
}

static void test_probes_limit(void **state)
{
  (void)state;
  osr_breaker_config_t c = cfg(10, 10, 0.5, 1, 100, 1000, 3);
  osr_breaker_t b;
  osr_breaker_init(&b, &c);
  trip(&b, 0);
  assert_true(osr_breaker_allow(&b, 100));
  assert_true(osr_breaker_allow(&b, 100));
  assert_true(osr_breaker_allow(&b, 100));
  assert_false(osr_breaker_allow(&b, 100)); /* 3 probes in flight */
  osr_breaker_record(&b, 1, 110);
  /* One succeeded, two in flight: still no room (3 admitted in total). */
  assert_int_equal(osr_breaker_state(&b, 110), OSR_BREAKER_HALF_OPEN);
  assert_false(osr_breaker_allow(&b, 110));
  /* A released slot (cancelled probe) can be used again. */
  osr_breaker_release(&b);
  assert_true(osr_breaker_allow(&b, 111));
  osr_breaker_record(&b, 1, 120);
  assert_int_equal(osr_breaker_state(&b, 120), OSR_BREAKER_HALF_OPEN);
  osr_breaker_record(&b, 1, 130); /* the third success closes */
  assert_int_equal(osr_breaker_state(&b, 130), OSR_BREAKER_CLOSED);
}

static void test_late_results_while_open_ignored(void **state)
{
  (void)state;
  osr_breaker_config_t c = cfg(10, 10, 0.5, 2, 1000, 8000, 1);
  osr_breaker_t b;
  osr_breaker_init(&b, &c);
  trip(&b, 0);
  /* Answers to requests admitted before the trip arrive while open. */
  osr_breaker_record(&b, 0, 500);
  osr_breaker_record(&b, 1, 600);
  assert_int_equal(osr_breaker_state(&b, 999), OSR_BREAKER_OPEN);
  assert_int_equal(osr_breaker_open_until(&b, 999), 1000);
  assert_int_equal(b.times_opened, 1);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_defaults),
    cmocka_unit_test(test_window_ratio_trips),
    cmocka_unit_test(test_window_slides),
    cmocka_unit_test(test_consecutive_trips),
    cmocka_unit_test(test_half_open_success_closes),
    cmocka_unit_test(test_half_open_failure_doubles_capped),
    cmocka_unit_test(test_probes_limit),
    cmocka_unit_test(test_late_results_while_open_ignored),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
