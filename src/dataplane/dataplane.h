/*
 * osr-dataplane: the direct-connect hot path (issue 5, docs/dataplane.md).
 *
 * SDKs, browsers and terminals connect here with a binding token the
 * control plane signed (src/token/token.h). The data plane verifies it
 * offline, picks the sandbox and port from the request (E2B routing
 * headers, the Host form <port>-<id>.<domain>, or the path form
 * /sbx/<id>/<port>/<rest>), and streams the exchange to the sandbox's agent
 * (osr-agent, the envd contract) without ever calling the gateway:
 *   - port 49983 (envd): each request is forwarded over a pooled keep-alive
 *     HTTP/1.1 connection to the agent endpoint named by the token;
 *   - any other port: each request is forwarded over a pooled tunnel
 *     (agent `GET /_osr/ports/{port}`, `Upgrade: osr-tcp`); an HTTP/1.1
 *     Upgrade request (WebSocket) gets its own tunnel and, after the
 *     sandbox's 101, the two sockets are spliced byte for byte.
 * Bodies are never copied between the two sides: a chunk is held where it
 * was read (osr_http_req_hold / osr_http_creq_hold, sock->input) until the
 * other side wrote it, which is also the backpressure.
 *
 * Library use: `osr serve` embeds it by calling osr_dataplane_start() on its
 * own loop and osr_dataplane_stop() on shutdown. The executable
 * (dataplane/main.c) is a thin flag parser around the same two calls.
 */
#ifndef OSR_DATAPLANE_DATAPLANE_H
#define OSR_DATAPLANE_DATAPLANE_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "osr/common.h"

typedef struct osr_dataplane_s osr_dataplane_t;
typedef struct osr_keyring_s osr_keyring_t;

/** The envd port of the E2B contract: traffic for it goes to the agent's
 *  own HTTP API instead of through a port tunnel. */
#define OSR_DP_ENVD_PORT 49983

#define OSR_DP_MAX_LISTEN 8

typedef struct osr_dataplane_config_s {
  /** Listen addresses (net/addr.h forms, port 0 allowed); at least one. */
  const char *listen[OSR_DP_MAX_LISTEN];
  size_t nlisten;
  /** Public keys: a directory of "<kid>.pub"/"<kid>.key" files (the
   *  gateway's <data_dir>/keys), re-read every keys_refresh_ms... */
  const char *keys_dir;
  /** ...or a URL answering the keyring's public JSON
   *  (osr_keyring_public_json), fetched at start and every keys_refresh_ms.
   *  http:// or https:// (verified with the system CA store). */
  const char *keys_url;
  /** ...or a keyring the embedder owns (osr serve: the gateway's own);
   *  borrowed, must outlive the data plane. Takes precedence. */
  const osr_keyring_t *keyring;
  uint64_t keys_refresh_ms; /**< default 60000 */
  /** Redis URL for revocations (the gateway's invalidation channel);
   *  NULL = none (then the token's lifetime bounds a kill's window). */
  const char *redis_url;
  const char *redis_prefix; /**< default "osr:" as the gateway's */
  /** Sandbox domain for the Host form "<port>-<id>.<domain>" and for
   *  "sandbox.<domain>" (header routing); NULL = Host form off. */
  const char *domain;
  const char *tls_cert; /**< PEM; with tls_key: HTTPS + h2 by ALPN */
  const char *tls_key;
  size_t max_conns;          /**< client connections per listener, default 10000 */
  uint64_t max_body;         /**< request body cap, default 1 TiB (streamed) */
  size_t pool_idle_max;      /**< idle upstream connections kept per endpoint, default 256 */
  uint64_t upstream_idle_ms; /**< upstream silent this long fails, default 300000 */
  int64_t token_leeway_s;    /**< clock skew allowed on expiry, default 5 */
  /** (Additive.) The agent secret, 32 bytes (copied): every upstream
   *  request and tunnel handshake carries X-Access-Token: hex(HMAC-SHA256(
   *  secret, sandbox id)) (token.h osr_agent_token), what the gateway
   *  started the agent with. NULL = send none (agents running open). */
  const uint8_t *agent_secret;

  /* (Additive.) Activity reports for idle timeouts (docs/dataplane.md,
   * "Activity"). Every sandbox with traffic or an open stream/tunnel in an
   * interval is reported once at the end of it, through the first of:
   * activity_cb (in-process, `osr serve`), Redis (redis_url: the hash the
   * gateways drain), gateway_url (POST /v1/internal/activity). */
  uint64_t activity_interval_ms; /**< default 5000 */
  size_t activity_max;           /**< sandboxes tracked at once, default 100000 */
  /** Called on the loop thread for each active sandbox at the end of each
   *  interval; must not block. NULL = use Redis / gateway_url. */
  void (*activity_cb)(void *data, const char *sandbox_id, int64_t at_ms);
  void *activity_data;
  /** HTTP fallback (or the only transport without Redis): a gateway's base
   *  URL, http:// or https://, and the key it accepts (the admin key). */
  const char *gateway_url;
  const char *gateway_key;
  /** Agent endpoint refresh (docs/dataplane.md, "Endpoint refresh"): with
   *  redis_url, endpoints are read from the binding cache and kept this
   *  long in process; default 2000. */
  uint64_t endpoint_ttl_ms;
  /** Bearer key for GET /metrics; NULL = open (bind to a private address). */
  const char *metrics_key;
  /* (Additive.) Exec upstreams multiplexed over shared h2c connections per
   * agent endpoint (docs/dataplane.md "How exec upstreams are
   * multiplexed"). */
  int exec_mux_off;          /**< 1: one HTTP/1.1 connection per stream and call, as before */
  size_t exec_mux_conns;     /**< shared connections per agent endpoint, default 64 */
  size_t exec_mux_sessions;  /**< exec sessions per connection, default 512 */
  uint64_t exec_mux_idle_ms; /**< a connection without sessions closes after, default 30000 */
} osr_dataplane_config_t;

/**
 * Start serving on `loop`. Synchronous parts (listening, reading the TLS
 * certificate, the first --keys-dir load) happen before this returns: call
 * it at start-up, not from a request handler. The keys URL is fetched in
 * the background; until the first keyring arrives every request gets 503.
 * Returns 0 and *out, or an error with a message logged and nothing left
 * running. `cfg` is copied (strings too); `cfg->keyring` is borrowed.
 */
int osr_dataplane_start(uv_loop_t *loop, const osr_dataplane_config_t *cfg, osr_dataplane_t **out);

/** Port of the n-th listener (for "port 0" in tests), or -1. */
int osr_dataplane_port(const osr_dataplane_t *dp, size_t n);

/** Live client connections (all listeners). */
size_t osr_dataplane_nconns(const osr_dataplane_t *dp);

/**
 * Stop: close the listeners, give in-flight exchanges `grace_ms` to finish
 * (spliced tunnels are closed at the deadline), close the Redis client and
 * the upstream pools, then call cb (once, on the loop thread) and free dp.
 */
void osr_dataplane_stop(osr_dataplane_t *dp, uint64_t grace_ms, void (*cb)(void *data), void *data);

#endif
