/*
 * Placement: filter, score, order (see placement.h).
 *
 * Every filter runs for every provider, even after one failed, so a plan and
 * a no_capable_provider answer list all the reasons a provider was refused,
 * not only the first: fixing one problem should not reveal another.
 *
 * Cost estimate (USD per hour) for the requested resources:
 *
 *   (vcpus * price_vcpu_per_s + memory_GiB * price_gib_per_s
 *    + gpus * gpu_price_per_s) * 3600
 *   + price_per_create * 3600 / ttl_s
 *
 * vcpus / memory default to the provider's defaults when the request leaves
 * them at 0. A GPU request without a type is priced at the provider's most
 * expensive type it offers, because the provider may pick any of them and a
 * budget must hold in the worst case. The per-create fee is amortised over
 * the sandbox's TTL (ttl_s, default one hour, at least one minute): a
 * 5-minute sandbox on a provider charging $0.01 per create costs $0.12/h
 * in fees alone, which is what makes per-create pricing matter.
 *
 * Scores are in 0..1, higher is better, over the eligible candidates only:
 *   cost, latency   min-max normalised: the cheapest/fastest gets 1, the
 *                   dearest/slowest 0, all equal -> 1.
 *   reliability     the success EWMA as is; it is already an absolute 0..1,
 *                   and normalising would turn 0.999 vs 0.998 into 1 vs 0.
 *   region          1 when a region was requested (every eligible provider
 *                   serves it); with no region requested, region-less
 *                   providers (local: next to the gateway) get 1, the others
 *                   0.5.
 * Strategy weights:
 *   cost      cost only, latency EWMA breaks ties
 *   latency   latency only
 *   balanced  0.4 cost + 0.3 latency + 0.2 reliability + 0.1 region
 *   order     configuration order (the balanced total is still reported)
 *   pin       the pinned provider only
 * Ties always fall back to configuration order (stable insertion sort), so
 * the same inputs always give the same plan.
 */
#include "gateway/placement.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define W_COST 0.4
#define W_LATENCY 0.3
#define W_RELIABILITY 0.2
#define W_REGION 0.1

/* EWMA weight of the newest sample: 0.2 follows a change within ~10
 * samples yet one slow create moves the estimate by only a fifth. */
#define EWMA_ALPHA 0.2

enum {
  F_ALLOWED = 0,
  F_BREAKER,
  F_ISOLATION,
  F_REGION,
  F_GPU,
  F_SNAPSHOT,
  F_PORTS,
  F_RESOURCES,
  F_BUDGET,
};

const char *const osr_filter_names[OSR_FILTER_COUNT] = {
  "allowed", "breaker", "isolation", "region", "gpu", "snapshot", "ports", "resources", "budget",
};

int osr_strategy_parse(const char *s, osr_policy_t *p)
{
  if (s == NULL)
    return OSR_EINVAL;
  if (strcmp(s, "balanced") == 0)
    p->strategy = OSR_STRATEGY_BALANCED;
  else if (strcmp(s, "cost") == 0)
    p->strategy = OSR_STRATEGY_COST;
  else if (strcmp(s, "latency") == 0)
    p->strategy = OSR_STRATEGY_LATENCY;
  else if (strcmp(s, "order") == 0)
    p->strategy = OSR_STRATEGY_ORDER;
  else if (strncmp(s, "pin:", 4) == 0) {
    size_t n = strlen(s + 4);
    if (n == 0 || n >= sizeof(p->pin))
      return OSR_EINVAL;
    memcpy(p->pin, s + 4, n + 1);
    p->strategy = OSR_STRATEGY_PIN;
    return 0;
  } else
    return OSR_EINVAL;
  p->pin[0] = '\0';
  return 0;
}

void osr_provider_health_init(osr_provider_health_t *h, const osr_provider_info_t *info,
                              const osr_breaker_config_t *bc)
{
  memset(h, 0, sizeof(*h));
  osr_breaker_init(&h->breaker, bc);
  h->latency_ewma_ms = info != NULL && info->expected_create_ms > 0 ? info->expected_create_ms
                                                                    : 1000.0;
  h->success_ewma = 1.0;
}

void osr_provider_health_record(osr_provider_health_t *h, int status, double latency_ms,
                                int64_t now_ms)
{
  /* Neither a cancellation (our shutdown) nor a request the provider
   * rightly rejected as invalid says anything about the provider's health:
   * give a half-open probe slot back and count nothing else. */
  if (status == OSR_ECANCELED || status == OSR_PERR_INVALID) {
    osr_breaker_release(&h->breaker);
    if (status == OSR_PERR_INVALID)
      h->creates_failed++;
    return;
  }
  int ok = status == 0;
  if (ok) {
    h->creates_ok++;
    /* Only successful creates measure how long a create takes; a fast
     * refusal would make a failing provider look attractive. */
    if (latency_ms >= 0)
      h->latency_ewma_ms = (1 - EWMA_ALPHA) * h->latency_ewma_ms + EWMA_ALPHA * latency_ms;
  } else {
    h->creates_failed++;
  }
  h->success_ewma = (1 - EWMA_ALPHA) * h->success_ewma + EWMA_ALPHA * (ok ? 1.0 : 0.0);
  osr_breaker_record(&h->breaker, ok, now_ms);
}

/* ---- cost ------------------------------------------------------------------ */

static double gpu_price(const osr_provider_info_t *info, const char *type)
{
  double best = 0;
  int found = 0;
  for (size_t i = 0; i < OSR_ARRAY_SIZE(info->gpu_types) && info->gpu_types[i] != NULL; i++) {
    if (type[0] != '\0') {
      if (strcmp(info->gpu_types[i], type) == 0)
        return info->gpu_price_per_s[i];
    } else if (!found || info->gpu_price_per_s[i] > best) {
      best = info->gpu_price_per_s[i];
      found = 1;
    }
  }
  return best;
}

static double estimate(const osr_provider_info_t *info, const osr_capabilities_t *caps,
                       uint32_t ttl_s)
{
  double vcpus = caps->vcpus != 0 ? caps->vcpus : info->default_vcpus != 0 ? info->default_vcpus : 1;
  double mib = caps->min_memory_mib != 0 ? caps->min_memory_mib : info->default_memory_mib;
  double per_s = vcpus * info->price_vcpu_per_s + mib / 1024.0 * info->price_gib_per_s;
  if (caps->gpu_count > 0)
    per_s += caps->gpu_count * gpu_price(info, caps->gpu_type);
  double ttl = ttl_s == 0 ? 3600.0 : ttl_s < 60 ? 60.0 : (double)ttl_s;
  return per_s * 3600.0 + info->price_per_create * 3600.0 / ttl;
}

double osr_estimate_cost_per_hour(const osr_provider_info_t *info, const osr_capabilities_t *caps)
{
  return estimate(info, caps, 0);
}

double osr_estimate_cost_per_hour_ttl(const osr_provider_info_t *info,
                                      const osr_capabilities_t *caps, uint32_t ttl_s)
{
  return estimate(info, caps, ttl_s);
}

/* ---- filters --------------------------------------------------------------- */

static int in_list(const char *name, const char (*list)[OSR_NAME_MAX], size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (strcmp(list[i], name) == 0)
      return 1;
  return 0;
}

static int in_plist(const char *name, const char *const *list, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (list[i] != NULL && strcmp(list[i], name) == 0)
      return 1;
  return 0;
}

/* "a, b, c" into out (truncated safely). */
static void join(char *out, size_t len, const char *const *items, size_t max)
{
  size_t off = 0;
  out[0] = '\0';
  for (size_t i = 0; i < max && items[i] != NULL; i++) {
    int n = snprintf(out + off, len - off, "%s%s", i ? ", " : "", items[i]);
    if (n < 0 || (size_t)n >= len - off)
      return;
    off += (size_t)n;
  }
}

static void isolation_list(unsigned mask, char *out, size_t len)
{
  const char *names[4];
  size_t n = 0;
  for (int c = OSR_ISO_CONTAINER; c <= OSR_ISO_FIRECRACKER; c++)
    if (mask & (1u << c))
      names[n++] = osr_isolation_name((osr_isolation_t)c);
  names[n] = NULL;
  join(out, len, names, n);
  if (n == 0)
    snprintf(out, len, "none");
}

static void fail(osr_candidate_t *c, int f, const char *fmt, ...) OSR_PRINTF(3, 4);
static void fail(osr_candidate_t *c, int f, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->reason[f], sizeof(c->reason[f]), fmt, ap);
  va_end(ap);
  c->passed[f] = 0;
}

static void filter_allowed(const osr_placement_input_t *in, osr_candidate_t *c)
{
  const osr_policy_t *pol = in->policy;
  const char *name = c->provider->name;
  if (pol != NULL && pol->strategy == OSR_STRATEGY_PIN && strcmp(pol->pin, name) != 0)
    fail(c, F_ALLOWED, "pinned to %s", pol->pin);
  else if (pol != NULL && pol->nallow > 0 && !in_list(name, pol->allow, pol->nallow))
    fail(c, F_ALLOWED, "not in the request's allow list");
  else if (pol != NULL && in_list(name, pol->deny, pol->ndeny))
    fail(c, F_ALLOWED, "denied by the request's policy");
  else if (in->ntenant_allow > 0 && !in_plist(name, in->tenant_allow, in->ntenant_allow))
    fail(c, F_ALLOWED, "not in the tenant's allow list");
  else if (in_plist(name, in->tenant_deny, in->ntenant_deny))
    fail(c, F_ALLOWED, "denied for this tenant");
}

static void filter_breaker(const osr_placement_input_t *in, osr_candidate_t *c)
{
  if (c->health == NULL)
    return;
  const osr_breaker_t *b = &c->health->breaker;
  if (osr_breaker_peek(b, in->now_ms))
    return;
  int64_t until = osr_breaker_open_until(b, in->now_ms);
  if (until == 0) {
    fail(c, F_BREAKER, "breaker half-open, probe in flight");
    return;
  }
  time_t t = (time_t)(until / 1000);
  struct tm tm;
  char ts[32];
  gmtime_r(&t, &tm);
  strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
  fail(c, F_BREAKER, "breaker open until %s.%03dZ (%lld ms)", ts, (int)(until % 1000),
       (long long)(until - in->now_ms));
}

static void filter_isolation(const osr_capabilities_t *caps, const osr_provider_info_t *info,
                             osr_candidate_t *c)
{
  /* The cheapest class that meets the floor: a stronger class costs more
   * and boots slower, and the caller asked for a floor, not a ceiling. */
  osr_isolation_t floor = caps->isolation > OSR_ISO_CONTAINER ? caps->isolation : OSR_ISO_CONTAINER;
  for (int k = floor; k <= OSR_ISO_FIRECRACKER; k++) {
    if (info->isolation_mask & (1u << k)) {
      c->isolation = (osr_isolation_t)k;
      return;
    }
  }
  char offered[64];
  isolation_list(info->isolation_mask, offered, sizeof(offered));
  fail(c, F_ISOLATION, "isolation %s needed, provider offers %s", osr_isolation_name(floor),
       offered);
}

static void filter_region(const osr_capabilities_t *caps, const osr_provider_info_t *info,
                          osr_candidate_t *c)
{
  if (caps->region[0] == '\0') {
    if (info->regions[0] != NULL)
      snprintf(c->region, sizeof(c->region), "%s", info->regions[0]);
    return;
  }
  for (size_t i = 0; i < OSR_ARRAY_SIZE(info->regions) && info->regions[i] != NULL; i++) {
    if (strcmp(info->regions[i], caps->region) == 0) {
      snprintf(c->region, sizeof(c->region), "%s", caps->region);
      return;
    }
  }
  char served[120];
  join(served, sizeof(served), info->regions, OSR_ARRAY_SIZE(info->regions));
  if (served[0] == '\0')
    fail(c, F_REGION, "region %s not served (provider has no regions)", caps->region);
  else
    fail(c, F_REGION, "region %s not served (%s)", caps->region, served);
}

static void filter_gpu(const osr_capabilities_t *caps, const osr_provider_info_t *info,
                       osr_candidate_t *c)
{
  if (caps->gpu_count == 0)
    return;
  char what[96];
  if (caps->gpu_type[0] != '\0')
    snprintf(what, sizeof(what), "%u GPU(s) of type %s", caps->gpu_count, caps->gpu_type);
  else
    snprintf(what, sizeof(what), "%u GPU(s)", caps->gpu_count);
  if (info->gpu_max == 0) {
    fail(c, F_GPU, "needs %s, provider has none", what);
    return;
  }
  if (caps->gpu_count > info->gpu_max) {
    fail(c, F_GPU, "needs %s, provider allows at most %u", what, info->gpu_max);
    return;
  }
  if (caps->gpu_type[0] != '\0') {
    for (size_t i = 0; i < OSR_ARRAY_SIZE(info->gpu_types) && info->gpu_types[i] != NULL; i++)
      if (strcmp(info->gpu_types[i], caps->gpu_type) == 0)
        return;
    char types[100];
    join(types, sizeof(types), info->gpu_types, OSR_ARRAY_SIZE(info->gpu_types));
    fail(c, F_GPU, "needs %s, provider has %s", what, types[0] ? types : "none");
  }
}

static void filter_resources(const osr_capabilities_t *caps, const osr_provider_info_t *info,
                             osr_candidate_t *c)
{
  /* A zero maximum in a manifest means the provider states no limit. */
  if (info->max_memory_mib != 0 && caps->min_memory_mib > info->max_memory_mib)
    fail(c, F_RESOURCES, "needs %u MiB memory, provider allows at most %u MiB",
         caps->min_memory_mib, info->max_memory_mib);
  else if (info->max_vcpus != 0 && caps->vcpus > info->max_vcpus)
    fail(c, F_RESOURCES, "needs %u vCPU(s), provider allows at most %u", caps->vcpus,
         info->max_vcpus);
}

static void evaluate(const osr_placement_input_t *in, size_t i, osr_candidate_t *c)
{
  const osr_capabilities_t *caps = in->caps;
  memset(c, 0, sizeof(*c));
  c->provider = in->providers[i];
  c->health = in->health != NULL ? in->health[i] : NULL;
  const osr_provider_info_t *info = &c->provider->info;
  for (int f = 0; f < OSR_FILTER_COUNT; f++)
    c->passed[f] = 1;

  filter_allowed(in, c);
  filter_breaker(in, c);
  filter_isolation(caps, info, c);
  filter_region(caps, info, c);
  filter_gpu(caps, info, c);
  if (caps->snapshot && !info->snapshot)
    fail(c, F_SNAPSHOT, "needs snapshot/restore, provider has none");
  if (caps->nports > info->max_ports)
    fail(c, F_PORTS, "needs %zu port(s), provider exposes at most %u", caps->nports,
         info->max_ports);
  filter_resources(caps, info, c);

  c->cost_per_hour = estimate(info, caps, in->ttl_s);
  double budget = in->policy != NULL ? in->policy->max_cost_per_hour : 0;
  if (budget > 0 && c->cost_per_hour > budget)
    fail(c, F_BUDGET, "costs $%.4f/h, budget is $%.4f/h", c->cost_per_hour, budget);

  c->eligible = 1;
  for (int f = 0; f < OSR_FILTER_COUNT; f++)
    if (c->passed[f] != 1)
      c->eligible = 0;
}

/* ---- score and order ------------------------------------------------------- */

static double norm_low_better(double v, double lo, double hi)
{
  if (!(hi > lo))
    return 1.0;
  return (hi - v) / (hi - lo);
}

static double latency_of(const osr_candidate_t *c)
{
  return c->health != NULL ? c->health->latency_ewma_ms : c->provider->info.expected_create_ms;
}

/* Does a go before b? Strict: equal keys keep configuration order. */
static int before(const osr_candidate_t *a, const osr_candidate_t *b, osr_strategy_t s)
{
  switch (s) {
  case OSR_STRATEGY_COST:
    if (a->cost_per_hour != b->cost_per_hour)
      return a->cost_per_hour < b->cost_per_hour;
    return latency_of(a) < latency_of(b);
  case OSR_STRATEGY_LATENCY:
    return latency_of(a) < latency_of(b);
  case OSR_STRATEGY_BALANCED:
    return a->score > b->score;
  case OSR_STRATEGY_ORDER:
  case OSR_STRATEGY_PIN:
    return 0;
  }
  return 0;
}

size_t osr_place(const osr_placement_input_t *in, osr_candidate_t *out)
{
  size_t n = in->nproviders, ne = 0;
  osr_strategy_t strat = in->policy != NULL ? in->policy->strategy : OSR_STRATEGY_BALANCED;

  /* Eligible candidates first (in configuration order for now), the rest
   * after them, also in configuration order. Two passes keep both stable. */
  for (size_t i = 0; i < n; i++) {
    osr_candidate_t c;
    evaluate(in, i, &c);
    if (c.eligible)
      out[ne++] = c;
  }
  size_t k = ne;
  for (size_t i = 0; i < n; i++) {
    osr_candidate_t c;
    evaluate(in, i, &c);
    if (!c.eligible)
      out[k++] = c;
  }

  if (ne == 0)
    return 0;
  double cmin = out[0].cost_per_hour, cmax = cmin, lmin = latency_of(&out[0]), lmax = lmin;
  for (size_t i = 1; i < ne; i++) {
    cmin = fmin(cmin, out[i].cost_per_hour);
    cmax = fmax(cmax, out[i].cost_per_hour);
    lmin = fmin(lmin, latency_of(&out[i]));
    lmax = fmax(lmax, latency_of(&out[i]));
  }
  for (size_t i = 0; i < ne; i++) {
    osr_candidate_t *c = &out[i];
    c->score_cost = norm_low_better(c->cost_per_hour, cmin, cmax);
    c->score_latency = norm_low_better(latency_of(c), lmin, lmax);
    c->score_reliability = c->health != NULL ? c->health->success_ewma : 1.0;
    if (in->caps->region[0] != '\0' || c->provider->info.regions[0] == NULL)
      c->score_region = 1.0;
    else
      c->score_region = 0.5;
    switch (strat) {
    case OSR_STRATEGY_COST:
      c->score = c->score_cost;
      break;
    case OSR_STRATEGY_LATENCY:
      c->score = c->score_latency;
      break;
    default:
      c->score = W_COST * c->score_cost + W_LATENCY * c->score_latency +
                 W_RELIABILITY * c->score_reliability + W_REGION * c->score_region;
      break;
    }
  }

  /* Stable insertion sort: n is a handful, and stability is the tie-break. */
  for (size_t i = 1; i < ne; i++) {
    osr_candidate_t tmp = out[i];
    size_t j = i;
    while (j > 0 && before(&tmp, &out[j - 1], strat)) {
      out[j] = out[j - 1];
      j--;
    }
    out[j] = tmp;
  }
  for (size_t i = 0; i < ne; i++)
    out[i].order = (int)i + 1;
  return ne;
}

/* ---- JSON ------------------------------------------------------------------ */

/* Six decimals: enough for prices per hour and scores, and stable output. */
static json_t *num(double v)
{
  return json_real(round(v * 1e6) / 1e6);
}

json_t *osr_plan_to_json(const osr_candidate_t *c, size_t n, size_t neligible)
{
  json_t *order = json_array();
  json_t *provs = json_array();
  for (size_t i = 0; i < neligible && i < n; i++)
    json_array_append_new(order, json_string(c[i].provider->name));
  for (size_t i = 0; i < n; i++) {
    const osr_candidate_t *x = &c[i];
    json_t *filters = json_array();
    for (int f = 0; f < OSR_FILTER_COUNT; f++) {
      json_t *reason = x->passed[f] == 0 ? json_string(x->reason[f]) : json_null();
      json_t *passed = x->passed[f] < 0 ? json_null() : json_boolean(x->passed[f] == 1);
      json_array_append_new(filters, json_pack("{s:s,s:o,s:o}", "name", osr_filter_names[f],
                                               "passed", passed, "reason", reason));
    }
    const char *iso = osr_isolation_name(x->isolation);
    json_t *p = json_pack("{s:s,s:s,s:b,s:o,s:o,s:o,s:o}", "name", x->provider->name, "type",
                          x->provider->adapter != NULL ? x->provider->adapter->type : "",
                          "eligible", x->eligible, "filters", filters, "isolation",
                          iso != NULL && x->passed[F_ISOLATION] == 1 ? json_string(iso) : json_null(),
                          "region", x->passed[F_REGION] == 1 ? json_string(x->region) : json_null(),
                          "costPerHour", num(x->cost_per_hour));
    if (x->eligible) {
      json_object_set_new(p, "score",
                          json_pack("{s:o,s:o,s:o,s:o,s:o}", "cost", num(x->score_cost), "latency",
                                    num(x->score_latency), "reliability",
                                    num(x->score_reliability), "region", num(x->score_region),
                                    "total", num(x->score)));
      json_object_set_new(p, "order", json_integer(x->order));
    } else {
      json_object_set_new(p, "score", json_null());
      json_object_set_new(p, "order", json_null());
    }
    json_array_append_new(provs, p);
  }
  return json_pack("{s:o,s:o}", "order", order, "providers", provs);
}
