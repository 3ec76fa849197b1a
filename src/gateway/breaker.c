/*
 * Circuit breaker (see breaker.h for the state machine).
 *
 * The breaker is a pure value: no timers, no I/O, the clock is an argument.
 * OPEN -> HALF_OPEN is therefore not an event but a question of time: every
 * entry point first "advances" the state to what the clock says, so a
 * breaker nobody touched for a minute is half-open the moment someone asks.
 *
 * The sliding window is a ring of the last `window` outcomes with a running
 * failure count, so both trip conditions are O(1) per outcome.
 */
#include "gateway/breaker.h"

#include <string.h>

static void set_defaults(osr_breaker_config_t *c)
{
  if (c->window == 0)
    c->window = 20;
  if (c->window > OSR_BREAKER_WINDOW_MAX)
    c->window = OSR_BREAKER_WINDOW_MAX;
  if (c->min_requests == 0)
    c->min_requests = 10;
  /* A window smaller than min_requests could never trip on the ratio. */
  if (c->min_requests > c->window)
    c->min_requests = c->window;
  if (c->failure_ratio <= 0 || c->failure_ratio > 1)
    c->failure_ratio = 0.5;
  if (c->consecutive_failures == 0)
    c->consecutive_failures = 5;
  if (c->open_ms == 0)
    c->open_ms = 5000;
  if (c->max_open_ms == 0)
    c->max_open_ms = 60000;
  if (c->max_open_ms < c->open_ms)
    c->max_open_ms = c->open_ms;
  if (c->half_open_probes == 0)
    c->half_open_probes = 1;
}

void osr_breaker_init(osr_breaker_t *b, const osr_breaker_config_t *cfg)
{
  memset(b, 0, sizeof(*b));
  if (cfg != NULL)
    b->cfg = *cfg;
  set_defaults(&b->cfg);
  b->state = OSR_BREAKER_CLOSED;
  b->current_open_ms = b->cfg.open_ms;
}

static void clear_window(osr_breaker_t *b)
{
  memset(b->ring, 0, sizeof(b->ring));
  b->ring_pos = b->ring_len = b->ring_failures = 0;
  b->consecutive = 0;
}

static int open_elapsed(const osr_breaker_t *b, int64_t now_ms)
{
  return now_ms - b->opened_at_ms >= (int64_t)b->current_open_ms;
}

/* Apply the passage of time: an OPEN breaker whose open time is over is
 * half-open, with no probe admitted yet. */
static void advance(osr_breaker_t *b, int64_t now_ms)
{
  if (b->state == OSR_BREAKER_OPEN && open_elapsed(b, now_ms)) {
    b->state = OSR_BREAKER_HALF_OPEN;
    b->probes_in_flight = 0;
    b->probes_ok = 0;
  }
}

static void trip(osr_breaker_t *b, int64_t now_ms, uint64_t open_ms)
{
  b->state = OSR_BREAKER_OPEN;
  b->opened_at_ms = now_ms;
  b->current_open_ms = open_ms;
  b->probes_in_flight = 0;
  b->probes_ok = 0;
  b->times_opened++;
}

osr_breaker_state_t osr_breaker_state(const osr_breaker_t *b, int64_t now_ms)
{
  if (b->state == OSR_BREAKER_OPEN && open_elapsed(b, now_ms))
    return OSR_BREAKER_HALF_OPEN;
  return b->state;
}

int64_t osr_breaker_open_until(const osr_breaker_t *b, int64_t now_ms)
{
  if (osr_breaker_state(b, now_ms) != OSR_BREAKER_OPEN)
    return 0;
  return b->opened_at_ms + (int64_t)b->current_open_ms;
}

int osr_breaker_peek(const osr_breaker_t *b, int64_t now_ms)
{
  switch (osr_breaker_state(b, now_ms)) {
  case OSR_BREAKER_CLOSED:
    return 1;
  case OSR_BREAKER_OPEN:
    return 0;
  case OSR_BREAKER_HALF_OPEN:
    /* Turned half-open by the clock only: nothing admitted yet. */
    if (b->state == OSR_BREAKER_OPEN)
      return 1;
    /* Probes admitted so far = still running + already succeeded. */
    return b->probes_in_flight + b->probes_ok < b->cfg.half_open_probes;
  }
  return 0;
}

int osr_breaker_allow(osr_breaker_t *b, int64_t now_ms)
{
  advance(b, now_ms);
  if (b->state == OSR_BREAKER_CLOSED)
    return 1;
  if (b->state == OSR_BREAKER_OPEN)
    return 0;
  if (b->probes_in_flight + b->probes_ok >= b->cfg.half_open_probes)
    return 0;
  b->probes_in_flight++;
  return 1;
}

void osr_breaker_release(osr_breaker_t *b)
{
  if (b->state == OSR_BREAKER_HALF_OPEN && b->probes_in_flight > 0)
    b->probes_in_flight--;
}

void osr_breaker_record(osr_breaker_t *b, int success, int64_t now_ms)
{
  advance(b, now_ms);
  switch (b->state) {
  case OSR_BREAKER_OPEN:
    /* A late answer to a request admitted before the breaker opened: it
     * says nothing new, and counting it would extend or shorten the open
     * period depending on the provider's latency. */
    return;

  case OSR_BREAKER_HALF_OPEN:
    if (b->probes_in_flight > 0)
      b->probes_in_flight--;
    if (!success) {
      /* The provider is still unwell: back off harder each time. */
      uint64_t next = b->current_open_ms * 2;
      if (next > b->cfg.max_open_ms || next < b->current_open_ms)
        next = b->cfg.max_open_ms;
      trip(b, now_ms, next);
      return;
    }
    if (++b->probes_ok >= b->cfg.half_open_probes) {
      b->state = OSR_BREAKER_CLOSED;
      b->current_open_ms = b->cfg.open_ms;
      b->probes_ok = 0;
      clear_window(b);
    }
    return;

  case OSR_BREAKER_CLOSED:
    break;
  }

  /* Closed: slide the window. When full, the oldest outcome falls out. */
  uint8_t f = success ? 0 : 1;
  if (b->ring_len == b->cfg.window) {
    b->ring_failures -= b->ring[b->ring_pos];
  } else {
    b->ring_len++;
  }
  b->ring[b->ring_pos] = f;
  b->ring_failures += f;
  b->ring_pos = (b->ring_pos + 1) % b->cfg.window;
  b->consecutive = success ? 0 : b->consecutive + 1;

  int ratio_trip = b->ring_len >= b->cfg.min_requests &&
                   (double)b->ring_failures >= b->cfg.failure_ratio * (double)b->ring_len;
  int run_trip = b->consecutive >= b->cfg.consecutive_failures;
  if (!success && (ratio_trip || run_trip)) {
    trip(b, now_ms, b->cfg.open_ms);
    /* The next closed period starts from a clean slate, or one failure
     * right after closing would re-trip on stale history. */
    clear_window(b);
  }
}

const char *osr_breaker_state_name(osr_breaker_state_t s)
{
  switch (s) {
  case OSR_BREAKER_CLOSED:
    return "closed";
  case OSR_BREAKER_OPEN:
    return "open";
  case OSR_BREAKER_HALF_OPEN:
    return "half_open";
  }
  return "unknown";
}
