/*
 * osr-sim: the SIMULATED sandbox provider as a separate process.
 *
 * It runs the `sim` adapter in-process (adapters/sim.c) behind a small JSON
 * HTTP API, so that "provider resources" outlive the gateway that created
 * them: a gateway killed with -9 in the middle of a create can restart and
 * find what the provider really has, and tests can check the provider's own
 * list. With --state-file the resources also survive osr-sim restarts.
 *
 *   POST   /v1/resources        {sandbox_id, tenant, template, isolation,
 *                               region, caps, labels} -> 201 resource, after
 *                               the configured latency; injected failures ->
 *                               503/429/504/507/401/400 {"error","message"}
 *   GET    /v1/resources        {"resources":[...]}; ?label=KEY or
 *                               ?label=KEY=VALUE filters (osr.dev/sandbox-id,
 *                               osr.dev/tenant); ?limit=N (1..10000) answers
 *                               one page {"resources":[...],"next":ID|null},
 *                               &after=ID (a page's "next") the one after it
 *   GET    /v1/resources/{id}   200 resource | 404
 *   DELETE /v1/resources/{id}   204 | 404
 *   GET    /healthz             {"status":"ok","resources":N}
 *
 * Prints "listening <addr> <port>" per listener, then "ready". SIGTERM or
 * SIGINT: stop accepting, finish in-flight requests, save the state file,
 * exit 0.
 *
 * The state file is rewritten (temporary file + rename, on the thread pool:
 * the loop never blocks on the disk) after changes, at most one write in
 * flight; changes during a write are picked up by the next one.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adapters/sim.h"
#include "net/http.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/text.h"

#define MOD "osr-sim"
#define MAX_BODY (1u << 20)

static uv_loop_t *loop;
static osr_http_server_t *server;
static uv_signal_t sig_term, sig_int;
static osr_provider_t prov;
static const char *state_file;
static int state_dirty, state_writing;
static uv_work_t state_work;
static char *state_text; /* the dump being written (jansson memory) */
static char *final_text; /* the dump taken at shutdown */
static int exiting;

/* ---- state file ---------------------------------------------------------- */

static int write_file(const char *path, const char *text)
{
  char tmp[4200];
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (f == NULL)
    return -errno;
  size_t n = strlen(text);
  int bad = fwrite(text, 1, n, f) != n;
  bad |= fflush(f) != 0;
  bad |= fsync(fileno(f)) != 0;
  bad |= fclose(f) != 0;
  if (bad || rename(tmp, path) != 0) {
    unlink(tmp);
    return OSR_EINVAL;
  }
  return 0;
}

static void state_work_cb(uv_work_t *w)
{
  w->data = (void *)(intptr_t)write_file(state_file, state_text);
}

static void save_async(void);

static void state_after_cb(uv_work_t *w, int status)
{
  int rv = (int)(intptr_t)w->data;
  if (status == 0 && rv != 0)
    OSR_LOG_WARN(MOD, "state file %s: write failed", state_file);
  osr_json_free(state_text);
  state_text = NULL;
  state_writing = 0;
  if (state_dirty && !exiting)
    save_async();
}

static void save_async(void)
{
  json_t *a = osr__sim_dump(&prov);
  state_text = json_dumps(a, JSON_COMPACT);
  json_decref(a);
  if (state_text == NULL)
    return;
  state_dirty = 0;
  state_writing = 1;
  if (uv_queue_work(loop, &state_work, state_work_cb, state_after_cb) != 0) {
    osr_json_free(state_text);
    state_text = NULL;
    state_writing = 0;
  }
}

static void on_change(void *data)
{
  (void)data;
  if (state_file == NULL || exiting)
    return;
  state_dirty = 1;
  if (!state_writing)
    save_async();
}

static int load_state(void)
{
  json_error_t jerr;
  FILE *f = fopen(state_file, "r");
  if (f == NULL)
    return errno == ENOENT ? 0 : -1; /* a first start has no file yet */
  json_t *a = json_loadf(f, 0, &jerr);
  fclose(f);
  if (a == NULL) {
    fprintf(stderr, "osr-sim: state file %s: %s (line %d)\n", state_file, jerr.text, jerr.line);
    return -1;
  }
  int rv = osr__sim_restore(&prov, a);
  json_decref(a);
  if (rv != 0)
    fprintf(stderr, "osr-sim: state file %s: not a list of resources\n", state_file);
  return rv;
}

/* ---- HTTP helpers ---------------------------------------------------------- */

static void send_json(osr_http_req_t *req, int status, json_t *j)
{
  char *s = j != NULL ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  if (s == NULL) {
    osr_http_abort(req);
    return;
  }
  osr_http_send(req, status, "application/json", s, strlen(s));
  osr_json_free(s);
}

static void send_error(osr_http_req_t *req, int status, const char *code, const char *msg)
{
  send_json(req, status, json_pack("{s:s,s:s}", "error", code, "message", msg));
}

static int http_status_of(int err)
{
  switch (err) {
  case OSR_PERR_CAPACITY:
    return 507;
  case OSR_PERR_RATE_LIMITED:
    return 429;
  case OSR_PERR_TIMEOUT:
    return 504;
  case OSR_PERR_AUTH:
    return 401;
  case OSR_PERR_INVALID:
    return 400;
  case OSR_PERR_NOT_FOUND:
    return 404;
  case OSR_PERR_UNAVAILABLE:
  case OSR_PERR_BOOT_FAILED:
  case OSR_ECANCELED:
    return 503;
  default:
    return 500;
  }
}

static const char *err_message(int err)
{
  switch (err) {
  case OSR_PERR_CAPACITY:
    return "simulated: no capacity left";
  case OSR_PERR_RATE_LIMITED:
    return "simulated: rate limited";
  case OSR_PERR_TIMEOUT:
    return "simulated: timed out";
  case OSR_PERR_UNAVAILABLE:
    return "simulated: provider unavailable";
  case OSR_PERR_BOOT_FAILED:
    return "simulated: accepted, then failed to boot";
  case OSR_PERR_AUTH:
    return "simulated: credentials rejected";
  case OSR_PERR_INVALID:
    return "simulated: invalid request";
  case OSR_PERR_NOT_FOUND:
    return "no such resource";
  default:
    return osr_strerror(err);
  }
}

static int method_is(const osr_http_req_t *req, const char *m)
{
  size_t n = strlen(m);
  return req->method.len == n && memcmp(req->method.base, m, n) == 0;
}

static int path_is(const osr_http_req_t *req, const char *p)
{
  size_t n = strlen(p);
  return req->path.len == n && memcmp(req->path.base, p, n) == 0;
}

/* ---- routes ----------------------------------------------------------------- */

typedef struct create_ctx_s {
  osr_http_req_t *req; /* NULL once the exchange is over */
  int created;         /* the adapter callback ran */
  int64_t created_ms;  /* wall clock when the create was started */
  char tenant[OSR_NAME_MAX];
} create_ctx_t;

static void create_req_done(osr_http_req_t *req, int status)
{
  create_ctx_t *c = req->data;
  (void)status;
  if (c == NULL)
    return;
  c->req = NULL;
  req->data = NULL;
  if (c->created)
    osr_free(c);
}

static void on_created(osr_provider_t *p, int status, const osr_resource_t *res, void *data)
{
  create_ctx_t *c = data;
  c->created = 1;
  if (c->req == NULL) {
    /* The client went away; the resource (if any) stays, as it would at a
     * real provider. */
    osr_free(c);
    return;
  }
  osr_http_req_t *req = c->req;
  if (status == 0) {
    /* The tenant comes from the request: dumping the whole table to find
     * the stored record made every create O(resources). */
    json_t *j = osr__sim_resource_to_json(res, c->tenant, c->created_ms);
    send_json(req, 201, j);
  } else {
    send_error(req, http_status_of(status), osr_provider_err_name(status), err_message(status));
  }
}

static int parse_caps(const json_t *j, osr_capabilities_t *c)
{
  json_int_t vcpus = 0, mem = 0, gcount = 0;
  const char *gtype = "";
  int snap = 0;
  json_t *ports = NULL;
  if (j == NULL)
    return 0;
  if (json_unpack((json_t *)j, "{s?I,s?I,s?{s?I,s?s},s?b,s?o}", "vcpus", &vcpus, "memoryMiB",
                  &mem, "gpu", "count", &gcount, "type", &gtype, "snapshot", &snap, "ports",
                  &ports) != 0)
    return -1;
  if (vcpus < 0 || vcpus > 1 << 20 || mem < 0 || mem > 1 << 30 || gcount < 0 || gcount > 1024 ||
      strlen(gtype) >= sizeof(c->gpu_type) || (ports != NULL && !json_is_array(ports)) ||
      json_array_size(ports) > OSR_MAX_PORTS)
    return -1;
  c->vcpus = (uint32_t)vcpus;
  c->min_memory_mib = (uint32_t)mem;
  c->gpu_count = (uint32_t)gcount;
  snprintf(c->gpu_type, sizeof(c->gpu_type), "%s", gtype);
  c->snapshot = snap;
  size_t i;
  json_t *v;
  json_array_foreach(ports, i, v)
  {
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65535)
      return -1;
    c->ports[c->nports++] = (uint16_t)json_integer_value(v);
  }
  return 0;
}

static void on_create_body(osr_http_req_t *req, osr_iovec_t body, int status)
{
  json_error_t jerr;
  if (status != 0) {
    if (status == OSR_ETOOLARGE)
      send_error(req, 413, "invalid", "body too large");
    return; /* otherwise the exchange failed; on_done follows */
  }
  json_t *j = json_loadb(body.base != NULL ? body.base : "", body.len, 0, &jerr);
  const char *sid = NULL, *tenant = "", *tmpl = "", *iso = NULL, *region = "";
  json_int_t timeout = 0;
  json_t *caps = NULL;
  if (j == NULL || json_unpack(j, "{s:s,s?s,s?s,s?s,s?s,s?I,s?o}", "sandbox_id", &sid, "tenant",
                               &tenant, "template", &tmpl, "isolation", &iso, "region", &region,
                               "timeout_s", &timeout, "caps", &caps) != 0 ||
      sid[0] == '\0' || strlen(sid) >= OSR_NAME_MAX || strlen(tenant) >= OSR_NAME_MAX ||
      strlen(region) >= OSR_NAME_MAX) {
    json_decref(j);
    send_error(req, 400, "invalid", "want {sandbox_id, tenant, isolation, region, caps}");
    return;
  }
  osr_sandbox_spec_t spec;
  memset(&spec, 0, sizeof(spec));
  spec.sandbox_id = sid;
  spec.tenant = tenant;
  spec.template_id = tmpl;
  spec.isolation = osr_isolation_parse(iso);
  spec.region = region;
  spec.timeout_s = timeout > 0 && timeout < UINT32_MAX ? (uint32_t)timeout : 0;
  if (parse_caps(caps, &spec.caps) != 0) {
    json_decref(j);
    send_error(req, 400, "invalid", "bad caps");
    return;
  }
  snprintf(spec.caps.region, sizeof(spec.caps.region), "%s", region);
  spec.caps.isolation = spec.isolation;

  create_ctx_t *c = osr_xcalloc(1, sizeof(*c));
  c->req = req;
  snprintf(c->tenant, sizeof(c->tenant), "%s", tenant);
  uv_timeval64_t tv;
  c->created_ms = uv_gettimeofday(&tv) == 0 ? (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000 : 0;
  req->data = c;
  req->on_done = create_req_done;
  int rv = prov.adapter->create(&prov, &spec, on_created, c);
  json_decref(j);
  if (rv != 0) {
    req->data = NULL;
    req->on_done = NULL;
    osr_free(c);
    send_error(req, http_status_of(rv == OSR_EINVAL ? OSR_PERR_INVALID : OSR_PERR_UNAVAILABLE),
               rv == OSR_EINVAL ? "invalid" : "unavailable", osr_strerror(rv));
  }
}

static void on_destroyed(osr_provider_t *p, int status, void *data)
{
  create_ctx_t *c = data;
  c->created = 1;
  if (c->req == NULL) {
    osr_free(c);
    return;
  }
  if (status == 0)
    osr_http_send(c->req, 204, NULL, "", 0);
  else
    send_error(c->req, http_status_of(status), osr_provider_err_name(status),
               err_message(status));
}

static int label_match(const json_t *res, const char *want)
{
  json_t *labels = json_object_get(res, "labels");
  const char *eq = strchr(want, '=');
  if (eq == NULL)
    return json_object_get(labels, want) != NULL;
  char key[128];
  size_t kn = (size_t)(eq - want);
  if (kn >= sizeof(key))
    return 0;
  memcpy(key, want, kn);
  key[kn] = '\0';
  const char *v = json_string_value(json_object_get(labels, key));
  return v != NULL && strcmp(v, eq + 1) == 0;
}

/* Query parameter `name`=... of the list request into out; 1 if present,
 * -1 if it does not decode into out. */
static int query_param(const osr_http_req_t *req, const char *name, char *out, size_t outlen)
{
  const char *q = req->query.base;
  size_t qn = req->query.len, nn = strlen(name), i = 0;
  while (i < qn) {
    size_t j = i;
    while (j < qn && q[j] != '&')
      j++;
    if (j - i > nn && memcmp(q + i, name, nn) == 0 && q[i + nn] == '=')
      return osr_pct_decode(q + i + nn + 1, j - i - nn - 1, out, outlen) < 0 ? -1 : 1;
    i = j + 1;
  }
  return 0;
}

static void route_list(osr_http_req_t *req)
{
  /* label filters; limit (1..10000) asks for one page, after= (the "next"
   * of the page before) for the page that follows. */
  char label[256] = "", after[128] = "", lim[16] = "";
  if (query_param(req, "label", label, sizeof(label)) < 0) {
    send_error(req, 400, "invalid", "bad label parameter");
    return;
  }
  int paged = query_param(req, "limit", lim, sizeof(lim));
  char *end = NULL, next[128] = "";
  unsigned long limit = paged > 0 ? strtoul(lim, &end, 10) : 0;
  if (paged < 0 || (paged > 0 && (end == lim || *end != '\0' || limit == 0 || limit > 10000)) ||
      query_param(req, "after", after, sizeof(after)) < 0) {
    send_error(req, 400, "invalid", "bad limit or after parameter");
    return;
  }
  json_t *all = paged > 0 ? osr__sim_dump_page(&prov, after, limit, next, sizeof(next))
                          : osr__sim_dump(&prov);
  if (all == NULL) {
    send_error(req, 400, "invalid", "bad after parameter");
    return;
  }
  json_t *out = json_array();
  size_t k;
  json_t *v;
  json_array_foreach(all, k, v)
  {
    if (label[0] == '\0' || label_match(v, label))
      json_array_append(out, v);
  }
  json_decref(all);
  json_t *body = json_pack("{s:o}", "resources", out);
  if (paged > 0)
    json_object_set_new(body, "next", next[0] != '\0' ? json_string(next) : json_null());
  send_json(req, 200, body);
}

static void route_one(osr_http_req_t *req, const char *id)
{
  if (method_is(req, "GET")) {
    json_t *all = osr__sim_dump(&prov), *found = NULL;
    size_t k;
    json_t *v;
    json_array_foreach(all, k, v)
    {
      if (strcmp(json_string_value(json_object_get(v, "id")), id) == 0) {
        found = json_incref(v);
        break;
      }
    }
    json_decref(all);
    if (found == NULL)
      send_error(req, 404, "not_found", "no such resource");
    else
      send_json(req, 200, found);
    return;
  }
  if (method_is(req, "DELETE")) {
    create_ctx_t *c = osr_xcalloc(1, sizeof(*c));
    c->req = req;
    req->data = c;
    req->on_done = create_req_done;
    int rv = prov.adapter->destroy(&prov, id, on_destroyed, c);
    if (rv != 0) {
      req->data = NULL;
      req->on_done = NULL;
      osr_free(c);
      send_error(req, 503, "unavailable", osr_strerror(rv));
    }
    return;
  }
  send_error(req, 405, "invalid", "use GET or DELETE");
}

static void on_request(osr_http_req_t *req, void *data)
{
  (void)data;
  static const char pfx[] = "/v1/resources/";
  if (path_is(req, "/v1/resources")) {
    if (method_is(req, "POST")) {
      if (osr_http_req_read_body(req, MAX_BODY, on_create_body) != 0)
        send_error(req, 413, "invalid", "body too large");
    } else if (method_is(req, "GET")) {
      route_list(req);
    } else {
      send_error(req, 405, "invalid", "use GET or POST");
    }
  } else if (req->path.len > sizeof(pfx) - 1 && memcmp(req->path.base, pfx, sizeof(pfx) - 1) == 0) {
    char id[128];
    if (osr_pct_decode(req->path.base + sizeof(pfx) - 1, req->path.len - (sizeof(pfx) - 1), id,
                       sizeof(id)) < 0 ||
        strchr(id, '/') != NULL) {
      send_error(req, 404, "not_found", "no such resource");
      return;
    }
    route_one(req, id);
  } else if (path_is(req, "/healthz")) {
    json_t *all = osr__sim_dump(&prov);
    size_t n = json_array_size(all);
    json_decref(all);
    send_json(req, 200, json_pack("{s:s,s:I}", "status", "ok", "resources", (json_int_t)n));
  } else {
    send_error(req, 404, "not_found", "no such endpoint");
  }
}

/* ---- main --------------------------------------------------------------------- */

static void on_prov_closed(osr_provider_t *p)
{
  (void)p;
  uv_close((uv_handle_t *)&sig_term, NULL);
  uv_close((uv_handle_t *)&sig_int, NULL);
}

static void on_server_closed(osr_http_server_t *srv, void *data)
{
  (void)srv;
  (void)data;
  /* Take the final state now (the provider is about to go); write it once
   * the loop is over and nothing else can run. */
  if (state_file != NULL) {
    json_t *a = osr__sim_dump(&prov);
    final_text = json_dumps(a, JSON_COMPACT);
    json_decref(a);
  }
  exiting = 1;
  prov.adapter->close(&prov, on_prov_closed);
}

static void on_signal(uv_signal_t *h, int signum)
{
  (void)h;
  (void)signum;
  uv_signal_stop(&sig_term);
  uv_signal_stop(&sig_int);
  osr_http_server_close(server, 2000, on_server_closed, NULL);
}

static void usage(FILE *f)
{
  fprintf(f,
          "usage: osr-sim [options]   (a SIMULATED sandbox provider for tests and drills)\n"
          "  --listen ADDR            listen address, repeatable (default 127.0.0.1:0)\n"
          "  --latency-ms N           mean create latency (default 20)\n"
          "  --jitter-ms N            uniform latency jitter +-N (default 0)\n"
          "  --failure-rate F         fraction of creates failing with --error (0..1)\n"
          "  --boot-failure-rate F    fraction accepted, then failing as boot_failed (0..1)\n"
          "  --capacity N             max live resources (0 = unlimited)\n"
          "  --error NAME             capacity|rate_limited|timeout|unavailable|auth|invalid\n"
          "  --seed N                 PRNG seed for reproducible failures\n"
          "  --state-file PATH        keep resources in PATH across restarts\n"
          "  --idle-timeout-ms N      close idle client connections after N ms (default 60000)\n"
          "  --log-level LEVEL        trace|debug|info|warn|error\n"
          "  --help                   this text\n");
}

static int add_num(json_t *cfg, const char *key, const char *v, int integer)
{
  char *end;
  double d = strtod(v, &end);
  if (*v == '\0' || *end != '\0')
    return -1;
  json_object_set_new(cfg, key, integer ? json_integer((json_int_t)d) : json_real(d));
  return 0;
}

int main(int argc, char **argv)
{
  const char *listen[8];
  size_t nlisten = 0;
  uint64_t idle_ms = 0;
  json_t *cfg = json_pack("{s:s,s:s,s:b,s:[sss]}", "name", "osr-sim", "type", "sim", "accept_any",
                          1, "isolation", "container", "gvisor", "firecracker");

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      json_decref(cfg);
      return 0;
    }
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (v == NULL) {
      fprintf(stderr, "osr-sim: %s needs a value (see --help)\n", a);
      json_decref(cfg);
      return 2;
    }
    i++;
    int bad = 0;
    if (strcmp(a, "--listen") == 0) {
      if (nlisten == OSR_ARRAY_SIZE(listen))
        bad = 1;
      else
        listen[nlisten++] = v;
    } else if (strcmp(a, "--latency-ms") == 0)
      bad = add_num(cfg, "latency_ms", v, 0);
    else if (strcmp(a, "--jitter-ms") == 0)
      bad = add_num(cfg, "latency_jitter_ms", v, 0);
    else if (strcmp(a, "--failure-rate") == 0)
      bad = add_num(cfg, "failure_rate", v, 0);
    else if (strcmp(a, "--boot-failure-rate") == 0)
      bad = add_num(cfg, "boot_failure_rate", v, 0);
    else if (strcmp(a, "--capacity") == 0)
      bad = add_num(cfg, "capacity", v, 1);
    else if (strcmp(a, "--seed") == 0)
      bad = add_num(cfg, "seed", v, 1);
    else if (strcmp(a, "--error") == 0)
      json_object_set_new(cfg, "error", json_string(v));
    else if (strcmp(a, "--state-file") == 0)
      state_file = v;
    else if (strcmp(a, "--idle-timeout-ms") == 0) {
      char *end;
      idle_ms = strtoull(v, &end, 10);
      bad = *v == '\0' || *end != '\0' || idle_ms == 0;
    }
    else if (strcmp(a, "--log-level") == 0) {
      osr_log_level_t l;
      if (osr_log_parse_level(v, &l) != 0)
        bad = 1;
      else
        osr_log_set_level(l);
    } else {
      fprintf(stderr, "osr-sim: unknown option %s (see --help)\n", a);
      json_decref(cfg);
      return 2;
    }
    if (bad) {
      fprintf(stderr, "osr-sim: bad value for %s: '%s'\n", a, v);
      json_decref(cfg);
      return 2;
    }
  }
  if (nlisten == 0)
    listen[nlisten++] = "127.0.0.1:0";

  signal(SIGPIPE, SIG_IGN);
  loop = uv_default_loop();
  memset(&prov, 0, sizeof(prov));
  prov.adapter = &osr_adapter_sim;
  prov.loop = loop;
  snprintf(prov.name, sizeof(prov.name), "osr-sim");
  char err[256];
  if (prov.adapter->init(&prov, cfg, err, sizeof(err)) != 0) {
    /* Name the flag rather than the config key where they differ. */
    fprintf(stderr, "osr-sim: %s\n", err);
    json_decref(cfg);
    return 2;
  }
  json_decref(cfg);
  prov.adapter->describe(&prov, &prov.info);
  if (state_file != NULL && load_state() != 0) {
    prov.adapter->close(&prov, NULL);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_loop_close(loop);
    return 1;
  }
  osr__sim_set_on_change(&prov, on_change, NULL);

  osr_http_server_opts_t opts;
  memset(&opts, 0, sizeof(opts));
  opts.handler.on_request = on_request;
  opts.server_name = "osr-sim";
  opts.limits.max_body = MAX_BODY;
  /* Many concurrent creates arrive on one HTTP/2 connection. */
  opts.limits.h2_max_streams = 1024;
  opts.limits.idle_timeout_ms = idle_ms;
  server = osr_http_server_new(loop, &opts);
  for (size_t i = 0; i < nlisten; i++) {
    int rv = osr_http_server_listen(server, listen[i], NULL);
    if (rv != 0) {
      fprintf(stderr, "osr-sim: listen %s: %s\n", listen[i], osr_strerror(rv));
      /* Close what exists and let the loop finish the closes. */
      osr_http_server_close(server, 0, NULL, NULL);
      prov.adapter->close(&prov, NULL);
      uv_run(loop, UV_RUN_DEFAULT);
      uv_loop_close(loop);
      return 1;
    }
    printf("listening %s %d\n", listen[i], osr_http_server_port(server, i));
  }
  uv_signal_init(loop, &sig_term);
  uv_signal_init(loop, &sig_int);
  uv_signal_start(&sig_term, on_signal, SIGTERM);
  uv_signal_start(&sig_int, on_signal, SIGINT);
  printf("ready\n");
  fflush(stdout);

  uv_run(loop, UV_RUN_DEFAULT);
  uv_loop_close(loop);
  int rc = 0;
  if (final_text != NULL) {
    if (write_file(state_file, final_text) != 0) {
      fprintf(stderr, "osr-sim: state file %s: write failed\n", state_file);
      rc = 1;
    }
    osr_json_free(final_text);
  }
  return rc;
}
