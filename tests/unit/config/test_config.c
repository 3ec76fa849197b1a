/*
 * Unit tests of the gateway configuration (src/gateway/config.c): the
 * bounded YAML reader, defaults -> file -> environment -> flags precedence,
 * secret references and their redaction, and errors that name file, line
 * and key.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gateway/gw.h"
#include "util/mem.h"

static char tmpdir[256];

static const char *const osr_env[] = {
    "OSR_LISTEN",   "OSR_DATAPLANE_LISTEN", "OSR_STORE",     "OSR_REDIS",
    "OSR_DATA_DIR", "OSR_PROVIDERS",        "OSR_ADMIN_KEY", "OSR_LOG_LEVEL",
    "OSR_LOG_JSON", "OSR_CONFIG",           "T_SECRET"};

static int setup(void **state)
{
  (void)state;
  for (size_t i = 0; i < sizeof(osr_env) / sizeof(osr_env[0]); i++)
    unsetenv(osr_env[i]);
  setenv("HOME", "/home/tester", 1);
  snprintf(tmpdir, sizeof(tmpdir), "/tmp/osr-cfg-XXXXXX");
  assert_non_null(mkdtemp(tmpdir));
  return 0;
}

static int teardown(void **state)
{
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
  assert_int_equal(system(cmd), 0);
  return 0;
}

static const char *write_file(const char *name, const char *text)
{
  static char path[512];
  snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  return path;
}

static int load(osr_gw_config_t *cfg, char *err, size_t errlen, ...)
{
  char *argv[32];
  int argc = 0;
  va_list ap;
  va_start(ap, errlen);
  for (const char *a = va_arg(ap, const char *); a != NULL && argc < 32;
       a = va_arg(ap, const char *))
    argv[argc++] = (char *)a;
  va_end(ap);
  return osr_gw_config_load(cfg, argc, argv, err, errlen);
}

static json_t *parse_ok(const char *y)
{
  char err[256];
  json_t *j = NULL;
  int rv = osr_gw_config_parse_yaml(y, strlen(y), &j, err, sizeof(err));
  if (rv != 0)
    fail_msg("parse failed: %s", err);
  return j;
}

static void parse_fails(const char *y, size_t len, const char *want)
{
  char err[256];
  json_t *j = NULL;
  assert_int_equal(osr_gw_config_parse_yaml(y, len, &j, err, sizeof(err)), OSR_EINVAL);
  assert_null(j);
  if (strstr(err, want) == NULL)
    fail_msg("error '%s' lacks '%s'", err, want);
}

/* ---- YAML reader ----------------------------------------------------------- */

static void yaml_scalar_types(void **state)
{
  (void)state;
  json_t *j = parse_ok("i: 42\nneg: -7\nhex: 0x1f\noct: 0o17\nf: 2.5\ne: 1e3\nt: true\nF: False\n"
                       "n: ~\nn2: null\nempty:\ns: hello\nq: \"123\"\nsq: 'true'\nstr: !!str 12\n"
                       "ver: 1.2.3\nlist: [1, two, 3.0]\n");
  assert_int_equal(json_integer_value(json_object_get(j, "i")), 42);
  assert_int_equal(json_integer_value(json_object_get(j, "neg")), -7);
  assert_int_equal(json_integer_value(json_object_get(j, "hex")), 31);
  assert_int_equal(json_integer_value(json_object_get(j, "oct")), 15);
  assert_true(json_is_real(json_object_get(j, "f")));
  assert_true(json_real_value(json_object_get(j, "e")) == 1000.0);
  assert_true(json_is_true(json_object_get(j, "t")));
  assert_true(json_is_false(json_object_get(j, "F")));
  assert_true(json_is_null(json_object_get(j, "n")));
  assert_true(json_is_null(json_object_get(j, "n2")));
  assert_true(json_is_null(json_object_get(j, "empty")));
  assert_string_equal(json_string_value(json_object_get(j, "s")), "hello");
  assert_string_equal(json_string_value(json_object_get(j, "q")), "123");
  assert_string_equal(json_string_value(json_object_get(j, "sq")), "true");
  assert_string_equal(json_string_value(json_object_get(j, "str")), "12");
  assert_string_equal(json_string_value(json_object_get(j, "ver")), "1.2.3");
  json_t *l = json_object_get(j, "list");
  assert_int_equal(json_array_size(l), 3);
  assert_string_equal(json_string_value(json_array_get(l, 1)), "two");
  json_decref(j);

  /* An empty document is null, not an error. */
  j = parse_ok("");
  assert_true(json_is_null(j));
  json_decref(j);
}

static void yaml_rejects(void **state)
{
  (void)state;
  parse_fails("a: &x 1\nb: *x\n", 14, "anchors");
  parse_fails("a: [1, 2\n", 9, "line ");
  parse_fails("a: 1\na: 2\n", 10, "a: duplicate key");
  parse_fails("a: 1\n---\nb: 2\n", 14, "only one YAML document");
  parse_fails("a: .inf\n", 8, "infinity");
  parse_fails("a: 99999999999999999999\n", 24, "out of range");
  parse_fails("a: !custom x\n", 13, "tag");
  parse_fails("? [1, 2]\n: x\n", 13, "mapping keys");
  /* Line numbers are 1-based and point at the problem. */
  parse_fails("ok: 1\nalso: 2\nbad: [\n", 21, "line 4");
}

static void yaml_alias_bomb(void **state)
{
  (void)state;
  const char *bomb =
      "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n"
      "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
      "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
      "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n";
  parse_fails(bomb, strlen(bomb), "not supported");
}

static void yaml_caps(void **state)
{
  (void)state;
  /* Depth: 32 levels are fine, 33 are not. */
  char deep[256];
  size_t n = 0;
  for (int i = 0; i < 31; i++)
    deep[n++] = '[';
  deep[n++] = '1';
  for (int i = 0; i < 31; i++)
    deep[n++] = ']';
  deep[n] = '\0';
  json_t *j = parse_ok(deep);
  json_decref(j);
  n = 0;
  for (int i = 0; i < 33; i++)
    deep[n++] = '[';
  deep[n++] = '1';
  for (int i = 0; i < 33; i++)
    deep[n++] = ']';
  parse_fails(deep, n, "deeper than 32");

  /* Nodes: a flat list of 10,001 items is over the cap. */
  size_t cap = 10001 * 3 + 8;
  char *big = osr_xmalloc(cap);
  n = 0;
  big[n++] = '[';
  for (int i = 0; i < 10001; i++) {
    big[n++] = '1';
    big[n++] = ',';
  }
  big[n - 1] = ']';
  parse_fails(big, n, "more than 10000 nodes");
  osr_free(big);

  /* Size: more than 1 MiB is refused before parsing. */
  size_t blen = 1024 * 1024 + 1;
  char *huge = osr_xmalloc(blen);
  memset(huge, '#', blen);
  parse_fails(huge, blen, "larger than");
  osr_free(huge);
}

/* ---- loading --------------------------------------------------------------- */

static void defaults(void **state)
{
  (void)state;
  osr_gw_config_t cfg;
  char err[512];
  assert_int_equal(load(&cfg, err, sizeof(err), NULL), 0);
  assert_int_equal(cfg.nlisten, 1);
  assert_string_equal(cfg.listen[0], "127.0.0.1:7070");
  assert_string_equal(cfg.dataplane_listen, "127.0.0.1:7071");
  assert_string_equal(cfg.dataplane_url, "http://127.0.0.1:7071");
  assert_string_equal(cfg.data_dir, "/home/tester/.local/share/osr");
  assert_string_equal(cfg.store_url, "sqlite:/home/tester/.local/share/osr/osr.db");
  assert_null(cfg.redis_url);
  assert_null(cfg.admin_key);
  assert_null(cfg.config_file);
  assert_int_equal(json_array_size(cfg.providers), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(cfg.providers, 0), "type")),
                      "sim");
  assert_int_equal(cfg.default_timeout_s, 300);
  assert_int_equal(cfg.max_timeout_s, 86400);
  assert_int_equal(cfg.token_ttl_s, 3600);
  assert_int_equal(cfg.breaker.window, 20);
  assert_int_equal(cfg.breaker.min_requests, 10);
  assert_int_equal(cfg.breaker.consecutive_failures, 5);
  assert_int_equal(cfg.breaker.open_ms, 5000);
  assert_int_equal(cfg.breaker.max_open_ms, 60000);
  assert_int_equal(cfg.breaker.half_open_probes, 1);
  assert_int_equal(cfg.reaper_interval_ms, 5000);
  assert_int_equal(osr_reaper_reconcile_ms(&cfg), 60000); /* 12 passes */
  assert_int_equal(cfg.drain_ms, 10000);
  assert_int_equal(cfg.max_request_body, 1024 * 1024);
  assert_int_equal(cfg.default_policy.strategy, OSR_STRATEGY_BALANCED);
  assert_int_equal(cfg.http_limits.max_headers, 100);
  osr_gw_config_dispose(&cfg);
}

static void file_values(void **state)
{
  (void)state;
  const char *f = write_file(
      "osr.yaml", "listen: [\"127.0.0.1:9000\", \"[::1]:9001\"]\n"
                  "dataplane: {listen: \"0.0.0.0:9100\", url: \"https://dp.example\"}\n"
                  "data_dir: /srv/osr\n"
                  "redis: redis://127.0.0.1:6379/2\n"
                  "providers:\n"
                  "  - {name: a, type: sim, latency_ms: 5}\n"
                  "  - {name: b, type: sim}\n"
                  "prices: {a: {vcpu_per_s: 0.00001, gpu_per_s: {a100: 0.001}}}\n"
                  "policy: {strategy: \"pin:a\", allow: [a], deny: [b], max_cost_per_hour: 2,\n"
                  "         on_provider_degraded: migrate}\n"
                  "sandbox: {default_timeout_seconds: 60, max_timeout_seconds: 600}\n"
                  "tokens: {ttl_seconds: 120}\n"
                  "breaker: {window: 50, min_requests: 5, failure_ratio: 0.25,\n"
                  "          consecutive_failures: 3, open_ms: 100, max_open_ms: 1000,\n"
                  "          half_open_probes: 2}\n"
                  "reaper: {interval_ms: 250, reconcile_interval_ms: 30000}\n"
                  "limits: {max_request_body: 4096, max_headers: 50}\n"
                  "drain_ms: 1500\n"
                  "log: {level: warn, json: false}\n");
  osr_gw_config_t cfg;
  char err[512];
  assert_int_equal(load(&cfg, err, sizeof(err), "--config", f, NULL), 0);
  assert_string_equal(cfg.config_file, f);
  assert_int_equal(cfg.nlisten, 2);
  assert_string_equal(cfg.listen[1], "[::1]:9001");
  assert_string_equal(cfg.dataplane_listen, "0.0.0.0:9100");
  assert_string_equal(cfg.dataplane_url, "https://dp.example");
  assert_string_equal(cfg.store_url, "sqlite:/srv/osr/osr.db"); /* derived from data_dir */
  assert_string_equal(cfg.redis_url, "redis://127.0.0.1:6379/2");
  assert_int_equal(json_array_size(cfg.providers), 2);
  assert_int_equal(
      json_integer_value(json_object_get(json_array_get(cfg.providers, 0), "latency_ms")), 5);
  assert_non_null(json_object_get(cfg.price_overrides, "a"));
  assert_int_equal(cfg.default_policy.strategy, OSR_STRATEGY_PIN);
  assert_string_equal(cfg.default_policy.pin, "a");
  assert_int_equal(cfg.default_policy.nallow, 1);
  assert_string_equal(cfg.default_policy.deny[0], "b");
  assert_true(cfg.default_policy.max_cost_per_hour == 2.0);
  assert_int_equal(cfg.default_policy.on_degraded_migrate, 1);
  assert_int_equal(cfg.default_timeout_s, 60);
  assert_int_equal(cfg.max_timeout_s, 600);
  assert_int_equal(cfg.token_ttl_s, 120);
  assert_int_equal(cfg.breaker.window, 50);
  assert_true(cfg.breaker.failure_ratio == 0.25);
  assert_int_equal(cfg.breaker.half_open_probes, 2);
  assert_int_equal(cfg.reaper_interval_ms, 250);
  assert_int_equal(osr_reaper_reconcile_ms(&cfg), 30000);
  assert_int_equal(cfg.max_request_body, 4096);
  assert_int_equal(cfg.http_limits.max_headers, 50);
  assert_int_equal(cfg.drain_ms, 1500);
  osr_gw_config_dispose(&cfg);
}

static void precedence(void **state)
{
  (void)state;
  const char *f = write_file("p.yaml", "listen: \"127.0.0.1:1001\"\nstore: \"sqlite:/file.db\"\n"
                                       "drain_ms: 1\nredis: redis://file:1\n");
  osr_gw_config_t cfg;
  char err[512];

  /* OSR_CONFIG picks the file; the file beats defaults. */
  setenv("OSR_CONFIG", f, 1);
  assert_int_equal(load(&cfg, err, sizeof(err), NULL), 0);
  assert_string_equal(cfg.listen[0], "127.0.0.1:1001");
  assert_string_equal(cfg.store_url, "sqlite:/file.db");
  assert_int_equal(cfg.drain_ms, 1);
  osr_gw_config_dispose(&cfg);

  /* The environment beats the file. */
  setenv("OSR_LISTEN", "127.0.0.1:2001, 127.0.0.1:2002", 1);
  setenv("OSR_STORE", "sqlite:/env.db", 1);
  setenv("OSR_REDIS", "none", 1);
  assert_int_equal(load(&cfg, err, sizeof(err), NULL), 0);
  assert_int_equal(cfg.nlisten, 2);
  assert_string_equal(cfg.listen[1], "127.0.0.1:2002");
  assert_string_equal(cfg.store_url, "sqlite:/env.db");
  assert_null(cfg.redis_url);
  osr_gw_config_dispose(&cfg);

  /* Flags beat the environment; repeated --listen accumulates. */
  assert_int_equal(load(&cfg, err, sizeof(err), "--listen", "127.0.0.1:3001",
                        "--listen=127.0.0.1:3002", "--store", "postgres://u@h/db", "--drain-ms",
                        "7", NULL),
                   0);
  assert_int_equal(cfg.nlisten, 2);
  assert_string_equal(cfg.listen[0], "127.0.0.1:3001");
  assert_string_equal(cfg.listen[1], "127.0.0.1:3002");
  assert_string_equal(cfg.store_url, "postgres://u@h/db");
  assert_int_equal(cfg.drain_ms, 7);
  osr_gw_config_dispose(&cfg);
}

static void providers_env(void **state)
{
  (void)state;
  osr_gw_config_t cfg;
  char err[512];
  setenv("OSR_PROVIDERS", "sim, sim,local", 1);
  assert_int_equal(load(&cfg, err, sizeof(err), NULL), 0);
  assert_int_equal(json_array_size(cfg.providers), 3);
  assert_string_equal(json_string_value(json_object_get(json_array_get(cfg.providers, 1), "name")),
                      "sim-2");
  assert_string_equal(json_string_value(json_object_get(json_array_get(cfg.providers, 2), "type")),
                      "local");
  osr_gw_config_dispose(&cfg);

  assert_int_equal(load(&cfg, err, sizeof(err), "--providers",
                        "[{\"name\":\"x\",\"type\":\"sim\",\"fail_rate\":0.5}]", NULL),
                   0);
  assert_int_equal(json_array_size(cfg.providers), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(cfg.providers, 0), "name")),
                      "x");
  osr_gw_config_dispose(&cfg);

  assert_int_equal(load(&cfg, err, sizeof(err), "--providers", "[{\"name\":\"x\"}]", NULL),
                   OSR_EINVAL);
  assert_non_null(strstr(err, "--providers"));
  assert_non_null(strstr(err, "type"));
}

static void secrets(void **state)
{
  (void)state;
  write_file("token.txt", "file-secret-42\n");
  const char *f = write_file("s.yaml", "admin_key: {env: T_SECRET}\n"
                                       "store: \"postgres://osr:pg-pass-9@db:5432/osr\"\n"
                                       "providers:\n"
                                       "  - name: e\n"
                                       "    type: e2b\n"
                                       "    api_key: {file: token.txt}\n"
                                       "    nested: {token: {env: T_SECRET}}\n"
                                       "    region: eu\n"
                                       "    inline_password: hunter2\n");
  setenv("T_SECRET", "env-secret-17", 1);
  osr_gw_config_t cfg;
  char err[512];
  assert_int_equal(load(&cfg, err, sizeof(err), "--config", f, NULL), 0);
  assert_string_equal(cfg.admin_key, "env-secret-17");
  json_t *p = json_array_get(cfg.providers, 0);
  assert_string_equal(json_string_value(json_object_get(p, "api_key")), "file-secret-42");
  assert_string_equal(json_string_value(json_object_get(json_object_get(p, "nested"), "token")),
                      "env-secret-17");

  json_t *red = osr_gw_config_to_json_redacted(&cfg);
  char *s = json_dumps(red, JSON_COMPACT);
  assert_non_null(s);
  assert_null(strstr(s, "env-secret-17"));
  assert_null(strstr(s, "file-secret-42"));
  assert_null(strstr(s, "pg-pass-9"));
  assert_null(strstr(s, "hunter2"));
  assert_non_null(strstr(s, "T_SECRET"));
  assert_non_null(strstr(s, "token.txt"));
  assert_non_null(strstr(s, "\"region\":\"eu\""));
  osr_json_free(s);
  json_decref(red);
  osr_gw_config_dispose(&cfg);

  /* A missing variable is an error naming the key. */
  unsetenv("T_SECRET");
  assert_int_equal(load(&cfg, err, sizeof(err), "--config", f, NULL), OSR_EINVAL);
  if (strstr(err, "admin_key") == NULL || strstr(err, "T_SECRET") == NULL)
    fail_msg("%s", err);

  /* The admin key inline is refused. */
  f = write_file("s2.yaml", "admin_key: plain\n");
  assert_int_equal(load(&cfg, err, sizeof(err), "--config", f, NULL), OSR_EINVAL);
  assert_non_null(strstr(err, "never the key itself"));

  /* Providers overridden by the environment need no credentials. */
  f = write_file("s3.yaml", "providers: [{name: e, type: e2b, api_key: {env: T_NOT_SET}}]\n");
  setenv("OSR_PROVIDERS", "sim", 1);
  assert_int_equal(load(&cfg, err, sizeof(err), "--config", f, NULL), 0);
  osr_gw_config_dispose(&cfg);
}

static void errors(void **state)
{
  (void)state;
  osr_gw_config_t cfg;
  char err[512], want[600];
  static const struct {
    const char *yaml, *want;
  } cases[] = {
      {"listen: [a]\nbreaker:\n  windw: 3\n", ":3: breaker.windw: unknown key"},
      {"drain_ms: soon\n", ":1: drain_ms: expected an integer, got a string"},
      {"log: {level: loud}\n", "log.level: 'loud' is not one of"},
      {"policy:\n  strategy: cheapest\n", ":2: policy.strategy"},
      {"providers:\n  - {name: a, type: sim}\n  - {name: a, type: sim}\n",
       ":3: providers[1].name: "
       "provider name 'a' is used twice"},
      {"providers:\n  - {name: a}\n", "providers[0]: a provider needs a type"},
      {"prices: {zzz: {vcpu_per_s: 1}}\n", "prices.zzz: no provider is named 'zzz'"},
      {"sandbox: {default_timeout_seconds: 10, max_timeout_seconds: 5}\n",
       "above max_timeout_seconds"},
      {"tls: {cert: a.pem}\n", "go together"},
      {"breaker: {window: 100000}\n", "breaker.window: 100000 is out of range"},
      {"reaper: {reconcile_interval_ms: 5}\n", "reaper.reconcile_interval_ms: 5 is out of range"},
      {"- 1\n- 2\n", "top level must be a mapping"},
      {"listen: [\n", "bad.yaml:2:"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    const char *f = write_file("bad.yaml", cases[i].yaml);
    assert_int_equal(load(&cfg, err, sizeof(err), "--config", f, NULL), OSR_EINVAL);
    snprintf(want, sizeof(want), "%s", cases[i].want);
    if (strstr(err, want) == NULL)
      fail_msg("case %zu: error '%s' lacks '%s'", i, err, want);
    /* Errors from the file name the file. */
    if (strstr(err, "bad.yaml") == NULL)
      fail_msg("case %zu: error '%s' does not name the file", i, err);
  }
  assert_int_equal(load(&cfg, err, sizeof(err), "--nope", NULL), OSR_EINVAL);
  assert_non_null(strstr(err, "--nope"));
  assert_int_equal(load(&cfg, err, sizeof(err), "--store", NULL), OSR_EINVAL);
  assert_non_null(strstr(err, "needs a value"));
  assert_int_equal(load(&cfg, err, sizeof(err), "--drain-ms", "-1", NULL), OSR_EINVAL);
  assert_int_equal(load(&cfg, err, sizeof(err), "--config", "/nonexistent/osr.yaml", NULL),
                   OSR_EINVAL);
  assert_non_null(strstr(err, "/nonexistent/osr.yaml"));
  setenv("OSR_LOG_JSON", "maybe", 1);
  assert_int_equal(load(&cfg, err, sizeof(err), NULL), OSR_EINVAL);
  assert_non_null(strstr(err, "OSR_LOG_JSON"));
  unsetenv("OSR_LOG_JSON");
  assert_int_equal(load(&cfg, err, sizeof(err), "--help", NULL), 1);
  osr_gw_config_dispose(&cfg);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(yaml_scalar_types, setup, teardown),
      cmocka_unit_test_setup_teardown(yaml_rejects, setup, teardown),
      cmocka_unit_test_setup_teardown(yaml_alias_bomb, setup, teardown),
      cmocka_unit_test_setup_teardown(yaml_caps, setup, teardown),
      cmocka_unit_test_setup_teardown(defaults, setup, teardown),
      cmocka_unit_test_setup_teardown(file_values, setup, teardown),
      cmocka_unit_test_setup_teardown(precedence, setup, teardown),
      cmocka_unit_test_setup_teardown(providers_env, setup, teardown),
      cmocka_unit_test_setup_teardown(secrets, setup, teardown),
      cmocka_unit_test_setup_teardown(errors, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
