/*
 * The gateway's HTTP API: routing, authentication, typed errors, and the
 * handlers. api.c owns the router, the error/JSON helpers and
 * authentication; api_sandboxes.c the sandbox routes; api_admin.c keys,
 * tenants and audit; metrics.c /metrics.
 *
 * Every error answer has the shape
 *   {"error":{"code":"<stable code>","message":"<human text>", ...details}}
 * with these codes and statuses: invalid_request 400, unauthorized 401,
 * forbidden 403, not_found 404, method_not_allowed 405,
 * idempotency_conflict 409, payload_too_large 413, no_capable_provider 422
 * (details.providers: each provider's reasons), all_providers_failed 502
 * (details.attempts), unavailable 503 (store down), internal 500.
 * Also in use: conflict 409 (the sandbox's state forbids the operation,
 * details.state) and provider_error 502 (a provider refused an operation on
 * an existing sandbox). A non-JSON body is 415 with code invalid_request.
 * docs/api.md and openapi.json list them all.
 */
#ifndef OSR_GATEWAY_API_H
#define OSR_GATEWAY_API_H

#include <jansson.h>

#include "gateway/gw.h"
#include "net/http.h"

/** Who is calling (resolved from `Authorization: Bearer <key>`). */
typedef struct osr_gw_auth_s {
  char tenant[OSR_TENANT_MAX];
  char key_id[24];
  osr_role_t role;
} osr_gw_auth_t;

/** A request in flight through the API: the HTTP request plus the parsed
 *  pieces; freed by the router when the HTTP exchange is done. */
typedef struct osr_gw_call_s {
  osr_gw_t *gw;
  osr_http_req_t *req;
  osr_gw_auth_t auth;
  json_t *body;                  /**< parsed JSON body (object) or NULL */
  char path_id[OSR_ID_MAX];      /**< {id} from the route, if any */
  const char *route;             /**< route pattern, for metrics ("/v1/sandboxes/{id}") */
  uint64_t started_us;
  int done;                      /**< a response was sent */
  void *data;                    /**< the handler's */
  void (*on_abort)(struct osr_gw_call_s *call); /**< client went away before the answer */
  /** The E2B front door (api_e2b.c) answers in E2B's shapes while reusing
   *  the OSR handlers: when set, every answer of this call (errors from the
   *  router included) passes through reshape before it is sent. It takes
   *  `body` (may be NULL) and returns the body to send (may be NULL), may
   *  change *status, and may add one header: set *hname (static storage)
   *  and write the value, NUL-terminated, into hval (hval_len bytes). */
  json_t *(*reshape)(struct osr_gw_call_s *call, int *status, json_t *body, const char **hname,
                     char *hval, size_t hval_len);
} osr_gw_call_t;

typedef void (*osr_gw_handler_t)(osr_gw_call_t *call);

/*
 * Call lifetime (api.c). The router frees a call when the HTTP exchange is
 * over AND no hold is outstanding. If the client goes away before the
 * answer, on_abort (if set) fires once, call->req becomes NULL, and
 * osr_gw_reply()/osr_gw_error() on that call only free what they were given.
 * A handler that starts asynchronous work (store, provider) either holds the
 * call until its callback ran (osr_gw_call_hold/release), or cancels the
 * work in on_abort and never touches the call afterwards.
 */
/** Keep `call` allocated until the matching osr_gw_call_release(). */
void osr_gw_call_hold(osr_gw_call_t *call);
void osr_gw_call_release(osr_gw_call_t *call);

/** Query parameter `name` of the call's request, percent-decoded into `out`
 *  (NUL-terminated). Returns its length, -1 if absent, OSR_ETOOLARGE if it
 *  does not fit in outlen - 1 bytes or is not valid percent-encoding. */
int osr_gw_query(const osr_gw_call_t *call, const char *name, char *out, size_t outlen);

/** `ms` (unix milliseconds) as RFC 3339 UTC, "2024-05-01T12:00:00.123Z". */
void osr_gw_rfc3339(int64_t ms, char out[32]);

/** API module state on gw->api (auth cache); osr_gateway_main calls these
 *  around serving. init returns 0. */
int osr_gw_api_init(osr_gw_t *gw);
void osr_gw_api_dispose(osr_gw_t *gw);
/** Drop a key from the auth cache (revocation). */
void osr_gw_auth_forget(osr_gw_t *gw, const char *key_id);

/** Install the API on the gateway's HTTP server (as its handler). */
void osr_gw_api_on_request(osr_http_req_t *req, void *gw);

/** Answer with JSON (steals `body`) and finish the call. */
void osr_gw_reply(osr_gw_call_t *call, int status, json_t *body);
/** Answer with JSON text already serialised (`json`, `len` bytes, allocated
 *  with osr_xmalloc and stolen; NULL = no body) and finish the call. Calls
 *  with a reshape hook get it parsed, as osr_gw_reply would have sent it. */
void osr_gw_reply_text(osr_gw_call_t *call, int status, char *json, size_t len);
/** Answer with a typed error; `details` (stolen, may be NULL) is merged into
 *  the error object. */
void osr_gw_error(osr_gw_call_t *call, int status, const char *code, const char *message,
                  json_t *details);
/** Map an OSR_E* / store error to the right typed error answer. */
void osr_gw_error_from(osr_gw_call_t *call, int err, const char *what);

/* Handlers (api_sandboxes.c). */
void osr_gw_sandbox_create(osr_gw_call_t *call);  /* POST   /v1/sandboxes */
void osr_gw_sandbox_list(osr_gw_call_t *call);    /* GET    /v1/sandboxes */
void osr_gw_sandbox_get(osr_gw_call_t *call);     /* GET    /v1/sandboxes/{id} */
void osr_gw_sandbox_delete(osr_gw_call_t *call);  /* DELETE /v1/sandboxes/{id} */
void osr_gw_sandbox_timeout(osr_gw_call_t *call); /* POST   /v1/sandboxes/{id}/timeout */
void osr_gw_sandbox_tokens(osr_gw_call_t *call);  /* POST   /v1/sandboxes/{id}/tokens */
void osr_gw_plan(osr_gw_call_t *call);            /* POST   /v1/plan */
void osr_gw_providers_get(osr_gw_call_t *call);   /* GET    /v1/providers */

/* Handlers (api_admin.c). */
void osr_gw_keys_create(osr_gw_call_t *call);     /* POST   /v1/keys (admin) */
void osr_gw_keys_list(osr_gw_call_t *call);       /* GET    /v1/keys (admin: all; tenant: own) */
void osr_gw_keys_revoke(osr_gw_call_t *call);     /* DELETE /v1/keys/{id} (admin) */
void osr_gw_audit_list(osr_gw_call_t *call);      /* GET    /v1/audit */

/* The E2B-compatible front door (api_e2b.c, docs/e2b-compat.md). Errors on
 * these routes are {"code":<status>,"message":...} (E2B's SDKs branch on
 * the body's code), with OSR's typed error kept under "error". */
void osr_gw_e2b_create(osr_gw_call_t *call);  /* POST   /sandboxes, /v2/sandboxes */
void osr_gw_e2b_list(osr_gw_call_t *call);    /* GET    /sandboxes, /v2/sandboxes */
void osr_gw_e2b_get(osr_gw_call_t *call);     /* GET    /sandboxes/{id} */
void osr_gw_e2b_kill(osr_gw_call_t *call);    /* DELETE /sandboxes/{id} */
void osr_gw_e2b_timeout(osr_gw_call_t *call); /* POST   /sandboxes/{id}/timeout */
void osr_gw_e2b_connect(osr_gw_call_t *call); /* POST   /sandboxes/{id}/connect, /v2/... */
void osr_gw_e2b_pause(osr_gw_call_t *call);   /* POST   /sandboxes/{id}/pause */
void osr_gw_e2b_metrics(osr_gw_call_t *call); /* GET    /sandboxes/{id}/metrics */
/** The reshape hook that turns OSR error bodies into E2B ones; the router
 *  sets it on every E2B route and on unknown paths under E2B's prefixes. */
json_t *osr_gw_e2b_reshape_error(osr_gw_call_t *call, int *status, json_t *body,
                                 const char **hname, char *hval, size_t hval_len);
/** 1 if `path` is under one of E2B's REST prefixes (/sandboxes, /v2/). */
int osr_gw_e2b_path(const char *path, size_t len);
/** Read OSR_E2B_DOMAIN (or derive the domain from the data-plane URL) and
 *  check it; called by osr_gw_api_init. Returns 0, or OSR_EINVAL when the
 *  configured domain is one of E2B's own (the front door then answers
 *  domain null and the error is logged). */
int osr_gw_e2b_init(osr_gw_t *gw);

/* Binding tokens (tokens.c). */
void osr_gw_keys_signing(osr_gw_call_t *call);    /* GET    /v1/keys/signing (public) */
/** Load (on first start: create) the signing keyring from
 *  cfg->token_keys_dir into gw->keyring. Blocking: call at start-up before
 *  the loop runs. Returns 0, or an error with the file and reason in err
 *  (also when the directory holds no private key). */
int osr_gw_keyring_open(osr_gw_t *gw, char *err, size_t errlen);
/** Free gw->keyring (NULL is fine). */
void osr_gw_keyring_close(osr_gw_t *gw);

/** Append an audit event (fire and forget; failures are logged and counted). */
void osr_gw_audit(osr_gw_t *gw, const osr_gw_auth_t *who, const char *action,
                  const char *sandbox_id, const char *outcome, json_t *detail);

/** The sandbox as the API shows it (binding + data-plane URL + token).
 *  With `with_token`, a RUNNING or PAUSED sandbox gets "token" (a binding
 *  token with every scope and port, docs/tokens.md) and "tokenExpiresAt";
 *  both are null when no token can be signed. */
json_t *osr_gw_sandbox_json(osr_gw_t *gw, const osr_binding_t *b, int with_token);

/** Resolve every binding left in CREATING by a crash (adopt what the
 *  provider has under our label, destroy the rest); cb when done. Called at
 *  start before the API listens. (create.c) */
void osr_gw_recover(osr_gw_t *gw, void (*cb)(osr_gw_t *gw, int status));

#endif
