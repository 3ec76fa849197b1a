/*
 * The adapter contract test, run against the `sim` adapter (docs/adapters.md:
 * every adapter gets one of these):
 *   - create -> get -> list shows our label -> destroy -> get NOT_FOUND;
 *   - every callback fires exactly once, and never inside the call;
 *   - close with operations in flight: each fails with OSR_ECANCELED, then
 *     the close callback runs;
 *   - list_page: pages of at most `limit`, every resource in exactly one page
 *     even when resources of earlier pages are destroyed between pages;
 *   - sim-specific knobs: failure_rate (and its seeded reproducibility),
 *     boot_failure_rate (the half-created resource is destroyed), capacity,
 *     configuration errors naming the key, connection refused in url mode.
 *
 * With OSR_TEST_SIM_URL=http://127.0.0.1:PORT (set by
 * tests/integration/sim/test_sim.py, which starts a real osr-sim) the
 * contract tests run in url mode against that server instead.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adapters/sim.h"
#include "contract.h"
#include "util/mem.h"

static const char *sim_url;
/* OSR_TEST_SIM_OFFLOAD=N: url mode with offload_bytes N (0: every answer
 * is parsed on the thread pool, rest.h on_work). */
static const char *sim_offload;

static osr_provider_t *sim_new_mode(const char *json, int url_mode)
{
  json_error_t e;
  json_t *cfg = json_loads(json, 0, &e);
  assert_non_null(cfg);
  if (url_mode && sim_url != NULL) {
    json_object_set_new(cfg, "url", json_string(sim_url));
    if (sim_offload != NULL)
      json_object_set_new(cfg, "offload_bytes", json_integer(atoll(sim_offload)));
  }
  osr_provider_t *p = osr_xcalloc(1, sizeof(*p));
  p->adapter = osr_adapter_find("sim");
  assert_ptr_equal(p->adapter, &osr_adapter_sim);
  p->loop = &loop;
  snprintf(p->name, sizeof(p->name), "sim-test");
  char err[256] = "";
  int rv = p->adapter->init(p, cfg, err, sizeof(err));
  if (rv != 0)
    fail_msg("init: %s", err);
  json_decref(cfg);
  p->adapter->describe(p, &p->info);
  return p;
}

static osr_provider_t *sim_new(const char *json)
{
  return sim_new_mode(json, 1);
}

static void spec_init(osr_sandbox_spec_t *s, const char *id)
{
  memset(s, 0, sizeof(*s));
  s->sandbox_id = id;
  s->tenant = "tenant-a";
  s->template_id = "base";
  s->isolation = OSR_ISO_CONTAINER;
  s->caps.isolation = OSR_ISO_CONTAINER;
  s->region = "";
  s->timeout_s = 60;
}

static int do_create(osr_provider_t *p, const char *id, res_t *r)
{
  osr_sandbox_spec_t spec;
  spec_init(&spec, id);
  memset(r, 0, sizeof(*r));
  in_call = 1;
  int rv = p->adapter->create(p, &spec, on_create, r);
  in_call = 0;
  return rv;
}

static void create_sync(osr_provider_t *p, const char *id, res_t *r)
{
  assert_int_equal(do_create(p, id, r), 0);
  assert_int_equal(r->calls, 0);
  run_until(&r->calls, 10000);
  assert_int_equal(r->calls, 1);
}

static void get_sync(osr_provider_t *p, const char *pid, res_t *r)
{
  memset(r, 0, sizeof(*r));
  in_call = 1;
  assert_int_equal(p->adapter->get(p, pid, on_create, r), 0);
  in_call = 0;
  run_until(&r->calls, 10000);
  assert_int_equal(r->calls, 1);
}

static void destroy_sync(osr_provider_t *p, const char *pid, res_t *r)
{
  memset(r, 0, sizeof(*r));
  in_call = 1;
  assert_int_equal(p->adapter->destroy(p, pid, on_done, r), 0);
  in_call = 0;
  run_until(&r->calls, 10000);
  assert_int_equal(r->calls, 1);
}

static void list_sync(osr_provider_t *p, const char *want, res_t *r)
{
  memset(r, 0, sizeof(*r));
  r->want = want;
  in_call = 1;
  assert_int_equal(p->adapter->list(p, on_list, r), 0);
  in_call = 0;
  run_until(&r->calls, 10000);
  assert_int_equal(r->calls, 1);
}

/* Sandbox ids unique per process, so url-mode runs sharing one osr-sim do
 * not see each other's resources. */
static const char *uid(const char *base)
{
  static char buf[8][64];
  static int k;
  char *b = buf[k++ % 8];
  snprintf(b, 64, "%s-%ld", base, (long)getpid());
  return b;
}

static void page_sync(osr_provider_t *p, const char *cursor, size_t limit, page_t *pg)
{
  const char *prefix = pg->prefix;
  memset(pg, 0, sizeof(*pg));
  pg->prefix = prefix;
  in_call = 1;
  assert_int_equal(p->adapter->list_page(p, cursor, limit, on_page, pg), 0);
  in_call = 0;
  run_until(&pg->r.calls, 10000);
  assert_int_equal(pg->r.calls, 1);
  assert_int_equal(pg->r.status, 0);
  assert_true(pg->n <= limit);
}

/* ---- the contract ---------------------------------------------------------- */

static void test_contract_list_pages(void **state)
{
  (void)state;
  osr_provider_t *p = sim_new("{\"latency_ms\": 0}");
  enum { N = 9 };
  res_t c[N], d;
  char ids[N][80], prefix[64];
  snprintf(prefix, sizeof(prefix), "%s-", uid("sbx-page"));
  for (int i = 0; i < N; i++) {
    snprintf(ids[i], sizeof(ids[i]), "%s%d", prefix, i);
    create_sync(p, ids[i], &c[i]);
    assert_int_equal(c[i].status, 0);
  }
  assert_non_null(p->adapter->list_page);
  assert_int_equal(p->adapter->list_page(p, NULL, 0, on_page, &d), OSR_EINVAL);
  assert_int_equal(p->adapter->list_page(p, "no-such-cursor", 2, on_page, &d), OSR_EINVAL);
  assert_int_equal(p->adapter->list_page(p, NULL, 2, NULL, &d), OSR_EINVAL);

  /* Walk in pages of 2; after the first page, destroy what it returned of
   * ours: nothing later may be skipped for it. */
  int seen[N] = {0}, pages = 0, destroyed = 0;
  page_t pg = {.prefix = prefix};
  char cursor[512] = "";
  do {
    page_sync(p, cursor[0] ? cursor : NULL, 2, &pg);
    pages++;
    for (size_t k = 0; k < pg.nids; k++)
      for (int i = 0; i < N; i++)
        if (strcmp(pg.sandbox_ids[k], ids[i]) == 0)
          seen[i]++;
    if (!destroyed && pg.nids > 0) {
      for (int i = 0; i < N; i++)
        if (seen[i]) {
          destroy_sync(p, c[i].res.provider_id, &d);
          assert_int_equal(d.status, 0);
        }
      destroyed = 1;
    }
    snprintf(cursor, sizeof(cursor), "%s", pg.next);
    assert_true(pages < 100000);
  } while (pg.has_next);
  for (int i = 0; i < N; i++)
    assert_int_equal(seen[i], 1);
  assert_true(pages >= (N + 1) / 2);

  /* One page large enough for everything is the last. */
  page_sync(p, NULL, 10000, &pg);
  assert_false(pg.has_next);

  for (int i = 0; i < N; i++)
    destroy_sync(p, c[i].res.provider_id, &d);
  adapter_free(p);
  assert_int_equal(sync_calls, 0);
}

static void test_contract_lifecycle(void **state)
{
  (void)state;
  osr_provider_t *p = sim_new("{\"latency_ms\": 5}");
  res_t c, g, l, d;
  const char *id = uid("sbx-life");

  create_sync(p, id, &c);
  assert_int_equal(c.status, 0);
  assert_string_equal(c.res.sandbox_id, id);
  assert_true(c.res.provider_id[0] != '\0');
  assert_int_equal(strncmp(c.res.agent_endpoint, "sim://", 6), 0);
  assert_int_equal(c.res.state, OSR_RES_RUNNING);
  assert_int_equal(c.res.isolation, OSR_ISO_CONTAINER);
  assert_int_equal(c.res.granted.isolation, OSR_ISO_CONTAINER);
  assert_true(c.res.granted.vcpus >= 1 && c.res.granted.min_memory_mib >= 1);

  get_sync(p, c.res.provider_id, &g);
  assert_int_equal(g.status, 0);
  assert_string_equal(g.res.provider_id, c.res.provider_id);
  assert_string_equal(g.res.sandbox_id, id);

  list_sync(p, id, &l);
  assert_int_equal(l.status, 0);
  assert_int_equal(l.found, 1); /* carries our label */
  assert_int_equal(l.found_state, OSR_RES_RUNNING);

  destroy_sync(p, c.res.provider_id, &d);
  assert_int_equal(d.status, 0);
  get_sync(p, c.res.provider_id, &g);
  assert_int_equal(g.status, OSR_PERR_NOT_FOUND);
  destroy_sync(p, c.res.provider_id, &d);
  assert_int_equal(d.status, OSR_PERR_NOT_FOUND);
  list_sync(p, id, &l);
  assert_int_equal(l.found, 0);
  /* An id that cannot exist is simply not found. */
  get_sync(p, "no/such id", &g);
  assert_int_equal(g.status, OSR_PERR_NOT_FOUND);

  adapter_free(p);
  assert_int_equal(sync_calls, 0);
}

static void test_contract_bad_args(void **state)
{
  (void)state;
  osr_provider_t *p = sim_new("{}");
  res_t r;
  memset(&r, 0, sizeof(r));
  osr_sandbox_spec_t spec;
  spec_init(&spec, NULL);
  assert_int_equal(p->adapter->create(p, &spec, on_create, &r), OSR_EINVAL);
  assert_int_equal(p->adapter->create(p, NULL, on_create, &r), OSR_EINVAL);
  assert_int_equal(p->adapter->get(p, NULL, on_create, &r), OSR_EINVAL);
  assert_int_equal(p->adapter->list(p, NULL, &r), OSR_EINVAL);
  uv_run(&loop, UV_RUN_NOWAIT);
  assert_int_equal(r.calls, 0); /* an error return means no callback */
  adapter_free(p);
}

static void test_contract_close_inflight(void **state)
{
  (void)state;
  osr_provider_t *p = sim_new("{\"latency_ms\": 300}");
  res_t r[5], l;
  for (int i = 0; i < 5; i++)
    assert_int_equal(do_create(p, uid("sbx-cancel"), &r[i]), 0);
  memset(&l, 0, sizeof(l));
  assert_int_equal(p->adapter->list(p, on_list, &l), 0);
  closed = 0;
  in_call = 1;
  p->adapter->close(p, on_closed);
  /* Closing: new work is refused at once. */
  res_t late;
  memset(&late, 0, sizeof(late));
  assert_int_equal(p->adapter->list(p, on_list, &late), OSR_ECLOSED);
  in_call = 0;
  for (int i = 0; i < 5; i++)
    assert_int_equal(r[i].calls, 0);
  run_until(&closed, 5000);
  assert_int_equal(closed, 1);
  for (int i = 0; i < 5; i++) {
    assert_int_equal(r[i].calls, 1);
    assert_int_equal(r[i].status, OSR_ECANCELED);
  }
  assert_int_equal(l.calls, 1);
  assert_int_equal(l.status, OSR_ECANCELED);
  assert_int_equal(late.calls, 0);
  osr_free(p);
  assert_int_equal(sync_calls, 0);
}

static void test_contract_concurrent(void **state)
{
  (void)state;
  /* Many creates at once, each answered exactly once. */
  osr_provider_t *p = sim_new("{\"latency_ms\": 5}");
  enum { N = 64 };
  static res_t r[N];
  int all = 0;
  for (int i = 0; i < N; i++)
    assert_int_equal(do_create(p, uid("sbx-many"), &r[i]), 0);
  uint64_t end = uv_now(&loop) + 10000;
  while (!all && uv_now(&loop) < end) {
    run_until(&r[N - 1].calls, 100);
    all = 1;
    for (int i = 0; i < N; i++)
      all &= r[i].calls == 1;
  }
  assert_true(all);
  for (int i = 0; i < N; i++) {
    assert_int_equal(r[i].status, 0);
    res_t d;
    destroy_sync(p, r[i].res.provider_id, &d);
    assert_int_equal(d.status, 0);
  }
  adapter_free(p);
  assert_int_equal(sync_calls, 0);
}

static void test_contract_reconnect(void **state)
{
  (void)state;
  /* In url mode (osr-sim started with a short --idle-timeout-ms) the
   * server closes the idle connection between these creates; the adapter
   * must notice and reconnect rather than fail. */
  osr_provider_t *p = sim_new("{\"latency_ms\": 1}");
  for (int i = 0; i < 3; i++) {
    res_t c, d;
    create_sync(p, uid("sbx-reconnect"), &c);
    assert_int_equal(c.status, 0);
    destroy_sync(p, c.res.provider_id, &d);
    assert_int_equal(d.status, 0);
    int never = 0;
    run_until(&never, 400);
  }
  adapter_free(p);
  assert_int_equal(sync_calls, 0);
}

/* ---- sim knobs (in-process) --------------------------------------------------- */

static void test_failure_rate_all(void **state)
{
  (void)state;
  osr_provider_t *p = sim_new_mode("{\"latency_ms\":0,\"failure_rate\":1,\"error\":\"rate_limited\"}", 0);
  for (int i = 0; i < 10; i++) {
    res_t c;
    create_sync(p, "sbx-f", &c);
    assert_int_equal(c.status, OSR_PERR_RATE_LIMITED);
  }
  res_t l;
  list_sync(p, "sbx-f", &l);
  assert_int_equal(l.n, 0); /* nothing was created */
  adapter_free(p);
}

static void run_fraction(const char *cfg, int n, int *fails, unsigned char *pattern)
{
  osr_provider_t *p = sim_new_mode(cfg, 0);
  *fails = 0;
  for (int i = 0; i < n; i++) {
    res_t c;
    create_sync(p, "sbx-r", &c);
    pattern[i] = c.status != 0;
    if (c.status != 0) {
      assert_int_equal(c.status, OSR_PERR_UNAVAILABLE); /* the default error */
      (*fails)++;
    } else {
      res_t d;
      destroy_sync(p, c.res.provider_id, &d);
    }
  }
  adapter_free(p);
}

static void test_failure_rate_seeded(void **state)
{
  (void)state;
  enum { N = 400 };
  static unsigned char p1[N], p2[N], p3[N];
  int f1, f2, f3;
  run_fraction("{\"latency_ms\":0,\"failure_rate\":0.5,\"seed\":42}", N, &f1, p1);
  run_fraction("{\"latency_ms\":0,\"failure_rate\":0.5,\"seed\":42}", N, &f2, p2);
  run_fraction("{\"latency_ms\":0,\"failure_rate\":0.5,\"seed\":7}", N, &f3, p3);
  /* Binomial(400, 0.5): sd 10, so 160..240 is 4 sd (and the seed makes it
   * reproducible, so this cannot flake). */
  assert_true(f1 >= 160 && f1 <= 240);
  assert_true(f3 >= 160 && f3 <= 240);
  assert_int_equal(f1, f2);
  assert_memory_equal(p1, p2, N);          /* same seed, same outcomes */
  assert_true(memcmp(p1, p3, N) != 0);     /* another seed, others */
}

static void test_boot_failure(void **state)
{
  (void)state;
  osr_provider_t *p = sim_new_mode("{\"latency_ms\":100,\"boot_failure_rate\":1}", 0);
  res_t c, l;
  assert_int_equal(do_create(p, "sbx-boot", &c), 0);
  /* Accepted: the labelled resource exists while it "boots". */
  list_sync(p, "sbx-boot", &l);
  assert_int_equal(c.calls, 0);
  assert_int_equal(l.found, 1);
  assert_int_equal(l.found_state, OSR_RES_STARTING);
  run_until(&c.calls, 5000);
  assert_int_equal(c.calls, 1);
  assert_int_equal(c.status, OSR_PERR_BOOT_FAILED);
  /* ... and is destroyed when the boot fails. */
  list_sync(p, "sbx-boot", &l);
  assert_int_equal(l.n, 0);
  adapter_free(p);
}

static void test_capacity(void **state)
{
  (void)state;
  osr_provider_t *p = sim_new_mode("{\"latency_ms\":1,\"capacity\":2}", 0);
  res_t a, b, c, d;
  create_sync(p, "sbx-1", &a);
  create_sync(p, "sbx-2", &b);
  create_sync(p, "sbx-3", &c);
  assert_int_equal(a.status, 0);
  assert_int_equal(b.status, 0);
  assert_int_equal(c.status, OSR_PERR_CAPACITY);
  destroy_sync(p, a.res.provider_id, &d);
  create_sync(p, "sbx-3", &c);
  assert_int_equal(c.status, 0);
  adapter_free(p);
}

static void test_honest_manifest(void **state)
{
  (void)state;
  osr_provider_t *p = sim_new_mode(
    "{\"isolation\":[\"gvisor\",\"firecracker\"],\"regions\":[\"eu\",\"us\"],"
    "\"gpus\":{\"max\":2,\"types\":{\"H100\":0.001}},\"snapshot\":true,"
    "\"prices\":{\"vcpu_per_s\":0.5,\"gib_per_s\":0.25,\"per_create\":0.125},"
    "\"latency_ms\":3,\"expected_create_ms\":70}", 0);
  const osr_provider_info_t *i = &p->info;
  assert_int_equal(i->isolation_mask, (1u << OSR_ISO_GVISOR) | (1u << OSR_ISO_FIRECRACKER));
  assert_string_equal(i->regions[0], "eu");
  assert_string_equal(i->regions[1], "us");
  assert_null(i->regions[2]);
  assert_int_equal(i->gpu_max, 2);
  assert_string_equal(i->gpu_types[0], "H100");
  assert_true(i->gpu_price_per_s[0] == 0.001);
  assert_true(i->snapshot);
  assert_true(i->price_vcpu_per_s == 0.5 && i->price_gib_per_s == 0.25);
  assert_true(i->price_per_create == 0.125 && i->expected_create_ms == 70);
  /* Asked for what it does not offer, it refuses (never a silent downgrade). */
  osr_sandbox_spec_t spec;
  res_t r;
  spec_init(&spec, "sbx-x");
  memset(&r, 0, sizeof(r));
  assert_int_equal(p->adapter->create(p, &spec, on_create, &r), 0); /* container */
  run_until(&r.calls, 5000);
  assert_int_equal(r.status, OSR_PERR_INVALID);
  spec.isolation = OSR_ISO_GVISOR;
  spec.region = "eu";
  spec.caps.gpu_count = 2;
  memset(&r, 0, sizeof(r));
  assert_int_equal(p->adapter->create(p, &spec, on_create, &r), 0);
  run_until(&r.calls, 5000);
  assert_int_equal(r.status, 0);
  assert_string_equal(r.res.region, "eu");
  assert_int_equal(r.res.granted.gpu_count, 2);
  assert_int_equal(r.res.isolation, OSR_ISO_GVISOR);
  adapter_free(p);
}

static void expect_config_error(const char *json, const char *needle)
{
  json_error_t e;
  json_t *cfg = json_loads(json, 0, &e);
  assert_non_null(cfg);
  osr_provider_t p;
  memset(&p, 0, sizeof(p));
  p.adapter = &osr_adapter_sim;
  p.loop = &loop;
  char err[256] = "";
  assert_int_equal(osr_adapter_sim.init(&p, cfg, err, sizeof(err)), OSR_EINVAL);
  if (strstr(err, needle) == NULL)
    fail_msg("'%s': error '%s' lacks '%s'", json, err, needle);
  assert_null(p.impl);
  json_decref(cfg);
}

static void test_config_errors(void **state)
{
  (void)state;
  expect_config_error("{\"bogus\":1}", "key 'bogus': unknown key");
  expect_config_error("{\"failure_rate\":1.5}", "key 'failure_rate': must be a number from 0 to 1");
  expect_config_error("{\"boot_failure_rate\":\"x\"}", "key 'boot_failure_rate'");
  expect_config_error("{\"latency_ms\":-1}", "key 'latency_ms'");
  expect_config_error("{\"capacity\":1.5}", "key 'capacity'");
  expect_config_error("{\"error\":\"nope\"}", "key 'error': must be one of");
  expect_config_error("{\"isolation\":[\"kvm\"]}", "key 'isolation'");
  expect_config_error("{\"isolation\":[]}", "key 'isolation'");
  expect_config_error("{\"url\":\"https://x:1\"}", "key 'url'");
  expect_config_error("{\"url\":\"http://nohostport\"}", "key 'url'");
  expect_config_error("{\"offload_bytes\":-1}", "key 'offload_bytes'");
  expect_config_error("{\"offload_bytes\":\"16k\"}", "key 'offload_bytes'");
  expect_config_error("{\"gpus\":{\"types\":{}}}", "key 'gpus'");
  expect_config_error("{\"prices\":{\"vcpu\":1}}", "key 'prices'");
  expect_config_error("{\"seed\":\"x\"}", "key 'seed'");
  /* The adapter table. */
  assert_null(osr_adapter_find("nope"));
  const char *names[4];
  assert_true(osr_adapter_types(names, 4) >= 1);
  assert_string_equal(names[0], "sim");
  assert_string_equal(osr_provider_err_name(OSR_PERR_BOOT_FAILED), "boot_failed");
  assert_true(osr_provider_err_retryable(OSR_PERR_CAPACITY));
  assert_true(osr_provider_err_retryable(OSR_PERR_BOOT_FAILED));
  assert_false(osr_provider_err_retryable(OSR_PERR_AUTH));
  assert_false(osr_provider_err_retryable(OSR_PERR_INVALID));
  assert_int_equal(osr_isolation_parse("gvisor"), OSR_ISO_GVISOR);
  assert_int_equal(osr_isolation_parse("vm"), OSR_ISO_NONE);
  assert_null(osr_isolation_name(OSR_ISO_NONE));
  assert_string_equal(osr_isolation_name(OSR_ISO_FIRECRACKER), "firecracker");
}

static void test_url_refused(void **state)
{
  (void)state;
  /* A port nobody listens on: bind one, note it, close it. */
  uv_tcp_t t;
  struct sockaddr_in sa;
  int len = sizeof(sa);
  uv_tcp_init(&loop, &t);
  uv_ip4_addr("127.0.0.1", 0, &sa);
  assert_int_equal(uv_tcp_bind(&t, (const struct sockaddr *)&sa, 0), 0);
  assert_int_equal(uv_tcp_getsockname(&t, (struct sockaddr *)&sa, &len), 0);
  char cfg[128];
  snprintf(cfg, sizeof(cfg), "{\"url\":\"http://127.0.0.1:%d\"}", ntohs(sa.sin_port));
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(&loop, UV_RUN_NOWAIT);

  osr_provider_t *p = sim_new_mode(cfg, 0);
  res_t c, l, g;
  create_sync(p, "sbx-refused", &c);
  assert_int_equal(c.status, OSR_PERR_UNAVAILABLE);
  list_sync(p, NULL, &l);
  assert_int_equal(l.status, OSR_PERR_UNAVAILABLE);
  get_sync(p, "sim-1", &g);
  assert_int_equal(g.status, OSR_PERR_UNAVAILABLE);
  adapter_free(p);
  assert_int_equal(sync_calls, 0);
}

/* ---- wire format: the create body and the resource reader ---------------- */

/* The create body as sim_create built it before osr__sim_create_body: the
 * json_pack + json_dumps(JSON_COMPACT) pair osr__sim_create_body replaced,
 * kept here as the reference its bytes must equal. */
static char *old_create_body(const osr_sandbox_spec_t *spec)
{
  const osr_capabilities_t *c = &spec->caps;
  json_t *ports = json_array();
  for (size_t i = 0; i < c->nports && i < OSR_MAX_PORTS; i++)
    json_array_append_new(ports, json_integer(c->ports[i]));
  json_t *caps =
      json_pack("{s:I,s:I,s:{s:I,s:s},s:b,s:o}", "vcpus", (json_int_t)c->vcpus, "memoryMiB",
                (json_int_t)c->min_memory_mib, "gpu", "count", (json_int_t)c->gpu_count, "type",
                c->gpu_type, "snapshot", c->snapshot, "ports", ports);
  json_t *b = json_pack(
      "{s:s,s:s,s:s,s:s?,s:s,s:I,s:o,s:{s:s,s:s}}", "sandbox_id", spec->sandbox_id, "tenant",
      spec->tenant != NULL ? spec->tenant : "", "template",
      spec->template_id != NULL ? spec->template_id : "", "isolation",
      osr_isolation_name(spec->isolation), "region", spec->region != NULL ? spec->region : "",
      "timeout_s", (json_int_t)spec->timeout_s, "caps", caps, "labels", OSR_LABEL_SANDBOX_ID,
      spec->sandbox_id, OSR_LABEL_TENANT, spec->tenant != NULL ? spec->tenant : "");
  assert_non_null(b);
  char *s = json_dumps(b, JSON_COMPACT);
  json_decref(b);
  return s;
}

static void check_create_body(const osr_sandbox_spec_t *spec)
{
  size_t len = 0;
  char *got = osr__sim_create_body(spec, &len);
  char *want = old_create_body(spec);
  assert_non_null(got);
  assert_non_null(want);
  assert_string_equal(got, want);
  assert_int_equal(len, strlen(want));
  osr_free(got);
  osr_json_free(want);
}

static void test_create_body(void **state)
{
  (void)state;
  osr_sandbox_spec_t spec;
  memset(&spec, 0, sizeof(spec));
  spec.sandbox_id = "abcdefgh0123456789xy";
  check_create_body(&spec); /* NULL tenant/template/region, no isolation: null */
  spec.tenant = "team-a";
  spec.template_id = "base";
  spec.region = "eu-west";
  spec.isolation = OSR_ISO_GVISOR;
  spec.timeout_s = UINT32_MAX;
  spec.caps.vcpus = 64;
  spec.caps.min_memory_mib = 65536;
  spec.caps.gpu_count = 2;
  snprintf(spec.caps.gpu_type, sizeof(spec.caps.gpu_type), "h100");
  spec.caps.snapshot = 1;
  check_create_body(&spec);
  for (size_t n = 0; n <= OSR_MAX_PORTS; n++) {
    spec.caps.nports = n;
    for (size_t i = 0; i < n; i++)
      spec.caps.ports[i] = (uint16_t)(i == 0 ? 65535 : i * 1000 + 1);
    check_create_body(&spec);
  }
  /* Escaping and UTF-8 in every free-text field. */
  spec.tenant = "t\"e\\n/a\x01\x1f\x7f";
  spec.template_id = "tpl\n\t\xc3\xa9\xe6\x97\xa5\xf0\x9f\x98\x80";
  spec.region = "";
  spec.isolation = OSR_ISO_FIRECRACKER;
  spec.caps.snapshot = 0;
  snprintf(spec.caps.gpu_type, sizeof(spec.caps.gpu_type), "a\"b");
  check_create_body(&spec);
}

/* osr__sim_resource_from_json as it was, with json_unpack: the reference
 * for the member-by-member reader that replaced it. */
static int old_resource_from_json(const json_t *j, osr_resource_t *r, char *tenant)
{
  const char *id = NULL, *sid = NULL, *ten = "", *region = "", *iso = NULL, *state = "unknown",
             *ep = "";
  json_t *granted = NULL;
  memset(r, 0, sizeof(*r));
  if (json_unpack((json_t *)j, "{s:s,s:s,s?s,s?s,s?s,s?s,s?s,s?o}", "id", &id, "sandbox_id", &sid,
                  "tenant", &ten, "region", &region, "isolation", &iso, "state", &state,
                  "agent_endpoint", &ep, "granted", &granted) != 0)
    return OSR_EINVAL;
  if (strlen(id) >= sizeof(r->provider_id) || strlen(sid) >= sizeof(r->sandbox_id))
    return OSR_EINVAL;
  snprintf(r->provider_id, sizeof(r->provider_id), "%s", id);
  snprintf(r->sandbox_id, sizeof(r->sandbox_id), "%s", sid);
  snprintf(r->region, sizeof(r->region), "%s", region);
  snprintf(r->agent_endpoint, sizeof(r->agent_endpoint), "%s", ep);
  r->isolation = osr_isolation_parse(iso);
  r->state = OSR_RES_UNKNOWN;
  static const char *const names[] = {"unknown", "starting", "running",
                                      "paused",  "stopped",  "gone"};
  for (int i = 0; i <= OSR_RES_GONE; i++)
    if (strcmp(names[i], state) == 0)
      r->state = (osr_resource_state_t)i;
  if (tenant != NULL)
    snprintf(tenant, OSR_NAME_MAX, "%s", ten);
  osr_capabilities_t *g = &r->granted;
  if (json_is_object(granted)) {
    json_int_t vcpus = 0, mem = 0, gcount = 0;
    const char *gtype = "";
    int snap = 0;
    json_t *ports = NULL;
    json_unpack(granted, "{s?I,s?I,s?{s?I,s?s},s?b,s?o}", "vcpus", &vcpus, "memoryMiB", &mem, "gpu",
                "count", &gcount, "type", &gtype, "snapshot", &snap, "ports", &ports);
    g->vcpus = (uint32_t)vcpus;
    g->min_memory_mib = (uint32_t)mem;
    g->gpu_count = (uint32_t)gcount;
    snprintf(g->gpu_type, sizeof(g->gpu_type), "%s", gtype);
    g->snapshot = snap;
    size_t i;
    json_t *v;
    json_array_foreach(ports, i, v)
    {
      if (g->nports < OSR_MAX_PORTS && json_is_integer(v))
        g->ports[g->nports++] = (uint16_t)json_integer_value(v);
    }
  }
  snprintf(g->region, sizeof(g->region), "%s", r->region);
  g->isolation = r->isolation;
  return 0;
}

static void check_from_json(const json_t *j)
{
  osr_resource_t got, want;
  char got_tenant[OSR_NAME_MAX], want_tenant[OSR_NAME_MAX];
  memset(&got, 0x5a, sizeof(got));
  memset(&want, 0xa5, sizeof(want));
  memset(got_tenant, 'g', sizeof(got_tenant));
  memset(want_tenant, 'g', sizeof(want_tenant));
  int rv_got = osr__sim_resource_from_json(j, &got, got_tenant);
  int rv_want = old_resource_from_json(j, &want, want_tenant);
  assert_int_equal(rv_got, rv_want);
  assert_memory_equal(&got, &want, sizeof(got));
  assert_memory_equal(got_tenant, want_tenant, sizeof(got_tenant));
  assert_int_equal(osr__sim_resource_from_json(j, &got, NULL), rv_want);
}

/* A member path ("granted.gpu.type") set to `v` (NULL: removed) in a copy. */
static json_t *with_member(const json_t *base, const char *path, json_t *v)
{
  json_t *copy = json_deep_copy(base);
  json_t *obj = copy;
  char buf[64];
  snprintf(buf, sizeof(buf), "%s", path);
  char *key = buf, *dot;
  while ((dot = strchr(key, '.')) != NULL) {
    *dot = '\0';
    obj = json_object_get(obj, key);
    key = dot + 1;
  }
  if (v != NULL)
    json_object_set(obj, key, v);
  else
    json_object_del(obj, key);
  return copy;
}

/* Every member of a full answer (and of its "granted") missing, or of each
 * JSON type, read the same as json_unpack read it: the same errors, the
 * same values, the same defaults. */
static void test_resource_from_json(void **state)
{
  (void)state;
  osr_resource_t r;
  memset(&r, 0, sizeof(r));
  snprintf(r.provider_id, sizeof(r.provider_id), "sim-42");
  snprintf(r.sandbox_id, sizeof(r.sandbox_id), "abcdefgh0123456789xy");
  snprintf(r.region, sizeof(r.region), "eu-west");
  snprintf(r.agent_endpoint, sizeof(r.agent_endpoint), "sim://sim-42");
  r.isolation = OSR_ISO_GVISOR;
  r.state = OSR_RES_RUNNING;
  r.granted.vcpus = 4;
  r.granted.min_memory_mib = 2048;
  r.granted.gpu_count = 1;
  snprintf(r.granted.gpu_type, sizeof(r.granted.gpu_type), "h100");
  r.granted.snapshot = 1;
  r.granted.nports = 2;
  r.granted.ports[0] = 8080;
  r.granted.ports[1] = 9090;
  json_t *full = osr__sim_resource_to_json(&r, "team-a", 1700000000000);
  assert_non_null(full);
  check_from_json(full);

  static const char *const paths[] = {
      "id",
      "sandbox_id",
      "tenant",
      "region",
      "isolation",
      "state",
      "agent_endpoint",
      "granted",
      "granted.vcpus",
      "granted.memoryMiB",
      "granted.gpu",
      "granted.gpu.count",
      "granted.gpu.type",
      "granted.snapshot",
      "granted.ports",
      "labels",
      "created_ms",
      "extra",
  };
  json_t *values[] = {
      NULL,
      json_null(),
      json_string("x"),
      json_string(""),
      json_integer(7),
      json_integer(-1),
      json_real(1.5),
      json_true(),
      json_false(),
      json_object(),
      json_pack("[i,s,i]", 1, "a", 2),
      json_pack("{s:i}", "count", 3),
  };
  for (size_t p = 0; p < OSR_ARRAY_SIZE(paths); p++) {
    for (size_t v = 0; v < OSR_ARRAY_SIZE(values); v++) {
      json_t *j = with_member(full, paths[p], values[v]);
      check_from_json(j);
      json_decref(j);
    }
  }
  /* Too long ids, a non-object, an empty object. */
  char longid[300];
  memset(longid, 'a', sizeof(longid) - 1);
  longid[sizeof(longid) - 1] = '\0';
  json_t *s = json_string(longid);
  json_t *j = with_member(full, "id", s);
  check_from_json(j);
  json_decref(j);
  j = with_member(full, "sandbox_id", s);
  check_from_json(j);
  json_decref(j);
  json_decref(s);
  json_t *arr = json_array();
  check_from_json(arr);
  json_decref(arr);
  json_t *empty = json_object();
  check_from_json(empty);
  json_decref(empty);
  for (size_t v = 1; v < OSR_ARRAY_SIZE(values); v++)
    json_decref(values[v]);
  json_decref(full);
}

int main(void)
{
  uv_loop_init(&loop);
  sim_url = getenv("OSR_TEST_SIM_URL");
  if (sim_url != NULL && sim_url[0] == '\0')
    sim_url = NULL;
  sim_offload = getenv("OSR_TEST_SIM_OFFLOAD");
  const struct CMUnitTest contract[] = {
      cmocka_unit_test(test_contract_lifecycle),  cmocka_unit_test(test_contract_list_pages),
      cmocka_unit_test(test_contract_bad_args),   cmocka_unit_test(test_contract_close_inflight),
      cmocka_unit_test(test_contract_concurrent), cmocka_unit_test(test_contract_reconnect),
  };
  const struct CMUnitTest local[] = {
    cmocka_unit_test(test_failure_rate_all),
    cmocka_unit_test(test_failure_rate_seeded),
    cmocka_unit_test(test_boot_failure),
    cmocka_unit_test(test_capacity),
    cmocka_unit_test(test_honest_manifest),
    cmocka_unit_test(test_config_errors),
    cmocka_unit_test(test_url_refused),
    cmocka_unit_test(test_create_body),
    cmocka_unit_test(test_resource_from_json),
  };
  printf("sim adapter contract, %s mode%s%s%s%s\n", sim_url != NULL ? "url" : "in-process",
         sim_url != NULL ? ": " : "", sim_url != NULL ? sim_url : "",
         sim_url != NULL && sim_offload != NULL ? ", offload_bytes " : "",
         sim_url != NULL && sim_offload != NULL ? sim_offload : "");
  fflush(stdout);
  int rc = cmocka_run_group_tests_name(sim_url != NULL ? "contract (url mode)" : "contract",
                                       contract, NULL, NULL);
  if (sim_url == NULL)
    rc |= cmocka_run_group_tests_name("sim", local, NULL, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
  return rc;
}
