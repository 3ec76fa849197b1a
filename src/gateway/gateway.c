/*
 * Gateway process: flags, the HTTP server and the health endpoints. The
 * process drains on SIGTERM/SIGINT: listeners close at once, in-flight
 * requests finish (up to drain_ms), then the loop ends.
 */
#include "gateway/gateway.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/http.h"
#include "net/tls.h"
#include "osr_config.h"
#include "util/log.h"
#include "util/mem.h"

typedef struct gateway_s {
  uv_loop_t *loop;
  osr_http_server_t *http;
  uv_signal_t sigterm, sigint;
  uint64_t started_ms;
  uint64_t drain_ms;
  int draining;
} gateway_t;

static void respond_json(osr_http_req_t *req, int status, json_t *j)
{
  char *s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  if (s == NULL) {
    osr_http_abort(req);
    return;
  }
  osr_http_send(req, status, "application/json", s, strlen(s));
  osr_json_free(s);
}

static void error_json(osr_http_req_t *req, int status, const char *code, const char *msg)
{
  respond_json(req, status, json_pack("{s:{s:s,s:s}}", "error", "code", code, "message", msg));
}

static int path_eq(const osr_http_req_t *req, const char *p)
{
  size_t n = strlen(p);
  return req->path.len == n && memcmp(req->path.base, p, n) == 0;
}

static void on_request(osr_http_req_t *req, void *data)
{
  gateway_t *gw = data;
  int is_get = (req->method.len == 3 && memcmp(req->method.base, "GET", 3) == 0) ||
               (req->method.len == 4 && memcmp(req->method.base, "HEAD", 4) == 0);

  if (path_eq(req, "/healthz") || path_eq(req, "/readyz")) {
    if (!is_get) {
      error_json(req, 405, "method_not_allowed", "use GET");
      return;
    }
    /* Readiness turns false while draining so load balancers stop sending. */
    int ready = !gw->draining || path_eq(req, "/healthz");
    respond_json(req, ready ? 200 : 503,
                 json_pack("{s:s,s:s,s:s,s:I}", "status", ready ? "ok" : "draining", "version",
                           OSR_VERSION, "tls", OSR_TLS_BACKEND, "uptime_ms",
                           (json_int_t)(uv_now(gw->loop) - gw->started_ms)));
    return;
  }
  if (path_eq(req, "/version")) {
    respond_json(req, 200, json_pack("{s:s}", "version", OSR_VERSION));
    return;
  }
  error_json(req, 404, "not_found", "no such endpoint");
}

static void on_http_closed(osr_http_server_t *srv, void *data)
{
  gateway_t *gw = data;
  (void)srv;
  OSR_LOG_INFO("gateway", "drained, exiting");
  uv_close((uv_handle_t *)&gw->sigterm, NULL);
  uv_close((uv_handle_t *)&gw->sigint, NULL);
}

static void on_signal(uv_signal_t *h, int signum)
{
  gateway_t *gw = h->data;
  if (gw->draining)
    return;
  gw->draining = 1;
  OSR_LOG_INFO("gateway", "signal %d: draining", signum);
  uv_signal_stop(&gw->sigterm);
  uv_signal_stop(&gw->sigint);
  osr_http_server_close(gw->http, gw->drain_ms, on_http_closed, gw);
}

static void print_usage(FILE *f, const char *prog)
{
  fprintf(f,
          "usage: %s [options]\n"
          "  --listen ADDR        listen address, repeatable (default 127.0.0.1:8080);\n"
          "                       ADDR is IP:PORT, [IPv6]:PORT or unix:/path\n"
          "  --tls-cert FILE      PEM certificate chain; with --tls-key serves HTTPS\n"
          "  --tls-key FILE       PEM private key\n"
          "  --drain-ms N         grace period for in-flight requests on SIGTERM (default 10000)\n"
          "  --log-level LEVEL    trace|debug|info|warn|error (default info; env OSR_LOG_LEVEL)\n"
          "  --log-json           log JSON lines (env OSR_LOG_JSON=1)\n"
          "  --help               this text\n",
          prog);
}

int osr_gateway_parse_args(int argc, char **argv, osr_gateway_config_t *cfg, const char *prog)
{
  memset(cfg, 0, sizeof(*cfg));
  cfg->drain_ms = 10000;
  const char *env = getenv("OSR_LOG_LEVEL");
  osr_log_level_t lvl;
  if (env != NULL && osr_log_parse_level(env, &lvl) == 0)
    osr_log_set_level(lvl);
  env = getenv("OSR_LOG_JSON");
  if (env != NULL && strcmp(env, "1") == 0)
    osr_log_set_json(1);

  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      print_usage(stdout, prog);
      return 1;
    } else if (strcmp(a, "--log-json") == 0) {
      osr_log_set_json(1);
      continue;
    }
    static const char *const with_value[] = {"--listen", "--tls-cert", "--tls-key", "--drain-ms",
                                             "--log-level"};
    int known = 0;
    for (size_t k = 0; k < OSR_ARRAY_SIZE(with_value); k++)
      known |= strcmp(a, with_value[k]) == 0;
    if (!known) {
      fprintf(stderr, "%s: unknown option %s (see --help)\n", prog, a);
      return OSR_EINVAL;
    }
    if (v == NULL) {
      fprintf(stderr, "%s: %s needs a value (see --help)\n", prog, a);
      return OSR_EINVAL;
    }
    i++;
    if (strcmp(a, "--listen") == 0) {
      if (cfg->nlisten == OSR_ARRAY_SIZE(cfg->listen)) {
        fprintf(stderr, "%s: too many --listen\n", prog);
        return OSR_EINVAL;
      }
      cfg->listen[cfg->nlisten++] = v;
    } else if (strcmp(a, "--tls-cert") == 0) {
      cfg->tls_cert = v;
    } else if (strcmp(a, "--tls-key") == 0) {
      cfg->tls_key = v;
    } else if (strcmp(a, "--drain-ms") == 0) {
      char *end;
      cfg->drain_ms = strtoull(v, &end, 10);
      if (*end != '\0') {
        fprintf(stderr, "%s: --drain-ms wants a number of milliseconds\n", prog);
        return OSR_EINVAL;
      }
    } else { /* --log-level */
      if (osr_log_parse_level(v, &lvl) != 0) {
        fprintf(stderr, "%s: unknown log level '%s'\n", prog, v);
        return OSR_EINVAL;
      }
      osr_log_set_level(lvl);
    }
  }
  if ((cfg->tls_cert == NULL) != (cfg->tls_key == NULL)) {
    fprintf(stderr, "%s: --tls-cert and --tls-key go together\n", prog);
    return OSR_EINVAL;
  }
  if (cfg->nlisten == 0)
    cfg->listen[cfg->nlisten++] = "127.0.0.1:8080";
  return 0;
}

int osr_gateway_run(const osr_gateway_config_t *cfg)
{
  gateway_t gw;
  osr_http_server_opts_t opts;
  osr_tls_ctx_t *tls = NULL;

  /* Route libuv's and jansson's allocations through osr_mem before the
   * first loop exists. */
  if (osr_mem_install_deps() != 0)
    OSR_LOG_DEBUG("gateway", "libuv allocator already in use; not replaced");
  memset(&gw, 0, sizeof(gw));
  gw.drain_ms = cfg->drain_ms;
  signal(SIGPIPE, SIG_IGN);
  gw.loop = uv_default_loop();
  gw.started_ms = uv_now(gw.loop);

  if (cfg->tls_cert != NULL) {
    static const char *const alpn[] = {"h2", "http/1.1"};
    osr_tls_server_opts_t to = {cfg->tls_cert, cfg->tls_key, alpn, 2};
    /* Start-up, before the loop runs: a blocking load is fine here. */
    int rv = osr_tls_ctx_new_server(&to, &tls);
    if (rv != 0) {
      OSR_LOG_ERROR("gateway", "TLS certificate/key: %s", osr_strerror(rv));
      return 1;
    }
  }

  memset(&opts, 0, sizeof(opts));
  opts.handler.on_request = on_request;
  opts.data = &gw;
  opts.server_name = "osr/" OSR_VERSION;
  gw.http = osr_http_server_new(gw.loop, &opts);
  for (size_t i = 0; i < cfg->nlisten; i++) {
    int rv = osr_http_server_listen(gw.http, cfg->listen[i], tls);
    if (rv != 0) {
      OSR_LOG_ERROR("gateway", "listen %s: %s", cfg->listen[i], osr_strerror(rv));
      if (tls != NULL)
        osr_tls_ctx_unref(tls);
      /* Close what was opened so far and let the loop finish the closes. */
      osr_http_server_close(gw.http, 0, NULL, NULL);
      uv_run(gw.loop, UV_RUN_DEFAULT);
      uv_loop_close(gw.loop);
      return 1;
    }
    OSR_LOG_INFO("gateway", "listening on %s (port %d, %s)", cfg->listen[i],
                 osr_http_server_port(gw.http, i), tls != NULL ? "https" : "http");
  }
  if (tls != NULL)
    osr_tls_ctx_unref(tls);

  uv_signal_init(gw.loop, &gw.sigterm);
  uv_signal_init(gw.loop, &gw.sigint);
  gw.sigterm.data = gw.sigint.data = &gw;
  uv_signal_start(&gw.sigterm, on_signal, SIGTERM);
  uv_signal_start(&gw.sigint, on_signal, SIGINT);
  OSR_LOG_INFO("gateway", "osr %s ready (tls backend %s)", OSR_VERSION, OSR_TLS_BACKEND);

  uv_run(gw.loop, UV_RUN_DEFAULT);
  uv_loop_close(gw.loop);
  return 0;
}
