/*
 * The audit writer: every API mutation (create, kill, timeout, key create
 * and revoke) and every reaper action is appended to the store's audit log.
 *
 * Fire and forget: the caller's answer never waits for the audit row, and
 * an audit failure never fails the operation it describes (the operation
 * already happened). Failures are logged and counted in
 * osr_audit_failures_total so they cannot go unnoticed.
 */
#include <stdio.h>
#include <string.h>

#include "gateway/api_int.h"
#include "gateway/metrics.h"
#include "gateway/sandboxes.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/text.h"

typedef struct pending_s {
  osr_gw_t *gw;
  osr_audit_event_t ev; /* kept until the store answers: the store may read
                           it on its worker after append returns */
} pending_t;

static void pending_free(pending_t *p)
{
  osr_json_free(p->ev.detail_json);
  osr_free(p);
}

static void on_appended(int status, void *data)
{
  pending_t *p = data;
  if (status != 0) {
    OSR_LOG_WARN("audit", "append %s %s: %s", p->ev.action, p->ev.sandbox_id,
                 osr__gw_strerror(status));
    osr_metrics_audit_failure(p->gw->metrics);
  }
  pending_free(p);
}

void osr__gw_audit_as(osr_gw_t *gw, const char *tenant, const char *actor, const char *action,
                      const char *sandbox_id, const char *outcome, json_t *detail)
{
  pending_t *p = osr_xcalloc(1, sizeof(*p));
  p->gw = gw;
  p->ev.at_ms = osr_now_ms();
  osr_str_copy(p->ev.tenant, sizeof(p->ev.tenant), tenant != NULL ? tenant : "");
  osr_str_copy(p->ev.actor, sizeof(p->ev.actor), actor != NULL ? actor : "system");
  osr_str_copy(p->ev.action, sizeof(p->ev.action), action != NULL ? action : "");
  osr_str_copy(p->ev.sandbox_id, sizeof(p->ev.sandbox_id), sandbox_id != NULL ? sandbox_id : "");
  osr_str_copy(p->ev.outcome, sizeof(p->ev.outcome), outcome != NULL ? outcome : "ok");
  if (detail != NULL) {
    if (json_is_object(detail))
      p->ev.detail_json = json_dumps(detail, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(detail);
  }
  int rv =
      gw->store != NULL ? osr_store_audit_append(gw->store, &p->ev, on_appended, p) : OSR_ECLOSED;
  if (rv != 0)
    on_appended(rv, p);
}

void osr_gw_audit(osr_gw_t *gw, const osr_gw_auth_t *who, const char *action,
                  const char *sandbox_id, const char *outcome, json_t *detail)
{
  osr__gw_audit_as(gw, who != NULL ? who->tenant : "", who != NULL ? who->key_id : "system", action,
                   sandbox_id, outcome, detail);
}

/* ---- audit rows that commit with the change they describe ------------------ */

void osr__audit_event(osr_audit_event_t *ev, const osr_gw_auth_t *who, const char *action,
                      const char *sandbox_id, const char *outcome, const char *detail_json)
{
  memset(ev, 0, sizeof(*ev));
  ev->at_ms = osr_now_ms();
  osr_str_copy(ev->tenant, sizeof(ev->tenant), who != NULL ? who->tenant : "");
  osr_str_copy(ev->actor, sizeof(ev->actor), who != NULL ? who->key_id : "system");
  osr_str_copy(ev->action, sizeof(ev->action), action != NULL ? action : "");
  osr_str_copy(ev->sandbox_id, sizeof(ev->sandbox_id), sandbox_id != NULL ? sandbox_id : "");
  osr_str_copy(ev->outcome, sizeof(ev->outcome), outcome != NULL ? outcome : "ok");
  ev->detail_json = detail_json != NULL ? osr_xstrdup(detail_json) : NULL;
}

void osr__audit_event_dispose(osr_audit_event_t *ev)
{
  osr_freep(&ev->detail_json);
}
