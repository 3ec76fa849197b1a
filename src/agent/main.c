/*
 * osr-agent main: flags, listeners, the access token, routing, shutdown.
 * See docs/agent.md for the flags and the HTTP surface.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/agent.h"
#include "osr_config.h"
#include "util/log.h"
#include "util/mem.h"

agent_t osr__agent;

static uv_signal_t sig_term, sig_int;

/* ---- users and paths ------------------------------------------------------------ */

static int fill_user(const char *name, uid_t uid, int by_name, agent_user_t *out)
{
  struct passwd pw, *res = NULL;
  char buf[4096];
  int rv = by_name ? getpwnam_r(name, &pw, buf, sizeof(buf), &res)
                   : getpwuid_r(uid, &pw, buf, sizeof(buf), &res);
  if (rv != 0 || res == NULL)
    return -1;
  snprintf(out->name, sizeof(out->name), "%s", pw.pw_name);
  snprintf(out->home, sizeof(out->home), "%s", pw.pw_dir != NULL ? pw.pw_dir : "/");
  out->uid = pw.pw_uid;
  out->gid = pw.pw_gid;
  return 0;
}

void osr__agent_resolve_user(const agent_t *a, const char *name, agent_user_t *out)
{
  *out = a->self;
  out->switch_ids = 0;
  if (name == NULL || name[0] == '\0' || strcmp(name, a->self.name) == 0)
    return;
  /* Only root can become someone else; a non-root agent runs everything as
   * itself (docs/agent.md, "Users"). */
  agent_user_t u;
  memset(&u, 0, sizeof(u));
  if (!a->is_root || fill_user(name, 0, 1, &u) != 0)
    return;
  u.switch_ids = u.uid != getuid() || u.gid != getgid();
  *out = u;
}

void osr__agent_req_username(const osr_http_req_t *req, char *out, size_t outsz)
{
  out[0] = '\0';
  const osr_iovec_t *v = osr_http_req_header(req, "authorization");
  if (v == NULL || v->len < 7 || v->len > 400 || strncasecmp(v->base, "Basic ", 6) != 0)
    return;
  char dec[320];
  long n = osr_b64_decode(v->base + 6, v->len - 6, dec);
  if (n <= 0)
    return;
  const char *colon = memchr(dec, ':', (size_t)n);
  size_t ulen = colon != NULL ? (size_t)(colon - dec) : (size_t)n;
  if (ulen >= outsz)
    return;
  memcpy(out, dec, ulen);
  out[ulen] = '\0';
}

int osr__agent_abs_path(const char *path, const char *home, char *out, size_t outsz)
{
  int n;
  if (path == NULL || path[0] == '\0')
    return OSR_EINVAL;
  if (path[0] == '/')
    n = snprintf(out, outsz, "%s", path);
  else if (path[0] == '~' && path[1] == '\0')
    n = snprintf(out, outsz, "%s", home);
  else if (path[0] == '~' && path[1] == '/')
    n = snprintf(out, outsz, "%s/%s", home, path + 2);
  else
    n = snprintf(out, outsz, "%s/%s", strcmp(home, "/") == 0 ? "" : home, path);
  if (n < 0 || (size_t)n >= outsz)
    return OSR_EINVAL;
  /* Lexical clean-up of "//", "/./" and "/../" (as Go's filepath.Clean),
   * so names in answers look like envd's. */
  char *r = out, *w = out;
  while (*r != '\0') {
    if (r[0] == '/' && r[1] == '/') {
      r++;
    } else if (r[0] == '/' && r[1] == '.' && (r[2] == '/' || r[2] == '\0')) {
      r += 2;
    } else if (r[0] == '/' && r[1] == '.' && r[2] == '.' && (r[3] == '/' || r[3] == '\0')) {
      r += 3;
      while (w > out && *--w != '/')
        ;
    } else {
      *w++ = *r++;
    }
  }
  if (w == out)
    *w++ = '/';
  else if (w > out + 1 && w[-1] == '/')
    w--;
  *w = '\0';
  return 0;
}

void osr__agent_send_http_error(osr_http_req_t *req, int status, const char *msg)
{
  json_t *j = json_pack("{s:i,s:s}", "code", status, "message", msg);
  char *s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  osr_http_send(req, status, "application/json", s, s != NULL ? strlen(s) : 0);
  osr_json_free(s);
}

/* ---- routing -------------------------------------------------------------------- */

static int path_is(const osr_http_req_t *req, const char *p)
{
  return req->path.len == strlen(p) && memcmp(req->path.base, p, req->path.len) == 0;
}

static int method_is(const osr_http_req_t *req, const char *m)
{
  return req->method.len == strlen(m) && memcmp(req->method.base, m, req->method.len) == 0;
}

/* Constant-time comparison: the time taken does not depend on where the
 * first difference is, so the token cannot be guessed byte by byte. */
static int token_ok(const agent_t *a, const osr_http_req_t *req)
{
  if (a->token == NULL)
    return 1;
  const osr_iovec_t *v = osr_http_req_header(req, "x-access-token");
  if (v == NULL)
    return 0;
  size_t tl = strlen(a->token);
  unsigned char diff = (unsigned char)(v->len != tl);
  for (size_t i = 0; i < tl; i++)
    diff |= (unsigned char)(a->token[i] ^ (i < v->len ? v->base[i] : 0));
  return diff == 0;
}

int osr__agent_files_signature_ok(agent_t *a, osr_http_req_t *req);

static void on_request(osr_http_req_t *req, void *data)
{
  agent_t *a = data;
  if (path_is(req, "/health")) {
    osr_http_send(req, 204, NULL, NULL, 0);
    return;
  }
  int is_files = path_is(req, "/files");
  if (!token_ok(a, req) && !(is_files && osr__agent_files_signature_ok(a, req))) {
    /* envd's shape: Connect JSON error for RPCs, {code,message} for HTTP. */
    if (req->path.len > 1 && memchr(req->path.base + 1, '.', req->path.len - 1) != NULL &&
        memchr(req->path.base + 1, '/', req->path.len - 1) != NULL) {
      static const char body[] =
          "{\"code\":\"unauthenticated\",\"message\":\"invalid access token\"}";
      osr_http_send(req, 401, "application/json", body, sizeof(body) - 1);
    } else {
      osr__agent_send_http_error(req, 401, "invalid access token");
    }
    return;
  }
  if (osr__agent_rpc_dispatch(a, req))
    return;
  if (is_files) {
    osr__agent_files(a, req);
    return;
  }
  if (path_is(req, "/_osr/info") && method_is(req, "GET")) {
    json_t *j = json_pack("{s:s,s:s,s:s,s:I}", "envdVersion", OSR_AGENT_ENVD_VERSION, "version",
                          OSR_VERSION, "user", a->self.name, "processes", (json_int_t)a->nprocs);
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    osr_http_send(req, 200, "application/json", s, strlen(s));
    osr_json_free(s);
    return;
  }
  if (req->path.len > 12 && memcmp(req->path.base, "/_osr/ports/", 12) == 0) {
    osr__agent_port_forward(a, req);
    return;
  }
  osr__agent_send_http_error(req, 404, "not found");
}

/* ---- start-up and shutdown ---------------------------------------------------------- */

static void on_server_closed(osr_http_server_t *srv, void *data)
{
  (void)srv;
  (void)data;
  osr__agent.server = NULL;
  uv_close((uv_handle_t *)&sig_term, NULL);
  uv_close((uv_handle_t *)&sig_int, NULL);
}

static void on_signal(uv_signal_t *h, int signum)
{
  (void)h;
  agent_t *a = &osr__agent;
  if (a->shutting_down)
    return;
  a->shutting_down = 1;
  OSR_LOG_INFO("agent", "signal %d: stopping (killing %zu process groups)", signum, a->nprocs);
  uv_signal_stop(&sig_term);
  uv_signal_stop(&sig_int);
  /* Children first: nothing we started may outlive us. */
  osr__agent_process_shutdown(a);
  osr_http_server_close(a->server, 2000, on_server_closed, NULL);
}

static void usage(FILE *f)
{
  fprintf(f, "usage: osr-agent [--listen ADDR]... [--token-file F] [--ring-bytes N]\n"
             "                 [--max-processes N] [--workdir DIR] [--env K=V]...\n"
             "                 [--log-level trace|debug|info|warn|error|off] [--log-json]\n"
             "       osr-agent --version\n"
             "ADDR: unix:/run/osr/agent.sock, 0.0.0.0:49983, [::1]:0 ...\n"
             "The access token comes from --token-file or $OSR_AGENT_TOKEN.\n");
}

static int num_arg(const char *s, uint64_t *out)
{
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (*s == '\0' || *end != '\0' || errno != 0)
    return -1;
  *out = v;
  return 0;
}

static char *read_token_file(const char *path)
{
  /* Start-up, before the loop runs: a blocking read is fine here. */
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return NULL;
  char buf[4096];
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
    n--;
  buf[n] = '\0';
  return osr_xstrdup(buf);
}

int main(int argc, char **argv)
{
  agent_t *a = &osr__agent;
  const char *listen[16];
  size_t nlisten = 0;
  const char *token_file = NULL;
  uint64_t v;

  memset(a, 0, sizeof(*a));
  a->ring_bytes = OSR_AGENT_DEFAULT_RING;
  a->max_procs = OSR_AGENT_DEFAULT_MAX_PROCS;
  a->envs = osr_xcalloc(1, sizeof(char *));

  for (int i = 1; i < argc; i++) {
    const char *o = argv[i];
    int has_val = i + 1 < argc;
    if (strcmp(o, "--version") == 0) {
      printf("osr-agent %s envd %s\n", OSR_VERSION, OSR_AGENT_ENVD_VERSION);
      return 0;
    } else if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(o, "--log-json") == 0) {
      osr_log_set_json(1);
    } else if (!has_val) {
      usage(stderr);
      return 2;
    } else if (strcmp(o, "--listen") == 0) {
      if (nlisten == OSR_ARRAY_SIZE(listen)) {
        fprintf(stderr, "osr-agent: too many --listen\n");
        return 2;
      }
      listen[nlisten++] = argv[++i];
    } else if (strcmp(o, "--token-file") == 0) {
      token_file = argv[++i];
    } else if (strcmp(o, "--ring-bytes") == 0) {
      if (num_arg(argv[++i], &v) != 0 || v < 2 * OSR_AGENT_CHUNK || v > (1ull << 32)) {
        fprintf(stderr, "osr-agent: --ring-bytes must be %d..4294967296\n", 2 * OSR_AGENT_CHUNK);
        return 2;
      }
      a->ring_bytes = (size_t)v;
    } else if (strcmp(o, "--max-processes") == 0) {
      if (num_arg(argv[++i], &v) != 0 || v == 0 || v > 100000) {
        fprintf(stderr, "osr-agent: bad --max-processes\n");
        return 2;
      }
      a->max_procs = (size_t)v;
    } else if (strcmp(o, "--workdir") == 0) {
      a->workdir = argv[++i];
    } else if (strcmp(o, "--env") == 0) {
      const char *kv = argv[++i];
      if (strchr(kv, '=') == NULL || kv[0] == '=') {
        fprintf(stderr, "osr-agent: --env wants K=V\n");
        return 2;
      }
      a->envs = osr_xrealloc(a->envs, (a->nenvs + 2) * sizeof(char *));
      a->envs[a->nenvs++] = osr_xstrdup(kv);
      a->envs[a->nenvs] = NULL;
    } else if (strcmp(o, "--log-level") == 0) {
      osr_log_level_t l;
      if (osr_log_parse_level(argv[++i], &l) != 0) {
        usage(stderr);
        return 2;
      }
      osr_log_set_level(l);
    } else {
      usage(stderr);
      return 2;
    }
  }
  if (nlisten == 0)
    listen[nlisten++] = "127.0.0.1:49983";

  if (token_file != NULL) {
    a->token = read_token_file(token_file);
    if (a->token == NULL) {
      fprintf(stderr, "osr-agent: cannot read %s: %s\n", token_file, strerror(errno));
      return 2;
    }
  } else if (getenv("OSR_AGENT_TOKEN") != NULL) {
    a->token = osr_xstrdup(getenv("OSR_AGENT_TOKEN"));
  }
  if (a->token != NULL && a->token[0] == '\0') {
    fprintf(stderr, "osr-agent: the access token is empty\n");
    return 2;
  }
  /* Do not hand the token to the processes we start. */
  unsetenv("OSR_AGENT_TOKEN");

  a->is_root = geteuid() == 0;
  if (fill_user(NULL, getuid(), 0, &a->self) != 0) {
    snprintf(a->self.name, sizeof(a->self.name), "%u", (unsigned)getuid());
    const char *h = getenv("HOME");
    snprintf(a->self.home, sizeof(a->self.home), "%s", h != NULL ? h : "/");
    a->self.uid = getuid();
    a->self.gid = getgid();
  }

  signal(SIGPIPE, SIG_IGN);
  a->loop = uv_default_loop();

  osr_http_server_opts_t opts;
  memset(&opts, 0, sizeof(opts));
  opts.handler.on_request = on_request;
  opts.data = a;
  opts.server_name = "osr-agent";
  /* Uploads stream to disk, so the body cap is about disk, not memory. */
  opts.limits.max_body = 1ull << 40;
  /* A streaming RPC may be silent for its keepalive interval (90 s by
   * default); the idle timeout must not cut it. */
  opts.limits.idle_timeout_ms = 600000;
  a->server = osr_http_server_new(a->loop, &opts);
  for (size_t i = 0; i < nlisten; i++) {
    int rv = osr_http_server_listen(a->server, listen[i], NULL);
    if (rv != 0) {
      fprintf(stderr, "osr-agent: listen %s: %s\n", listen[i], osr_strerror(rv));
      return 1;
    }
    printf("listening %s %d\n", listen[i], osr_http_server_port(a->server, i));
  }
  uv_signal_init(a->loop, &sig_term);
  uv_signal_init(a->loop, &sig_int);
  uv_signal_start(&sig_term, on_signal, SIGTERM);
  uv_signal_start(&sig_int, on_signal, SIGINT);
  printf("ready envd %s\n", OSR_AGENT_ENVD_VERSION);
  fflush(stdout);
  OSR_LOG_INFO("agent", "ready as %s (uid %u), ring %zu bytes, max %zu processes, token %s",
               a->self.name, (unsigned)a->self.uid, a->ring_bytes, a->max_procs,
               a->token != NULL ? "required" : "NONE");

  uv_run(a->loop, UV_RUN_DEFAULT);
  uv_loop_close(a->loop);
  for (size_t i = 0; i < a->nenvs; i++)
    osr_free(a->envs[i]);
  osr_free(a->envs);
  osr_free(a->token);
  return 0;
}
