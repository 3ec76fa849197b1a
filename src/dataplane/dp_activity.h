/*
 * Data plane: activity reports (activity.c), agent endpoint refresh
 * (endpoint.c) and GET /metrics (dp_metrics.c). Private to the data plane;
 * the behaviour is documented in docs/dataplane.md.
 *
 * Activity: every request stream and spliced tunnel holds a dp_act_t of
 * its sandbox from start to end (osr__dp_act_open / osr__dp_act_close). A
 * sandbox is "active" in an interval when a stream started or ended in it
 * or one is still open; each active sandbox is reported once when the
 * interval ends. Open streams count even when no byte moves: an idle
 * WebSocket console or a long `sleep` command streaming nothing keeps its
 * sandbox alive (the absolute TTL still bounds it).
 */
#ifndef OSR_DATAPLANE_DP_ACTIVITY_H
#define OSR_DATAPLANE_DP_ACTIVITY_H

#include <stddef.h>
#include <stdint.h>

typedef struct osr_dataplane_s osr_dataplane_t;
typedef struct dp_activity_s dp_activity_t;
typedef struct dp_epcache_s dp_epcache_t;

/** One tracked sandbox. Owned by the table; a holder (open > 0) keeps it
 *  from being freed, so streams may keep the pointer until they close. */
typedef struct dp_act_s {
  struct dp_act_s *next; /* hash chain */
  uint32_t open;         /* live streams and tunnels */
  uint64_t last_uv;      /* uv_now() of the latest start/end; 0 = none since reported */
  int64_t retry_ms;      /* unix ms from a report that failed, 0 = none */
  char sid[40];
} dp_act_t;

/* ---- metrics (dp_metrics.c) ---------------------------------------------- */

typedef enum dp_kind_e {
  DP_KIND_NONE = 0, /* answered before a sandbox was known (or /metrics) */
  DP_KIND_ENVD,     /* port 49983: the agent's API */
  DP_KIND_PORT,     /* any other port, request by request */
  DP_KIND_UPGRADE,  /* an upgrade (WebSocket) to a port */
  DP_KIND_N
} dp_kind_t;

typedef enum dp_auth_e {
  DP_AUTH_MISSING = 0,
  DP_AUTH_MALFORMED,
  DP_AUTH_SIGNATURE,
  DP_AUTH_EXPIRED,
  DP_AUTH_UNKNOWN_KEY,
  DP_AUTH_REVOKED,
  DP_AUTH_SANDBOX,
  DP_AUTH_SCOPE,
  DP_AUTH_PORT,
  DP_AUTH_N
} dp_auth_t;

typedef struct dp_metrics_s {
  uint64_t requests[DP_KIND_N][6]; /* [kind][status / 100], 0 = anything else */
  uint64_t auth_fail[DP_AUTH_N];
  uint64_t bytes_in;  /* request bodies, client -> sandbox */
  uint64_t bytes_out; /* response bodies, sandbox -> client */
  uint64_t act_reports, act_failed, act_dropped, act_sandboxes;
  uint64_t ep_lookups, ep_lookup_fail, ep_from_cache;
  uint64_t exec_reattach; /* exec streams re-attached after a shared connection died */
} dp_metrics_t;

/** Count an answered request. */
void osr__dp_count(osr_dataplane_t *dp, dp_kind_t kind, int status);
/** Count a refused token by its OSR_ETOKEN_* code (0 = missing). */
void osr__dp_count_auth(osr_dataplane_t *dp, int token_err);
/** GET /metrics (Prometheus text 0.0.4); answers req. */
struct osr_http_req_s;
void osr__dp_metrics_answer(osr_dataplane_t *dp, struct osr_http_req_s *req);

/* ---- activity (activity.c) ----------------------------------------------- */

/** Set up from dp->cfg (after Redis exists); starts the flush timer. */
void osr__dp_activity_start(osr_dataplane_t *dp);
/** Stop: a last in-process flush, close the timer, cancel a send in
 *  flight. Holds dp->closing_handles until all of that is over. */
void osr__dp_activity_stop(osr_dataplane_t *dp);
/** Free what is left (from dp_free). */
void osr__dp_activity_free(osr_dataplane_t *dp);
/** A stream/tunnel of `sid` starts: returns its entry (open + 1), or NULL
 *  when the table is full (counted; the stream just goes unreported). */
dp_act_t *osr__dp_act_open(osr_dataplane_t *dp, const char *sid);
/** The stream ended (a NULL act is ignored). */
void osr__dp_act_close(osr_dataplane_t *dp, dp_act_t *act);

/* ---- endpoint refresh (endpoint.c) ---------------------------------------- */

/** With Redis: the agent endpoint to use for `sid` instead of the token's,
 *  from the in-process cache (fresh for cfg.endpoint_ttl_ms). A miss or a
 *  stale entry starts a background lookup in the Redis binding cache and
 *  returns what is known now (NULL = use the token's). */
const char *osr__dp_endpoint_for(osr_dataplane_t *dp, const char *sid);
/** Forget a sandbox (invalidation). */
void osr__dp_endpoint_forget(osr_dataplane_t *dp, const char *sid);
/** Free the cache; lookups in flight find it gone (dp->stopping). */
void osr__dp_endpoint_free(osr_dataplane_t *dp);

#endif
