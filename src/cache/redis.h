/*
 * Redis binding cache and invalidation bus (hiredis with its libuv adapter).
 *
 * What it is for: the data plane and other gateways read a sandbox's binding
 * from Redis instead of the database; when a binding changes (killed, paused,
 * resumed, migrated) the gateway deletes/overwrites the cached copy and
 * publishes an invalidation so every subscriber drops its local copy within a
 * second (token revocation rides on the same channel).
 *
 * Failure model: Redis is an accelerator, never a dependency. While it is
 * down every call fails fast with OSR_EUNAVAILABLE (callers fall back to the
 * store), and the client reconnects in the background with capped backoff.
 *
 * Hazards handled here (STYLE, "Known hazards"): hiredis connects to numeric
 * addresses only (the host is resolved with uv_getaddrinfo first); in-flight
 * commands per connection are capped (max_inflight; above it calls fail with
 * OSR_EAGAIN instead of growing hiredis's output buffer); reply sizes are
 * capped (hiredis 0.14 has no maxelements and buffers a whole bulk reply,
 * so redis.c caps buffered bytes after each read and wraps the reader's
 * object functions; a reply over the cap costs the connection, which is
 * rebuilt); nothing is freed before hiredis has let go of both contexts.
 *
 * Callback contract as everywhere: 0 → the callback fires exactly once on the
 * loop thread; an error return → it never fires.
 */
#ifndef OSR_CACHE_REDIS_H
#define OSR_CACHE_REDIS_H

#include <stdint.h>
#include <uv.h>

#include "osr/common.h"
#include "store/store.h"

typedef struct osr_redis_s osr_redis_t;

/** Cap on one cached binding's JSON (and on any bulk reply we accept). */
#define OSR_BINDING_JSON_MAX (4u * 1024 * 1024)
/** Cap on each JSON document inside a binding (request, granted, ...). */
#define OSR_BINDING_DOC_MAX (2u * 1024 * 1024)
/** Longest id carried by an invalidation. */
#define OSR_REDIS_ID_MAX 64

typedef struct osr_redis_opts_s {
  const char *url;             /**< redis://host:port[/db] or unix:/path */
  const char *prefix;          /**< key prefix, default "osr:" */
  uint64_t connect_timeout_ms; /**< default 1000 */
  uint64_t command_timeout_ms; /**< default 500: a stuck Redis must not stall creates */
  size_t max_inflight;         /**< default 10000 */
  uint64_t binding_ttl_ms;     /**< cache entry lifetime, default 300000 */
} osr_redis_opts_t;

/** Invalidation message: a sandbox whose binding changed (or "*" for all).
 *  "*" is also delivered after the subscriber connection came back from an
 *  outage, since messages published meanwhile were lost. */
typedef void (*osr_redis_invalidate_cb)(const char *sandbox_id, void *data);

/** Create the client and start connecting (in the background). Returns 0 or
 *  OSR_EINVAL for a bad URL. */
int osr_redis_new(uv_loop_t *loop, const osr_redis_opts_t *opts, osr_redis_t **out);

/** Subscribe to invalidations (a second connection; re-subscribes after
 *  reconnects). One subscriber callback per client: a second call returns
 *  OSR_EBUSY. `cb` runs on the loop thread for every valid message until
 *  osr_redis_close; ids are checked with osr_redis_id_is_valid first. */
int osr_redis_subscribe(osr_redis_t *r, osr_redis_invalidate_cb cb, void *data);

/** 1 while the command connection is up. */
int osr_redis_is_connected(const osr_redis_t *r);

typedef void (*osr_redis_done_cb)(int status, void *data);
/** `b` valid during the call (NULL unless status is 0); status OSR_ENOTFOUND
 *  on a miss, OSR_ETIMEDOUT after command_timeout_ms (a late reply is
 *  dropped), OSR_EUNAVAILABLE if the connection broke or Redis answered an
 *  error, OSR_EPROTO for an entry that is not a valid binding, OSR_ECANCELED
 *  when the client is closed first. Same statuses for osr_redis_done_cb. */
typedef void (*osr_redis_binding_cb)(int status, const osr_binding_t *b, void *data);

/** Cache a binding (SET "<prefix>b:<id>" PX binding_ttl_ms).
 *  Synchronous errors (the callback then never fires): OSR_EUNAVAILABLE while
 *  disconnected, OSR_EAGAIN at max_inflight, OSR_EINVAL for a bad id or
 *  binding, OSR_ETOOLARGE above OSR_BINDING_JSON_MAX, OSR_ECLOSED while
 *  closing. The same apply to get and invalidate. */
int osr_redis_put_binding(osr_redis_t *r, const osr_binding_t *b, osr_redis_done_cb cb, void *data);
int osr_redis_get_binding(osr_redis_t *r, const char *id, osr_redis_binding_cb cb, void *data);
/** Delete the cached copy and publish an invalidation on
 *  "<prefix>invalidate". id "*" publishes only (every subscriber flushes). */
int osr_redis_invalidate(osr_redis_t *r, const char *id, osr_redis_done_cb cb, void *data);

/** Serialise a binding for the cache (JSON) and back; exposed for tests and
 *  the data plane. `out` is heap (osr_free), NUL-terminated.
 *  to_json: OSR_EINVAL for a string field not terminated inside its array,
 *  non-UTF-8 text, a bad id/state/isolation; OSR_ETOOLARGE past the caps. */
int osr_binding_to_json(const osr_binding_t *b, char **out);
/** Parse untrusted JSON (`len` bytes, no NUL needed). `b` is overwritten as
 *  if uninitialised (dispose an old value first). 0: every field was present
 *  and valid; the JSON documents are heap strings the caller frees
 *  (osr_binding_dispose). OSR_EINVAL for anything else (syntax, duplicate or
 *  missing members, wrong types, oversize strings, unknown enum names, input
 *  above OSR_BINDING_JSON_MAX); `b` is then all zero and owns nothing.
 *  OSR_ENOMEM on allocation failure. Unknown members are ignored. */
int osr_binding_from_json(const char *json, size_t len, osr_binding_t *b);

/** 1 if `id` (`len` bytes) is 1..OSR_REDIS_ID_MAX of [a-z0-9*_-]. */
int osr_redis_id_is_valid(const char *id, size_t len);

/** (Additive.) Most (id, ms) pairs in one activity add or drain. */
#define OSR_REDIS_ACTIVITY_BATCH_MAX 1024

/**
 * (Additive.) Data-plane activity reports (docs/dataplane.md, "Activity"):
 * the hash "<prefix>activity" maps sandbox id -> unix ms of its latest
 * traffic. add merges n pairs keeping the larger time per id (one atomic
 * EVAL); ids must be valid cache ids without '*', ms > 0, 1 <= n <=
 * OSR_REDIS_ACTIVITY_BATCH_MAX (else OSR_EINVAL). The callback reports
 * whether Redis took the batch; the same synchronous errors as
 * osr_redis_put_binding apply.
 */
int osr_redis_activity_add(osr_redis_t *r, const char *const *ids, const int64_t *ms, size_t n,
                           osr_redis_done_cb cb, void *data);

/** (Additive.) The same pairs into the cached bindings ("<prefix>b:<id>",
 *  when present): last_activity_ms is raised, TTL kept, so reads served
 *  from the cache show data-plane activity. Same contract as add. */
int osr_redis_activity_cached(osr_redis_t *r, const char *const *ids, const int64_t *ms, size_t n,
                              osr_redis_done_cb cb, void *data);

/** Activity drained: on status 0, n pairs valid during the call (may be 0);
 *  otherwise ids/ms are NULL and n is 0. */
typedef void (*osr_redis_activity_cb)(int status, const char *const *ids, const int64_t *ms,
                                      size_t n, void *data);
/** (Additive.) Take (read and delete, atomically) up to `max` (1..
 *  OSR_REDIS_ACTIVITY_BATCH_MAX) pairs from the activity hash. A drained
 *  pair is gone from Redis even if the caller then fails to apply it. */
int osr_redis_activity_drain(osr_redis_t *r, size_t max, osr_redis_activity_cb cb, void *data);

/** Round-trip latency of the last command in microseconds (metrics). */
uint64_t osr_redis_last_latency_us(const osr_redis_t *r);

/** Disconnect and free; pending callbacks fire with OSR_ECANCELED first. */
void osr_redis_close(osr_redis_t *r, void (*cb)(void *data), void *data);

#endif
