/*
 * Failover at unit level (the end-to-end proof through the API is the API
 * tests' job): a burst of 100 concurrent creates placed over two real sim
 * providers from the registry, `bad` failing 63 % of creates and `good`
 * failing none, with the create path's logic reduced to a small loop:
 * osr_place -> osr_breaker_allow -> create -> osr_provider_health_record ->
 * on a retryable error, the next candidate of a fresh plan. Expect >= 99.9 %
 * success (i.e. all 100) and the bad provider's breaker to have opened.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "gateway/providers.h"
#include "util/mem.h"

static uv_loop_t loop;

typedef struct attempt_s {
  osr_providers_t *reg;
  char id[32];
  int tried[4];        /* provider index -> already tried */
  int done, ok;
  int attempts;
  size_t idx;          /* provider of the attempt in flight */
  uint64_t started;
} attempt_t;

static int64_t now_ms(void)
{
  return (int64_t)uv_now(&loop);
}

static void try_next(attempt_t *a);

static void on_created(osr_provider_t *p, int status, const osr_resource_t *res, void *data)
{
  attempt_t *a = data;
  osr_provider_health_t *h = osr_providers_health(a->reg, a->idx);
  osr_provider_health_record(h, status, (double)(uv_now(&loop) - a->started), now_ms());
  if (status == 0) {
    a->ok = 1;
    a->done = 1;
    return;
  }
  if (!osr_provider_err_retryable(status)) {
    a->done = 1;
    return;
  }
  try_next(a);
}

static void try_next(attempt_t *a)
{
  size_t n = osr_providers_count(a->reg);
  osr_candidate_t c[4];
  osr_capabilities_t caps;
  osr_policy_t pol;
  memset(&caps, 0, sizeof(caps));
  memset(&pol, 0, sizeof(pol));
  pol.strategy = OSR_STRATEGY_ORDER; /* bad first: the worst case */
  osr_placement_input_t in = {
    .providers = osr_providers_list(a->reg),
    .health = osr_providers_health_list(a->reg),
    .nproviders = n,
    .caps = &caps,
    .policy = &pol,
    .now_ms = now_ms(),
  };
  size_t ne = osr_place(&in, c);
  for (size_t i = 0; i < ne; i++) {
    size_t idx;
    assert_non_null(osr_providers_find(a->reg, c[i].provider->name, &idx));
    if (a->tried[idx] || !osr_breaker_allow(&c[i].health->breaker, now_ms()))
      continue;
    a->tried[idx] = 1;
    a->idx = idx;
    a->attempts++;
    a->started = uv_now(&loop);
    osr_sandbox_spec_t spec;
    memset(&spec, 0, sizeof(spec));
    spec.sandbox_id = a->id;
    spec.tenant = "t";
    spec.isolation = c[i].isolation;
    spec.region = c[i].region;
    spec.caps = caps;
    int rv = c[i].provider->adapter->create(c[i].provider, &spec, on_created, a);
    assert_int_equal(rv, 0);
    return;
  }
  a->done = 1; /* all_providers_failed */
}

static int closed;
static void on_closed(void *data)
{
  (void)data;
  closed = 1;
}

static void test_failover_burst(void **state)
{
  (void)state;
  enum { N = 100 };
  json_error_t e;
  json_t *cfg = json_loads("[{\"name\":\"bad\",\"type\":\"sim\",\"failure_rate\":0.63,"
                           "\"seed\":63,\"latency_ms\":2,\"error\":\"unavailable\"},"
                           "{\"name\":\"good\",\"type\":\"sim\",\"latency_ms\":5,\"seed\":1}]",
                           0, &e);
  assert_non_null(cfg);
  osr_providers_t *reg = NULL;
  char err[256] = "";
  int rv = osr_providers_new(&loop, cfg, NULL, NULL, &reg, err, sizeof(err));
  if (rv != 0)
    fail_msg("providers: %s", err);
  json_decref(cfg);

  static attempt_t a[N];
  memset(a, 0, sizeof(a));
  /* The burst: all 100 start before any answer arrives. */
  for (int i = 0; i < N; i++) {
    a[i].reg = reg;
    snprintf(a[i].id, sizeof(a[i].id), "sbx-%03d", i);
    try_next(&a[i]);
  }
  uint64_t end = uv_now(&loop) + 20000;
  int all = 0;
  while (!all && uv_now(&loop) < end) {
    uv_run(&loop, UV_RUN_ONCE);
    all = 1;
    for (int i = 0; i < N; i++)
      all &= a[i].done;
  }
  assert_true(all);
  int ok = 0, retried = 0;
  for (int i = 0; i < N; i++) {
    ok += a[i].ok;
    retried += a[i].attempts > 1;
  }
  osr_provider_health_t *bad = osr_providers_health(reg, 0);
  osr_provider_health_t *good = osr_providers_health(reg, 1);
  print_message("ok %d/%d, retried %d, bad: ok %llu failed %llu opened %llu; good: ok %llu\n",
                ok, N, retried, (unsigned long long)bad->creates_ok,
                (unsigned long long)bad->creates_failed,
                (unsigned long long)bad->breaker.times_opened,
                (unsigned long long)good->creates_ok);
  /* >= 99.9 % of 100 is all of them. */
  assert_true(ok * 1000 >= N * 999);
  assert_true(bad->breaker.times_opened >= 1);
  assert_true(bad->creates_failed > 0);
  assert_true(retried > 0);
  assert_int_equal(good->creates_failed, 0);

  /* The registry's JSON shows it. */
  json_t *j = osr_providers_to_json(reg, now_ms());
  json_t *h = json_object_get(json_array_get(json_object_get(j, "providers"), 0), "health");
  assert_true(json_integer_value(json_object_get(h, "timesOpened")) >= 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(j, "providers"), 0), "name")), "bad");
  json_decref(j);

  closed = 0;
  osr_providers_close(reg, on_closed, NULL);
  assert_int_equal(closed, 0); /* never inside the call */
  end = uv_now(&loop) + 5000;
  while (!closed && uv_now(&loop) < end)
    uv_run(&loop, UV_RUN_ONCE);
  assert_int_equal(closed, 1);
}

static void expect_reg_error(const char *json, const char *prices, const char *needle)
{
  json_error_t e;
  json_t *cfg = json_loads(json, 0, &e);
  json_t *pr = prices != NULL ? json_loads(prices, 0, &e) : NULL;
  osr_providers_t *reg = NULL;
  char err[300] = "";
  assert_int_equal(osr_providers_new(&loop, cfg, pr, NULL, &reg, err, sizeof(err)), OSR_EINVAL);
  assert_null(reg);
  if (strstr(err, needle) == NULL)
    fail_msg("error '%s' lacks '%s'", err, needle);
  json_decref(cfg);
  json_decref(pr);
  uv_run(&loop, UV_RUN_DEFAULT); /* background closes finish */
}

static void test_registry_config(void **state)
{
  (void)state;
  expect_reg_error("[]", NULL, "non-empty list");
  expect_reg_error("[{\"type\":\"sim\"}]", NULL, "provider '#1': key 'name'");
  expect_reg_error("[{\"name\":\"x\"}]", NULL, "provider 'x': key 'type': missing");
  expect_reg_error("[{\"name\":\"x\",\"type\":\"warp\"}]", NULL,
                   "provider 'x': key 'type': unknown provider type 'warp' (built in: sim");
  expect_reg_error("[{\"name\":\"x\",\"type\":\"sim\"},{\"name\":\"y\",\"type\":\"sim\",\"failure_rate\":9}]",
                   NULL, "provider 'y': key 'failure_rate'");
  expect_reg_error("[{\"name\":\"x\",\"type\":\"sim\"},{\"name\":\"x\",\"type\":\"sim\"}]", NULL,
                   "configured twice");
  expect_reg_error("[{\"name\":\"x\",\"type\":\"sim\"}]", "{\"y\":{}}", "no provider named 'y'");
  expect_reg_error("[{\"name\":\"x\",\"type\":\"sim\"}]", "{\"x\":{\"cpu\":1}}",
                   "provider 'x': price override key 'cpu'");
  expect_reg_error("[{\"name\":\"x\",\"type\":\"sim\"}]", "{\"x\":{\"gpu\":{\"H100\":1}}}",
                   "no GPU type 'H100'");

  /* Price overrides apply on top of the manifest. */
  json_error_t e;
  json_t *cfg = json_loads("[{\"name\":\"a\",\"type\":\"sim\",\"gpus\":{\"max\":1,\"types\":{\"L4\":0.1}}},"
                           "{\"name\":\"b\",\"type\":\"sim\"}]", 0, &e);
  json_t *pr = json_loads("{\"a\":{\"vcpu_per_s\":2,\"gib_per_s\":3,\"per_create\":4,\"gpu\":{\"L4\":5}}}", 0, &e);
  osr_breaker_config_t bc = {.consecutive_failures = 7};
  osr_providers_t *reg = NULL;
  char err[256];
  assert_int_equal(osr_providers_new(&loop, cfg, pr, &bc, &reg, err, sizeof(err)), 0);
  assert_int_equal(osr_providers_count(reg), 2);
  size_t idx = 9;
  osr_provider_t *a = osr_providers_find(reg, "a", &idx);
  assert_non_null(a);
  assert_int_equal(idx, 0);
  assert_null(osr_providers_find(reg, "zz", NULL));
  assert_true(a->info.price_vcpu_per_s == 2 && a->info.price_gib_per_s == 3);
  assert_true(a->info.price_per_create == 4 && a->info.gpu_price_per_s[0] == 5);
  assert_true(osr_providers_at(reg, 1)->info.price_vcpu_per_s < 1);
  assert_int_equal(osr_providers_health(reg, 0)->breaker.cfg.consecutive_failures, 7);
  json_t *j = osr_providers_to_json(reg, 0);
  json_t *p0 = json_array_get(json_object_get(j, "providers"), 0);
  assert_string_equal(json_string_value(json_object_get(p0, "type")), "sim");
  assert_true(json_real_value(json_object_get(json_object_get(p0, "prices"), "vcpuPerSecond")) == 2);
  assert_string_equal(json_string_value(json_object_get(json_object_get(p0, "health"), "breaker")),
                      "closed");
  json_t *iso = json_object_get(json_object_get(p0, "capabilities"), "isolation");
  assert_int_equal(json_array_size(iso), 2);
  json_decref(j);
  json_decref(cfg);
  json_decref(pr);
  closed = 0;
  osr_providers_close(reg, on_closed, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(closed, 1);
}

int main(void)
{
  uv_loop_init(&loop);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_failover_burst),
    cmocka_unit_test(test_registry_config),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  return rc;
}
