/*
 * A queue of JSON-over-HTTP calls to one provider's REST API, for adapters
 * (adapters/e2b.c; the next REST providers, Modal, Vercel, Daytona, are one
 * file each on top of it: docs/adapters.md "Writing a REST adapter").
 *
 * The module owns what every such adapter needs and must get exactly right:
 * the list of operations in flight, one deadline per operation, the HTTP
 * exchange (connect, request with an optional JSON body, response head,
 * capped body), the deferred exactly-once delivery of the result (never
 * inside the call that started the operation, STYLE 7), and close with
 * operations in flight (each ends OSR_ECANCELED, then the close callback,
 * once nothing of the module is left on the loop). The adapter owns the
 * vendor: URLs, bodies, status mapping, what an answer means.
 *
 * An operation ("op") carries `user_size` bytes of adapter state
 * (osr_rest_user(), zeroed at start). Its life:
 *
 *   op = osr_rest_op_new(api, kind)          deadline starts
 *   osr_rest_send(op, "GET", target, body)   connect if needed, send
 *     -> cfg.on_head(op, status, headers)    (optional) the response head
 *     -> cfg.on_answer(op, status, body, n)  the whole answer arrived: call
 *                                            osr_rest_send() again (next
 *                                            page, same connection) or
 *                                            osr_rest_finish(op, result)
 *   osr_rest_finish(op, result)              first result wins; later:
 *     -> cfg.on_deliver(op, result)          exactly once, on a later turn
 *     -> cfg.on_release(op)                  when the op's handles are gone
 *
 * Transport failures finish the op for the adapter: no connection or reset
 * -> OSR_PERR_UNAVAILABLE, no answer by the deadline -> OSR_PERR_TIMEOUT,
 * closing -> OSR_ECANCELED. By default each op has its own HTTP/1.1
 * connection, closed when the op ends: provider calls are rare and slow
 * (hundreds of ms), so a pool would buy nothing measurable and cost
 * reconnection logic. With `shared_h2` every op shares one HTTP/2 (prior
 * knowledge) connection instead, opened on demand and replaced when it
 * dies; a request that never reached the wire (OSR_ECLOSED) is sent once
 * more on the new one (osr-sim: many concurrent calls to a local peer).
 *
 * Threading: the loop thread only, like every adapter, except cfg.on_work
 * (on libuv's thread pool, with the op's own state only).
 */
#ifndef OSR_ADAPTERS_REST_H
#define OSR_ADAPTERS_REST_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include <uv.h>

#include "net/http.h"
#include "net/tls.h"

/* Default work_min_bytes: an answer this large takes ~0.5 ms of jansson
 * (~30 ns a byte), well above the thread pool's hand-off; an answer to a
 * create or a get (a few hundred bytes) stays on the loop. */
#define OSR_REST_OFFLOAD_BYTES 16384

typedef struct osr_rest_s osr_rest_t;
typedef struct osr_rest_op_s osr_rest_op_t;

typedef struct osr_rest_config_s {
  const char *name;      /**< for log lines (the provider's name); copied */
  const char *addr;      /**< host:port to connect to; copied */
  const char *authority; /**< Host header; NULL = addr; copied */
  osr_tls_ctx_t *tls;    /**< NULL = plain HTTP; borrowed, must outlive the api */
  uint64_t timeout_ms;   /**< each op's deadline (every request it sends); 0 = none */
  uint64_t connect_timeout_ms; /**< 0 = timeout_ms */
  uint64_t idle_timeout_ms;    /**< the connection's; 0 = timeout_ms */
  int shared_h2;         /**< one shared HTTP/2 connection (see above) */
  size_t max_response;   /**< largest answer body accepted (then unavailable) */
  /** Sent with every request (API key, user agent); at most 6, copied by
   *  reference: the strings must outlive the api. */
  osr_http_header_t headers[6];
  size_t nheaders;
  size_t user_size;      /**< bytes of adapter state per op */
  /** Optional: the response head (headers valid during the call only). */
  void (*on_head)(osr_rest_op_t *op, int http_status, const osr_http_header_t *h, size_t nh);
  /** The answer is complete (body: len bytes, not NUL-terminated, valid
   *  during the call). Must call osr_rest_send() or osr_rest_finish(). */
  void (*on_answer)(osr_rest_op_t *op, int http_status, const char *body, size_t len);
  /** Optional: the same for an answer of at least work_min_bytes, run on
   *  libuv's thread pool instead of the loop (a list page of hundreds of
   *  resources costs milliseconds to parse, which on the loop would hold
   *  every other request of the gateway for as long). It may read the body
   *  and write the op's adapter state, nothing else: no osr_rest_* call, no
   *  loop handle, no state shared with other ops. It returns the op's
   *  result, which rest.c then sets on the loop (osr_rest_finish), or
   *  OSR_EAGAIN to have on_answer take this answer on the loop after all.
   *  A deadline or close that comes while it runs wins, as for any op; the
   *  op is delivered and released only after it has returned. */
  int (*on_work)(osr_rest_op_t *op, int http_status, const char *body, size_t len);
  size_t work_min_bytes; /**< with on_work: 0 = every answer off the loop */
  /** The op's result; exactly once per op, never inside an osr_rest_* call
   *  that the adapter made. */
  void (*on_deliver)(osr_rest_op_t *op, int status);
  /** Optional: free what the adapter hung on its op state (it is freed
   *  after this returns). Runs after on_deliver. */
  void (*on_release)(osr_rest_op_t *op);
} osr_rest_config_t;

/** The contract's mapping of an HTTP error status to OSR's provider error
 *  classes (docs/adapters.md): 400/422 invalid, 401/403 auth, 404
 *  not_found, 408/504 timeout, 429 rate_limited, 507 capacity, anything
 *  else unavailable. Adapters apply their vendor's exceptions first. */
int osr_rest_map_status(int http_status);

/** Configuration checks every adapter's init() makes (docs/adapters.md:
 *  errors name the key). osr_rest_cfg_err writes "key '<key>': <what>" and
 *  returns OSR_EINVAL; osr_rest_num_in stores a JSON number within
 *  [lo, hi] in *out and returns 0, else -1. */
int osr_rest_cfg_err(char *err, size_t errlen, const char *key, const char *what);
int osr_rest_num_in(const json_t *v, double lo, double hi, double *out);

/** A new api (no I/O). `cfg` is copied. */
osr_rest_t *osr_rest_new(uv_loop_t *loop, const osr_rest_config_t *cfg, void *owner);

/** The adapter state given to osr_rest_new. */
void *osr_rest_owner(const osr_rest_t *api);

/** 1 once osr_rest_close() was called: start no new op. */
int osr_rest_closing(const osr_rest_t *api);

/** Number of ops not yet released. */
size_t osr_rest_nops(const osr_rest_t *api);

/** Start an op of the adapter's `kind` (its own tag); its deadline runs. */
osr_rest_op_t *osr_rest_op_new(osr_rest_t *api, int kind);

/** The op's adapter state (user_size bytes, zeroed) / its kind / its api. */
void *osr_rest_user(osr_rest_op_t *op);
int osr_rest_kind(const osr_rest_op_t *op);
osr_rest_t *osr_rest_api(const osr_rest_op_t *op);

/**
 * Send `method target` (target is the full path and query) with `body`
 * (NUL-terminated JSON, or NULL for none; borrowed until the op ends: keep
 * it in the op's state). Connects first if the op has no connection yet.
 * Failures finish the op (see the file comment).
 */
void osr_rest_send(osr_rest_op_t *op, const char *method, const char *target, const char *body);

/** Set the op's result (the first one wins) and deliver it on a later loop
 *  turn; cancels its request and closes its connection. */
void osr_rest_finish(osr_rest_op_t *op, int status);

/** Method and target of the op's last request (for log lines). */
const char *osr_rest_method(const osr_rest_op_t *op);
const char *osr_rest_target(const osr_rest_op_t *op);

/**
 * Stop: every op finishes OSR_ECANCELED (delivered as usual), and once all
 * are released and nothing of the api is left on the loop, the api is
 * freed and cb(owner) runs, always later (never inside this call).
 */
void osr_rest_close(osr_rest_t *api, void (*cb)(void *owner));

#endif
