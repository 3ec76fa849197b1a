/*
 * osr-agent main: flags, listeners, the access token, routing, shutdown.
 * See docs/agent.md for the flags and the HTTP surface.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <nss.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/spawn.h"
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

int osr__agent_user_is_self(const agent_t *a, const char *name)
{
  /* Only root can become someone else; a non-root agent runs everything as
   * itself (docs/agent.md, "Users"). */
  return name == NULL || name[0] == '\0' || strcmp(name, a->self.name) == 0 || !a->is_root;
}

void osr__agent_resolve_user(const agent_t *a, const char *name, agent_user_t *out)
{
  *out = a->self;
  out->switch_ids = 0;
  if (osr__agent_user_is_self(a, name))
    return;
  agent_user_t u;
  memset(&u, 0, sizeof(u));
  if (fill_user(name, 0, 1, &u) != 0)
    return;
  u.switch_ids = u.uid != getuid() || u.gid != getgid();
  *out = u;
}

void osr__agent_req_username(const osr_http_req_t *req, char *out, size_t outsz)
{
  /* No user named: the default user (envd's defaultUser), copied here on
   * the loop thread so jobs never read a->default_user while /init may
   * change it. */
  snprintf(out, outsz, "%s", osr__agent.default_user);
  const osr_iovec_t *v = osr_http_req_header(req, "authorization");
  if (v == NULL || v->len < 7 || v->len > 400 || strncasecmp(v->base, "Basic ", 6) != 0)
    return;
  char dec[320];
  long n = osr_b64_decode(v->base + 6, v->len - 6, dec);
  if (n <= 0)
    return;
  const char *colon = memchr(dec, ':', (size_t)n);
  size_t ulen = colon != NULL ? (size_t)(colon - dec) : (size_t)n;
  if (ulen == 0 || ulen >= outsz)
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

/* ---- POST /init (envd's orchestrator call) ------------------------------------------ */

void osr__agent_setenv(agent_t *a, const char *kv)
{
  size_t kl = (size_t)(strchr(kv, '=') - kv);
  for (size_t i = 0; i < a->nenvs; i++) {
    if (strncmp(a->envs[i], kv, kl + 1) == 0) {
      osr_free(a->envs[i]);
      a->envs[i] = osr_xstrdup(kv);
      return;
    }
  }
  a->envs = osr_xrealloc(a->envs, (a->nenvs + 2) * sizeof(char *));
  a->envs[a->nenvs++] = osr_xstrdup(kv);
  a->envs[a->nenvs] = NULL;
}

static int digits(const char **p, int n, int *out)
{
  int v = 0;
  for (int i = 0; i < n; i++, (*p)++) {
    if (**p < '0' || **p > '9')
      return -1;
    v = v * 10 + (**p - '0');
  }
  *out = v;
  return 0;
}

int osr__agent_parse_rfc3339(const char *s, int64_t *ns)
{
  int Y, M, D, h, m, sec;
  const char *p = s;
  if (digits(&p, 4, &Y) || *p++ != '-' || digits(&p, 2, &M) || *p++ != '-' || digits(&p, 2, &D) ||
      (*p != 'T' && *p != 't' && *p != ' ') || !*p++ || digits(&p, 2, &h) || *p++ != ':' ||
      digits(&p, 2, &m) || *p++ != ':' || digits(&p, 2, &sec))
    return -1;
  if (M < 1 || M > 12 || D < 1 || D > 31 || h > 23 || m > 59 || sec > 60)
    return -1;
  int64_t frac = 0;
  if (*p == '.') {
    p++;
    int n = 0;
    while (*p >= '0' && *p <= '9') {
      if (n < 9)
        frac = frac * 10 + (*p - '0');
      n++;
      p++;
    }
    if (n == 0)
      return -1;
    for (; n < 9; n++)
      frac *= 10;
  }
  int64_t off = 0;
  if (*p == 'Z' || *p == 'z') {
    p++;
  } else if (*p == '+' || *p == '-') {
    int sign = *p++ == '-' ? -1 : 1, oh, om;
    if (digits(&p, 2, &oh) || *p++ != ':' || digits(&p, 2, &om) || oh > 23 || om > 59)
      return -1;
    off = sign * (int64_t)(oh * 3600 + om * 60);
  } else {
    return -1;
  }
  if (*p != '\0')
    return -1;
  /* Days from the civil date (Howard Hinnant's algorithm): no timegm, no
   * locale, no TZ lookups. */
  int y = Y - (M <= 2);
  int64_t era = (y >= 0 ? y : y - 399) / 400;
  int64_t yoe = y - era * 400;
  int64_t doy = (153 * (M + (M > 2 ? -3 : 9)) + 2) / 5 + D - 1;
  int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  int64_t days = era * 146097 + doe - 719468;
  *ns = ((days * 86400 + h * 3600 + m * 60 + sec) - off) * 1000000000 + frac;
  return 0;
}

/* Apply an /init body. Validates everything before changing anything, so a
 * bad request changes nothing. Returns 0 or an error message. */
static const char *apply_init(agent_t *a, json_t *j)
{
  json_t *ts = json_object_get(j, "timestamp");
  json_t *env = json_object_get(j, "envVars");
  json_t *tok = json_object_get(j, "accessToken");
  json_t *user = json_object_get(j, "defaultUser");
  json_t *wd = json_object_get(j, "defaultWorkdir");
  int64_t t = 0;
  const char *k;
  json_t *v;
  if (ts != NULL && !json_is_null(ts) &&
      (!json_is_string(ts) || osr__agent_parse_rfc3339(json_string_value(ts), &t) != 0))
    return "timestamp: expected an RFC 3339 time";
  if (env != NULL && !json_is_null(env)) {
    if (!json_is_object(env) || json_object_size(env) > 1024)
      return "envVars: expected an object of at most 1024 strings";
    json_object_foreach(env, k, v)
    {
      if (!json_is_string(v) || k[0] == '\0' || strchr(k, '=') != NULL ||
          strlen(k) + json_string_length(v) > 65536)
        return "envVars: names must be non-empty without '=', values strings";
    }
  }
  /* An empty token would open the API: refuse it rather than guess. */
  if (tok != NULL && !json_is_null(tok) &&
      (!json_is_string(tok) || json_string_length(tok) == 0 || json_string_length(tok) > 4096))
    return "accessToken: expected a non-empty string";
  if (user != NULL && !json_is_null(user) &&
      (!json_is_string(user) || json_string_length(user) >= sizeof(a->default_user)))
    return "defaultUser: expected a user name";
  if (wd != NULL && !json_is_null(wd) &&
      (!json_is_string(wd) || json_string_length(wd) >= 4096 ||
       (json_string_length(wd) > 0 && json_string_value(wd)[0] != '/')))
    return "defaultWorkdir: expected an absolute path";

  /* envd (lastSetTime.SetToGreater): an /init older than the newest one
   * applied is acknowledged and ignored, so a delayed retry cannot undo a
   * newer call. Without a timestamp it always applies. */
  if (ts != NULL && !json_is_null(ts)) {
    if (t <= a->init_ts_ns) {
      OSR_LOG_INFO("agent", "/init: timestamp not newer than the last one, ignored");
      return NULL;
    }
    a->init_ts_ns = t;
  }
  if (json_is_object(env)) {
    json_object_foreach(env, k, v)
    {
      size_t kl = strlen(k), vl = json_string_length(v);
      char *kv = osr_xmalloc(kl + vl + 2);
      memcpy(kv, k, kl);
      kv[kl] = '=';
      memcpy(kv + kl + 1, json_string_value(v), vl + 1);
      osr__agent_setenv(a, kv);
      osr_free(kv);
    }
  }
  if (json_is_string(tok)) {
    /* The swap is atomic for every request: all token checks run on this
     * thread, before and after this line. Requests already accepted keep
     * running; the next one needs the new token. */
    osr_free(a->token);
    a->token = osr_xstrdup(json_string_value(tok));
  }
  if (json_is_string(user))
    snprintf(a->default_user, sizeof(a->default_user), "%s", json_string_value(user));
  if (json_is_string(wd)) {
    osr_free(a->workdir);
    a->workdir = json_string_length(wd) > 0 ? osr_xstrdup(json_string_value(wd)) : NULL;
  }
  OSR_LOG_INFO(
      "agent", "/init: %zu env vars%s%s%s", json_is_object(env) ? json_object_size(env) : 0,
      json_is_string(tok) ? ", new access token" : "",
      json_is_string(user) ? ", default user " : "", json_is_string(user) ? a->default_user : "");
  return NULL;
}

static void on_init_body(osr_http_req_t *req, osr_iovec_t body, int status)
{
  agent_t *a = &osr__agent;
  if (status != 0) {
    osr__agent_send_http_error(req, status == OSR_ETOOLARGE ? 413 : 400, "bad request body");
    return;
  }
  const char *err = NULL;
  json_t *j = NULL;
  if (body.len > 0) {
    json_error_t jerr;
    j = json_loadb(body.base, body.len, JSON_REJECT_DUPLICATES, &jerr);
    if (j == NULL || !json_is_object(j))
      err = "the body is not a JSON object";
  }
  if (err == NULL && j != NULL)
    err = apply_init(a, j);
  json_decref(j);
  if (err != NULL) {
    osr__agent_send_http_error(req, 400, err);
    return;
  }
  osr_http_header_t h = {OSR_IOV_LIT("cache-control"), OSR_IOV_LIT("no-store")};
  if (osr_http_respond(req, 204, &h, 1, 0) == 0)
    osr_http_write(req, NULL, 0, 1, NULL, NULL);
}

void osr__agent_init(agent_t *a, osr_http_req_t *req)
{
  (void)a;
  if (req->method.len != 4 || memcmp(req->method.base, "POST", 4) != 0) {
    osr__agent_send_http_error(req, 405, "method not allowed");
    return;
  }
  if (osr_http_req_read_body(req, 1 << 20, on_init_body) != 0)
    osr__agent_send_http_error(req, 500, "cannot read the request body");
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
  if (path_is(req, "/init")) {
    osr__agent_init(a, req);
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
             "                 [--default-user NAME] [--prewarm SHELL-COMMAND]\n"
             "                 [--sched batch|normal]\n"
             "                 [--log-level trace|debug|info|warn|error|off] [--log-json]\n"
             "       osr-agent --version\n"
             "ADDR: unix:/run/osr/agent.sock, 0.0.0.0:49983, [::1]:0 ...\n"
             "The access token comes from --token-file or $OSR_AGENT_TOKEN.\n");
}

/* ---- --sched ------------------------------------------------------------------------- */

/* The agent relays its processes' output: each write of a process wakes
 * it, and when the process, the agent and the reader of the stream share a
 * CPU, a woken agent preempts the writer (wakeup preemption) after every
 * few KiB, then wakes its own reader, which preempts it in turn: a 1 GiB
 * exec stdout took ~150,000 context switches each in the agent and in
 * osr-dataplane. As SCHED_BATCH the agent does not preempt on wakeup; it
 * runs when the writer blocks or its slice ends and then moves a socket
 * buffer's worth at once (~14,000 switches, under half the CPU per byte;
 * bench/README.md "1 GiB rows, second pass"). The cost is the agent's own
 * wake-up latency on a contended CPU (it waits for the running task's
 * slice), which only its API calls see. The processes it starts get
 * SCHED_OTHER back (spawn.c's child). Best effort: a sandbox kernel that
 * refuses it (gVisor may) leaves the default policy. */
static void apply_sched(int batch)
{
  if (!batch)
    return;
  struct sched_param sp = {.sched_priority = 0};
  if (sched_setscheduler(0, SCHED_BATCH, &sp) != 0)
    OSR_LOG_DEBUG("agent", "SCHED_BATCH refused: %s", strerror(errno));
}

/* ---- start-up ------------------------------------------------------------------------ */

/* libuv's thread pool starts on the first uv_queue_work, which creates its
 * threads and waits until each runs: in a fresh gVisor sandbox that was the
 * first Start's work (its user and cwd lookup), four thread creations
 * through the sentry (runsc --strace: ~3 ms of the first command's 10 ms
 * from accept to clone). Started here instead, while the sandbox boots or
 * waits in the warm pool; the threads are the agent's own, nothing a user
 * of the sandbox can see (no process, no output). */
static void pool_noop(uv_work_t *w)
{
  (void)w;
}

static void pool_noop_done(uv_work_t *w, int status)
{
  (void)status;
  osr_free(w);
}

static void start_thread_pool(uv_loop_t *loop)
{
  uv_work_t *w = osr_xcalloc(1, sizeof(*w));
  if (uv_queue_work(loop, w, pool_noop, pool_noop_done) != 0)
    osr_free(w);
}

/* ---- --prewarm ---------------------------------------------------------------------- */

/* The first command a gVisor sandbox runs pays for what its sentry has not
 * cached yet: /bin/sh, ld.so and libc looked up and mapped through the
 * gofer, the first process stubs of the ptrace platform (~5 ms measured,
 * bench/results/tti.md). A warm-pool sandbox pays that while it waits in
 * the pool instead: the provider passes --prewarm, and the agent runs the
 * command through its own spawn path once and waits for it before it
 * listens, so the sandbox is not ready (never handed out) until then.
 * Bounded: after PREWARM_MAX_MS the command's process group is killed. */
#define PREWARM_MAX_MS 3000

typedef struct prewarm_s {
  agent_child_t *c;
  uv_timer_t timer;
  int done;
} prewarm_t;

static void on_prewarm_exit(agent_child_t *c, int64_t exit_status, int term_signal)
{
  prewarm_t *pw = c->data;
  pw->c = NULL;
  pw->done = 1;
  OSR_LOG_DEBUG("agent", "prewarm done: status %lld signal %d", (long long)exit_status,
                term_signal);
}

static void on_prewarm_timeout(uv_timer_t *t)
{
  prewarm_t *pw = t->data;
  if (pw->c != NULL)
    kill(-pw->c->pid, SIGKILL);
}

static void prewarm(uv_loop_t *loop, const char *cmd)
{
  char *argv[] = {(char *)"/bin/sh", (char *)"-c", (char *)cmd, NULL};
  agent_spawn_opts_t o;
  memset(&o, 0, sizeof(o));
  o.file = "/bin/sh";
  o.argv = argv;
  o.env = environ;
  o.stdio[0] = o.stdio[1] = o.stdio[2] = -1;
  o.new_session = 1;
  prewarm_t pw;
  memset(&pw, 0, sizeof(pw));
  int rv = osr__agent_spawn(loop, &o, on_prewarm_exit, &pw.c);
  if (rv != 0) {
    OSR_LOG_INFO("agent", "prewarm: %s", uv_strerror(rv));
    return;
  }
  pw.c->data = &pw;
  uv_timer_init(loop, &pw.timer);
  pw.timer.data = &pw;
  uv_timer_start(&pw.timer, on_prewarm_timeout, PREWARM_MAX_MS, 0);
  /* Nothing else is on the loop yet: this waits for the child's SIGCHLD
   * (after a SIGKILL at the latest). */
  while (!pw.done)
    uv_run(loop, UV_RUN_ONCE);
  uv_close((uv_handle_t *)&pw.timer, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
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
  const char *default_user = NULL;
  const char *prewarm_cmd = NULL;
  int sched_batch = 1;
  uint64_t v;

  memset(a, 0, sizeof(*a));
  /* Users and groups come from the sandbox's /etc/passwd and /etc/group
   * only: glibc's built-in "files" service, never an NSS module loaded per
   * nsswitch.conf (libnss_systemd, sssd...). A static agent (src/meson.build)
   * cannot dlopen those safely, and inside gVisor every extra shared object
   * costs milliseconds of the first lookup. Host names likewise: files, dns. */
  __nss_configure_lookup("passwd", "files");
  __nss_configure_lookup("group", "files");
  __nss_configure_lookup("hosts", "files dns");
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
      osr_free(a->workdir);
      a->workdir = osr_xstrdup(argv[++i]);
    } else if (strcmp(o, "--default-user") == 0) {
      default_user = argv[++i];
      if (strlen(default_user) >= sizeof(a->default_user)) {
        fprintf(stderr, "osr-agent: --default-user is too long\n");
        return 2;
      }
    } else if (strcmp(o, "--prewarm") == 0) {
      prewarm_cmd = argv[++i];
    } else if (strcmp(o, "--env") == 0) {
      const char *kv = argv[++i];
      if (strchr(kv, '=') == NULL || kv[0] == '=') {
        fprintf(stderr, "osr-agent: --env wants K=V\n");
        return 2;
      }
      osr__agent_setenv(a, kv);
    } else if (strcmp(o, "--sched") == 0) {
      const char *pol = argv[++i];
      if (strcmp(pol, "batch") != 0 && strcmp(pol, "normal") != 0) {
        fprintf(stderr, "osr-agent: --sched is batch or normal\n");
        return 2;
      }
      sched_batch = strcmp(pol, "batch") == 0;
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
  apply_sched(sched_batch);

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
  /* The default user of requests that name none. envd's sandboxes run
   * commands as "user" (home /home/user) unless told otherwise; an agent
   * running as root does the same when that user exists. Start-up, before
   * the loop: a blocking getpwnam is fine here. */
  if (default_user != NULL) {
    snprintf(a->default_user, sizeof(a->default_user), "%s", default_user);
  } else if (a->is_root) {
    agent_user_t u;
    if (fill_user("user", 0, 1, &u) == 0)
      snprintf(a->default_user, sizeof(a->default_user), "user");
  }

  signal(SIGPIPE, SIG_IGN);
  osr__agent_spawn_init_signals();
  a->loop = uv_default_loop();
  if (prewarm_cmd != NULL)
    prewarm(a->loop, prewarm_cmd);

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
  /* A data plane multiplexes its exec sessions to this agent over shared
   * h2c connections, two streams per session at most (output + one control
   * call): 1024 streams let one connection carry 512 sessions
   * (docs/dataplane.md "How exec upstreams are multiplexed"). */
  opts.limits.h2_max_streams = 1024;
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
  start_thread_pool(a->loop);
  /* The dispositions and the policy every command must not inherit are
   * final now (spawn.h): after the thread pool, since glibc gives its
   * internal signal 33 a handler when the first thread starts. */
  osr__agent_spawn_snapshot();
  printf("ready envd %s\n", OSR_AGENT_ENVD_VERSION);
  fflush(stdout);
  OSR_LOG_INFO("agent", "ready as %s (uid %u), ring %zu bytes, max %zu processes, token %s",
               a->self.name, (unsigned)a->self.uid, a->ring_bytes, a->max_procs,
               a->token != NULL ? "required" : "NONE");

  uv_run(a->loop, UV_RUN_DEFAULT);
  /* The SIGCHLD watcher (spawn.c) does not keep the loop alive once no
   * process is watched; close it so the loop can be closed. */
  osr__agent_spawn_close();
  uv_run(a->loop, UV_RUN_NOWAIT);
  uv_loop_close(a->loop);
  for (size_t i = 0; i < a->nenvs; i++)
    osr_free(a->envs[i]);
  osr_free(a->envs);
  osr_free(a->token);
  osr_free(a->workdir);
  return 0;
}
