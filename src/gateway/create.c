/*
 * POST /v1/sandboxes: the create flow with failover, idempotent replays, and
 * crash recovery of creates that a previous process left half done.
 *
 * The order of writes is what makes creates crash-safe:
 *   1. the intent row (state creating, idempotency key, first provider,
 *      attempt 1) is durable BEFORE any provider is called;
 *   2. before each provider call the row names that provider and attempt,
 *      so a restart knows where to look;
 *   3. every resource a provider creates carries our sandbox id as a label.
 * After a crash osr_gw_recover() lists the rows still creating that this
 * instance owns (or that are stale, see "Crash recovery"), asks each
 * provider which resources carry our label, adopts the one that matches the
 * row's provider and destroys everything else. Nothing is created twice
 * (the unique (tenant, key) row is the only way to a provider call) and
 * nothing leaks (every resource is findable by its label).
 *
 * A provider call cannot be cancelled through the adapter interface, so a
 * call that outlives its time budget is abandoned, not forgotten: its
 * attempt record stays alive until the adapter's callback fires, and a
 * sandbox that arrives that late is destroyed.
 *
 * Relaxed binding commit. The success update (creating -> running, with the
 * provider id and its audit row) is the second commit on a create's path;
 * on PostgreSQL it is committed with synchronous_commit = off (the store
 * runs it in a transaction of its own, osr_store_update_opts_t.relaxed;
 * `?binding_commit=sync` in the store URL turns it off), so a create waits
 * for one disk flush, the intent's, not two. A PostgreSQL crash may lose
 * that update after the client got its 201; what is left is exactly what a
 * gateway crash after the provider call leaves: the intent row (durable,
 * still creating, naming the provider) and the provider's resource carrying
 * our label. The same adopt path resolves it: recovery at start (this
 * instance's rows) and, while gateways keep running, the reaper's stale pass
 * (rows of any owner still creating after reaper.stale_creating_ms, longer
 * than any create may run, which is how one gateway tells a lost update from
 * a create in flight on another). Until then the binding reads `creating`;
 * the token in the 201 is verified offline by the data plane and works
 * throughout (tests recovery_lostupdate).
 *
 * Concurrent requests with one Idempotency-Key: the store lets exactly one
 * insert win; the others get that row back. While it is still being created
 * in this process they wait on it (in-process list), else they poll the
 * store every 50 ms up to the create deadline (another gateway creating it).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/api.h"
#include "gateway/metrics.h"
#include "gateway/sandboxes.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/text.h"

#define MOD "create"
#define POLL_MS 50

typedef struct create_s create_t;

/* A create's phases, in order (OSR_LOG_LEVEL=trace, docs/gateway.md). */
enum {
  T_PARSED,      /* the HTTP request was parsed (the API call began) */
  T_START,       /* the create began (body checked, placement done next) */
  T_INTENT_RUN,  /* the intent's store transaction began (worker) */
  T_INTENT_RAN,  /* ... and committed */
  T_INTENT_BACK, /* its result reached the loop */
  T_PROVIDER,    /* the provider answered */
  T_HANDED,      /* the binding update was queued (and, inline, the token signed) */
  T_UPDATE_RUN,  /* the update's store transaction began */
  T_UPDATE_RAN,  /* ... and committed */
  T_UPDATE_BACK, /* its result reached the loop */
  T_REPLIED,     /* the answer was written to the connection */
  T_COUNT
};

/* The agent token of sandbox `id` (osr_agent_token) from the gateway's
 * precomputed key, made here on first use (loop thread only, as the key's
 * scratch context requires). Falls back to the one-shot HMAC if the key
 * cannot be made. */
static int agent_token(osr_gw_t *gw, const char *id, char out[65])
{
  if (gw->agent_key == NULL)
    gw->agent_key = osr_agent_key_new(gw->agent_secret);
  if (gw->agent_key == NULL)
    return osr_agent_token(gw->agent_secret, id, out);
  return osr_agent_key_token(gw->agent_key, id, out);
}

/* One provider call. Outlives the create when abandoned (c == NULL). */
typedef struct attempt_s {
  create_t *c;
  osr_gw_t *gw;
  osr_provider_t *p;
  size_t pidx;
  uint64_t started_ms;
} attempt_t;

typedef struct waiter_s {
  osr_gw_call_t *call;
  struct waiter_s *next;
} waiter_t;

struct create_s {
  osr_gw_t *gw;
  osr_gw_call_t *call;
  osr__sbx_req_t req;
  osr_binding_t b;
  osr_candidate_t *cands;
  size_t ncands, neligible, next;
  json_t *attempts;            /* [{provider, error, message, latencyMs}] */
  uint64_t started_ms;
  int64_t deadline_ms;
  /* Phase timestamps (uv_hrtime, µs) for the trace line of a successful
   * create, indexed by the T_* names above. */
  uint64_t t_us[T_COUNT];
  /* The create answer's token is signed on the thread pool while the
   * binding commits (both start when the provider answered), so the
   * signature adds no step to the create's critical path. The create is
   * not freed while the job runs: create_finish waits for it. */
  int signing;                 /* a mint job holds a pointer to us */
  int finish_wanted;           /* create_finish was called while signing */
  int sign_status;             /* the job's outcome (0: tok is set) */
  char *tok;                   /* the signed token (heap), or NULL */
  osr_token_claims_t tok_claims;
  int nattempts;               /* provider calls made */
  attempt_t *att;              /* the call in flight, or NULL */
  uv_timer_t timer;            /* the in-flight call's time budget */
  waiter_t *waiters;
  int registered;
  create_t *prev_c, *next_c;
  /* the final answer, replayed to waiters */
  int status;
  const char *code;
  char message[256];
  json_t *details;
};

/* Creates in flight in this process. One loop per gateway, so a plain list
 * owned by the loop thread; entries are matched by (gw, id). */
static create_t *inflight;

int osr__create_in_flight(osr_gw_t *gw, const char *id)
{
  for (create_t *c = inflight; c != NULL; c = c->next_c)
    if (c->gw == gw && strcmp(c->b.id, id) == 0)
      return 1;
  return 0;
}

static create_t *find_inflight(osr_gw_t *gw, const char *id)
{
  for (create_t *c = inflight; c != NULL; c = c->next_c)
    if (c->gw == gw && strcmp(c->b.id, id) == 0)
      return c;
  return NULL;
}

const char *osr__err_text(int err)
{
  switch (err) {
  case OSR_EUNAVAILABLE:
    return "the store is unavailable";
  case OSR_ECONFLICT:
    return "conflict";
  case OSR_ENOTFOUND:
    return "not found";
  case OSR_PERR_CAPACITY:
    return "the provider has no capacity";
  case OSR_PERR_RATE_LIMITED:
    return "the provider rate-limited the request";
  case OSR_PERR_TIMEOUT:
    return "the provider did not answer in time";
  case OSR_PERR_UNAVAILABLE:
    return "the provider is unavailable";
  case OSR_PERR_BOOT_FAILED:
    return "the sandbox was accepted but never became ready";
  case OSR_PERR_AUTH:
    return "the provider rejected our credentials";
  case OSR_PERR_INVALID:
    return "the provider rejected the request as invalid";
  case OSR_PERR_NOT_FOUND:
    return "no such resource at the provider";
  case OSR_PERR_UNSUPPORTED:
    return "the provider does not support this operation";
  default:
    /* OSR's own codes end at OSR_ESHUTDOWN; anything below is another
     * module's and unknown to osr_strerror. */
    return err < OSR_ESHUTDOWN ? "error" : osr_strerror(err);
  }
}

void osr__auth_system(osr_gw_auth_t *a, const char *actor, const char *tenant)
{
  memset(a, 0, sizeof(*a));
  osr_str_copy(a->tenant, sizeof(a->tenant), tenant ? tenant : "");
  osr_str_copy(a->key_id, sizeof(a->key_id), actor);
  a->role = OSR_ROLE_ADMIN;
}

/* ------------------------------------------------------------------------ */
/* Background destroy                                                        */

typedef struct bgd_s {
  char provider_id[128];
} bgd_t;

static void bg_destroyed(osr_provider_t *p, int status, void *data)
{
  bgd_t *d = data;
  if (status != 0 && status != OSR_PERR_NOT_FOUND)
    OSR_LOG_WARN(MOD, "%s: destroying %s failed: %s", p->name, d->provider_id,
                 osr_provider_err_name(status));
  osr_free(d);
}

void osr__destroy_bg(osr_gw_t *gw, osr_provider_t *p, const char *provider_id)
{
  (void)gw;
  if (p == NULL || provider_id == NULL || provider_id[0] == '\0')
    return;
  bgd_t *d = osr_xcalloc(1, sizeof(*d));
  osr_str_copy(d->provider_id, sizeof(d->provider_id), provider_id);
  int rv = p->adapter->destroy(p, d->provider_id, bg_destroyed, d);
  if (rv != 0)
    bg_destroyed(p, rv, d);
}

int osr__resource_is_bound(const osr_binding_t *b, const char *provider, const char *provider_id,
                           const char **why)
{
  if (b == NULL) {
    *why = "no binding";
    return 0;
  }
  if (b->state == OSR_BINDING_ENDED || b->state == OSR_BINDING_FAILED ||
      b->state == OSR_BINDING_LOST) {
    *why = "binding is over";
    return 0;
  }
  if (strcmp(b->provider, provider) != 0) {
    /* An earlier attempt that answered after we moved on. */
    *why = "binding lives on another provider";
    return 0;
  }
  if (b->state == OSR_BINDING_CREATING)
    return 1;
  if (b->provider_id[0] != '\0' && strcmp(b->provider_id, provider_id) != 0) {
    *why = "binding points at another resource";
    return 0;
  }
  return 1;
}

/* ------------------------------------------------------------------------ */
/* Answers                                                                   */

/* Answer a call from a binding that is already settled (idempotent replay,
 * waiters): the sandbox, or the failure recorded with it. */
static void reply_settled(osr_gw_t *gw, osr_gw_call_t *call, const osr_binding_t *b, int ok_status)
{
  if (b->state == OSR_BINDING_FAILED) {
    json_t *e = b->error_json ? json_loads(b->error_json, 0, NULL) : NULL;
    const char *code = e ? json_string_value(json_object_get(e, "code")) : NULL;
    const char *msg = e ? json_string_value(json_object_get(e, "message")) : NULL;
    int st = code && strcmp(code, "no_capable_provider") == 0 ? 422 : 502;
    json_t *details = json_object();
    if (e != NULL) {
      json_t *v;
      if ((v = json_object_get(e, "attempts")) != NULL)
        json_object_set(details, "attempts", v);
      if ((v = json_object_get(e, "providers")) != NULL)
        json_object_set(details, "providers", v);
    }
    json_object_set_new(details, "sandboxId", json_string(b->id));
    osr_gw_error(call, st, code ? code : "all_providers_failed",
                 msg ? msg : "the create failed", details);
    json_decref(e);
    return;
  }
  if (b->state == OSR_BINDING_CREATING) {
    osr_gw_error(call, 503, "unavailable",
                 "a create with this Idempotency-Key is still in progress; retry later",
                 json_pack("{s:s}", "sandboxId", b->id));
    return;
  }
  (void)gw;
  osr__sandbox_reply(call, ok_status, b, 1);
}

static void on_timer_closed(uv_handle_t *h)
{
  create_t *c = h->data;
  osr_free(c);
}

static void create_free(create_t *c)
{
  if (c->registered) {
    if (c->prev_c)
      c->prev_c->next_c = c->next_c;
    else
      inflight = c->next_c;
    if (c->next_c)
      c->next_c->prev_c = c->prev_c;
    c->registered = 0;
  }
  if (c->gw->inflight_creates > 0)
    c->gw->inflight_creates--;
  osr__sbx_req_dispose(&c->req);
  osr_binding_dispose(&c->b);
  osr_freep(&c->tok);
  json_decref(c->attempts);
  json_decref(c->details);
  osr_free(c->cands);
  uv_close((uv_handle_t *)&c->timer, on_timer_closed);
}

/* Where a successful create's time went, for latency profiles
 * (OSR_LOG_LEVEL=trace; bench/README.md "Create tail"): the absolute time
 * the request was parsed, then each phase's end relative to it, in µs. */
static void trace_phases(create_t *c)
{
  if (osr__log_level > OSR_LOG_TRACE)
    return;
  uint64_t *t = c->t_us;
  t[T_REPLIED] = uv_hrtime() / 1000;
  char rel[T_COUNT * 21];
  size_t off = 0;
  for (int i = T_START; i < T_COUNT && off < sizeof(rel); i++)
    off += (size_t)snprintf(rel + off, sizeof(rel) - off, " %" PRId64,
                            t[i] ? (int64_t)(t[i] - t[T_PARSED]) : (int64_t)-1);
  OSR_LOG_TRACE(MOD, "phases %s at %" PRIu64 ":%s (attempts %d)", c->b.id, t[T_PARSED], rel,
                c->nattempts);
}

static void stamp_store(create_t *c, int run, int ran, int back)
{
  if (osr__log_level > OSR_LOG_TRACE)
    return;
  const osr_store_timing_t *tm = osr_store_last_timing(c->gw->store);
  c->t_us[run] = tm->batch_start_us;
  c->t_us[ran] = tm->batch_end_us;
  c->t_us[back] = uv_hrtime() / 1000;
}

/* Send the final answer to the caller and every waiter, then free. */
static void create_finish(create_t *c)
{
  osr_gw_t *gw = c->gw;
  osr_metrics_t *m = gw->metrics;
  if (c->signing) {
    c->finish_wanted = 1; /* token_signed finishes */
    return;
  }
  if (m != NULL)
    osr_metrics_create_done(m, c->nattempts, (osr_now_ms() - c->started_ms) * 1000);
  if (c->status == 201) {
    if (c->sign_status != 0)
      OSR_LOG_WARN(MOD, "sandbox %s: no token: %s", c->b.id, osr_token_strerror(c->sign_status));
    osr__sandbox_reply_signed(c->call, 201, &c->b, c->tok, &c->tok_claims);
    trace_phases(c);
  } else {
    osr_gw_error(c->call, c->status, c->code, c->message,
                 c->details ? json_deep_copy(c->details) : NULL);
  }
  osr_gw_call_release(c->call);
  c->call = NULL;
  while (c->waiters != NULL) {
    waiter_t *w = c->waiters;
    c->waiters = w->next;
    if (c->status == 201)
      osr__sandbox_reply(w->call, 200, &c->b, 1);
    else
      osr_gw_error(w->call, c->status, c->code, c->message,
                   c->details ? json_deep_copy(c->details) : NULL);
    osr_gw_call_release(w->call);
    osr_free(w);
  }
  create_free(c);
}

static void set_answer(create_t *c, int status, const char *code, const char *msg, json_t *details)
{
  c->status = status;
  c->code = code;
  osr_str_copy(c->message, sizeof(c->message), msg);
  json_decref(c->details);
  c->details = details;
}

/* ------------------------------------------------------------------------ */
/* Failure                                                                   */

static void failed_stored(int status, void *data)
{
  create_t *c = data;
  if (status != 0) {
    OSR_LOG_WARN(MOD, "%s: recording the failure: %s", c->b.id, osr__err_text(status));
    if (c->gw->metrics != NULL)
      osr_metrics_audit_failure(c->gw->metrics); /* its audit row went with it */
  }
  create_finish(c);
}

/* The text of an audit detail object (json_dumps with sorted keys, as
 * osr_gw_audit writes it); steals `detail`. NULL for NULL. */
static char *detail_text(json_t *detail)
{
  if (detail == NULL)
    return NULL;
  char *s = json_dumps(detail, JSON_COMPACT | JSON_SORT_KEYS);
  json_decref(detail);
  char *o = s != NULL ? osr_xstrdup(s) : NULL;
  osr_json_free(s);
  return o;
}

/* Store `b` and, in the same transaction, the audit row describing it:
 * one commit instead of two, and the audit row exists exactly when the
 * change does. The update applies only while the row is still in state
 * `if_state` (and at version `if_updated_ms` unless 0): another gateway's
 * reaper or recovery may have resolved it (OSR_ECONFLICT then). Takes
 * `detail` (heap text or NULL). */
static int update_audited(osr_gw_t *gw, const osr_binding_t *b, osr_binding_state_t if_state,
                          int64_t if_updated_ms, int relaxed, const osr_gw_auth_t *who,
                          const char *action, const char *outcome, char *detail,
                          osr_store_done_cb cb, void *data)
{
  osr_audit_event_t ev;
  osr_store_update_opts_t o;
  osr__audit_event(&ev, who, action, b->id, outcome, NULL);
  ev.detail_json = detail;
  memset(&o, 0, sizeof(o));
  o.if_state = if_state;
  o.if_updated_ms = if_updated_ms;
  o.audit = &ev;
  o.relaxed = relaxed;
  int rv = gw->store != NULL ? osr_store_update_ex(gw->store, b, &o, cb, data) : OSR_EUNAVAILABLE;
  osr__audit_event_dispose(&ev);
  return rv;
}

/* Every candidate failed (or a non-retryable error stopped us): record the
 * binding as failed with the attempts, then answer 502. */
static void create_fail(create_t *c, const char *code, int http_status, const char *msg,
                        json_t *details)
{
  osr_gw_t *gw = c->gw;
  int64_t now = osr_now_ms();
  json_t *err = json_pack("{s:s,s:s}", "code", code, "message", msg);
  json_object_update(err, details);
  c->b.state = OSR_BINDING_FAILED;
  c->b.updated_ms = now;
  c->b.ended_ms = now;
  snprintf(c->b.end_reason, sizeof(c->b.end_reason), "failed: %s", code);
  osr_free(c->b.error_json);
  char *s = json_dumps(err, JSON_COMPACT);
  c->b.error_json = s ? osr_xstrdup(s) : NULL;
  osr_json_free(s);
  json_decref(err);
  json_object_set_new(details, "sandboxId", json_string(c->b.id));
  set_answer(c, http_status, code, msg, details);
  int rv = update_audited(gw, &c->b, OSR_BINDING_CREATING, 0, 0, &c->call->auth, "create", code,
                          detail_text(json_deep_copy(details)), failed_stored, c);
  if (rv != 0)
    failed_stored(rv, c);
}

static void fail_all(create_t *c, const char *why)
{
  char msg[256];
  snprintf(msg, sizeof(msg), "%s (%zu attempt%s)", why, json_array_size(c->attempts),
           json_array_size(c->attempts) == 1 ? "" : "s");
  create_fail(c, "all_providers_failed", 502, msg,
              json_pack("{s:O}", "attempts", c->attempts));
}

/* ------------------------------------------------------------------------ */
/* Attempts                                                                  */

static void next_attempt(create_t *c);

static void add_attempt(create_t *c, const char *provider, const char *error, const char *message,
                        uint64_t latency_ms)
{
  json_array_append_new(c->attempts,
                        json_pack("{s:s,s:s,s:s,s:I}", "provider", provider, "error", error,
                                  "message", message, "latencyMs", (json_int_t)latency_ms));
}

static void record_outcome(create_t *c, attempt_t *a, int status, uint64_t latency_ms)
{
  osr_gw_t *gw = c->gw;
  osr_provider_health_t *h = osr_providers_health(gw->providers, a->pidx);
  if (h != NULL)
    osr_provider_health_record(h, status, (double)latency_ms, osr_now_ms());
  if (gw->metrics != NULL)
    osr_metrics_create(gw->metrics, a->p->name, status == 0 ? "ok" : osr_provider_err_name(status));
}

static void success_stored(int status, void *data)
{
  create_t *c = data;
  osr_gw_t *gw = c->gw;
  stamp_store(c, T_UPDATE_RUN, T_UPDATE_RAN, T_UPDATE_BACK);
  if (status != 0) {
    /* The sandbox exists but its binding could not be made durable. Do not
     * hand out something the store does not know: destroy it; the intent
     * row (still creating) is resolved by recovery. */
    osr__destroy_bg(gw, osr_providers_find(gw->providers, c->b.provider, NULL), c->b.provider_id);
    if (status == OSR_ECONFLICT || status == OSR_ENOTFOUND) {
      /* Another gateway resolved our intent row meanwhile (its reaper
       * took it for an abandoned create and failed it): that outcome
       * stands, so the sandbox must not. */
      OSR_LOG_WARN(MOD, "%s: resolved by another gateway while being created", c->b.id);
      set_answer(c, 503, "unavailable", "the create was resolved elsewhere; retry", NULL);
    } else {
      set_answer(c, 503, "unavailable", "the binding store is unavailable", NULL);
    }
    osr_gw_audit(gw, &c->call->auth, "create", c->b.id, "unavailable", NULL);
    create_finish(c);
    return;
  }
  osr__cache_put(gw, &c->b);
  set_answer(c, 201, NULL, "", NULL);
  create_finish(c);
}

/* Granted capabilities as stored (compact JSON, heap, osr_free). */
static char *caps_text(const osr_capabilities_t *g)
{
  osr_jw_t w;
  size_t len;
  osr_jw_init(&w, 16 * 1024);
  osr__caps_write(&w, g);
  return osr_jw_release(&w, &len);
}

static void token_signed(int status, const char *tok, const osr_token_claims_t *claims, void *data)
{
  create_t *c = data;
  c->signing = 0;
  c->sign_status = status;
  if (status == 0) {
    c->tok = osr_xstrdup(tok);
    c->tok_claims = *claims;
  }
  OSR_LOG_TRACE(MOD, "token %s: signed %" PRIu64 " us after the provider answered", c->b.id,
                uv_hrtime() / 1000 - c->t_us[T_PROVIDER]);
  if (c->finish_wanted)
    create_finish(c);
}

/* The create answer's token, started alongside the binding's commit; its
 * claims (expiry included) come from the binding as it is about to be
 * committed. On a failure to start, the answer carries a null token, as
 * osr__sandbox_reply would have sent. With one CPU (osr__token_sign_inline)
 * it is signed here, on the loop thread, after the commit was queued. */
static void start_signing(create_t *c)
{
  osr__token_req_t tr;
  memset(&tr, 0, sizeof(tr));
  tr.scopes = OSR_SCOPE_ALL;
  tr.all_ports = 1;
  if (osr__token_sign_inline()) {
    char tok[OSR_TOKEN_MAX + 1];
    c->sign_status = osr__token_mint(c->gw, &c->b, &tr, tok, sizeof(tok), &c->tok_claims);
    if (c->sign_status == 0)
      c->tok = osr_xstrdup(tok);
    return;
  }
  c->signing = 1;
  int rv = osr__token_mint_async(c->gw, &c->b, &tr, token_signed, c);
  if (rv != 0) {
    c->signing = 0;
    c->sign_status = rv;
  }
}

static void on_created(osr_provider_t *p, int status, const osr_resource_t *res, void *data)
{
  attempt_t *a = data;
  create_t *c = a->c;
  if (c == NULL) {
    /* Abandoned after its time budget: the create moved on, so whatever
     * arrives now is not ours to keep. */
    if (status == 0 && res != NULL)
      osr__destroy_bg(a->gw, p, res->provider_id);
    osr_free(a);
    return;
  }
  uv_timer_stop(&c->timer);
  c->att = NULL;
  uint64_t lat = (uint64_t)(osr_now_ms() - (int64_t)a->started_ms);
  char why[200];

  if (status == 0 && res != NULL && !osr__caps_cover(&c->req.caps, &res->granted, why, sizeof(why))) {
    /* A dishonest manifest: never answer with less than was asked. */
    osr__destroy_bg(c->gw, p, res->provider_id);
    record_outcome(c, a, OSR_PERR_BOOT_FAILED, lat);
    add_attempt(c, p->name, "insufficient", why, lat);
    osr_free(a);
    next_attempt(c);
    return;
  }
  if (status != 0 || res == NULL) {
    if (status == 0)
      status = OSR_PERR_UNAVAILABLE;
    record_outcome(c, a, status, lat);
    add_attempt(c, p->name, osr_provider_err_name(status), osr__err_text(status), lat);
    osr_free(a);
    if (osr_provider_err_retryable(status))
      next_attempt(c);
    else
      fail_all(c, "a provider refused the request");
    return;
  }
  record_outcome(c, a, 0, lat);
  osr_free(a);
  c->t_us[T_PROVIDER] = uv_hrtime() / 1000;

  int64_t now = osr_now_ms();
  osr_binding_t *b = &c->b;
  osr_str_copy(b->provider_id, sizeof(b->provider_id), res->provider_id);
  if (res->region[0])
    osr_str_copy(b->region, sizeof(b->region), res->region);
  if (res->isolation != OSR_ISO_NONE)
    b->isolation = res->isolation;
  osr_str_copy(b->agent_endpoint, sizeof(b->agent_endpoint), res->agent_endpoint);
  b->state = OSR_BINDING_RUNNING;
  b->updated_ms = now;
  b->expires_ms = now + (int64_t)c->req.timeout_s * 1000;
  b->last_activity_ms = now;
  osr_free(b->granted_json);
  b->granted_json = caps_text(&res->granted);
  /* {"attempt":N,"provider":"...","providerId":"..."}: the audit detail
   * with sorted keys, as osr_gw_audit would have written it. */
  osr_jw_t w;
  osr_jw_init(&w, 4096);
  osr_jw_lit(&w, "{\"attempt\":");
  osr_jw_int(&w, b->attempt);
  osr_jw_lit(&w, ",\"provider\":");
  osr_jw_str(&w, b->provider);
  osr_jw_lit(&w, ",\"providerId\":");
  osr_jw_str(&w, b->provider_id);
  osr_jw_lit(&w, "}");
  size_t dlen;
  /* On the thread pool the signature starts first (it runs in parallel
   * anyway); inline, the commit is queued first so the store thread works
   * while the loop signs. success_stored never runs inside update_audited
   * when it returns 0 (the store's callbacks always come later). */
  int sign_first = !osr__token_sign_inline();
  if (sign_first)
    start_signing(c);
  int rv = update_audited(c->gw, b, OSR_BINDING_CREATING, 0, 1, &c->call->auth, "create", "ok",
                          osr_jw_release(&w, &dlen), success_stored, c);
  if (rv != 0) {
    success_stored(rv, c);
    return;
  }
  if (!sign_first)
    start_signing(c);
  c->t_us[T_HANDED] = uv_hrtime() / 1000;
}

static void on_attempt_timeout(uv_timer_t *t)
{
  create_t *c = t->data;
  attempt_t *a = c->att;
  if (a == NULL)
    return;
  a->c = NULL; /* on_created frees it when the adapter finally answers */
  c->att = NULL;
  uint64_t lat = (uint64_t)(osr_now_ms() - (int64_t)a->started_ms);
  record_outcome(c, a, OSR_PERR_TIMEOUT, lat);
  add_attempt(c, a->p->name, osr_provider_err_name(OSR_PERR_TIMEOUT), "no answer in time", lat);
  next_attempt(c);
}

static void call_provider(create_t *c)
{
  osr_gw_t *gw = c->gw;
  osr_candidate_t *cand = &c->cands[c->next - 1];
  osr_provider_t *p = cand->provider;
  size_t pidx = 0;
  (void)osr_providers_find(gw->providers, p->name, &pidx);
  osr_provider_health_t *h = osr_providers_health(gw->providers, pidx);
  int64_t now = osr_now_ms();

  /* The breaker may have opened while the store write ran; in half-open this
   * reserves the probe that record_outcome() releases. */
  if (h != NULL && !osr_breaker_allow(&h->breaker, now)) {
    add_attempt(c, p->name, "circuit_open", "the provider's circuit breaker is open", 0);
    next_attempt(c);
    return;
  }
  attempt_t *a = osr_xcalloc(1, sizeof(*a));
  a->c = c;
  a->gw = gw;
  a->p = p;
  a->pidx = pidx;
  a->started_ms = (uint64_t)now;
  c->nattempts++;

  osr_sandbox_spec_t spec;
  memset(&spec, 0, sizeof(spec));
  spec.sandbox_id = c->b.id;
  spec.tenant = c->b.tenant;
  spec.template_id = c->req.template_id;
  spec.caps = c->req.caps;
  spec.isolation = cand->isolation;
  spec.region = cand->region;
  spec.timeout_s = c->req.timeout_s;
  spec.env = c->req.env;
  spec.metadata = c->req.metadata;
  /* The agent checks this, the data plane derives and sends the same
   * (docs/tokens.md); the client's binding token never reaches the agent. */
  char agent_tok[65];
  if (gw->has_agent_secret && agent_token(gw, c->b.id, agent_tok) == 0)
    spec.agent_token = agent_tok;

  int64_t left = c->deadline_ms - now;
  uint64_t budget = left < OSR_CREATE_ATTEMPT_MS ? (uint64_t)(left > 0 ? left : 1)
                                                 : OSR_CREATE_ATTEMPT_MS;
  c->att = a;
  int rv = p->adapter->create(p, &spec, on_created, a);
  if (rv != 0) {
    c->att = NULL;
    a->c = c;
    on_created(p, rv, NULL, a);
    return;
  }
  uv_timer_start(&c->timer, on_attempt_timeout, budget, 0);
}

static void attempt_stored(int status, void *data)
{
  create_t *c = data;
  if (status != 0) {
    /* Without the durable record of where we are about to create, a crash
     * could leak the sandbox: do not call the provider. The row stays
     * creating and names the previous provider, which recovery resolves. */
    set_answer(c, 503, "unavailable", "the binding store is unavailable", NULL);
    osr_gw_audit(c->gw, &c->call->auth, "create", c->b.id, "unavailable", NULL);
    create_finish(c);
    return;
  }
  call_provider(c);
}

static void next_attempt(create_t *c)
{
  osr_gw_t *gw = c->gw;
  int64_t now = osr_now_ms();
  while (c->next < c->neligible) {
    if (now >= c->deadline_ms) {
      fail_all(c, "the create deadline passed");
      return;
    }
    osr_candidate_t *cand = &c->cands[c->next++];
    size_t pidx = 0;
    (void)osr_providers_find(gw->providers, cand->provider->name, &pidx);
    osr_provider_health_t *h = osr_providers_health(gw->providers, pidx);
    if (h != NULL && !osr_breaker_peek(&h->breaker, now)) {
      add_attempt(c, cand->provider->name, "circuit_open",
                  "the provider's circuit breaker is open", 0);
      continue;
    }
    /* The first attempt's provider is already in the intent row. */
    int first = c->nattempts == 0 && strcmp(c->b.provider, cand->provider->name) == 0;
    osr_str_copy(c->b.provider, sizeof(c->b.provider), cand->provider->name);
    osr_str_copy(c->b.region, sizeof(c->b.region), cand->region);
    c->b.isolation = cand->isolation;
    c->b.attempt = c->nattempts + 1;
    c->b.updated_ms = now;
    if (first) {
      call_provider(c);
      return;
    }
    int rv = osr_store_update(gw->store, &c->b, attempt_stored, c);
    if (rv != 0)
      attempt_stored(rv, c);
    return;
  }
  fail_all(c, "every capable provider failed");
}

/* ------------------------------------------------------------------------ */
/* Idempotent replays                                                        */

typedef struct poll_s {
  uv_timer_t timer;
  osr_gw_call_t *call;
  char tenant[OSR_TENANT_MAX];
  char id[OSR_ID_MAX];
  int64_t until_ms;
} poll_t;

static void poll_closed(uv_handle_t *h)
{
  osr_free(h->data);
}

static void poll_tick(uv_timer_t *t);

static void poll_got(int status, const osr_binding_t *b, int created, void *data)
{
  poll_t *p = data;
  osr_gw_t *gw = p->call->gw;
  (void)created;
  if (status != 0) {
    osr_gw_error_from(p->call, status, "sandbox");
  } else if (b->state == OSR_BINDING_CREATING) {
    create_t *c = find_inflight(gw, b->id);
    if (c != NULL) {
      /* It is ours after all: wait on it instead of polling. */
      waiter_t *w = osr_xcalloc(1, sizeof(*w));
      w->call = p->call;
      w->next = c->waiters;
      c->waiters = w;
      uv_close((uv_handle_t *)&p->timer, poll_closed);
      return;
    }
    if (osr_now_ms() < p->until_ms) {
      uv_timer_start(&p->timer, poll_tick, POLL_MS, 0);
      return;
    }
    reply_settled(gw, p->call, b, 200);
  } else {
    reply_settled(gw, p->call, b, 200);
  }
  osr_gw_call_release(p->call);
  uv_close((uv_handle_t *)&p->timer, poll_closed);
}

static void poll_tick(uv_timer_t *t)
{
  poll_t *p = t->data;
  int rv = osr_store_get(p->call->gw->store, p->tenant, p->id, poll_got, p);
  if (rv != 0)
    poll_got(rv == OSR_ECLOSED ? OSR_EUNAVAILABLE : rv, NULL, 0, p);
}

/* A second request with a key whose row exists and has the same body. */
static void replay(osr_gw_t *gw, osr_gw_call_t *call, const osr_binding_t *b)
{
  if (b->state != OSR_BINDING_CREATING) {
    reply_settled(gw, call, b, 200);
    return;
  }
  osr_gw_call_hold(call);
  create_t *c = find_inflight(gw, b->id);
  if (c != NULL) {
    waiter_t *w = osr_xcalloc(1, sizeof(*w));
    w->call = call;
    w->next = c->waiters;
    c->waiters = w;
    return;
  }
  poll_t *p = osr_xcalloc(1, sizeof(*p));
  p->call = call;
  osr_str_copy(p->tenant, sizeof(p->tenant), b->tenant);
  osr_str_copy(p->id, sizeof(p->id), b->id);
  p->until_ms = b->created_ms + OSR_CREATE_DEADLINE_MS + 5000;
  if (p->until_ms < osr_now_ms() + POLL_MS)
    p->until_ms = osr_now_ms() + POLL_MS;
  uv_timer_init(gw->loop, &p->timer);
  p->timer.data = p;
  uv_timer_start(&p->timer, poll_tick, POLL_MS, 0);
}

/* ------------------------------------------------------------------------ */
/* Start                                                                     */

static void intent_done(int status, const osr_binding_t *b, int created, void *data)
{
  create_t *c = data;
  osr_gw_t *gw = c->gw;
  if (status == 0)
    stamp_store(c, T_INTENT_RUN, T_INTENT_RAN, T_INTENT_BACK);
  if (status != 0) {
    set_answer(c, status == OSR_EUNAVAILABLE || status == OSR_ECLOSED ? 503 : 500,
               status == OSR_EUNAVAILABLE || status == OSR_ECLOSED ? "unavailable" : "internal",
               status == OSR_EUNAVAILABLE || status == OSR_ECLOSED
                   ? "the binding store is unavailable"
                   : "recording the create failed",
               NULL);
    create_finish(c);
    return;
  }
  if (!created) {
    osr_gw_call_t *call = c->call;
    if (strcmp(b->request_hash, c->b.request_hash) != 0) {
      osr_gw_error(call, 409, "idempotency_conflict",
                   "this Idempotency-Key was used with a different request body",
                   json_pack("{s:s}", "sandboxId", b->id));
    } else {
      replay(gw, call, b);
    }
    osr_gw_call_release(call);
    c->call = NULL;
    create_free(c);
    return;
  }
  if (c->neligible == 0) {
    size_t np = osr_providers_count(gw->providers);
    json_t *plan = osr_plan_to_json(c->cands, np, 0);
    json_t *prov = json_object_get(plan, "providers");
    json_t *details = json_pack("{s:O}", "providers", prov ? prov : plan);
    json_decref(plan);
    create_fail(c, "no_capable_provider", 422, "no provider can host this sandbox", details);
    return;
  }
  /* Registered only now: before the row exists there is nothing to wait on. */
  c->registered = 1;
  c->next_c = inflight;
  if (inflight)
    inflight->prev_c = c;
  inflight = c;
  next_attempt(c);
}

void osr__create_start(osr_gw_call_t *call, osr__sbx_req_t *req, const char *idem_key)
{
  osr_gw_t *gw = call->gw;
  create_t *c = osr_xcalloc(1, sizeof(*c));
  c->gw = gw;
  c->call = call;
  c->req = *req;
  osr_binding_init(&c->b);
  c->started_ms = (uint64_t)osr_now_ms();
  c->t_us[T_PARSED] = call->started_us;
  c->t_us[T_START] = uv_hrtime() / 1000;
  c->deadline_ms = (int64_t)c->started_ms + OSR_CREATE_DEADLINE_MS;
  c->attempts = json_array();
  uv_timer_init(gw->loop, &c->timer);
  c->timer.data = c;
  gw->inflight_creates++;
  osr_gw_call_hold(call);

  /* The canonical request: sorted keys, no whitespace, so the same body
   * hashes the same whichever way the client serialised it. */
  json_t *body = call->body ? json_incref(call->body) : json_object();
  char *canon = json_dumps(body, JSON_SORT_KEYS | JSON_COMPACT);
  json_decref(body);
  if (canon == NULL) {
    set_answer(c, 500, "internal", "out of memory", NULL);
    create_finish(c);
    return;
  }

  size_t np = osr_providers_count(gw->providers);
  c->cands = osr_xcalloc(np ? np : 1, sizeof(*c->cands));
  c->ncands = np;
  c->neligible = osr__sbx_place(gw, &c->req, c->cands);

  if (c->neligible == 0 && idem_key[0] == '\0') {
    /* Refused before anything was written: there is nothing to replay and
     * nothing to recover. The refusal is still audited. */
    json_t *plan = osr_plan_to_json(c->cands, np, 0);
    json_t *prov = json_object_get(plan, "providers");
    set_answer(c, 422, "no_capable_provider", "no provider can host this sandbox",
               json_pack("{s:O}", "providers", prov ? prov : plan));
    json_decref(plan);
    osr_gw_audit(gw, &call->auth, "create", "", "no_capable_provider", NULL);
    osr_json_free(canon);
    create_finish(c);
    return;
  }

  osr_binding_t *b = &c->b;
  osr_sandbox_id_new(b->id);
  osr_str_copy(b->tenant, sizeof(b->tenant), call->auth.tenant);
  osr_str_copy(b->idem_key, sizeof(b->idem_key), idem_key);
  osr_sha256_hex(canon, strlen(canon), b->request_hash);
  osr_str_copy(b->template_id, sizeof(b->template_id), c->req.template_id);
  /* Recovery at start resolves only its own instance's rows (and stale
   * ones): another gateway on the same database must see this row as ours. */
  osr_str_copy(b->owner, sizeof(b->owner), gw->cfg->instance_id ? gw->cfg->instance_id : "");
  if (c->neligible > 0) {
    osr_str_copy(b->provider, sizeof(b->provider), c->cands[0].provider->name);
    osr_str_copy(b->region, sizeof(b->region), c->cands[0].region);
    b->isolation = c->cands[0].isolation;
  }
  b->state = OSR_BINDING_CREATING;
  b->attempt = 1;
  int64_t now = osr_now_ms();
  b->created_ms = now;
  b->updated_ms = now;
  b->expires_ms = now + (int64_t)c->req.timeout_s * 1000;
  b->idle_timeout_ms = (int64_t)c->req.idle_timeout_s * 1000;
  b->request_json = osr_xstrdup(canon);
  osr_json_free(canon);
  if (c->req.metadata != NULL) {
    char *m = json_dumps(c->req.metadata, JSON_SORT_KEYS | JSON_COMPACT);
    b->metadata_json = m ? osr_xstrdup(m) : NULL;
    osr_json_free(m);
  }
  int rv = osr_store_create_intent(gw->store, b, intent_done, c);
  if (rv != 0)
    intent_done(rv == OSR_ECLOSED ? OSR_EUNAVAILABLE : rv, NULL, 0, c);
}

/* ------------------------------------------------------------------------ */
/* Crash recovery                                                            */
/*
 * Which rows are ours to resolve. Several gateways may share one PostgreSQL
 * database, so "every row still creating" includes creates that another
 * live gateway is running right now; failing or destroying those would
 * break its creates. Each intent row names its owner (cfg->instance_id), so:
 *   - at start we resolve our own rows of any age (creates this instance
 *     was running when it died: nobody else is running them), plus
 *   - rows of any owner older than stale_creating_ms (their gateway has been
 *     gone for longer than any create may run: the create deadline is 60 s
 *     and calls past it are abandoned, so a live owner never has one that
 *     old). The reaper resolves these on every pass, so a gateway that dies
 *     and never comes back leaves nothing creating for long.
 * The resolution (adopt what the provider has under the row's label, fail
 * the rest) is the same code for both callers.
 */

#define RECOVER_PAGE 500
#define RECOVER_MAX_ROWS 100000

typedef struct recover_s {
  osr_gw_t *gw;
  osr__resolve_cb cb;
  void *cb_data;
  int at_start;                /* recovery at start (else: the reaper) */
  int phase;                   /* listing: 0 = own rows, 1 = stale rows */
  int64_t stale_before_ms;     /* created_ms < this is stale */
  osr_binding_t *rows;         /* bindings left creating, sorted by id */
  unsigned char *adopted;
  size_t n, cap;
  unsigned char *list_failed;  /* per provider index */
  char cursor[256];
  size_t pi;                   /* provider being reconciled */
  osr_provider_t *p;
  osr_resource_t *res;         /* its labelled resources (copy) */
  size_t nres, ri;
  size_t fi;                   /* final pass over unadopted rows */
  osr_gw_auth_t who;
  const char *act_adopt, *act_fail, *act_orphan;
  unsigned adopted_n, orphans_n, failed_n;
} recover_t;

static void rec_list_page(recover_t *r);
static void rec_provider(recover_t *r);
static void rec_resource(recover_t *r);
static void rec_final(recover_t *r);

static int cmp_row(const void *a, const void *b)
{
  return strcmp(((const osr_binding_t *)a)->id, ((const osr_binding_t *)b)->id);
}

static void rec_end(recover_t *r, int status)
{
  if (status != 0)
    OSR_LOG_ERROR(MOD, "%s failed: %s", r->at_start ? "recovery" : "stale creates",
                  osr__err_text(status));
  else if (r->at_start || r->n > 0)
    OSR_LOG_INFO(MOD, "%s: %zu interrupted create(s): %u adopted, %u failed, %u orphan(s) "
                      "destroyed",
                 r->at_start ? "recovery" : "stale creates", r->n, r->adopted_n, r->failed_n,
                 r->orphans_n);
  for (size_t i = 0; i < r->n; i++)
    osr_binding_dispose(&r->rows[i]);
  osr_free(r->rows);
  osr_free(r->adopted);
  osr_free(r->list_failed);
  osr_free(r->res);
  osr__resolve_cb cb = r->cb;
  void *cb_data = r->cb_data;
  osr_gw_t *gw = r->gw;
  osr_free(r);
  if (cb != NULL)
    cb(gw, status, cb_data);
}

/* Rows arrive from two queries (own, stale) that overlap; sorted, the
 * duplicates are neighbours and the second copy goes. */
static void rec_sort_dedup(recover_t *r)
{
  size_t o = 0;
  if (r->n > 0)
    qsort(r->rows, r->n, sizeof(*r->rows), cmp_row);
  for (size_t i = 0; i < r->n; i++) {
    if (o > 0 && strcmp(r->rows[o - 1].id, r->rows[i].id) == 0) {
      osr_binding_dispose(&r->rows[i]);
      continue;
    }
    if (o != i)
      r->rows[o] = r->rows[i];
    o++;
  }
  r->n = o;
}

static void rec_listed_rows(int status, const osr_binding_t *items, size_t n, const char *next,
                            void *data)
{
  recover_t *r = data;
  if (status != 0) {
    rec_end(r, status);
    return;
  }
  for (size_t i = 0; i < n && r->n < RECOVER_MAX_ROWS; i++) {
    /* A create this process is running is not interrupted (the reaper runs
     * beside live creates; at start there are none). */
    if (osr__create_in_flight(r->gw, items[i].id))
      continue;
    if (r->n == r->cap) {
      r->cap = r->cap ? 2 * r->cap : 64;
      r->rows = osr_xrealloc(r->rows, r->cap * sizeof(*r->rows));
    }
    osr_binding_init(&r->rows[r->n]);
    osr_binding_copy(&r->rows[r->n++], &items[i]);
  }
  if (next != NULL && r->n < RECOVER_MAX_ROWS) {
    osr_str_copy(r->cursor, sizeof(r->cursor), next);
    rec_list_page(r);
    return;
  }
  if (r->phase == 0) {
    r->phase = 1;
    r->cursor[0] = '\0';
    rec_list_page(r);
    return;
  }
  rec_sort_dedup(r);
  if (r->n == 0) {
    /* Nothing to resolve: no provider needs listing. */
    rec_end(r, 0);
    return;
  }
  r->adopted = osr_xcalloc(r->n, 1);
  r->pi = 0;
  rec_provider(r);
}

static void rec_list_page(recover_t *r)
{
  osr_store_query_t q;
  memset(&q, 0, sizeof(q));
  q.state_mask = 1u << OSR_BINDING_CREATING;
  q.limit = RECOVER_PAGE;
  q.cursor = r->cursor[0] ? r->cursor : NULL;
  if (r->phase == 0)
    q.owner = r->gw->cfg->instance_id ? r->gw->cfg->instance_id : "";
  else
    q.created_before_ms = r->stale_before_ms;
  int rv = osr_store_list(r->gw->store, &q, rec_listed_rows, r);
  if (rv != 0)
    rec_end(r, rv);
}

static void rec_next_resource(recover_t *r)
{
  r->ri++;
  rec_resource(r);
}

static void rec_destroyed(osr_provider_t *p, int status, void *data)
{
  recover_t *r = data;
  const osr_resource_t *res = &r->res[r->ri];
  int ok = status == 0 || status == OSR_PERR_NOT_FOUND;
  if (!ok)
    OSR_LOG_WARN(MOD, "recovery: destroying %s on %s failed: %s", res->provider_id, p->name,
                 osr_provider_err_name(status));
  r->orphans_n += ok;
  osr_gw_audit(r->gw, &r->who, r->act_orphan, res->sandbox_id,
               ok ? "ok" : osr_provider_err_name(status),
               json_pack("{s:s,s:s}", "provider", p->name, "providerId", res->provider_id));
  if (ok && r->gw->metrics != NULL && !r->at_start)
    osr_metrics_reaper(r->gw->metrics, r->act_orphan + 5 /* after "reap." */);
  rec_next_resource(r);
}

static void rec_destroy(recover_t *r)
{
  int rv = r->p->adapter->destroy(r->p, r->res[r->ri].provider_id, rec_destroyed, r);
  if (rv != 0)
    rec_destroyed(r->p, rv, r);
}

static void rec_got(int status, const osr_binding_t *b, int created, void *data);

static void rec_adopt_stored(int status, void *data)
{
  recover_t *r = data;
  const osr_resource_t *res = &r->res[r->ri];
  osr_binding_t key;
  snprintf(key.id, sizeof(key.id), "%.39s", res->sandbox_id);
  osr_binding_t *row = bsearch(&key, r->rows, r->n, sizeof(*r->rows), cmp_row);
  if (status == OSR_ECONFLICT || status == OSR_ENOTFOUND) {
    /* Someone else resolved the row first. Whether this resource is now
     * theirs (they adopted it too) or an orphan (they failed the row) is
     * for the fresh row to say: rec_got keeps or destroys it. */
    OSR_LOG_INFO(MOD, "recovery: %s was resolved by another gateway", res->sandbox_id);
    if (row != NULL)
      r->adopted[row - r->rows] = 1; /* nothing left for rec_final to do */
    int rv = osr_store_get(r->gw->store, NULL, res->sandbox_id, rec_got, r);
    if (rv != 0)
      rec_got(rv, NULL, 0, r);
    return;
  }
  if (status != 0) {
    /* The store went away mid-recovery: leave the row creating (a later
     * recovery resolves it) and the resource in place (it is labelled). */
    OSR_LOG_WARN(MOD, "recovery: adopting %s: %s", res->sandbox_id, osr__err_text(status));
  } else if (row != NULL) {
    r->adopted[row - r->rows] = 1;
    r->adopted_n++;
    osr__cache_put(r->gw, row);
    if (r->gw->metrics != NULL && !r->at_start)
      osr_metrics_reaper(r->gw->metrics, r->act_adopt + 5);
  }
  rec_next_resource(r);
}

static void rec_adopt_store(recover_t *r, osr_binding_t *row, const osr_resource_t *res);

/* The adapter completed the listed resource r->res[r->ri] for adoption. */
static void rec_adopt_completed(osr_provider_t *p, int status, const osr_resource_t *res,
                                void *data)
{
  recover_t *r = data;
  osr_resource_t *have = &r->res[r->ri];
  osr_binding_t key;
  snprintf(key.id, sizeof(key.id), "%.39s", have->sandbox_id);
  osr_binding_t *row = bsearch(&key, r->rows, r->n, sizeof(*r->rows), cmp_row);
  if (status == 0 && res != NULL && row != NULL) {
    osr_str_copy(have->agent_endpoint, sizeof(have->agent_endpoint), res->agent_endpoint);
    rec_adopt_store(r, row, have);
    return;
  }
  if (status != OSR_PERR_NOT_FOUND && row != NULL) {
    /* Cannot tell now: leave the row creating (like a failed listing), the
     * reaper's stale-create pass tries again. */
    OSR_LOG_WARN(MOD, "recovery: completing %s on %s failed: %s; it stays pending",
                 have->provider_id, p->name, osr_provider_err_name(status));
    r->adopted[row - r->rows] = 1;
  }
  /* NOT_FOUND: gone since the listing; rec_final fails the row. */
  rec_next_resource(r);
}

/* Adopt `res` for `row` unless it does not cover what the request asked.
 * An adapter whose list() cannot report a usable endpoint (adopt != NULL)
 * completes the resource first, given the sandbox's agent token. */
static void rec_adopt(recover_t *r, osr_binding_t *row, const osr_resource_t *res)
{
  osr__sbx_req_t req;
  char why[200];
  json_t *body = row->request_json ? json_loads(row->request_json, 0, NULL) : NULL;
  int parsed = body != NULL && osr__sbx_req_parse(r->gw, body, &req, why, sizeof(why)) == 0;
  json_decref(body);
  if (parsed) {
    int covers = osr__caps_cover(&req.caps, &res->granted, why, sizeof(why));
    osr__sbx_req_dispose(&req);
    if (!covers) {
      rec_destroy(r);
      return;
    }
  }
  char agent_tok[65];
  if (r->p->adapter->adopt != NULL && r->gw->has_agent_secret &&
      agent_token(r->gw, row->id, agent_tok) == 0) {
    int rv = r->p->adapter->adopt(r->p, res->provider_id, row->id, agent_tok, rec_adopt_completed,
                                  r);
    explicit_bzero(agent_tok, sizeof(agent_tok));
    if (rv != 0)
      rec_adopt_completed(r->p, rv, NULL, r);
    return;
  }
  rec_adopt_store(r, row, res);
}

static void rec_adopt_store(recover_t *r, osr_binding_t *row, const osr_resource_t *res)
{
  int64_t now = osr_now_ms();
  int64_t seen_ms = row->updated_ms; /* the version we decided on */
  osr_str_copy(row->provider_id, sizeof(row->provider_id), res->provider_id);
  if (res->region[0])
    osr_str_copy(row->region, sizeof(row->region), res->region);
  if (res->isolation != OSR_ISO_NONE)
    row->isolation = res->isolation;
  osr_str_copy(row->agent_endpoint, sizeof(row->agent_endpoint), res->agent_endpoint);
  row->state = res->state == OSR_RES_PAUSED ? OSR_BINDING_PAUSED : OSR_BINDING_RUNNING;
  row->updated_ms = now;
  row->last_activity_ms = now;
  osr_free(row->granted_json);
  row->granted_json = caps_text(&res->granted);
  /* Compare-and-set on the row as we listed it: another gateway (the owner
   * back from a restart, or a second gateway's reaper) may be resolving the
   * same row right now, one adopting and one failing it. The database lets
   * exactly one of us change it; the loser re-checks the resource. */
  osr_str_copy(r->who.tenant, sizeof(r->who.tenant), row->tenant);
  int rv = update_audited(r->gw, row, OSR_BINDING_CREATING, seen_ms, 0, &r->who, r->act_adopt, "ok",
                          detail_text(json_pack("{s:s,s:s,s:s}", "provider", row->provider,
                                                "providerId", row->provider_id, "resolution",
                                                "adopted")),
                          rec_adopt_stored, r);
  if (rv != 0)
    rec_adopt_stored(rv, r);
}

static void rec_got(int status, const osr_binding_t *b, int created, void *data)
{
  recover_t *r = data;
  const char *why = "";
  (void)created;
  if (status != 0 && status != OSR_ENOTFOUND) {
    /* Cannot tell: keep the resource; the reaper looks again later. */
    rec_next_resource(r);
    return;
  }
  if (osr__resource_is_bound(status == 0 ? b : NULL, r->p->name, r->res[r->ri].provider_id, &why)) {
    rec_next_resource(r);
    return;
  }
  OSR_LOG_INFO(MOD, "recovery: %s on %s is an orphan (%s)", r->res[r->ri].provider_id, r->p->name,
               why);
  rec_destroy(r);
}

static void rec_resource(recover_t *r)
{
  while (r->ri < r->nres) {
    const osr_resource_t *res = &r->res[r->ri];
    if (res->sandbox_id[0] == '\0') {
      r->ri++;
      continue;
    }
    osr_binding_t key;
    snprintf(key.id, sizeof(key.id), "%.39s", res->sandbox_id);
    osr_binding_t *row = r->n ? bsearch(&key, r->rows, r->n, sizeof(*r->rows), cmp_row) : NULL;
    if (row != NULL) {
      int usable = res->state != OSR_RES_STOPPED && res->state != OSR_RES_GONE;
      if (strcmp(row->provider, r->p->name) == 0 && !r->adopted[row - r->rows] && usable)
        rec_adopt(r, row, res);
      else
        rec_destroy(r);
      return;
    }
    if (!r->at_start) {
      /* The reaper's own reconciliation deals with every other resource
       * later in the same pass; checking it here too would double the
       * store reads. */
      r->ri++;
      continue;
    }
    int rv = osr_store_get(r->gw->store, NULL, res->sandbox_id, rec_got, r);
    if (rv != 0)
      rec_got(rv, NULL, 0, r);
    return;
  }
  osr_freep(&r->res);
  r->nres = 0;
  r->pi++;
  rec_provider(r);
}

static void rec_listed(osr_provider_t *p, int status, const osr_resource_t *res, size_t n,
                       void *data)
{
  recover_t *r = data;
  if (status != 0) {
    OSR_LOG_WARN(MOD, "recovery: listing %s failed: %s; its interrupted creates stay pending",
                 p->name, osr_provider_err_name(status));
    r->list_failed[r->pi] = 1;
    r->pi++;
    rec_provider(r);
    return;
  }
  r->res = osr_xcalloc(n ? n : 1, sizeof(*r->res));
  if (n > 0)
    memcpy(r->res, res, n * sizeof(*res));
  r->nres = n;
  r->ri = 0;
  rec_resource(r);
}

static void rec_provider(recover_t *r)
{
  size_t np = osr_providers_count(r->gw->providers);
  while (r->pi < np) {
    r->p = osr_providers_at(r->gw->providers, r->pi);
    int rv = r->p->adapter->list(r->p, rec_listed, r);
    if (rv == 0)
      return;
    OSR_LOG_WARN(MOD, "recovery: cannot list %s: %s", r->p->name, osr_provider_err_name(rv));
    r->list_failed[r->pi++] = 1;
  }
  r->fi = 0;
  rec_final(r);
}

static void rec_failed_stored(int status, void *data)
{
  recover_t *r = data;
  osr_binding_t *row = &r->rows[r->fi];
  if (status == 0) {
    r->failed_n++;
    osr__cache_invalidate(r->gw, row->id);
    if (r->gw->metrics != NULL && !r->at_start)
      osr_metrics_reaper(r->gw->metrics, r->act_fail + 5);
  } else if (status == OSR_ECONFLICT || status == OSR_ENOTFOUND) {
    /* Resolved (or adopted) by another gateway since we listed it. */
    OSR_LOG_INFO(MOD, "recovery: %s was resolved by another gateway", row->id);
  } else {
    OSR_LOG_WARN(MOD, "recovery: failing %s: %s", row->id, osr__err_text(status));
  }
  r->fi++;
  rec_final(r);
}

/* No resource carries this id on the provider the row names: the process
 * died before the provider created anything (or it already cleaned up after
 * a boot failure). Fail the row, but only as we listed it: another gateway
 * (the owner back from a restart, or a second gateway's reaper) may have
 * resolved it since our snapshot, and a row it adopted must not be turned
 * into a failure. The compare-and-set in the store decides; a re-read
 * followed by a plain update would leave a window between the two. */
static void rec_fail(recover_t *r, osr_binding_t *row)
{
  int64_t now = osr_now_ms();
  int64_t seen_ms = row->updated_ms;
  row->state = OSR_BINDING_FAILED;
  row->updated_ms = now;
  row->ended_ms = now;
  snprintf(row->end_reason, sizeof(row->end_reason), "failed: interrupted");
  osr_free(row->error_json);
  row->error_json = osr_xstrdup("{\"code\":\"all_providers_failed\",\"message\":\"the gateway "
                                "stopped while the sandbox was being created\",\"attempts\":[]}");
  osr_str_copy(r->who.tenant, sizeof(r->who.tenant), row->tenant);
  int rv = update_audited(r->gw, row, OSR_BINDING_CREATING, seen_ms, 0, &r->who, r->act_fail, "ok",
                          detail_text(json_pack("{s:s,s:s,s:s}", "provider", row->provider,
                                                "reason", "interrupted", "resolution", "failed")),
                          rec_failed_stored, r);
  if (rv != 0)
    rec_failed_stored(rv, r);
}

static void rec_final(recover_t *r)
{
  while (r->fi < r->n) {
    osr_binding_t *row = &r->rows[r->fi];
    size_t pidx = 0;
    osr_provider_t *p = row->provider[0]
                            ? osr_providers_find(r->gw->providers, row->provider, &pidx)
                            : NULL;
    if (r->adopted[r->fi] || (p != NULL && r->list_failed[pidx])) {
      r->fi++;
      continue;
    }
    rec_fail(r, row);
    return;
  }
  rec_end(r, 0);
}

void osr__resolve_creating(osr_gw_t *gw, int at_start, osr__resolve_cb cb, void *data)
{
  recover_t *r = osr_xcalloc(1, sizeof(*r));
  r->gw = gw;
  r->cb = cb;
  r->cb_data = data;
  r->at_start = at_start;
  size_t np = osr_providers_count(gw->providers);
  r->list_failed = osr_xcalloc(np ? np : 1, 1);
  uint64_t stale = gw->cfg->stale_creating_ms ? gw->cfg->stale_creating_ms : 120000;
  r->stale_before_ms = osr_now_ms() - (int64_t)stale;
  if (at_start) {
    osr__auth_system(&r->who, "system", NULL);
    r->act_adopt = "recover.adopt";
    r->act_fail = "recover.fail";
    r->act_orphan = "recover.orphan";
    /* Phase 0 lists our own rows. Without an id (a config built by hand:
     * osr_gw_config_load always sets one) our rows are the ones with owner
     * "", which is also what create writes then: one gateway alone
     * behaves as before owners existed. */
    r->phase = 0;
  } else {
    osr__auth_system(&r->who, "reaper", NULL);
    r->act_adopt = "reap.stale_creating";
    r->act_fail = "reap.stale_creating";
    r->act_orphan = "reap.orphan";
    r->phase = 1;
  }
  if (gw->store == NULL) {
    rec_end(r, OSR_EUNAVAILABLE);
    return;
  }
  rec_list_page(r);
}

typedef struct recover_start_s {
  void (*cb)(osr_gw_t *gw, int status);
} recover_start_t;

static void recovered(osr_gw_t *gw, int status, void *data)
{
  recover_start_t *s = data;
  void (*cb)(osr_gw_t *, int) = s->cb;
  osr_free(s);
  if (cb != NULL)
    cb(gw, status);
}

void osr_gw_recover(osr_gw_t *gw, void (*cb)(osr_gw_t *gw, int status))
{
  recover_start_t *s = osr_xcalloc(1, sizeof(*s));
  s->cb = cb;
  osr__resolve_creating(gw, 1, recovered, s);
}
