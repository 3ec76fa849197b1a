/*
 * The binding store: durable sandbox -> provider bindings, idempotency,
 * tenants and API keys, and the audit log. Two backends with one schema and
 * one set of migrations, chosen by URL:
 *   sqlite:/path/to/osr.db    embedded default (WAL, synchronous=NORMAL... see store_sqlite.c)
 *   postgres://user@host:port/db?...   gateway mode, several gateways on one database
 *
 * Threading: the loop thread never blocks on the database. Each backend runs
 * its own worker thread(s); requests are queued to them and results come
 * back to the loop thread through a uv_async_t. Writes that arrive together
 * are committed in one transaction (group commit), which is what makes
 * thousands of durable creates per second possible on SQLite.
 *
 * Callback contract: a function that returns 0 calls its callback exactly
 * once on the loop thread; an error return (OSR_EINVAL for bad arguments,
 * OSR_ECLOSED after close) means it never does. Data passed to callbacks is
 * valid only during the callback. Store failures (database down, disk
 * full) come back as OSR_EUNAVAILABLE so the API can answer `unavailable`.
 *
 * Ordering: requests run in submission order on SQLite (one worker). On
 * PostgreSQL a pool of connections (?pool=N, default 2) runs batches in
 * parallel, so calls issued without waiting for each other's callbacks may
 * complete in any order; issue dependent calls from the callback.
 * While PostgreSQL is unreachable every call fails within milliseconds with
 * OSR_EUNAVAILABLE (a failed connect holds further attempts for ~500 ms);
 * the store reconnects by itself. A failed open (status != 0 in the open
 * callback) still leaves `st` valid: calls fail or succeed as the database
 * comes and goes, and the caller must osr_store_close it in any case.
 */
#ifndef OSR_STORE_STORE_H
#define OSR_STORE_STORE_H

#include <stdint.h>
#include <uv.h>

#include "osr/adapter.h"
#include "osr/common.h"

#define OSR_EUNAVAILABLE (-30010) /* the store cannot be reached */
#define OSR_ECONFLICT (-30011)    /* a uniqueness rule was violated */
#define OSR_ENOTFOUND (-30012)    /* no such row (or not the caller's) */

#define OSR_ID_MAX 40
#define OSR_TENANT_MAX 64
#define OSR_IDEM_KEY_MAX 256
#define OSR_OWNER_MAX 64

/** Lifecycle of a binding. */
typedef enum osr_binding_state_e {
  OSR_BINDING_CREATING = 1, /**< intent written, provider not yet answered */
  OSR_BINDING_RUNNING = 2,
  OSR_BINDING_PAUSED = 3,
  OSR_BINDING_ENDED = 4,    /**< destroyed on purpose (kill, TTL, idle) */
  OSR_BINDING_FAILED = 5,   /**< create failed on every candidate */
  OSR_BINDING_LOST = 6,     /**< the provider resource vanished */
} osr_binding_state_t;

const char *osr_binding_state_name(osr_binding_state_t s);
/** Parse a state name; returns 0 if unknown. */
osr_binding_state_t osr_binding_state_parse(const char *s);

/**
 * One sandbox's binding: where it lives and what it is. Strings are inline
 * (fixed caps) except the JSON documents, which are heap strings owned by
 * whoever owns the struct (osr_binding_dispose frees them).
 */
typedef struct osr_binding_s {
  char id[OSR_ID_MAX];              /**< OSR sandbox id (20 lower-case alnum chars) */
  char tenant[OSR_TENANT_MAX];
  char idem_key[OSR_IDEM_KEY_MAX];  /**< "" if none was given */
  char request_hash[65];            /**< SHA-256 hex of the canonical request */
  char template_id[128];
  char provider[OSR_NAME_MAX];      /**< configured provider name, "" before placement */
  char provider_id[128];            /**< the provider's own id, "" until created */
  char region[OSR_NAME_MAX];
  osr_isolation_t isolation;
  char agent_endpoint[1024]; /**< may end in a sealed upstream credential (token.h) */
  osr_binding_state_t state;
  int attempt;                      /**< 1-based create attempt (failover count + 1) */
  int64_t created_ms;               /**< unix ms */
  int64_t updated_ms;
  int64_t expires_ms;               /**< absolute TTL deadline; 0 = none */
  int64_t idle_timeout_ms;          /**< 0 = none */
  int64_t last_activity_ms;         /**< data-plane traffic, for idle */
  int64_t ended_ms;
  char end_reason[64];              /**< "killed", "ttl", "idle", "lost", "failed: ..." */
  char *request_json;               /**< the create request as received (canonical) */
  char *granted_json;               /**< capabilities granted (JSON object) */
  char *metadata_json;              /**< user metadata (JSON object of strings) */
  char *error_json;                 /**< for FAILED: attempts and reasons */
  char owner[OSR_OWNER_MAX];        /**< instance id of the gateway that wrote the intent (and
                                         runs the create); "" for rows older than schema v2.
                                         osr_store_update keeps the stored owner when "" */
} osr_binding_t;

void osr_binding_init(osr_binding_t *b);
void osr_binding_dispose(osr_binding_t *b);
/** Deep copy. */
void osr_binding_copy(osr_binding_t *dst, const osr_binding_t *src);

typedef struct osr_store_s osr_store_t;

typedef void (*osr_store_open_cb)(osr_store_t *st, int status, void *data);
typedef void (*osr_store_done_cb)(int status, void *data);
/** `b` valid during the call. For create_intent, `created` is 1 if this call
 *  inserted the row, 0 if a row with the same (tenant, idem_key) existed and
 *  `b` is that row. */
typedef void (*osr_store_binding_cb)(int status, const osr_binding_t *b, int created, void *data);
typedef void (*osr_store_list_cb)(int status, const osr_binding_t *items, size_t n,
                                  const char *next_cursor, void *data);

/** Open the store at `url`, create or migrate the schema (on the worker),
 *  then call cb on the loop thread. Returns 0 or OSR_EINVAL (bad URL). */
int osr_store_open(uv_loop_t *loop, const char *url, osr_store_open_cb cb, void *data,
                   osr_store_t **out);

/** Finish queued work, stop the workers, free; cb may be NULL. */
void osr_store_close(osr_store_t *st, void (*cb)(void *data), void *data);

/** "sqlite" or "postgres". */
const char *osr_store_backend(const osr_store_t *st);

/**
 * Insert a binding in state CREATING. If b->idem_key is non-empty and a row
 * with (tenant, idem_key) exists, nothing is inserted and that row is
 * returned with created = 0 (the caller compares request_hash to detect an
 * idempotency conflict). Concurrent calls with one key from any number of
 * gateways yield exactly one row (unique constraint).
 */
int osr_store_create_intent(osr_store_t *st, const osr_binding_t *b, osr_store_binding_cb cb,
                            void *data);

/** Overwrite the mutable fields of the binding with id b->id (provider,
 *  provider_id, region, isolation, endpoint, state, attempt, timestamps,
 *  end_reason, granted/error JSON). OSR_ENOTFOUND if absent. */
int osr_store_update(osr_store_t *st, const osr_binding_t *b, osr_store_done_cb cb, void *data);

/** Options of osr_store_update_ex. Zeroed = osr_store_update. */
typedef struct osr_store_update_opts_s {
  /** Compare-and-set: apply only while the stored row is in this state
   *  (0 = any state). */
  osr_binding_state_t if_state;
  /** ... and only while its updated_ms equals this (0 = any): the version
   *  a caller read, so an update built from a stale read cannot win. */
  int64_t if_updated_ms;
  /** Appended to the audit log in the same transaction as the update, and
   *  only if the update applied (NULL = none). Copied at call time. */
  const struct osr_audit_event_s *audit;
  /** The commit need not wait for the database's disk (PostgreSQL: SET
   *  LOCAL synchronous_commit = off, in a transaction of its own, never
   *  shared with a request that did not ask for it; SQLite: no effect). A
   *  database crash may then lose this update (and its audit event) after
   *  it was reported done. Only for a write that a recovery path restores
   *  when it is lost: the create's binding update (create.c, "Relaxed
   *  binding commit"). It may commit before strict requests submitted
   *  earlier in the same loop turn. */
  int relaxed;
} osr_store_update_opts_t;

/** osr_store_update with options. With a condition (if_state or
 *  if_updated_ms) the outcome is decided by the database in one statement
 *  (UPDATE ... WHERE id = ? AND state = ? AND updated_ms = ?): of several
 *  conditional updates racing on one row from any number of gateways,
 *  exactly one sees status 0 and the others OSR_ECONFLICT (the row exists
 *  but no longer matches) or OSR_ENOTFOUND (no such row). The audit event,
 *  if any, is written only for the winner, atomically with its update, and
 *  costs no extra transaction. */
int osr_store_update_ex(osr_store_t *st, const osr_binding_t *b, const osr_store_update_opts_t *o,
                        osr_store_done_cb cb, void *data);

/** Get by id; `tenant` NULL = any tenant (admin, reaper). OSR_ENOTFOUND if
 *  absent or another tenant's. */
int osr_store_get(osr_store_t *st, const char *tenant, const char *id, osr_store_binding_cb cb,
                  void *data);

typedef struct osr_store_query_s {
  const char *tenant;               /**< NULL = all tenants */
  unsigned state_mask;              /**< bit (1 << state); 0 = all */
  const char *const *meta_keys;     /**< metadata equality filters */
  const char *const *meta_values;
  size_t nmeta;
  const char *cursor;               /**< from a previous page; NULL = first */
  size_t limit;                     /**< 1..1000, default 100 */
  int64_t expires_before_ms;        /**< expires_ms != 0 && < this; 0 = off */
  /** reaper: only rows whose TTL or idle timeout has passed at this time
   *  (expires_ms != 0 && expires_ms <= t, or idle_timeout_ms != 0 &&
   *  last_activity_ms != 0 && last_activity_ms + idle_timeout_ms <= t);
   *  0 = off */
  int64_t due_at_ms;
  const char *owner;                /**< only rows with this owner; NULL = any */
  int64_t created_before_ms;        /**< only rows with created_ms < this; 0 = off */
  /** Maintenance read (the reaper's pages): may wait behind every other
   *  request. Runs on the store's background worker, with its own
   *  connection and a low CPU priority, never in a transaction with other
   *  requests (store.c, "Background reads"). */
  int background;
} osr_store_query_t;

/** List bindings ordered by (created_ms, id); next_cursor NULL on the last page. */
int osr_store_list(osr_store_t *st, const osr_store_query_t *q, osr_store_list_cb cb, void *data);

/** Row counts per state: counts[s] for s in 1..OSR_BINDING_LOST (index 0
 *  unused), n = OSR_BINDING_LOST + 1. Valid during the call. */
typedef void (*osr_store_counts_cb)(int status, const uint64_t *counts, size_t n, void *data);

/** Count bindings by state (one GROUP BY query, for the sandboxes{state}
 *  gauge); `tenant` NULL = all tenants. Always a background read (see
 *  osr_store_query_t.background). */
int osr_store_count_by_state(osr_store_t *st, const char *tenant, osr_store_counts_cb cb,
                             void *data);

/** Record data-plane activity (idle tracking); cheap, batched. */
int osr_store_touch(osr_store_t *st, const char *id, int64_t at_ms, osr_store_done_cb cb,
                    void *data);

/* ---- tenants and API keys ------------------------------------------------ */

typedef enum osr_role_e { OSR_ROLE_TENANT = 1, OSR_ROLE_ADMIN = 2 } osr_role_t;

typedef struct osr_api_key_s {
  char key_id[24];                  /**< public id, e.g. "k_3f9a..." */
  char tenant[OSR_TENANT_MAX];
  osr_role_t role;
  char hash[65];                    /**< SHA-256 hex of the secret; the secret is never stored */
  char name[OSR_NAME_MAX];
  int64_t created_ms;
  int64_t revoked_ms;               /**< 0 = active */
} osr_api_key_t;

typedef void (*osr_store_key_cb)(int status, const osr_api_key_t *k, void *data);
typedef void (*osr_store_keys_cb)(int status, const osr_api_key_t *k, size_t n, void *data);

int osr_store_key_put(osr_store_t *st, const osr_api_key_t *k, osr_store_done_cb cb, void *data);
/** Look up an active key by its hash. OSR_ENOTFOUND if unknown or revoked. */
int osr_store_key_lookup(osr_store_t *st, const char *hash, osr_store_key_cb cb, void *data);
/** A tenant's keys (NULL = all), revoked ones included, oldest first, at
 *  most 1000. */
int osr_store_key_list(osr_store_t *st, const char *tenant, osr_store_keys_cb cb, void *data);
int osr_store_key_revoke(osr_store_t *st, const char *key_id, int64_t at_ms, osr_store_done_cb cb,
                         void *data);

/* ---- audit log (append-only) ----------------------------------------------- */

typedef struct osr_audit_event_s {
  int64_t seq;                      /**< assigned by the store */
  int64_t at_ms;
  char tenant[OSR_TENANT_MAX];
  char actor[64];                   /**< key id, "reaper", "system" */
  char action[32];                  /**< "create", "kill", "timeout", "reap.ttl", ... */
  char sandbox_id[OSR_ID_MAX];
  char outcome[32];                 /**< "ok" or an error code */
  char *detail_json;                /**< optional JSON object; owned */
} osr_audit_event_t;

typedef void (*osr_store_audit_cb)(int status, const osr_audit_event_t *ev, size_t n,
                                   const char *next_cursor, void *data);

int osr_store_audit_append(osr_store_t *st, const osr_audit_event_t *ev, osr_store_done_cb cb,
                           void *data);
/** A tenant's events (NULL = all), newest first, paginated. */
int osr_store_audit_list(osr_store_t *st, const char *tenant, const char *cursor, size_t limit,
                         osr_store_audit_cb cb, void *data);

/** Round-trip latency of the last completed store call in microseconds (metrics). */
uint64_t osr_store_last_latency_us(const osr_store_t *st);

/** Where the request whose callback is running spent its time (uv_hrtime in
 * µs): submitted on the loop, its batch's transaction started and ended on a
 * worker, its result delivered on the loop. Valid inside a store callback
 * only; for trace-level latency profiles. */
typedef struct osr_store_timing_s {
  uint64_t submitted_us, batch_start_us, batch_end_us, delivered_us;
} osr_store_timing_t;
const osr_store_timing_t *osr_store_last_timing(const osr_store_t *st);

/** Counters since the store was opened (any thread may read them; each is
 *  exact, the set is not one snapshot). */
typedef struct osr_store_stats_s {
  uint64_t transactions;    /**< transactions run, retries included */
  uint64_t requests;        /**< requests answered by a worker */
  uint64_t row_statements;  /**< multi-row statements (creates or updates of one batch) */
  uint64_t rows;            /**< requests those statements carried */
  uint64_t split_batches;   /**< batches rolled back and rerun one request at a time */
  uint64_t one_flush;       /**< transactions sent with their COMMIT in one round trip (PostgreSQL) */
  uint64_t wal_restarts;    /**< SQLite: times the WAL started over from its first frame */
  /** SQLite: the writer's copies before a start-over of the WAL (docs/gateway.md "SQLite
   *  checkpoints") after which the WAL did not start over, because a reader's snapshot
   *  still used it; each one stalled the store queue for nothing. */
  uint64_t wal_restart_misses;
} osr_store_stats_t;
void osr_store_stats(const osr_store_t *st, osr_store_stats_t *out);

#endif
