/*
 * The adapter contract test (docs/adapters.md), run against the `e2b`
 * adapter and an in-process FAKE of E2B's REST API (a scripted OSR HTTP
 * server on loopback, on the same loop; never a mock of the adapter):
 *   - create -> get -> list (paginated with X-Next-Token, our labels only)
 *     -> pause (twice: 409 is done) -> resume -> destroy -> get NOT_FOUND
 *     -> destroy NOT_FOUND;
 *   - the create request E2B gets (templateID mapping, timeout, envVars,
 *     labels and user metadata, secure, X-API-KEY) and the endpoint the
 *     adapter reports: E2B's Host form or sandbox_url, with E2B's token
 *     sealed so that only the sandbox's agent token opens it;
 *   - every callback exactly once, never inside the call; bad arguments
 *     return an error and no callback; many concurrent creates;
 *   - close with operations in flight: each fails OSR_ECANCELED, then the
 *     close callback;
 *   - failure mapping: 429, 401, 400, 500, 503, 507, a refused connection,
 *     no answer in timeout_ms, no agent token; configuration errors name
 *     the key; an honest manifest;
 *   - adopt() (crash recovery): the endpoint sealed from E2B's SandboxDetail
 *     opens to what create sealed; another sandbox's label is NOT_FOUND.
 * The end-to-end passthrough (data plane + real SDK) is
 * tests/integration/e2b/test_e2b_provider.py.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/http.h"
#include "contract.h"
#include "osr/adapter.h"
#include "token/token.h"
#include "util/mem.h"


/* ---- the fake E2B ----------------------------------------------------------- */

#define FAKE_KEY  "e2b_unit_key_0123"
#define FAKE_MAX  128
#define FAKE_PAGE 2

typedef struct fake_sbx_s {
  char id[32];
  json_t *metadata;
  int paused;
  int live;
} fake_sbx_t;

static struct {
  osr_http_server_t *srv;
  int port;
  int create_status; /* 0 = 201, -1 = never answer, else this status */
  int n_create, n_list_pages, n_pause, n_connect, n_delete;
  int notoken; /* GET /sandboxes/{id} answers without envdAccessToken */
  json_t *last_create; /* the last create body */
  char *last_body;     /* the last POST body as sent (osr_free) */
  int in_post_body;    /* fake_request runs again with the body read */
  fake_sbx_t sbx[FAKE_MAX];
  int nsbx;
  osr_http_req_t *hung[16];
  int nhung;
} fake;

static void reply(osr_http_req_t *req, int status, json_t *j, const char *next)
{
  char *s = j != NULL ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  size_t len = s != NULL ? strlen(s) : 0;
  if (next == NULL) {
    assert_int_equal(osr_http_send(req, status, len ? "application/json" : NULL, s, len), 0);
  } else {
    osr_http_header_t h[2] = {{OSR_IOV_LIT("content-type"), OSR_IOV_LIT("application/json")},
                              {OSR_IOV_LIT("x-next-token"), osr_iov(next, strlen(next))}};
    assert_int_equal(osr_http_respond(req, status, h, 2, (int64_t)len), 0);
    osr_iovec_t v = osr_iov(s, len);
    assert_int_equal(osr_http_write(req, &v, 1, 1, NULL, NULL), 0);
  }
  if (s != NULL)
    osr_json_free(s);
}

static void err(osr_http_req_t *req, int status)
{
  reply(req, status, json_pack("{s:i,s:s}", "code", status, "message", "fake says no"), NULL);
}

static fake_sbx_t *find(const char *id, size_t n)
{
  for (int i = 0; i < fake.nsbx; i++)
    if (fake.sbx[i].live && strlen(fake.sbx[i].id) == n && memcmp(fake.sbx[i].id, id, n) == 0)
      return &fake.sbx[i];
  return NULL;
}

static json_t *sandbox_json(const fake_sbx_t *s)
{
  return json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "sandboxID", s->id, "templateID", "tpl", "clientID",
                   "c", "envdVersion", "0.5.7", "envdAccessToken", s->id + 3, "domain",
                   "unit.test");
}

static void keep_body(osr_iovec_t body)
{
  osr_free(fake.last_body);
  fake.last_body = osr_xmalloc(body.len + 1);
  memcpy(fake.last_body, body.base, body.len);
  fake.last_body[body.len] = '\0';
}

static void fake_request(osr_http_req_t *req, void *data);

/* pause and connect: keep the body, then answer as without one. */
static void on_post_body(osr_http_req_t *req, osr_iovec_t body, int status)
{
  assert_int_equal(status, 0);
  keep_body(body);
  fake.in_post_body = 1;
  fake_request(req, NULL);
  fake.in_post_body = 0;
}

static void on_create_body(osr_http_req_t *req, osr_iovec_t body, int status)
{
  assert_int_equal(status, 0);
  keep_body(body);
  json_t *j = json_loadb(body.base, body.len, JSON_ALLOW_NUL, NULL); /* as E2B, \u0000 too */
  assert_non_null(j);
  json_decref(fake.last_create);
  fake.last_create = j;
  if (fake.create_status == -1) {
    assert_true(fake.nhung < 16);
    fake.hung[fake.nhung++] = req;
    return;
  }
  if (fake.create_status != 0) {
    err(req, fake.create_status);
    return;
  }
  assert_true(fake.nsbx < FAKE_MAX);
  fake_sbx_t *s = &fake.sbx[fake.nsbx];
  snprintf(s->id, sizeof(s->id), "sbx%d", fake.nsbx + 1);
  fake.nsbx++;
  s->live = 1;
  s->metadata = json_incref(json_object_get(j, "metadata"));
  reply(req, 201, sandbox_json(s), NULL);
}

static void on_hung_done(osr_http_req_t *req, int status)
{
  (void)status;
  for (int i = 0; i < fake.nhung; i++)
    if (fake.hung[i] == req)
      fake.hung[i] = NULL;
}

static void fake_request(osr_http_req_t *req, void *data)
{
  (void)data;
  const osr_iovec_t *key = osr_http_req_header(req, "x-api-key");
  char path[512];
  snprintf(path, sizeof(path), "%.*s", (int)req->path.len, req->path.base);
  char method[16];
  snprintf(method, sizeof(method), "%.*s", (int)req->method.len, req->method.base);
  if (key == NULL || key->len != strlen(FAKE_KEY) || memcmp(key->base, FAKE_KEY, key->len) != 0) {
    err(req, 401);
    return;
  }
  if (strcmp(method, "POST") == 0 && strcmp(path, "/api/v2/sandboxes") == 0) {
    fake.n_create++;
    req->on_done = on_hung_done;
    assert_int_equal(osr_http_req_read_body(req, 1 << 20, on_create_body), 0);
    return;
  }
  if (strcmp(method, "GET") == 0 && strcmp(path, "/api/v2/sandboxes") == 0) {
    /* The adapter's filter, exactly; pages of FAKE_PAGE, X-Next-Token =
     * the next index. */
    char q[512];
    snprintf(q, sizeof(q), "%.*s", (int)req->query.len, req->query.base);
    assert_non_null(strstr(q, "metadata=osr.dev%2Fmanaged%3Dtrue"));
    int start = 0;
    const char *nt = strstr(q, "nextToken=");
    if (nt != NULL)
      start = atoi(nt + 10);
    fake.n_list_pages++;
    json_t *arr = json_array();
    int i = start, shown = 0;
    for (; i < fake.nsbx && shown < FAKE_PAGE; i++) {
      fake_sbx_t *s = &fake.sbx[i];
      const char *m = json_string_value(json_object_get(s->metadata, "osr.dev/managed"));
      if (!s->live || m == NULL || strcmp(m, "true") != 0)
        continue;
      json_array_append_new(arr, json_pack("{s:s,s:O,s:s,s:i,s:i}", "sandboxID", s->id, "metadata",
                                           s->metadata, "state", s->paused ? "paused" : "running",
                                           "cpuCount", 2, "memoryMB", 512));
      shown++;
    }
    char next[16];
    snprintf(next, sizeof(next), "%d", i);
    reply(req, 200, arr, i < fake.nsbx ? next : NULL);
    return;
  }
  if (strncmp(path, "/api/sandboxes/", 15) == 0) {
    if (strcmp(method, "POST") == 0 && !fake.in_post_body) {
      assert_int_equal(osr_http_req_read_body(req, 1 << 20, on_post_body), 0);
      return;
    }
    const char *id = path + 15;
    size_t n = strcspn(id, "/");
    const char *tail = id + n;
    fake_sbx_t *s = find(id, n);
    if (s == NULL) {
      err(req, 404);
      return;
    }
    if (strcmp(method, "GET") == 0 && tail[0] == '\0') {
      json_t *j = sandbox_json(s);
      json_object_set(j, "metadata", s->metadata);
      json_object_set_new(j, "state", json_string(s->paused ? "paused" : "running"));
      if (fake.notoken)
        json_object_del(j, "envdAccessToken");
      reply(req, 200, j, NULL);
    } else if (strcmp(method, "DELETE") == 0 && tail[0] == '\0') {
      fake.n_delete++;
      s->live = 0;
      reply(req, 204, NULL, NULL);
    } else if (strcmp(method, "POST") == 0 && strcmp(tail, "/pause") == 0) {
      fake.n_pause++;
      if (s->paused) {
        err(req, 409);
        return;
      }
      s->paused = 1;
      reply(req, 204, NULL, NULL);
    } else if (strcmp(method, "POST") == 0 && strcmp(tail, "/connect") == 0) {
      fake.n_connect++;
      int was = s->paused;
      s->paused = 0;
      reply(req, was ? 201 : 200, sandbox_json(s), NULL);
    } else {
      err(req, 404);
    }
    return;
  }
  err(req, 404);
}

static void fake_start(void)
{
  for (int i = 0; i < fake.nsbx; i++)
    json_decref(fake.sbx[i].metadata);
  json_decref(fake.last_create);
  osr_free(fake.last_body);
  memset(&fake, 0, sizeof(fake));
  osr_http_server_opts_t o;
  memset(&o, 0, sizeof(o));
  o.handler.on_request = fake_request;
  osr_http_limits_defaults(&o.limits);
  fake.srv = osr_http_server_new(&loop, &o);
  assert_non_null(fake.srv);
  assert_int_equal(osr_http_server_listen(fake.srv, "127.0.0.1:0", NULL), 0);
  fake.port = osr_http_server_port(fake.srv, 0);
}

static int fake_closed;
static void on_fake_closed(osr_http_server_t *srv, void *data)
{
  (void)srv;
  (void)data;
  fake_closed = 1;
}


static void fake_stop(void)
{
  for (int i = 0; i < fake.nhung; i++)
    if (fake.hung[i] != NULL)
      osr_http_abort(fake.hung[i]);
  fake_closed = 0;
  osr_http_server_close(fake.srv, 0, on_fake_closed, NULL);
  run_until(&fake_closed, 5000);
  assert_int_equal(fake_closed, 1);
  for (int i = 0; i < fake.nsbx; i++)
    json_decref(fake.sbx[i].metadata);
  json_decref(fake.last_create);
  osr_free(fake.last_body);
  memset(&fake, 0, sizeof(fake));
}

/* ---- harness ------------------------------------------------------------------ */

/* The second run of the contract group: every answer goes to the adapter's
 * on_work first (rest.h; list pages are parsed on the thread pool, the rest
 * come back to on_answer on the loop). */
static const char *offload_cfg = "";

static osr_provider_t *e2b_new(const char *extra_json, char *errbuf, size_t errlen, int *rv)
{
  char cfgtext[1024];
  snprintf(cfgtext, sizeof(cfgtext),
           "{\"api_url\": \"http://127.0.0.1:%d/api/\", \"api_key_env\": \"E2B_UNIT_KEY\", "
           "\"templates\": {\"base\": \"osr-base-tpl\"}, \"timeout_ms\": 2000%s%s%s%s}",
           fake.port, extra_json[0] ? ", " : "", extra_json, offload_cfg[0] ? ", " : "",
           offload_cfg);
  json_t *cfg = json_loads(cfgtext, 0, NULL);
  assert_non_null(cfg);
  osr_provider_t *p = osr_xcalloc(1, sizeof(*p));
  p->adapter = osr_adapter_find("e2b");
  assert_non_null(p->adapter);
  p->loop = &loop;
  snprintf(p->name, sizeof(p->name), "e2b-test");
  *rv = p->adapter->init(p, cfg, errbuf, errlen);
  json_decref(cfg);
  if (*rv != 0) {
    osr_free(p);
    return NULL;
  }
  p->adapter->describe(p, &p->info);
  return p;
}

static osr_provider_t *e2b_ok(const char *extra_json)
{
  char e[256] = "";
  int rv;
  osr_provider_t *p = e2b_new(extra_json, e, sizeof(e), &rv);
  if (p == NULL)
    fail_msg("init: %s", e);
  return p;
}

static char agent_tok[65];

static void spec_init(osr_sandbox_spec_t *s, const char *id)
{
  memset(s, 0, sizeof(*s));
  s->sandbox_id = id;
  s->tenant = "tenant-a";
  s->template_id = "base";
  s->isolation = OSR_ISO_FIRECRACKER;
  s->caps.isolation = OSR_ISO_FIRECRACKER;
  s->region = "";
  s->timeout_s = 120;
  static const uint8_t secret[OSR_AGENT_SECRET_LEN] = {7};
  assert_int_equal(osr_agent_token(secret, id, agent_tok), 0);
  s->agent_token = agent_tok;
}

static int do_create_spec(osr_provider_t *p, const osr_sandbox_spec_t *spec, res_t *r)
{
  memset(r, 0, sizeof(*r));
  in_call = 1;
  int rv = p->adapter->create(p, spec, on_create, r);
  in_call = 0;
  return rv;
}

static void create_sync(osr_provider_t *p, const char *id, res_t *r)
{
  osr_sandbox_spec_t spec;
  spec_init(&spec, id);
  assert_int_equal(do_create_spec(p, &spec, r), 0);
  assert_int_equal(r->calls, 0);
  run_until(&r->calls, 10000);
  assert_int_equal(r->calls, 1);
}

#define SIMPLE_SYNC(call, r)                                                                       \
  do {                                                                                             \
    memset((r), 0, sizeof(*(r)));                                                                  \
    in_call = 1;                                                                                   \
    assert_int_equal((call), 0);                                                                   \
    in_call = 0;                                                                                   \
    assert_int_equal((r)->calls, 0);                                                               \
    run_until(&(r)->calls, 10000);                                                                 \
    assert_int_equal((r)->calls, 1);                                                               \
  } while (0)

/* Open the sealed part of an endpoint with the agent token of `sid`. */
static void open_endpoint(const char *ep, const char *sid, char *plain, size_t len)
{
  const char *frag = strstr(ep, OSR_UPSTREAM_FRAG);
  assert_non_null(frag);
  frag += strlen(OSR_UPSTREAM_FRAG);
  char tok[65];
  static const uint8_t secret[OSR_AGENT_SECRET_LEN] = {7};
  assert_int_equal(osr_agent_token(secret, sid, tok), 0);
  assert_true(osr_upstream_open(tok, sid, frag, strlen(frag), plain, len) > 0);
}

/* ---- request bodies ------------------------------------------------------------ */

/* The create body as e2b_create built it before util/jsonw: json_pack +
 * json_dumps(JSON_COMPACT), kept as the reference for the bytes E2B gets. */
static char *old_create_body(const osr_sandbox_spec_t *spec, const char *template_id, uint32_t ttl)
{
  json_t *meta = json_object();
  const char *k;
  json_t *v;
  if (json_is_object(spec->metadata))
    json_object_foreach((json_t *)spec->metadata, k, v)
    {
      if (json_is_string(v) && strncmp(k, "osr.", 4) != 0)
        json_object_set(meta, k, v);
    }
  json_object_set_new(meta, OSR_LABEL_SANDBOX_ID, json_string(spec->sandbox_id));
  json_object_set_new(meta, OSR_LABEL_TENANT, json_string(spec->tenant));
  json_object_set_new(meta, "osr.dev/managed", json_string("true"));
  json_t *b = json_pack("{s:s,s:I,s:o,s:b,s:b}", "templateID", template_id, "timeout",
                        (json_int_t)ttl, "metadata", meta, "secure", 1, "allow_internet_access", 1);
  assert_non_null(b);
  if (json_is_object(spec->env) && json_object_size(spec->env) > 0)
    json_object_set_new(b, "envVars", json_deep_copy(spec->env));
  char *text = json_dumps(b, JSON_COMPACT);
  json_decref(b);
  assert_non_null(text);
  return text;
}

/* json_dumps(JSON_COMPACT) of `j`, which is released. */
static char *dumps_new(json_t *j)
{
  assert_non_null(j);
  char *text = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  assert_non_null(text);
  return text;
}

/* What the fake received last equals `want` (jansson memory, freed). */
static void assert_last_body(char *want)
{
  assert_non_null(fake.last_body);
  assert_string_equal(fake.last_body, want);
  osr_json_free(want);
}

static void create_and_compare(osr_provider_t *p, osr_sandbox_spec_t *spec, const char *tpl,
                               uint32_t ttl)
{
  res_t c;
  assert_int_equal(do_create_spec(p, spec, &c), 0);
  run_until(&c.calls, 10000);
  assert_int_equal(c.calls, 1);
  assert_int_equal(c.status, 0);
  assert_last_body(old_create_body(spec, tpl, ttl));
}

/* The create body's bytes as json_pack + json_dumps wrote them, for user
 * metadata and env with escapes, UTF-8, NUL bytes, non-string values,
 * OSR's namespace, and without either; an unmapped template. */
static void test_create_body_bytes(void **state)
{
  (void)state;
  fake_start();
  osr_provider_t *p = e2b_ok("");
  osr_sandbox_spec_t spec;
  spec_init(&spec, "osrsbx0000000000000b");
  create_and_compare(p, &spec, "osr-base-tpl", 120); /* no metadata, no env */

  json_t *md = json_pack("{s:s,s:s,s:i,s:s,s:n,s:s}", "quote\"key\\", "v\"a\\l/\n\t\x01\x1f\x7f",
                         "caf\xc3\xa9", "\xe6\x97\xa5\xf0\x9f\x98\x80", "count", 3, "osr.x", "no",
                         "null", "empty", "");
  json_object_set_new(md, "nul", json_stringn("a\0b", 3));
  json_t *env = json_pack("{s:s,s:i,s:{s:[i,b]},s:s}", "PATH", "/bin:/usr/bin", "N", -42, "deep",
                          "x", 1, 1, "Q", "\"\\\b\f\n\r\t");
  json_object_set_new(env, "Z", json_stringn("\0", 1));
#if JANSSON_VERSION_HEX >= 0x020e00
  /* A metadata key holding a NUL byte (jansson 2.14) is cut there, as
   * json_object_set took C strings. (An env key would be sent whole, as
   * \u0000, which the fake's jansson refuses to parse.) */
  json_object_setn_new(md, "m\0m", 3, json_string("w"));
#endif
  spec.metadata = md;
  spec.env = env;
  spec.template_id = "custom \"tpl\"";
  spec.timeout_s = 0; /* E2B's default: 300 */
  spec.tenant = "t\xc3\xa9nant";
  create_and_compare(p, &spec, "custom \"tpl\"", 300);

  json_t *empty = json_object();
  spec.env = empty; /* an empty env: no envVars */
  spec.template_id = NULL;
  create_and_compare(p, &spec, "osr-base-tpl", 300);
  json_decref(empty);
  json_decref(env);
  json_decref(md);

  adapter_free(p);
  fake_stop();
  assert_int_equal(sync_calls, 0);
}

/* ---- the contract ---------------------------------------------------------------- */

static void test_contract_lifecycle(void **state)
{
  (void)state;
  fake_start();
  osr_provider_t *p = e2b_ok("");
  res_t c, g, l, d, pz, rs;
  osr_sandbox_spec_t spec;
  spec_init(&spec, "osrsbx00000000000001");
  json_t *env = json_pack("{s:s}", "A", "1");
  json_t *md =
      json_pack("{s:s,s:s,s:s}", "team", "ml", "osr.e2b", "{}", "osr.dev/tenant", "forged");
  spec.env = env;
  spec.metadata = md;
  assert_int_equal(do_create_spec(p, &spec, &c), 0);
  assert_int_equal(c.calls, 0);
  run_until(&c.calls, 10000);
  assert_int_equal(c.calls, 1);
  assert_int_equal(c.status, 0);
  assert_last_body(old_create_body(&spec, "osr-base-tpl", 120));
  json_decref(env);
  json_decref(md);

  /* What E2B was asked. */
  json_t *b = fake.last_create;
  assert_string_equal(json_string_value(json_object_get(b, "templateID")), "osr-base-tpl");
  assert_int_equal(json_integer_value(json_object_get(b, "timeout")), 120);
  assert_true(json_is_true(json_object_get(b, "secure")));
  assert_string_equal(json_string_value(json_object_get(json_object_get(b, "envVars"), "A")), "1");
  json_t *m = json_object_get(b, "metadata");
  assert_string_equal(json_string_value(json_object_get(m, OSR_LABEL_SANDBOX_ID)),
                      "osrsbx00000000000001");
  assert_string_equal(json_string_value(json_object_get(m, OSR_LABEL_TENANT)), "tenant-a");
  assert_string_equal(json_string_value(json_object_get(m, "osr.dev/managed")), "true");
  assert_string_equal(json_string_value(json_object_get(m, "team")), "ml");
  assert_null(json_object_get(m, "osr.e2b")); /* OSR's namespace is not forwarded */
  assert_int_equal(json_object_size(m), 4);

  /* What OSR gets: E2B's Host form with the token sealed for this sandbox. */
  assert_string_equal(c.res.provider_id, "sbx1");
  assert_string_equal(c.res.sandbox_id, "osrsbx00000000000001");
  assert_int_equal(c.res.isolation, OSR_ISO_FIRECRACKER);
  assert_int_equal(c.res.state, OSR_RES_RUNNING);
  assert_int_equal(c.res.granted.vcpus, 2);
  assert_int_equal(c.res.granted.min_memory_mib, 512);
  assert_int_equal(strncmp(c.res.agent_endpoint, "https://49983-sbx1.unit.test#osr-up=", 36), 0);
  assert_null(strstr(c.res.agent_endpoint, "envd"));
  char plain[OSR_UPSTREAM_PLAIN_MAX + 1];
  open_endpoint(c.res.agent_endpoint, "osrsbx00000000000001", plain, sizeof(plain));
  assert_string_equal(plain, "v1\nsbx1.unit.test\n1\n"); /* the fake's token is the id's tail */

  SIMPLE_SYNC(p->adapter->get(p, "sbx1", on_create, &g), &g);
  assert_int_equal(g.status, 0);
  assert_string_equal(g.res.sandbox_id, "osrsbx00000000000001");

  /* Five more (one unlabelled, as a sandbox made outside OSR with our
   * managed marker would be): list pages through them all. */
  for (int i = 2; i <= 6; i++) {
    char id[32];
    snprintf(id, sizeof(id), "osrsbx0000000000000%d", i);
    res_t x;
    create_sync(p, id, &x);
    assert_int_equal(x.status, 0);
  }
  json_object_del(fake.sbx[3].metadata, OSR_LABEL_SANDBOX_ID); /* sbx4 */
  SIMPLE_SYNC(p->adapter->list(p, on_list, &l), &l);
  assert_int_equal(l.status, 0);
  assert_int_equal(l.n, 5);
  assert_true(fake.n_list_pages >= 3);
  for (size_t i = 0; i < l.n; i++) {
    assert_string_not_equal(l.list[i].provider_id, "sbx4");
    assert_int_equal(strncmp(l.list[i].sandbox_id, "osrsbx", 6), 0);
  }
  /* list_page: the same five, one E2B page per call, X-Next-Token as the
   * cursor. */
  int pages_before = fake.n_list_pages, pages = 0;
  size_t total = 0;
  page_t pg = {.prefix = NULL};
  char cursor[512] = "";
  assert_int_equal(p->adapter->list_page(p, NULL, 0, on_page, &pg), OSR_EINVAL);
  do {
    SIMPLE_SYNC(p->adapter->list_page(p, cursor[0] ? cursor : NULL, 100, on_page, &pg), &pg.r);
    assert_int_equal(pg.r.status, 0);
    assert_int_equal(pg.nids, pg.n);
    for (size_t i = 0; i < pg.nids; i++)
      assert_string_not_equal(pg.provider_ids[i], "sbx4");
    total += pg.n;
    pages++;
    snprintf(cursor, sizeof(cursor), "%s", pg.next);
    assert_true(pages < 100);
  } while (pg.has_next);
  assert_int_equal(total, 5);
  assert_int_equal(fake.n_list_pages - pages_before, pages);
  assert_true(pages >= 3);

  SIMPLE_SYNC(p->adapter->pause(p, "sbx1", on_done, &pz), &pz);
  assert_int_equal(pz.status, 0);
  assert_last_body(dumps_new(json_object()));
  SIMPLE_SYNC(p->adapter->pause(p, "sbx1", on_done, &pz), &pz);
  assert_int_equal(pz.status, 0); /* E2B's 409: already paused */
  assert_int_equal(fake.n_pause, 2);
  SIMPLE_SYNC(p->adapter->list(p, on_list, &l), &l);
  int seen_paused = 0;
  for (size_t i = 0; i < l.n; i++)
    if (strcmp(l.list[i].provider_id, "sbx1") == 0)
      seen_paused = l.list[i].state == OSR_RES_PAUSED;
  assert_true(seen_paused);
  SIMPLE_SYNC(p->adapter->resume(p, "sbx1", on_create, &rs), &rs);
  assert_int_equal(rs.status, 0);
  assert_string_equal(rs.res.provider_id, "sbx1");
  assert_string_equal(rs.res.agent_endpoint, ""); /* the binding keeps the sealed one */
  assert_int_equal(fake.n_connect, 1);
  assert_last_body(dumps_new(json_pack("{s:I}", "timeout", (json_int_t)300)));

  SIMPLE_SYNC(p->adapter->destroy(p, "sbx1", on_done, &d), &d);
  assert_int_equal(d.status, 0);
  SIMPLE_SYNC(p->adapter->get(p, "sbx1", on_create, &g), &g);
  assert_int_equal(g.status, OSR_PERR_NOT_FOUND);
  SIMPLE_SYNC(p->adapter->destroy(p, "sbx1", on_done, &d), &d);
  assert_int_equal(d.status, OSR_PERR_NOT_FOUND);
  /* An id that cannot be E2B's never reaches the wire. */
  int before = fake.n_delete;
  SIMPLE_SYNC(p->adapter->destroy(p, "../etc", on_done, &d), &d);
  assert_int_equal(d.status, OSR_PERR_NOT_FOUND);
  assert_int_equal(fake.n_delete, before);

  adapter_free(p);
  fake_stop();
  assert_int_equal(sync_calls, 0);
}

static void test_sandbox_url(void **state)
{
  (void)state;
  fake_start();
  osr_provider_t *p =
      e2b_ok("\"sandbox_url\": \"https://127.0.0.1:9443/\", \"sandbox_timeout_s\": 3600");
  res_t c, rs;
  create_sync(p, "osrsbx0000000000000u", &c);
  assert_int_equal(c.status, 0);
  /* E2B's lifetime: sandbox_timeout_s when longer than the OSR TTL (120). */
  assert_int_equal(json_integer_value(json_object_get(fake.last_create, "timeout")), 3600);
  SIMPLE_SYNC(p->adapter->resume(p, "sbx1", on_create, &rs), &rs);
  assert_int_equal(rs.status, 0);
  assert_last_body(dumps_new(json_pack("{s:I}", "timeout", (json_int_t)3600)));
  assert_int_equal(strncmp(c.res.agent_endpoint, "https://127.0.0.1:9443#osr-up=", 30), 0);
  char plain[OSR_UPSTREAM_PLAIN_MAX + 1];
  open_endpoint(c.res.agent_endpoint, "osrsbx0000000000000u", plain, sizeof(plain));
  assert_string_equal(plain, "v1\nsbx1.unit.test\n1\n");
  adapter_free(p);
  fake_stop();
  assert_int_equal(sync_calls, 0);
}

static void test_contract_bad_args(void **state)
{
  (void)state;
  fake_start();
  osr_provider_t *p = e2b_ok("");
  osr_sandbox_spec_t spec;
  spec_init(&spec, "osrsbx0000000000000b");
  res_t r;
  memset(&r, 0, sizeof(r));
  assert_int_equal(p->adapter->create(p, NULL, on_create, &r), OSR_EINVAL);
  assert_int_equal(p->adapter->create(p, &spec, NULL, &r), OSR_EINVAL);
  spec.sandbox_id = "";
  assert_int_equal(p->adapter->create(p, &spec, on_create, &r), OSR_EINVAL);
  assert_int_equal(p->adapter->destroy(p, NULL, on_done, &r), OSR_EINVAL);
  assert_int_equal(p->adapter->get(p, "x", NULL, &r), OSR_EINVAL);
  assert_int_equal(p->adapter->list(p, NULL, &r), OSR_EINVAL);
  run_until(&r.calls, 50);
  assert_int_equal(r.calls, 0);
  assert_int_equal(fake.n_create, 0);
  adapter_free(p);
  fake_stop();
}

static void test_contract_close_inflight(void **state)
{
  (void)state;
  fake_start();
  fake.create_status = -1; /* E2B never answers the creates */
  osr_provider_t *p = e2b_ok("");
  res_t r[3], l;
  for (int i = 0; i < 3; i++) {
    osr_sandbox_spec_t spec;
    char id[32];
    snprintf(id, sizeof(id), "osrsbx000000000000c%d", i);
    spec_init(&spec, id);
    assert_int_equal(do_create_spec(p, &spec, &r[i]), 0);
  }
  memset(&l, 0, sizeof(l));
  assert_int_equal(p->adapter->list(p, on_list, &l), 0);
  /* Let the requests reach the fake. */
  for (int k = 0; k < 200 && fake.nhung < 3; k++)
    uv_run(&loop, UV_RUN_ONCE);
  assert_int_equal(fake.nhung, 3);
  closed = 0;
  in_call = 1;
  p->adapter->close(p, on_closed);
  res_t late;
  memset(&late, 0, sizeof(late));
  assert_int_equal(p->adapter->list(p, on_list, &late), OSR_ECLOSED);
  in_call = 0;
  run_until(&closed, 5000);
  assert_int_equal(closed, 1);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(r[i].calls, 1);
    assert_int_equal(r[i].status, OSR_ECANCELED);
  }
  assert_int_equal(l.calls, 1);
  assert_true(l.status == OSR_ECANCELED || l.status == 0); /* the list may have finished first */
  assert_int_equal(late.calls, 0);
  osr_free(p);
  fake_stop();
  assert_int_equal(sync_calls, 0);
}

static void test_contract_concurrent(void **state)
{
  (void)state;
  fake_start();
  osr_provider_t *p = e2b_ok("");
  enum { N = 24 };
  static res_t r[N];
  for (int i = 0; i < N; i++) {
    osr_sandbox_spec_t spec;
    char id[32];
    snprintf(id, sizeof(id), "osrsbx00000000000%03d", i);
    spec_init(&spec, id);
    assert_int_equal(do_create_spec(p, &spec, &r[i]), 0);
  }
  int all = 0;
  uint64_t end = uv_now(&loop) + 10000;
  while (!all && uv_now(&loop) < end) {
    run_until(&r[N - 1].calls, 50);
    all = 1;
    for (int i = 0; i < N; i++)
      all &= r[i].calls == 1;
  }
  assert_true(all);
  for (int i = 0; i < N; i++) {
    assert_int_equal(r[i].status, 0);
    for (int j = 0; j < i; j++)
      assert_string_not_equal(r[i].res.provider_id, r[j].res.provider_id);
  }
  adapter_free(p);
  fake_stop();
  assert_int_equal(sync_calls, 0);
}

static void test_failure_mapping(void **state)
{
  (void)state;
  static const struct {
    int http;
    int err;
  } map[] = {{429, OSR_PERR_RATE_LIMITED}, {400, OSR_PERR_INVALID},     {422, OSR_PERR_INVALID},
             {500, OSR_PERR_UNAVAILABLE},  {503, OSR_PERR_UNAVAILABLE}, {507, OSR_PERR_CAPACITY},
             {403, OSR_PERR_AUTH}};
  fake_start();
  osr_provider_t *p = e2b_ok("");
  for (size_t i = 0; i < OSR_ARRAY_SIZE(map); i++) {
    fake.create_status = map[i].http;
    res_t c;
    create_sync(p, "osrsbx0000000000000f", &c);
    assert_int_equal(c.status, map[i].err);
  }
  adapter_free(p);

  /* A wrong key: the fake's 401 -> auth, never retryable. */
  fake.create_status = 0;
  setenv("E2B_UNIT_KEY", "e2b_wrong", 1);
  p = e2b_ok("");
  res_t c;
  create_sync(p, "osrsbx0000000000000w", &c);
  assert_int_equal(c.status, OSR_PERR_AUTH);
  assert_false(osr_provider_err_retryable(c.status));
  adapter_free(p);
  setenv("E2B_UNIT_KEY", FAKE_KEY, 1);

  /* No agent token: cannot seal, so no request at all; another provider may. */
  p = e2b_ok("");
  osr_sandbox_spec_t spec;
  spec_init(&spec, "osrsbx0000000000000n");
  spec.agent_token = NULL;
  int before = fake.n_create;
  assert_int_equal(do_create_spec(p, &spec, &c), 0);
  run_until(&c.calls, 5000);
  assert_int_equal(c.calls, 1);
  assert_int_equal(c.status, OSR_PERR_UNAVAILABLE);
  assert_int_equal(fake.n_create, before);
  /* A class E2B does not have is not silently downgraded. */
  spec_init(&spec, "osrsbx0000000000000i");
  spec.isolation = OSR_ISO_GVISOR;
  assert_int_equal(do_create_spec(p, &spec, &c), 0);
  run_until(&c.calls, 5000);
  assert_int_equal(c.status, OSR_PERR_INVALID);
  adapter_free(p);

  /* No answer within timeout_ms. */
  fake.create_status = -1;
  p = e2b_ok("\"timeout_ms\": 200");
  create_sync(p, "osrsbx0000000000000t", &c);
  assert_int_equal(c.status, OSR_PERR_TIMEOUT);
  adapter_free(p);
  fake_stop();

  /* Connection refused: the fake is gone. */
  fake.port = 1; /* nothing listens on port 1 */
  p = e2b_ok("");
  create_sync(p, "osrsbx0000000000000r", &c);
  assert_int_equal(c.status, OSR_PERR_UNAVAILABLE);
  res_t l;
  SIMPLE_SYNC(p->adapter->list(p, on_list, &l), &l);
  assert_int_equal(l.status, OSR_PERR_UNAVAILABLE);
  adapter_free(p);
  assert_int_equal(sync_calls, 0);
}

static void test_config_errors(void **state)
{
  (void)state;
  static const struct {
    const char *json;
    const char *key;
  } bad[] = {
      {"{\"api_url\": \"http://127.0.0.1:1\"}", "api_key"},
      {"{\"api_key_env\": \"E2B_UNIT_UNSET_VAR\"}", "api_key_env"},
      {"{\"api_key_file\": \"/nonexistent/e2b.key\"}", "api_key_file"},
      {"{\"api_key_env\": \"E2B_UNIT_KEY\", \"api_url\": \"ftp://x\"}", "api_url"},
      {"{\"api_key_env\": \"E2B_UNIT_KEY\", \"sandbox_url\": \"https://h/path\"}", "sandbox_url"},
      {"{\"api_key_env\": \"E2B_UNIT_KEY\", \"domain\": \"a b\"}", "domain"},
      {"{\"api_key_env\": \"E2B_UNIT_KEY\", \"templates\": {\"a\": 1}}", "templates"},
      {"{\"api_key_env\": \"E2B_UNIT_KEY\", \"apikey\": \"x\"}", "apikey"},
      {"{\"api_key_env\": \"E2B_UNIT_KEY\", \"api_key\": \"x\"}", "api_key"},
      {"{\"api_key_env\": \"E2B_UNIT_KEY\", \"offload_bytes\": -1}", "offload_bytes"},
  };
  for (size_t i = 0; i < OSR_ARRAY_SIZE(bad); i++) {
    json_t *cfg = json_loads(bad[i].json, 0, NULL);
    assert_non_null(cfg);
    osr_provider_t p;
    memset(&p, 0, sizeof(p));
    p.adapter = osr_adapter_find("e2b");
    p.loop = &loop;
    char e[256] = "";
    assert_int_equal(p.adapter->init(&p, cfg, e, sizeof(e)), OSR_EINVAL);
    char want[64];
    snprintf(want, sizeof(want), "key '%s'", bad[i].key);
    if (strstr(e, want) == NULL)
      fail_msg("%s: error '%s' does not name %s", bad[i].json, e, want);
    assert_null(strstr(e, FAKE_KEY)); /* the key is never echoed */
    json_decref(cfg);
  }
}

static void test_honest_manifest(void **state)
{
  (void)state;
  fake_start();
  osr_provider_t *p = e2b_ok("\"vcpus\": 4, \"memory_mib\": 2048, \"regions\": [\"us-west\"]");
  const osr_provider_info_t *in = &p->info;
  assert_int_equal(in->isolation_mask, 1u << OSR_ISO_FIRECRACKER);
  assert_int_equal(in->gpu_max, 0);
  assert_int_equal(in->snapshot, 0);
  assert_int_equal(in->pause, 1);
  assert_int_equal(in->max_vcpus, 4);
  assert_int_equal(in->max_memory_mib, 2048);
  assert_string_equal(in->regions[0], "us-west");
  assert_null(in->regions[1]);
  assert_true(in->price_vcpu_per_s > 0.000013 && in->price_vcpu_per_s < 0.000015);
  assert_true(in->price_gib_per_s > 0.0000044 && in->price_gib_per_s < 0.0000046);
  adapter_free(p);
  fake_stop();
}

/* Crash recovery's adopt(): list() carries no endpoint (ListedSandbox has
 * no envdAccessToken), so adopt fetches the detail and seals an endpoint
 * that opens, with the sandbox's agent token, to what create sealed. */
static void test_adopt(void **state)
{
  (void)state;
  fake_start();
  osr_provider_t *p = e2b_ok("");
  res_t c, l, a;
  create_sync(p, "osrsbx00000000000011", &c);
  assert_int_equal(c.status, 0);
  char tok[65];
  memcpy(tok, agent_tok, sizeof(tok)); /* spec_init derived it for ...11 */
  SIMPLE_SYNC(p->adapter->list(p, on_list, &l), &l);
  assert_int_equal(l.status, 0);
  assert_int_equal(l.n, 1);
  assert_string_equal(l.list[0].agent_endpoint, "");

  SIMPLE_SYNC(p->adapter->adopt(p, l.list[0].provider_id, "osrsbx00000000000011", tok, on_create,
                                &a),
              &a);
  assert_int_equal(a.status, 0);
  assert_string_equal(a.res.provider_id, c.res.provider_id);
  assert_string_equal(a.res.sandbox_id, "osrsbx00000000000011");
  assert_int_equal(a.res.state, OSR_RES_RUNNING);
  char p1[OSR_UPSTREAM_PLAIN_MAX + 1], p2[OSR_UPSTREAM_PLAIN_MAX + 1];
  open_endpoint(c.res.agent_endpoint, "osrsbx00000000000011", p1, sizeof(p1));
  open_endpoint(a.res.agent_endpoint, "osrsbx00000000000011", p2, sizeof(p2));
  assert_string_equal(p1, p2);
  assert_int_equal(strncmp(a.res.agent_endpoint, "https://49983-", 14), 0);
  /* Paused: still adoptable, reported paused. */
  fake.sbx[fake.nsbx - 1].paused = 1;
  SIMPLE_SYNC(p->adapter->adopt(p, c.res.provider_id, "osrsbx00000000000011", tok, on_create, &a),
              &a);
  assert_int_equal(a.status, 0);
  assert_int_equal(a.res.state, OSR_RES_PAUSED);
  /* Still starting (no envd token yet): not adoptable now, not gone. */
  fake.notoken = 1;
  SIMPLE_SYNC(p->adapter->adopt(p, c.res.provider_id, "osrsbx00000000000011", tok, on_create, &a),
              &a);
  assert_int_equal(a.status, OSR_PERR_UNAVAILABLE);
  fake.notoken = 0;
  /* The label names another OSR sandbox: not this one's to adopt. */
  SIMPLE_SYNC(p->adapter->adopt(p, c.res.provider_id, "osrsbx00000000000099", tok, on_create, &a),
              &a);
  assert_int_equal(a.status, OSR_PERR_NOT_FOUND);
  /* Gone at E2B, or an id that cannot be E2B's. */
  SIMPLE_SYNC(p->adapter->adopt(p, "sbx999", "osrsbx00000000000011", tok, on_create, &a), &a);
  assert_int_equal(a.status, OSR_PERR_NOT_FOUND);
  SIMPLE_SYNC(p->adapter->adopt(p, "../x", "osrsbx00000000000011", tok, on_create, &a), &a);
  assert_int_equal(a.status, OSR_PERR_NOT_FOUND);
  /* Bad arguments: an error and no callback. */
  memset(&a, 0, sizeof(a));
  assert_int_equal(p->adapter->adopt(p, c.res.provider_id, "osrsbx00000000000011", "short",
                                     on_create, &a),
                   OSR_EINVAL);
  assert_int_equal(p->adapter->adopt(p, c.res.provider_id, "", tok, on_create, &a), OSR_EINVAL);
  assert_int_equal(p->adapter->adopt(p, c.res.provider_id, "osrsbx00000000000011", tok, NULL, &a),
                   OSR_EINVAL);
  run_until(&a.calls, 50);
  assert_int_equal(a.calls, 0);
  adapter_free(p);
  fake_stop();
  assert_int_equal(sync_calls, 0);
}

int main(void)
{
  uv_loop_init(&loop);
  setenv("E2B_UNIT_KEY", FAKE_KEY, 1);
  unsetenv("E2B_UNIT_UNSET_VAR");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_contract_lifecycle),
    cmocka_unit_test(test_create_body_bytes),  cmocka_unit_test(test_sandbox_url),
      cmocka_unit_test(test_contract_bad_args),   cmocka_unit_test(test_contract_close_inflight),
      cmocka_unit_test(test_contract_concurrent), cmocka_unit_test(test_failure_mapping),
      cmocka_unit_test(test_config_errors),       cmocka_unit_test(test_honest_manifest),
      cmocka_unit_test(test_adopt),
  };
  int rc = cmocka_run_group_tests_name("e2b adapter contract", tests, NULL, NULL);
  const struct CMUnitTest offloaded[] = {
      cmocka_unit_test(test_contract_lifecycle),      cmocka_unit_test(test_contract_close_inflight),
      cmocka_unit_test(test_contract_concurrent),     cmocka_unit_test(test_failure_mapping),
      cmocka_unit_test(test_adopt),
  };
  offload_cfg = "\"offload_bytes\": 0";
  rc |= cmocka_run_group_tests_name("e2b adapter contract, answers off the loop", offloaded, NULL,
                                    NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
  return rc;
}
