/*
 * The reaper: enforces every binding's absolute TTL and idle timeout and
 * reconciles bindings with what the providers really run: TTLs every
 * cfg->reaper_interval_ms, the providers' listings at start and every
 * reconcile interval (osr_reaper_reconcile_ms, 12 passes by default).
 *
 *   TTL / idle   expires_ms passed, or last_activity_ms + idle_timeout_ms
 *                passed → destroy the provider resource, mark the binding
 *                ENDED ("ttl" / "idle"), invalidate the cache, audit.
 *   orphans      a provider resource carrying our label with no live binding
 *                → destroyed, audited ("reap.orphan").
 *   lost         a RUNNING/PAUSED binding whose provider no longer has the
 *                resource → marked LOST, cache invalidated, audited.
 *
 * One pass at a time; a pass that overlaps the next tick is skipped. Work per
 * pass is bounded (pages of 500 bindings, at most 64 provider calls in flight).
 */
#ifndef OSR_GATEWAY_REAPER_H
#define OSR_GATEWAY_REAPER_H

#include "gateway/gw.h"

int osr_reaper_start(osr_gw_t *gw, osr_reaper_t **out);
/** Run one pass now (tests, `osr doctor`); cb when it ends. */
void osr_reaper_run_once(osr_reaper_t *r, void (*cb)(osr_reaper_t *r, int status, void *data),
                         void *data);
void osr_reaper_stop(osr_reaper_t *r, void (*cb)(void *data), void *data);

#endif
