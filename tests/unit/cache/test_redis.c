/*
 * Redis cache tests against a real redis-server that this test starts itself
 * (posix_spawn, loopback port and a unix socket in a temporary directory), so
 * it can also stop (SIGSTOP), kill and restart it mid-run.
 *
 * Covered: binding JSON round trip and rejection of malformed input
 * (hand-made cases plus every truncation and many byte flips), put/get/miss,
 * TTL, a corrupt cache entry, invalidation reaching two subscribers ("two
 * gateways") within a second, max_inflight, command timeout with a late
 * reply, the stall limit, Redis killed and restarted (fail fast, reconnect,
 * subscription restored), close with commands in flight (ECANCELED, then the
 * close callback), close from inside a callback, close while resolving,
 * unix sockets, URL parsing and a refused handshake.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "cache/redis.h"
#include "util/mem.h"

extern char **environ;

/* ---- the redis-server under test ------------------------------------------ */

static pid_t redis_pid = -1;
static int redis_port;
static char redis_dir[64];
static char redis_sock[128];
static char redis_url[64];
static char redis_unix_url[160];

static int free_port(void)
{
  struct sockaddr_in a;
  socklen_t len = sizeof(a);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

static int port_open(void)
{
  struct sockaddr_in a;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int ok;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)redis_port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
  close(fd);
  return ok;
}

static void redis_start(void)
{
  char port[16];
  char *argv[] = {"redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
                  "--appendonly", "no", "--unixsocket", redis_sock, "--unixsocketperm", "700",
                  "--dir", redis_dir, "--daemonize", "no", "--loglevel", "warning", NULL};
  posix_spawn_file_actions_t fa;
  snprintf(port, sizeof(port), "%d", redis_port);
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  assert_int_equal(posix_spawnp(&redis_pid, "redis-server", &fa, NULL, argv, environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  for (int i = 0; i < 400 && !port_open(); i++)
    usleep(25 * 1000);
  assert_true(port_open());
}

static void redis_kill(void)
{
  if (redis_pid > 0) {
    kill(redis_pid, SIGKILL);
    waitpid(redis_pid, NULL, 0);
  }
  redis_pid = -1;
}

static void redis_signal(int sig)
{
  assert_true(redis_pid > 0);
  assert_int_equal(kill(redis_pid, sig), 0);
}

/* Run redis-cli; returns its first output line without the newline. */
static void cli(char *out, size_t cap, const char *fmt, ...)
{
  char args[512], cmd[640];
  va_list ap;
  FILE *f;
  va_start(ap, fmt);
  vsnprintf(args, sizeof(args), fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof(cmd), "redis-cli -p %d %s", redis_port, args);
  f = popen(cmd, "r");
  assert_non_null(f);
  out[0] = '\0';
  if (fgets(out, (int)cap, f) != NULL)
    out[strcspn(out, "\r\n")] = '\0';
  pclose(f);
}

static long cli_int(const char *fmt, const char *arg)
{
  char out[256];
  cli(out, sizeof(out), fmt, arg);
  return strtol(out, NULL, 10);
}

static int group_setup(void **state)
{
  (void)state;
  snprintf(redis_dir, sizeof(redis_dir), "/tmp/osr-redis-test-XXXXXX");
  assert_non_null(mkdtemp(redis_dir));
  snprintf(redis_sock, sizeof(redis_sock), "%s/redis.sock", redis_dir);
  redis_port = free_port();
  snprintf(redis_url, sizeof(redis_url), "redis://127.0.0.1:%d", redis_port);
  snprintf(redis_unix_url, sizeof(redis_unix_url), "unix:%s", redis_sock);
  redis_start();
  return 0;
}

static int group_teardown(void **state)
{
  char cmd[128];
  (void)state;
  redis_kill();
  snprintf(cmd, sizeof(cmd), "rm -rf %s", redis_dir);
  if (system(cmd) != 0)
    return -1;
  return 0;
}

/* Every test starts with a running, responsive, empty server. */
static void redis_fresh(void)
{
  char out[64];
  if (redis_pid <= 0)
    redis_start();
  cli(out, sizeof(out), "FLUSHALL");
  assert_string_equal(out, "OK");
}

/* ---- loop helpers ------------------------------------------------------------ */

static uv_loop_t loop;

static void tick_cb(uv_timer_t *t) { (void)t; }

/* Run the loop until *flag or `ms` passed (a ticker keeps the loop awake). */
static int run_until(volatile int *flag, uint64_t ms)
{
  uv_timer_t tick;
  uint64_t end;
  uv_timer_init(&loop, &tick);
  uv_timer_start(&tick, tick_cb, 5, 5);
  uv_update_time(&loop);
  end = uv_now(&loop) + ms;
  while (!*flag && uv_now(&loop) < end)
    uv_run(&loop, UV_RUN_ONCE);
  uv_close((uv_handle_t *)&tick, NULL);
  uv_run(&loop, UV_RUN_NOWAIT);
  return *flag;
}

static void run_for(uint64_t ms)
{
  int never = 0;
  run_until(&never, ms);
}

static int connected_flag(osr_redis_t *r)
{
  for (int i = 0; i < 2000 && !osr_redis_is_connected(r); i++)
    run_for(5);
  return osr_redis_is_connected(r);
}

static osr_redis_t *client(const char *url, uint64_t cmd_timeout_ms, size_t max_inflight)
{
  osr_redis_opts_t o;
  osr_redis_t *r = NULL;
  memset(&o, 0, sizeof(o));
  o.url = url;
  o.command_timeout_ms = cmd_timeout_ms;
  o.max_inflight = max_inflight;
  o.connect_timeout_ms = 500;
  assert_int_equal(osr_redis_new(&loop, &o, &r), 0);
  assert_non_null(r);
  return r;
}

static void closed_cb(void *data) { (*(int *)data)++; }

static void client_close(osr_redis_t *r)
{
  int closed = 0;
  osr_redis_close(r, closed_cb, &closed);
  assert_true(run_until(&closed, 10000));
  assert_int_equal(closed, 1);
}

static void loop_start(void) { assert_int_equal(uv_loop_init(&loop), 0); }

static void loop_finish(void)
{
  /* Everything (hiredis's poll handles included) must be closed. */
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* ---- bindings ------------------------------------------------------------------ */

static void fill(osr_binding_t *b, const char *id)
{
  memset(b, 0, sizeof(*b));
  snprintf(b->id, sizeof(b->id), "%s", id);
  snprintf(b->tenant, sizeof(b->tenant), "tenant-a");
  snprintf(b->idem_key, sizeof(b->idem_key), "key \"with\" quotes \\ and ünicode");
  memset(b->request_hash, 'f', 64);
  snprintf(b->template_id, sizeof(b->template_id), "python:3.12");
  snprintf(b->provider, sizeof(b->provider), "sim-eu");
  snprintf(b->provider_id, sizeof(b->provider_id), "prov-123/abc");
  snprintf(b->region, sizeof(b->region), "eu-west-1");
  b->isolation = OSR_ISO_GVISOR;
  snprintf(b->agent_endpoint, sizeof(b->agent_endpoint), "https://10.0.0.7:49983");
  b->state = OSR_BINDING_PAUSED;
  b->attempt = 3;
  b->created_ms = 1700000000001;
  b->updated_ms = 1700000000002;
  b->expires_ms = 1700000003600;
  b->idle_timeout_ms = 600000;
  b->last_activity_ms = 1700000000500;
  b->ended_ms = 1700000009999;
  snprintf(b->end_reason, sizeof(b->end_reason), "failed: boot");
  b->request_json = osr_xstrdup("{\"template\":\"python:3.12\",\"env\":{\"A\":\"1\"}}");
  b->granted_json = osr_xstrdup("{\"vcpus\":2,\"gpu\":{\"count\":1}}");
  b->metadata_json = osr_xstrdup("{\"user\":\"x\\n\"}");
  b->error_json = osr_xstrdup("[{\"provider\":\"a\",\"reason\":\"capacity\"}]");
}

static void dispose(osr_binding_t *b)
{
  osr_freep(&b->request_json);
  osr_freep(&b->granted_json);
  osr_freep(&b->metadata_json);
  osr_freep(&b->error_json);
}

static void assert_doc_equal(const char *a, const char *b)
{
  if (a == NULL || b == NULL)
    assert_ptr_equal(a, b);
  else
    assert_string_equal(a, b);
}

static void assert_binding_equal(const osr_binding_t *a, const osr_binding_t *b)
{
  assert_string_equal(a->id, b->id);
  assert_string_equal(a->tenant, b->tenant);
  assert_string_equal(a->idem_key, b->idem_key);
  assert_string_equal(a->request_hash, b->request_hash);
  assert_string_equal(a->template_id, b->template_id);
  assert_string_equal(a->provider, b->provider);
  assert_string_equal(a->provider_id, b->provider_id);
  assert_string_equal(a->region, b->region);
  assert_int_equal(a->isolation, b->isolation);
  assert_string_equal(a->agent_endpoint, b->agent_endpoint);
  assert_int_equal(a->state, b->state);
  assert_int_equal(a->attempt, b->attempt);
  assert_int_equal(a->created_ms, b->created_ms);
  assert_int_equal(a->updated_ms, b->updated_ms);
  assert_int_equal(a->expires_ms, b->expires_ms);
  assert_int_equal(a->idle_timeout_ms, b->idle_timeout_ms);
  assert_int_equal(a->last_activity_ms, b->last_activity_ms);
  assert_int_equal(a->ended_ms, b->ended_ms);
  assert_string_equal(a->end_reason, b->end_reason);
  assert_doc_equal(a->request_json, b->request_json);
  assert_doc_equal(a->granted_json, b->granted_json);
  assert_doc_equal(a->metadata_json, b->metadata_json);
  assert_doc_equal(a->error_json, b->error_json);
}

static void test_json_roundtrip(void **state)
{
  osr_binding_t a, b;
  char *js = NULL;
  (void)state;

  fill(&a, "abcdefghij0123456789");
  assert_int_equal(osr_binding_to_json(&a, &js), 0);
  assert_int_equal(osr_binding_from_json(js, strlen(js), &b), 0);
  assert_binding_equal(&a, &b);
  dispose(&b);
  osr_freep(&js);

  /* NULL documents stay NULL; every enum value survives. */
  osr_freep(&a.request_json);
  osr_freep(&a.error_json);
  for (int st = OSR_BINDING_CREATING; st <= OSR_BINDING_LOST; st++) {
    for (int iso = OSR_ISO_NONE; iso <= OSR_ISO_FIRECRACKER; iso++) {
      a.state = (osr_binding_state_t)st;
      a.isolation = (osr_isolation_t)iso;
      assert_int_equal(osr_binding_to_json(&a, &js), 0);
      assert_int_equal(osr_binding_from_json(js, strlen(js), &b), 0);
      assert_binding_equal(&a, &b);
      dispose(&b);
      osr_freep(&js);
    }
  }

  /* What to_json refuses to write. */
  a.state = (osr_binding_state_t)0;
  assert_int_equal(osr_binding_to_json(&a, &js), OSR_EINVAL);
  a.state = OSR_BINDING_RUNNING;
  a.isolation = (osr_isolation_t)9;
  assert_int_equal(osr_binding_to_json(&a, &js), OSR_EINVAL);
  a.isolation = OSR_ISO_CONTAINER;
  memset(a.tenant, 'x', sizeof(a.tenant)); /* not terminated */
  assert_int_equal(osr_binding_to_json(&a, &js), OSR_EINVAL);
  snprintf(a.tenant, sizeof(a.tenant), "bad\xff utf8");
  assert_int_equal(osr_binding_to_json(&a, &js), OSR_EINVAL);
  snprintf(a.tenant, sizeof(a.tenant), "t");
  snprintf(a.id, sizeof(a.id), "Upper");
  assert_int_equal(osr_binding_to_json(&a, &js), OSR_EINVAL);
  snprintf(a.id, sizeof(a.id), "abc");
  osr_free(a.granted_json);
  a.granted_json = osr_xmalloc(OSR_BINDING_DOC_MAX + 2);
  memset(a.granted_json, 'g', OSR_BINDING_DOC_MAX + 1);
  a.granted_json[OSR_BINDING_DOC_MAX + 1] = '\0';
  assert_int_equal(osr_binding_to_json(&a, &js), OSR_ETOOLARGE);
  assert_null(js);
  dispose(&a);
}

/* Allocation failures (STYLE 25): every osr_try_ allocation in the codec
 * fails cleanly, with nothing leaked (ASan) and nothing owned. */
static void test_json_alloc_failure(void **state)
{
  osr_binding_t a, b;
  char *js = NULL, *js2 = NULL;
  (void)state;
  fill(&a, "allocfail");
  assert_int_equal(osr_binding_to_json(&a, &js), 0);
  for (unsigned long n = 1; n <= 4; n++) {
    osr_mem_fail_after(n);
    memset(&b, 0x5a, sizeof(b));
    assert_int_equal(osr_binding_from_json(js, strlen(js), &b), OSR_ENOMEM);
    assert_null(b.request_json);
    assert_null(b.granted_json);
    assert_null(b.metadata_json);
    assert_null(b.error_json);
  }
  osr_mem_fail_after(5); /* four documents: the fifth allocation never happens */
  assert_int_equal(osr_binding_from_json(js, strlen(js), &b), 0);
  osr_mem_fail_after(0);
  dispose(&b);
  osr_mem_fail_after(1);
  assert_int_equal(osr_binding_to_json(&a, &js2), OSR_ENOMEM);
  assert_null(js2);
  osr_mem_fail_after(0);
  osr_free(js);
  dispose(&a);
}

/* Valid JSON of a full binding with member `key` replaced by `val` (a JSON
 * text; NULL deletes the member). */
static char *mutated(const char *key, const char *val)
{
  osr_binding_t a;
  char *js = NULL, *res;
  json_t *o;
  fill(&a, "abc");
  assert_int_equal(osr_binding_to_json(&a, &js), 0);
  dispose(&a);
  o = json_loads(js, 0, NULL);
  assert_non_null(o);
  osr_free(js);
  if (val == NULL) {
    assert_int_equal(json_object_del(o, key), 0);
  } else {
    json_t *v = json_loads(val, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    assert_non_null(v);
    json_object_set_new(o, key, v);
  }
  res = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  assert_non_null(res);
  return res;
}

static void expect_rejected(const char *js, size_t len)
{
  osr_binding_t b;
  memset(&b, 0x5a, sizeof(b));
  assert_int_equal(osr_binding_from_json(js, len, &b), OSR_EINVAL);
  /* On failure `b` owns nothing. */
  assert_null(b.request_json);
  assert_null(b.granted_json);
  assert_null(b.metadata_json);
  assert_null(b.error_json);
}

static void test_json_malformed(void **state)
{
  static const char *const raw[] = {
    "", "{", "[]", "null", "{}", "\"x\"", "{\"v\":1}", "{\"v\":1,}",
  };
  static const struct {
    const char *key, *val;
  } bad[] = {
    {"v", "2"}, {"v", "\"1\""}, {"v", NULL}, {"id", "7"}, {"id", "\"\""}, {"id", "\"Abc\""},
    {"id", "\"a b\""}, {"id", "\"*\""}, {"id", "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\""},
    {"id", NULL}, {"tenant", NULL}, {"tenant", "null"}, {"tenant", "[\"a\"]"},
    {"tenant", "\"a\\u0000b\""},
    {"tenant", "\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\""}, /* 64 */
    {"request_hash", "\"ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff0\""},
    {"state", "\"zombie\""}, {"state", "2"}, {"state", NULL}, {"isolation", "\"kvm\""},
    {"isolation", "3"}, {"attempt", "-1"}, {"attempt", "1.5"}, {"attempt", "10000000"},
    {"attempt", "\"1\""}, {"created_ms", "-5"}, {"created_ms", "1e3"}, {"created_ms", "true"},
    {"ended_ms", NULL}, {"request", "{\"a\":1}"}, {"granted", "5"}, {"metadata", "[]"},
    {"error", "false"}, {"error", NULL}, {"end_reason", NULL},
  };
  char *js;
  size_t n;
  osr_binding_t b;
  unsigned ok = 0, rejected = 0;
  (void)state;

  for (size_t i = 0; i < OSR_ARRAY_SIZE(raw); i++)
    expect_rejected(raw[i], strlen(raw[i]));
  expect_rejected(NULL, 0);
  for (size_t i = 0; i < OSR_ARRAY_SIZE(bad); i++) {
    js = mutated(bad[i].key, bad[i].val);
    expect_rejected(js, strlen(js));
    osr_json_free(js);
  }

  /* Unknown members are fine; duplicates, trailing garbage, NUL are not. */
  js = mutated("future_field", "{\"x\":[1,2]}");
  assert_int_equal(osr_binding_from_json(js, strlen(js), &b), 0);
  dispose(&b);
  n = strlen(js);
  {
    char *dup = osr_xmalloc(n + 32);
    memcpy(dup, js, n - 1);
    memcpy(dup + n - 1, ",\"v\":1}", 8);
    expect_rejected(dup, strlen(dup));
    memcpy(dup, js, n);
    memcpy(dup + n, " x", 3);
    expect_rejected(dup, n + 2);
    memcpy(dup, js, n);
    dup[n] = '\0';
    expect_rejected(dup, n + 1); /* a NUL inside the given length */
    osr_free(dup);
  }

  /* Oversize: one document past its cap, and an input past the total cap. */
  {
    size_t big = OSR_BINDING_DOC_MAX + 1;
    char *val = osr_xmalloc(big + 3);
    val[0] = '"';
    memset(val + 1, 'a', big);
    val[big + 1] = '"';
    val[big + 2] = '\0';
    char *o = mutated("request", val);
    expect_rejected(o, strlen(o));
    osr_json_free(o);
    osr_free(val);
    char *huge = osr_xmalloc(OSR_BINDING_JSON_MAX + 1);
    memset(huge, ' ', OSR_BINDING_JSON_MAX + 1);
    memcpy(huge, js, n);
    expect_rejected(huge, OSR_BINDING_JSON_MAX + 1);
    osr_free(huge);
  }

  /* Every proper prefix is invalid JSON. */
  for (size_t len = 0; len < n; len++)
    expect_rejected(js, len);

  /* Byte flips: never a crash or leak (ASan), each result either a complete
   * binding or a clean rejection. */
  {
    static const char subst[] = {'"', '\\', '{', '}', '[', ']', ',', ':', '0', '-', 'a', ' ',
                                 '\0', '\x80', '\xff', 'e', '.'};
    char *m = osr_xmalloc(n);
    for (size_t i = 0; i < n; i++) {
      for (size_t k = 0; k < sizeof(subst); k++) {
        memcpy(m, js, n);
        if (m[i] == subst[k])
          continue;
        m[i] = subst[k];
        int rv = osr_binding_from_json(m, n, &b);
        if (rv == 0) {
          ok++;
          dispose(&b);
        } else {
          assert_int_equal(rv, OSR_EINVAL);
          assert_null(b.request_json);
          rejected++;
        }
      }
    }
    osr_free(m);
  }
  /* Flips inside string values still parse; structural ones do not. */
  assert_true(ok > 0);
  assert_true(rejected > 0);
  osr_json_free(js);
}

/* ---- commands ------------------------------------------------------------------- */

typedef struct result_s {
  int fired;
  int status;
  int order;
  osr_binding_t b;
} result_t;

static int order_seq;

static void done_cb(int status, void *data)
{
  result_t *res = data;
  res->fired++;
  res->status = status;
  res->order = ++order_seq;
}

static void binding_cb(int status, const osr_binding_t *b, void *data)
{
  result_t *res = data;
  res->fired++;
  res->status = status;
  res->order = ++order_seq;
  if (status == 0) {
    assert_non_null(b);
    res->b = *b;
    res->b.request_json = b->request_json ? osr_xstrdup(b->request_json) : NULL;
    res->b.granted_json = b->granted_json ? osr_xstrdup(b->granted_json) : NULL;
    res->b.metadata_json = b->metadata_json ? osr_xstrdup(b->metadata_json) : NULL;
    res->b.error_json = b->error_json ? osr_xstrdup(b->error_json) : NULL;
  } else {
    assert_null(b);
  }
}

static int do_put(osr_redis_t *r, const osr_binding_t *b)
{
  result_t res = {0};
  int rv = osr_redis_put_binding(r, b, done_cb, &res);
  if (rv != 0)
    return rv;
  assert_true(run_until(&res.fired, 5000));
  return res.status;
}

/* status of a GET; on 0 the binding is copied to *out (caller disposes). */
static int do_get(osr_redis_t *r, const char *id, osr_binding_t *out)
{
  result_t res = {0};
  int rv = osr_redis_get_binding(r, id, binding_cb, &res);
  if (rv != 0)
    return rv;
  assert_true(run_until(&res.fired, 5000));
  assert_int_equal(res.fired, 1);
  if (res.status == 0) {
    if (out != NULL)
      *out = res.b;
    else
      dispose(&res.b);
  }
  return res.status;
}

static int do_invalidate(osr_redis_t *r, const char *id)
{
  result_t res = {0};
  int rv = osr_redis_invalidate(r, id, done_cb, &res);
  if (rv != 0)
    return rv;
  assert_true(run_until(&res.fired, 5000));
  return res.status;
}

static void test_put_get(void **state)
{
  osr_binding_t a, got;
  osr_redis_t *r;
  char out[64];
  long pttl;
  (void)state;

  redis_fresh();
  loop_start();
  r = client(redis_url, 2000, 0);
  assert_true(connected_flag(r));

  fill(&a, "abcdefghij0123456789");
  assert_int_equal(do_put(r, &a), 0);
  assert_true(osr_redis_last_latency_us(r) > 0);
  assert_int_equal(do_get(r, a.id, &got), 0);
  assert_binding_equal(&a, &got);
  dispose(&got);

  /* Stored under <prefix>b:<id> with the default 300 s TTL. */
  pttl = cli_int("PTTL osr:b:%s", a.id);
  assert_true(pttl > 290000 && pttl <= 300000);

  assert_int_equal(do_get(r, "nosuchid", NULL), OSR_ENOTFOUND);

  /* A corrupt entry is reported, never half-parsed. */
  cli(out, sizeof(out), "SET osr:b:corrupt '{\"v\":1,\"id\":\"corrupt\"}'");
  assert_string_equal(out, "OK");
  assert_int_equal(do_get(r, "corrupt", NULL), OSR_EPROTO);
  cli(out, sizeof(out), "RPUSH osr:b:list x");
  assert_int_equal(do_get(r, "list", NULL), OSR_EUNAVAILABLE); /* WRONGTYPE */

  /* Argument checks. */
  assert_int_equal(osr_redis_get_binding(r, "Bad Id", binding_cb, NULL), OSR_EINVAL);
  assert_int_equal(osr_redis_get_binding(r, "*", binding_cb, NULL), OSR_EINVAL);
  assert_int_equal(osr_redis_invalidate(r, "a/b", done_cb, NULL), OSR_EINVAL);
  a.state = (osr_binding_state_t)77;
  assert_int_equal(osr_redis_put_binding(r, &a, done_cb, NULL), OSR_EINVAL);
  dispose(&a);

  client_close(r);
  loop_finish();
}

static void test_prefix_ttl_unix(void **state)
{
  osr_redis_opts_t o;
  osr_redis_t *r = NULL;
  osr_binding_t a;
  long pttl;
  (void)state;

  redis_fresh();
  loop_start();
  memset(&o, 0, sizeof(o));
  o.url = redis_unix_url;
  o.prefix = "t1:";
  o.binding_ttl_ms = 5000;
  assert_int_equal(osr_redis_new(&loop, &o, &r), 0);
  assert_true(connected_flag(r));
  fill(&a, "unixid");
  assert_int_equal(do_put(r, &a), 0);
  pttl = cli_int("PTTL t1:b:%s", "unixid");
  assert_true(pttl > 0 && pttl <= 5000);
  assert_int_equal(do_get(r, "unixid", NULL), 0);
  dispose(&a);
  client_close(r);
  loop_finish();
}

/* ---- invalidation ------------------------------------------------------------------ */

typedef struct sub_s {
  int count;
  char last[OSR_REDIS_ID_MAX + 1];
  char seen[16][OSR_REDIS_ID_MAX + 1];
} sub_t;

static void on_invalidate(const char *id, void *data)
{
  sub_t *s = data;
  assert_true(strlen(id) <= OSR_REDIS_ID_MAX);
  if (s->count < 16)
    snprintf(s->seen[s->count], sizeof(s->seen[0]), "%s", id);
  snprintf(s->last, sizeof(s->last), "%s", id);
  s->count++;
}

static void wait_numsub(long want)
{
  for (int i = 0; i < 200; i++) {
    char out[128];
    /* NUMSUB answers "channel\ncount": read the second line via awk-free tail */
    FILE *f;
    char cmd[256];
    long n = -1;
    snprintf(cmd, sizeof(cmd), "redis-cli -p %d PUBSUB NUMSUB osr:invalidate | tail -n 1",
             redis_port);
    f = popen(cmd, "r");
    assert_non_null(f);
    if (fgets(out, sizeof(out), f) != NULL)
      n = strtol(out, NULL, 10);
    pclose(f);
    if (n == want)
      return;
    run_for(25);
  }
  fail_msg("subscriber count never reached %ld", want);
}

static void test_invalidate(void **state)
{
  osr_redis_t *a, *b;
  sub_t sa, sb;
  osr_binding_t x;
  char out[64];
  uint64_t t0;
  (void)state;

  memset(&sa, 0, sizeof(sa));
  memset(&sb, 0, sizeof(sb));
  redis_fresh();
  loop_start();
  a = client(redis_url, 2000, 0);
  b = client(redis_url, 2000, 0); /* another gateway */
  assert_int_equal(osr_redis_subscribe(a, on_invalidate, &sa), 0);
  assert_int_equal(osr_redis_subscribe(a, on_invalidate, &sa), OSR_EBUSY);
  assert_int_equal(osr_redis_subscribe(b, on_invalidate, &sb), 0);
  assert_true(connected_flag(a));
  assert_true(connected_flag(b));
  wait_numsub(2);

  fill(&x, "sbx1");
  assert_int_equal(do_put(a, &x), 0);
  assert_int_equal(cli_int("EXISTS osr:b:%s", "sbx1"), 1);
  uv_update_time(&loop);
  t0 = uv_now(&loop);
  assert_int_equal(do_invalidate(a, "sbx1"), 0);
  /* Both subscribers within a second of the call. */
  {
    int both = 0;
    for (int i = 0; i < 1000 && !both; i++) {
      run_for(2);
      both = sa.count >= 1 && sb.count >= 1;
      if (uv_now(&loop) - t0 > 1000)
        break;
    }
    assert_true(both);
  }
  assert_string_equal(sa.seen[0], "sbx1");
  assert_string_equal(sb.seen[0], "sbx1");
  assert_int_equal(cli_int("EXISTS osr:b:%s", "sbx1"), 0);
  assert_int_equal(do_get(b, "sbx1", NULL), OSR_ENOTFOUND);

  /* Garbage on the channel is dropped; what follows still arrives. */
  cli(out, sizeof(out), "PUBLISH osr:invalidate 'BAD ID!'");
  cli(out, sizeof(out), "PUBLISH osr:invalidate %s",
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"); /* 65 */
  cli(out, sizeof(out), "PUBLISH other:invalidate zzz");
  assert_int_equal(do_invalidate(b, "*"), 0);
  for (int i = 0; i < 200 && (sa.count < 2 || sb.count < 2); i++)
    run_for(5);
  assert_int_equal(sa.count, 2);
  assert_int_equal(sb.count, 2);
  assert_string_equal(sa.last, "*");
  assert_string_equal(sb.last, "*");

  dispose(&x);
  client_close(a);
  client_close(b);
  loop_finish();
}

/* ---- limits and failures ----------------------------------------------------------- */

static void test_max_inflight(void **state)
{
  osr_redis_t *r;
  result_t res[3];
  result_t extra = {0};
  (void)state;

  memset(res, 0, sizeof(res));
  redis_fresh();
  loop_start();
  r = client(redis_url, 5000, 3);
  assert_true(connected_flag(r));
  for (int i = 0; i < 3; i++)
    assert_int_equal(osr_redis_get_binding(r, "k", binding_cb, &res[i]), 0);
  assert_int_equal(osr_redis_get_binding(r, "k", binding_cb, &extra), OSR_EAGAIN);
  assert_int_equal(osr_redis_invalidate(r, "k", done_cb, &extra), OSR_EAGAIN);
  for (int i = 0; i < 3; i++) {
    assert_true(run_until(&res[i].fired, 5000));
    assert_int_equal(res[i].status, OSR_ENOTFOUND);
  }
  assert_int_equal(extra.fired, 0);
  /* Room again once the replies came back. */
  assert_int_equal(do_get(r, "k", NULL), OSR_ENOTFOUND);
  client_close(r);
  loop_finish();
}

/* Replies above the caps cost the connection, not the process's memory:
 * hiredis 0.14 would buffer a bulk string of any size. */
static void test_reply_caps(void **state)
{
  osr_redis_t *r;
  char out[64];
  (void)state;

  redis_fresh();
  loop_start();
  r = client(redis_url, 3000, 0);
  assert_true(connected_flag(r));
  /* Past the buffered-bytes cap (checked after every read). */
  cli(out, sizeof(out), "EVAL \"return redis.call('SET', KEYS[1], string.rep('a', 6000000))\" 1 osr:b:big");
  assert_string_equal(out, "OK");
  assert_int_equal(do_get(r, "big", NULL), OSR_EUNAVAILABLE);
  assert_true(connected_flag(r));
  assert_int_equal(do_get(r, "small", NULL), OSR_ENOTFOUND);
  /* Just past OSR_BINDING_JSON_MAX: refused by the reader's string hook. */
  cli(out, sizeof(out), "EVAL \"return redis.call('SET', KEYS[1], string.rep('a', %u))\" 1 osr:b:big2",
      OSR_BINDING_JSON_MAX + 1);
  assert_string_equal(out, "OK");
  assert_int_equal(do_get(r, "big2", NULL), OSR_EUNAVAILABLE);
  assert_true(connected_flag(r));
  /* Large but allowed: read whole, then rejected as not a binding. */
  cli(out, sizeof(out), "EVAL \"return redis.call('SET', KEYS[1], string.rep('a', 1000000))\" 1 osr:b:big3");
  assert_int_equal(do_get(r, "big3", NULL), OSR_EPROTO);
  client_close(r);
  loop_finish();
}

static void test_command_timeout(void **state)
{
  osr_redis_t *r;
  result_t res = {0}, res2 = {0};
  osr_binding_t a;
  int rv = -1;
  (void)state;

  redis_fresh();
  loop_start();
  r = client(redis_url, 300, 0);
  assert_true(connected_flag(r));
  fill(&a, "slow");

  /* Server frozen: the caller hears ETIMEDOUT long before the stall limit. */
  redis_signal(SIGSTOP);
  assert_int_equal(osr_redis_get_binding(r, "slow", binding_cb, &res), 0);
  assert_int_equal(osr_redis_put_binding(r, &a, done_cb, &res2), 0);
  assert_true(run_until(&res2.fired, 1500));
  assert_int_equal(res.status, OSR_ETIMEDOUT);
  assert_int_equal(res2.status, OSR_ETIMEDOUT);
  /* Thawed quickly: the late replies are dropped, the connection is kept. */
  redis_signal(SIGCONT);
  run_for(200);
  assert_int_equal(res.fired, 1);
  assert_int_equal(res2.fired, 1);
  assert_true(osr_redis_is_connected(r));
  assert_int_equal(do_get(r, "slow", NULL), 0); /* the late SET did land */

  /* Frozen past the stall limit (max(4 x 300, 2000) ms): the connection is
   * given up and rebuilt once the server is back. */
  memset(&res, 0, sizeof(res));
  redis_signal(SIGSTOP);
  assert_int_equal(osr_redis_get_binding(r, "slow", binding_cb, &res), 0);
  assert_true(run_until(&res.fired, 1500));
  assert_int_equal(res.status, OSR_ETIMEDOUT);
  for (int i = 0; i < 800 && osr_redis_is_connected(r); i++)
    run_for(5);
  assert_false(osr_redis_is_connected(r));
  assert_int_equal(osr_redis_get_binding(r, "slow", binding_cb, &res), OSR_EUNAVAILABLE);
  redis_signal(SIGCONT);
  assert_true(connected_flag(r));
  for (int i = 0; i < 50 && rv != 0; i++) {
    rv = do_get(r, "slow", NULL);
    if (rv != 0)
      run_for(100);
  }
  assert_int_equal(rv, 0);
  dispose(&a);
  client_close(r);
  loop_finish();
}

static void test_redis_restart(void **state)
{
  osr_redis_t *r;
  sub_t s;
  result_t res = {0};
  osr_binding_t a;
  (void)state;

  memset(&s, 0, sizeof(s));
  redis_fresh();
  loop_start();
  r = client(redis_url, 3000, 0);
  assert_int_equal(osr_redis_subscribe(r, on_invalidate, &s), 0);
  assert_true(connected_flag(r));
  wait_numsub(1);
  fill(&a, "restart1");

  /* A command in flight when the server dies fails, it does not hang. */
  redis_signal(SIGSTOP);
  assert_int_equal(osr_redis_get_binding(r, "restart1", binding_cb, &res), 0);
  run_for(50);
  redis_kill();
  assert_true(run_until(&res.fired, 2000));
  assert_int_equal(res.status, OSR_EUNAVAILABLE);

  /* Down: every call fails at once, no callback. */
  for (int i = 0; i < 400 && osr_redis_is_connected(r); i++)
    run_for(5);
  assert_false(osr_redis_is_connected(r));
  assert_int_equal(osr_redis_put_binding(r, &a, done_cb, &res), OSR_EUNAVAILABLE);
  assert_int_equal(osr_redis_get_binding(r, "restart1", binding_cb, &res), OSR_EUNAVAILABLE);
  assert_int_equal(osr_redis_invalidate(r, "restart1", done_cb, &res), OSR_EUNAVAILABLE);
  run_for(700); /* a few reconnect attempts against a closed port */
  assert_int_equal(res.fired, 1);

  /* Back: reconnects on its own, works, and the subscription is restored
   * (announced with "*", since messages may have been missed). */
  redis_start();
  assert_true(connected_flag(r));
  assert_int_equal(do_put(r, &a), 0);
  assert_int_equal(do_get(r, "restart1", NULL), 0);
  wait_numsub(1);
  for (int i = 0; i < 400 && s.count < 1; i++)
    run_for(5);
  assert_int_equal(s.count, 1);
  assert_string_equal(s.last, "*");
  assert_int_equal(do_invalidate(r, "restart1"), 0);
  for (int i = 0; i < 400 && s.count < 2; i++)
    run_for(5);
  assert_int_equal(s.count, 2);
  assert_string_equal(s.last, "restart1");
  dispose(&a);
  client_close(r);
  loop_finish();
}

static void test_close_inflight(void **state)
{
  osr_redis_t *r;
  result_t res[7];
  osr_binding_t a;
  sub_t s;
  int closed = 0, closed_order;
  (void)state;

  memset(res, 0, sizeof(res));
  memset(&s, 0, sizeof(s));
  redis_fresh();
  loop_start();
  r = client(redis_url, 5000, 0);
  assert_int_equal(osr_redis_subscribe(r, on_invalidate, &s), 0);
  assert_true(connected_flag(r));
  fill(&a, "closing");
  redis_signal(SIGSTOP);
  for (int i = 0; i < 5; i++)
    assert_int_equal(osr_redis_get_binding(r, "closing", binding_cb, &res[i]), 0);
  assert_int_equal(osr_redis_put_binding(r, &a, done_cb, &res[5]), 0);
  assert_int_equal(osr_redis_invalidate(r, "closing", done_cb, &res[6]), 0);
  run_for(20);
  order_seq = 0;
  osr_redis_close(r, closed_cb, &closed);
  /* Every caller answered with ECANCELED, before the close callback. */
  for (int i = 0; i < 7; i++) {
    assert_int_equal(res[i].fired, 1);
    assert_int_equal(res[i].status, OSR_ECANCELED);
  }
  assert_true(run_until(&closed, 5000));
  closed_order = ++order_seq;
  for (int i = 0; i < 7; i++)
    assert_true(res[i].order < closed_order);
  redis_signal(SIGCONT);
  dispose(&a);
  loop_finish();
  assert_int_equal(s.count, 0);
}

static osr_redis_t *reentrant_r;
static int reentrant_closed;

static void close_from_cb(int status, const osr_binding_t *b, void *data)
{
  (void)b;
  (void)data;
  assert_int_equal(status, OSR_ENOTFOUND);
  osr_redis_close(reentrant_r, closed_cb, &reentrant_closed);
  /* Calls after close fail cleanly until the client is gone. */
  assert_int_equal(osr_redis_get_binding(reentrant_r, "x", binding_cb, NULL), OSR_ECLOSED);
}

static void test_close_variants(void **state)
{
  osr_redis_t *r;
  int closed = 0;
  char url[128];
  (void)state;

  redis_fresh();
  loop_start();
  /* From inside a reply callback. */
  reentrant_closed = 0;
  reentrant_r = client(redis_url, 2000, 0);
  assert_true(connected_flag(reentrant_r));
  assert_int_equal(osr_redis_get_binding(reentrant_r, "x", close_from_cb, NULL), 0);
  assert_true(run_until(&reentrant_closed, 5000));

  /* While resolving a name (uv_getaddrinfo in flight). */
  snprintf(url, sizeof(url), "redis://localhost:%d", redis_port);
  r = client(url, 2000, 0);
  osr_redis_close(r, closed_cb, &closed);
  assert_true(run_until(&closed, 5000));

  /* A name that resolves, reaching the server by the numeric address. */
  r = client(url, 2000, 0);
  assert_true(connected_flag(r));
  assert_int_equal(do_get(r, "x", NULL), OSR_ENOTFOUND);
  client_close(r);

  /* While connecting to nothing, and before any attempt ran. */
  r = client("redis://127.0.0.1:1", 2000, 0);
  run_for(300);
  assert_false(osr_redis_is_connected(r));
  assert_int_equal(osr_redis_get_binding(r, "x", binding_cb, NULL), OSR_EUNAVAILABLE);
  client_close(r);
  r = client(redis_url, 2000, 0);
  client_close(r);
  loop_finish();
}

static void test_urls(void **state)
{
  static const char *const bad[] = {
    "", "redis://", "redis://:1", "redis://h:0", "redis://h:65536", "redis://h:x",
    "redis://h:1/x", "redis://[::1", "redis://user@h", "rediss://h", "http://h", "unix:",
    "unix:relative", "redis://h:1x", "redis://h:1/2/3",
  };
  static const char *const good[] = {
    "redis://127.0.0.1", "redis://127.0.0.1:1/3", "redis://[::1]:1", "redis://:pw@127.0.0.1:1",
    "redis://u:pw@127.0.0.1:1/0", "unix:/tmp/nothing.sock", "unix:///tmp/nothing.sock",
  };
  osr_redis_opts_t o;
  osr_redis_t *r;
  (void)state;

  loop_start();
  memset(&o, 0, sizeof(o));
  for (size_t i = 0; i < OSR_ARRAY_SIZE(bad); i++) {
    o.url = bad[i];
    r = (osr_redis_t *)&o;
    assert_int_equal(osr_redis_new(&loop, &o, &r), OSR_EINVAL);
    assert_null(r);
  }
  o.url = NULL;
  assert_int_equal(osr_redis_new(&loop, &o, &r), OSR_EINVAL);
  o.url = "redis://127.0.0.1";
  o.prefix = "01234567890123456789012345678901234567890123456789012345678901234"; /* 65 */
  assert_int_equal(osr_redis_new(&loop, &o, &r), OSR_EINVAL);
  o.prefix = NULL;
  for (size_t i = 0; i < OSR_ARRAY_SIZE(good); i++) {
    o.url = good[i];
    assert_int_equal(osr_redis_new(&loop, &o, &r), 0);
    client_close(r);
  }
  loop_finish();
}

static void test_handshake_refused(void **state)
{
  osr_redis_t *r;
  char url[128];
  (void)state;

  redis_fresh();
  loop_start();
  /* The default server has 16 databases: SELECT 99 fails, so the client
   * must never report itself usable (it would write to the wrong db). */
  snprintf(url, sizeof(url), "%s/99", redis_url);
  r = client(url, 2000, 0);
  run_for(600);
  assert_false(osr_redis_is_connected(r));
  client_close(r);
  /* A valid db is selected before anything is sent. */
  snprintf(url, sizeof(url), "%s/5", redis_url);
  r = client(url, 2000, 0);
  assert_true(connected_flag(r));
  {
    osr_binding_t a;
    char out[64];
    fill(&a, "indb5");
    assert_int_equal(do_put(r, &a), 0);
    dispose(&a);
    cli(out, sizeof(out), "-n 5 EXISTS osr:b:indb5");
    assert_string_equal(out, "1");
    cli(out, sizeof(out), "-n 0 EXISTS osr:b:indb5");
    assert_string_equal(out, "0");
  }
  client_close(r);
  loop_finish();
}

static void test_auth(void **state)
{
  osr_redis_t *r;
  sub_t s;
  char url[160], out[64];
  (void)state;

  memset(&s, 0, sizeof(s));
  redis_fresh();
  cli(out, sizeof(out), "CONFIG SET requirepass s3cret");
  assert_string_equal(out, "OK");
  loop_start();
  /* Without the password the PING of the handshake is refused. */
  r = client(redis_url, 2000, 0);
  run_for(600);
  assert_false(osr_redis_is_connected(r));
  client_close(r);
  /* With it, both connections authenticate (":password@" form). */
  snprintf(url, sizeof(url), "redis://:s3cret@127.0.0.1:%d", redis_port);
  r = client(url, 2000, 0);
  assert_int_equal(osr_redis_subscribe(r, on_invalidate, &s), 0);
  assert_true(connected_flag(r));
  cli(out, sizeof(out), "-a s3cret --no-auth-warning PING");
  assert_string_equal(out, "PONG");
  for (int i = 0; i < 200 && s.count == 0; i++) {
    if (i % 20 == 0)
      assert_int_equal(do_invalidate(r, "authed"), 0);
    run_for(10);
  }
  assert_true(s.count >= 1);
  assert_string_equal(s.seen[0], "authed");
  client_close(r);
  loop_finish();
  cli(out, sizeof(out), "-a s3cret --no-auth-warning CONFIG SET requirepass ''");
  assert_string_equal(out, "OK");
}

int main(void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_json_roundtrip),
    cmocka_unit_test(test_json_malformed),
    cmocka_unit_test(test_json_alloc_failure),
    cmocka_unit_test(test_urls),
    cmocka_unit_test(test_put_get),
    cmocka_unit_test(test_prefix_ttl_unix),
    cmocka_unit_test(test_invalidate),
    cmocka_unit_test(test_max_inflight),
    cmocka_unit_test(test_reply_caps),
    cmocka_unit_test(test_command_timeout),
    cmocka_unit_test(test_redis_restart),
    cmocka_unit_test(test_close_inflight),
    cmocka_unit_test(test_close_variants),
    cmocka_unit_test(test_handshake_refused),
    cmocka_unit_test(test_auth),
  };
  signal(SIGPIPE, SIG_IGN);
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
