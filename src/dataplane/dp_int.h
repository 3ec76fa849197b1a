/*
 * Data plane internals shared by dataplane.c (server, auth, keys,
 * revocations), route.c (pure request routing, unit-testable) and proxy.c
 * (upstream pools, request forwarding, port tunnels, splicing).
 */
#ifndef OSR_DATAPLANE_DP_INT_H
#define OSR_DATAPLANE_DP_INT_H

#include <stdint.h>
#include <string.h>
#include <uv.h>

#include "dataplane/dataplane.h"
#include "dataplane/dp_activity.h"
#include "net/http.h"
#include "token/token.h"
#include "util/text.h"

#define OSR_DP_MOD "dataplane"

/* ---- routing (route.c, pure) ----------------------------------------------- */

#define OSR_DP_SID_MAX 40 /* as osr_token_claims_t.sandbox_id */

typedef enum dp_via_e {
  DP_VIA_HEADERS = 1, /* E2b-Sandbox-Id / E2b-Sandbox-Port */
  DP_VIA_HOST = 2,    /* <port>-<id>.<domain> */
  DP_VIA_PATH = 3,    /* /sbx/<id>/<port>/<rest> */
} dp_via_t;

typedef struct dp_route_s {
  dp_via_t via;
  char sandbox_id[OSR_DP_SID_MAX];
  uint16_t port;
  /** Path and query to send upstream: the request's own, or for the path
   *  form what follows /sbx/<id>/<port>; never includes access_token. */
  osr_iovec_t path;  /* slice of the request, starts with '/' */
  osr_iovec_t query; /* slice of the request (without '?'), may be empty */
} dp_route_t;

/** Route a request (see docs/dataplane.md for the precedence). `domain` may
 *  be NULL. Returns 0, OSR_ENOENT when the request names no sandbox, or
 *  OSR_EINVAL for a malformed id or port. */
int osr__dp_route(const osr_http_req_t *req, const char *domain, dp_route_t *out);

typedef enum dp_tok_src_e {
  DP_TOK_NONE = 0,
  DP_TOK_HEADER = 1, /* X-Access-Token */
  DP_TOK_BEARER = 2, /* Authorization: Bearer */
  DP_TOK_QUERY = 3,  /* ?access_token= (browsers' WebSocket) */
} dp_tok_src_t;

/** Find the client's token. The query form is returned still
 *  percent-encoded; tokens are base64url and '.', which need no escaping. */
dp_tok_src_t osr__dp_token(const osr_http_req_t *req, osr_iovec_t *tok);

/** The scope a request needs: envd paths map to exec / files, every other
 *  port to ports. Returns 0 and *scope (0 = any valid token for the
 *  sandbox: /health), or OSR_EACCES for paths the data plane never
 *  forwards (/_osr/ on the envd port: the agent's own extensions). */
int osr__dp_scope(uint16_t port, osr_iovec_t path, unsigned *scope);

/** Write `path` + ("?" + query minus every access_token parameter) into out
 *  (NUL-terminated). Returns the length or OSR_E2BIG. */
int osr__dp_target(osr_iovec_t path, osr_iovec_t query, char *out, size_t outlen);

/** Turn a token's agent endpoint ("unix:/p", "http://h:p", "https://h[:p]",
 *  or a bare net/addr.h address) into a connect address and TLS flag.
 *  Returns 0 or OSR_EINVAL. */
int osr__dp_endpoint(const char *ep, char *addr, size_t addrlen, int *tls);

/** FNV-1a of a NUL-terminated string: the hash of the data plane's small
 *  per-sandbox and per-endpoint tables (not keyed: the keys are our own
 *  ids and addresses, bounded tables). */
static inline uint32_t osr__dp_hash_str(const char *s)
{
  return osr_fnv1a_str(s);
}

/* ---- the data plane object (dataplane.c) ----------------------------------- */

typedef struct dp_pool_s dp_pool_t;
typedef struct dp_stream_s dp_stream_t;
typedef struct dp_splice_s dp_splice_t;

#define DP_POOL_BUCKETS 256

struct osr_dataplane_s {
  uv_loop_t *loop;
  osr_dataplane_config_t cfg; /* strings point into `strings` */
  char *strings;
  osr_http_server_t *srv[OSR_DP_MAX_LISTEN];
  size_t nsrv;
  osr_tls_ctx_t *tls;        /* server context (--tls-cert) */
  osr_tls_ctx_t *client_tls; /* for https:// agent endpoints and keys URLs */
  osr_keyring_t *kr_owned;   /* keys_dir / keys_url keyring */
  const osr_keyring_t *kr;   /* what requests verify with; NULL = not loaded */
  osr_revocations_t *rev;
  struct osr_token_cache_s *tcache; /* verified tokens (token/cache.h) */
  uint8_t agent_secret[32]; /* cfg.agent_secret points here when set */
  struct osr_redis_s *redis;
  uv_timer_t keys_timer;
  uv_timer_t pool_timer;
  int keys_busy; /* a keys load/fetch is in flight */
  /* upstream connection pools by endpoint (proxy.c) */
  dp_pool_t *pools[DP_POOL_BUCKETS];
  /* connect caps per agent endpoint, with their FIFO wait queues (proxy.c) */
  struct dp_gate_s *gates[DP_POOL_BUCKETS];
  dp_splice_t *splices; /* live spliced tunnels (for stop) */
  struct dp_exec_s *execs; /* live exec console sessions (exec.c, for stop) */
  struct dp_mux_s *mux;    /* shared exec connections (exec_mux.c) */
  size_t nstreams;
  size_t nsplices;
  /* counters (logged at stop; tests read the log) */
  uint64_t n_requests, n_refused, n_forwarded, n_upstream_fail;
  /* activity reports, endpoint refresh, GET /metrics (dp_activity.h) */
  dp_activity_t *activity;
  dp_epcache_t *epcache;
  struct dp_upcache_s *upcache; /* opened upstream credentials (upstream.c) */
  dp_metrics_t m;
  /* stop */
  int stopping;
  int closing_handles;
  size_t srv_open; /* servers not yet closed */
  void (*stop_cb)(void *data);
  void *stop_data;
};

/** Answer with a JSON error {"code":status,"message":msg} (E2B shape, with
 *  "sandboxId" when sid is non-NULL). */
void osr__dp_error(osr_http_req_t *req, int status, const char *sid, const char *msg);

/** As osr__dp_error with a machine-readable "type" member (e.g.
 *  "upstream_busy" for the connect cap's 503). */
void osr__dp_error_typed(osr_http_req_t *req, int status, const char *sid, const char *type,
                         const char *msg);

/** Called by proxy.c when the last stream/splice is gone while stopping. */
void osr__dp_maybe_finish(osr_dataplane_t *dp);

/* ---- upstream credentials (upstream.c) ------------------------------------- */

/** A remote provider's sandbox (E2B), opened from the sealed credential in
 *  its agent endpoint (token.h "upstream credentials"): requests go to the
 *  provider's own envd and ports with the provider's token, never the
 *  client's. */
typedef struct dp_upstream_s {
  char host[300];    /* "<providerSandboxId>.<domain>": Host = "<port>-" host */
  char token[400];   /* envd's X-Access-Token ("" = none) */
  char traffic[200]; /* e2b-traffic-access-token for other ports ("" = none) */
  int by_host;       /* the endpoint is the Host form itself: connect per port */
} dp_upstream_t;

/** If `ep` carries a sealed credential, open it with the agent token of
 *  `sid` into *up and return 1; 0 if it carries none; OSR_EINVAL if it
 *  cannot be opened (no agent secret, wrong key, tampered). Opened
 *  credentials are memoised per (sid, sealed text): see upstream.c. */
int osr__dp_upstream_open(osr_dataplane_t *dp, const char *ep, const char *sid, dp_upstream_t *up);

/** Drop the opened credentials of `sid` (its tokens were revoked) / all
 *  (stop). */
void osr__dp_upstream_forget(osr_dataplane_t *dp, const char *sid);
void osr__dp_upstream_free(osr_dataplane_t *dp);

/** The connect address for `port` of an upstream sandbox: "<port>-<host>:443"
 *  in the Host form, else `addr` (an override such as E2B_SANDBOX_URL's)
 *  unchanged. Returns 0 or OSR_E2BIG. */
int osr__dp_upstream_addr(const dp_upstream_t *up, uint16_t port, char *addr, size_t addrlen);

/* ---- forwarding (proxy.c) --------------------------------------------------- */

/** Forward an authorised request to `addr` (the agent's connect address).
 *  port OSR_DP_ENVD_PORT: the agent's own API; else a tunnel to that port.
 *  `target` is copied. Answers the request in every case. */
void osr__dp_forward(osr_dataplane_t *dp, osr_http_req_t *req, const char *addr, int tls,
                     uint16_t port, const char *target, const char *sid, dp_tok_src_t tok_src);
/** Same, to a remote provider's sandbox `up` (copied): every port is a
 *  direct HTTP exchange with the provider's Host form and credential. */
void osr__dp_forward_upstream(osr_dataplane_t *dp, osr_http_req_t *req, const char *addr, int tls,
                              uint16_t port, const char *target, const char *sid,
                              dp_tok_src_t tok_src, const dp_upstream_t *up);

/** Close idle pooled connections older than `max_idle_ms` (all with 0), and
 *  answer 503 to requests that waited too long for a connect slot (all of
 *  them with 0: stop). */
void osr__dp_pools_sweep(osr_dataplane_t *dp, uint64_t max_idle_ms);

/** Close every spliced tunnel (stop deadline). */
void osr__dp_splices_close(osr_dataplane_t *dp);

#endif
