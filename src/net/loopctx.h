/*
 * osr_loopctx_t: state one libuv loop shares among all of its connections,
 * so that a connection carries small intrusive nodes instead of libuv
 * handles of its own (a uv_timer_t is 152 bytes, a uv_idle_t 120; the
 * nodes here are 40 and 24). Two services:
 *
 * Timers. osr_timer_t is a one-shot timer in a binary min-heap ordered by
 * (due time, start order); one uv_timer per loop is armed for the earliest
 * (h2o and haproxy drive their connection timeouts the same way). Times are
 * the loop's clock (uv_now), in milliseconds, as for uv_timer_start. A timer
 * fires once, from the loop's timer phase, after it is removed from the heap,
 * so its callback may start it again, stop any timer, or free the memory
 * holding it. A timer started from inside a timer callback never fires in
 * the same pass, even with a 0 ms timeout: it fires after the pass, from
 * the loop's idle phase, so a timer re-arming itself for 0 ms cannot keep
 * the loop from polling I/O.
 *
 * Pending calls. osr_pending_t is a node on the loop's list of calls to make
 * on the next loop iteration (a per-loop uv_idle runs them, in the order they
 * were scheduled), replacing a uv_idle_t per connection. Scheduling an
 * already scheduled node does nothing; a node scheduled from inside a
 * pending callback runs on the following iteration.
 *
 * Lifetime. osr_loopctx_acquire() returns the calling thread's context for
 * the loop (created on first use) with a reference; every owner of timers
 * or nodes holds one and calls osr_loopctx_release() once it has stopped
 * them. When the last reference goes, the context closes its two libuv
 * handles and frees itself in their close callbacks (STYLE 20), so a loop
 * with no connections holds no handles of ours and uv_loop_close() succeeds.
 * The handles are active only while a timer is armed or a call is pending:
 * like a connection's own handles before, they keep uv_run() going exactly
 * as long as there is something to time out or run.
 *
 * Threads. A context belongs to the thread that runs its loop; every call
 * must come from that thread (libuv's own rule for handles).
 */
#ifndef OSR_NET_LOOPCTX_H
#define OSR_NET_LOOPCTX_H

#include <stdint.h>
#include <uv.h>

typedef struct osr_loopctx_s osr_loopctx_t;
typedef struct osr_timer_s osr_timer_t;
typedef struct osr_pending_s osr_pending_t;

typedef void (*osr_timer_cb)(osr_timer_t *t);
typedef void (*osr_pending_cb)(osr_pending_t *n);

/** A one-shot timer; embed it and find the owner with osr_container_of. */
struct osr_timer_s {
  /* private */
  uint64_t _due; /* loop time (ms) at which it fires */
  uint64_t _seq; /* start order: ties fire first-started first */
  osr_timer_cb _cb;
  osr_loopctx_t *_ctx;
  uint32_t _idx; /* heap position + 1; 0 = not armed */
};

/** A pending-call node; embed it like a timer. */
struct osr_pending_s {
  /* private */
  osr_pending_t *_prev, *_next; /* NULL when not scheduled */
  osr_pending_cb _cb;
};

/** The calling thread's context for `loop`, with a new reference (created,
 *  with its two handles initialised on `loop`, on first use). Aborts on OOM
 *  (a fixed-size control structure, STYLE 9). */
osr_loopctx_t *osr_loopctx_acquire(uv_loop_t *loop);
/** Drop a reference. Timers and nodes of this owner must be stopped. */
void osr_loopctx_release(osr_loopctx_t *ctx);
/** The loop's clock in milliseconds (uv_now). */
uint64_t osr_loopctx_now(const osr_loopctx_t *ctx);
/** Number of armed timers (for tests and stats). */
uint32_t osr_loopctx_timers(const osr_loopctx_t *ctx);

/** Prepare an unarmed timer on `ctx`. The owner holds a reference. */
void osr_timer_init(osr_timer_t *t, osr_loopctx_t *ctx);
/** Arm (or re-arm) `t` to call cb(t) once `ms` from now. */
void osr_timer_start(osr_timer_t *t, osr_timer_cb cb, uint64_t ms);
/** Disarm; idempotent. The callback will not fire. */
void osr_timer_stop(osr_timer_t *t);
static inline int osr_timer_is_active(const osr_timer_t *t)
{
  return t->_idx != 0;
}
/** The context the timer was initialised on. */
static inline osr_loopctx_t *osr_timer_ctx(const osr_timer_t *t)
{
  return t->_ctx;
}
/** Milliseconds until an armed timer is due (0 if overdue or unarmed). */
uint64_t osr_timer_due_in(const osr_timer_t *t);

/** Prepare an unscheduled node. */
void osr_pending_init(osr_pending_t *n);
/** Call cb(n) on the next loop iteration; no-op if already scheduled (the
 *  first callback stays). */
void osr_pending_schedule(osr_loopctx_t *ctx, osr_pending_t *n, osr_pending_cb cb);
/** Unschedule; idempotent. */
void osr_pending_cancel(osr_loopctx_t *ctx, osr_pending_t *n);
static inline int osr_pending_is_scheduled(const osr_pending_t *n)
{
  return n->_next != NULL;
}

/* ---- deferred calls ------------------------------------------------------
 * A FIFO of calls with arguments, run on the next loop iteration from the
 * pending list, for owners that must not carry a node of their own for each
 * outstanding call (net/sock.c: the callbacks of writes the kernel took at
 * once). The queue lives in the context and grows to the number of calls
 * outstanding in one iteration; nothing is allocated per call. */

/** Any function pointer, cast back to its real type by the deferred call. */
typedef void (*osr_fn_t)(void);
/** Runs one deferred call. */
typedef void (*osr_call_cb)(void *obj, osr_fn_t fn, void *arg);

/** Call run(obj, fn, arg) on the next loop iteration, after the calls
 *  deferred before it. */
void osr_call_defer(osr_loopctx_t *ctx, osr_call_cb run, void *obj, osr_fn_t fn, void *arg);
/** Run now, in order, every call deferred for `obj` that has not run yet
 *  (calls these defer again wait for the next iteration). For an owner that
 *  must see them before something else, or is about to go away. */
void osr_call_flush(osr_loopctx_t *ctx, const void *obj);

#endif
