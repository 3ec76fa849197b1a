/*
 * local_driver: drives the `local` provider adapter directly, for the
 * integration tests and bench/tti_bench.py.
 *
 *   local_driver CONFIG_JSON [--destroy-at-exit]
 *
 * reads one JSON command per line on stdin and answers one JSON line per
 * command on stdout, in completion order (commands run concurrently):
 *   {"tag":T,"op":"create","class":"container","sandbox_id":S,"token":K,
 *    "timeout_s":N,"memory_mib":M,"env":{...}}
 *   {"tag":T,"op":"get|destroy|pause|resume","provider_id":P}
 *   {"tag":T,"op":"list"} {"tag":T,"op":"describe"}
 *   {"tag":T,"op":"snapshot","provider_id":P,"path":F}
 *   {"tag":T,"op":"restore","class":C,"sandbox_id":S,"token":K,"path":F}
 *   {"tag":T,"op":"exit"}   close the provider and exit (sandboxes keep running)
 * Answers: {"tag":T,"status":"ok"|<error name>,"ms":<elapsed>,...}.
 * EOF on stdin behaves like "exit". With --destroy-at-exit, "exit" (or EOF:
 * the client died) first waits for the commands in flight, then destroys
 * every sandbox of the state directory (list + destroy) before closing, so
 * a killed benchmark leaves nothing running.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "osr/adapter.h"
#include "util/log.h"
#include "util/mem.h"

#define LINE_MAX_BYTES 65536

static uv_loop_t *loop;
static osr_provider_t prov;
static uv_pipe_t in;
static char line[LINE_MAX_BYTES];
static size_t linelen;
static int exiting, inflight;
static int destroy_at_exit;
static size_t destroys_left;

typedef struct cmd_s {
  json_t *tag;
  uint64_t t0;
} cmd_t;

static void emit(json_t *o)
{
  char *s = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  if (s != NULL) {
    fputs(s, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    osr_json_free(s);
  }
}

static json_t *res_json(const osr_resource_t *r)
{
  static const char *const st[] = {"unknown", "starting", "running", "paused", "stopped", "gone"};
  return json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:i}", "provider_id", r->provider_id,
                   "sandbox_id", r->sandbox_id, "class",
                   osr_isolation_name(r->isolation) ? osr_isolation_name(r->isolation) : "",
                   "agent_endpoint", r->agent_endpoint, "state", st[r->state % 6], "memory_mib",
                   (int)r->granted.min_memory_mib, "vcpus", (int)r->granted.vcpus);
}

static json_t *answer(cmd_t *c, int status)
{
  json_t *o = json_pack("{s:O, s:s, s:f}", "tag", c->tag, "status",
                        osr_provider_err_name(status), "ms",
                        (double)(uv_hrtime() - c->t0) / 1e6);
  if (status != 0 && status > -31000)
    json_object_set_new(o, "error", json_string(osr_strerror(status)));
  json_decref(c->tag);
  osr_free(c);
  inflight--;
  return o;
}

static void on_closed(osr_provider_t *p)
{
  (void)p;
  uv_close((uv_handle_t *)&in, NULL);
}

static void on_exit_destroyed(osr_provider_t *p, int status, void *data)
{
  (void)data;
  if (status != 0)
    fprintf(stderr, "local_driver: destroy at exit: %s\n", osr_provider_err_name(status));
  if (--destroys_left == 0)
    p->adapter->close(p, on_closed);
}

static void on_exit_list(osr_provider_t *p, int status, const osr_resource_t *r, size_t n,
                         void *data)
{
  destroys_left = 1; /* held until every destroy is started */
  for (size_t i = 0; status == 0 && i < n; i++)
    if (p->adapter->destroy(p, r[i].provider_id, on_exit_destroyed, data) == 0)
      destroys_left++;
  if (destroys_left > 1)
    fprintf(stderr, "local_driver: destroying %zu sandboxes at exit\n", destroys_left - 1);
  on_exit_destroyed(p, 0, data);
}

static void maybe_exit(void)
{
  if (exiting == 1 && inflight == 0) {
    exiting = 2;
    uv_read_stop((uv_stream_t *)&in);
    if (destroy_at_exit && prov.adapter->list(&prov, on_exit_list, NULL) == 0)
      return;
    prov.adapter->close(&prov, on_closed);
  }
}

static void on_create(osr_provider_t *p, int status, const osr_resource_t *r, void *data)
{
  json_t *o = answer(data, status);
  if (status == 0)
    json_object_set_new(o, "resource", res_json(r));
  emit(o);
  maybe_exit();
}

static void on_done(osr_provider_t *p, int status, void *data)
{
  emit(answer(data, status));
  maybe_exit();
}

static void on_list(osr_provider_t *p, int status, const osr_resource_t *r, size_t n, void *data)
{
  json_t *o = answer(data, status);
  json_t *a = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(a, res_json(&r[i]));
  json_object_set_new(o, "resources", a);
  emit(o);
  maybe_exit();
}

static void on_snap(osr_provider_t *p, int status, const char *snap, void *data)
{
  json_t *o = answer(data, status);
  if (snap != NULL)
    json_object_set_new(o, "snapshot", json_string(snap));
  emit(o);
  maybe_exit();
}

static void fill_spec(osr_sandbox_spec_t *spec, json_t *j)
{
  memset(spec, 0, sizeof(*spec));
  spec->sandbox_id = json_string_value(json_object_get(j, "sandbox_id"));
  spec->tenant = json_string_value(json_object_get(j, "tenant"));
  if (spec->tenant == NULL)
    spec->tenant = "t1";
  spec->template_id = json_string_value(json_object_get(j, "template"));
  spec->isolation = osr_isolation_parse(json_string_value(json_object_get(j, "class")));
  spec->caps.isolation = spec->isolation;
  spec->caps.min_memory_mib = (uint32_t)json_integer_value(json_object_get(j, "memory_mib"));
  spec->caps.vcpus = (uint32_t)json_integer_value(json_object_get(j, "vcpus"));
  spec->timeout_s = (uint32_t)json_integer_value(json_object_get(j, "timeout_s"));
  spec->env = json_object_get(j, "env");
  spec->agent_token = json_string_value(json_object_get(j, "token"));
  spec->region = "";
}

static void run(json_t *j)
{
  const char *op = json_string_value(json_object_get(j, "op"));
  const char *pid = json_string_value(json_object_get(j, "provider_id"));
  const char *path = json_string_value(json_object_get(j, "path"));
  cmd_t *c = osr_xcalloc(1, sizeof(*c));
  c->tag = json_incref(json_object_get(j, "tag"));
  if (c->tag == NULL)
    c->tag = json_null();
  c->t0 = uv_hrtime();
  inflight++;
  const osr_adapter_t *ad = prov.adapter;
  osr_sandbox_spec_t spec;
  int rv;
  if (op == NULL) {
    rv = OSR_PERR_INVALID;
  } else if (strcmp(op, "create") == 0) {
    fill_spec(&spec, j);
    rv = ad->create(&prov, &spec, on_create, c);
  } else if (strcmp(op, "restore") == 0) {
    fill_spec(&spec, j);
    rv = ad->restore(&prov, &spec, path, on_create, c);
  } else if (strcmp(op, "get") == 0) {
    rv = ad->get(&prov, pid, on_create, c);
  } else if (strcmp(op, "destroy") == 0) {
    rv = ad->destroy(&prov, pid, on_done, c);
  } else if (strcmp(op, "pause") == 0) {
    rv = ad->pause(&prov, pid, on_done, c);
  } else if (strcmp(op, "resume") == 0) {
    rv = ad->resume(&prov, pid, on_create, c);
  } else if (strcmp(op, "snapshot") == 0) {
    rv = ad->snapshot(&prov, pid, path, on_snap, c);
  } else if (strcmp(op, "list") == 0) {
    rv = ad->list(&prov, on_list, c);
  } else if (strcmp(op, "describe") == 0) {
    osr_provider_info_t info;
    ad->describe(&prov, &info);
    json_t *o = answer(c, 0);
    json_t *cls = json_array();
    for (int i = 1; i <= 3; i++)
      if (info.isolation_mask & (1u << i))
        json_array_append_new(cls, json_string(osr_isolation_name((osr_isolation_t)i)));
    json_object_set_new(o, "classes", cls);
    json_object_set_new(o, "pause", json_boolean(info.pause));
    json_object_set_new(o, "snapshot", json_boolean(info.snapshot));
    json_object_set_new(o, "max_memory_mib", json_integer(info.max_memory_mib));
    emit(o);
    return;
  } else if (strcmp(op, "exit") == 0) {
    emit(answer(c, 0));
    exiting = 1;
    maybe_exit();
    return;
  } else {
    rv = OSR_PERR_INVALID;
  }
  if (rv != 0)
    emit(answer(c, rv));
}

static void on_alloc(uv_handle_t *h, size_t sz, uv_buf_t *b)
{
  static char buf[65536];
  b->base = buf;
  b->len = sizeof(buf);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
  if (n < 0) {
    uv_read_stop(s);
    if (exiting == 0)
      exiting = 1;
    maybe_exit();
    return;
  }
  for (ssize_t i = 0; i < n; i++) {
    char ch = b->base[i];
    if (ch != '\n') {
      if (linelen + 1 < sizeof(line))
        line[linelen++] = ch;
      continue;
    }
    line[linelen] = '\0';
    linelen = 0;
    json_error_t err;
    json_t *j = json_loads(line, 0, &err);
    if (j == NULL) {
      fprintf(stderr, "local_driver: bad command: %s\n", err.text);
      continue;
    }
    if (exiting == 0)
      run(j);
    json_decref(j);
  }
}

int main(int argc, char **argv)
{
  destroy_at_exit = argc == 3 && strcmp(argv[2], "--destroy-at-exit") == 0;
  if (argc != 2 && !destroy_at_exit) {
    fprintf(stderr, "usage: local_driver CONFIG_JSON [--destroy-at-exit] < commands\n");
    return 2;
  }
  /* A client that died must not kill us with its pipe: answers to nobody
   * fail with EPIPE, and EOF on stdin then runs the exit (and with
   * --destroy-at-exit the teardown). */
  signal(SIGPIPE, SIG_IGN);
  const char *lvl = getenv("OSR_LOG_LEVEL");
  osr_log_level_t l;
  if (lvl != NULL && osr_log_parse_level(lvl, &l) == 0)
    osr_log_set_level(l);
  json_error_t jerr;
  json_t *cfg = json_loads(argv[1], 0, &jerr);
  if (cfg == NULL) {
    fprintf(stderr, "local_driver: config: %s\n", jerr.text);
    return 2;
  }
  loop = uv_default_loop();
  prov.adapter = osr_adapter_find("local");
  prov.loop = loop;
  snprintf(prov.name, sizeof(prov.name), "local");
  char err[256] = "";
  if (prov.adapter == NULL || prov.adapter->init(&prov, cfg, err, sizeof(err)) != 0) {
    fprintf(stderr, "local_driver: init: %s\n", err);
    json_decref(cfg);
    return 2;
  }
  json_decref(cfg);
  uv_pipe_init(loop, &in, 0);
  uv_pipe_open(&in, 0);
  uv_read_start((uv_stream_t *)&in, on_alloc, on_read);
  uv_run(loop, UV_RUN_DEFAULT);
  uv_loop_close(loop);
  return 0;
}
