/*
 * The binding store against real databases: one suite, run once on SQLite
 * (a file in a fresh temporary directory) and once on PostgreSQL (a server
 * started by run_pg.py, URL in OSR_TEST_PG_URL).
 *
 * Every test uses its own tenant names and ids (unique per process), so the
 * tests share one database without seeing each other's rows; list tests that
 * cross tenants narrow by a metadata value unique to the test.
 *
 * Child processes (exec of this binary with a sub-command) prove durability
 * across processes: rows a first process committed are visible to a second,
 * and rows whose callback fired survive the first process dying abruptly.
 *
 * PostgreSQL outage and restart are driven by run_pg.py through two pipe fds
 * given in OSR_TEST_PG_CTL ("<read fd>,<write fd>"): we write "stop" or
 * "start" and read "ok" once the server is down or accepting queries again.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <sqlite3.h>

#include "store/store.h"
#include "util/mem.h"

#define WAIT_MS 30000

static char g_url[1024];
static int g_pg;
static const char *g_self;
static unsigned g_seq;

/* ---- helpers ------------------------------------------------------------------ */

static void uniq(char *out, size_t cap, const char *prefix)
{
  /* 20 chars for ids ("b" + pid + counter), readable names otherwise. */
  snprintf(out, cap, "%s%07u%012u", prefix, (unsigned)getpid() % 10000000u, ++g_seq);
}

static void on_tick(uv_timer_t *t)
{
  (void)t;
}

/* Run the loop until *flag >= want, bounded in time (fails the test). */
static void wait_for(uv_loop_t *loop, const int *flag, int want)
{
  uv_timer_t tick;
  uint64_t end = uv_now(loop) + WAIT_MS;

  uv_timer_init(loop, &tick);
  uv_timer_start(&tick, on_tick, 10, 10);
  while (*flag < want) {
    uv_run(loop, UV_RUN_ONCE);
    uv_update_time(loop);
    if (uv_now(loop) > end)
      fail_msg("timed out waiting for store callbacks (%d of %d)", *flag, want);
  }
  uv_timer_stop(&tick);
  uv_close((uv_handle_t *)&tick, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
}

typedef struct ctx_s {
  uv_loop_t loop;
  osr_store_t *st;
  int opened;
  int open_status;
  int closed;
} ctx_t;

static void on_open(osr_store_t *st, int status, void *data)
{
  ctx_t *c = data;
  assert_ptr_equal(st, c->st);
  c->open_status = status;
  c->opened++;
}

static void on_closed(void *data)
{
  ((ctx_t *)data)->closed++;
}

static int ctx_open_url(ctx_t *c, const char *url)
{
  int rv;
  memset(c, 0, sizeof(*c));
  assert_int_equal(uv_loop_init(&c->loop), 0);
  rv = osr_store_open(&c->loop, url, on_open, c, &c->st);
  assert_int_equal(rv, 0);
  wait_for(&c->loop, &c->opened, 1);
  return c->open_status;
}

static void ctx_open(ctx_t *c)
{
  assert_int_equal(ctx_open_url(c, g_url), 0);
  assert_string_equal(osr_store_backend(c->st), g_pg ? "postgres" : "sqlite");
}

static void ctx_close(ctx_t *c)
{
  osr_store_close(c->st, on_closed, c);
  wait_for(&c->loop, &c->closed, 1);
  assert_int_equal(uv_run(&c->loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&c->loop), 0);
}

/* One call's outcome, copied out of the callback. */
typedef struct res_s {
  int done;
  int status;
  int created;
  osr_binding_t b;
  osr_binding_t *items;
  size_t n;
  char cursor[128];
  int has_cursor;
  osr_api_key_t k;
  osr_api_key_t *keys;
  osr_audit_event_t *evs;
  uint64_t t0, t1;
} res_t;

static void res_free(res_t *r)
{
  size_t i;
  osr_binding_dispose(&r->b);
  for (i = 0; r->items != NULL && i < r->n; i++)
    osr_binding_dispose(&r->items[i]);
  osr_freep(&r->items);
  osr_freep(&r->keys);
  for (i = 0; r->evs != NULL && i < r->n; i++)
    osr_free(r->evs[i].detail_json);
  osr_freep(&r->evs);
  memset(r, 0, sizeof(*r));
}

static void on_binding(int status, const osr_binding_t *b, int created, void *data)
{
  res_t *r = data;
  r->status = status;
  r->created = created;
  if (status == 0) {
    assert_non_null(b);
    osr_binding_copy(&r->b, b);
  } else {
    assert_null(b);
  }
  r->t1 = uv_hrtime();
  r->done++;
}

static void on_done(int status, void *data)
{
  res_t *r = data;
  r->status = status;
  r->t1 = uv_hrtime();
  r->done++;
}

static void on_list(int status, const osr_binding_t *items, size_t n, const char *next, void *data)
{
  res_t *r = data;
  size_t i;
  r->status = status;
  r->n = n;
  if (n > 0) {
    r->items = osr_xcalloc(n, sizeof(*items));
    for (i = 0; i < n; i++)
      osr_binding_copy(&r->items[i], &items[i]);
  }
  r->has_cursor = next != NULL;
  if (next != NULL)
    snprintf(r->cursor, sizeof(r->cursor), "%s", next);
  r->done++;
}

static void on_key(int status, const osr_api_key_t *k, void *data)
{
  res_t *r = data;
  r->status = status;
  if (status == 0)
    r->k = *k;
  else
    assert_null(k);
  r->done++;
}

static void on_keys(int status, const osr_api_key_t *k, size_t n, void *data)
{
  res_t *r = data;
  r->status = status;
  r->n = n;
  if (n > 0) {
    r->keys = osr_xcalloc(n, sizeof(*k));
    memcpy(r->keys, k, n * sizeof(*k));
  }
  r->done++;
}

static void on_audit(int status, const osr_audit_event_t *ev, size_t n, const char *next, void *data)
{
  res_t *r = data;
  size_t i;
  r->status = status;
  r->n = n;
  if (n > 0) {
    r->evs = osr_xcalloc(n, sizeof(*ev));
    for (i = 0; i < n; i++) {
      r->evs[i] = ev[i];
      r->evs[i].detail_json = ev[i].detail_json != NULL ? osr_xstrdup(ev[i].detail_json) : NULL;
    }
  }
  r->has_cursor = next != NULL;
  if (next != NULL)
    snprintf(r->cursor, sizeof(r->cursor), "%s", next);
  r->done++;
}

/* A 64-char fake hash unique per key id. */
static void mk_hash(char *hash, const char *key_id, int n)
{
  size_t len;
  memset(hash, '0', 64);
  hash[64] = '\0';
  len = strlen(key_id);
  memcpy(hash, key_id, len < 60 ? len : 60);
  hash[63] = (char)('0' + n);
}

static void mk_binding(osr_binding_t *b, const char *tenant, const char *key, int64_t created)
{
  osr_binding_init(b);
  uniq(b->id, sizeof(b->id), "b");
  snprintf(b->tenant, sizeof(b->tenant), "%s", tenant);
  snprintf(b->idem_key, sizeof(b->idem_key), "%s", key != NULL ? key : "");
  memset(b->request_hash, 'a', 64);
  snprintf(b->template_id, sizeof(b->template_id), "python:3.12");
  snprintf(b->provider, sizeof(b->provider), "sim-a");
  snprintf(b->region, sizeof(b->region), "eu-west");
  b->isolation = OSR_ISO_GVISOR;
  b->attempt = 1;
  b->created_ms = created;
  b->updated_ms = created;
  b->expires_ms = created + 3600000;
  b->idle_timeout_ms = 600000;
}

static void sync_create(ctx_t *c, const osr_binding_t *b, res_t *r)
{
  memset(r, 0, sizeof(*r));
  assert_int_equal(osr_store_create_intent(c->st, b, on_binding, r), 0);
  assert_int_equal(r->done, 0); /* never from inside the call */
  wait_for(&c->loop, &r->done, 1);
}

static void sync_get(ctx_t *c, const char *tenant, const char *id, res_t *r)
{
  memset(r, 0, sizeof(*r));
  assert_int_equal(osr_store_get(c->st, tenant, id, on_binding, r), 0);
  wait_for(&c->loop, &r->done, 1);
}

static void sync_update(ctx_t *c, const osr_binding_t *b, res_t *r)
{
  memset(r, 0, sizeof(*r));
  assert_int_equal(osr_store_update(c->st, b, on_done, r), 0);
  wait_for(&c->loop, &r->done, 1);
}

static void sync_list(ctx_t *c, const osr_store_query_t *q, res_t *r)
{
  memset(r, 0, sizeof(*r));
  assert_int_equal(osr_store_list(c->st, q, on_list, r), 0);
  wait_for(&c->loop, &r->done, 1);
}

typedef struct counts_s {
  int status, done;
  size_t n;
  uint64_t c[OSR_BINDING_LOST + 1];
} counts_t;

static void on_counts(int status, const uint64_t *counts, size_t n, void *data)
{
  counts_t *r = data;
  r->status = status;
  r->n = n;
  for (size_t i = 0; i < n && i <= OSR_BINDING_LOST; i++)
    r->c[i] = counts[i];
  r->done++;
}

static void sync_count(ctx_t *c, const char *tenant, counts_t *r)
{
  memset(r, 0, sizeof(*r));
  assert_int_equal(osr_store_count_by_state(c->st, tenant, on_counts, r), 0);
  wait_for(&c->loop, &r->done, 1);
}

/* Read a whole listing page by page; returns the number of rows and checks
 * the (created_ms, id) order and that no row repeats. */
static size_t list_all(ctx_t *c, osr_store_query_t q, size_t page, char ids[][OSR_ID_MAX], size_t cap)
{
  char cursor[128];
  size_t total = 0, pages = 0, i;
  int64_t last_created = -1;
  char last_id[OSR_ID_MAX] = "";
  res_t r;

  q.limit = page;
  q.cursor = NULL;
  for (;;) {
    sync_list(c, &q, &r);
    assert_int_equal(r.status, 0);
    assert_true(r.n <= page);
    for (i = 0; i < r.n; i++) {
      const osr_binding_t *b = &r.items[i];
      assert_true(b->created_ms > last_created ||
                  (b->created_ms == last_created && strcmp(b->id, last_id) > 0));
      last_created = b->created_ms;
      snprintf(last_id, sizeof(last_id), "%s", b->id);
      assert_true(total < cap);
      snprintf(ids[total++], OSR_ID_MAX, "%s", b->id);
    }
    if (!r.has_cursor) {
      res_free(&r);
      break;
    }
    assert_int_equal(r.n, page); /* only full pages have a next page */
    snprintf(cursor, sizeof(cursor), "%s", r.cursor);
    q.cursor = cursor;
    res_free(&r);
    assert_true(++pages < 1000);
  }
  return total;
}

/* Run this binary as a child with a sub-command; returns its exit status. */
static int run_child(const char *cmd, const char *arg)
{
  pid_t pid = fork();
  int st = 0;
  assert_true(pid >= 0);
  if (pid == 0) {
    execl(g_self, g_self, cmd, g_url, arg, (char *)NULL);
    _exit(127);
  }
  assert_int_equal(waitpid(pid, &st, 0), pid);
  if (WIFSIGNALED(st))
    return 128 + WTERMSIG(st);
  return WEXITSTATUS(st);
}

/* ---- tests: values and arguments ------------------------------------------------ */

static void test_state_names(void **state)
{
  osr_binding_t a, b;
  int s;
  (void)state;
  for (s = OSR_BINDING_CREATING; s <= OSR_BINDING_LOST; s++)
    assert_int_equal(osr_binding_state_parse(osr_binding_state_name((osr_binding_state_t)s)), s);
  assert_string_equal(osr_binding_state_name(OSR_BINDING_RUNNING), "running");
  assert_int_equal(osr_binding_state_parse("nope"), 0);
  assert_int_equal(osr_binding_state_parse(NULL), 0);
  assert_string_equal(osr_binding_state_name((osr_binding_state_t)99), "unknown");

  osr_binding_init(&a);
  snprintf(a.id, sizeof(a.id), "x");
  a.granted_json = osr_xstrdup("{\"gpu\":1}");
  osr_binding_copy(&b, &a);
  assert_ptr_not_equal(a.granted_json, b.granted_json);
  assert_string_equal(b.granted_json, "{\"gpu\":1}");
  assert_null(b.error_json);
  osr_binding_dispose(&a);
  osr_binding_dispose(&b);
  assert_null(b.granted_json);
}

static void test_bad_urls(void **state)
{
  uv_loop_t loop;
  osr_store_t *st = (osr_store_t *)&loop;
  static const char *const bad[] = {
    "mysql://x/y", "sqlite:", "sqlite://", "sqlite:/tmp/x.db?sync=sometimes", "sqlite:/tmp/x?foo=1",
    "postgres://127.0.0.1/db?pool=0", "postgres://127.0.0.1/db?pool=99", "postgres://127.0.0.1/db?pool=x",
    "postgresql://127.0.0.1/db?nosuchparam=1", "", "postgres:/nohost",
  };
  size_t i;
  (void)state;
  assert_int_equal(uv_loop_init(&loop), 0);
  for (i = 0; i < OSR_ARRAY_SIZE(bad); i++) {
    st = (osr_store_t *)&loop;
    assert_int_equal(osr_store_open(&loop, bad[i], on_open, NULL, &st), OSR_EINVAL);
    assert_null(st);
  }
  assert_int_equal(osr_store_open(&loop, NULL, on_open, NULL, &st), OSR_EINVAL);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void test_bad_args(void **state)
{
  ctx_t c;
  osr_binding_t b;
  osr_store_query_t q;
  osr_api_key_t k;
  osr_audit_event_t ev;
  const char *keys[1] = {"k"}, *vals[1] = {"v"};
  char *big;
  res_t r;
  (void)state;

  ctx_open(&c);
  mk_binding(&b, "tenant-bad", NULL, 1000);
  b.metadata_json = (char *)"[1,2]";
  assert_int_equal(osr_store_create_intent(c.st, &b, on_binding, &r), OSR_EINVAL);
  b.metadata_json = (char *)"{\"a\": 1}";
  assert_int_equal(osr_store_create_intent(c.st, &b, on_binding, &r), OSR_EINVAL);
  b.metadata_json = (char *)"{\"a\": \"x\", \"a\": \"y\"}";
  assert_int_equal(osr_store_create_intent(c.st, &b, on_binding, &r), OSR_EINVAL);
  b.metadata_json = (char *)"{not json";
  assert_int_equal(osr_store_create_intent(c.st, &b, on_binding, &r), OSR_EINVAL);
  b.metadata_json = NULL;
  big = osr_xmalloc(64 * 1024 + 2);
  memset(big, ' ', 64 * 1024 + 1);
  big[0] = '{';
  big[64 * 1024] = '}';
  big[64 * 1024 + 1] = '\0';
  b.request_json = big;
  assert_int_equal(osr_store_create_intent(c.st, &b, on_binding, &r), OSR_EINVAL);
  b.request_json = NULL;
  osr_free(big);
  b.id[0] = '\0';
  assert_int_equal(osr_store_create_intent(c.st, &b, on_binding, &r), OSR_EINVAL);
  mk_binding(&b, "", NULL, 1000);
  assert_int_equal(osr_store_create_intent(c.st, &b, on_binding, &r), OSR_EINVAL);
  memset(b.tenant, 'x', sizeof(b.tenant)); /* not terminated */
  assert_int_equal(osr_store_create_intent(c.st, &b, on_binding, &r), OSR_EINVAL);
  assert_int_equal(osr_store_get(c.st, NULL, "", on_binding, &r), OSR_EINVAL);
  mk_binding(&b, "tenant-bad", NULL, 1000);
  b.state = (osr_binding_state_t)0;
  assert_int_equal(osr_store_update(c.st, &b, on_done, &r), OSR_EINVAL);

  memset(&q, 0, sizeof(q));
  q.cursor = "garbage";
  assert_int_equal(osr_store_list(c.st, &q, on_list, &r), OSR_EINVAL);
  q.cursor = "12:bad id";
  assert_int_equal(osr_store_list(c.st, &q, on_list, &r), OSR_EINVAL);
  q.cursor = NULL;
  q.nmeta = 17;
  q.meta_keys = keys;
  q.meta_values = vals;
  assert_int_equal(osr_store_list(c.st, &q, on_list, &r), OSR_EINVAL);
  assert_int_equal(osr_store_audit_list(c.st, NULL, "x", 10, on_audit, &r), OSR_EINVAL);
  assert_int_equal(osr_store_audit_list(c.st, NULL, "-5", 10, on_audit, &r), OSR_EINVAL);

  memset(&k, 0, sizeof(k));
  snprintf(k.key_id, sizeof(k.key_id), "k_1");
  snprintf(k.hash, sizeof(k.hash), "h");
  k.role = (osr_role_t)7;
  assert_int_equal(osr_store_key_put(c.st, &k, on_done, &r), OSR_EINVAL);
  memset(&ev, 0, sizeof(ev));
  assert_int_equal(osr_store_audit_append(c.st, &ev, on_done, &r), OSR_EINVAL); /* no action */

  /* After close every call is refused and nothing fires. */
  osr_store_close(c.st, on_closed, &c);
  mk_binding(&b, "tenant-bad", NULL, 1000);
  memset(&r, 0, sizeof(r));
  assert_int_equal(osr_store_create_intent(c.st, &b, on_binding, &r), OSR_ECLOSED);
  assert_int_equal(osr_store_touch(c.st, b.id, 1, on_done, &r), OSR_ECLOSED);
  wait_for(&c.loop, &c.closed, 1);
  assert_int_equal(r.done, 0);
  assert_int_equal(uv_run(&c.loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&c.loop), 0);
}

/* ---- tests: bindings ----------------------------------------------------------------- */

static void test_create_get_update(void **state)
{
  ctx_t c;
  osr_binding_t b, u;
  char tenant[40], other[40];
  res_t r;
  (void)state;

  uniq(tenant, sizeof(tenant), "t-cgu-");
  uniq(other, sizeof(other), "t-oth-");
  ctx_open(&c);
  mk_binding(&b, tenant, "key-1", 1700000000000);
  b.state = OSR_BINDING_RUNNING; /* ignored: an intent is always CREATING */
  b.request_json = (char *)"{\"template\":\"python:3.12\"}";
  b.metadata_json = (char *)"{\"team\":\"ml\",\"owner\":\"ann\"}";
  b.granted_json = (char *)"{}";
  sync_create(&c, &b, &r);
  assert_int_equal(r.status, 0);
  assert_int_equal(r.created, 1);
  assert_string_equal(r.b.id, b.id);
  assert_int_equal(r.b.state, OSR_BINDING_CREATING);
  res_free(&r);

  sync_get(&c, tenant, b.id, &r);
  assert_int_equal(r.status, 0);
  assert_string_equal(r.b.tenant, tenant);
  assert_string_equal(r.b.idem_key, "key-1");
  assert_memory_equal(r.b.request_hash, b.request_hash, 65);
  assert_string_equal(r.b.template_id, "python:3.12");
  assert_string_equal(r.b.provider, "sim-a");
  assert_string_equal(r.b.region, "eu-west");
  assert_int_equal(r.b.isolation, OSR_ISO_GVISOR);
  assert_int_equal(r.b.state, OSR_BINDING_CREATING);
  assert_int_equal(r.b.attempt, 1);
  assert_int_equal(r.b.created_ms, 1700000000000);
  assert_int_equal(r.b.expires_ms, 1700000000000 + 3600000);
  assert_int_equal(r.b.idle_timeout_ms, 600000);
  assert_string_equal(r.b.request_json, "{\"template\":\"python:3.12\"}");
  assert_string_equal(r.b.metadata_json, "{\"team\":\"ml\",\"owner\":\"ann\"}");
  assert_string_equal(r.b.granted_json, "{}");
  assert_null(r.b.error_json);
  res_free(&r);

  /* Another tenant cannot see it; the admin (NULL) can. */
  sync_get(&c, other, b.id, &r);
  assert_int_equal(r.status, OSR_ENOTFOUND);
  res_free(&r);
  sync_get(&c, NULL, b.id, &r);
  assert_int_equal(r.status, 0);
  osr_binding_copy(&u, &r.b);
  res_free(&r);

  /* Update the mutable fields. */
  snprintf(u.provider, sizeof(u.provider), "sim-b");
  snprintf(u.provider_id, sizeof(u.provider_id), "prov-123");
  snprintf(u.region, sizeof(u.region), "us-east");
  u.isolation = OSR_ISO_FIRECRACKER;
  snprintf(u.agent_endpoint, sizeof(u.agent_endpoint), "10.0.0.5:7000");
  u.state = OSR_BINDING_RUNNING;
  u.attempt = 2;
  u.updated_ms = 1700000001000;
  u.last_activity_ms = 1700000001500;
  osr_free(u.granted_json);
  u.granted_json = osr_xstrdup("{\"vcpus\":2}");
  u.error_json = osr_xstrdup("{\"attempts\":[]}");
  snprintf(u.template_id, sizeof(u.template_id), "immutable"); /* not written */
  sync_update(&c, &u, &r);
  assert_int_equal(r.status, 0);
  res_free(&r);

  /* A stale update cannot move last_activity backwards. */
  u.last_activity_ms = 5;
  u.state = OSR_BINDING_ENDED;
  u.ended_ms = 1700000002000;
  snprintf(u.end_reason, sizeof(u.end_reason), "killed");
  sync_update(&c, &u, &r);
  assert_int_equal(r.status, 0);
  res_free(&r);

  sync_get(&c, tenant, b.id, &r);
  assert_int_equal(r.status, 0);
  assert_string_equal(r.b.provider, "sim-b");
  assert_string_equal(r.b.provider_id, "prov-123");
  assert_string_equal(r.b.region, "us-east");
  assert_int_equal(r.b.isolation, OSR_ISO_FIRECRACKER);
  assert_string_equal(r.b.agent_endpoint, "10.0.0.5:7000");
  assert_int_equal(r.b.state, OSR_BINDING_ENDED);
  assert_int_equal(r.b.attempt, 2);
  assert_int_equal(r.b.updated_ms, 1700000001000);
  assert_int_equal(r.b.last_activity_ms, 1700000001500);
  assert_int_equal(r.b.ended_ms, 1700000002000);
  assert_string_equal(r.b.end_reason, "killed");
  assert_string_equal(r.b.granted_json, "{\"vcpus\":2}");
  assert_string_equal(r.b.error_json, "{\"attempts\":[]}");
  assert_string_equal(r.b.template_id, "python:3.12");
  assert_string_equal(r.b.request_json, "{\"template\":\"python:3.12\"}");
  res_free(&r);

  /* Unknown ids. */
  uniq(u.id, sizeof(u.id), "b");
  sync_update(&c, &u, &r);
  assert_int_equal(r.status, OSR_ENOTFOUND);
  sync_get(&c, NULL, u.id, &r);
  assert_int_equal(r.status, OSR_ENOTFOUND);
  res_free(&r);

  /* The same id twice without a key is a conflict, not a second row. */
  osr_binding_dispose(&u);
  mk_binding(&u, tenant, NULL, 1700000000000);
  snprintf(u.id, sizeof(u.id), "%s", b.id);
  sync_create(&c, &u, &r);
  assert_int_equal(r.status, OSR_ECONFLICT);
  res_free(&r);

  osr_binding_dispose(&u);
  assert_true(osr_store_last_latency_us(c.st) > 0);
  ctx_close(&c);
}

static void test_idempotency(void **state)
{
  enum { N = 50 };
  ctx_t c;
  osr_binding_t b[N], x, y;
  res_t r[N], rx, ry;
  char tenant[40], tenant2[40];
  int i, created = 0;
  (void)state;

  uniq(tenant, sizeof(tenant), "t-idem-");
  uniq(tenant2, sizeof(tenant2), "t-idem2-");
  ctx_open(&c);
  /* 50 concurrent creates with one (tenant, key): exactly one row. */
  for (i = 0; i < N; i++) {
    mk_binding(&b[i], tenant, "same-key", 1700000000000 + i);
    memset(&r[i], 0, sizeof(r[i]));
    assert_int_equal(osr_store_create_intent(c.st, &b[i], on_binding, &r[i]), 0);
  }
  for (i = 0; i < N; i++)
    wait_for(&c.loop, &r[i].done, 1);
  for (i = 0; i < N; i++) {
    assert_int_equal(r[i].status, 0);
    created += r[i].created;
    if (r[i].created)
      assert_string_equal(r[i].b.id, b[i].id);
  }
  assert_int_equal(created, 1);
  for (i = 1; i < N; i++)
    assert_string_equal(r[i].b.id, r[0].b.id);
  for (i = 0; i < N; i++) {
    assert_string_equal(r[i].b.idem_key, "same-key");
    assert_string_equal(r[i].b.tenant, tenant);
    res_free(&r[i]);
  }

  /* A later retry gets the same row back (created = 0). */
  mk_binding(&x, tenant, "same-key", 1700000009999);
  sync_create(&c, &x, &rx);
  assert_int_equal(rx.status, 0);
  assert_int_equal(rx.created, 0);
  assert_string_not_equal(rx.b.id, x.id);
  res_free(&rx);

  /* The same key in another tenant is another sandbox. */
  mk_binding(&y, tenant2, "same-key", 1700000000000);
  sync_create(&c, &y, &ry);
  assert_int_equal(ry.status, 0);
  assert_int_equal(ry.created, 1);
  assert_string_equal(ry.b.id, y.id);
  res_free(&ry);

  /* No key: every create is its own row. */
  mk_binding(&x, tenant, NULL, 1700000000000);
  mk_binding(&y, tenant, NULL, 1700000000000);
  sync_create(&c, &x, &rx);
  sync_create(&c, &y, &ry);
  assert_int_equal(rx.created + ry.created, 2);
  res_free(&rx);
  res_free(&ry);
  ctx_close(&c);
}

static void test_list(void **state)
{
  enum { N = 23 };
  ctx_t c;
  osr_binding_t b;
  osr_store_query_t q;
  char tenant[40], other[40], run[40], ids[64][OSR_ID_MAX], made[N][OSR_ID_MAX], meta[160];
  const char *mk[2], *mv[2];
  res_t r;
  size_t n, i;
  int j;
  (void)state;

  uniq(tenant, sizeof(tenant), "t-list-");
  uniq(other, sizeof(other), "t-lst2-");
  uniq(run, sizeof(run), "run-");
  ctx_open(&c);
  /* Rows i: state RUNNING for odd i (after update), team "a" for i % 3 == 0,
   * several rows share a created_ms so the id breaks ties. */
  for (j = 0; j < N; j++) {
    mk_binding(&b, j < 20 ? tenant : other, NULL, 1700000000000 + j / 2);
    snprintf(meta, sizeof(meta), "{\"run\":\"%s\",\"team\":\"%s\",\"n\":\"%d\"}", run,
             j % 3 == 0 ? "a" : "b", j);
    b.metadata_json = meta;
    b.expires_ms = j < 5 ? 1000 + j : 0;
    /* Idle timeouts: rows 5..7 fall due at 2105..2107, row 8 never (no
     * activity yet), the others have none. */
    b.idle_timeout_ms = j >= 5 && j <= 8 ? 100 : 0;
    b.last_activity_ms = j >= 5 && j <= 7 ? 2000 + j : 0;
    snprintf(b.owner, sizeof(b.owner), "%s", j < 10 ? "gw-x" : "gw-y");
    sync_create(&c, &b, &r);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.created, 1);
    res_free(&r);
    snprintf(made[j], OSR_ID_MAX, "%s", b.id);
    if (j % 2 == 1) {
      b.metadata_json = NULL;
      b.state = OSR_BINDING_RUNNING;
      if (j < 10)
        b.owner[0] = '\0'; /* an update without an owner keeps the stored one */
      sync_update(&c, &b, &r);
      assert_int_equal(r.status, 0);
    }
  }

  memset(&q, 0, sizeof(q));
  q.tenant = tenant;
  n = list_all(&c, q, 7, ids, 64);
  assert_int_equal(n, 20);
  for (i = 0; i < 20; i++) {
    size_t k;
    int seen = 0;
    for (k = 0; k < n; k++)
      seen += strcmp(ids[k], made[i]) == 0;
    assert_int_equal(seen, 1);
  }
  /* Page sizes that divide the total exactly end with an empty-cursor page. */
  assert_int_equal(list_all(&c, q, 5, ids, 64), 20);
  assert_int_equal(list_all(&c, q, 20, ids, 64), 20);
  assert_int_equal(list_all(&c, q, 1000, ids, 64), 20);

  q.state_mask = 1u << OSR_BINDING_RUNNING;
  assert_int_equal(list_all(&c, q, 4, ids, 64), 10);
  q.state_mask = (1u << OSR_BINDING_RUNNING) | (1u << OSR_BINDING_CREATING);
  assert_int_equal(list_all(&c, q, 100, ids, 64), 20);
  q.state_mask = 1u << OSR_BINDING_LOST;
  assert_int_equal(list_all(&c, q, 100, ids, 64), 0);
  q.state_mask = 1u << 20; /* no known state */
  assert_int_equal(list_all(&c, q, 100, ids, 64), 0);
  q.state_mask = 0;

  mk[0] = "team";
  mv[0] = "a";
  q.meta_keys = mk;
  q.meta_values = mv;
  q.nmeta = 1;
  assert_int_equal(list_all(&c, q, 3, ids, 64), 7); /* 0,3,...,18 */
  q.state_mask = 1u << OSR_BINDING_RUNNING;
  assert_int_equal(list_all(&c, q, 3, ids, 64), 3); /* 3, 9, 15 */
  q.state_mask = 0;
  mk[1] = "n";
  mv[1] = "9";
  q.nmeta = 2;
  assert_int_equal(list_all(&c, q, 3, ids, 64), 1);
  assert_string_equal(ids[0], made[9]);
  mv[1] = "10"; /* team b */
  assert_int_equal(list_all(&c, q, 3, ids, 64), 0);

  /* All tenants, narrowed to this test's rows by metadata. */
  q.tenant = NULL;
  mk[0] = "run";
  mv[0] = run;
  q.nmeta = 1;
  assert_int_equal(list_all(&c, q, 6, ids, 64), N);
  q.tenant = other;
  assert_int_equal(list_all(&c, q, 6, ids, 64), 3);
  /* The reaper's live snapshot: several states, all tenants, small pages
   * (the cursor walks the (created_ms, id) index; ties on created_ms). */
  q.tenant = NULL;
  q.state_mask = (1u << OSR_BINDING_CREATING) | (1u << OSR_BINDING_RUNNING) |
                 (1u << OSR_BINDING_PAUSED);
  assert_int_equal(list_all(&c, q, 2, ids, 64), N);
  q.state_mask = (1u << OSR_BINDING_RUNNING) | (1u << OSR_BINDING_PAUSED);
  assert_int_equal(list_all(&c, q, 3, ids, 64), 11); /* odd j */
  q.state_mask = 0;

  /* Reaper query: expires before a deadline (rows 0..4 expire at 1000+j). */
  q.tenant = NULL;
  q.expires_before_ms = 1003;
  assert_int_equal(list_all(&c, q, 2, ids, 64), 3);
  q.expires_before_ms = 0;
  /* The reaper's due rows: TTLs passed (<=, rows 0..4) or idle timeouts
   * passed (rows 5..7 at 2105..2107), in any state the mask allows. */
  q.due_at_ms = 999;
  assert_int_equal(list_all(&c, q, 2, ids, 64), 0);
  q.due_at_ms = 1002;
  assert_int_equal(list_all(&c, q, 2, ids, 64), 3);
  q.due_at_ms = 2106;
  assert_int_equal(list_all(&c, q, 2, ids, 64), 7);
  q.due_at_ms = 1700000000000;
  assert_int_equal(list_all(&c, q, 2, ids, 64), 8);
  q.state_mask = (1u << OSR_BINDING_RUNNING) | (1u << OSR_BINDING_PAUSED);
  assert_int_equal(list_all(&c, q, 2, ids, 64), 4); /* odd j: 1, 3, 5, 7 */
  q.state_mask = 0;
  q.due_at_ms = 0;

  /* Recovery queries: by owner (kept by updates without one), and older
   * than a cut-off (rows j < 10 have created_ms < base + 5). */
  q.owner = "gw-x";
  assert_int_equal(list_all(&c, q, 4, ids, 64), 10);
  q.owner = "gw-y";
  assert_int_equal(list_all(&c, q, 4, ids, 64), 13);
  q.state_mask = 1u << OSR_BINDING_CREATING;
  assert_int_equal(list_all(&c, q, 4, ids, 64), 7); /* even j in 10..22 */
  q.state_mask = 0;
  q.created_before_ms = 1700000000000 + 5;
  assert_int_equal(list_all(&c, q, 4, ids, 64), 0);
  q.owner = NULL;
  assert_int_equal(list_all(&c, q, 4, ids, 64), 10);
  q.created_before_ms = 0;
  sync_get(&c, NULL, made[1], &r);
  assert_int_equal(r.status, 0);
  assert_string_equal(r.b.owner, "gw-x");
  res_free(&r);

  /* Counts by state, per tenant and across tenants. */
  {
    counts_t k;
    sync_count(&c, tenant, &k);
    assert_int_equal(k.status, 0);
    assert_int_equal(k.n, OSR_BINDING_LOST + 1);
    assert_int_equal(k.c[OSR_BINDING_CREATING], 10);
    assert_int_equal(k.c[OSR_BINDING_RUNNING], 10);
    assert_int_equal(k.c[OSR_BINDING_FAILED], 0);
    sync_count(&c, other, &k);
    assert_int_equal(k.c[OSR_BINDING_CREATING], 2);
    assert_int_equal(k.c[OSR_BINDING_RUNNING], 1);
    sync_count(&c, NULL, &k);
    assert_true(k.c[OSR_BINDING_RUNNING] >= 11);
  }

  /* Limit clamps: 0 means the default page. */
  q.limit = 0;
  q.cursor = NULL;
  sync_list(&c, &q, &r);
  assert_int_equal(r.status, 0);
  assert_int_equal(r.n, N);
  assert_false(r.has_cursor);
  res_free(&r);
  ctx_close(&c);
}

static void test_touch(void **state)
{
  enum { N = 40 };
  ctx_t c;
  osr_binding_t b;
  res_t r, t[N], u;
  char tenant[40], missing[OSR_ID_MAX];
  int i;
  (void)state;

  uniq(tenant, sizeof(tenant), "t-touch-");
  ctx_open(&c);
  mk_binding(&b, tenant, NULL, 1700000000000);
  sync_create(&c, &b, &r);
  assert_int_equal(r.status, 0);
  res_free(&r);
  /* Many touches in one burst, out of order: the latest wins. */
  for (i = 0; i < N; i++) {
    memset(&t[i], 0, sizeof(t[i]));
    assert_int_equal(osr_store_touch(c.st, b.id, 1700000100000 + ((i * 17) % N), on_done, &t[i]), 0);
  }
  uniq(missing, sizeof(missing), "b");
  memset(&u, 0, sizeof(u));
  assert_int_equal(osr_store_touch(c.st, missing, 5, on_done, &u), 0);
  for (i = 0; i < N; i++) {
    wait_for(&c.loop, &t[i].done, 1);
    assert_int_equal(t[i].status, 0);
  }
  wait_for(&c.loop, &u.done, 1);
  assert_int_equal(u.status, 0); /* unknown ids are ignored: activity is best effort */
  sync_get(&c, tenant, b.id, &r);
  assert_int_equal(r.b.last_activity_ms, 1700000100000 + N - 1);
  res_free(&r);
  /* An older touch does not go back in time. */
  memset(&u, 0, sizeof(u));
  assert_int_equal(osr_store_touch(c.st, b.id, 1700000000001, on_done, &u), 0);
  wait_for(&c.loop, &u.done, 1);
  sync_get(&c, tenant, b.id, &r);
  assert_int_equal(r.b.last_activity_ms, 1700000100000 + N - 1);
  res_free(&r);
  ctx_close(&c);
}

/* ---- tests: keys and audit ----------------------------------------------------------- */

static void test_keys(void **state)
{
  ctx_t c;
  osr_api_key_t k, k2, adm;
  char tenant[40];
  res_t r;
  size_t i;
  int found = 0;
  (void)state;

  uniq(tenant, sizeof(tenant), "t-keys-");
  ctx_open(&c);
  memset(&k, 0, sizeof(k));
  uniq(k.key_id, sizeof(k.key_id), "k_");
  snprintf(k.tenant, sizeof(k.tenant), "%s", tenant);
  k.role = OSR_ROLE_TENANT;
  mk_hash(k.hash, k.key_id, 1);
  snprintf(k.name, sizeof(k.name), "ci");
  k.created_ms = 1700000000000;
  k2 = k;
  uniq(k2.key_id, sizeof(k2.key_id), "k_");
  mk_hash(k2.hash, k2.key_id, 2);
  k2.created_ms = 1700000000001;
  adm = k;
  uniq(adm.key_id, sizeof(adm.key_id), "k_");
  mk_hash(adm.hash, adm.key_id, 3);
  snprintf(adm.tenant, sizeof(adm.tenant), "admin");
  adm.role = OSR_ROLE_ADMIN;

  memset(&r, 0, sizeof(r));
  assert_int_equal(osr_store_key_put(c.st, &k, on_done, &r), 0);
  wait_for(&c.loop, &r.done, 1);
  assert_int_equal(r.status, 0);
  memset(&r, 0, sizeof(r));
  assert_int_equal(osr_store_key_put(c.st, &k2, on_done, &r), 0);
  wait_for(&c.loop, &r.done, 1);
  assert_int_equal(r.status, 0);
  memset(&r, 0, sizeof(r));
  assert_int_equal(osr_store_key_put(c.st, &adm, on_done, &r), 0);
  wait_for(&c.loop, &r.done, 1);
  assert_int_equal(r.status, 0);
  /* Same id or same hash again: conflict. */
  memset(&r, 0, sizeof(r));
  assert_int_equal(osr_store_key_put(c.st, &k, on_done, &r), 0);
  wait_for(&c.loop, &r.done, 1);
  assert_int_equal(r.status, OSR_ECONFLICT);
  adm = k;
  uniq(adm.key_id, sizeof(adm.key_id), "k_");
  memset(&r, 0, sizeof(r));
  assert_int_equal(osr_store_key_put(c.st, &adm, on_done, &r), 0);
  wait_for(&c.loop, &r.done, 1);
  assert_int_equal(r.status, OSR_ECONFLICT);

  memset(&r, 0, sizeof(r));
  assert_int_equal(osr_store_key_lookup(c.st, k.hash, on_key, &r), 0);
  wait_for(&c.loop, &r.done, 1);
  assert_int_equal(r.status, 0);
  assert_string_equal(r.k.key_id, k.key_id);
  assert_string_equal(r.k.tenant, tenant);
  assert_int_equal(r.k.role, OSR_ROLE_TENANT);
  assert_string_equal(r.k.name, "ci");
  assert_int_equal(r.k.created_ms, 1700000000000);
  assert_int_equal(r.k.revoked_ms, 0);

  memset(&r, 0, sizeof(r));
  assert_int_equal(osr_store_key_list(c.st, tenant, on_keys, &r), 0);
  wait_for(&c.loop, &r.done, 1);
  assert_int_equal(r.status, 0);
  assert_int_equal(r.n, 2);
  assert_string_equal(r.keys[0].key_id, k.key_id);
  assert_string_equal(r.keys[1].key_id, k2.key_id);
  res_free(&r);
  assert_int_equal(osr_store_key_list(c.st, NULL, on_keys, &r), 0);
  wait_for(&c.loop, &r.done, 1);
  assert_int_equal(r.status, 0);
  for (i = 0; i < r.n; i++)
    found += strcmp(r.keys[i].tenant, "admin") == 0 && r.keys[i].role == OSR_ROLE_ADMIN;
  assert_true(found >= 1);
  assert_true(r.n >= 3);
  res_free(&r);

  assert_int_equal(osr_store_key_revoke(c.st, k.key_id, 1700000005000, on_done, &r), 0);
  wait_for(&c.loop, &r.done, 1);
  assert_int_equal(r.status, 0);
  memset(&r, 0, sizeof(r));
  assert_int_equal(osr_store_key_revoke(c.st, k.key_id, 1700000009000, on_done, &r), 0);
  wait_for(&c.loop, &r.done, 1);
  assert_int_equal(r.status, 0); /* idempotent */
  memset(&r, 0, sizeof(r));
  assert_int_equal(osr_store_key_revoke(c.st, "k_nosuchkey", 1, on_done, &r), 0);
  wait_for(&c.loop, &r.done, 1);
  assert_int_equal(r.status, OSR_ENOTFOUND);
  memset(&r, 0, sizeof(r));
  assert_int_equal(osr_store_key_lookup(c.st, k.hash, on_key, &r), 0);
  wait_for(&c.loop, &r.done, 1);
  assert_int_equal(r.status, OSR_ENOTFOUND);
  memset(&r, 0, sizeof(r));
  assert_int_equal(osr_store_key_list(c.st, tenant, on_keys, &r), 0);
  wait_for(&c.loop, &r.done, 1);
  assert_int_equal(r.n, 2);
  assert_int_equal(r.keys[0].revoked_ms, 1700000005000); /* first revocation kept */
  res_free(&r);
  assert_int_equal(osr_store_key_lookup(c.st, k2.hash, on_key, &r), 0);
  wait_for(&c.loop, &r.done, 1);
  assert_int_equal(r.status, 0);
  ctx_close(&c);
}

static void test_audit(void **state)
{
  enum { N = 12 };
  ctx_t c;
  osr_audit_event_t ev;
  char tenant[40], other[40], cursor[128];
  res_t r, w[N + 3];
  int64_t last = INT64_MAX;
  int i, total = 0, pages = 0, seen[N];
  (void)state;

  uniq(tenant, sizeof(tenant), "t-aud-");
  uniq(other, sizeof(other), "t-aud2-");
  ctx_open(&c);
  for (i = 0; i < N + 3; i++) {
    memset(&ev, 0, sizeof(ev));
    ev.at_ms = 1700000000000 + i;
    snprintf(ev.tenant, sizeof(ev.tenant), "%s", i < N ? tenant : other);
    snprintf(ev.actor, sizeof(ev.actor), "k_test");
    snprintf(ev.action, sizeof(ev.action), "create");
    snprintf(ev.sandbox_id, sizeof(ev.sandbox_id), "sb%d", i);
    snprintf(ev.outcome, sizeof(ev.outcome), i == 4 ? "no_capable_provider" : "ok");
    ev.detail_json = i == 2 ? (char *)"{\"provider\":\"sim-a\"}" : NULL;
    memset(&w[i], 0, sizeof(w[i]));
    assert_int_equal(osr_store_audit_append(c.st, &ev, on_done, &w[i]), 0);
  }
  for (i = 0; i < N + 3; i++) {
    wait_for(&c.loop, &w[i].done, 1);
    assert_int_equal(w[i].status, 0);
  }
  /* Newest first, by pages of 5: 5, 5, 2. With a connection pool,
   * appends issued together may commit in any order, so seq order is
   * checked, and the set of events, not their submission order. */
  cursor[0] = '\0';
  memset(seen, 0, sizeof(seen));
  for (;;) {
    size_t k;
    memset(&r, 0, sizeof(r));
    assert_int_equal(osr_store_audit_list(c.st, tenant, cursor[0] ? cursor : NULL, 5, on_audit, &r), 0);
    wait_for(&c.loop, &r.done, 1);
    assert_int_equal(r.status, 0);
    for (k = 0; k < r.n; k++) {
      int idx = (int)(r.evs[k].at_ms - 1700000000000);
      assert_true(r.evs[k].seq < last);
      last = r.evs[k].seq;
      assert_string_equal(r.evs[k].tenant, tenant);
      assert_true(idx >= 0 && idx < N);
      assert_int_equal(seen[idx], 0);
      seen[idx] = 1;
      assert_string_equal(r.evs[k].action, "create");
      assert_string_equal(r.evs[k].actor, "k_test");
      if (idx == 2)
        assert_string_equal(r.evs[k].detail_json, "{\"provider\":\"sim-a\"}");
      else
        assert_null(r.evs[k].detail_json);
      assert_string_equal(r.evs[k].outcome, idx == 4 ? "no_capable_provider" : "ok");
      total++;
    }
    pages++;
    if (!r.has_cursor) {
      assert_int_equal(r.n, 2);
      res_free(&r);
      break;
    }
    assert_int_equal(r.n, 5);
    snprintf(cursor, sizeof(cursor), "%s", r.cursor);
    res_free(&r);
    assert_true(pages < 10);
  }
  assert_int_equal(total, N);
  assert_int_equal(pages, 3);
  memset(&r, 0, sizeof(r));
  assert_int_equal(osr_store_audit_list(c.st, NULL, NULL, 1000, on_audit, &r), 0);
  wait_for(&c.loop, &r.done, 1);
  assert_true(r.n >= N + 3);
  res_free(&r);
  ctx_close(&c);
}

/* ---- tests: lifecycle and durability ------------------------------------------------------ */

typedef struct closer_s {
  int fired;
  int closed_seen_before; /* a request callback after the close callback */
  int *closed;
} closer_t;

static void on_binding_count(int status, const osr_binding_t *b, int created, void *data)
{
  closer_t *cl = data;
  (void)b;
  (void)created;
  /* A get may overtake its create on another pooled connection. */
  assert_true(status == 0 || status == OSR_ENOTFOUND);
  if (*cl->closed)
    cl->closed_seen_before++;
  cl->fired++;
}

typedef struct timer_submit_s {
  ctx_t *c;
  res_t r;
} timer_submit_t;

static void on_timer_get(int status, const osr_binding_t *b, int created, void *data)
{
  timer_submit_t *ts = data;
  (void)b;
  (void)created;
  ts->r.status = status;
  ts->r.done++;
}

static void on_submit_timer(uv_timer_t *t)
{
  timer_submit_t *ts = t->data;
  char id[OSR_ID_MAX];
  uniq(id, sizeof(id), "b");
  assert_int_equal(osr_store_get(ts->c->st, NULL, id, on_timer_get, ts), 0);
  uv_close((uv_handle_t *)t, NULL);
}

/* Requests are handed to the workers once per loop turn. One submitted from
 * a timer callback, with nothing else to wake the loop, must still reach
 * them before the loop blocks in poll (the prepare-phase hand-off); without
 * it uv_run would wait forever and the alarm fails the test. */
static void test_submit_from_timer(void **state)
{
  ctx_t c;
  uv_timer_t t;
  timer_submit_t ts;
  (void)state;

  ctx_open(&c);
  memset(&ts, 0, sizeof(ts));
  ts.c = &c;
  uv_timer_init(&c.loop, &t);
  t.data = &ts;
  uv_timer_start(&t, on_submit_timer, 1, 0);
  alarm(WAIT_MS / 1000 + 5);
  assert_int_equal(uv_run(&c.loop, UV_RUN_DEFAULT), 0);
  alarm(0);
  assert_int_equal(ts.r.done, 1);
  assert_int_equal(ts.r.status, OSR_ENOTFOUND);
  ctx_close(&c);
}

static void test_close_with_queued_work(void **state)
{
  enum { N = 300 };
  ctx_t c;
  osr_binding_t b;
  closer_t cl;
  char tenant[40], first[OSR_ID_MAX] = "";
  res_t r;
  int i;
  (void)state;

  uniq(tenant, sizeof(tenant), "t-close-");
  ctx_open(&c);
  memset(&cl, 0, sizeof(cl));
  cl.closed = &c.closed;
  for (i = 0; i < N; i++) {
    mk_binding(&b, tenant, NULL, 1700000000000 + i);
    if (i == 0)
      snprintf(first, sizeof(first), "%s", b.id);
    assert_int_equal(osr_store_create_intent(c.st, &b, on_binding_count, &cl), 0);
    assert_int_equal(osr_store_get(c.st, NULL, first, on_binding_count, &cl), 0);
  }
  osr_store_close(c.st, on_closed, &c);
  osr_store_close(c.st, on_closed, &c); /* second close is a no-op */
  assert_int_equal(cl.fired, 0);
  wait_for(&c.loop, &c.closed, 1);
  assert_int_equal(cl.fired, 2 * N);
  assert_int_equal(cl.closed_seen_before, 0);
  assert_int_equal(c.closed, 1);
  assert_int_equal(uv_run(&c.loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&c.loop), 0);

  /* Reopened (same process), the data is there. */
  ctx_open(&c);
  memset(&r, 0, sizeof(r));
  sync_get(&c, tenant, first, &r);
  assert_int_equal(r.status, 0);
  res_free(&r);
  ctx_close(&c);
}

static void test_other_process_sees_commits(void **state)
{
  ctx_t c;
  osr_binding_t b;
  char tenant[40];
  res_t r;
  (void)state;

  uniq(tenant, sizeof(tenant), "t-proc-");
  ctx_open(&c);
  mk_binding(&b, tenant, NULL, 1700000000000);
  sync_create(&c, &b, &r);
  assert_int_equal(r.status, 0);
  res_free(&r);
  /* While this store is still open, a second process reads the row. */
  assert_int_equal(run_child("child-get", b.id), 0);
  assert_int_equal(run_child("child-get", "bnosuchid00000000000"), 3);
  ctx_close(&c);
}

static void test_crash_after_commit(void **state)
{
  ctx_t c;
  res_t r;
  char id[OSR_ID_MAX];
  (void)state;

  /* A child creates a row and dies by SIGKILL inside the callback, before
   * any close: what the callback reported as written must be there. */
  uniq(id, sizeof(id), "b");
  assert_int_equal(run_child("child-create-crash", id), 128 + SIGKILL);
  ctx_open(&c);
  sync_get(&c, NULL, id, &r);
  assert_int_equal(r.status, 0);
  assert_string_equal(r.b.tenant, "t-crash");
  res_free(&r);
  ctx_close(&c);
}

typedef struct open2_s {
  int done;
  int status[2];
} open2_t;

static void on_open2(osr_store_t *st, int status, void *data)
{
  open2_t *o = data;
  (void)st;
  o->status[o->done++] = status;
}

/* Two stores ("gateways") opening one fresh database at the same moment:
 * both migrate safely and both work. Runs first, on a new database. */
static void test_concurrent_open(void **state)
{
  uv_loop_t loop;
  osr_store_t *a, *b;
  open2_t o;
  (void)state;

  memset(&o, 0, sizeof(o));
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(osr_store_open(&loop, g_url, on_open2, &o, &a), 0);
  assert_int_equal(osr_store_open(&loop, g_url, on_open2, &o, &b), 0);
  wait_for(&loop, &o.done, 2);
  assert_int_equal(o.status[0], 0);
  assert_int_equal(o.status[1], 0);
  osr_store_close(a, NULL, NULL);
  osr_store_close(b, NULL, NULL);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* An unusable SQLite path: open answers `unavailable` (through the callback),
 * calls fail the same way, and the store still closes cleanly. */
static void test_sqlite_unusable_path(void **state)
{
  ctx_t c;
  res_t r;
  (void)state;
  if (g_pg)
    skip();
  assert_int_equal(ctx_open_url(&c, "sqlite:/nonexistent-osr-dir/x/osr.db"), OSR_EUNAVAILABLE);
  sync_get(&c, NULL, "bnosuchid00000000000", &r);
  assert_int_equal(r.status, OSR_EUNAVAILABLE);
  ctx_close(&c);
}

/* A long sustained write load keeps the WAL bounded, by the checkpoint
 * thread's work: the writer's last-resort checkpoint comes only at 128 MiB
 * of WAL (store_sqlite.c), so a WAL file that stays under WAL_BOUND while
 * three times that much was appended to it was started over at 32 MiB,
 * when the thread's copy reached the WAL's end and asked the writer for
 * the last few frames (restart_due); the slack up to WAL_BOUND is for a
 * thread that lags (a loaded machine, ASan). Without the thread (or with
 * that request broken) the file reaches 128 MiB. Measured by file size,
 * never by time. */
static void on_create_ok(int status, const osr_binding_t *b, int created, void *data)
{
  (void)b;
  assert_int_equal(status, 0);
  assert_true(created);
  (*(int *)data)++;
}

static off_t wal_size(void)
{
  char p[1100];
  struct stat sb;
  snprintf(p, sizeof(p), "%s-wal", g_url + strlen("sqlite:"));
  return stat(p, &sb) == 0 ? sb.st_size : 0;
}

/* Creates, INFLIGHT at a time, until about `append` bytes were appended to
 * the WAL (from the growth of the first PROBE creates: the WAL only grows
 * before its first start-over, at 32 MiB); the WAL file never exceeds
 * `bound`. Answers its peak size. */
static off_t append_wal(ctx_t *c, const char *tenant, off_t append, off_t bound)
{
  enum { INFLIGHT = 16, PROBE = 1600, MAX_CREATES = 600000 };
  osr_binding_t b;
  off_t start, size, peak = 0;
  long n = 0, want = MAX_CREATES;
  int done = 0, i;

  start = wal_size();
  while (n < want) {
    for (i = 0; i < INFLIGHT; i++, n++) {
      mk_binding(&b, tenant, NULL, 1700000000000 + n);
      assert_int_equal(osr_store_create_intent(c->st, &b, on_create_ok, &done), 0);
    }
    wait_for(&c->loop, &done, (int)n);
    size = wal_size();
    peak = size > peak ? size : peak;
    assert_true(size <= bound);
    if (n == PROBE) {
      assert_true(size > start);
      want = (long)(append / ((size - start) / PROBE + 1));
      want = want < PROBE ? PROBE : want > MAX_CREATES ? MAX_CREATES : want;
    }
  }
  print_message("%ld creates (about %lld MiB of WAL), peak WAL file %lld KiB\n", n,
                (long long)(append >> 20), (long long)(peak >> 10));
  return peak;
}

static void test_sqlite_wal_bounded(void **state)
{
  const off_t WAL_BOUND = 96 * 1024 * 1024;
  ctx_t c;
  char tenant[64];
  (void)state;
  if (g_pg)
    skip();
  ctx_open(&c);
  uniq(tenant, sizeof(tenant), "walt");
  assert_true(append_wal(&c, tenant, 3 * WAL_BOUND, WAL_BOUND) > 0);
  ctx_close(&c);
}

/* The background reader reading page after page, as the reaper does, while
 * creates fill the WAL: each start-over copy of the writer must be followed
 * by a start-over. A reader transaction that began before such a copy ended
 * keeps SQLite from starting the WAL over (its snapshot still uses the WAL),
 * so the copy's two fsyncs stalled the store queue for nothing, again at
 * each of the checkpoint thread's next requests. The writer holds the reader
 * off and copies only when it has no transaction open (store_sqlite.c
 * sq_shared_t). Counted by osr_store_stats, never timed. The reader runs
 * at a low CPU priority (store.c BG_NICE): on a loaded machine it can be
 * starved inside a page's transaction for seconds, and no start-over can
 * happen meanwhile, so the WAL's bound here is loose (the writer's last
 * resort, 128 MiB, plus a copy's worth); test_sqlite_wal_bounded, with no
 * reader, holds the tight one. Pages of 100 keep its transactions short. */
typedef struct lister_s {
  osr_store_t *st;
  osr_store_query_t q;
  char tenant[64], cursor[256];
  int stop, inflight;
  long pages;
} lister_t;

static void on_lister_page(int status, const osr_binding_t *items, size_t n, const char *next,
                           void *data)
{
  lister_t *l = data;
  (void)items;
  (void)n;
  assert_int_equal(status, 0);
  l->pages++;
  if (next != NULL)
    snprintf(l->cursor, sizeof(l->cursor), "%s", next);
  l->q.cursor = next != NULL ? l->cursor : NULL;
  if (l->stop) {
    l->inflight = 0;
    return;
  }
  assert_int_equal(osr_store_list(l->st, &l->q, on_lister_page, l), 0);
}

static void test_sqlite_wal_restart_with_reader(void **state)
{
  const off_t WAL_BOUND = 160 * 1024 * 1024;
  ctx_t c;
  lister_t l;
  osr_store_stats_t s0, s1;
  char tenant[64];
  (void)state;
  if (g_pg)
    skip();
  ctx_open(&c);
  uniq(tenant, sizeof(tenant), "walr");
  memset(&l, 0, sizeof(l));
  l.st = c.st;
  snprintf(l.tenant, sizeof(l.tenant), "%s", tenant);
  l.q.tenant = l.tenant;
  l.q.limit = 100;
  l.q.background = 1;
  l.inflight = 1;
  osr_store_stats(c.st, &s0);
  assert_int_equal(osr_store_list(c.st, &l.q, on_lister_page, &l), 0);
  append_wal(&c, tenant, 5 * 32 * 1024 * 1024, WAL_BOUND);
  l.stop = 1;
  while (l.inflight)
    uv_run(&c.loop, UV_RUN_ONCE);
  osr_store_stats(c.st, &s1);
  print_message("%ld background pages; WAL started over %llu times, %llu copies for nothing\n",
                l.pages, (unsigned long long)(s1.wal_restarts - s0.wal_restarts),
                (unsigned long long)(s1.wal_restart_misses - s0.wal_restart_misses));
  assert_true(l.pages > 0);
  assert_true(s1.wal_restarts - s0.wal_restarts >= 2);
  assert_int_equal(s1.wal_restart_misses - s0.wal_restart_misses, 0);
  ctx_close(&c);
}

static void test_sqlite_file_mode(void **state)
{
  struct stat sb;
  const char *path = g_url + strlen("sqlite:");
  (void)state;
  if (g_pg)
    skip();
  assert_int_equal(stat(path, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0600);
}

/* ---- PostgreSQL only: outage, reconnect, two gateways ---------------------------------------- */

static int ctl_rfd = -1, ctl_wfd = -1;

static void pg_ctl(const char *cmd)
{
  char line[16];
  size_t n = 0;
  ssize_t k;
  assert_true(ctl_wfd >= 0);
  assert_int_equal(write(ctl_wfd, cmd, strlen(cmd)), (ssize_t)strlen(cmd));
  assert_int_equal(write(ctl_wfd, "\n", 1), 1);
  while (n < sizeof(line) - 1) {
    k = read(ctl_rfd, line + n, 1);
    assert_true(k == 1);
    if (line[n] == '\n')
      break;
    n++;
  }
  line[n] = '\0';
  assert_string_equal(line, "ok");
}

static void test_pg_outage(void **state)
{
  enum { BURST = 20 };
  ctx_t c;
  osr_binding_t b;
  res_t r, burst[BURST];
  char tenant[40], before[OSR_ID_MAX];
  uint64_t worst = 0, t0;
  int i, ok = 0;
  (void)state;

  if (!g_pg || ctl_wfd < 0)
    skip();
  uniq(tenant, sizeof(tenant), "t-outage-");
  ctx_open(&c);
  mk_binding(&b, tenant, NULL, 1700000000000);
  snprintf(before, sizeof(before), "%s", b.id);
  sync_create(&c, &b, &r);
  assert_int_equal(r.status, 0);
  res_free(&r);

  pg_ctl("stop");
  /* Sequential calls and a burst: each answers `unavailable`, none hangs. */
  for (i = 0; i < 5; i++) {
    mk_binding(&b, tenant, NULL, 1700000000000);
    t0 = uv_hrtime();
    sync_create(&c, &b, &r);
    assert_int_equal(r.status, OSR_EUNAVAILABLE);
    if (r.t1 - t0 > worst)
      worst = r.t1 - t0;
    res_free(&r);
    sync_get(&c, NULL, before, &r);
    assert_int_equal(r.status, OSR_EUNAVAILABLE);
    res_free(&r);
  }
  t0 = uv_hrtime();
  for (i = 0; i < BURST; i++) {
    memset(&burst[i], 0, sizeof(burst[i]));
    assert_int_equal(osr_store_get(c.st, NULL, before, on_binding, &burst[i]), 0);
  }
  for (i = 0; i < BURST; i++) {
    wait_for(&c.loop, &burst[i].done, 1);
    assert_int_equal(burst[i].status, OSR_EUNAVAILABLE);
    if (burst[i].t1 - t0 > worst)
      worst = burst[i].t1 - t0;
  }
  print_message("postgres down: worst call %.1f ms\n", (double)worst / 1e6);
  /* "Quickly" is ~2 s by the spec; 5 s here only catches a hang, not speed. */
  assert_true(worst < 5000000000ull);

  pg_ctl("start");
  /* The circuit may hold for up to ~500 ms; after that the store reconnects. */
  for (i = 0; i < 50 && !ok; i++) {
    sync_get(&c, NULL, before, &r);
    ok = r.status == 0;
    res_free(&r);
    if (!ok)
      usleep(100000);
  }
  assert_true(ok);
  mk_binding(&b, tenant, "after-restart", 1700000000000);
  sync_create(&c, &b, &r);
  assert_int_equal(r.status, 0);
  assert_int_equal(r.created, 1);
  res_free(&r);
  ctx_close(&c);
}

/* A create on a connection the server closed while it was idle (restart)
 * is replayed on a new connection, not failed: the create's INSERT and
 * COMMIT leave in one flush (store_pg.c pg_query_commit), and once COMMIT
 * is sent a lost connection leaves the outcome unknown, so the dead
 * connection must be noticed before that. One connection, so the create
 * meets the dead one. */
static void test_pg_restart_idle(void **state)
{
  ctx_t c;
  osr_binding_t b;
  res_t r;
  char tenant[40], url[sizeof(g_url) + 16];
  (void)state;

  if (!g_pg || ctl_wfd < 0)
    skip();
  snprintf(url, sizeof(url), "%s%s", g_url, strchr(g_url, '?') ? "&pool=1" : "?pool=1");
  uniq(tenant, sizeof(tenant), "t-idle-");
  assert_int_equal(ctx_open_url(&c, url), 0);
  mk_binding(&b, tenant, NULL, 1700000000000);
  sync_create(&c, &b, &r);
  assert_int_equal(r.status, 0);
  res_free(&r);
  pg_ctl("stop");
  pg_ctl("start");
  mk_binding(&b, tenant, "after-idle-restart", 1700000000000);
  sync_create(&c, &b, &r);
  assert_int_equal(r.status, 0);
  assert_int_equal(r.created, 1);
  res_free(&r);
  sync_get(&c, tenant, b.id, &r);
  assert_int_equal(r.status, 0);
  res_free(&r);
  ctx_close(&c);
}

static void test_pg_outage_at_open(void **state)
{
  ctx_t c;
  res_t r;
  int i, ok = 0;
  (void)state;

  if (!g_pg || ctl_wfd < 0)
    skip();
  /* A gateway started while the database is down gets `unavailable` from
   * open, keeps the store, and works once the database is back. */
  pg_ctl("stop");
  assert_int_equal(ctx_open_url(&c, g_url), OSR_EUNAVAILABLE);
  sync_get(&c, NULL, "bnosuchid00000000000", &r);
  assert_int_equal(r.status, OSR_EUNAVAILABLE);
  pg_ctl("start");
  for (i = 0; i < 50 && !ok; i++) {
    sync_get(&c, NULL, "bnosuchid00000000000", &r);
    ok = r.status == OSR_ENOTFOUND;
    if (!ok)
      usleep(100000);
  }
  assert_true(ok);
  ctx_close(&c);
}

static void test_pg_two_gateways(void **state)
{
  enum { N = 30 };
  ctx_t a;
  osr_store_t *b;
  open2_t o;
  osr_binding_t x[2 * N];
  res_t r[2 * N];
  char tenant[40], url2[1200];
  int i, created = 0;
  (void)state;

  if (!g_pg)
    skip();
  uniq(tenant, sizeof(tenant), "t-2gw-");
  ctx_open(&a);
  memset(&o, 0, sizeof(o));
  /* The second gateway's URL carries our pool size and libpq parameters
   * that replace our defaults. */
  snprintf(url2, sizeof(url2), "%s?pool=3&connect_timeout=5&application_name=osr-test-2"
           "&options=-c%%20statement_timeout%%3D5000", g_url);
  assert_int_equal(osr_store_open(&a.loop, url2, on_open2, &o, &b), 0);
  wait_for(&a.loop, &o.done, 1);
  assert_int_equal(o.status[0], 0);
  for (i = 0; i < 2 * N; i++) {
    mk_binding(&x[i], tenant, "race-key", 1700000000000 + i);
    memset(&r[i], 0, sizeof(r[i]));
    assert_int_equal(osr_store_create_intent(i % 2 ? b : a.st, &x[i], on_binding, &r[i]), 0);
  }
  for (i = 0; i < 2 * N; i++) {
    wait_for(&a.loop, &r[i].done, 1);
    assert_int_equal(r[i].status, 0);
    created += r[i].created;
  }
  assert_int_equal(created, 1);
  for (i = 1; i < 2 * N; i++)
    assert_string_equal(r[i].b.id, r[0].b.id);
  for (i = 0; i < 2 * N; i++)
    res_free(&r[i]);
  osr_store_close(b, NULL, NULL);
  ctx_close(&a);
}

/* One request PostgreSQL rejects (bytes that are not UTF-8) in a burst that
 * shares its group-commit transaction: it alone fails, with OSR_EINVAL; the
 * others are retried on their own and succeed. */
static void test_pg_bad_request_in_batch(void **state)
{
  enum { N = 40 };
  ctx_t c;
  osr_binding_t b[N];
  res_t r[N];
  char tenant[40];
  int i;
  (void)state;

  if (!g_pg)
    skip();
  uniq(tenant, sizeof(tenant), "t-batch-");
  ctx_open(&c);
  for (i = 0; i < N; i++) {
    mk_binding(&b[i], tenant, NULL, 1700000000000 + i);
    if (i == N / 2)
      snprintf(b[i].idem_key, sizeof(b[i].idem_key), "bad-\xff\xfe");
    memset(&r[i], 0, sizeof(r[i]));
    assert_int_equal(osr_store_create_intent(c.st, &b[i], on_binding, &r[i]), 0);
  }
  for (i = 0; i < N; i++) {
    wait_for(&c.loop, &r[i].done, 1);
    if (i == N / 2) {
      assert_int_equal(r[i].status, OSR_EINVAL);
    } else {
      assert_int_equal(r[i].status, 0);
      assert_int_equal(r[i].created, 1);
    }
    res_free(&r[i]);
  }
  for (i = 0; i < N; i++) {
    sync_get(&c, tenant, b[i].id, &r[0]);
    assert_int_equal(r[0].status, i == N / 2 ? OSR_ENOTFOUND : 0);
    res_free(&r[0]);
  }
  ctx_close(&c);
}

/* ---- child sub-commands ----------------------------------------------------------------------- */

static int child_get(const char *url, const char *id)
{
  ctx_t c;
  res_t r;
  int rv;
  snprintf(g_url, sizeof(g_url), "%s", url);
  if (ctx_open_url(&c, url) != 0)
    return 2;
  memset(&r, 0, sizeof(r));
  if (osr_store_get(c.st, NULL, id, on_binding, &r) != 0)
    return 2;
  wait_for(&c.loop, &r.done, 1);
  rv = r.status == 0 ? 0 : r.status == OSR_ENOTFOUND ? 3 : 4;
  res_free(&r);
  ctx_close(&c);
  return rv;
}

static void on_crash_created(int status, const osr_binding_t *b, int created, void *data)
{
  (void)b;
  (void)data;
  if (status == 0 && created == 1)
    raise(SIGKILL);
  _exit(5);
}

static int child_create_crash(const char *url, const char *id)
{
  ctx_t c;
  osr_binding_t b;
  if (ctx_open_url(&c, url) != 0)
    return 2;
  mk_binding(&b, "t-crash", NULL, 1700000000000);
  snprintf(b.id, sizeof(b.id), "%s", id);
  if (osr_store_create_intent(c.st, &b, on_crash_created, NULL) != 0)
    return 2;
  uv_run(&c.loop, UV_RUN_DEFAULT);
  return 6; /* not reached: the callback kills us */
}

/* ---- compare-and-set updates ------------------------------------------------------ */

static void cas_update(ctx_t *c, const osr_binding_t *b, osr_binding_state_t if_state,
                       int64_t if_updated_ms, const osr_audit_event_t *ev, res_t *r)
{
  osr_store_update_opts_t o;
  memset(&o, 0, sizeof(o));
  o.if_state = if_state;
  o.if_updated_ms = if_updated_ms;
  o.audit = ev;
  memset(r, 0, sizeof(*r));
  assert_int_equal(osr_store_update_ex(c->st, b, &o, on_done, r), 0);
  assert_int_equal(r->done, 0);
}

static void mk_event(osr_audit_event_t *ev, const char *tenant, const char *action, const char *id)
{
  memset(ev, 0, sizeof(*ev));
  snprintf(ev->tenant, sizeof(ev->tenant), "%s", tenant);
  snprintf(ev->actor, sizeof(ev->actor), "reaper");
  snprintf(ev->action, sizeof(ev->action), "%s", action);
  snprintf(ev->sandbox_id, sizeof(ev->sandbox_id), "%.*s", (int)sizeof(ev->sandbox_id) - 1, id);
  snprintf(ev->outcome, sizeof(ev->outcome), "ok");
  ev->detail_json = (char *)"{\"resolution\":\"x\"}";
}

/* The reaper race between two gateways on one database: gateway A (the
 * owner, back from a restart) adopts a stale CREATING row while gateway B's
 * reaper fails the same row. Both decided from the same read; both send a
 * compare-and-set on (state creating, updated_ms as read) at once, from two
 * stores (two connections, two worker threads). Exactly one must win each
 * round, the row must show the winner's outcome, and only the winner's
 * audit row may exist. Without the condition both updates would succeed
 * and the last writer would silently overwrite the first. */
static void test_conditional_update_race(void **state)
{
  ctx_t a, b;
  char tenant[40];
  int round, wins_a = 0, wins_b = 0;
  (void)state;

  uniq(tenant, sizeof(tenant), "t-cas-");
  ctx_open(&a);
  ctx_open(&b);
  for (round = 0; round < 20; round++) {
    osr_binding_t row, adopt, fail;
    osr_audit_event_t ev_a, ev_b;
    res_t r, ra, rb;
    mk_binding(&row, tenant, NULL, 1700000000000 + round);
    sync_create(&a, &row, &r);
    assert_int_equal(r.status, 0);
    res_free(&r);

    osr_binding_copy(&adopt, &row);
    adopt.state = OSR_BINDING_RUNNING;
    adopt.updated_ms = row.updated_ms + 1000;
    snprintf(adopt.provider_id, sizeof(adopt.provider_id), "res-%d", round);
    osr_binding_copy(&fail, &row);
    fail.state = OSR_BINDING_FAILED;
    fail.updated_ms = row.updated_ms + 1000;
    fail.ended_ms = fail.updated_ms;
    snprintf(fail.end_reason, sizeof(fail.end_reason), "failed: interrupted");
    mk_event(&ev_a, tenant, "recover.adopt", row.id);
    mk_event(&ev_b, tenant, "reap.stale_creating", row.id);

    /* Alternate who is submitted first so both orders are exercised. */
    if (round % 2 == 0) {
      cas_update(&a, &adopt, OSR_BINDING_CREATING, row.updated_ms, &ev_a, &ra);
      cas_update(&b, &fail, OSR_BINDING_CREATING, row.updated_ms, &ev_b, &rb);
    } else {
      cas_update(&b, &fail, OSR_BINDING_CREATING, row.updated_ms, &ev_b, &rb);
      cas_update(&a, &adopt, OSR_BINDING_CREATING, row.updated_ms, &ev_a, &ra);
    }
    wait_for(&a.loop, &ra.done, 1);
    wait_for(&b.loop, &rb.done, 1);
    assert_true((ra.status == 0) != (rb.status == 0));
    assert_int_equal(ra.status == 0 ? rb.status : ra.status, OSR_ECONFLICT);
    wins_a += ra.status == 0;
    wins_b += rb.status == 0;

    sync_get(&a, NULL, row.id, &r);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.b.state, ra.status == 0 ? OSR_BINDING_RUNNING : OSR_BINDING_FAILED);
    res_free(&r);

    /* A late retry of the loser, or of the winner, changes nothing. */
    cas_update(&b, &fail, OSR_BINDING_CREATING, row.updated_ms, &ev_b, &rb);
    wait_for(&b.loop, &rb.done, 1);
    assert_int_equal(rb.status, OSR_ECONFLICT);
    osr_binding_dispose(&row);
    osr_binding_dispose(&adopt);
    osr_binding_dispose(&fail);
  }
  /* Exactly one audit row per round, and it names the winner. */
  {
    res_t r;
    size_t i;
    int adopts = 0, fails = 0;
    memset(&r, 0, sizeof(r));
    assert_int_equal(osr_store_audit_list(a.st, tenant, NULL, 100, on_audit, &r), 0);
    wait_for(&a.loop, &r.done, 1);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.n, 20);
    for (i = 0; i < r.n; i++) {
      adopts += strcmp(r.evs[i].action, "recover.adopt") == 0;
      fails += strcmp(r.evs[i].action, "reap.stale_creating") == 0;
      assert_string_equal(r.evs[i].detail_json, "{\"resolution\":\"x\"}");
    }
    assert_int_equal(adopts, wins_a);
    assert_int_equal(fails, wins_b);
    res_free(&r);
  }
  ctx_close(&b);
  ctx_close(&a);
}

/* The conditions one by one, on one store. */
static void test_conditional_update(void **state)
{
  ctx_t c;
  char tenant[40];
  osr_binding_t row, u;
  osr_audit_event_t ev;
  res_t r;
  (void)state;

  uniq(tenant, sizeof(tenant), "t-cas1-");
  ctx_open(&c);
  mk_binding(&row, tenant, NULL, 1700000000000);
  sync_create(&c, &row, &r);
  assert_int_equal(r.status, 0);
  res_free(&r);
  osr_binding_copy(&u, &row);
  u.state = OSR_BINDING_RUNNING;
  u.updated_ms = row.updated_ms + 5;
  mk_event(&ev, tenant, "create", row.id);

  /* Wrong state, wrong version: the row exists, so a conflict; no audit. */
  cas_update(&c, &u, OSR_BINDING_RUNNING, 0, &ev, &r);
  wait_for(&c.loop, &r.done, 1);
  assert_int_equal(r.status, OSR_ECONFLICT);
  cas_update(&c, &u, OSR_BINDING_CREATING, row.updated_ms + 1, &ev, &r);
  wait_for(&c.loop, &r.done, 1);
  assert_int_equal(r.status, OSR_ECONFLICT);
  /* Both right: applied, with its audit row. */
  cas_update(&c, &u, OSR_BINDING_CREATING, row.updated_ms, &ev, &r);
  wait_for(&c.loop, &r.done, 1);
  assert_int_equal(r.status, 0);
  /* State only (the create path's form). */
  u.state = OSR_BINDING_ENDED;
  cas_update(&c, &u, OSR_BINDING_RUNNING, 0, NULL, &r);
  wait_for(&c.loop, &r.done, 1);
  assert_int_equal(r.status, 0);
  /* No row at all. */
  uniq(u.id, sizeof(u.id), "b");
  cas_update(&c, &u, OSR_BINDING_CREATING, 0, &ev, &r);
  wait_for(&c.loop, &r.done, 1);
  assert_int_equal(r.status, OSR_ENOTFOUND);
  /* Bad options. */
  {
    osr_store_update_opts_t o;
    memset(&o, 0, sizeof(o));
    o.if_state = (osr_binding_state_t)99;
    assert_int_equal(osr_store_update_ex(c.st, &u, &o, on_done, &r), OSR_EINVAL);
    o.if_state = 0;
    ev.action[0] = '\0';
    o.audit = &ev;
    assert_int_equal(osr_store_update_ex(c.st, &u, &o, on_done, &r), OSR_EINVAL);
  }

  sync_get(&c, NULL, row.id, &r);
  assert_int_equal(r.status, 0);
  assert_int_equal(r.b.state, OSR_BINDING_ENDED);
  res_free(&r);
  memset(&r, 0, sizeof(r));
  assert_int_equal(osr_store_audit_list(c.st, tenant, NULL, 100, on_audit, &r), 0);
  wait_for(&c.loop, &r.done, 1);
  assert_int_equal(r.status, 0);
  assert_int_equal(r.n, 1);
  assert_string_equal(r.evs[0].action, "create");
  assert_string_equal(r.evs[0].sandbox_id, row.id);
  res_free(&r);
  osr_binding_dispose(&row);
  osr_binding_dispose(&u);
  ctx_close(&c);
}

/* Relaxed updates (osr_store_update_opts_t.relaxed) queued in the same loop
 * turn as strict requests: on PostgreSQL the worker splits the batch into a
 * relaxed transaction and a strict one; on SQLite the flag has no effect.
 * Either way every request gets its own right answer: the updates apply with
 * their audit rows, a conflicting one is refused without its audit row, the
 * intents queued beside them are all created. */
static void test_relaxed_update(void **state)
{
  enum { N = 12 };
  ctx_t c;
  char tenant[40];
  osr_binding_t rows[N], fresh[N], u;
  osr_audit_event_t ev;
  osr_store_update_opts_t o;
  res_t r[N], rf[N];
  int i;
  (void)state;

  uniq(tenant, sizeof(tenant), "t-relax-");
  ctx_open(&c);
  for (i = 0; i < N; i++) {
    mk_binding(&rows[i], tenant, NULL, 1700000000000 + i);
    sync_create(&c, &rows[i], &r[0]);
    assert_int_equal(r[0].status, 0);
    res_free(&r[0]);
  }
  /* One loop turn: relaxed updates and strict intents, interleaved. */
  for (i = 0; i < N; i++) {
    osr_binding_copy(&u, &rows[i]);
    u.state = OSR_BINDING_RUNNING;
    u.updated_ms = rows[i].updated_ms + 5;
    mk_event(&ev, tenant, "create", rows[i].id);
    memset(&o, 0, sizeof(o));
    /* The last one asks for the wrong state: refused, no audit row. */
    o.if_state = i == N - 1 ? OSR_BINDING_RUNNING : OSR_BINDING_CREATING;
    o.audit = &ev;
    o.relaxed = 1;
    memset(&r[i], 0, sizeof(r[i]));
    assert_int_equal(osr_store_update_ex(c.st, &u, &o, on_done, &r[i]), 0);
    osr_binding_dispose(&u);
    mk_binding(&fresh[i], tenant, NULL, 1700000001000 + i);
    memset(&rf[i], 0, sizeof(rf[i]));
    assert_int_equal(osr_store_create_intent(c.st, &fresh[i], on_binding, &rf[i]), 0);
  }
  for (i = 0; i < N; i++) {
    wait_for(&c.loop, &r[i].done, 1);
    assert_int_equal(r[i].status, i == N - 1 ? OSR_ECONFLICT : 0);
    wait_for(&c.loop, &rf[i].done, 1);
    assert_int_equal(rf[i].status, 0);
    assert_int_equal(rf[i].created, 1);
    res_free(&rf[i]);
  }
  for (i = 0; i < N; i++) {
    sync_get(&c, tenant, rows[i].id, &r[0]);
    assert_int_equal(r[0].status, 0);
    assert_int_equal(r[0].b.state, i == N - 1 ? OSR_BINDING_CREATING : OSR_BINDING_RUNNING);
    res_free(&r[0]);
    sync_get(&c, tenant, fresh[i].id, &r[0]);
    assert_int_equal(r[0].status, 0);
    assert_int_equal(r[0].b.state, OSR_BINDING_CREATING);
    res_free(&r[0]);
  }
  memset(&r[0], 0, sizeof(r[0]));
  assert_int_equal(osr_store_audit_list(c.st, tenant, NULL, 100, on_audit, &r[0]), 0);
  wait_for(&c.loop, &r[0].done, 1);
  assert_int_equal(r[0].status, 0);
  assert_int_equal(r[0].n, N - 1);
  res_free(&r[0]);
  for (i = 0; i < N; i++) {
    osr_binding_dispose(&rows[i]);
    osr_binding_dispose(&fresh[i]);
  }
  ctx_close(&c);
}

/* How many of the tenant's bindings a metadata filter k=v finds. */
static size_t count_meta(ctx_t *c, const char *tenant, const char *k, const char *v)
{
  osr_store_query_t q;
  const char *keys[] = {k}, *vals[] = {v};
  res_t r;
  size_t n;

  memset(&q, 0, sizeof(q));
  q.tenant = tenant;
  q.meta_keys = keys;
  q.meta_values = vals;
  q.nmeta = 1;
  q.limit = 100;
  sync_list(c, &q, &r);
  assert_int_equal(r.status, 0);
  n = r.n;
  res_free(&r);
  return n;
}

/* Queue a relaxed compare-and-set of u (from state if_state) with an audit
 * row `action` naming u, its outcome `outcome` unless NULL ("ok"); the
 * answer goes to r. */
static void queue_cas(ctx_t *c, const osr_binding_t *u, osr_binding_state_t if_state, const char *action,
                      const char *outcome, const char *detail, res_t *r)
{
  osr_audit_event_t ev;
  osr_store_update_opts_t o;

  mk_event(&ev, u->tenant, action, u->id);
  if (outcome != NULL)
    snprintf(ev.outcome, sizeof(ev.outcome), "%s", outcome);
  if (detail != NULL)
    ev.detail_json = (char *)detail;
  memset(&o, 0, sizeof(o));
  o.if_state = if_state;
  o.audit = &ev;
  o.relaxed = 1;
  memset(r, 0, sizeof(*r));
  assert_int_equal(osr_store_update_ex(c->st, u, &o, on_done, r), 0);
}

/* Wait for answers r[0..n-1], each wanted status want[i] (NULL: all 0). */
static void wait_statuses(ctx_t *c, res_t *r, size_t n, const int *want)
{
  size_t i;
  for (i = 0; i < n; i++) {
    wait_for(&c->loop, &r[i].done, 1);
    assert_int_equal(r[i].status, want != NULL ? want[i] : 0);
  }
}

/* What one loop turn cost in transactions: on PostgreSQL exactly one, in
 * one flush (stats.one_flush), after `s0`. */
static void assert_one_flush(ctx_t *c, const osr_store_stats_t *s0)
{
  osr_store_stats_t s1;
  osr_store_stats(c->st, &s1);
  if (g_pg) {
    assert_int_equal(s1.transactions - s0->transactions, 1);
    assert_int_equal(s1.one_flush - s0->one_flush, 1);
    assert_int_equal(s1.split_batches, s0->split_batches);
  }
}

/* Requests queued in one loop turn run in one transaction; on PostgreSQL
 * the batch's consecutive creates go to the server as one multi-row INSERT
 * and its binding updates as one multi-row UPDATE (store.c, "many rows in
 * one statement"). Every request must still get the answer it gets alone:
 * values with the characters an array literal quotes survive unchanged,
 * creates sharing one Idempotency-Key give one sandbox, a repeated id is a
 * conflict, metadata rows are written, a compare-and-set that loses or
 * finds no row says so without an audit row, a second update of one row in
 * the batch sees the first, and (PostgreSQL, which checks UTF-8) one bad
 * row fails alone. */
#define ODD "q\"b\\s{c},NULL 'x' \xc3\xa9"
static void test_rows_batch(void **state)
{
  /* NU >= 12 (store.c FLUSH_UPDATE_ROWS_MIN): the updates' first run is one
   * multi-row statement on PostgreSQL. */
  enum { NK = 20, ND = 3, NC = NK + ND + 1, NU = 20 };
  ctx_t c;
  char tenant[40];
  osr_binding_t b[NC], u[NU + 1];
  osr_audit_event_t ev;
  osr_store_update_opts_t o;
  osr_store_stats_t s0, s1;
  res_t r[NC], ru[NU + 1];
  int i, created = 0, want_audit = 0;
  (void)state;

  uniq(tenant, sizeof(tenant), "t-rows-");
  ctx_open(&c);
  osr_store_stats(c.st, &s0);
  for (i = 0; i < NC; i++) {
    mk_binding(&b[i], tenant, NULL, 1700000000000 + i);
    if (i < NK) {
      snprintf(b[i].idem_key, sizeof(b[i].idem_key), "k%d-" ODD, i);
      snprintf(b[i].template_id, sizeof(b[i].template_id), "%s", ODD);
      snprintf(b[i].end_reason, sizeof(b[i].end_reason), "%s", i % 2 ? ODD : "");
      b[i].request_json = i % 3 ? osr_xstrdup("{\"t\":\"a\\\"b\\\\c{},\"}") : NULL;
      if (i % 2 == 0) {
        b[i].metadata_json = osr_xstrdup("{\"team\":\"x,y\",\"k\":\"{}\"}");
      }
    } else if (i < NK + ND) {
      snprintf(b[i].idem_key, sizeof(b[i].idem_key), "dup");
    } else {
      snprintf(b[i].id, sizeof(b[i].id), "%s", b[0].id); /* the same id again */
    }
    memset(&r[i], 0, sizeof(r[i]));
    assert_int_equal(osr_store_create_intent(c.st, &b[i], on_binding, &r[i]), 0);
  }
  for (i = 0; i < NC; i++)
    wait_for(&c.loop, &r[i].done, 1);
  /* PostgreSQL wrote them with multi-row statements, none of which failed
   * (a failure would be hidden by the rerun one request at a time, which
   * gives the same answers: the counters tell). SQLite: one row each. */
  osr_store_stats(c.st, &s1);
  assert_int_equal(s1.split_batches, s0.split_batches);
  if (g_pg) {
    assert_true(s1.row_statements > s0.row_statements);
    assert_true(s1.rows - s0.rows >= 2 * (s1.row_statements - s0.row_statements));
  } else {
    assert_int_equal(s1.row_statements, 0);
  }
  for (i = 0; i < NK; i++) {
    assert_int_equal(r[i].status, 0);
    assert_int_equal(r[i].created, 1);
    res_free(&r[i]);
    sync_get(&c, tenant, b[i].id, &r[i]);
    assert_int_equal(r[i].status, 0);
    assert_string_equal(r[i].b.idem_key, b[i].idem_key);
    assert_string_equal(r[i].b.template_id, ODD);
    assert_string_equal(r[i].b.end_reason, b[i].end_reason);
    assert_string_equal(r[i].b.request_hash, b[i].request_hash);
    assert_int_equal(r[i].b.isolation, OSR_ISO_GVISOR);
    assert_int_equal(r[i].b.created_ms, b[i].created_ms);
    assert_int_equal(r[i].b.expires_ms, b[i].expires_ms);
    if (b[i].request_json != NULL)
      assert_string_equal(r[i].b.request_json, b[i].request_json);
    else
      assert_null(r[i].b.request_json);
    res_free(&r[i]);
  }
  for (i = NK; i < NK + ND; i++) {
    assert_int_equal(r[i].status, 0);
    created += r[i].created;
    assert_string_equal(r[i].b.idem_key, "dup");
    assert_string_equal(r[i].b.id, r[NK].b.id);
  }
  assert_int_equal(created, 1);
  assert_string_equal(r[NK].b.id, b[NK].id); /* the first in the batch won */
  for (i = NK; i < NK + ND; i++)
    res_free(&r[i]);
  assert_int_equal(r[NC - 1].status, OSR_ECONFLICT);
  /* The metadata rows were written: a filter finds exactly the even ones. */
  assert_int_equal(count_meta(&c, tenant, "team", "x,y"), (NK + 1) / 2);

  /* One loop turn of updates: 0-5 apply (CAS on creating), 6 asks for the
   * wrong state, 7 names no row, 8 twice (the second sees the first's
   * state), 9 carries bytes that are not UTF-8, 10-19 apply. */
  osr_store_stats(c.st, &s0);
  for (i = 0; i <= NU; i++) {
    int row = i == NU ? 8 : i;
    osr_binding_copy(&u[i], &b[row]);
    u[i].state = OSR_BINDING_RUNNING;
    u[i].updated_ms = b[row].updated_ms + 5;
    snprintf(u[i].provider_id, sizeof(u[i].provider_id), "p-%d-" ODD, i);
    snprintf(u[i].agent_endpoint, sizeof(u[i].agent_endpoint), "http://10.0.0.%d:49983", i);
    osr_freep(&u[i].granted_json);
    u[i].granted_json = osr_xstrdup("{\"vcpus\":1,\"s\":\"" ODD "\"}");
    if (i == 7)
      uniq(u[i].id, sizeof(u[i].id), "b");
    if (i == 9)
      snprintf(u[i].end_reason, sizeof(u[i].end_reason), "bad-\xff\xfe");
    mk_event(&ev, tenant, "create", u[i].id);
    memset(&o, 0, sizeof(o));
    o.if_state = i == 6 ? OSR_BINDING_RUNNING : OSR_BINDING_CREATING;
    o.audit = &ev;
    o.relaxed = 1;
    memset(&ru[i], 0, sizeof(ru[i]));
    assert_int_equal(osr_store_update_ex(c.st, &u[i], &o, on_done, &ru[i]), 0);
  }
  for (i = 0; i <= NU; i++) {
    int want = 0;
    wait_for(&c.loop, &ru[i].done, 1);
    if (i == 6 || i == NU)
      want = OSR_ECONFLICT;
    else if (i == 7)
      want = OSR_ENOTFOUND;
    else if (i == 9 && g_pg)
      want = OSR_EINVAL;
    assert_int_equal(ru[i].status, want);
    want_audit += want == 0;
  }
  osr_store_stats(c.st, &s1);
  if (g_pg) {
    /* The bad row failed the multi-row statement; rerun alone, every other
     * request got its own answer above. */
    assert_true(s1.row_statements > s0.row_statements);
    assert_true(s1.split_batches > s0.split_batches);
  }
  for (i = 0; i < NK; i++) {
    int applied = i != 6 && i != 7 && !(i == 9 && g_pg);
    sync_get(&c, tenant, b[i].id, &r[0]);
    assert_int_equal(r[0].status, 0);
    assert_int_equal(r[0].b.state, applied ? OSR_BINDING_RUNNING : OSR_BINDING_CREATING);
    if (applied) {
      assert_string_equal(r[0].b.provider_id, u[i].provider_id);
      assert_string_equal(r[0].b.agent_endpoint, u[i].agent_endpoint);
      assert_string_equal(r[0].b.granted_json, u[i].granted_json);
      assert_int_equal(r[0].b.updated_ms, u[i].updated_ms);
      assert_string_equal(r[0].b.template_id, ODD); /* untouched by the update */
    }
    res_free(&r[0]);
  }
  memset(&r[0], 0, sizeof(r[0]));
  assert_int_equal(osr_store_audit_list(c.st, tenant, NULL, 100, on_audit, &r[0]), 0);
  wait_for(&c.loop, &r[0].done, 1);
  assert_int_equal(r[0].status, 0);
  assert_int_equal(r[0].n, want_audit);
  res_free(&r[0]);
  for (i = 0; i < NC; i++)
    osr_binding_dispose(&b[i]);
  for (i = 0; i <= NU; i++)
    osr_binding_dispose(&u[i]);
  ctx_close(&c);
}

/* Relaxed binding updates queued in one loop turn, as the create path sends
 * them. On PostgreSQL such a batch is BEGIN, its UPDATE ... RETURNING
 * statements with their audit rows inside, and COMMIT in one flush
 * (store.c "a transaction in one flush"; stats.one_flush counts those
 * transactions), and so is a batch of creates with metadata rows. Each request still gets its own
 * answer: a lost compare-and-set (the second update of one row, which sees
 * the first) is a conflict, an update of no row is not found, neither
 * writes an audit row; two updates (one single-row statement each) and a
 * long run (one multi-row statement, values an array literal quotes) go in
 * one flush too; an audit row PostgreSQL refuses (not UTF-8) fails the
 * flush, and after the rerun one request at a time only its own update is
 * missing, binding and audit row alike. */
static void test_binding_step_one_flush(void **state)
{
  enum { N = 24, NU = 6, NM = 18 /* >= FLUSH_UPDATE_ROWS_MIN */ };
  static const char detail[] = "{\"s\":\"" ODD "\"}";
  ctx_t c;
  char tenant[40], want[64];
  osr_binding_t b[N], u;
  osr_store_stats_t s0, s1;
  res_t r[N], ru[NU], rm[NM];
  int i;
  /* Turn 1: rows 0-3 apply, row 0 again loses, an unknown id. */
  const int row1[NU] = {0, 1, 2, 3, 0, -1};
  const int want1[NU] = {0, 0, 0, 0, OSR_ECONFLICT, OSR_ENOTFOUND};
  const int want3[2] = {0, OSR_EINVAL};
  (void)state;

  uniq(tenant, sizeof(tenant), "t-flush-");
  ctx_open(&c);
  osr_store_stats(c.st, &s0);
  for (i = 0; i < N; i++) {
    mk_binding(&b[i], tenant, NULL, 1700000000000 + i);
    if (i % 2 == 0)
      b[i].metadata_json = osr_xstrdup("{\"team\":\"flush\"}");
    memset(&r[i], 0, sizeof(r[i]));
    assert_int_equal(osr_store_create_intent(c.st, &b[i], on_binding, &r[i]), 0);
  }
  for (i = 0; i < N; i++) {
    wait_for(&c.loop, &r[i].done, 1);
    assert_int_equal(r[i].status, 0);
    assert_int_equal(r[i].created, 1);
    res_free(&r[i]);
  }
  assert_one_flush(&c, &s0);
  assert_int_equal(count_meta(&c, tenant, "team", "flush"), N / 2);

  osr_store_stats(c.st, &s0);
  for (i = 0; i < NU; i++) {
    osr_binding_copy(&u, &b[row1[i] < 0 ? 0 : row1[i]]);
    if (row1[i] < 0)
      uniq(u.id, sizeof(u.id), "b");
    u.state = OSR_BINDING_RUNNING;
    u.updated_ms += 5;
    snprintf(u.provider_id, sizeof(u.provider_id), "res-%d", i);
    queue_cas(&c, &u, OSR_BINDING_CREATING, "create", NULL, NULL, &ru[i]);
    osr_binding_dispose(&u);
  }
  wait_statuses(&c, ru, NU, want1);
  assert_one_flush(&c, &s0);

  /* Turn 2: rows 4 and 5, one single-row statement each. */
  osr_store_stats(c.st, &s0);
  for (i = 0; i < 2; i++) {
    osr_binding_copy(&u, &b[4 + i]);
    u.state = OSR_BINDING_RUNNING;
    u.updated_ms += 5;
    queue_cas(&c, &u, OSR_BINDING_CREATING, "create", NULL, NULL, &ru[i]);
    osr_binding_dispose(&u);
  }
  wait_statuses(&c, ru, 2, NULL);
  assert_one_flush(&c, &s0);

  /* Turn 3: rows 4 and 5 end; row 5's audit row is not UTF-8. */
  osr_store_stats(c.st, &s0);
  for (i = 0; i < 2; i++) {
    osr_binding_copy(&u, &b[4 + i]);
    u.state = OSR_BINDING_ENDED;
    u.updated_ms += 10;
    u.ended_ms = u.updated_ms;
    queue_cas(&c, &u, OSR_BINDING_RUNNING, "delete", i == 1 ? "bad-\xff\xfe" : NULL, NULL, &ru[i]);
    osr_binding_dispose(&u);
  }
  wait_statuses(&c, ru, 2, g_pg ? want3 : NULL);
  osr_store_stats(c.st, &s1);
  if (g_pg)
    assert_int_equal(s1.split_batches - s0.split_batches, 1);

  /* Turn 4: NM updates of distinct rows, one multi-row statement. */
  osr_store_stats(c.st, &s0);
  for (i = 0; i < NM; i++) {
    osr_binding_copy(&u, &b[N - NM + i]);
    u.state = OSR_BINDING_RUNNING;
    u.updated_ms += 5;
    snprintf(u.provider_id, sizeof(u.provider_id), "m-%d-" ODD, i);
    queue_cas(&c, &u, OSR_BINDING_CREATING, "create", NULL, detail, &rm[i]);
    osr_binding_dispose(&u);
  }
  wait_statuses(&c, rm, NM, NULL);
  assert_one_flush(&c, &s0);
  osr_store_stats(c.st, &s1);
  if (g_pg) {
    assert_int_equal(s1.row_statements - s0.row_statements, 1);
    assert_int_equal(s1.rows - s0.rows, NM);
  }

  for (i = 0; i < N; i++) {
    int st = i < 4 || i >= N - NM || (i == 5 && g_pg) ? OSR_BINDING_RUNNING : OSR_BINDING_ENDED;
    sync_get(&c, tenant, b[i].id, &r[0]);
    assert_int_equal(r[0].status, 0);
    assert_int_equal(r[0].b.state, st);
    if (i < 4) {
      snprintf(want, sizeof(want), "res-%d", i);
      assert_string_equal(r[0].b.provider_id, want); /* the first update, not the lost one */
    } else if (i >= N - NM) {
      snprintf(want, sizeof(want), "m-%d-" ODD, i - (N - NM));
      assert_string_equal(r[0].b.provider_id, want);
    }
    res_free(&r[0]);
  }
  /* Audit: 4 + 2 + 2 + NM rows, less the refused one on PostgreSQL, in
   * request order (the list is newest first). */
  memset(&r[0], 0, sizeof(r[0]));
  assert_int_equal(osr_store_audit_list(c.st, tenant, NULL, 100, on_audit, &r[0]), 0);
  wait_for(&c.loop, &r[0].done, 1);
  assert_int_equal(r[0].status, 0);
  assert_int_equal(r[0].n, (g_pg ? 7 : 8) + NM);
  for (i = 0; i < 4; i++)
    assert_string_equal(r[0].evs[r[0].n - 1 - (size_t)i].sandbox_id, b[i].id);
  for (i = 0; i < NM; i++) {
    assert_string_equal(r[0].evs[NM - 1 - i].sandbox_id, b[N - NM + i].id);
    assert_string_equal(r[0].evs[NM - 1 - i].detail_json, detail);
  }
  assert_string_equal(r[0].evs[NM].sandbox_id, b[g_pg ? 4 : 5].id);
  assert_string_equal(r[0].evs[NM].action, "delete");
  res_free(&r[0]);
  for (i = 0; i < N; i++)
    osr_binding_dispose(&b[i]);
  ctx_close(&c);
}

/* Background reads (osr_store_query_t.background, counts) run on a worker
 * and connection of their own: with the foreground writer stuck behind
 * another client's lock (PostgreSQL: an uncommitted row with the same
 * (tenant, key), one foreground worker; SQLite: another connection's write
 * transaction), a background list page and a count are still answered,
 * and the create completes once the lock goes. */
static void test_background_reads(void **state)
{
  ctx_t c;
  char tenant[40], url[1100], sql[512];
  osr_binding_t b, seed;
  osr_store_query_t q;
  res_t rc, rl, rs;
  counts_t cnt;
  PGconn *pg = NULL;
  sqlite3 *lite = NULL;
  (void)state;

  uniq(tenant, sizeof(tenant), "t-bg-");
  /* One foreground worker, so only the background lane can answer. */
  snprintf(url, sizeof(url), "%s%s", g_url, g_pg ? (strchr(g_url, '?') ? "&pool=1" : "?pool=1") : "");
  assert_int_equal(ctx_open_url(&c, url), 0);
  mk_binding(&seed, tenant, NULL, 1700000000000);
  sync_create(&c, &seed, &rc);
  assert_int_equal(rc.status, 0);
  res_free(&rc);

  mk_binding(&b, tenant, "held", 1700000000001);
  if (g_pg) {
    pg = PQconnectdb(g_url);
    assert_int_equal(PQstatus(pg), CONNECTION_OK);
    PQclear(PQexec(pg, "BEGIN"));
    snprintf(sql, sizeof(sql),
             "INSERT INTO bindings (id, tenant, idem_key, state, created_ms, updated_ms) VALUES "
             "('lock%s', '%s', 'held', 1, 1, 1)", tenant + 5, tenant);
    PGresult *res = PQexec(pg, sql);
    assert_int_equal(PQresultStatus(res), PGRES_COMMAND_OK);
    PQclear(res);
  } else {
    assert_int_equal(sqlite3_open(g_url + strlen("sqlite:"), &lite), SQLITE_OK);
    assert_int_equal(sqlite3_exec(lite, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
  }
  memset(&rc, 0, sizeof(rc));
  assert_int_equal(osr_store_create_intent(c.st, &b, on_binding, &rc), 0);

  memset(&q, 0, sizeof(q));
  q.tenant = tenant;
  q.limit = 10;
  q.background = 1;
  memset(&rl, 0, sizeof(rl));
  assert_int_equal(osr_store_list(c.st, &q, on_list, &rl), 0);
  memset(&cnt, 0, sizeof(cnt));
  assert_int_equal(osr_store_count_by_state(c.st, tenant, on_counts, &cnt), 0);
  wait_for(&c.loop, &rl.done, 1);
  wait_for(&c.loop, &cnt.done, 1);
  assert_int_equal(rc.done, 0); /* still behind the lock */
  assert_int_equal(rl.status, 0);
  assert_int_equal(rl.n, 1);
  assert_string_equal(rl.items[0].id, seed.id);
  assert_int_equal(cnt.status, 0);
  assert_int_equal(cnt.c[OSR_BINDING_CREATING], 1);

  if (g_pg) {
    PQclear(PQexec(pg, "ROLLBACK"));
    PQfinish(pg);
  } else {
    sqlite3_exec(lite, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(lite);
  }
  wait_for(&c.loop, &rc.done, 1);
  assert_int_equal(rc.status, 0);
  assert_int_equal(rc.created, 1);
  /* A foreground list sees it (the background one reads committed rows). */
  q.background = 0;
  sync_list(&c, &q, &rs);
  assert_int_equal(rs.n, 2);
  res_free(&rs);
  res_free(&rc);
  res_free(&rl);
  osr_binding_dispose(&b);
  osr_binding_dispose(&seed);
  ctx_close(&c);
}

int main(int argc, char **argv)
{
  const char *pg = getenv("OSR_TEST_PG_URL");
  const char *ctl = getenv("OSR_TEST_PG_CTL");
  char dir[] = "/tmp/osr-store-test-XXXXXX";
  int rv;
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_concurrent_open),
    cmocka_unit_test(test_state_names),
    cmocka_unit_test(test_bad_urls),
    cmocka_unit_test(test_bad_args),
    cmocka_unit_test(test_create_get_update),
    cmocka_unit_test(test_conditional_update),
    cmocka_unit_test(test_conditional_update_race),
    cmocka_unit_test(test_relaxed_update),
    cmocka_unit_test(test_rows_batch),
    cmocka_unit_test(test_binding_step_one_flush),
    cmocka_unit_test(test_background_reads),
    cmocka_unit_test(test_idempotency),
    cmocka_unit_test(test_list),
    cmocka_unit_test(test_submit_from_timer),
    cmocka_unit_test(test_touch),
    cmocka_unit_test(test_keys),
    cmocka_unit_test(test_audit),
    cmocka_unit_test(test_close_with_queued_work),
    cmocka_unit_test(test_other_process_sees_commits),
    cmocka_unit_test(test_crash_after_commit),
    cmocka_unit_test(test_sqlite_file_mode),
    cmocka_unit_test(test_sqlite_wal_bounded),
    cmocka_unit_test(test_sqlite_wal_restart_with_reader),
    cmocka_unit_test(test_sqlite_unusable_path),
    cmocka_unit_test(test_pg_two_gateways),
    cmocka_unit_test(test_pg_bad_request_in_batch),
    cmocka_unit_test(test_pg_outage),
    cmocka_unit_test(test_pg_outage_at_open),
    cmocka_unit_test(test_pg_restart_idle),
  };

  g_self = argv[0];
  if (getenv("OSR_TEST_FILTER") != NULL) /* e.g. "test_crash*" while debugging */
    cmocka_set_test_filter(getenv("OSR_TEST_FILTER"));
  if (argc == 4 && strcmp(argv[1], "child-get") == 0)
    return child_get(argv[2], argv[3]);
  if (argc == 4 && strcmp(argv[1], "child-create-crash") == 0)
    return child_create_crash(argv[2], argv[3]);

  if (pg != NULL && *pg != '\0') {
    g_pg = 1;
    snprintf(g_url, sizeof(g_url), "%s", pg);
    if (ctl != NULL && sscanf(ctl, "%d,%d", &ctl_rfd, &ctl_wfd) != 2)
      ctl_rfd = ctl_wfd = -1;
    rv = cmocka_run_group_tests_name("store_postgres", tests, NULL, NULL);
  } else {
    if (mkdtemp(dir) == NULL)
      return 1;
    snprintf(g_url, sizeof(g_url), "sqlite:%s/osr.db", dir);
    rv = cmocka_run_group_tests_name("store_sqlite", tests, NULL, NULL);
    /* Leave nothing behind: the database and its WAL/SHM files. */
    {
      static const char *const sfx[] = {"", "-wal", "-shm"};
      char p[1100];
      size_t i;
      for (i = 0; i < OSR_ARRAY_SIZE(sfx); i++) {
        snprintf(p, sizeof(p), "%s/osr.db%s", dir, sfx[i]);
        unlink(p);
      }
      rmdir(dir);
    }
  }
  return rv;
}
