/*
 * The gateway process (osr_gateway_main): configuration, data directory,
 * admin key and token signing keys, then the asynchronous start-up chain on
 * the loop
 *
 *   providers → store open → Redis → recover interrupted creates → reaper →
 *   HTTP listeners (TLS if configured) → serving
 *
 * and, on SIGTERM/SIGINT (or a start-up failure), the reverse
 *
 *   readyz 503 → drain HTTP (cfg->drain_ms) → stop the reaper → close the
 *   providers (in-flight provider calls are cancelled) → Redis → store
 *   (queued writes finish) → signal handles → the loop ends.
 *
 * Every step owns what it opened and the stop chain skips what never
 * opened, so a failure at any point frees everything (ASan's leak check at
 * exit holds us to that). A signal during start-up is remembered and acted
 * on when the running start step finishes, because most steps cannot be
 * interrupted half-way (a store open runs on its worker).
 */
#include "gateway/gateway.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <openssl/crypto.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/redis.h"
#include "gateway/api.h"
#include "gateway/api_int.h"
#include "gateway/gw.h"
#include "gateway/metrics.h"
#include "gateway/providers.h"
#include "gateway/reaper.h"
#include "net/http.h"
#include "net/tls.h"
#include "osr_config.h"
#include "store/store.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/fsutil.h"

#define MOD "gateway"

typedef struct main_s {
  osr_gw_t gw;
  osr_gw_config_t cfg;
  const char *prog;
  uv_signal_t sigterm, sigint;
  osr_tls_ctx_t *tls;
  int exit_code;
  int starting;       /* a start step is running */
  int stop_requested; /* signal or failure: stop when the running step ends */
  int stopping;
  int stop_step;
  const osr_gateway_embed_t *embed; /* osr_gateway_main_embed; NULL = none */
  int embed_running;                /* embed->start succeeded, stop not yet called */
} main_t;

static void stop_next(main_t *m);

/* ---- small start-up helpers (blocking is fine: the loop is not running) -- */

/* Read a key file: first line, surrounding whitespace trimmed. Returns the
 * length, 0 if empty, or a negative error. */
static int read_key_file(const char *path, char *out, size_t outlen)
{
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  ssize_t n = read(fd, out, outlen - 1);
  int err = errno;
  close(fd);
  if (n < 0)
    return -err;
  out[n] = '\0';
  char *nl = strpbrk(out, "\r\n");
  if (nl != NULL)
    *nl = '\0';
  size_t len = strlen(out);
  while (len > 0 && (out[len - 1] == ' ' || out[len - 1] == '\t'))
    out[--len] = '\0';
  size_t lead = strspn(out, " \t");
  memmove(out, out + lead, len - lead + 1);
  return (int)(len - lead);
}

/*
 * The admin key: cfg->admin_key (OSR_ADMIN_KEY / --admin-key / YAML), else
 * <data_dir>/admin.key, else a new random key written there with mode 0600
 * (O_EXCL, so two gateways starting at once agree on one key). Only its
 * SHA-256 stays in memory; the key itself is wiped. Never logged.
 */
static int setup_admin_key(main_t *m)
{
  char key[512];
  char path[4200];
  snprintf(path, sizeof(path), "%s/admin.key", m->cfg.data_dir);
  if (m->cfg.admin_key != NULL && m->cfg.admin_key[0] != '\0') {
    osr_sha256_hex(m->cfg.admin_key, strlen(m->cfg.admin_key), m->gw.admin_key_hash);
    OSR_LOG_INFO(MOD, "admin key: from the configuration (OSR_ADMIN_KEY)");
    return 0;
  }
  for (int tries = 0; tries < 2; tries++) {
    int n = read_key_file(path, key, sizeof(key));
    if (n > 0) {
      struct stat st;
      if (stat(path, &st) == 0 && (st.st_mode & 077) != 0)
        OSR_LOG_WARN(MOD, "%s is readable by group/others (chmod 600 it)", path);
      osr_sha256_hex(key, (size_t)n, m->gw.admin_key_hash);
      OPENSSL_cleanse(key, sizeof(key));
      OSR_LOG_INFO(MOD, "admin key: %s", path);
      return 0;
    }
    if (n == 0) {
      fprintf(stderr, "%s: %s is empty: delete it to generate a new admin key\n", m->prog, path);
      return OSR_EINVAL;
    }
    if (n != OSR_ENOENT) {
      fprintf(stderr, "%s: cannot read %s: %s\n", m->prog, path, osr__gw_strerror(n));
      return n;
    }
    /* Generate: "osr_" + 40 hex digits, like every key. */
    unsigned char r[20];
    static const char hex[] = "0123456789abcdef";
    osr_random_bytes(r, sizeof(r));
    memcpy(key, "osr_", 4);
    for (size_t i = 0; i < sizeof(r); i++) {
      key[4 + 2 * i] = hex[r[i] >> 4];
      key[5 + 2 * i] = hex[r[i] & 15];
    }
    key[44] = '\n';
    OPENSSL_cleanse(r, sizeof(r));
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST)
      continue; /* another gateway just wrote it: read theirs */
    if (fd < 0) {
      int err = -errno;
      fprintf(stderr, "%s: cannot create %s: %s\n", m->prog, path, osr__gw_strerror(err));
      OPENSSL_cleanse(key, sizeof(key));
      return err;
    }
    errno = 0;
    ssize_t w = write(fd, key, 45);
    int err = w == 45 && fsync(fd) == 0 ? 0 : (errno != 0 ? -errno : UV_EIO);
    close(fd);
    if (err != 0) {
      unlink(path);
      fprintf(stderr, "%s: cannot write %s: %s\n", m->prog, path, osr__gw_strerror(err));
      OPENSSL_cleanse(key, sizeof(key));
      return err;
    }
    osr_sha256_hex(key, 44, m->gw.admin_key_hash);
    OPENSSL_cleanse(key, sizeof(key));
    OSR_LOG_INFO(MOD, "admin key: generated into %s (mode 0600; `cat` it to use the admin API)",
                 path);
    return 0;
  }
  fprintf(stderr, "%s: cannot settle %s\n", m->prog, path);
  return OSR_EINVAL;
}

/* The store URL without credentials or query parameters, for messages:
 * "postgres://user:pw@host:5432/db?sslpassword=x" → "postgres://host:5432/db". */
static void url_for_humans(const char *url, char *out, size_t outlen)
{
  const char *scheme_end = strstr(url, "://");
  if (scheme_end == NULL) { /* sqlite:PATH has no secrets */
    snprintf(out, outlen, "%s", url);
    return;
  }
  const char *host = scheme_end + 3;
  const char *end = host + strcspn(host, "/?#");
  const char *at = NULL;
  for (const char *p = host; p < end; p++)
    if (*p == '@')
      at = p;
  if (at != NULL)
    host = at + 1;
  size_t path_len = strcspn(host, "?#");
  snprintf(out, outlen, "%.*s%.*s", (int)(scheme_end + 3 - url), url, (int)path_len, host);
}

/* ---- stop chain ----------------------------------------------------------- */

static void stop_next_cb(void *data)
{
  stop_next(data);
}

static void on_http_closed(osr_http_server_t *srv, void *data)
{
  main_t *m = data;
  (void)srv;
  m->gw.http = NULL;
  OSR_LOG_INFO(MOD, "drained");
  stop_next(m);
}

static void stop_next(main_t *m)
{
  osr_gw_t *gw = &m->gw;
  for (;;) {
    switch (m->stop_step++) {
    case 0:
      if (gw->http != NULL) {
        osr_http_server_close(gw->http, m->cfg.drain_ms, on_http_closed, m);
        return;
      }
      break;
    case 1:
      /* The embedded data plane drains after the API (no new creates hand
       * out tokens for it) and before Redis and the store close. */
      if (m->embed_running) {
        m->embed_running = 0;
        m->embed->stop(m->embed->data, m->cfg.drain_ms, stop_next_cb, m);
        return;
      }
      break;
    case 2:
      if (gw->reaper != NULL) {
        osr_reaper_t *r = gw->reaper;
        gw->reaper = NULL;
        osr_reaper_stop(r, stop_next_cb, m);
        return;
      }
      break;
    case 3:
      if (gw->providers != NULL) {
        osr_providers_t *p = gw->providers;
        gw->providers = NULL;
        osr_providers_close(p, stop_next_cb, m);
        return;
      }
      break;
    case 4:
      if (gw->redis != NULL) {
        osr_redis_t *r = gw->redis;
        gw->redis = NULL;
        osr_redis_close(r, stop_next_cb, m);
        return;
      }
      break;
    case 5:
      if (gw->store != NULL) {
        osr_store_t *st = gw->store;
        gw->store = NULL;
        osr_store_close(st, stop_next_cb, m);
        return;
      }
      break;
    default:
      /* Nothing left but the signal handles: closing them ends the loop. */
      if (!uv_is_closing((uv_handle_t *)&m->sigterm)) {
        uv_close((uv_handle_t *)&m->sigterm, NULL);
        uv_close((uv_handle_t *)&m->sigint, NULL);
      }
      OSR_LOG_INFO(MOD, "stopped (exit %d)", m->exit_code);
      return;
    }
  }
}

/* Begin stopping with `code` (unless a stop is already underway). */
static void stop(main_t *m, int code)
{
  if (code != 0 && m->exit_code == 0)
    m->exit_code = code;
  if (m->stopping)
    return;
  if (m->starting) { /* the running start step calls us back */
    m->stop_requested = 1;
    return;
  }
  m->stopping = 1;
  m->gw.draining = 1;
  stop_next(m);
}

static void on_signal(uv_signal_t *h, int signum)
{
  main_t *m = h->data;
  if (m->stopping || m->stop_requested)
    return;
  OSR_LOG_INFO(MOD, "signal %d: draining", signum);
  /* readyz turns 503 at once, even while a start step finishes. */
  m->gw.draining = 1;
  stop(m, 0);
}

/* ---- start chain ---------------------------------------------------------- */

/* A start step finished: continue only if nobody asked to stop meanwhile. */
static int step_ok(main_t *m)
{
  m->starting = 0;
  if (m->stop_requested) {
    stop(m, 0);
    return 0;
  }
  return 1;
}

static void serve(main_t *m)
{
  osr_gw_t *gw = &m->gw;
  osr_http_server_opts_t opts;
  memset(&opts, 0, sizeof(opts));
  opts.handler.on_request = osr_gw_api_on_request;
  opts.data = gw;
  opts.limits = m->cfg.http_limits;
  opts.server_name = "osr/" OSR_VERSION;
  gw->http = osr_http_server_new(gw->loop, &opts);
  for (size_t i = 0; i < m->cfg.nlisten; i++) {
    int rv = osr_http_server_listen(gw->http, m->cfg.listen[i], m->tls);
    if (rv != 0) {
      OSR_LOG_ERROR(MOD, "listen %s: %s", m->cfg.listen[i], osr__gw_strerror(rv));
      stop(m, 1);
      return;
    }
    /* Tests and scripts parse this line: keep its shape. */
    OSR_LOG_INFO(MOD, "listening on %s (port %d, %s)", m->cfg.listen[i],
                 osr_http_server_port(gw->http, i), m->tls != NULL ? "https" : "http");
  }
  /* After the API's "listening on" lines (scripts take the first one as the
   * API's port), before "ready". */
  if (m->embed != NULL && m->embed->start != NULL) {
    if (m->embed->attach != NULL)
      m->embed->attach(m->embed->data, gw);
    int rv = m->embed->start(m->embed->data, gw->loop, &m->cfg, gw->keyring,
                             gw->has_agent_secret ? gw->agent_secret : NULL);
    if (rv != 0) {
      fprintf(stderr, "%s: embedded data plane failed to start: %s\n", m->prog,
              osr__gw_strerror(rv));
      stop(m, 1);
      return;
    }
    m->embed_running = 1;
  }
  OSR_LOG_INFO(MOD, "osr %s ready (tls backend %s, store %s, %zu provider%s)", OSR_VERSION,
               OSR_TLS_BACKEND, osr_store_backend(gw->store), osr_providers_count(gw->providers),
               osr_providers_count(gw->providers) == 1 ? "" : "s");
}

static void on_recovered(osr_gw_t *gw, int status)
{
  main_t *m = osr_container_of(gw, main_t, gw);
  /* Recovery that could not finish (a provider down) is not fatal: the
   * reaper's reconciliation settles what is left, and the rows stay
   * `creating` until then. */
  if (status != 0)
    OSR_LOG_WARN(MOD, "recovery of interrupted creates incomplete: %s", osr__gw_strerror(status));
  if (!step_ok(m))
    return;
  int rv = osr_reaper_start(gw, &gw->reaper);
  if (rv != 0) {
    gw->reaper = NULL;
    OSR_LOG_ERROR(MOD, "reaper: %s", osr__gw_strerror(rv));
    stop(m, 1);
    return;
  }
  serve(m);
}

static void on_store_open(osr_store_t *st, int status, void *data)
{
  main_t *m = data;
  osr_gw_t *gw = &m->gw;
  char url[512];
  url_for_humans(m->cfg.store_url, url, sizeof(url));
  if (status != 0) {
    OSR_LOG_ERROR(MOD, "store %s: %s", url, osr__gw_strerror(status));
    fprintf(stderr, "%s: cannot open the store %s: %s\n", m->prog, url, osr__gw_strerror(status));
    m->starting = 0;
    gw->store = st; /* closed by the stop chain */
    stop(m, 1);
    return;
  }
  gw->store = st;
  OSR_LOG_INFO(MOD, "store: %s (%s)", url, osr_store_backend(st));
  if (!step_ok(m))
    return;

  if (m->cfg.redis_url != NULL && m->cfg.redis_url[0] != '\0') {
    osr_redis_opts_t ro;
    memset(&ro, 0, sizeof(ro));
    ro.url = m->cfg.redis_url;
    int rv = osr_redis_new(gw->loop, &ro, &gw->redis);
    url_for_humans(m->cfg.redis_url, url, sizeof(url));
    if (rv != 0) {
      gw->redis = NULL;
      fprintf(stderr, "%s: redis %s: %s\n", m->prog, url, osr__gw_strerror(rv));
      stop(m, 2);
      return;
    }
    /* Connects in the background; the gateway works without it. */
    OSR_LOG_INFO(MOD, "redis: %s", url);
  }
  m->starting = 1;
  osr_gw_recover(gw, on_recovered);
}

/* ---- entry point ---------------------------------------------------------- */

int osr_gateway_main(int argc, char **argv, const char *prog)
{
  return osr_gateway_main_embed(argc, argv, prog, NULL);
}

int osr_gateway_main_embed(int argc, char **argv, const char *prog,
                           const osr_gateway_embed_t *embed)
{
  char err[512];
  main_t *m;
  int rv;

  /* Route libuv's and jansson's allocations through osr_mem before the
   * first loop exists. */
  if (osr_mem_install_deps() != 0)
    OSR_LOG_DEBUG(MOD, "libuv allocator already in use; not replaced");
  signal(SIGPIPE, SIG_IGN);
#ifdef __GLIBC__
  /* A fixed mmap threshold: glibc otherwise raises it to the size of every
   * large block freed (up to 32 MiB), after which the reaper's per-pass
   * arrays and a provider's list answer (megabytes at 10,000 sandboxes)
   * come from the heap and their pages stay in the RSS after free. With
   * the threshold fixed, blocks over 256 KiB are mapped and unmapped. */
  (void)mallopt(M_MMAP_THRESHOLD, 256 * 1024);
#endif

  m = osr_xcalloc(1, sizeof(*m));
  m->prog = prog;
  m->embed = embed;
  rv = osr_gw_config_load(&m->cfg, argc, argv, err, sizeof(err));
  if (rv == 1) {
    osr_gw_config_usage(stdout, prog);
    osr_gw_config_dispose(&m->cfg);
    osr_free(m);
    return 0;
  }
  if (rv != 0) {
    fprintf(stderr, "%s: %s\n", prog, err[0] ? err : "invalid configuration");
    osr_free(m);
    return 2;
  }

  osr_gw_t *gw = &m->gw;
  gw->cfg = &m->cfg;
  gw->started_ms = osr_now_ms();

  rv = osr_mkdir_p(m->cfg.data_dir, 0700);
  if (rv != 0) {
    fprintf(stderr, "%s: data directory %s: %s\n", prog, m->cfg.data_dir, osr__gw_strerror(rv));
    osr_gw_config_dispose(&m->cfg);
    osr_free(m);
    return 1;
  }
  rv = setup_admin_key(m);
  if (rv != 0) {
    osr_gw_config_dispose(&m->cfg);
    osr_free(m);
    return 1;
  }
  /* The token signing keys (created on first start; docs/tokens.md). */
  rv = osr_gw_keyring_open(gw, err, sizeof(err));
  if (rv != 0) {
    fprintf(stderr, "%s: token keys: %s\n", prog, err);
    osr_gw_config_dispose(&m->cfg);
    osr_free(m);
    return 1;
  }
  /* The agent secret next to the signing keys (created on first start):
   * sandboxes' agents check tokens derived from it (docs/tokens.md). */
  {
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", m->cfg.token_keys_dir, OSR_AGENT_SECRET_FILE);
    rv = osr_agent_secret_load(path, 1, gw->agent_secret, err, sizeof(err));
    if (rv != 0) {
      fprintf(stderr, "%s: agent secret: %s\n", prog, err);
      osr_gw_keyring_close(gw);
      osr_gw_config_dispose(&m->cfg);
      osr_free(m);
      return 1;
    }
    gw->has_agent_secret = 1;
  }
  if (m->cfg.tls_cert != NULL) {
    static const char *const alpn[] = {"h2", "http/1.1"};
    osr_tls_server_opts_t to = {m->cfg.tls_cert, m->cfg.tls_key, alpn, 2};
    /* Start-up, before the loop runs: a blocking load is fine here. */
    rv = osr_tls_ctx_new_server(&to, &m->tls);
    if (rv != 0) {
      OSR_LOG_ERROR(MOD, "TLS certificate/key: %s", osr__gw_strerror(rv));
      osr_gw_keyring_close(gw);
      osr_gw_config_dispose(&m->cfg);
      osr_free(m);
      return 1;
    }
  }

  gw->loop = uv_default_loop();
  gw->metrics = osr_metrics_new();
  osr_gw_api_init(gw);
  /* The signal handles also keep the loop alive while the store opens (its
   * async handle is unreferenced). */
  uv_signal_init(gw->loop, &m->sigterm);
  uv_signal_init(gw->loop, &m->sigint);
  m->sigterm.data = m->sigint.data = m;
  uv_signal_start(&m->sigterm, on_signal, SIGTERM);
  uv_signal_start(&m->sigint, on_signal, SIGINT);

  rv = osr_providers_new(gw->loop, m->cfg.providers, m->cfg.price_overrides, &m->cfg.breaker,
                         &gw->providers, err, sizeof(err));
  if (rv != 0) {
    gw->providers = NULL;
    fprintf(stderr, "%s: %s\n", prog, err[0] ? err : "invalid provider configuration");
    stop(m, 2);
  } else {
    m->starting = 1;
    rv = osr_store_open(gw->loop, m->cfg.store_url, on_store_open, m, &gw->store);
    if (rv != 0) {
      char url[512];
      url_for_humans(m->cfg.store_url, url, sizeof(url));
      fprintf(stderr, "%s: store %s: %s\n", prog, url, osr__gw_strerror(rv));
      m->starting = 0;
      gw->store = NULL;
      stop(m, rv == OSR_EINVAL ? 2 : 1);
    }
  }

  uv_run(gw->loop, UV_RUN_DEFAULT);
  rv = uv_loop_close(gw->loop);
  if (rv != 0)
    OSR_LOG_WARN(MOD, "loop closed with handles open: %s", osr__gw_strerror(rv));
  if (m->tls != NULL)
    osr_tls_ctx_unref(m->tls);
  osr_gw_api_dispose(gw);
  osr_metrics_free(gw->metrics);
  osr_gw_keyring_close(gw);
  OPENSSL_cleanse(gw->agent_secret, sizeof(gw->agent_secret));
  osr_agent_key_free(gw->agent_key);
  gw->agent_key = NULL;
  osr_gw_config_dispose(&m->cfg);
  int code = m->exit_code;
  osr_free(m);
  return code;
}
