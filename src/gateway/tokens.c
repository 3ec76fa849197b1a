/*
 * The gateway's side of binding tokens (docs/tokens.md): the signing
 * keyring loaded at start-up, minting a token for a binding, and the public
 * key endpoint data planes fetch.
 *
 * The keyring is read once, before the loop runs (a blocking directory read
 * is fine then), from cfg->token_keys_dir (default <data_dir>/keys); the
 * first start generates a key there. To rotate, add a key file, point
 * "active" at it and restart: the old key keeps verifying for as long as it
 * stays in the directory (docs/tokens.md has the procedure).
 *
 * A token never outlives its sandbox: its expiry is the earlier of now +
 * the requested lifetime and the binding's TTL deadline, so extending a
 * sandbox's timeout does not extend tokens already handed out (clients ask
 * for a fresh one, which the short default lifetime makes routine).
 */
#include <stdio.h>
#include <string.h>

#include "gateway/api.h"
#include "gateway/sandboxes.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/text.h"

#define MOD "tokens"

int osr_gw_keyring_open(osr_gw_t *gw, char *err, size_t errlen)
{
  const char *dir = gw->cfg->token_keys_dir;
  osr_keyring_t *kr = osr_keyring_new();
  int rv = osr_keyring_load_dir(kr, dir, 1, err, errlen);
  if (rv == 0 && osr_keyring_active(kr) == NULL) {
    snprintf(err, errlen, "%s: no private key to sign tokens with", dir);
    rv = OSR_EINVAL;
  }
  if (rv != 0) {
    osr_keyring_free(kr);
    return rv;
  }
  gw->keyring = kr;
  OSR_LOG_INFO(MOD, "token keys: %s (%zu key%s, signing with %s)", dir, osr_keyring_count(kr),
               osr_keyring_count(kr) == 1 ? "" : "s", osr_keyring_active(kr));
  return 0;
}

void osr_gw_keyring_close(osr_gw_t *gw)
{
  osr_keyring_free(gw->keyring);
  gw->keyring = NULL;
}

/* The claims a token for `b` carries; the signature is the only part that
 * costs anything (see osr__token_mint_async). */
static int fill_claims(osr_gw_t *gw, const osr_binding_t *b, const osr__token_req_t *r,
                       osr_token_claims_t *c)
{
  if (gw->keyring == NULL)
    return OSR_ETOKEN_UNKNOWN_KEY;
  int64_t now = osr_now_ms() / 1000;
  uint64_t ttl = r->ttl_s ? r->ttl_s : (gw->cfg->token_ttl_s ? gw->cfg->token_ttl_s : 3600);
  int64_t exp = now + (int64_t)ttl;
  if (b->expires_ms > 0) {
    int64_t sbx_end = b->expires_ms / 1000;
    if (sbx_end <= now)
      return OSR_ETOKEN_EXPIRED; /* the sandbox's TTL is over */
    if (sbx_end < exp)
      exp = sbx_end;
  }
  memset(c, 0, sizeof(*c));
  osr_str_copy(c->sandbox_id, sizeof(c->sandbox_id), b->id);
  osr_str_copy(c->tenant, sizeof(c->tenant), b->tenant);
  osr_str_copy(c->provider, sizeof(c->provider), b->provider);
  osr_str_copy(c->agent_endpoint, sizeof(c->agent_endpoint), b->agent_endpoint);
  c->scopes = r->scopes;
  c->all_ports = r->all_ports;
  c->nports = r->nports <= OSR_TOKEN_PORTS_MAX ? r->nports : OSR_TOKEN_PORTS_MAX;
  memcpy(c->ports, r->ports, c->nports * sizeof(c->ports[0]));
  c->iat = now;
  c->exp = exp;
  return 0;
}

int osr__token_mint(osr_gw_t *gw, const osr_binding_t *b, const osr__token_req_t *r, char *out,
                    size_t outlen, osr_token_claims_t *claims)
{
  osr_token_claims_t c;
  int rv = fill_claims(gw, b, r, &c);
  if (rv != 0)
    return rv;
  int n = osr_token_sign(gw->keyring, &c, out, outlen);
  if (n < 0)
    return n;
  if (claims != NULL)
    *claims = c;
  return 0;
}

/* ---- signing on the thread pool --------------------------------------------
 * An Ed25519 signature is ~380,000 instructions with Debian's BoringSSL:
 * four fifths of everything the loop thread did for a create. It needs
 * nothing the loop owns except the keyring, which is immutable from
 * osr_gw_keyring_open until osr_gw_keyring_close, and that runs only after
 * uv_run has returned, i.e. after every queued work request has completed
 * (a uv_work_t keeps the loop alive). EVP_PKEY signing with a per-call
 * EVP_MD_CTX and RAND_bytes are safe from several threads at once in both
 * BoringSSL and OpenSSL 3. So the job owns a private copy of the claims and
 * the output buffer, the worker touches nothing else, and the result goes
 * back to the loop thread in the after-work callback. Nothing is shared
 * while the job is in flight, and a job cannot be cancelled half way: one
 * queued at shutdown still runs (a ~0.1 ms signature) and its callback
 * fires, which answers a call the router may already have finished (that is
 * a no-op, see api.h "Call lifetime"). */
typedef struct mint_job_s {
  uv_work_t w;
  const osr_keyring_t *kr;
  osr_token_claims_t claims;
  int rv; /* token length, or an osr_token_sign error */
  osr__mint_cb cb;
  void *data;
  char tok[OSR_TOKEN_MAX + 1];
} mint_job_t;

static void mint_work(uv_work_t *w)
{
  mint_job_t *j = osr_container_of(w, mint_job_t, w);
  j->rv = osr_token_sign(j->kr, &j->claims, j->tok, sizeof(j->tok));
}

static void mint_after(uv_work_t *w, int status)
{
  mint_job_t *j = osr_container_of(w, mint_job_t, w);
  /* UV_ECANCELED only if someone uv_cancel()ed the job: we never do. */
  int rv = status != 0 ? OSR_ECANCELED : j->rv;
  if (rv < 0)
    j->cb(rv, NULL, NULL, j->data);
  else
    j->cb(0, j->tok, &j->claims, j->data);
  osr_free(j);
}

int osr__token_sign_inline(void)
{
  /* uv_available_parallelism honours the CPU affinity mask (taskset,
   * cgroup cpusets show up there too). Read once: a gateway does not move. */
  static int inline_ = -1;
  if (inline_ < 0)
    inline_ = uv_available_parallelism() <= 1;
  return inline_;
}

int osr__token_mint_async(osr_gw_t *gw, const osr_binding_t *b, const osr__token_req_t *r,
                          osr__mint_cb cb, void *data)
{
  mint_job_t *j = osr_xmalloc(sizeof(*j));
  int rv = fill_claims(gw, b, r, &j->claims);
  if (rv != 0) {
    osr_free(j);
    return rv;
  }
  j->kr = gw->keyring;
  j->rv = 0;
  j->cb = cb;
  j->data = data;
  j->tok[0] = '\0';
  rv = uv_queue_work(gw->loop, &j->w, mint_work, mint_after);
  if (rv != 0) {
    osr_free(j);
    return rv;
  }
  return 0;
}

/* GET /v1/keys/signing: the public half of every key, for data planes that
 * verify tokens offline. Public by nature, so unauthenticated. */
void osr_gw_keys_signing(osr_gw_call_t *call)
{
  char *s = osr_keyring_public_json(call->gw->keyring);
  json_t *doc = s != NULL ? json_loads(s, 0, NULL) : NULL;
  osr_free(s);
  if (doc == NULL) {
    osr_gw_error(call, 503, "unavailable", "no signing keys loaded", NULL);
    return;
  }
  const char *active = osr_keyring_active(call->gw->keyring);
  json_object_set_new(doc, "active", active != NULL ? json_string(active) : json_null());
  osr_gw_reply(call, 200, doc);
}
