/*
 * A circuit breaker per provider (closed -> open -> half-open -> closed),
 * fed by create outcomes, including failures after the provider accepted the
 * create (boot failures). Pure state machine over a caller-supplied clock.
 *
 *   closed     requests flow; outcomes go into a sliding window of the last
 *              `window` creates. When at least `min_requests` are in the
 *              window and the failure ratio reaches `failure_ratio`, or
 *              `consecutive_failures` happen in a row, the breaker opens.
 *   open       requests are refused (placement skips the provider) until
 *              `open_ms` passed; then half-open.
 *   half-open  up to `half_open_probes` requests are let through; if they all
 *              succeed the breaker closes (window cleared), any failure
 *              re-opens it (with open_ms doubled, capped at max_open_ms).
 */
#ifndef OSR_GATEWAY_BREAKER_H
#define OSR_GATEWAY_BREAKER_H

#include <stdint.h>

typedef enum osr_breaker_state_e {
  OSR_BREAKER_CLOSED = 0,
  OSR_BREAKER_OPEN = 1,
  OSR_BREAKER_HALF_OPEN = 2,
} osr_breaker_state_t;

typedef struct osr_breaker_config_s {
  uint32_t window;               /**< default 20 */
  uint32_t min_requests;         /**< default 10 */
  double failure_ratio;          /**< default 0.5 */
  uint32_t consecutive_failures; /**< default 5 */
  uint64_t open_ms;              /**< default 5000 */
  uint64_t max_open_ms;          /**< default 60000 */
  uint32_t half_open_probes;     /**< default 1 */
} osr_breaker_config_t;

#define OSR_BREAKER_WINDOW_MAX 256

typedef struct osr_breaker_s {
  osr_breaker_config_t cfg;
  osr_breaker_state_t state;
  uint8_t ring[OSR_BREAKER_WINDOW_MAX]; /* 1 = failure */
  uint32_t ring_pos, ring_len, ring_failures;
  uint32_t consecutive;
  int64_t opened_at_ms;
  uint64_t current_open_ms;
  uint32_t probes_in_flight, probes_ok;
  uint64_t times_opened;
} osr_breaker_t;

/** Zero fields of cfg take the defaults. */
void osr_breaker_init(osr_breaker_t *b, const osr_breaker_config_t *cfg);
/** May a request go to this provider now? In half-open, a 1 answer reserves a
 *  probe slot that the next osr_breaker_record() releases. */
int osr_breaker_allow(osr_breaker_t *b, int64_t now_ms);
/** Would osr_breaker_allow() say yes (without reserving)? For plans. */
int osr_breaker_peek(const osr_breaker_t *b, int64_t now_ms);
void osr_breaker_record(osr_breaker_t *b, int success, int64_t now_ms);
/** Give back a half-open probe slot reserved by osr_breaker_allow() when the
 *  request ended without an outcome that says anything about the provider
 *  (cancelled by shutdown, rejected as invalid). No-op in other states. */
void osr_breaker_release(osr_breaker_t *b);
/** When an OPEN breaker turns half-open (unix ms); 0 if not open. */
int64_t osr_breaker_open_until(const osr_breaker_t *b, int64_t now_ms);
osr_breaker_state_t osr_breaker_state(const osr_breaker_t *b, int64_t now_ms);
const char *osr_breaker_state_name(osr_breaker_state_t s);

#endif
