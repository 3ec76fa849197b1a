/*
 * The gateway's side of data-plane activity reports (docs/dataplane.md,
 * "Activity"; the data plane's side is dataplane/activity.c). Every path
 * ends in osr_store_touch, which only ever moves a binding's
 * last_activity_ms forward; the reaper's idle rule reads that column.
 *
 *   in process   `osr serve`: the embedded data plane calls
 *                osr_gw_activity_report directly;
 *   Redis        data planes merge into the hash "<prefix>activity"; the
 *                reaper drains it at the start of every pass
 *                (osr__gw_activity_drain), so each idle decision sees every
 *                report that reached Redis before the pass began;
 *   HTTP         POST /v1/internal/activity (admin key), answered 204 once
 *                every touch of the batch is in the store.
 */
#ifndef OSR_GATEWAY_ACTIVITY_H
#define OSR_GATEWAY_ACTIVITY_H

#include <stdint.h>

#include "gateway/api.h"
#include "gateway/gw.h"

/** Most reports one POST /v1/internal/activity may carry. */
#define OSR_GW_ACTIVITY_POST_MAX 10000

/** Record that `sandbox_id` had data-plane traffic at `at_ms` (unix ms;
 *  clamped to now, so a skewed clock cannot postpone an idle kill). Fire
 *  and forget: a store error is logged. Ids that are not sandbox ids are
 *  ignored. */
void osr_gw_activity_report(osr_gw_t *gw, const char *sandbox_id, int64_t at_ms);

/** POST /v1/internal/activity: {"activity":[{"id":"<sandbox id>","at":<unix ms>},
 *  ...]} (admin key). 204 when every report is stored, 400 for a malformed
 *  batch, 503 when the store failed (the data plane retries). */
void osr_gw_activity_post(osr_gw_call_t *call);

/** Apply what data planes left in Redis (bounded: at most 64 rounds of
 *  OSR_REDIS_ACTIVITY_BATCH_MAX), then call done once, on the loop thread
 *  (synchronously when there is no Redis or it is down). */
void osr__gw_activity_drain(osr_gw_t *gw, void (*done)(void *data), void *data);

#endif
