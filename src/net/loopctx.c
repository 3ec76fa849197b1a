/*
 * The per-loop timer heap and pending-call list. See loopctx.h for the
 * contract; this file explains the mechanics.
 *
 * The heap is an array of timer pointers; each timer knows its position
 * (_idx, 1-based so that 0 means unarmed), which makes stop and re-arm
 * O(log n) without a search. The loop's uv_timer is re-armed only when the
 * earliest due time changes, which for connection timeouts (mostly the same
 * few durations, started in time order) is rare: a new timer usually sorts
 * behind the current earliest one.
 *
 * A context lives in a per-thread list, found by loop pointer; a thread
 * normally runs one loop, tests run several one after another.
 */
#include "net/loopctx.h"

#include <string.h>

#include "osr/common.h"
#include "util/mem.h"

struct osr_loopctx_s {
  uv_loop_t *loop;
  uv_timer_t timer; /* armed for heap[0] */
  uv_idle_t idle;   /* active while calls are pending */
  osr_timer_t **heap;
  uint32_t n, cap;
  uint64_t seq;          /* next timer start number */
  uint64_t armed_due;    /* due time uv timer is armed for (valid while active) */
  osr_pending_t pending; /* list sentinel */
  osr_pending_t again;   /* a timer pass left due timers for the next iteration */
  struct call_s *calls;  /* deferred calls, oldest first (run == NULL: done) */
  uint32_t ncalls, calls_cap;
  osr_pending_t calls_node; /* scheduled while calls are queued */
  int refs;
  int open_handles;    /* handles to close before freeing */
  osr_loopctx_t *next; /* the thread's list */
};

static _Thread_local osr_loopctx_t *thread_ctxs;

/* ---- heap ---------------------------------------------------------------- */

static int earlier(const osr_timer_t *a, const osr_timer_t *b)
{
  return a->_due < b->_due || (a->_due == b->_due && a->_seq < b->_seq);
}

static void heap_set(osr_loopctx_t *c, uint32_t i, osr_timer_t *t)
{
  c->heap[i] = t;
  t->_idx = i + 1;
}

static void sift_up(osr_loopctx_t *c, uint32_t i)
{
  osr_timer_t *t = c->heap[i];
  while (i > 0) {
    uint32_t parent = (i - 1) / 2;
    if (!earlier(t, c->heap[parent]))
      break;
    heap_set(c, i, c->heap[parent]);
    i = parent;
  }
  heap_set(c, i, t);
}

static void sift_down(osr_loopctx_t *c, uint32_t i)
{
  osr_timer_t *t = c->heap[i];
  for (;;) {
    uint32_t l = 2 * i + 1, m = i;
    const osr_timer_t *best = t;
    if (l < c->n && earlier(c->heap[l], best)) {
      m = l;
      best = c->heap[l];
    }
    if (l + 1 < c->n && earlier(c->heap[l + 1], best))
      m = l + 1;
    if (m == i)
      break;
    heap_set(c, i, c->heap[m]);
    i = m;
  }
  heap_set(c, i, t);
}

static void heap_remove(osr_loopctx_t *c, osr_timer_t *t)
{
  uint32_t i = t->_idx - 1;
  osr_timer_t *last = c->heap[--c->n];
  t->_idx = 0;
  if (i == c->n)
    return;
  heap_set(c, i, last);
  if (i > 0 && earlier(last, c->heap[(i - 1) / 2]))
    sift_up(c, i);
  else
    sift_down(c, i);
}

/* ---- the loop's uv timer ---------------------------------------------------- */

static void on_uv_timer(uv_timer_t *h);

/* Make the uv timer match heap[0]: stopped when the heap is empty, else due
 * at heap[0]'s time. Restarting a uv timer is itself a heap operation in
 * libuv, so it is skipped while the armed time is already right. */
static void rearm(osr_loopctx_t *c)
{
  if (c->n == 0) {
    uv_timer_stop(&c->timer);
    return;
  }
  uint64_t due = c->heap[0]->_due;
  if (uv_is_active((uv_handle_t *)&c->timer) && c->armed_due == due)
    return;
  if (osr_pending_is_scheduled(&c->again))
    return; /* a pass follows on the next iteration and re-arms */
  uint64_t now = uv_now(c->loop);
  c->armed_due = due;
  uv_timer_start(&c->timer, on_uv_timer, due > now ? due - now : 0, 0);
}

static void ctx_ref(osr_loopctx_t *c)
{
  c->refs++;
}

static void on_again(osr_pending_t *n);

/* Fire every timer that is due and was started before this pass began;
 * ones the callbacks start (even for 0 ms) wait. libuv would run a uv timer
 * re-armed for 0 ms from its own callback again in the same phase, so a
 * pass that leaves due timers behind continues from the pending list, on
 * the next iteration, after I/O has been polled. */
static void fire_due(osr_loopctx_t *c)
{
  uint64_t now = uv_now(c->loop);
  uint64_t limit = c->seq;

  ctx_ref(c); /* a callback may drop the last owner's reference */
  while (c->n != 0) {
    osr_timer_t *t = c->heap[0];
    if (t->_due > now || t->_seq >= limit)
      break;
    heap_remove(c, t);
    t->_cb(t);
  }
  if (c->refs > 1) {
    if (c->n != 0 && c->heap[0]->_due <= now) {
      uv_timer_stop(&c->timer);
      osr_pending_schedule(c, &c->again, on_again);
    } else {
      rearm(c);
    }
  }
  osr_loopctx_release(c);
}

static void on_uv_timer(uv_timer_t *h)
{
  fire_due(h->data);
}

static void on_again(osr_pending_t *n)
{
  fire_due(osr_container_of(n, osr_loopctx_t, again));
}

/* ---- timers ---------------------------------------------------------------- */

void osr_timer_init(osr_timer_t *t, osr_loopctx_t *ctx)
{
  t->_due = 0;
  t->_seq = 0;
  t->_cb = NULL;
  t->_ctx = ctx;
  t->_idx = 0;
}

void osr_timer_start(osr_timer_t *t, osr_timer_cb cb, uint64_t ms)
{
  osr_loopctx_t *c = t->_ctx;
  if (t->_idx != 0)
    heap_remove(c, t);
  t->_due = uv_now(c->loop) + ms;
  t->_seq = c->seq++;
  t->_cb = cb;
  if (c->n == c->cap) {
    c->cap = c->cap != 0 ? 2 * c->cap : 64;
    c->heap = osr_xrealloc(c->heap, c->cap * sizeof(*c->heap));
  }
  c->heap[c->n] = t;
  c->n++;
  sift_up(c, c->n - 1);
  rearm(c);
}

void osr_timer_stop(osr_timer_t *t)
{
  if (t->_idx == 0)
    return;
  osr_loopctx_t *c = t->_ctx;
  int was_first = t->_idx == 1;
  heap_remove(c, t);
  /* An early wake-up costs less than re-arming on every stop: only an
   * empty heap stops the uv timer. */
  if (was_first && c->n == 0)
    uv_timer_stop(&c->timer);
}

uint64_t osr_timer_due_in(const osr_timer_t *t)
{
  if (t->_idx == 0)
    return 0;
  uint64_t now = uv_now(t->_ctx->loop);
  return t->_due > now ? t->_due - now : 0;
}

/* ---- pending calls ------------------------------------------------------ */

static void on_uv_idle(uv_idle_t *h)
{
  osr_loopctx_t *c = h->data;
  osr_pending_t run;

  if (c->pending._next == &c->pending) {
    uv_idle_stop(&c->idle); /* everything was cancelled */
    return;
  }
  /* Move the list aside: what is scheduled meanwhile waits for the next
   * iteration. Cancelling a node still on `run` unlinks it from there. */
  run._next = c->pending._next;
  run._prev = c->pending._prev;
  run._next->_prev = &run;
  run._prev->_next = &run;
  c->pending._next = c->pending._prev = &c->pending;

  ctx_ref(c);
  while (run._next != &run) {
    osr_pending_t *n = run._next;
    n->_next->_prev = &run;
    run._next = n->_next;
    n->_next = n->_prev = NULL;
    n->_cb(n);
  }
  if (c->pending._next == &c->pending)
    uv_idle_stop(&c->idle);
  osr_loopctx_release(c);
}

void osr_pending_init(osr_pending_t *n)
{
  n->_next = n->_prev = NULL;
  n->_cb = NULL;
}

void osr_pending_schedule(osr_loopctx_t *ctx, osr_pending_t *n, osr_pending_cb cb)
{
  if (n->_next != NULL)
    return;
  n->_cb = cb;
  n->_prev = ctx->pending._prev;
  n->_next = &ctx->pending;
  ctx->pending._prev->_next = n;
  ctx->pending._prev = n;
  uv_idle_start(&ctx->idle, on_uv_idle);
}

void osr_pending_cancel(osr_loopctx_t *ctx, osr_pending_t *n)
{
  (void)ctx;
  if (n->_next == NULL)
    return;
  n->_prev->_next = n->_next;
  n->_next->_prev = n->_prev;
  n->_next = n->_prev = NULL;
  /* The idle handle stops itself when it finds the list empty. */
}

/* ---- deferred calls ------------------------------------------------------ */

typedef struct call_s {
  osr_call_cb run;
  void *obj;
  osr_fn_t fn;
  void *arg;
} call_t;

/* Run the calls queued before this pass, in order; calls they defer (which
 * may grow the array) wait for the next iteration. A call osr_call_flush
 * ran already is marked done and skipped. */
static void on_calls(osr_pending_t *n)
{
  osr_loopctx_t *c = osr_container_of(n, osr_loopctx_t, calls_node);
  uint32_t end = c->ncalls;

  ctx_ref(c);
  for (uint32_t i = 0; i < end; i++) {
    call_t k = c->calls[i];
    if (k.run == NULL)
      continue;
    c->calls[i].run = NULL;
    k.run(k.obj, k.fn, k.arg);
  }
  c->ncalls -= end;
  memmove(c->calls, c->calls + end, c->ncalls * sizeof(*c->calls));
  osr_loopctx_release(c);
}

void osr_call_defer(osr_loopctx_t *c, osr_call_cb run, void *obj, osr_fn_t fn, void *arg)
{
  if (c->ncalls == c->calls_cap) {
    c->calls_cap = c->calls_cap != 0 ? 2 * c->calls_cap : 64;
    c->calls = osr_xrealloc(c->calls, c->calls_cap * sizeof(*c->calls));
  }
  c->calls[c->ncalls++] = (call_t){run, obj, fn, arg};
  osr_pending_schedule(c, &c->calls_node, on_calls);
}

void osr_call_flush(osr_loopctx_t *c, const void *obj)
{
  uint32_t end = c->ncalls;
  for (uint32_t i = 0; i < end; i++) {
    call_t k = c->calls[i];
    if (k.run == NULL || k.obj != obj)
      continue;
    c->calls[i].run = NULL;
    k.run(k.obj, k.fn, k.arg);
  }
}

/* ---- lifetime ---------------------------------------------------------------- */

osr_loopctx_t *osr_loopctx_acquire(uv_loop_t *loop)
{
  osr_loopctx_t *c;
  for (c = thread_ctxs; c != NULL; c = c->next) {
    if (c->loop == loop) {
      ctx_ref(c);
      return c;
    }
  }
  c = osr_xcalloc(1, sizeof(*c));
  c->loop = loop;
  uv_timer_init(loop, &c->timer);
  c->timer.data = c;
  uv_idle_init(loop, &c->idle);
  c->idle.data = c;
  c->open_handles = 2;
  c->pending._next = c->pending._prev = &c->pending;
  osr_pending_init(&c->again);
  osr_pending_init(&c->calls_node);
  c->refs = 1;
  c->next = thread_ctxs;
  thread_ctxs = c;
  return c;
}

static void on_handle_closed(uv_handle_t *h)
{
  osr_loopctx_t *c = h->data;
  if (--c->open_handles != 0)
    return;
  osr_free(c->heap);
  osr_free(c->calls);
  osr_free(c);
}

void osr_loopctx_release(osr_loopctx_t *c)
{
  if (--c->refs != 0)
    return;
  /* Unlinked now, so a new owner on this loop gets a fresh context while
   * this one's handles are still closing. */
  for (osr_loopctx_t **pp = &thread_ctxs; *pp != NULL; pp = &(*pp)->next) {
    if (*pp == c) {
      *pp = c->next;
      break;
    }
  }
  uv_close((uv_handle_t *)&c->timer, on_handle_closed);
  uv_close((uv_handle_t *)&c->idle, on_handle_closed);
}

uint64_t osr_loopctx_now(const osr_loopctx_t *ctx)
{
  return uv_now(ctx->loop);
}

uint32_t osr_loopctx_timers(const osr_loopctx_t *ctx)
{
  return ctx->n;
}
