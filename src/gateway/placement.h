/*
 * Placement: which providers may host a sandbox, and in which order to try
 * them. Pure functions over the providers' manifests and live health, so the
 * same code answers POST /v1/plan (dry run) and drives POST /v1/sandboxes.
 *
 *   filter  capabilities (gpu count/type, snapshot, ports, memory, vcpus),
 *           isolation floor, region, tenant allow/deny, policy allow/deny,
 *           budget (maxCostPerHour), circuit breaker open
 *   score   normalised cost estimate, latency EWMA, reliability (success
 *           EWMA), region affinity -> weighted by strategy
 *   order   cost | latency | balanced | order (configuration order) |
 *           pin:<provider> (only that one)
 *
 * Every provider appears in the result with each filter's verdict and reason,
 * so a refusal (no_capable_provider) can say exactly why for each provider.
 */
#ifndef OSR_GATEWAY_PLACEMENT_H
#define OSR_GATEWAY_PLACEMENT_H

#include <jansson.h>
#include <stdint.h>

#include "gateway/breaker.h"
#include "osr/adapter.h"

typedef enum osr_strategy_e {
  OSR_STRATEGY_BALANCED = 0,
  OSR_STRATEGY_COST = 1,
  OSR_STRATEGY_LATENCY = 2,
  OSR_STRATEGY_ORDER = 3,
  OSR_STRATEGY_PIN = 4,
} osr_strategy_t;

#define OSR_POLICY_LIST_MAX 16

typedef struct osr_policy_s {
  osr_strategy_t strategy;
  char pin[OSR_NAME_MAX];                        /**< for OSR_STRATEGY_PIN */
  char allow[OSR_POLICY_LIST_MAX][OSR_NAME_MAX]; /**< empty = all */
  size_t nallow;
  char deny[OSR_POLICY_LIST_MAX][OSR_NAME_MAX];
  size_t ndeny;
  double max_cost_per_hour;                      /**< USD; 0 = no budget */
  int on_degraded_migrate;                       /**< 0 = fail, 1 = migrate */
} osr_policy_t;

/** Parse "cost|latency|balanced|order|pin:<name>". Returns 0 or OSR_EINVAL. */
int osr_strategy_parse(const char *s, osr_policy_t *p);

/** Live health of one provider, owned by the provider registry. */
typedef struct osr_provider_health_s {
  osr_breaker_t breaker;
  double latency_ewma_ms;   /**< create latency; starts at info.expected_create_ms */
  double success_ewma;      /**< 0..1; starts at 1 */
  uint64_t creates_ok;
  uint64_t creates_failed;
} osr_provider_health_t;

void osr_provider_health_init(osr_provider_health_t *h, const osr_provider_info_t *info,
                              const osr_breaker_config_t *bc);
/** Feed one create outcome (status 0 = success) and its latency. */
void osr_provider_health_record(osr_provider_health_t *h, int status, double latency_ms,
                                int64_t now_ms);

/** Names of the filters, in the order they are applied. */
#define OSR_FILTER_COUNT 9
extern const char *const osr_filter_names[OSR_FILTER_COUNT];
/* "allowed", "breaker", "isolation", "region", "gpu", "snapshot", "ports", "resources", "budget" */

typedef struct osr_candidate_s {
  osr_provider_t *provider;
  osr_provider_health_t *health;
  int eligible;
  int passed[OSR_FILTER_COUNT];           /**< 1 passed, 0 failed, -1 not evaluated */
  char reason[OSR_FILTER_COUNT][160];     /**< why a filter failed */
  osr_isolation_t isolation;              /**< class that would be used */
  char region[OSR_NAME_MAX];              /**< region that would be used */
  double cost_per_hour;                   /**< USD estimate for the requested resources */
  double score_cost, score_latency, score_reliability, score_region, score;
  int order;                              /**< 1-based attempt position; 0 if ineligible */
} osr_candidate_t;

typedef struct osr_placement_input_s {
  osr_provider_t *const *providers;       /**< in configuration order */
  osr_provider_health_t *const *health;
  size_t nproviders;
  const osr_capabilities_t *caps;
  const osr_policy_t *policy;
  const char *const *tenant_allow;        /**< tenant-level lists (NULL/0 = none) */
  size_t ntenant_allow;
  const char *const *tenant_deny;
  size_t ntenant_deny;
  int64_t now_ms;                         /**< for breaker state */
  uint32_t ttl_s;                         /**< the sandbox's TTL, to amortise per-create
                                               fees (0 = one hour) */
} osr_placement_input_t;

/**
 * Evaluate every provider. `out` has room for in->nproviders entries and is
 * filled with eligible candidates first in attempt order, then the rest in
 * configuration order. Returns the number of eligible candidates (0 means
 * no_capable_provider). Does not change breaker state.
 */
size_t osr_place(const osr_placement_input_t *in, osr_candidate_t *out);

/** The plan as JSON (for POST /v1/plan and no_capable_provider details). */
json_t *osr_plan_to_json(const osr_candidate_t *c, size_t n, size_t neligible);

/** Estimated cost per hour of `caps` on a provider with manifest `info`. */
double osr_estimate_cost_per_hour(const osr_provider_info_t *info, const osr_capabilities_t *caps);
/** Same, with the per-create fee amortised over `ttl_s` (0 = one hour, at
 *  least 60 s): what osr_place() uses with in->ttl_s. */
double osr_estimate_cost_per_hour_ttl(const osr_provider_info_t *info,
                                      const osr_capabilities_t *caps, uint32_t ttl_s);

#endif
