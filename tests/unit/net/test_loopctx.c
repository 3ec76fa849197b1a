/*
 * The per-loop timer heap and pending-call list (net/loopctx.c) on a real
 * libuv loop: firing order, stop and re-arm from inside callbacks, a 0 ms
 * timer started from a callback waiting for the next pass, many timers in
 * random order, freeing a timer's memory from its own callback, pending
 * calls in order with cancel and reschedule, deferred calls in order with
 * flush by owner (calls deferred from a call wait for the next pass, more
 * than the queue's first allocation holds), and the context closing its
 * handles with the last reference so uv_loop_close() succeeds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>

#include "net/loopctx.h"
#include "osr/common.h"
#include "util/mem.h"

typedef struct tm_s {
  osr_timer_t t;
  int id;
  uint64_t iteration; /* loop pass in which it fired */
} tm_t;

static int order[4096];
static int norder;
static uint64_t passes;

static void on_prepare(uv_prepare_t *p)
{
  (void)p;
  passes++;
}

static void record(osr_timer_t *t)
{
  tm_t *m = osr_container_of(t, tm_t, t);
  m->iteration = passes;
  order[norder++] = m->id;
}

static uv_loop_t *loop_new(uv_prepare_t *prep)
{
  uv_loop_t *loop = osr_xmalloc(sizeof(*loop));
  assert_int_equal(uv_loop_init(loop), 0);
  uv_prepare_init(loop, prep);
  uv_prepare_start(prep, on_prepare);
  uv_unref((uv_handle_t *)prep);
  norder = 0;
  passes = 0;
  return loop;
}

static void loop_done(uv_loop_t *loop, uv_prepare_t *prep)
{
  uv_close((uv_handle_t *)prep, NULL);
  assert_int_equal(uv_run(loop, UV_RUN_DEFAULT), 0);
  /* No handle of the context is left once the last reference went. */
  assert_int_equal(uv_loop_close(loop), 0);
  osr_free(loop);
}

/* Timers fire by due time, ties in start order; stopped ones never. */
static void test_ordering(void **state)
{
  (void)state;
  uv_prepare_t prep;
  uv_loop_t *loop = loop_new(&prep);
  osr_loopctx_t *ctx = osr_loopctx_acquire(loop);
  tm_t m[6];
  uint64_t ms[6] = {30, 10, 20, 10, 0, 25};
  for (int i = 0; i < 6; i++) {
    m[i].id = i;
    osr_timer_init(&m[i].t, ctx);
    osr_timer_start(&m[i].t, record, ms[i]);
  }
  assert_int_equal(osr_loopctx_timers(ctx), 6);
  osr_timer_stop(&m[5].t);
  osr_timer_stop(&m[5].t); /* idempotent */
  assert_false(osr_timer_is_active(&m[5].t));
  uv_run(loop, UV_RUN_DEFAULT);
  int want[] = {4, 1, 3, 2, 0};
  assert_int_equal(norder, 5);
  for (int i = 0; i < 5; i++)
    assert_int_equal(order[i], want[i]);
  assert_int_equal(osr_loopctx_timers(ctx), 0);
  osr_loopctx_release(ctx);
  loop_done(loop, &prep);
}

/* Re-arming an armed timer moves it; due_in reports what is left. */
static void test_rearm(void **state)
{
  (void)state;
  uv_prepare_t prep;
  uv_loop_t *loop = loop_new(&prep);
  osr_loopctx_t *ctx = osr_loopctx_acquire(loop);
  tm_t a = {.id = 1}, b = {.id = 2};
  osr_timer_init(&a.t, ctx);
  osr_timer_init(&b.t, ctx);
  osr_timer_start(&a.t, record, 5);
  osr_timer_start(&b.t, record, 20);
  assert_true(osr_timer_due_in(&b.t) <= 20);
  osr_timer_start(&a.t, record, 40); /* now after b */
  assert_int_equal(osr_loopctx_timers(ctx), 2);
  assert_true(osr_timer_due_in(&a.t) > 20);
  uv_run(loop, UV_RUN_DEFAULT);
  assert_int_equal(norder, 2);
  assert_int_equal(order[0], 2);
  assert_int_equal(order[1], 1);
  assert_int_equal(osr_timer_due_in(&a.t), 0);
  osr_loopctx_release(ctx);
  loop_done(loop, &prep);
}

/* A callback stops another timer due in the same pass and re-arms itself
 * with 0 ms: the stopped one never fires, the re-armed one fires after the
 * rest of the pass. */
static tm_t cb_a, cb_b, cb_c;
static int a_runs;

static void on_a(osr_timer_t *t)
{
  record(t);
  osr_timer_stop(&cb_b.t);
  if (++a_runs == 1)
    osr_timer_start(t, on_a, 0);
}

static void test_cancel_inside_callback(void **state)
{
  (void)state;
  uv_prepare_t prep;
  uv_loop_t *loop = loop_new(&prep);
  osr_loopctx_t *ctx = osr_loopctx_acquire(loop);
  a_runs = 0;
  cb_a.id = 1;
  cb_b.id = 2;
  cb_c.id = 3;
  osr_timer_init(&cb_a.t, ctx);
  osr_timer_init(&cb_b.t, ctx);
  osr_timer_init(&cb_c.t, ctx);
  osr_timer_start(&cb_a.t, on_a, 5);
  osr_timer_start(&cb_b.t, record, 5);
  osr_timer_start(&cb_c.t, record, 5);
  uv_run(loop, UV_RUN_DEFAULT);
  assert_int_equal(norder, 3);
  assert_int_equal(order[0], 1);
  assert_int_equal(order[1], 3); /* b was stopped by a */
  assert_int_equal(order[2], 1); /* a again, later */
  osr_loopctx_release(ctx);
  loop_done(loop, &prep);
}

/* A timer that keeps re-arming itself for 0 ms does not hold the loop in
 * its timer phase: the loop goes round (the prepare handle counts passes)
 * between its calls. Without that this test would never end. */
static tm_t spin;
static int spins;

static void on_spin(osr_timer_t *t)
{
  spins++;
  if (passes < 3)
    osr_timer_start(t, on_spin, 0);
}

static void test_zero_rearm_yields(void **state)
{
  (void)state;
  uv_prepare_t prep;
  uv_loop_t *loop = loop_new(&prep);
  osr_loopctx_t *ctx = osr_loopctx_acquire(loop);
  spins = 0;
  osr_timer_init(&spin.t, ctx);
  osr_timer_start(&spin.t, on_spin, 0);
  uv_run(loop, UV_RUN_DEFAULT);
  assert_true(passes >= 3);
  assert_true(spins >= 3 && (uint64_t)spins <= passes + 1);
  osr_loopctx_release(ctx);
  loop_done(loop, &prep);
}

/* Many timers in random order come out sorted; stopping half of them at
 * random leaves the rest in order. */
static void check_sorted(osr_timer_t *t)
{
  tm_t *m = osr_container_of(t, tm_t, t);
  static uint64_t last_due;
  if (norder == 0)
    last_due = 0;
  uint64_t due = (uint64_t)m->id;
  assert_true(due >= last_due);
  last_due = due;
  order[norder++] = m->id;
}

static void test_many(void **state)
{
  (void)state;
  enum { N = 3000 };
  uv_prepare_t prep;
  uv_loop_t *loop = loop_new(&prep);
  osr_loopctx_t *ctx = osr_loopctx_acquire(loop);
  tm_t *m = osr_xcalloc(N, sizeof(*m));
  srand(7);
  for (int i = 0; i < N; i++) {
    m[i].id = rand() % 50; /* the id is the timeout: sorted by id */
    osr_timer_init(&m[i].t, ctx);
    osr_timer_start(&m[i].t, check_sorted, (uint64_t)m[i].id);
  }
  int stopped = 0;
  for (int i = 0; i < N; i += 2) {
    osr_timer_stop(&m[(i * 7) % N].t);
  }
  for (int i = 0; i < N; i++)
    stopped += !osr_timer_is_active(&m[i].t);
  assert_int_equal(osr_loopctx_timers(ctx), N - stopped);
  uv_run(loop, UV_RUN_DEFAULT);
  assert_int_equal(norder, N - stopped);
  osr_free(m);
  osr_loopctx_release(ctx);
  loop_done(loop, &prep);
}

/* A callback may free the memory holding its timer, and the owner's last
 * reference may go with it: the context closes once its pass is over. */
typedef struct owner_s {
  osr_loopctx_t *ctx;
  osr_timer_t t;
} owner_t;

static int owners_freed;

static void on_owner_timer(osr_timer_t *t)
{
  owner_t *o = osr_container_of(t, owner_t, t);
  osr_loopctx_release(o->ctx);
  osr_free(o);
  owners_freed++;
}

static void test_free_inside_callback(void **state)
{
  (void)state;
  uv_prepare_t prep;
  uv_loop_t *loop = loop_new(&prep);
  owners_freed = 0;
  for (int i = 0; i < 3; i++) {
    owner_t *o = osr_xmalloc(sizeof(*o));
    o->ctx = osr_loopctx_acquire(loop);
    osr_timer_init(&o->t, o->ctx);
    osr_timer_start(&o->t, on_owner_timer, (uint64_t)i);
  }
  uv_run(loop, UV_RUN_DEFAULT);
  assert_int_equal(owners_freed, 3);
  loop_done(loop, &prep);
}

/* An armed timer keeps uv_run() going; releasing with nothing armed lets
 * the loop end, and a new acquire after that gets a working context. */
static void test_close_while_armed(void **state)
{
  (void)state;
  uv_prepare_t prep;
  uv_loop_t *loop = loop_new(&prep);
  osr_loopctx_t *ctx = osr_loopctx_acquire(loop);
  tm_t a = {.id = 1};
  osr_timer_init(&a.t, ctx);
  osr_timer_start(&a.t, record, 10000);
  assert_int_equal(uv_run(loop, UV_RUN_NOWAIT), 1); /* still alive */
  osr_timer_stop(&a.t);
  osr_loopctx_release(ctx);
  ctx = osr_loopctx_acquire(loop); /* while the old one is closing */
  osr_timer_init(&a.t, ctx);
  osr_timer_start(&a.t, record, 1);
  uv_run(loop, UV_RUN_DEFAULT);
  assert_int_equal(norder, 1);
  osr_loopctx_release(ctx);
  loop_done(loop, &prep);
}

/* Pending calls run on the next iteration in order; cancel removes one;
 * one scheduled from a callback runs on the iteration after. */
typedef struct pn_s {
  osr_pending_t n;
  int id;
  uint64_t iteration;
} pn_t;

static pn_t pn[4];
static osr_loopctx_t *pctx;

static void on_pending(osr_pending_t *n)
{
  pn_t *p = osr_container_of(n, pn_t, n);
  p->iteration = passes;
  order[norder++] = p->id;
  if (p->id == 0) {
    osr_pending_cancel(pctx, &pn[2].n);               /* not yet run: removed */
    osr_pending_schedule(pctx, &pn[0].n, on_pending); /* itself: next time */
    pn[0].id = 10;
  }
}

static void test_pending(void **state)
{
  (void)state;
  uv_prepare_t prep;
  uv_loop_t *loop = loop_new(&prep);
  pctx = osr_loopctx_acquire(loop);
  for (int i = 0; i < 4; i++) {
    pn[i].id = i;
    osr_pending_init(&pn[i].n);
    osr_pending_schedule(pctx, &pn[i].n, on_pending);
  }
  osr_pending_schedule(pctx, &pn[1].n, on_pending); /* no-op: scheduled */
  assert_true(osr_pending_is_scheduled(&pn[1].n));
  osr_pending_cancel(pctx, &pn[3].n);
  osr_pending_cancel(pctx, &pn[3].n);
  uv_run(loop, UV_RUN_DEFAULT);
  assert_int_equal(norder, 3);
  assert_int_equal(order[0], 0);
  assert_int_equal(order[1], 1);
  assert_int_equal(order[2], 10);
  assert_true(pn[0].iteration > pn[1].iteration);
  assert_false(osr_pending_is_scheduled(&pn[2].n));
  osr_loopctx_release(pctx);
  loop_done(loop, &prep);
}

/* Deferred calls: FIFO across owners, flush runs one owner's now and only
 * once, calls deferred from inside a call run on a later pass. */
static osr_loopctx_t *dctx;
static int dobj[2];
static uint64_t dpass[200];

static void on_deferred(void *obj, osr_fn_t fn, void *arg)
{
  int id = (int)(intptr_t)arg;
  assert_null(fn);
  dpass[id] = passes;
  order[norder++] = (obj == &dobj[0] ? 0 : 1000) + id;
  if (id == 4) /* from inside a call: waits for the next pass */
    osr_call_defer(dctx, on_deferred, &dobj[0], NULL, (void *)(intptr_t)199);
}

static void test_deferred_calls(void **state)
{
  (void)state;
  uv_prepare_t prep;
  uv_loop_t *loop = loop_new(&prep);
  dctx = osr_loopctx_acquire(loop);
  for (int i = 0; i < 150; i++) /* beyond the first 64 slots */
    osr_call_defer(dctx, on_deferred, &dobj[i % 2], NULL, (void *)(intptr_t)i);
  osr_call_flush(dctx, &dobj[1]); /* the odd ones, now, in order */
  assert_int_equal(norder, 75);
  for (int i = 0; i < 75; i++)
    assert_int_equal(order[i], 1000 + 2 * i + 1);
  osr_call_flush(dctx, &dobj[1]); /* nothing left for it */
  assert_int_equal(norder, 75);
  uv_run(loop, UV_RUN_DEFAULT);
  assert_int_equal(norder, 151);
  for (int i = 0; i < 75; i++)
    assert_int_equal(order[75 + i], 2 * i);
  assert_int_equal(order[150], 199);
  assert_true(dpass[199] > dpass[4]);
  osr_loopctx_release(dctx);
  loop_done(loop, &prep);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ordering),
      cmocka_unit_test(test_rearm),
      cmocka_unit_test(test_cancel_inside_callback),
      cmocka_unit_test(test_zero_rearm_yields),
    cmocka_unit_test(test_many),
      cmocka_unit_test(test_free_inside_callback),
      cmocka_unit_test(test_close_while_armed),
      cmocka_unit_test(test_pending),
      cmocka_unit_test(test_deferred_calls),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
