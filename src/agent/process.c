/*
 * process.Process for osr-agent (contract §4).
 *
 * Each started process gets a record with its pipes, a bounded output ring
 * (ring.h) and a list of subscribers: the Start stream and any Connect
 * streams. Output is read straight into the ring (no copy on the way in),
 * and each subscriber sends it from its own cursor, one data event of at
 * most 32 KiB (JSON) or 256 KiB (protobuf codec) per frame. The ring is
 * the only buffer between the process and its clients, so:
 *   - a slow client: its cursor lags, the ring's room (relative to the
 *     slowest cursor) shrinks, and below one read's worth the pipes stop
 *     being read; the process then blocks on its own writes, which is the
 *     backpressure the kernel already implements;
 *   - no client: nothing is pinned, the ring keeps the newest bytes and the
 *     process runs on (envd semantics: a closed stream does not kill it).
 * A client re-attaches with Connect and may ask for an absolute output
 * offset (OSR extension "outputOffset", docs/agent.md).
 *
 * Children are spawned detached (setsid), so each is a process-group leader
 * and signals and shutdown reach everything it started. They are spawned by
 * spawn.c (clone with CLONE_VM | CLONE_VFORK, not libuv's fork: see
 * spawn.h), which also makes a pty the controlling terminal of a pty child
 * between setsid() and the exec (TIOCSCTTY), or a shell on it would have no
 * job control, Ctrl-C would send nothing and a resize no SIGWINCH.
 */
#include <errno.h>
#include <fcntl.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/procpb.h"
#include "agent/ring.h"
#include "agent/spawn.h"
#include "util/log.h"
#include "util/mem.h"

enum { KIND_STDOUT = 1, KIND_STDERR = 2, KIND_PTY = 3 };

/* After a pty process exited, its output ends at the master's EIO or after
 * this long without output, whichever comes first (on_pty_grace). */
#define PTY_EXIT_GRACE_MS 250

#define STDIN_QUEUE_MAX (16 * 1024 * 1024)
#define KEEPALIVE_EVENT "{\"event\":{\"keepalive\":{}}}"

typedef struct sub_s {
  agent_proc_t *p;
  agent_stream_t *st;
  uint64_t cursor;
  int end_sent;
  int is_start; /* the Start stream (gets deadline_exceeded) */
  int in_pump;  /* sub_pump is running: sends re-enter via on_writable */
  int binary;   /* the stream uses the protobuf codec (procpb.h) */
  struct sub_s *next;
} sub_t;

struct agent_proc_s {
  agent_t *a;
  agent_proc_t *prev, *next;
  agent_child_t *child; /* spawn.c's record until the child is reaped */
  uv_pipe_t out, err, in;
  uv_timer_t deadline, retain;
  int handles; /* initialised handles not yet closed */
  int out_init, err_init, in_init;
  int out_open, err_open; /* read side not at EOF yet */
  int in_open;            /* stdin writable (pipe, or the pty master) */
  int reading;
  int is_pty;
  int master_fd;
  uint32_t pid;
  char *tag;
  json_t *config; /* {cmd,args,envs,cwd} for List */
  osr_ring_t ring;
  sub_t *subs;
  int exited, ended, timed_out, closing, spawned;
  int64_t exit_status;
  int term_signal;
  size_t stdin_queued;
};

static void proc_pump_all(agent_proc_t *p);
static void proc_update_reading(agent_proc_t *p);
static void on_pty_grace(uv_timer_t *t);
static void proc_close(agent_proc_t *p);

/* ---- lookup ------------------------------------------------------------------------ */

static agent_proc_t *find_proc(agent_t *a, json_t *sel, int include_exited)
{
  if (!json_is_object(sel))
    return NULL;
  json_t *pid = json_object_get(sel, "pid");
  json_t *tag = json_object_get(sel, "tag");
  for (agent_proc_t *p = a->procs; p != NULL; p = p->next) {
    if (p->closing || (!include_exited && p->exited))
      continue;
    if (json_is_integer(pid) && (json_int_t)p->pid == json_integer_value(pid))
      return p;
    if (json_is_string(tag) && p->tag != NULL && strcmp(p->tag, json_string_value(tag)) == 0)
      return p;
  }
  return NULL;
}

static void not_found(agent_call_t *call, json_t *sel)
{
  json_t *pid = json_object_get(sel, "pid"), *tag = json_object_get(sel, "tag");
  if (json_is_integer(pid))
    agent_call_error(call, OSR_CX_NOT_FOUND, "process with pid %lld not found",
                     (long long)json_integer_value(pid));
  else if (json_is_string(tag))
    agent_call_error(call, OSR_CX_NOT_FOUND, "process with tag %s not found",
                     json_string_value(tag));
  else
    agent_call_error(call, OSR_CX_INVALID_ARGUMENT, "process selector required");
}

/* ---- lifecycle --------------------------------------------------------------------- */

static void on_handle_closed(uv_handle_t *h)
{
  agent_proc_t *p = h->data;
  if (--p->handles > 0)
    return;
  osr_ring_dispose(&p->ring);
  if (p->config != NULL)
    json_decref(p->config);
  osr_free(p->tag);
  osr_free(p);
}

static void close_handle(agent_proc_t *p, uv_handle_t *h)
{
  if (!uv_is_closing(h))
    uv_close(h, on_handle_closed);
}

static void unlink_proc(agent_proc_t *p)
{
  agent_t *a = p->a;
  if (p->prev != NULL)
    p->prev->next = p->next;
  else if (a->procs == p)
    a->procs = p->next;
  if (p->next != NULL)
    p->next->prev = p->prev;
  p->prev = p->next = NULL;
  a->nprocs--;
}

static void proc_close(agent_proc_t *p)
{
  if (p->closing)
    return;
  p->closing = 1;
  unlink_proc(p);
  while (p->subs != NULL) {
    sub_t *s = p->subs;
    p->subs = s->next;
    agent_stream_detach(s->st); /* ends it with {}; no callbacks after */
    osr_free(s);
  }
  if (p->child != NULL) {
    osr__agent_child_detach(p->child);
    p->child = NULL;
  }
  close_handle(p, (uv_handle_t *)&p->deadline);
  close_handle(p, (uv_handle_t *)&p->retain);
  if (p->out_init)
    close_handle(p, (uv_handle_t *)&p->out);
  if (p->err_init)
    close_handle(p, (uv_handle_t *)&p->err);
  if (p->in_init)
    close_handle(p, (uv_handle_t *)&p->in);
}

static void on_retain(uv_timer_t *t)
{
  agent_proc_t *p = t->data;
  if (p->subs != NULL) {
    /* A client is still reading the tail: keep the record a bit longer. */
    uv_timer_start(&p->retain, on_retain, 1000, 0);
    return;
  }
  proc_close(p);
}

static void maybe_end(agent_proc_t *p)
{
  if (p->ended || !p->exited)
    return;
  /* envd: a signalled process ends at once; a normal exit waits for the
   * output pipes to close (contract §10). */
  if (p->term_signal == 0 && (p->out_open || p->err_open))
    return;
  p->ended = 1;
  uv_timer_start(&p->retain, on_retain, OSR_AGENT_RETAIN_MS, 0);
  proc_pump_all(p);
}

/* ---- output ------------------------------------------------------------------------ */

/* One read takes what a socket pair buffer holds (~200 KiB: a process
 * writing fast fills it between two loop turns), not 32 KiB: fewer reads,
 * appends and frames per byte. Half the ring at most, so that a slow
 * client's unsent bytes still leave room for a read. */
static size_t read_max(const agent_proc_t *p)
{
  size_t half = p->ring.cap / 2;
  return half < OSR_AGENT_READ ? half : OSR_AGENT_READ;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
  agent_proc_t *p = h->data;
  (void)suggested;
  /* Straight into the ring's free end (on_pipe_read commits it): reading
   * runs only while the slowest subscriber leaves read_max() of room
   * (proc_update_reading), so this overwrites nothing a client still
   * needs, and libuv reads synchronously after this call, so no other
   * append comes in between. Near the wrap the read is shorter. */
  size_t len = 0;
  buf->base = osr_ring_tail(&p->ring, &len);
  buf->len = len < read_max(p) ? len : read_max(p);
}

static void on_pipe_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
  agent_proc_t *p = s->data;
  int is_err = s == (uv_stream_t *)&p->err;
  if (nread > 0) {
    int kind = p->is_pty ? KIND_PTY : is_err ? KIND_STDERR : KIND_STDOUT;
    if (p->is_pty && p->exited)
      uv_timer_start(&p->deadline, on_pty_grace, PTY_EXIT_GRACE_MS, 0); /* still talking */
    osr_ring_commit(&p->ring, kind, (size_t)nread); /* read in place (on_alloc) */
    proc_pump_all(p);
    proc_update_reading(p);
    return;
  }
  if (nread == 0)
    return;
  /* EOF, or EIO from a pty master once the last slave fd closed. */
  uv_read_stop(s);
  if (is_err) {
    p->err_open = 0;
  } else {
    p->out_open = 0;
    if (p->is_pty)
      p->in_open = 0;
  }
  maybe_end(p);
}

static void proc_update_reading(agent_proc_t *p)
{
  if (p->closing)
    return;
  uint64_t slowest = p->ring.end;
  for (sub_t *s = p->subs; s != NULL; s = s->next)
    if (!s->end_sent && s->cursor < slowest)
      slowest = s->cursor;
  int want = osr_ring_room(&p->ring, slowest) >= read_max(p);
  if (want == p->reading)
    return;
  p->reading = want;
  if (p->out_open) {
    if (want)
      uv_read_start((uv_stream_t *)&p->out, on_alloc, on_pipe_read);
    else
      uv_read_stop((uv_stream_t *)&p->out);
  }
  if (p->err_open) {
    if (want)
      uv_read_start((uv_stream_t *)&p->err, on_alloc, on_pipe_read);
    else
      uv_read_stop((uv_stream_t *)&p->err);
  }
}

/* The end event, in either codec. */
static void sub_send_end(sub_t *s, agent_proc_t *p)
{
  char status[64];
  int32_t code = 0;
  int exited = 0;
  const char *error = NULL;
  if (p->term_signal != 0) {
    const char *name = strsignal(p->term_signal);
    char sig[48];
    snprintf(sig, sizeof(sig), "%s", name != NULL ? name : "unknown signal");
    /* Go's signal strings are glibc's with a lower-case first letter. */
    if (sig[0] >= 'A' && sig[0] <= 'Z')
      sig[0] = (char)(sig[0] - 'A' + 'a');
    snprintf(status, sizeof(status), "signal: %s", sig);
    code = -1;
    error = status;
  } else {
    snprintf(status, sizeof(status), "exit status %lld", (long long)p->exit_status);
    code = (int32_t)p->exit_status;
    exited = 1;
    if (p->exit_status != 0)
      error = status;
  }
  if (!s->binary) {
    /* proto3 JSON: defaults (exit code 0, exited false) are omitted. */
    json_t *end = json_object();
    if (code != 0)
      json_object_set_new(end, "exitCode", json_integer(code));
    if (exited)
      json_object_set_new(end, "exited", json_true());
    json_object_set_new(end, "status", json_string(status));
    if (error != NULL)
      json_object_set_new(end, "error", json_string(error));
    agent_stream_send(s->st, json_pack("{s:{s:o}}", "event", "end", end));
    return;
  }
  osr_buf_t b;
  osr_buf_init(&b, 256);
  if (osr_pb_put_end(&b, code, exited, status, error) == 0)
    (void)agent_stream_send_raw(s->st, osr_buf_data(&b), b.len);
  osr_buf_dispose(&b);
}

/* The start event, in either codec; Connect adds the output offset. */
static void sub_send_start(sub_t *s, uint32_t pid, int has_offset, uint64_t off)
{
  if (s->binary) {
    osr_buf_t b;
    osr_buf_init(&b, 64);
    if (osr_pb_put_start(&b, pid, has_offset, off) == 0)
      (void)agent_stream_send_raw(s->st, osr_buf_data(&b), b.len);
    osr_buf_dispose(&b);
    return;
  }
  json_t *st = json_pack("{s:I}", "pid", (json_int_t)pid);
  if (has_offset) {
    char num[32];
    snprintf(num, sizeof(num), "%llu", (unsigned long long)off);
    json_object_set_new(st, "outputOffset", json_string(num));
  }
  agent_stream_send(s->st, json_pack("{s:{s:o}}", "event", "start", st));
}

static void sub_pump_loop(sub_t *s);

/* Room for one data frame: prefix + base64(32 KiB) + suffix. */
static char frame_buf[64 + (OSR_AGENT_CHUNK + 2) / 3 * 4];
static char linear[OSR_AGENT_CHUNK];

static void sub_pump(sub_t *s)
{
  if (s->in_pump)
    return; /* the outer loop goes on producing */
  s->in_pump = 1;
  sub_pump_loop(s);
  s->in_pump = 0;
}

static void sub_pump_loop(sub_t *s)
{
  agent_proc_t *p = s->p;
  while (!s->end_sent && agent_stream_queued(s->st) < AGENT_STREAM_LOW) {
    osr_iovec_t iov[2];
    int kind = 0;
    long n = osr_ring_peek(&p->ring, s->cursor, s->binary ? OSR_AGENT_BIN_CHUNK : OSR_AGENT_CHUNK,
                           &kind, iov);
    if (n < 0) {
      s->end_sent = 1;
      agent_stream_end(s->st, OSR_CX_DATA_LOSS, "output was dropped from the ring");
      return;
    }
    if (n == 0) {
      if (!p->ended)
        return;
      s->end_sent = 1;
      sub_send_end(s, p);
      if (s->is_start && p->timed_out)
        agent_stream_end(s->st, OSR_CX_DEADLINE_EXCEEDED, "context deadline exceeded");
      else
        agent_stream_end(s->st, 0, NULL);
      return;
    }
    if (s->binary) {
      /* Raw output behind a small protobuf header: no encoding, and the
       * ring's two slices are gathered straight into the stream queue. */
      uint8_t hdr[OSR_PB_DATA_HDR_MAX];
      int stream = kind == KIND_PTY      ? OSR_PE_PTY
                   : kind == KIND_STDERR ? OSR_PE_STDERR
                                         : OSR_PE_STDOUT;
      osr_iovec_t parts[3] = {osr_iov((char *)hdr, osr_pb_data_header(hdr, stream, (size_t)n)),
                              iov[0], iov[1]};
      s->cursor += (uint64_t)n;
      if (agent_stream_send_iov(s->st, parts, 3) != 0)
        return;
      continue;
    }
    /* Encoded from the ring itself; only a run that wraps (once per ring
     * turn) is joined in `linear` first. */
    const char *src = iov[0].base;
    if (iov[1].len > 0) {
      memcpy(linear, iov[0].base, iov[0].len);
      memcpy(linear + iov[0].len, iov[1].base, iov[1].len);
      src = linear;
    }
    const char *field = kind == KIND_PTY ? "pty" : kind == KIND_STDERR ? "stderr" : "stdout";
    int len = snprintf(frame_buf, 64, "{\"event\":{\"data\":{\"%s\":\"", field);
    size_t off = (size_t)len;
    off += osr_b64_encode(src, (size_t)n, frame_buf + off, 1);
    memcpy(frame_buf + off, "\"}}}", 4);
    off += 4;
    s->cursor += (uint64_t)n;
    if (agent_stream_send_raw(s->st, frame_buf, off) != 0)
      return; /* the exchange is over; on_close follows */
  }
}

static void proc_pump_all(agent_proc_t *p)
{
  for (sub_t *s = p->subs; s != NULL;) {
    sub_t *next = s->next; /* sub_pump never frees s synchronously... */
    sub_pump(s);
    s = next;
  }
}

static void sub_on_writable(agent_stream_t *st, void *data)
{
  sub_t *s = data;
  (void)st;
  sub_pump(s);
  proc_update_reading(s->p);
}

static void sub_on_close(agent_stream_t *st, void *data)
{
  sub_t *s = data;
  agent_proc_t *p = s->p;
  (void)st;
  for (sub_t **pp = &p->subs; *pp != NULL; pp = &(*pp)->next) {
    if (*pp == s) {
      *pp = s->next;
      break;
    }
  }
  osr_free(s);
  /* A client leaving does not stop the process (envd); it only unpins the
   * ring, so reading may resume. */
  proc_update_reading(p);
}

static const agent_stream_events_t sub_events = {sub_on_writable, sub_on_close};

static sub_t *sub_attach(agent_proc_t *p, agent_call_t *call, uint64_t cursor, int is_start)
{
  sub_t *s = osr_xcalloc(1, sizeof(*s));
  s->p = p;
  s->cursor = cursor;
  s->is_start = is_start;
  s->binary = call->binary;
  s->st = agent_stream_begin(call, &sub_events, s, KEEPALIVE_EVENT);
  if (s->st == NULL) {
    osr_free(s);
    return NULL;
  }
  s->next = p->subs;
  p->subs = s;
  return s;
}

/* ---- exit and deadline --------------------------------------------------------------- */

/* A pty master reports EIO only once every slave fd is closed: a background
 * job the shell left behind keeps one open for as long as it runs, and
 * gVisor (runsc 2022-12) never reports it at all. So once the process has
 * exited, PTY_EXIT_GRACE_MS without output also ends its output (envd too
 * ends a pty with its process). Not while a slow client holds reading off:
 * the output is still there to be read. */
static void on_pty_grace(uv_timer_t *t)
{
  agent_proc_t *p = t->data;
  if (p->ended || !p->out_open)
    return;
  if (!p->reading) {
    uv_timer_start(t, on_pty_grace, PTY_EXIT_GRACE_MS, 0);
    return;
  }
  uv_read_stop((uv_stream_t *)&p->out);
  p->out_open = 0;
  p->in_open = 0;
  maybe_end(p);
}

static void on_exit_cb(agent_child_t *c, int64_t exit_status, int term_signal)
{
  agent_proc_t *p = c->data;
  p->child = NULL; /* spawn.c frees it after this callback */
  p->exited = 1;
  p->exit_status = exit_status;
  p->term_signal = term_signal;
  uv_timer_stop(&p->deadline);
  if (p->is_pty && p->out_open && term_signal == 0)
    uv_timer_start(&p->deadline, on_pty_grace, PTY_EXIT_GRACE_MS, 0);
  OSR_LOG_DEBUG("agent", "process %u exited: status %lld signal %d", p->pid, (long long)exit_status,
                term_signal);
  maybe_end(p);
}

static void kill_group(agent_proc_t *p, int sig)
{
  if (p->exited || p->pid == 0)
    return;
  /* The child called setsid(): its pid is its process group. */
  if (kill(-(pid_t)p->pid, sig) != 0)
    kill((pid_t)p->pid, sig);
}

static void on_deadline(uv_timer_t *t)
{
  agent_proc_t *p = t->data;
  p->timed_out = 1;
  kill_group(p, SIGKILL);
}

/* ---- Start ------------------------------------------------------------------------- */

typedef struct start_job_s {
  uv_work_t w;
  agent_call_t *call;
  agent_user_t user;
  char cwd[4096];
  char workdir[4096]; /* a->workdir at submission ("" = the user's home): POST /init
                         may change a->workdir while the job runs */
  int cwd_given;
  int cwd_err;
  int cwd_unchecked; /* fast path: nobody stat()ed cwd, the spawn child checks it */
} start_job_t;

static void start_work(uv_work_t *w)
{
  start_job_t *j = osr_container_of(w, start_job_t, w);
  agent_t *a = j->call->agent;
  osr__agent_resolve_user(a, j->call->username, &j->user);
  json_t *cwd = json_object_get(json_object_get(j->call->msg, "process"), "cwd");
  struct stat st;
  if (json_is_string(cwd) && json_string_length(cwd) > 0) {
    j->cwd_given = 1;
    if (osr__agent_abs_path(json_string_value(cwd), j->user.home, j->cwd, sizeof(j->cwd)) != 0)
      j->cwd_err = UV_EINVAL;
    else if (stat(j->cwd, &st) != 0)
      j->cwd_err = UV_ENOENT;
    else if (!S_ISDIR(st.st_mode))
      j->cwd_err = UV_ENOTDIR;
    return;
  }
  const char *dflt = j->workdir[0] != '\0' ? j->workdir : j->user.home;
  snprintf(j->cwd, sizeof(j->cwd), "%s", dflt);
  if (stat(j->cwd, &st) != 0 || !S_ISDIR(st.st_mode))
    snprintf(j->cwd, sizeof(j->cwd), "/");
}

/* Child environment in envd's order (contract §4): PATH, HOME, USER,
 * LOGNAME, the sandbox's variables, the request's; for a repeated name the
 * last value wins and keeps the last position (Go's dedupEnv). */
static char **build_env(agent_t *a, const agent_user_t *u, json_t *envs)
{
  size_t cap = 4 + a->nenvs + (json_is_object(envs) ? json_object_size(envs) : 0);
  char **all = osr_xcalloc(cap + 1, sizeof(char *));
  size_t n = 0;
  const char *path = getenv("PATH");
  char tmp[8192];
  snprintf(tmp, sizeof(tmp), "PATH=%s",
           path != NULL ? path : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
  all[n++] = osr_xstrdup(tmp);
  snprintf(tmp, sizeof(tmp), "HOME=%s", u->home);
  all[n++] = osr_xstrdup(tmp);
  snprintf(tmp, sizeof(tmp), "USER=%s", u->name);
  all[n++] = osr_xstrdup(tmp);
  snprintf(tmp, sizeof(tmp), "LOGNAME=%s", u->name);
  all[n++] = osr_xstrdup(tmp);
  for (size_t i = 0; i < a->nenvs; i++)
    all[n++] = osr_xstrdup(a->envs[i]);
  if (json_is_object(envs)) {
    const char *k;
    json_t *v;
    json_object_foreach(envs, k, v)
    {
      if (!json_is_string(v) || k[0] == '\0' || strchr(k, '=') != NULL)
        continue;
      size_t kl = strlen(k), vl = json_string_length(v);
      char *kv = osr_xmalloc(kl + vl + 2);
      memcpy(kv, k, kl);
      kv[kl] = '=';
      memcpy(kv + kl + 1, json_string_value(v), vl);
      kv[kl + 1 + vl] = '\0';
      all[n++] = kv;
    }
  }
  /* Drop every entry whose name appears again later. */
  size_t w = 0;
  for (size_t i = 0; i < n; i++) {
    size_t kl = (size_t)(strchr(all[i], '=') - all[i]);
    int later = 0;
    for (size_t k = i + 1; k < n && !later; k++)
      later = strncmp(all[k], all[i], kl + 1) == 0;
    if (later)
      osr_free(all[i]);
    else
      all[w++] = all[i];
  }
  all[w] = NULL;
  return all;
}

static void free_strv(char **v)
{
  for (size_t i = 0; v != NULL && v[i] != NULL; i++)
    osr_free(v[i]);
  osr_free(v);
}

static void cwd_error(agent_call_t *call)
{
  json_t *c = json_object_get(json_object_get(call->msg, "process"), "cwd");
  agent_call_error(call, OSR_CX_INVALID_ARGUMENT, "cwd '%s' does not exist", json_string_value(c));
}

/* Spawn the job's command (loop thread; frees j). */
static void start_spawn(start_job_t *j)
{
  agent_call_t *call = j->call;
  agent_t *a = call->agent;
  json_t *msg = call->msg;
  json_t *proc = json_object_get(msg, "process");

  if (call->req == NULL || a->shutting_down) {
    agent_call_error(call, OSR_CX_CANCELED, "client went away");
    osr_free(j);
    return;
  }
  if (j->cwd_err != 0) {
    cwd_error(call);
    osr_free(j);
    return;
  }

  const char *cmd = json_string_value(json_object_get(proc, "cmd"));
  json_t *args = json_object_get(proc, "args");
  size_t nargs = json_is_array(args) ? json_array_size(args) : 0;
  json_t *pty = json_object_get(msg, "pty");
  char **argv = osr_xcalloc(nargs + 2, sizeof(char *));
  argv[0] = osr_xstrdup(cmd);
  for (size_t i = 0; i < nargs; i++) {
    json_t *x = json_array_get(args, i);
    argv[i + 1] = osr_xstrdup(json_is_string(x) ? json_string_value(x) : "");
  }
  char **env = build_env(a, &j->user, json_object_get(proc, "envs"));

  agent_proc_t *p = osr_xcalloc(1, sizeof(*p));
  p->a = a;
  p->master_fd = -1;
  osr_ring_init(&p->ring, a->ring_bytes, 4096);
  json_t *jstdin = json_object_get(msg, "stdin");
  /* Absent means enabled: SDKs older than envd 0.3.0 never send it. */
  int want_stdin = !json_is_false(jstdin);
  p->is_pty = json_is_object(pty);

  agent_spawn_opts_t o;
  memset(&o, 0, sizeof(o));
  o.file = cmd;
  o.argv = argv;
  o.env = env;
  o.cwd = j->cwd;
  /* Fast path (start_fast): the child checks the cwd. A given one that
   * does not exist fails the Start as the stat did; the default one (the
   * workdir or home) falls back to "/", as start_work does. */
  int cwd_status = 0;
  if (j->cwd_unchecked) {
    o.cwd_fallback = j->cwd_given ? NULL : "/";
    o.cwd_status = &cwd_status;
  }
  o.new_session = 1;
  o.ctty = p->is_pty;
  /* A pty command that cannot run exits 127/126 with the reason on the
   * terminal (what a user at a shell prompt sees), not a Start error. */
  o.fail_in_child = p->is_pty;
  o.stdio[0] = o.stdio[1] = o.stdio[2] = -1;
  if (j->user.switch_ids) {
    o.switch_ids = 1;
    o.uid = j->user.uid;
    o.gid = j->user.gid;
  }

  uv_timer_init(a->loop, &p->deadline);
  uv_timer_init(a->loop, &p->retain);
  p->deadline.data = p->retain.data = p;
  p->handles = 2; /* the timers */
  /* The child's ends (closed here once it runs: it has its own copies) and
   * ours, handed to the uv pipes after a successful spawn. All CLOEXEC, so
   * no other child inherits them; the child's dup2 onto 0-2 clears it. */
  int child_fd[3] = {-1, -1, -1}, our_fd[3] = {-1, -1, -1};
  int rv = 0;
  if (p->is_pty) {
    struct winsize ws;
    memset(&ws, 0, sizeof(ws));
    json_t *size = json_object_get(pty, "size");
    ws.ws_col = (unsigned short)json_integer_value(json_object_get(size, "cols"));
    ws.ws_row = (unsigned short)json_integer_value(json_object_get(size, "rows"));
    if (ws.ws_col == 0)
      ws.ws_col = 80;
    if (ws.ws_row == 0)
      ws.ws_row = 24;
    if (openpty(&p->master_fd, &child_fd[0], NULL, NULL, &ws) != 0) {
      rv = -errno;
    } else {
      fcntl(p->master_fd, F_SETFD, FD_CLOEXEC);
      fcntl(child_fd[0], F_SETFD, FD_CLOEXEC);
      o.stdio[0] = o.stdio[1] = o.stdio[2] = child_fd[0];
    }
  } else {
    /* Socket pairs, as libuv's UV_CREATE_PIPE made them: CloseStdin is a
     * shutdown(SHUT_WR) of our end. */
    for (int i = 0; i < 3 && rv == 0; i++) {
      if (i == 0 && !want_stdin)
        continue; /* /dev/null */
      int sv[2];
      if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        rv = -errno;
        break;
      }
      our_fd[i] = sv[0];
      child_fd[i] = o.stdio[i] = sv[1];
    }
  }
  if (rv == 0) {
    uv_pipe_init(a->loop, &p->out, 0);
    p->out_init = 1;
    p->handles++;
    if (!p->is_pty) {
      uv_pipe_init(a->loop, &p->err, 0);
      p->err_init = 1;
      p->handles++;
      if (want_stdin) {
        uv_pipe_init(a->loop, &p->in, 0);
        p->in_init = 1;
        p->handles++;
      }
    }
    p->out.data = p->err.data = p->in.data = p;
  }

  /* Link first so proc_close() can unlink on any failure below. */
  p->next = a->procs;
  if (a->procs != NULL)
    a->procs->prev = p;
  a->procs = p;
  a->nprocs++;

  if (rv == 0)
    rv = osr__agent_spawn(a->loop, &o, on_exit_cb, &p->child);
  for (int i = 0; i < 3; i++)
    if (child_fd[i] >= 0)
      close(child_fd[i]);
  free_strv(argv);
  free_strv(env);
  int master_handed = 0;
  if (rv == 0) {
    p->child->data = p;
    /* Each fd a uv pipe accepted is the pipe's now (closed by proc_close). */
    if (p->is_pty) {
      rv = uv_pipe_open(&p->out, p->master_fd);
      master_handed = rv == 0;
    } else {
      for (int i = 0; i < 3 && rv == 0; i++) {
        if (our_fd[i] < 0)
          continue;
        rv = uv_pipe_open(i == 0 ? &p->in : i == 1 ? &p->out : &p->err, our_fd[i]);
        if (rv == 0)
          our_fd[i] = -1;
      }
    }
    if (rv != 0) {
      /* Cannot happen for fresh fds; if it did, nothing could be read:
       * end the child rather than leave it unobserved. */
      OSR_LOG_ERROR("agent", "spawn %s: pipe open: %s", cmd, uv_strerror(rv));
      kill(-p->child->pid, SIGKILL);
    }
  }
  if (rv != 0) {
    OSR_LOG_INFO("agent", "spawn %s: %s", cmd, uv_strerror(rv));
    if (j->cwd_given && (cwd_status == ENOENT || cwd_status == ENOTDIR))
      cwd_error(call);
    else
      agent_call_error(call, OSR_CX_INTERNAL, "error starting process '%s': fork/exec %s: %s", cmd,
                       cmd, uv_strerror(rv));
    if (p->master_fd >= 0 && !master_handed)
      close(p->master_fd);
    p->master_fd = -1;
    for (int i = 0; i < 3; i++)
      if (our_fd[i] >= 0)
        close(our_fd[i]);
    p->exited = 1;
    proc_close(p);
    osr_free(j);
    return;
  }
  if (cwd_status == -1)
    snprintf(j->cwd, sizeof(j->cwd), "/");
  p->spawned = 1;
  p->pid = (uint32_t)p->child->pid;
  if (p->is_pty) {
    p->out_open = 1;
    p->in_open = 1;
  } else {
    p->out_open = p->err_open = 1;
    p->in_open = want_stdin;
  }
  json_t *tag = json_object_get(msg, "tag");
  if (json_is_string(tag))
    p->tag = osr_xstrdup(json_string_value(tag));
  json_t *cenvs = json_object_get(proc, "envs");
  p->config = json_pack("{s:s,s:o,s:o}", "cmd", cmd, "args",
                        json_is_array(args) ? json_incref(args) : json_array(), "envs",
                        json_is_object(cenvs) ? json_incref(cenvs) : json_object());
  json_object_set_new(p->config, "cwd", json_string(j->cwd));
  osr_free(j);

  if (call->timeout_ms > 0)
    uv_timer_start(&p->deadline, on_deadline, (uint64_t)call->timeout_ms, 0);
  OSR_LOG_DEBUG("agent", "started %s pid %u", cmd, p->pid);

  sub_t *s = sub_attach(p, call, 0, 1);
  if (s != NULL)
    sub_send_start(s, p->pid, 0, 0);
  proc_update_reading(p);
  if (s != NULL)
    sub_pump(s);
}

static void start_after(uv_work_t *w, int status)
{
  (void)status;
  start_spawn(osr_container_of(w, start_job_t, w));
}

/* The fast path: when the user is the agent's own (no getpwnam) the
 * thread-pool hop only stat()ed the cwd, and in gVisor that hop (a futex
 * wake, the worker's stat and eventfd write, one more loop iteration) was
 * ~9 ptrace stops and a wake-up of another thread before the clone. The
 * spawn child's chdir checks the cwd instead (spawn.h cwd_status). */
static void start_fast(start_job_t *j)
{
  agent_t *a = j->call->agent;
  osr__agent_resolve_user(a, j->call->username, &j->user); /* no I/O: user_is_self */
  json_t *cwd = json_object_get(json_object_get(j->call->msg, "process"), "cwd");
  j->cwd_unchecked = 1;
  if (json_is_string(cwd) && json_string_length(cwd) > 0) {
    j->cwd_given = 1;
    if (osr__agent_abs_path(json_string_value(cwd), j->user.home, j->cwd, sizeof(j->cwd)) != 0)
      j->cwd_err = UV_EINVAL;
  } else {
    snprintf(j->cwd, sizeof(j->cwd), "%s", j->workdir[0] != '\0' ? j->workdir : j->user.home);
  }
  start_spawn(j);
}

void osr__agent_process_start(agent_call_t *call)
{
  agent_t *a = call->agent;
  json_t *proc = json_object_get(call->msg, "process");
  json_t *cmd = json_object_get(proc, "cmd");
  if (!json_is_string(cmd) || json_string_length(cmd) == 0) {
    agent_call_error(call, OSR_CX_INVALID_ARGUMENT, "process.cmd is required");
    return;
  }
  if (a->nprocs >= a->max_procs) {
    agent_call_error(call, OSR_CX_RESOURCE_EXHAUSTED, "too many processes (max %zu)", a->max_procs);
    return;
  }
  start_job_t *j = osr_xcalloc(1, sizeof(*j));
  j->call = call;
  if (a->workdir != NULL)
    snprintf(j->workdir, sizeof(j->workdir), "%s", a->workdir);
  if (osr__agent_user_is_self(a, call->username)) {
    start_fast(j);
    return;
  }
  if (uv_queue_work(a->loop, &j->w, start_work, start_after) != 0) {
    osr_free(j);
    agent_call_error(call, OSR_CX_INTERNAL, "cannot queue work");
  }
}

/* ---- Connect, List ---------------------------------------------------------------------- */

static int json_u64(json_t *v, uint64_t *out)
{
  if (json_is_integer(v) && json_integer_value(v) >= 0) {
    *out = (uint64_t)json_integer_value(v);
    return 1;
  }
  if (json_is_string(v)) {
    char *end;
    errno = 0;
    unsigned long long n = strtoull(json_string_value(v), &end, 10);
    if (*json_string_value(v) != '\0' && *end == '\0' && errno == 0) {
      *out = n;
      return 1;
    }
  }
  return 0;
}

void osr__agent_process_connect(agent_call_t *call)
{
  json_t *sel = json_object_get(call->msg, "process");
  agent_proc_t *p = find_proc(call->agent, sel, 1);
  if (p == NULL) {
    not_found(call, sel);
    return;
  }
  /* OSR extension: resume from an absolute output offset. Without it the
   * stream carries new output only, as envd's. */
  uint64_t off = p->ring.end;
  json_t *jo = json_object_get(call->msg, "outputOffset");
  if (jo != NULL && !json_is_null(jo)) {
    if (!json_u64(jo, &off)) {
      agent_call_error(call, OSR_CX_INVALID_ARGUMENT, "outputOffset must be an unsigned integer");
      return;
    }
    if (off < p->ring.start || off > p->ring.end) {
      agent_call_error(call, OSR_CX_OUT_OF_RANGE,
                       "outputOffset %llu is outside the kept output [%llu, %llu]",
                       (unsigned long long)off, (unsigned long long)p->ring.start,
                       (unsigned long long)p->ring.end);
      return;
    }
  }
  sub_t *s = sub_attach(p, call, off, 0);
  if (s == NULL)
    return;
  sub_send_start(s, p->pid, 1, off);
  sub_pump(s);
  proc_update_reading(p);
}

void osr__agent_process_list(agent_call_t *call)
{
  json_t *arr = json_array();
  for (agent_proc_t *p = call->agent->procs; p != NULL; p = p->next) {
    if (p->exited || p->closing)
      continue;
    json_t *info = json_pack("{s:O,s:I}", "config", p->config, "pid", (json_int_t)p->pid);
    if (p->tag != NULL)
      json_object_set_new(info, "tag", json_string(p->tag));
    json_array_append_new(arr, info);
  }
  agent_call_reply(call, json_pack("{s:o}", "processes", arr));
}

/* ---- input, signals, resize ------------------------------------------------------------- */

typedef struct input_req_s {
  uv_write_t w;
  agent_call_t *call;
  agent_proc_t *p;
  size_t len;
  char data[];
} input_req_t;

static void on_input_written(uv_write_t *w, int status)
{
  input_req_t *r = osr_container_of(w, input_req_t, w);
  r->p->stdin_queued -= r->len;
  if (status == 0)
    agent_call_reply(r->call, json_object());
  else
    agent_call_error(r->call, OSR_CX_INTERNAL, "write to stdin: %s", uv_strerror(status));
  osr_free(r);
}

void osr__agent_process_send_input(agent_call_t *call)
{
  json_t *sel = json_object_get(call->msg, "process");
  agent_proc_t *p = find_proc(call->agent, sel, 0);
  if (p == NULL) {
    not_found(call, sel);
    return;
  }
  json_t *input = json_object_get(call->msg, "input");
  json_t *data = json_object_get(input, "stdin");
  if (data == NULL)
    data = json_object_get(input, "pty");
  if (!json_is_string(data)) {
    agent_call_error(call, OSR_CX_INVALID_ARGUMENT, "input.stdin or input.pty required");
    return;
  }
  if (!p->in_open) {
    agent_call_error(call, OSR_CX_INTERNAL, "stdin not enabled or closed");
    return;
  }
  size_t elen = json_string_length(data);
  if (p->stdin_queued + elen > STDIN_QUEUE_MAX) {
    agent_call_error(call, OSR_CX_RESOURCE_EXHAUSTED, "too much stdin queued");
    return;
  }
  input_req_t *r = osr_try_malloc(sizeof(*r) + elen / 4 * 3 + 3);
  if (r == NULL) {
    agent_call_error(call, OSR_CX_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  long n = osr_b64_decode(json_string_value(data), elen, r->data);
  if (n < 0) {
    osr_free(r);
    agent_call_error(call, OSR_CX_INVALID_ARGUMENT, "input is not base64");
    return;
  }
  if (n == 0) {
    osr_free(r);
    agent_call_reply(call, json_object());
    return;
  }
  r->call = call;
  r->p = p;
  r->len = (size_t)n;
  uv_buf_t b = uv_buf_init(r->data, (unsigned)n);
  uv_stream_t *dst = p->is_pty ? (uv_stream_t *)&p->out : (uv_stream_t *)&p->in;
  int rv = uv_write(&r->w, dst, &b, 1, on_input_written);
  if (rv != 0) {
    osr_free(r);
    agent_call_error(call, OSR_CX_INTERNAL, "write to stdin: %s", uv_strerror(rv));
    return;
  }
  p->stdin_queued += r->len;
}

static void on_stdin_shutdown(uv_shutdown_t *sr, int status)
{
  agent_proc_t *p = sr->data;
  (void)status;
  osr_free(sr);
  if (!p->closing)
    close_handle(p, (uv_handle_t *)&p->in);
  p->in_init = 0;
}

void osr__agent_process_close_stdin(agent_call_t *call)
{
  json_t *sel = json_object_get(call->msg, "process");
  agent_proc_t *p = find_proc(call->agent, sel, 0);
  if (p == NULL) {
    not_found(call, sel);
    return;
  }
  if (p->in_open && !p->is_pty) {
    p->in_open = 0;
    /* After the queued input: the child sees EOF once it read it all. */
    uv_shutdown_t *sr = osr_xmalloc(sizeof(*sr));
    sr->data = p;
    if (uv_shutdown(sr, (uv_stream_t *)&p->in, on_stdin_shutdown) != 0) {
      osr_free(sr);
      close_handle(p, (uv_handle_t *)&p->in);
      p->in_init = 0;
    }
  }
  agent_call_reply(call, json_object());
}

void osr__agent_process_send_signal(agent_call_t *call)
{
  json_t *sel = json_object_get(call->msg, "process");
  agent_proc_t *p = find_proc(call->agent, sel, 0);
  if (p == NULL) {
    not_found(call, sel);
    return;
  }
  json_t *js = json_object_get(call->msg, "signal");
  int sig = 0;
  if (json_is_string(js)) {
    const char *s = json_string_value(js);
    if (strcmp(s, "SIGNAL_SIGKILL") == 0)
      sig = SIGKILL;
    else if (strcmp(s, "SIGNAL_SIGTERM") == 0)
      sig = SIGTERM;
  } else if (json_is_integer(js)) {
    json_int_t v = json_integer_value(js);
    if (v == SIGKILL || v == SIGTERM)
      sig = (int)v;
  }
  if (sig == 0) {
    agent_call_error(call, OSR_CX_INVALID_ARGUMENT, "unsupported signal");
    return;
  }
  kill_group(p, sig);
  agent_call_reply(call, json_object());
}

void osr__agent_process_update(agent_call_t *call)
{
  json_t *sel = json_object_get(call->msg, "process");
  agent_proc_t *p = find_proc(call->agent, sel, 0);
  if (p == NULL) {
    not_found(call, sel);
    return;
  }
  json_t *size = json_object_get(json_object_get(call->msg, "pty"), "size");
  if (size != NULL) {
    if (!p->is_pty || p->master_fd < 0) {
      agent_call_error(call, OSR_CX_FAILED_PRECONDITION, "process has no pty");
      return;
    }
    struct winsize ws;
    memset(&ws, 0, sizeof(ws));
    ws.ws_col = (unsigned short)json_integer_value(json_object_get(size, "cols"));
    ws.ws_row = (unsigned short)json_integer_value(json_object_get(size, "rows"));
    if (ioctl(p->master_fd, TIOCSWINSZ, &ws) != 0) {
      agent_call_error(call, OSR_CX_INTERNAL, "resize: %s", strerror(errno));
      return;
    }
    /* The kernel signals SIGWINCH to the terminal's foreground process
     * group (the pty is the child's controlling terminal). gVisor (runsc
     * 2022-12) does not, and answers TIOCGPGRP on the master with ENOTTY,
     * so there is no group to signal from here: docs/agent.md. */
  }
  agent_call_reply(call, json_object());
}

void osr__agent_process_shutdown(agent_t *a)
{
  for (agent_proc_t *p = a->procs; p != NULL; p = p->next)
    kill_group(p, SIGKILL);
  while (a->procs != NULL)
    proc_close(a->procs);
}
