/*
 * `osr doctor`: check this machine's OSR setup and say how to fix what is
 * missing. Every check prints one line, OK / WARN / FAIL, and a fix for the
 * latter two. Exit 1 if anything FAILed (so scripts can gate on it), else 0.
 *
 * The store and Redis are opened for real with the gateway's own modules
 * (store/store.h, cache/redis.h) on a private loop, each under a deadline,
 * so "OK" means the gateway would open them too.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/redis.h"
#include "cli/cli.h"
#include "gateway/gw.h"
#include "osr/adapter.h"
#include "store/store.h"
#include "util/log.h"
#include "util/mem.h"

#define STORE_DEADLINE_MS 10000
#define REDIS_DEADLINE_MS 3000

typedef struct report_s {
  json_t *checks;
  int fails, warns;
  int json;
} report_t;

static void check(report_t *r, const char *status, const char *name, const char *detail,
                  const char *fix)
{
  json_array_append_new(r->checks, json_pack("{s:s,s:s,s:s,s:s?}", "name", name, "status", status,
                                             "detail", detail, "fix", fix));
  r->fails += strcmp(status, "FAIL") == 0;
  r->warns += strcmp(status, "WARN") == 0;
  if (r->json)
    return;
  printf("%-4s  %-14s %s\n", status, name, detail);
  if (fix != NULL)
    printf("      %-14s fix: %s\n", "", fix);
  fflush(stdout);
}

/* ---- data directory -------------------------------------------------------- */

static void check_data_dir(report_t *r, const char *dir)
{
  char detail[4200], fix[4300], probe[4200];
  struct stat st;
  if (stat(dir, &st) != 0) {
    /* The gateway creates it at first start; the parent must allow that. */
    char parent[4096];
    snprintf(parent, sizeof(parent), "%s", dir);
    char *slash = strrchr(parent, '/');
    while (slash != NULL && slash != parent) {
      *slash = '\0';
      if (stat(parent, &st) == 0)
        break;
      slash = strrchr(parent, '/');
    }
    if (slash == parent)
      snprintf(parent, sizeof(parent), "/");
    if (access(parent, W_OK) == 0) {
      snprintf(detail, sizeof(detail), "%s does not exist yet; `osr serve` creates it", dir);
      check(r, "OK", "data dir", detail, NULL);
    } else {
      snprintf(detail, sizeof(detail), "%s does not exist and %s is not writable", dir, parent);
      snprintf(fix, sizeof(fix),
               "mkdir -p %s (as a user who may), or set --data-dir / OSR_DATA_DIR", dir);
      check(r, "FAIL", "data dir", detail, fix);
    }
    return;
  }
  if (!S_ISDIR(st.st_mode)) {
    snprintf(detail, sizeof(detail), "%s is not a directory", dir);
    check(r, "FAIL", "data dir", detail, "point --data-dir / OSR_DATA_DIR at a directory");
    return;
  }
  snprintf(probe, sizeof(probe), "%s/.osr-doctor-%ld", dir, (long)getpid());
  int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    snprintf(detail, sizeof(detail), "%s is not writable: %s", dir, strerror(errno));
    snprintf(fix, sizeof(fix), "chown/chmod %s for the user running osr, or set --data-dir", dir);
    check(r, "FAIL", "data dir", detail, fix);
    return;
  }
  close(fd);
  unlink(probe);
  snprintf(detail, sizeof(detail), "%s is writable", dir);
  check(r, "OK", "data dir", detail, NULL);
}

/* ---- store ----------------------------------------------------------------- */

typedef struct probe_s {
  int done, status;
  osr_store_t *st;
  uv_timer_t timer;
  int timed_out;
} probe_t;

static void on_store_open(osr_store_t *st, int status, void *data)
{
  probe_t *p = data;
  p->done = 1;
  p->status = status;
  p->st = st;
  uv_timer_stop(&p->timer);
}

static void on_probe_timer(uv_timer_t *t)
{
  probe_t *p = t->data;
  p->timed_out = 1;
  uv_stop(t->loop);
}

static void on_store_closed(void *data)
{
  (void)data;
}

static void walk_close(uv_handle_t *h, void *arg)
{
  (void)arg;
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

/* Close what a probe left on its loop and free the loop. */
static void loop_finish(uv_loop_t *loop)
{
  for (int i = 0; i < 1000 && uv_run(loop, UV_RUN_NOWAIT) != 0; i++) {
    uv_walk(loop, walk_close, NULL);
    usleep(1000);
  }
  if (uv_loop_close(loop) != 0) {
    /* A module still holds handles (a stuck worker thread): leak the loop
     * rather than free memory that is in use; the process exits soon. */
    return;
  }
  osr_free(loop);
}

static void check_store(report_t *r, const char *url)
{
  char detail[1024], fix[1200];
  uv_loop_t *loop = osr_xmalloc(sizeof(*loop));
  probe_t p;
  memset(&p, 0, sizeof(p));
  uv_loop_init(loop);
  uv_timer_init(loop, &p.timer);
  p.timer.data = &p;
  osr_store_t *st = NULL;
  int rv = osr_store_open(loop, url, on_store_open, &p, &st);
  if (rv != 0) {
    uv_close((uv_handle_t *)&p.timer, NULL);
    loop_finish(loop);
    snprintf(detail, sizeof(detail), "%s: %s", url, osr_strerror(rv));
    check(r, "FAIL", "store", detail,
          "use sqlite:/path/to/osr.db or postgres://user@host:port/db (--store / OSR_STORE)");
    return;
  }
  uv_timer_start(&p.timer, on_probe_timer, STORE_DEADLINE_MS, 0);
  uv_run(loop, UV_RUN_DEFAULT);
  uv_close((uv_handle_t *)&p.timer, NULL);
  if (p.done && p.status == 0) {
    snprintf(detail, sizeof(detail), "%s opened (%s, schema up to date)", url,
             osr_store_backend(p.st));
    check(r, "OK", "store", detail, NULL);
  } else {
    int pg = strncmp(url, "postgres", 8) == 0;
    snprintf(detail, sizeof(detail), "%s: %s", url,
             p.done ? osr_strerror(p.status) : "no answer within 10 s");
    if (pg)
      snprintf(fix, sizeof(fix),
               "start PostgreSQL and check the URL (user, host, port, database); "
               "pg_isready -d '<url>' tells whether it accepts connections");
    else
      snprintf(fix, sizeof(fix),
               "check that the directory of the SQLite file exists and is writable");
    check(r, "FAIL", "store", detail, fix);
  }
  /* On open failure the store module frees itself; on success close it. */
  if (p.done && p.status == 0 && p.st != NULL)
    osr_store_close(p.st, on_store_closed, NULL);
  else if (!p.done && st != NULL)
    osr_store_close(st, on_store_closed, NULL);
  uv_run(loop, UV_RUN_DEFAULT);
  loop_finish(loop);
}

/* ---- Redis ----------------------------------------------------------------- */

typedef struct rprobe_s {
  osr_redis_t *redis;
  uv_timer_t timer;
  uint64_t waited;
  int connected;
} rprobe_t;

static void on_redis_poll(uv_timer_t *t)
{
  rprobe_t *p = t->data;
  p->waited += 50;
  if (osr_redis_is_connected(p->redis)) {
    p->connected = 1;
    uv_timer_stop(t);
    return;
  }
  if (p->waited >= REDIS_DEADLINE_MS)
    uv_timer_stop(t);
}

static void on_redis_closed(void *data)
{
  (void)data;
}

static void check_redis(report_t *r, const char *url)
{
  char detail[1024];
  if (url == NULL) {
    check(r, "OK", "redis", "not configured (optional: a cache for bindings and invalidation)",
          NULL);
    return;
  }
  uv_loop_t *loop = osr_xmalloc(sizeof(*loop));
  rprobe_t p;
  memset(&p, 0, sizeof(p));
  uv_loop_init(loop);
  osr_redis_opts_t o;
  memset(&o, 0, sizeof(o));
  o.url = url;
  o.connect_timeout_ms = REDIS_DEADLINE_MS;
  int rv = osr_redis_new(loop, &o, &p.redis);
  if (rv != 0) {
    loop_finish(loop);
    snprintf(detail, sizeof(detail), "%s: %s", url, osr_strerror(rv));
    check(r, "FAIL", "redis", detail,
          "use redis://HOST:PORT[/DB] or unix:/path (--redis / OSR_REDIS)");
    return;
  }
  uv_timer_init(loop, &p.timer);
  p.timer.data = &p;
  uv_timer_start(&p.timer, on_redis_poll, 50, 50);
  /* Runs until the poll timer stops (connected or deadline); the client's
   * own reconnect timers keep the loop alive, so stop on the poll timer. */
  while (uv_is_active((uv_handle_t *)&p.timer))
    uv_run(loop, UV_RUN_ONCE);
  uv_close((uv_handle_t *)&p.timer, NULL);
  osr_redis_close(p.redis, on_redis_closed, NULL);
  uv_run(loop, UV_RUN_DEFAULT);
  loop_finish(loop);
  if (p.connected) {
    snprintf(detail, sizeof(detail), "%s reachable", url);
    check(r, "OK", "redis", detail, NULL);
  } else {
    snprintf(detail, sizeof(detail), "%s not reachable within %d ms", url, REDIS_DEADLINE_MS);
    check(r, "FAIL", "redis", detail,
          "start Redis (apt-get install -y redis-server; systemctl start redis-server), fix the "
          "URL, or remove `redis:` from the config / unset OSR_REDIS (the gateway then works "
          "from the store alone)");
  }
}

/* ---- providers and runtimes ------------------------------------------------ */

static void check_providers(report_t *r, const json_t *providers)
{
  size_t i;
  json_t *p;
  json_array_foreach(providers, i, p)
  {
    const char *name = json_string_value(json_object_get(p, "name"));
    const char *type = json_string_value(json_object_get(p, "type"));
    char label[80], detail[512], fix[1024];
    snprintf(label, sizeof(label), "provider %s", name ? name : "?");
    const osr_adapter_t *ad = type != NULL ? osr_adapter_find(type) : NULL;
    if (ad != NULL) {
      /* available(): can it run here, and with what (local: which cgroup
       * interface enforces the limits). Bounded, blocking: fine here. */
      char why[256] = "";
      int ok = ad->available == NULL || ad->available(why, sizeof(why));
      snprintf(detail, sizeof(detail), "adapter type '%s' is built in%s%s%s", type,
               why[0] != '\0' ? "; " : "", ok ? "" : "cannot run here: ", why);
      check(r, ok ? "OK" : "WARN", label, detail, ok ? NULL : "install what is missing above");
      continue;
    }
    const char *names[32];
    size_t n = osr_adapter_types(names, OSR_ARRAY_SIZE(names));
    size_t o = 0;
    fix[0] = '\0';
    for (size_t k = 0; k < n && k < OSR_ARRAY_SIZE(names); k++) {
      int w = snprintf(fix + o, sizeof(fix) - o, "%s%s", k ? ", " : "", names[k]);
      if (w < 0 || (size_t)w >= sizeof(fix) - o)
        break;
      o += (size_t)w;
    }
    snprintf(detail, sizeof(detail), "adapter type '%s' is unknown to this build",
             type ? type : "?");
    char fix2[1200];
    snprintf(fix2, sizeof(fix2), "use one of: %s", n ? fix : "(no adapters built in)");
    check(r, "FAIL", label, detail, fix2);
  }
}

static int in_path(const char *prog, char *found, size_t len)
{
  const char *path = getenv("PATH");
  if (path == NULL)
    return 0;
  const char *p = path;
  while (*p != '\0') {
    size_t n = strcspn(p, ":");
    char cand[4096];
    snprintf(cand, sizeof(cand), "%.*s/%s", (int)n, n ? p : ".", prog);
    if (access(cand, X_OK) == 0) {
      snprintf(found, len, "%s", cand);
      return 1;
    }
    p += n;
    if (*p == ':')
      p++;
  }
  return 0;
}

static void check_runtimes(report_t *r)
{
  static const struct {
    const char *prog, *what, *fix;
  } rt[] = {
      {"runsc", "gVisor (isolation gvisor)",
       "install gVisor: see https://gvisor.dev/docs/user_guide/install/ (apt repository "
       "https://storage.googleapis.com/gvisor/releases, package runsc)"},
      {"bwrap", "bubblewrap (isolation container)", "apt-get install -y bubblewrap"},
      {"crun", "crun (isolation container)", "apt-get install -y crun"},
  };
  for (size_t i = 0; i < OSR_ARRAY_SIZE(rt); i++) {
    char found[4096], detail[4300], label[32];
    snprintf(label, sizeof(label), "runtime %s", rt[i].prog);
    if (in_path(rt[i].prog, found, sizeof(found))) {
      snprintf(detail, sizeof(detail), "%s: %s", rt[i].what, found);
      check(r, "OK", label, detail, NULL);
    } else {
      snprintf(detail, sizeof(detail), "%s not in PATH (needed by the local provider)", rt[i].what);
      check(r, "WARN", label, detail, rt[i].fix);
    }
  }
}

static void check_gateway(report_t *r, const cli_t *c)
{
  char err[512], detail[1024];
  cli_resp_t resp;
  int rv = cli_http(c, "GET", "/healthz", NULL, 0, NULL, &resp, err, sizeof(err));
  if (rv != 0) {
    snprintf(detail, sizeof(detail), "%s: %s", c->url, err);
    check(r, "FAIL", "gateway", detail,
          "start it with `osr serve` (or point --url / OSR_URL at a running gateway)");
    return;
  }
  char v[64];
  cli_field(resp.json, "version", v, sizeof(v));
  snprintf(detail, sizeof(detail), "%s answers /healthz %d (version %s)", c->url, resp.status, v);
  check(r, resp.status == 200 ? "OK" : "WARN", "gateway", detail,
        resp.status == 200 ? NULL : "the gateway is draining or unhealthy: see its log");
  cli_resp_dispose(&resp);

  if (c->key == NULL) {
    check(r, "WARN", "api key", "no API key (--key, OSR_KEY or <data dir>/admin.key)",
          "pass --key or set OSR_KEY; the admin key is in <data dir>/admin.key");
    return;
  }
  rv = cli_http(c, "GET", "/v1/providers", NULL, 0, NULL, &resp, err, sizeof(err));
  if (rv != 0)
    return;
  snprintf(detail, sizeof(detail), "key from %s: GET /v1/providers -> %d", c->key_source,
           resp.status);
  int ok = resp.status >= 200 && resp.status < 300;
  check(r, ok ? "OK" : "FAIL", "api key", detail,
        ok ? NULL : "the key is wrong or revoked: pass the right one with --key / OSR_KEY");
  cli_resp_dispose(&resp);
}

int cli_cmd_doctor(cli_t *c, int argc, char **argv)
{
  report_t r;
  char err[1024];
  osr_gw_config_t cfg;
  memset(&r, 0, sizeof(r));
  r.checks = json_array();
  r.json = c->json;

  int rv = osr_gw_config_load(&cfg, argc, argv, err, sizeof(err));
  if (rv == 1) {
    osr_gw_config_usage(stdout, "osr doctor");
    json_decref(r.checks);
    return CLI_OK;
  }
  json_t *redacted = NULL;
  if (rv != 0) {
    check(&r, "FAIL", "config", err,
          "fix the file/variable/flag named above (docs/configuration.md)");
  } else {
    char detail[4200];
    snprintf(detail, sizeof(detail), "%s",
             cfg.config_file ? cfg.config_file : "defaults + environment");
    check(&r, "OK", "config", detail, NULL);
    redacted = osr_gw_config_to_json_redacted(&cfg);
    /* The modules log their reconnect attempts; the check lines say it all. */
    osr_log_set_level(OSR_LOG_OFF);
    check_data_dir(&r, cfg.data_dir);
    check_store(&r, cfg.store_url);
    check_redis(&r, cfg.redis_url);
    check_providers(&r, cfg.providers);
  }
  check_runtimes(&r);
  check_gateway(&r, c);
  if (rv == 0)
    osr_gw_config_dispose(&cfg);

  if (r.json) {
    json_t *j = json_pack("{s:o,s:o,s:i,s:i}", "checks", r.checks, "config",
                          redacted ? redacted : json_null(), "fail", r.fails, "warn", r.warns);
    char *s = json_dumps(j, JSON_INDENT(2));
    printf("%s\n", s ? s : "{}");
    osr_json_free(s);
    json_decref(j);
  } else {
    printf("\n%d FAIL, %d WARN\n", r.fails, r.warns);
    json_decref(r.checks);
    json_decref(redacted);
  }
  return r.fails > 0 ? CLI_EAPI : CLI_OK;
}
