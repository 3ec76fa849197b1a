/*
 * Gateway metrics in Prometheus text format (GET /metrics). Counters and
 * histograms live in memory on the loop thread (no locks); gauges that come
 * from elsewhere (breaker state, store/Redis latency, sandboxes by state)
 * are read when /metrics is scraped.
 *
 * Exposed series (all prefixed osr_):
 *   http_requests_total{route,method,code}
 *   http_request_duration_seconds{route} (histogram)
 *   creates_total{provider,outcome}      outcome: ok | capacity | rate_limited | timeout |
 *                                        unavailable | boot_failed | auth | invalid | ...
 *   create_failovers_total               creates that needed more than one provider
 *   create_duration_seconds (histogram)  end to end, as the client sees it
 *   provider_breaker_state{provider}     0 closed, 1 open, 2 half-open
 *   provider_create_latency_ewma_ms{provider}
 *   sandboxes{state}                     from the store, refreshed by the reaper
 *   store_latency_seconds / redis_latency_seconds (last round trip)
 *   redis_up, reaper_actions_total{action}, audit_failures_total
 */
#ifndef OSR_GATEWAY_METRICS_H
#define OSR_GATEWAY_METRICS_H

#include <stdint.h>

#include "gateway/gw.h"
#include "util/buf.h"

osr_metrics_t *osr_metrics_new(void);
void osr_metrics_free(osr_metrics_t *m);

void osr_metrics_http(osr_metrics_t *m, const char *route, const char *method, int code,
                      uint64_t duration_us);
void osr_metrics_create(osr_metrics_t *m, const char *provider, const char *outcome);
void osr_metrics_create_done(osr_metrics_t *m, int attempts, uint64_t duration_us);
void osr_metrics_reaper(osr_metrics_t *m, const char *action);
void osr_metrics_audit_failure(osr_metrics_t *m);
/** Sandboxes by state, as last counted (index = osr_binding_state_t). */
void osr_metrics_sandboxes(osr_metrics_t *m, const uint64_t *by_state, size_t n);

/** Render everything (including gauges read from gw) into `out`. */
int osr_metrics_render(osr_metrics_t *m, osr_gw_t *gw, osr_buf_t *out);

#endif
