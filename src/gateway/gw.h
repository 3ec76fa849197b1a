/*
 * The gateway context shared by every gateway module, and its configuration.
 *
 * Configuration precedence (lowest to highest): built-in defaults, the YAML
 * file (--config FILE or OSR_CONFIG), environment variables (OSR_*), flags.
 * Secrets (admin key, provider credentials) are referenced, never inlined in
 * logs: YAML values of the form {env: NAME} or {file: PATH} are resolved at
 * load time and the resolved values are never logged.
 */
#ifndef OSR_GATEWAY_GW_H
#define OSR_GATEWAY_GW_H

#include <jansson.h>
#include <stdint.h>
#include <uv.h>

#include "cache/redis.h"
#include "gateway/breaker.h"
#include "gateway/placement.h"
#include "net/http.h"
#include "store/store.h"
#include "token/token.h"

#define OSR_GW_LISTEN_MAX 8

typedef struct osr_gw_config_s {
  const char *listen[OSR_GW_LISTEN_MAX]; /**< API listeners; default 127.0.0.1:7070 (OSR_LISTEN) */
  size_t nlisten;
  const char *dataplane_listen;  /**< default 127.0.0.1:7071 (OSR_DATAPLANE_LISTEN) */
  const char *dataplane_url;     /**< public data-plane URL put in create answers;
                                      default http://<dataplane_listen> */
  const char *tls_cert, *tls_key;
  const char *data_dir;          /**< default $HOME/.local/share/osr (OSR_DATA_DIR) */
  const char *store_url;         /**< default sqlite:<data_dir>/osr.db (OSR_STORE) */
  const char *redis_url;         /**< NULL = no Redis (OSR_REDIS) */
  const char *admin_key;         /**< OSR_ADMIN_KEY, else generated at first start into
                                      <data_dir>/admin.key (mode 0600) */
  json_t *providers;             /**< array of {name, type, ...adapter config}; default
                                      [{name:"sim",type:"sim"}] (OSR_PROVIDERS: JSON or a
                                      comma list of types) */
  osr_policy_t default_policy;
  json_t *price_overrides;       /**< {provider: {vcpu_per_s, gib_per_s, ...}} or NULL */
  uint32_t default_timeout_s;    /**< TTL when a create gives none; default 300 */
  uint32_t max_timeout_s;        /**< default 86400 */
  uint64_t token_ttl_s;          /**< binding token lifetime; default 3600 */
  const char *token_keys_dir;    /**< signing keys (tokens.keys_dir); default <data_dir>/keys */
  osr_breaker_config_t breaker;
  uint64_t reaper_interval_ms;   /**< default 5000 */
  uint64_t reaper_reconcile_ms;  /**< reaper.reconcile_interval_ms: the providers are listed on a
                                      pass at most this often (and on the first pass, and on every
                                      osr_reaper_run_once pass); 0 = 12 x reaper_interval_ms */
  uint64_t drain_ms;             /**< default 10000 */
  size_t max_request_body;       /**< API JSON bodies; default 1 MiB */
  osr_http_limits_t http_limits;
  const char *config_file;       /**< the file that was loaded, or NULL */
  const char *instance_id;       /**< this gateway's identity in the shared store (bindings.owner):
                                      instance_id / OSR_INSTANCE_ID / --instance-id; default
                                      "gw-" + first 16 hex of SHA-256(hostname "\n" data_dir),
                                      stable across restarts. At most 63 chars [A-Za-z0-9._:-] */
  uint64_t stale_creating_ms;    /**< reaper.stale_creating_ms: a binding still creating after
                                      this long is resolved by any gateway (its owner is presumed
                                      dead); default 120000 = 2x the create deadline */
  const char *e2b_domain;        /**< e2b.domain / OSR_E2B_DOMAIN / --e2b-domain: the `domain`
                                      the E2B front door answers (host[:port], never one of
                                      E2B's own domains; checked at load). NULL = derive it
                                      (osr_gw_e2b_domain) */
  /* private: memory owned by the config (strings point into it) */
  json_t *_owned;
} osr_gw_config_t;

/** The reaper's interval and its provider listings' as in force (defaults
 *  applied): 5 s, and 12 passes, 60 s, unless configured. */
static inline uint64_t osr_reaper_interval_ms(const osr_gw_config_t *cfg)
{
  return cfg->reaper_interval_ms ? cfg->reaper_interval_ms : 5000;
}

static inline uint64_t osr_reaper_reconcile_ms(const osr_gw_config_t *cfg)
{
  return cfg->reaper_reconcile_ms ? cfg->reaper_reconcile_ms : 12 * osr_reaper_interval_ms(cfg);
}

/** Load defaults, then the YAML file, then environment, then flags (argv
 *  after the program/subcommand name). Returns 0; 1 if --help was printed;
 *  OSR_EINVAL with a human message in err (name the flag/key and what is
 *  wrong). */
int osr_gw_config_load(osr_gw_config_t *cfg, int argc, char **argv, char *err, size_t errlen);
void osr_gw_config_dispose(osr_gw_config_t *cfg);
/** Why `d` cannot be the E2B domain (a static message), or NULL when it can:
 *  a host name of [A-Za-z0-9.-] with an optional :port, under 256 bytes, and
 *  not one of E2B's own domains (e2b.app, e2b.dev, e2b.pro, e2b-staging.dev or
 *  a subdomain: the SDKs would send sandbox traffic to E2B). */
const char *osr_gw_e2b_domain_problem(const char *d);

/** The effective E2B domain into out (NUL-terminated; "" = none, the SDK
 *  then uses its own default): cfg->e2b_domain when set, else the host[:port]
 *  of cfg->dataplane_url when that host is a DNS name that can carry a
 *  wildcard (not an IP literal, not "localhost", not one of E2B's). Used by
 *  the E2B front door's answers and by `osr serve` for its data plane's Host
 *  form. Returns 0, or OSR_EINVAL when out is too small. */
int osr_gw_e2b_domain(const osr_gw_config_t *cfg, char *out, size_t outlen);

/** The flags/env table as help text (for --help and docs). */
void osr_gw_config_usage(FILE *f, const char *prog);

/** The effective configuration as JSON (the YAML schema's shape, every
 *  default filled in) with every secret replaced: the admin key and resolved
 *  {env:}/{file:} credentials show as {"env"|"file": NAME, "value":
 *  "<redacted>"}, provider string values whose key looks secret ("key",
 *  "token", "secret", "password", ...) as "<redacted>", and passwords inside
 *  store/Redis URLs as "<redacted>". For `osr doctor`, `osr serve
 *  --print-config` and debug output. Returns a new reference. */
json_t *osr_gw_config_to_json_redacted(const osr_gw_config_t *cfg);

/** The bounded YAML reader behind osr_gw_config_load, exposed for tests and
 *  the fuzzer: one YAML document of at most 1 MiB, nesting <= 32, <= 10,000
 *  nodes, no anchors/aliases/custom tags; plain scalars typed by the YAML 1.2
 *  core schema, quoted ones are strings. Returns 0 and *out (a new
 *  reference; JSON null for an empty document) or OSR_EINVAL with
 *  "line N: what" in err (OSR_ENOMEM if libyaml could not start). */
int osr_gw_config_parse_yaml(const char *buf, size_t len, json_t **out, char *err, size_t errlen);

typedef struct osr_providers_s osr_providers_t; /* gateway/providers.h */
typedef struct osr_metrics_s osr_metrics_t;     /* gateway/metrics.h */
typedef struct osr_reaper_s osr_reaper_t;       /* gateway/reaper.h */
typedef struct osr_gw_api_s osr_gw_api_t;       /* gateway/api.c: auth cache */

typedef struct osr_gw_s {
  uv_loop_t *loop;
  const osr_gw_config_t *cfg;
  osr_store_t *store;
  osr_redis_t *redis;            /**< NULL when not configured; may be disconnected */
  osr_providers_t *providers;
  osr_metrics_t *metrics;
  osr_reaper_t *reaper;
  osr_http_server_t *http;
  osr_gw_api_t *api;             /**< API module state (osr_gw_api_init) */
  osr_keyring_t *keyring;        /**< token signing keys (osr_gw_keyring_open); NULL = none */
  /** (Additive.) The agent secret (<token_keys_dir>/agent.secret, token.h
   *  osr_agent_token): every create passes the derived agent token. */
  uint8_t agent_secret[32];
  int has_agent_secret;
  /** The same secret's HMAC pad states (osr_agent_key_new), made on the
   *  loop at the first create that needs it; freed with the gateway. */
  osr_agent_key_t *agent_key;
  char admin_key_hash[65];       /**< SHA-256 hex of the admin key */
  int64_t started_ms;
  int draining;
  uint64_t inflight_creates;
} osr_gw_t;

/** Wall-clock now in unix milliseconds. */
int64_t osr_now_ms(void);

/** SHA-256 of `len` bytes as 64 lower-case hex chars + NUL (BoringSSL/OpenSSL). */
void osr_sha256_hex(const void *p, size_t len, char out[65]);

/** Fill `out` with n random bytes from the TLS library's CSPRNG. */
void osr_random_bytes(void *out, size_t n);

/** A new sandbox id: 20 chars [a-z0-9], DNS-label safe (E2B host form
 *  <port>-<id>.<domain>). `out` has room for 21 bytes. */
void osr_sandbox_id_new(char out[21]);

#endif
