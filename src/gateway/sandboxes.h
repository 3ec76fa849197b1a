/*
 * Private seam between the sandbox API handlers (api_sandboxes.c), the E2B
 * front door (api_e2b.c), the create flow and crash recovery (create.c), the
 * reaper (reaper.c) and the gateway's token minting (tokens.c). Nothing here
 * is used outside those files.
 *
 * Ownership: an osr__sbx_req_t holds references into the request body (env,
 * metadata); osr__sbx_req_dispose drops them. Bindings passed to the helpers
 * are borrowed for the duration of the call.
 */
#ifndef OSR_GATEWAY_SANDBOXES_H
#define OSR_GATEWAY_SANDBOXES_H

#include <jansson.h>

#include "gateway/api.h"
#include "gateway/gw.h"
#include "gateway/placement.h"
#include "gateway/providers.h"
#include "util/buf.h"
#include "util/jsonw.h"

/* Caps on what a create request may carry (documented in openapi.json). */
#define OSR_SBX_MAP_MAX 64        /* env / metadata entries */
#define OSR_SBX_KEY_MAX 128       /* env / metadata key bytes */
#define OSR_SBX_VALUE_MAX 4096    /* env / metadata value bytes */
#define OSR_SBX_GPU_MAX 64
#define OSR_SBX_MEMORY_MAX (1u << 22) /* 4 TiB in MiB: anything larger is a typo */
#define OSR_SBX_VCPUS_MAX 1024

/* The create flow's time budget: one create never takes longer than this end
 * to end, and one provider call never longer than the per-attempt cap. */
#define OSR_CREATE_DEADLINE_MS 60000
#define OSR_CREATE_ATTEMPT_MS 30000

/** A validated POST /v1/sandboxes (or /v1/plan) body. */
typedef struct osr__sbx_req_s {
  osr_capabilities_t caps;
  osr_policy_t policy;              /**< request policy merged over the default */
  char template_id[128];
  uint32_t timeout_s;               /**< absolute TTL (default cfg->default_timeout_s) */
  uint32_t idle_timeout_s;          /**< 0 = none */
  json_t *env;                      /**< reference, or NULL */
  json_t *metadata;                 /**< reference, or NULL */
} osr__sbx_req_t;

/** Validate `body` (NULL = empty object). On error returns OSR_EINVAL with a
 *  message naming the offending field in `err`. */
int osr__sbx_req_parse(osr_gw_t *gw, const json_t *body, osr__sbx_req_t *out, char *err,
                       size_t errlen);
void osr__sbx_req_dispose(osr__sbx_req_t *r);

/** Run placement for `r`. `out` needs room for osr_providers_count() entries.
 *  Returns the number of eligible candidates (first in `out`). */
size_t osr__sbx_place(osr_gw_t *gw, const osr__sbx_req_t *r, osr_candidate_t *out);


/** 1 if `granted` covers everything `asked` asked for; otherwise 0 and the
 *  first shortfall in `why`. */
int osr__caps_cover(const osr_capabilities_t *asked, const osr_capabilities_t *granted, char *why,
                    size_t whylen);

/** Cache a binding in Redis if configured (failures are ignored: Redis is
 *  an accelerator) / drop it from the cache and tell subscribers. */
void osr__cache_put(osr_gw_t *gw, const osr_binding_t *b);
void osr__cache_invalidate(osr_gw_t *gw, const char *id);

/** Called once with the binding (borrowed for the call) or an error. */
typedef void (*osr__read_cb)(osr_gw_call_t *call, int status, const osr_binding_t *b);

/** Read the binding call->path_id for the caller's tenant (an admin sees
 *  every tenant's; another tenant's binding is OSR_ENOTFOUND, exactly like
 *  a missing one). `cached_ok` lets the answer come from Redis when it is
 *  connected (reads that only show the binding); 0 goes straight to the
 *  store (calls that act on the state: kill, timeout, tokens, E2B's).
 *  Holds `call` until cb has run. cb fires exactly once, possibly inside
 *  this call (store unavailable), with 0 and the binding, or
 *  OSR_ENOTFOUND / OSR_EUNAVAILABLE / another store error and NULL. */
void osr__read_binding(osr_gw_call_t *call, int cached_ok, osr__read_cb cb);

/** Start the create flow for a validated request (create.c). Takes `req`
 *  (the caller must not dispose it). Answers `call` when done. */
void osr__create_start(osr_gw_call_t *call, osr__sbx_req_t *req, const char *idem_key);

/** 1 while a create for sandbox `id` runs in this process (the reaper and
 *  recovery leave such bindings alone). */
int osr__create_in_flight(osr_gw_t *gw, const char *id);

/** Called once when osr__resolve_creating is done; status 0 or a store error. */
typedef void (*osr__resolve_cb)(osr_gw_t *gw, int status, void *data);

/** Resolve interrupted creates (create.c): bindings still CREATING that this
 *  instance owns (`at_start` only: recovery after our own crash) plus those
 *  of any owner created more than cfg->stale_creating_ms ago (their gateway
 *  is gone). For each, the provider it names is asked for resources carrying
 *  the sandbox id: one is adopted (row RUNNING/PAUSED), extra ones are
 *  destroyed, and a row with none is marked FAILED. Rows of a provider that
 *  cannot be listed stay creating. At start every other labelled resource is
 *  also checked for orphans ("recover.*" audit actions); from the reaper
 *  ("reap.stale_creating", "reap.orphan") that is left to its own
 *  reconciliation. Creates running in this process are skipped. cb fires
 *  exactly once (inside this call only when the store cannot be asked). */
void osr__resolve_creating(osr_gw_t *gw, int at_start, osr__resolve_cb cb, void *data);

/** Should a provider resource (the provider's id `provider_id`) labelled
 *  with a sandbox id be kept, given the binding the store has for that id
 *  (NULL if none)? Returns 1 to keep, 0 when it is an orphan to destroy
 *  (with the reason in `why`). */
int osr__resource_is_bound(const osr_binding_t *b, const char *provider, const char *provider_id,
                           const char **why);

/** Destroy a provider resource in the background; NOT_FOUND counts as done.
 *  Failures are logged. */
void osr__destroy_bg(osr_gw_t *gw, osr_provider_t *p, const char *provider_id);

/** Human text for any error the create/reaper paths meet: store codes,
 *  provider codes (OSR_PERR_*) and OSR_Exxx and libuv codes. Static storage.
 *  (osr_strerror alone hands unknown codes to uv_strerror, which allocates.) */
const char *osr__err_text(int err);

/** What a token grants (tokens.c). ttl_s 0 = cfg->token_ttl_s. */
typedef struct osr__token_req_s {
  unsigned scopes;                      /**< OSR_SCOPE_* bits */
  int all_ports;
  uint16_t ports[OSR_TOKEN_PORTS_MAX];
  size_t nports;
  uint64_t ttl_s;
} osr__token_req_t;

/** Sign a binding token for `b` into `out` (OSR_TOKEN_MAX + 1 bytes
 *  suffice): expiry = min(now + ttl, the sandbox's TTL deadline). Returns 0
 *  (and the signed claims in `claims`, if not NULL), OSR_ETOKEN_EXPIRED if
 *  the sandbox's deadline has passed, OSR_ETOKEN_UNKNOWN_KEY without a
 *  signing key, or another osr_token_sign error. */
int osr__token_mint(osr_gw_t *gw, const osr_binding_t *b, const osr__token_req_t *r, char *out,
                    size_t outlen, osr_token_claims_t *claims);

/** Called once on the loop thread with the signed token (NUL-terminated,
 *  valid during the call only) and its claims, or with status < 0 (an
 *  osr_token_sign error) and NULLs. */
typedef void (*osr__mint_cb)(int status, const char *token, const osr_token_claims_t *claims,
                             void *data);

/** osr__token_mint with the signature computed on libuv's thread pool, so
 *  the loop thread does not spend ~0.1 ms per token on Ed25519. The claims
 *  (expiry included) are fixed now from `b` and `r`, which are not used
 *  after the return. Returns 0 and cb fires exactly once, later, on the
 *  loop thread; or returns OSR_ETOKEN_EXPIRED / OSR_ETOKEN_UNKNOWN_KEY / a
 *  uv_queue_work error and cb never fires. The job cannot be cancelled; it
 *  keeps the loop alive until it is done (the keyring outlives uv_run). */
int osr__token_mint_async(osr_gw_t *gw, const osr_binding_t *b, const osr__token_req_t *r,
                          osr__mint_cb cb, void *data);

/** 1 when this process may run on one CPU only (affinity): then the thread
 *  pool cannot sign in parallel with the loop, only add two context
 *  switches per token (~15 µs of CPU per create measured pinned to one
 *  core), and the create signs on the loop thread instead, while its
 *  binding commits on the store thread. */
int osr__token_sign_inline(void);

/** An audit identity for the system's own actions ("reaper", "system"). */
void osr__auth_system(osr_gw_auth_t *a, const char *actor, const char *tenant);

/* ---- direct JSON writing (util/jsonw.h) ----------------------------------
 * The create answer, the granted capabilities and the audit details are
 * written straight into one buffer instead of being built as a jansson tree
 * and serialised: the tree cost ~70,000 instructions per answer to build and
 * as much again to dump (jansson's loop check does snprintf("%p") and a hash
 * insert per nested object). The output is byte for byte what json_dumps
 * (JSON_COMPACT) of the equivalent tree gives, so clients see no change. */

/** Capabilities as the API shows them ({gpu:{count,type}, snapshot, ports,
 *  minMemoryMiB, vcpus, region, isolation}), compact JSON. */
void osr__caps_write(osr_jw_t *w, const osr_capabilities_t *c);
/** Write osr_gw_sandbox_json(gw, b, with_token) without building it. */
void osr__sandbox_write(osr_gw_t *gw, const osr_binding_t *b, int with_token, osr_jw_t *w);
/** Answer `call` with the sandbox (osr_gw_reply of osr_gw_sandbox_json,
 *  without the tree; a call with a reshape hook gets the tree). With a
 *  token to show (with_token and a RUNNING/PAUSED sandbox) the answer is
 *  sent later, once the token has been signed on the thread pool
 *  (osr__token_mint_async; the call is held meanwhile); otherwise now.
 *  `b` is borrowed for this call only either way. */
void osr__sandbox_reply(osr_gw_call_t *call, int status, const osr_binding_t *b, int with_token);
/** The same, now, with a token signed beforehand (`tok` NULL: "token" and
 *  "tokenExpiresAt" are null). The create signs while its binding commits. */
void osr__sandbox_reply_signed(osr_gw_call_t *call, int status, const osr_binding_t *b,
                               const char *tok, const osr_token_claims_t *claims);

/** Fill an audit event as osr_gw_audit would append it, for
 *  osr_store_update_ex(.audit) (the row then commits with the change it
 *  describes). `detail_json` (may be NULL) is copied; release the event with
 *  osr__audit_event_dispose. */
void osr__audit_event(osr_audit_event_t *ev, const osr_gw_auth_t *who, const char *action,
                      const char *sandbox_id, const char *outcome, const char *detail_json);
void osr__audit_event_dispose(osr_audit_event_t *ev);

#endif
