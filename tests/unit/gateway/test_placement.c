/* Unit tests for placement: every filter and its reason, each strategy's
 * order, pin, allow/deny (policy and tenant), budget, breaker-open skip,
 * determinism, cost estimate, and a golden plan JSON. Providers here are
 * plain manifests (placement never calls an adapter). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/placement.h"
#include "util/mem.h"

static const osr_adapter_t fake_adapter = {.version = OSR_ADAPTER_VERSION, .type = "fake"};

#define NP 3
static osr_provider_t prov[NP];
static osr_provider_health_t health[NP];
static osr_provider_t *pp[NP];
static osr_provider_health_t *hp[NP];
static osr_capabilities_t caps;
static osr_policy_t pol;
static osr_placement_input_t in;
static osr_candidate_t out[NP];

/*  a: cheap, slow, container only, region-less
 *  b: mid price, fast, container+gvisor, us-east/us-west, 2x H100, snapshot
 *  c: dear, mid latency, firecracker, eu-west */
static int setup(void **state)
{
  (void)state;
  memset(prov, 0, sizeof(prov));
  static const char *names[NP] = {"a", "b", "c"};
  for (int i = 0; i < NP; i++) {
    prov[i].adapter = &fake_adapter;
    snprintf(prov[i].name, sizeof(prov[i].name), "%s", names[i]);
    osr_provider_info_t *f = &prov[i].info;
    f->max_ports = 4;
    f->max_memory_mib = 8192;
    f->max_vcpus = 8;
    f->default_memory_mib = 1024;
    f->default_vcpus = 1;
    pp[i] = &prov[i];
    hp[i] = &health[i];
  }
  prov[0].info.isolation_mask = 1u << OSR_ISO_CONTAINER;
  prov[0].info.price_vcpu_per_s = 0.00001;
  prov[0].info.price_gib_per_s = 0.000002;
  prov[0].info.expected_create_ms = 800;

  prov[1].info.isolation_mask = (1u << OSR_ISO_CONTAINER) | (1u << OSR_ISO_GVISOR);
  prov[1].info.regions[0] = "us-east";
  prov[1].info.regions[1] = "us-west";
  prov[1].info.gpu_max = 2;
  prov[1].info.gpu_types[0] = "H100";
  prov[1].info.gpu_price_per_s[0] = 0.001;
  prov[1].info.snapshot = 1;
  prov[1].info.price_vcpu_per_s = 0.00002;
  prov[1].info.price_gib_per_s = 0.000004;
  prov[1].info.expected_create_ms = 100;

  prov[2].info.isolation_mask = 1u << OSR_ISO_FIRECRACKER;
  prov[2].info.regions[0] = "eu-west";
  prov[2].info.price_vcpu_per_s = 0.00005;
  prov[2].info.price_gib_per_s = 0.00001;
  prov[2].info.price_per_create = 0.01;
  prov[2].info.expected_create_ms = 400;

  for (int i = 0; i < NP; i++)
    osr_provider_health_init(&health[i], &prov[i].info, NULL);
  memset(&caps, 0, sizeof(caps));
  memset(&pol, 0, sizeof(pol));
  memset(&in, 0, sizeof(in));
  in.providers = pp;
  in.health = hp;
  in.nproviders = NP;
  in.caps = &caps;
  in.policy = &pol;
  in.now_ms = 1000000;
  return 0;
}

static size_t place(void)
{
  return osr_place(&in, out);
}

static const osr_candidate_t *cand(const char *name)
{
  for (int i = 0; i < NP; i++)
    if (strcmp(out[i].provider->name, name) == 0)
      return &out[i];
  fail_msg("no candidate %s", name);
  return &out[0]; /* not reached: fail_msg does not return */
}

static int filter_idx(const char *f)
{
  for (int i = 0; i < OSR_FILTER_COUNT; i++)
    if (strcmp(osr_filter_names[i], f) == 0)
      return i;
  fail_msg("no filter %s", f);
  return -1;
}

static void assert_refused(const char *prov_name, const char *filter, const char *reason)
{
  const osr_candidate_t *c = cand(prov_name);
  int f = filter_idx(filter);
  assert_false(c->eligible);
  assert_int_equal(c->passed[f], 0);
  if (strstr(c->reason[f], reason) == NULL)
    fail_msg("%s/%s: reason '%s' lacks '%s'", prov_name, filter, c->reason[f], reason);
  assert_int_equal(c->order, 0);
}

static void order_is(size_t n, const char *a, const char *b, const char *c)
{
  const char *want[3] = {a, b, c};
  for (size_t i = 0; i < n; i++) {
    assert_string_equal(out[i].provider->name, want[i]);
    assert_int_equal(out[i].order, (int)i + 1);
    assert_true(out[i].eligible);
  }
}

static void test_strategy_parse(void **state)
{
  (void)state;
  osr_policy_t p;
  memset(&p, 0, sizeof(p));
  assert_int_equal(osr_strategy_parse("cost", &p), 0);
  assert_int_equal(p.strategy, OSR_STRATEGY_COST);
  assert_int_equal(osr_strategy_parse("latency", &p), 0);
  assert_int_equal(p.strategy, OSR_STRATEGY_LATENCY);
  assert_int_equal(osr_strategy_parse("order", &p), 0);
  assert_int_equal(p.strategy, OSR_STRATEGY_ORDER);
  assert_int_equal(osr_strategy_parse("pin:e2b-eu", &p), 0);
  assert_int_equal(p.strategy, OSR_STRATEGY_PIN);
  assert_string_equal(p.pin, "e2b-eu");
  assert_int_equal(osr_strategy_parse("balanced", &p), 0);
  assert_int_equal(p.strategy, OSR_STRATEGY_BALANCED);
  assert_string_equal(p.pin, "");
  assert_int_equal(osr_strategy_parse("pin:", &p), OSR_EINVAL);
  assert_int_equal(osr_strategy_parse("cheapest", &p), OSR_EINVAL);
  assert_int_equal(osr_strategy_parse(NULL, &p), OSR_EINVAL);
  char longname[100];
  memset(longname, 'x', sizeof(longname));
  memcpy(longname, "pin:", 4);
  longname[99] = '\0';
  assert_int_equal(osr_strategy_parse(longname, &p), OSR_EINVAL);
}

static void test_isolation_filter_and_choice(void **state)
{
  (void)state;
  caps.isolation = OSR_ISO_GVISOR;
  assert_int_equal(place(), 2);
  assert_refused("a", "isolation", "isolation gvisor needed, provider offers container");
  /* The lowest class meeting the floor: b gives gvisor, c firecracker. */
  assert_int_equal(cand("b")->isolation, OSR_ISO_GVISOR);
  assert_int_equal(cand("c")->isolation, OSR_ISO_FIRECRACKER);
  caps.isolation = OSR_ISO_NONE; /* no floor: the cheapest class offered */
  assert_int_equal(place(), 3);
  assert_int_equal(cand("b")->isolation, OSR_ISO_CONTAINER);
  caps.isolation = OSR_ISO_FIRECRACKER;
  assert_int_equal(place(), 1);
  assert_refused("b", "isolation", "isolation firecracker needed, provider offers container, gvisor");
}

static void test_region_filter(void **state)
{
  (void)state;
  snprintf(caps.region, sizeof(caps.region), "eu-west");
  assert_int_equal(place(), 1);
  assert_refused("b", "region", "region eu-west not served (us-east, us-west)");
  assert_refused("a", "region", "region eu-west not served (provider has no regions)");
  assert_string_equal(cand("c")->region, "eu-west");
  caps.region[0] = '\0';
  assert_int_equal(place(), 3);
  assert_string_equal(cand("b")->region, "us-east"); /* the provider's first */
  assert_string_equal(cand("a")->region, "");
}

static void test_gpu_filter(void **state)
{
  (void)state;
  caps.gpu_count = 2;
  snprintf(caps.gpu_type, sizeof(caps.gpu_type), "H100");
  assert_int_equal(place(), 1);
  assert_refused("a", "gpu", "needs 2 GPU(s) of type H100, provider has none");
  assert_true(cand("b")->eligible);
  caps.gpu_count = 3;
  assert_int_equal(place(), 0);
  assert_refused("b", "gpu", "provider allows at most 2");
  caps.gpu_count = 1;
  snprintf(caps.gpu_type, sizeof(caps.gpu_type), "A100");
  assert_int_equal(place(), 0);
  assert_refused("b", "gpu", "needs 1 GPU(s) of type A100, provider has H100");
}

static void test_snapshot_ports_resources(void **state)
{
  (void)state;
  caps.snapshot = 1;
  assert_int_equal(place(), 1);
  assert_refused("a", "snapshot", "needs snapshot/restore, provider has none");
  caps.snapshot = 0;
  caps.nports = 5;
  assert_int_equal(place(), 0);
  assert_refused("a", "ports", "needs 5 port(s), provider exposes at most 4");
  caps.nports = 1;
  caps.min_memory_mib = 16384;
  assert_int_equal(place(), 0);
  assert_refused("c", "resources", "needs 16384 MiB memory, provider allows at most 8192 MiB");
  caps.min_memory_mib = 0;
  caps.vcpus = 9;
  assert_int_equal(place(), 0);
  assert_refused("c", "resources", "needs 9 vCPU(s), provider allows at most 8");
}

static void test_all_reasons_reported(void **state)
{
  (void)state;
  /* A provider failing several filters reports each of them. */
  caps.isolation = OSR_ISO_GVISOR;
  caps.snapshot = 1;
  snprintf(caps.region, sizeof(caps.region), "us-east");
  assert_int_equal(place(), 1);
  const osr_candidate_t *a = cand("a");
  assert_int_equal(a->passed[filter_idx("isolation")], 0);
  assert_int_equal(a->passed[filter_idx("region")], 0);
  assert_int_equal(a->passed[filter_idx("snapshot")], 0);
  assert_int_equal(a->passed[filter_idx("gpu")], 1);
  assert_int_equal(a->passed[filter_idx("allowed")], 1);
}

static void test_allow_deny(void **state)
{
  (void)state;
  snprintf(pol.allow[0], OSR_NAME_MAX, "b");
  snprintf(pol.allow[1], OSR_NAME_MAX, "c");
  pol.nallow = 2;
  snprintf(pol.deny[0], OSR_NAME_MAX, "c");
  pol.ndeny = 1;
  assert_int_equal(place(), 1);
  assert_refused("a", "allowed", "not in the request's allow list");
  assert_refused("c", "allowed", "denied by the request's policy");
  pol.nallow = pol.ndeny = 0;

  const char *tallow[] = {"a", "b"};
  const char *tdeny[] = {"b"};
  in.tenant_allow = tallow;
  in.ntenant_allow = 2;
  in.tenant_deny = tdeny;
  in.ntenant_deny = 1;
  assert_int_equal(place(), 1);
  assert_string_equal(out[0].provider->name, "a");
  assert_refused("c", "allowed", "not in the tenant's allow list");
  assert_refused("b", "allowed", "denied for this tenant");
}

static void test_pin(void **state)
{
  (void)state;
  assert_int_equal(osr_strategy_parse("pin:c", &pol), 0);
  assert_int_equal(place(), 1);
  assert_string_equal(out[0].provider->name, "c");
  assert_int_equal(out[0].order, 1);
  assert_refused("a", "allowed", "pinned to c");
  assert_refused("b", "allowed", "pinned to c");
  /* Pinning does not bypass capability filters. */
  caps.gpu_count = 1;
  assert_int_equal(place(), 0);
  assert_refused("c", "gpu", "provider has none");
}

static void test_budget(void **state)
{
  (void)state;
  /* 1 vCPU + 1 GiB (defaults), per hour:
   *   a: (0.00001 + 0.000002) * 3600 = 0.0432
   *   b: (0.00002 + 0.000004) * 3600 = 0.0864
   *   c: (0.00005 + 0.00001) * 3600 + 0.01 (per create, 1 h TTL) = 0.226 */
  assert_int_equal(place(), 3);
  assert_true(fabs(cand("a")->cost_per_hour - 0.0432) < 1e-9);
  assert_true(fabs(cand("b")->cost_per_hour - 0.0864) < 1e-9);
  assert_true(fabs(cand("c")->cost_per_hour - 0.226) < 1e-9);
  pol.max_cost_per_hour = 0.1;
  assert_int_equal(place(), 2);
  assert_refused("c", "budget", "costs $0.2260/h, budget is $0.1000/h");
  /* A 5-minute TTL amortises c's per-create fee over 5 minutes. */
  in.ttl_s = 300;
  pol.max_cost_per_hour = 0;
  place();
  assert_true(fabs(cand("c")->cost_per_hour - (0.216 + 0.12)) < 1e-9);
}

static void test_cost_estimate(void **state)
{
  (void)state;
  caps.vcpus = 4;
  caps.min_memory_mib = 2048;
  caps.gpu_count = 2;
  /* b: (4 * 0.00002 + 2 * 0.000004 + 2 * 0.001) * 3600 */
  double want = (4 * 0.00002 + 2 * 0.000004 + 2 * 0.001) * 3600;
  assert_true(fabs(osr_estimate_cost_per_hour(&prov[1].info, &caps) - want) < 1e-9);
  /* A GPU of any type is priced at the dearest type offered. */
  prov[1].info.gpu_types[1] = "L4";
  prov[1].info.gpu_price_per_s[1] = 0.0001;
  assert_true(fabs(osr_estimate_cost_per_hour(&prov[1].info, &caps) - want) < 1e-9);
  snprintf(caps.gpu_type, sizeof(caps.gpu_type), "L4");
  want = (4 * 0.00002 + 2 * 0.000004 + 2 * 0.0001) * 3600;
  assert_true(fabs(osr_estimate_cost_per_hour(&prov[1].info, &caps) - want) < 1e-9);
  /* The per-create fee over a TTL shorter than a minute counts as a minute. */
  caps.gpu_count = 0;
  double base = (4 * 0.00005 + 2 * 0.00001) * 3600;
  assert_true(fabs(osr_estimate_cost_per_hour_ttl(&prov[2].info, &caps, 10) - (base + 0.6)) < 1e-9);
}

static void test_strategies(void **state)
{
  (void)state;
  /* cost: a < b < c */
  osr_strategy_parse("cost", &pol);
  assert_int_equal(place(), 3);
  order_is(3, "a", "b", "c");
  assert_true(out[0].score == 1.0 && out[2].score == 0.0);
  /* latency: b (100) < c (400) < a (800) */
  osr_strategy_parse("latency", &pol);
  place();
  order_is(3, "b", "c", "a");
  /* order: configuration order whatever the scores */
  osr_strategy_parse("order", &pol);
  place();
  order_is(3, "a", "b", "c");
  /* balanced: 0.4 cost + 0.3 latency + 0.2 reliability + 0.1 region
   *   a: 0.4*1 + 0.3*0 + 0.2 + 0.1*1   = 0.7
   *   b: 0.4*(0.226-0.0864)/(0.226-0.0432) + 0.3*1 + 0.2 + 0.1*0.5 ≈ 0.855
   *   c: 0 + 0.3*(400/700) + 0.2 + 0.05 ≈ 0.421 */
  osr_strategy_parse("balanced", &pol);
  place();
  order_is(3, "b", "a", "c");
  assert_true(fabs(cand("a")->score - 0.7) < 1e-9);
  assert_true(fabs(cand("b")->score_cost - (0.226 - 0.0864) / (0.226 - 0.0432)) < 1e-9);
  /* Reliability moves the balanced order: b fails a lot. */
  for (int i = 0; i < 20; i++)
    osr_provider_health_record(&health[1], OSR_PERR_UNAVAILABLE, 50, in.now_ms - 100000);
  osr_breaker_init(&health[1].breaker, NULL); /* keep it eligible */
  place();
  assert_true(health[1].success_ewma < 0.02);
  order_is(3, "a", "b", "c");
}

static void test_cost_tie_breaks_on_latency_then_config(void **state)
{
  (void)state;
  /* Make all three cost the same. */
  for (int i = 0; i < NP; i++) {
    prov[i].info.price_vcpu_per_s = 0.00001;
    prov[i].info.price_gib_per_s = 0;
    prov[i].info.price_per_create = 0;
  }
  osr_strategy_parse("cost", &pol);
  place();
  order_is(3, "b", "c", "a"); /* by latency */
  for (int i = 0; i < NP; i++)
    health[i].latency_ewma_ms = 100;
  place();
  order_is(3, "a", "b", "c"); /* full tie: configuration order */
  osr_strategy_parse("balanced", &pol);
  prov[0].info.regions[0] = "x"; /* same region affinity for all */
  place();
  order_is(3, "a", "b", "c");
}

static void test_breaker_open_skipped(void **state)
{
  (void)state;
  osr_strategy_parse("cost", &pol);
  for (int i = 0; i < 5; i++)
    osr_provider_health_record(&health[0], OSR_PERR_CAPACITY, 10, in.now_ms);
  assert_int_equal(osr_breaker_state(&health[0].breaker, in.now_ms), OSR_BREAKER_OPEN);
  assert_int_equal(place(), 2);
  order_is(2, "b", "c", NULL);
  assert_refused("a", "breaker", "breaker open until ");
  assert_refused("a", "breaker", "(5000 ms)");
  /* osr_place does not change breaker state; after open_ms, half-open lets
   * it back in. */
  assert_int_equal(health[0].breaker.state, OSR_BREAKER_OPEN);
  in.now_ms += 5000;
  assert_int_equal(place(), 3);
  order_is(3, "a", "b", "c");
  /* Half-open with its probe taken: skipped again, with a reason. */
  assert_true(osr_breaker_allow(&health[0].breaker, in.now_ms));
  assert_int_equal(place(), 2);
  assert_refused("a", "breaker", "half-open, probe in flight");
}

static void test_health_record(void **state)
{
  (void)state;
  osr_provider_health_t *h = &health[1];
  assert_true(h->latency_ewma_ms == 100 && h->success_ewma == 1.0);
  osr_provider_health_record(h, 0, 200, 0);
  assert_true(fabs(h->latency_ewma_ms - 120) < 1e-9); /* alpha 0.2 */
  osr_provider_health_record(h, OSR_PERR_TIMEOUT, 5000, 0);
  assert_true(fabs(h->latency_ewma_ms - 120) < 1e-9); /* failures do not move it */
  assert_true(fabs(h->success_ewma - 0.8) < 1e-9);
  assert_int_equal(h->creates_ok, 1);
  assert_int_equal(h->creates_failed, 1);
  /* Cancellations count for nothing; invalid requests are not the
   * provider's fault (no breaker failure). */
  osr_provider_health_record(h, OSR_ECANCELED, 1, 0);
  for (int i = 0; i < 10; i++)
    osr_provider_health_record(h, OSR_PERR_INVALID, 1, 0);
  assert_int_equal(h->breaker.ring_failures, 1);
  assert_int_equal(osr_breaker_state(&h->breaker, 0), OSR_BREAKER_CLOSED);
  assert_true(fabs(h->success_ewma - 0.8) < 1e-9);
}

static void test_deterministic(void **state)
{
  (void)state;
  osr_strategy_parse("balanced", &pol);
  caps.isolation = OSR_ISO_CONTAINER;
  size_t n = place();
  json_t *first = osr_plan_to_json(out, NP, n);
  for (int k = 0; k < 50; k++) {
    assert_int_equal(place(), n);
    json_t *again = osr_plan_to_json(out, NP, n);
    assert_true(json_equal(first, again));
    json_decref(again);
  }
  json_decref(first);
}

static const char *golden =
  "{\"order\":[\"b\",\"c\"],\"providers\":["
  "{\"name\":\"b\",\"type\":\"fake\",\"eligible\":true,\"filters\":["
  "{\"name\":\"allowed\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"breaker\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"isolation\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"region\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"gpu\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"snapshot\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"ports\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"resources\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"budget\",\"passed\":true,\"reason\":null}],"
  "\"isolation\":\"gvisor\",\"region\":\"us-east\",\"costPerHour\":0.0864,"
  "\"score\":{\"cost\":1.0,\"latency\":1.0,\"reliability\":1.0,\"region\":0.5,\"total\":0.95},"
  "\"order\":1},"
  "{\"name\":\"c\",\"type\":\"fake\",\"eligible\":true,\"filters\":["
  "{\"name\":\"allowed\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"breaker\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"isolation\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"region\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"gpu\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"snapshot\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"ports\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"resources\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"budget\",\"passed\":true,\"reason\":null}],"
  "\"isolation\":\"firecracker\",\"region\":\"eu-west\",\"costPerHour\":0.226,"
  "\"score\":{\"cost\":0.0,\"latency\":0.0,\"reliability\":1.0,\"region\":0.5,\"total\":0.25},"
  "\"order\":2},"
  "{\"name\":\"a\",\"type\":\"fake\",\"eligible\":false,\"filters\":["
  "{\"name\":\"allowed\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"breaker\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"isolation\",\"passed\":false,"
  "\"reason\":\"isolation gvisor needed, provider offers container\"},"
  "{\"name\":\"region\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"gpu\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"snapshot\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"ports\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"resources\",\"passed\":true,\"reason\":null},"
  "{\"name\":\"budget\",\"passed\":true,\"reason\":null}],"
  "\"isolation\":null,\"region\":\"\",\"costPerHour\":0.0432,\"score\":null,\"order\":null}]}";

static void test_plan_json_golden(void **state)
{
  (void)state;
  caps.isolation = OSR_ISO_GVISOR;
  size_t n = place();
  assert_int_equal(n, 2);
  json_t *plan = osr_plan_to_json(out, NP, n);
  json_error_t err;
  json_t *want = json_loads(golden, 0, &err);
  if (want == NULL)
    fail_msg("golden: %s", err.text);
  if (!json_equal(plan, want)) {
    char *s = json_dumps(plan, JSON_COMPACT | JSON_REAL_PRECISION(10));
    print_error("got: %s\n", s);
    free(s);
    fail_msg("plan JSON differs from the golden copy");
  }
  json_decref(plan);
  json_decref(want);
}

#define T(f) cmocka_unit_test_setup(f, setup)

int main(void)
{
  const struct CMUnitTest tests[] = {
    T(test_strategy_parse),
    T(test_isolation_filter_and_choice),
    T(test_region_filter),
    T(test_gpu_filter),
    T(test_snapshot_ports_resources),
    T(test_all_reasons_reported),
    T(test_allow_deny),
    T(test_pin),
    T(test_budget),
    T(test_cost_estimate),
    T(test_strategies),
    T(test_cost_tie_breaks_on_latency_then_config),
    T(test_breaker_open_skipped),
    T(test_health_record),
    T(test_deterministic),
    T(test_plan_json_golden),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
