/*
 * Exec console: Kubernetes channel WebSocket <-> the agent's envd process
 * API (see exec.h for the shape, docs/dataplane.md for the contract).
 *
 * Why translate instead of tunnelling: the agent speaks Connect (the
 * output streams in its protobuf codec, procpb.h, so output arrives as raw
 * bytes; control calls in JSON), browsers and Kubernetes clients speak the
 * channel protocol. The data plane is where the token was checked, so it is
 * also where the session is translated; the agent stays the one
 * implementation of processes, rings and resume.
 *
 * Lifetime of a session (dp_exec_t): it lives until every one of these is
 * over, whichever comes last frees it (exec_maybe_free):
 *   ws           the WebSocket (its on_close always fires once after accept);
 *   sc / cc      the stream and control upstream clients (closed by us);
 *                or, multiplexed (`shared`), both the client of the lease
 *                on a shared connection (exec_mux.h), which is never
 *                closed here: our requests on it are cancelled, and the
 *                lease goes back once none is left (lease_maybe_release);
 *   screq/ccreq  their requests, until the final on_body (which a client
 *                close delivers later, with OSR_ECANCELED);
 *   connecting   pending connect callbacks (sc_connecting, cc_connecting);
 *   writing      outstanding request-body write callbacks.
 * `busy` guards code that can re-enter through synchronous callbacks
 * (closing a client fails its requests from inside the close call).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "agent/connect.h"
#include "agent/procpb.h"
#include "dataplane/dp_activity.h"
#include "dataplane/exec.h"
#include "dataplane/exec_mux.h"
#include "net/addr.h"
#include "net/ws.h"
#include "token/token.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/text.h"

#define MOD OSR_DP_MOD

#define DP_EXEC_MAX_ARGS     256
#define DP_EXEC_MAX_QUERY    65536
#define DP_EXEC_MAX_MESSAGE  (1024 * 1024) /* one client message */
#define DP_EXEC_WS_QUEUE     (512 * 1024)  /* output queued towards the client */
#define DP_EXEC_STDIN_MAX    (4 * 1024 * 1024)
#define DP_EXEC_STDIN_HIGH   (256 * 1024) /* stop reading the client above */
#define DP_EXEC_STDIN_LOW    (64 * 1024)  /* resume below */
#define DP_EXEC_INPUT_CHUNK  (64 * 1024)  /* raw bytes per SendInput */
/* A Connect frame from the agent: a data event's protobuf header is a few
 * bytes on top of its output (at most OSR_AGENT_CHUNK today). */
#define DP_EXEC_FRAME_MAX    (256 * 1024 + 64)
#define DP_EXEC_ERRBODY_MAX  4096
#define DP_EXEC_CONNECT_MS   10000
/* Re-attaches (process.Connect from the output offset) after a shared
 * connection died under a live session, per session. */
#define DP_EXEC_REATTACH_MAX 3
#define DP_EXEC_CONTENT_TYPE "application/vnd.osr.exec-frames"

typedef struct dp_exec_s dp_exec_t;

struct dp_exec_s {
  osr_dataplane_t *dp;
  dp_exec_t *prev, *next; /* dp->execs */
  osr_ws_t *ws;           /* NULL once on_close fired */
  int v5;                 /* v5.channel.k8s.io: channel 255 */
  int want_stdin, want_stdout, want_stderr, tty, want_info;
  char addr[OSR_ADDR_HOST_MAX + OSR_ADDR_PATH_MAX + 16];
  int tls;
  char agent_tok[65];
  char sid[OSR_DP_SID_MAX];
  /* the output stream: process.Process/Start or /Connect */
  char *start_body; /* envelope, freed with the session */
  size_t start_len;
  const char *start_method; /* "Start" or "Connect" */
  osr_http_client_t *sc;
  osr_http_creq_t *screq;
  int sc_connecting, sc_writing;
  int sc_status; /* HTTP status of the stream response, 0 = none yet */
  osr_buf_t errbody;
  osr_cx_parser_t cx;
  const char *in; /* unparsed rest of the held upstream chunk */
  size_t in_len;
  int holding;
  osr_buf_t out; /* one WebSocket message: channel byte + payload */
  int out_pending; /* 1 binary / 2 text in out; 3: sent by reference (on_data) */
  int in_place;    /* the frame being handled lies in the held chunk (pump) */
  char och;        /* channel byte of a message sent by reference */
  int64_t pid;     /* -1 until the start event */
  uint64_t offset; /* output bytes seen (absolute, the agent's numbering) */
  int ended;       /* the status is decided: no more output */
  int status_sent; /* decided (status_msg or queued) */
  int status_queued;
  char *status_msg; /* decided but waiting behind queued output */
  char *stream_err; /* end-of-stream error message */
  char stream_code[32];
  /* upstream over a shared h2c connection (exec_mux.h) instead of own
   * connections; `shared` is decided at the connect */
  int shared;
  dp_mux_lease_t lease;
  int reattaches; /* streams re-attached after their connection died */
  int info_sent;
  /* control calls */
  osr_http_client_t *cc;
  osr_http_creq_t *ccreq;
  int cc_connecting, cc_writing, cc_reused;
  osr_buf_t op_body; /* body of the call being sent (kept for one retry) */
  const char *op_method;
  int op_ready;  /* op_body holds a call not yet answered */
  int op_status; /* HTTP status of the current call */
  int op_retried;
  osr_buf_t stdin_buf;
  int stdin_close_req, stdin_closed;
  int resize_pending;
  unsigned cols, rows;
  int reading_paused;
  /* HTTP stream transport (POST .../exec, docs: "Exec streams") */
  osr_http_req_t *hreq; /* NULL once on_done fired */
  osr_buf_t hout;       /* the frame being written (until h_written / ws_written) */
  int hwriting, hend_pending, hend_sent, hheld;
  uint8_t fhdr[4]; /* input frame parser: length prefix, channel, payload */
  size_t fhdr_len;
  int fch;          /* channel of the frame being read, -1 = in the header */
  uint32_t frem;    /* payload bytes still to come */
  osr_buf_t fsmall; /* payload of a resize / close frame */
  dp_act_t *act;    /* an open session keeps its sandbox active (dp_activity.h) */
  /* lifetime */
  int finishing;
  int closing_ws;
  int busy;
};

static void exec_maybe_free(dp_exec_t *e);
static void exec_finish(dp_exec_t *e);
static void pump(dp_exec_t *e);
static void ops_kick(dp_exec_t *e);
static void send_failure(dp_exec_t *e, int code, const char *reason, const char *msg);
static void exec_connect(dp_exec_t *e);
static void exec_reattach(dp_exec_t *e);

/* ========================================================================== */
/* Routing                                                                     */

static int sid_ok(const char *p, size_t n)
{
  if (n == 0 || n >= OSR_DP_SID_MAX)
    return 0;
  for (size_t i = 0; i < n; i++) {
    char c = p[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
          c == '_'))
      return 0;
  }
  return 1;
}

/* Split path into at most 8 segments (between '/'). Returns the count, or
 * -1 for more. */
static int segments(osr_iovec_t p, osr_iovec_t *seg, int max)
{
  int n = 0;
  size_t i = 0;
  if (p.len == 0 || p.base[0] != '/')
    return -1;
  i = 1;
  while (i <= p.len) {
    size_t j = i;
    while (j < p.len && p.base[j] != '/')
      j++;
    if (n == max)
      return -1;
    seg[n++] = osr_iov(p.base + i, j - i);
    i = j + 1;
  }
  return n;
}

static int seg_is(osr_iovec_t s, const char *lit)
{
  size_t n = strlen(lit);
  return s.len == n && memcmp(s.base, lit, n) == 0;
}

int osr__dp_exec_route(const osr_http_req_t *req, dp_route_t *rt)
{
  osr_iovec_t seg[8];
  osr_iovec_t id;
  int n = segments(req->path, seg, 8);
  if (n == 4 && seg_is(seg[0], "v1") && seg_is(seg[1], "sandboxes") && seg_is(seg[3], "exec"))
    id = seg[2];
  else if (n == 7 && seg_is(seg[0], "api") && seg_is(seg[1], "v1") &&
           seg_is(seg[2], "namespaces") && seg[3].len > 0 && seg_is(seg[4], "pods") &&
           seg_is(seg[6], "exec"))
    id = seg[5];
  else if (n == 3 && seg_is(seg[0], "sbx") && seg_is(seg[2], "exec"))
    id = seg[1];
  else
    return 0;
  if (!sid_ok(id.base, id.len))
    return OSR_EINVAL;
  memset(rt, 0, sizeof(*rt));
  rt->via = DP_VIA_PATH;
  memcpy(rt->sandbox_id, id.base, id.len);
  rt->sandbox_id[id.len] = '\0';
  rt->port = OSR_DP_ENVD_PORT;
  rt->path = req->path;
  rt->query = req->query;
  return 1;
}

/* ========================================================================== */
/* Query                                                                       */

typedef struct exec_query_s {
  json_t *argv; /* array of strings */
  json_t *envs; /* object */
  char *cwd, *tag;
  int64_t pid; /* -1 none */
  int have_offset;
  uint64_t offset;
  int in, out, err, tty, info;
} exec_query_t;

static int parse_bool(const char *v, int *out)
{
  if (strcmp(v, "true") == 0 || strcmp(v, "1") == 0 || strcmp(v, "") == 0)
    *out = 1;
  else if (strcmp(v, "false") == 0 || strcmp(v, "0") == 0)
    *out = 0;
  else
    return -1;
  return 0;
}

static int parse_u64(const char *v, uint64_t *out)
{
  uint64_t x = 0;
  if (*v == '\0' || strlen(v) > 19)
    return -1;
  for (; *v; v++) {
    if (*v < '0' || *v > '9')
      return -1;
    x = x * 10 + (uint64_t)(*v - '0');
  }
  *out = x;
  return 0;
}

static void query_dispose(exec_query_t *q)
{
  json_decref(q->argv);
  json_decref(q->envs);
  osr_free(q->cwd);
  osr_free(q->tag);
}

/* Kubernetes' PodExecOptions plus OSR's extensions. Returns NULL or why the
 * query is refused (400). Values are percent-decoded ('+' is a space, as
 * application/x-www-form-urlencoded). */
static const char *parse_query(osr_iovec_t q, exec_query_t *o)
{
  memset(o, 0, sizeof(*o));
  o->argv = json_array();
  o->envs = json_object();
  o->pid = -1;
  o->out = o->err = 1;
  if (q.len > DP_EXEC_MAX_QUERY)
    return "query too long";
  size_t i = 0;
  char *buf = osr_xmalloc(q.len + 1);
  char *key = osr_xmalloc(q.len + 1);
  const char *why = NULL;
  while (i < q.len && why == NULL) {
    size_t j = i;
    while (j < q.len && q.base[j] != '&')
      j++;
    const char *p = q.base + i;
    size_t n = j - i;
    i = j + 1;
    if (n == 0)
      continue;
    const char *eq = memchr(p, '=', n);
    size_t kn = eq != NULL ? (size_t)(eq - p) : n;
    const char *vp = eq != NULL ? eq + 1 : p + n;
    size_t vn = eq != NULL ? n - kn - 1 : 0;
    /* '+' means space in forms: replace before decoding (in a copy). */
    memcpy(buf, vp, vn);
    for (size_t k = 0; k < vn; k++)
      if (buf[k] == '+')
        buf[k] = ' ';
    char *val = osr_xmalloc(vn + 1);
    int vl = osr_pct_decode(buf, vn, val, vn + 1);
    int kl = osr_pct_decode(p, kn, key, q.len + 1);
    if (vl < 0 || kl < 0 || memchr(val, '\0', (size_t)vl) != NULL) {
      osr_free(val);
      why = "malformed query";
      break;
    }
    val[vl] = '\0';
    key[kl] = '\0';
    int b = 0;
    if (strcmp(key, "command") == 0) {
      if (json_array_size(o->argv) >= DP_EXEC_MAX_ARGS)
        why = "too many command arguments";
      else
        json_array_append_new(o->argv, json_stringn(val, (size_t)vl));
      if (json_array_size(o->argv) > 0 &&
          json_string_value(json_array_get(o->argv, json_array_size(o->argv) - 1)) == NULL)
        why = "command is not valid UTF-8";
    } else if (strcmp(key, "stdin") == 0) {
      why = parse_bool(val, &b) == 0 ? NULL : "stdin must be true or false";
      o->in = b;
    } else if (strcmp(key, "stdout") == 0) {
      why = parse_bool(val, &b) == 0 ? NULL : "stdout must be true or false";
      o->out = b;
    } else if (strcmp(key, "stderr") == 0) {
      why = parse_bool(val, &b) == 0 ? NULL : "stderr must be true or false";
      o->err = b;
    } else if (strcmp(key, "tty") == 0) {
      why = parse_bool(val, &b) == 0 ? NULL : "tty must be true or false";
      o->tty = b;
    } else if (strcmp(key, "osrInfo") == 0) {
      why = parse_bool(val, &b) == 0 ? NULL : "osrInfo must be true or false";
      o->info = b;
    } else if (strcmp(key, "pid") == 0) {
      uint64_t x;
      if (parse_u64(val, &x) != 0 || x == 0 || x > INT32_MAX)
        why = "pid must be a positive integer";
      else
        o->pid = (int64_t)x;
    } else if (strcmp(key, "offset") == 0) {
      if (parse_u64(val, &o->offset) != 0)
        why = "offset must be an unsigned integer";
      o->have_offset = 1;
    } else if (strcmp(key, "tag") == 0) {
      osr_free(o->tag);
      o->tag = osr_xstrdup(val);
    } else if (strcmp(key, "cwd") == 0) {
      osr_free(o->cwd);
      o->cwd = osr_xstrdup(val);
    } else if (strcmp(key, "env") == 0) {
      char *e = strchr(val, '=');
      if (e == NULL || e == val)
        why = "env must be NAME=VALUE";
      else {
        *e = '\0';
        json_t *s = json_string(e + 1);
        if (s == NULL || json_object_size(o->envs) >= DP_EXEC_MAX_ARGS)
          why = "bad env";
        else
          json_object_set(o->envs, val, s);
        json_decref(s);
      }
    }
    /* container, access_token and anything else: ignored (one container). */
    osr_free(val);
  }
  osr_free(buf);
  osr_free(key);
  if (why != NULL)
    return why;
  int attach = o->pid > 0 || (o->tag != NULL && json_array_size(o->argv) == 0);
  if (!attach && json_array_size(o->argv) == 0)
    return "command is required (command=<argv0>&command=<argv1>...), or pid/tag to re-attach";
  if (attach && json_array_size(o->argv) > 0 && o->pid > 0)
    return "give either command or pid, not both";
  if (!attach && o->have_offset)
    return "offset needs pid or tag (re-attach)";
  if (!o->in && !o->out && !o->err)
    return "you must specify at least one of stdin, stdout, stderr";
  return NULL;
}

/* The Start or Connect request message, in a Connect envelope. */
static char *build_start(const exec_query_t *q, size_t *len, const char **method)
{
  json_t *j;
  int attach = q->pid > 0 || (q->tag != NULL && json_array_size(q->argv) == 0);
  if (attach) {
    *method = "Connect";
    json_t *sel = q->pid > 0 ? json_pack("{s:I}", "pid", (json_int_t)q->pid)
                             : json_pack("{s:s}", "tag", q->tag);
    j = json_pack("{s:o}", "process", sel);
    if (q->have_offset) {
      char num[32];
      snprintf(num, sizeof(num), "%llu", (unsigned long long)q->offset);
      json_object_set_new(j, "outputOffset", json_string(num));
    }
  } else {
    *method = "Start";
    json_t *args = json_array();
    for (size_t i = 1; i < json_array_size(q->argv); i++)
      json_array_append(args, json_array_get(q->argv, i));
    json_t *proc = json_pack("{s:O,s:o,s:O}", "cmd", json_array_get(q->argv, 0), "args", args,
                             "envs", q->envs);
    if (q->cwd != NULL)
      json_object_set_new(proc, "cwd", json_string(q->cwd));
    j = json_pack("{s:o,s:b}", "process", proc, "stdin", q->in);
    if (q->tty)
      json_object_set_new(j, "pty", json_pack("{s:{s:i,s:i}}", "size", "cols", 80, "rows", 24));
    if (q->tag != NULL)
      json_object_set_new(j, "tag", json_string(q->tag));
  }
  /* The binary codec (procpb.h): output then comes back as raw bytes. */
  osr_buf_t b;
  osr_buf_init(&b, 2 * DP_EXEC_MAX_QUERY + 1024);
  int rv = osr_buf_append(&b, "\0\0\0\0\0", OSR_CX_HEADER_LEN);
  if (rv == 0 && j != NULL)
    rv = osr_pb_request_from_json(&b, j, attach);
  json_decref(j);
  if (rv != 0 || j == NULL) {
    osr_buf_dispose(&b);
    return NULL;
  }
  size_t n = b.len;
  char *env = osr_xmalloc(n);
  memcpy(env, osr_buf_data(&b), n);
  osr_buf_dispose(&b);
  osr_cx_frame_header((uint8_t *)env, 0, (uint32_t)(n - OSR_CX_HEADER_LEN));
  *len = n;
  return env;
}

/* ========================================================================== */
/* Lifetime                                                                    */

/* Free a session that never went live (not linked, nothing pending). */
static void exec_discard(dp_exec_t *e)
{
  osr_cx_parser_dispose(&e->cx);
  osr_buf_dispose(&e->out);
  osr_buf_dispose(&e->hout);
  osr_buf_dispose(&e->fsmall);
  osr_buf_dispose(&e->errbody);
  osr_buf_dispose(&e->op_body);
  osr_buf_dispose(&e->stdin_buf);
  osr_free(e->start_body);
  osr_free(e);
}

/* A shared connection's lease goes back once the session made its last
 * request on it: both request pointers clear (their final on_body ran) and
 * no body write is outstanding. */
static void lease_maybe_release(dp_exec_t *e)
{
  if (!e->shared || e->sc_connecting || e->sc != NULL || e->cc != NULL || e->screq != NULL ||
      e->ccreq != NULL || e->sc_writing || e->cc_writing)
    return;
  osr__dp_mux_release(&e->lease);
}

static void exec_maybe_free(dp_exec_t *e)
{
  lease_maybe_release(e);
  if (e->busy || e->ws != NULL || e->hreq != NULL || e->hwriting || e->sc != NULL ||
      e->cc != NULL || e->screq != NULL || e->ccreq != NULL || e->sc_connecting ||
      e->cc_connecting || e->sc_writing || e->cc_writing || osr__dp_mux_is_leased(&e->lease))
    return;
  osr_dataplane_t *dp = e->dp;
  if (e->prev != NULL)
    e->prev->next = e->next;
  else
    dp->execs = e->next;
  if (e->next != NULL)
    e->next->prev = e->prev;
  osr_cx_parser_dispose(&e->cx);
  osr_buf_dispose(&e->out);
  osr_buf_dispose(&e->hout);
  osr_buf_dispose(&e->fsmall);
  osr_buf_dispose(&e->errbody);
  osr_buf_dispose(&e->op_body);
  osr_buf_dispose(&e->stdin_buf);
  osr_free(e->start_body);
  osr_free(e->stream_err);
  osr_free(e->status_msg);
  osr__dp_act_close(dp, e->act);
  osr_free(e);
  dp->nstreams--;
  if (dp->stopping)
    osr__dp_maybe_finish(dp);
}

static void close_sc(dp_exec_t *e)
{
  osr_http_client_t *c = e->sc;
  if (e->shared && e->sc_connecting) {
    /* Still waiting for the shared connection: stop waiting. */
    e->sc_connecting = 0;
    osr__dp_mux_release(&e->lease);
    return;
  }
  if (c == NULL)
    return;
  int held = e->holding;
  e->sc = NULL;
  e->holding = 0;
  e->in_len = 0;
  if (e->shared) {
    /* Only our own stream ends (its final on_body follows, ECANCELED). A
     * held chunk is let go too, or a stream whose body had all arrived
     * would wait for the release forever; what it still delivers is
     * dropped (sc_on_body, finishing). */
    osr_http_creq_t *r = e->screq;
    if (r != NULL) {
      osr_http_creq_cancel(r);
      if (held && e->screq == r)
        osr_http_creq_release(r);
    }
    return;
  }
  osr_http_client_close(c); /* a live stream request fails with ECANCELED */
}

static void close_cc(dp_exec_t *e)
{
  osr_http_client_t *c = e->cc;
  if (c == NULL)
    return;
  e->cc = NULL;
  if (e->shared) {
    if (e->ccreq != NULL)
      osr_http_creq_cancel(e->ccreq);
    return;
  }
  osr_http_client_close(c);
}

/* Everything towards the agent stops; the process keeps running (a closed
 * stream never stops it, docs/agent.md), so a client can re-attach. */
static void exec_finish(dp_exec_t *e)
{
  e->busy++;
  e->finishing = 1;
  close_sc(e);
  close_cc(e);
  e->busy--;
  exec_maybe_free(e);
}

static void h_written(osr_http_req_t *req, int status, void *arg);
static void ws_written(osr_ws_t *ws, int status, void *arg);

/* End the client side once everything queued before went out: the
 * WebSocket's close (ws.h: a close never overtakes queued messages), or the
 * end of the HTTP response body behind the frame being written. */
static void close_ws(dp_exec_t *e, int code, const char *why)
{
  if (e->closing_ws)
    return;
  if (e->ws != NULL) {
    e->closing_ws = 1;
    osr_ws_close(e->ws, code, why);
    return;
  }
  if (e->hreq == NULL || e->hend_sent)
    return;
  e->closing_ws = 1;
  if (e->hwriting) {
    e->hend_pending = 1; /* h_written ends it */
    return;
  }
  e->hend_sent = 1;
  if (osr_http_write(e->hreq, NULL, 0, 1, h_written, e) == 0)
    e->hwriting = 1;
  else
    osr_http_abort(e->hreq);
}

static int client_gone(const dp_exec_t *e)
{
  return e->ws == NULL && e->hreq == NULL;
}

/* Input flow control on either transport. */
static void input_pause(dp_exec_t *e)
{
  if (e->reading_paused)
    return;
  if (e->ws != NULL) {
    e->reading_paused = 1;
    osr_ws_read_stop(e->ws);
  }
  /* HTTP: h_on_body holds its chunk (hold is only valid inside on_body). */
}

static void input_resume(dp_exec_t *e)
{
  if (!e->reading_paused || e->stdin_buf.len >= DP_EXEC_STDIN_LOW || e->pid <= 0)
    return;
  e->reading_paused = 0;
  if (e->ws != NULL) {
    osr_ws_read_start(e->ws);
  } else if (e->hreq != NULL && e->hheld) {
    e->hheld = 0;
    osr_http_req_release(e->hreq); /* may deliver the next chunk now */
  }
}

/* ========================================================================== */
/* Output: Connect frames -> channel messages                                  */

/* e->out holds one frame of the HTTP framing: a 4-byte big-endian length,
 * the channel byte, the payload. A WebSocket message is the same without
 * the length (and an info frame, channel 5, is a text message of just the
 * payload), so output is built once for both transports. */
static void out_begin(dp_exec_t *e, int ch)
{
  const char head[5] = {0, 0, 0, 0, (char)ch};
  e->out.len = 0;
  /* On failure (no memory for 5 bytes) out stays shorter than a frame
   * header and out_flush drops it. */
  if (osr_buf_append(&e->out, head, 5) != 0)
    e->out.len = 0;
}

/* Send e->out; when the client cannot take it now keep it for
 * on_client_writable. Returns 0 when sent (or dropped because the client is
 * gone), OSR_EAGAIN when kept. */
static int out_flush(dp_exec_t *e)
{
  if (!e->out_pending)
    return 0;
  if (e->out_pending == 3)
    return OSR_EAGAIN; /* ws_written ends it */
  if (client_gone(e) || e->closing_ws || e->out.len < 5) {
    e->out_pending = 0;
    e->out.len = 0;
    return 0;
  }
  uint8_t *p = (uint8_t *)osr_buf_data(&e->out);
  if (p == NULL) {
    e->out_pending = 0;
    return 0;
  }
  uint32_t n = (uint32_t)(e->out.len - 4);
  p[0] = (uint8_t)(n >> 24);
  p[1] = (uint8_t)(n >> 16);
  p[2] = (uint8_t)(n >> 8);
  p[3] = (uint8_t)n;
  int rv;
  if (e->hwriting)
    return OSR_EAGAIN;
  if (e->ws != NULL) {
    /* Written by reference (ws.h osr_ws_sendv): the frame moves to hout
     * until ws_written, as on the HTTP transport, and no byte of it is
     * copied again. */
    int text = e->out_pending == 2;
    size_t off = text ? 5 : 4;
    osr_iovec_t iov = osr_iov((const char *)p + off, e->out.len - off);
    osr_buf_swap(&e->out, &e->hout);
    rv = osr_ws_sendv(e->ws, text ? OSR_WS_TEXT : OSR_WS_BINARY, &iov, 1, ws_written, e);
    if (rv == 0)
      e->hwriting = 1;
    else
      osr_buf_swap(&e->out, &e->hout); /* kept for on_writable, or dropped below */
  } else {
    /* One write in flight (http.h): the frame moves to hout until its
     * callback, and out is free for the next one. */
    osr_buf_swap(&e->out, &e->hout);
    osr_iovec_t iov = osr_iov(osr_buf_data(&e->hout), e->hout.len);
    rv = osr_http_write(e->hreq, &iov, 1, 0, h_written, e);
    if (rv == 0)
      e->hwriting = 1;
  }
  if (rv == OSR_EAGAIN)
    return OSR_EAGAIN;
  if (rv != 0)
    OSR_LOG_DEBUG(MOD, "exec %s: send to client: %s", e->sid, osr_strerror(rv));
  e->out_pending = 0;
  e->out.len = 0;
  return 0;
}

/* Queue the status message (channel 3) behind any output already queued,
 * and the close behind it. */
static void status_kick(dp_exec_t *e)
{
  if (e->status_msg == NULL || e->out_pending)
    return;
  out_begin(e, 3);
  if (osr_buf_append(&e->out, e->status_msg, strlen(e->status_msg)) == 0)
    e->out_pending = 1;
  osr_free(e->status_msg);
  e->status_msg = NULL;
  e->status_queued = 1;
  if (out_flush(e) == 0)
    close_ws(e, 1000, NULL);
  /* else ws_on_writable sends it and closes */
}

static void send_status_json(dp_exec_t *e, json_t *st)
{
  if (e->status_sent) {
    json_decref(st);
    return;
  }
  e->status_sent = 1;
  e->ended = 1;
  char *s = st != NULL ? json_dumps(st, JSON_COMPACT) : NULL;
  json_decref(st);
  e->status_msg = osr_xstrdup(s != NULL ? s : "{\"metadata\":{},\"status\":\"Failure\"}");
  osr_json_free(s);
  status_kick(e);
}

static void send_failure(dp_exec_t *e, int code, const char *reason, const char *msg)
{
  json_t *st = json_pack("{s:{},s:s,s:s,s:s,s:i}", "metadata", "status", "Failure", "message", msg,
                         "reason", reason, "code", code);
  send_status_json(e, st);
}

/* Go's signal names (what the agent puts in "status") to numbers, for the
 * 128+n exit code shells and Kubernetes report for a signalled process. */
static int signal_number(const char *status)
{
  static const struct {
    const char *name;
    int num;
  } tab[] = {{"hangup", 1},
             {"interrupt", 2},
             {"quit", 3},
             {"illegal instruction", 4},
             {"trace/breakpoint trap", 5},
             {"aborted", 6},
             {"bus error", 7},
             {"floating point exception", 8},
             {"killed", 9},
             {"user defined signal 1", 10},
             {"segmentation fault", 11},
             {"user defined signal 2", 12},
             {"broken pipe", 13},
             {"alarm clock", 14},
             {"terminated", 15}};
  if (status == NULL || strncmp(status, "signal: ", 8) != 0)
    return 0;
  for (size_t i = 0; i < OSR_ARRAY_SIZE(tab); i++)
    if (strcmp(status + 8, tab[i].name) == 0)
      return tab[i].num;
  return 0;
}

static void on_end_event(dp_exec_t *e, const osr_pe_t *ev)
{
  long long code = ev->exit_code;
  char sbuf[128];
  size_t sl = ev->status.len < sizeof(sbuf) - 1 ? ev->status.len : sizeof(sbuf) - 1;
  if (sl > 0)
    memcpy(sbuf, ev->status.base, sl);
  sbuf[sl] = '\0';
  const char *status = sl > 0 ? sbuf : NULL;
  if (code < 0) {
    int sig = signal_number(status);
    code = sig > 0 ? 128 + sig : 255;
  }
  if (code == 0) {
    send_status_json(e, json_pack("{s:{},s:s}", "metadata", "status", "Success"));
    return;
  }
  char num[24], msg[256];
  snprintf(num, sizeof(num), "%lld", (long long)code);
  snprintf(msg, sizeof(msg), "command terminated with non-zero exit code: %s",
           status != NULL ? status : num);
  json_t *st = json_pack("{s:{},s:s,s:s,s:s,s:{s:[{s:s,s:s}]}}", "metadata", "status", "Failure",
                         "message", msg, "reason", "NonZeroExitCode", "details", "causes", "reason",
                         "ExitCode", "message", num);
  send_status_json(e, st);
}

static void on_start_event(dp_exec_t *e, const osr_pe_t *ev)
{
  e->pid = ev->pid;
  if (ev->has_offset)
    e->offset = ev->output_offset;
  if (e->want_info && !e->info_sent && !client_gone(e)) {
    e->info_sent = 1;
    /* OSR extension (osrInfo=true): one text message before any output, so
     * a client learns what to re-attach to. Kubernetes clients never ask. */
    char num[32];
    snprintf(num, sizeof(num), "%llu", (unsigned long long)e->offset);
    json_t *j = json_pack("{s:I,s:s}", "pid", (json_int_t)e->pid, "outputOffset", num);
    char *s = j != NULL ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    out_begin(e, 5);
    if (s != NULL && osr_buf_append(&e->out, s, strlen(s)) == 0)
      e->out_pending = 2;
    osr_json_free(s);
    (void)out_flush(e);
  }
  /* Input can flow now: it needs the pid. */
  input_resume(e);
  ops_kick(e);
}

/* A data event: its raw output into one channel message, written by
 * reference from the parser's buffer when the envelope was assembled there,
 * else copied once (behind the channel byte) into the client's frame. */
static void on_data(dp_exec_t *e, const osr_pe_t *ev)
{
  int ch;
  if (ev->stream == OSR_PE_STDOUT || ev->stream == OSR_PE_PTY)
    ch = e->want_stdout ? 1 : 0;
  else if (ev->stream == OSR_PE_STDERR)
    ch = e->want_stderr ? 2 : 0;
  else
    return;
  e->offset += ev->data.len;
  if (ch == 0 || ev->data.len == 0)
    return;
  if (e->ws != NULL && !e->in_place && !e->hwriting && !e->closing_ws) {
    /* The envelope was assembled in the parser's buffer, which stays put
     * until the pump parses again, and the pump waits for ws_written
     * (out_pending 3): the WebSocket writes the payload from there, so no
     * byte of it is copied here either. A chunk of the agent connection
     * (in_place) can go away with that connection, so it is copied. */
    e->och = (char)ch;
    osr_iovec_t iov[2] = {osr_iov(&e->och, 1), ev->data};
    int rv = osr_ws_sendv(e->ws, OSR_WS_BINARY, iov, 2, ws_written, e);
    if (rv == 0) {
      e->hwriting = 1;
      e->out_pending = 3;
      return;
    }
    if (rv != OSR_EAGAIN) {
      OSR_LOG_DEBUG(MOD, "exec %s: send to client: %s", e->sid, osr_strerror(rv));
      return; /* as out_flush: the client is going away */
    }
    /* Over the queue cap: copied and kept for on_writable below. */
  }
  out_begin(e, ch);
  if (osr_buf_append(&e->out, ev->data.base, ev->data.len) != 0) {
    send_failure(e, 500, "InternalError", "output frame too large");
    return;
  }
  e->out_pending = 1;
  (void)out_flush(e);
}

static void on_frame(dp_exec_t *e, const osr_cx_msg_t *m)
{
  if (m->flags & OSR_CX_FLAG_END_STREAM) {
    json_t *j = json_loadb(m->data, m->len, 0, NULL);
    json_t *err = json_object_get(j, "error");
    if (err != NULL) {
      const char *msg = json_string_value(json_object_get(err, "message"));
      const char *code = json_string_value(json_object_get(err, "code"));
      osr_free(e->stream_err);
      e->stream_err = osr_xstrdup(msg != NULL ? msg : "error");
      snprintf(e->stream_code, sizeof(e->stream_code), "%s", code != NULL ? code : "unknown");
    }
    json_decref(j);
    return;
  }
  if (e->ended)
    return;
  osr_pe_t ev;
  if (osr_pe_decode(m->data, m->len, &ev) != 0) {
    send_failure(e, 500, "InternalError", "malformed event from the sandbox");
    return;
  }
  if (ev.kind == OSR_PE_START)
    on_start_event(e, &ev);
  else if (ev.kind == OSR_PE_DATA)
    on_data(e, &ev);
  else if (ev.kind == OSR_PE_END)
    on_end_event(e, &ev);
  /* keepalive and event kinds we do not know: nothing to relay */
}

/* Parse and deliver frames from the held chunk until it is used up or the
 * client's queue is full. Releases the chunk when it is used up. */
static void pump(dp_exec_t *e)
{
  e->busy++;
  while (!e->out_pending && e->in_len > 0 && e->screq != NULL && !e->finishing) {
    size_t used = 0;
    osr_cx_msg_t m;
    /* Release the message the parser delivered last (an empty feed does
     * only that), so that it is idle between envelopes. */
    if (!osr_cx_parser_is_idle(&e->cx) && osr_cx_parse(&e->cx, "", 0, &used, &m) != 0)
      break; /* cannot happen: an empty feed completes nothing */
    if (osr_cx_parser_is_idle(&e->cx) && e->in_len >= OSR_CX_HEADER_LEN) {
      /* A whole envelope in the held chunk is decoded where it lies: the
       * parser's copy (callgrind: a fifth of the data plane's instructions
       * per output byte) is only for envelopes cut by a chunk boundary. */
      const uint8_t *h = (const uint8_t *)e->in;
      size_t n = (size_t)h[1] << 24 | (size_t)h[2] << 16 | (size_t)h[3] << 8 | h[4];
      if ((h[0] & ~OSR_CX_FLAG_END_STREAM) == 0 && n <= e->cx.max &&
          e->in_len - OSR_CX_HEADER_LEN >= n) {
        m.flags = h[0];
        m.data = e->in + OSR_CX_HEADER_LEN;
        m.len = n;
        e->in += OSR_CX_HEADER_LEN + n;
        e->in_len -= OSR_CX_HEADER_LEN + n;
        e->in_place = 1;
        on_frame(e, &m);
        e->in_place = 0;
        continue;
      }
    }
    int rv = osr_cx_parse(&e->cx, e->in, e->in_len, &used, &m);
    e->in += used;
    e->in_len -= used;
    if (rv < 0) {
      e->in_len = 0;
      send_failure(e, 500, "InternalError", "malformed stream from the sandbox");
      break;
    }
    if (rv == 1)
      on_frame(e, &m);
  }
  if (e->holding && e->in_len == 0 && !e->out_pending && e->screq != NULL && !e->finishing) {
    e->holding = 0;
    osr_http_creq_release(e->screq); /* may deliver the next chunk now */
  }
  e->busy--;
}

/* Start the output stream over: process.Connect to the same pid from the
 * offset of the output already passed on (e->offset counts the data
 * events decoded; a frame still queued for the client is among them, an
 * envelope cut by the loss is not), on a fresh shared connection. A
 * control call in flight when the connection died is not retried (it may
 * have run): that case fails the session instead (cc_on_body). If the
 * agent is gone the connect fails and the session gets its Failure. */
static void exec_reattach(dp_exec_t *e)
{
  OSR_LOG_INFO(MOD, "exec %s pid %lld: shared connection lost, re-attaching at offset %llu", e->sid,
               (long long)e->pid, (unsigned long long)e->offset);
  e->reattaches++;
  e->dp->m.exec_reattach++;
  e->sc = NULL;
  e->cc = NULL; /* no call in flight on it (checked by the caller) */
  osr__dp_mux_release(&e->lease);
  e->sc_status = 0;
  e->errbody.len = 0;
  osr_freep(&e->stream_err);
  if (e->out_pending != 3) {
    /* Drop an envelope the loss cut. With out_pending 3 the parser holds
     * no such thing, only the message the WebSocket is writing from its
     * buffer (on_data), which must stay put until ws_written. */
    osr_cx_parser_dispose(&e->cx);
    osr_cx_parser_init(&e->cx, DP_EXEC_FRAME_MAX);
  }
  exec_query_t q;
  memset(&q, 0, sizeof(q));
  q.pid = e->pid;
  q.have_offset = 1;
  q.offset = e->offset;
  osr_free(e->start_body);
  e->start_body = build_start(&q, &e->start_len, &e->start_method);
  if (e->start_body == NULL) {
    send_failure(e, 500, "InternalError", "out of memory");
    return;
  }
  exec_connect(e);
}

static void sc_on_response(osr_http_creq_t *r, int status, const osr_http_header_t *h, size_t n,
                           void *data)
{
  (void)r;
  (void)h;
  (void)n;
  ((dp_exec_t *)data)->sc_status = status;
}

static const char *reason_of_code(const char *code, int *http)
{
  if (strcmp(code, "not_found") == 0) {
    *http = 404;
    return "NotFound";
  }
  if (strcmp(code, "invalid_argument") == 0 || strcmp(code, "out_of_range") == 0 ||
      strcmp(code, "failed_precondition") == 0) {
    *http = 400;
    return "BadRequest";
  }
  if (strcmp(code, "unauthenticated") == 0 || strcmp(code, "permission_denied") == 0) {
    *http = 403;
    return "Forbidden";
  }
  *http = 500;
  return "InternalError";
}

static void sc_on_body(osr_http_creq_t *r, const osr_iovec_t *chunk, int status, void *data)
{
  dp_exec_t *e = data;
  if (status == 0 && e->screq == r) {
    if (e->finishing)
      return; /* close_sc let the stream go: nobody wants its output */
    if (e->sc_status != 200) {
      if (osr_buf_append(&e->errbody, chunk->base, chunk->len) != 0)
        e->errbody.len = 0;
      return;
    }
    e->in = chunk->base;
    e->in_len = chunk->len;
    pump(e);
    if ((e->in_len > 0 || e->out_pending) && e->screq == r) {
      osr_http_creq_hold(r);
      e->holding = 1;
    }
    return;
  }
  if (status == 0)
    return;
  /* The stream is over: EOF, an error, or our own close. */
  if (e->screq != r)
    return;
  e->busy++;
  e->screq = NULL;
  e->holding = 0;
  e->in_len = 0;
  if (e->shared && status < 0 && status != OSR_ECANCELED && e->sc_status == 200 && !e->finishing &&
      !e->status_sent && e->pid > 0 && e->ccreq == NULL && !e->cc_writing && e->sc != NULL &&
      osr_http_client_max_streams(e->sc) == 0 && e->reattaches < DP_EXEC_REATTACH_MAX) {
    /* The shared connection died under a live session (not the stream:
     * the agent may be fine): continue on a fresh connection with
     * process.Connect from the output offset, so the client sees nothing
     * (exec_reattach). */
    exec_reattach(e);
    e->busy--;
    exec_maybe_free(e);
    return;
  }
  if (e->shared && status < 0 && e->sc_status == 0 && !e->finishing && e->sc != NULL &&
      !osr_http_client_peer_ready(e->sc)) {
    /* The shared connection died before the agent's first SETTINGS: the
     * endpoint does not speak h2c (an HTTP/1.1-only agent). Nothing ran
     * there, so start over on the per-session HTTP/1.1 path. */
    osr__dp_mux_refused(e->dp, e->addr);
    e->sc = NULL;
    lease_maybe_release(e);
    if (!osr__dp_mux_is_leased(&e->lease)) {
      e->shared = 0;
      exec_connect(e);
      e->busy--;
      exec_maybe_free(e);
      return;
    }
  }
  if (!e->status_sent && !e->finishing) {
    char msg[512];
    int http = 500;
    const char *reason = "InternalError";
    if (e->sc_status != 200 && e->sc_status != 0) {
      json_t *j = json_loadb(osr_buf_data(&e->errbody), e->errbody.len, 0, NULL);
      const char *m = json_string_value(json_object_get(j, "message"));
      const char *c = json_string_value(json_object_get(j, "code"));
      if (c != NULL)
        reason = reason_of_code(c, &http);
      snprintf(msg, sizeof(msg), "%s: %s", e->start_method,
               m != NULL ? m : osr_http_reason(e->sc_status));
      json_decref(j);
    } else if (e->stream_err != NULL) {
      reason = reason_of_code(e->stream_code, &http);
      snprintf(msg, sizeof(msg), "%s: %s", e->start_method, e->stream_err);
    } else {
      snprintf(msg, sizeof(msg), "the exec stream from the sandbox ended early: %s",
               osr_strerror(status == OSR_EOF ? OSR_ECONNRESET : status));
    }
    send_failure(e, http, reason, msg);
  }
  close_sc(e);
  e->busy--;
  exec_maybe_free(e);
}

static const osr_http_client_events_t sc_events = {sc_on_response, sc_on_body};

static void sc_written(osr_http_creq_t *r, int status, void *arg)
{
  dp_exec_t *e = arg;
  (void)r;
  (void)status;
  e->sc_writing = 0;
  exec_maybe_free(e);
}

static void fill_headers(dp_exec_t *e, osr_http_header_t *h, size_t *n, int stream)
{
  size_t k = 0;
  h[k].name = OSR_IOV_LIT("content-type");
  h[k++].value = stream ? OSR_IOV_LIT(OSR_PB_CONTENT_TYPE) : OSR_IOV_LIT("application/json");
  h[k].name = OSR_IOV_LIT("connect-protocol-version");
  h[k++].value = OSR_IOV_LIT("1");
  if (e->agent_tok[0] != '\0') {
    h[k].name = OSR_IOV_LIT("x-access-token");
    h[k++].value = osr_iov(e->agent_tok, strlen(e->agent_tok));
  }
  *n = k;
}

static void sc_start(dp_exec_t *e, osr_http_client_t *c);

static void sc_connect_failed(dp_exec_t *e, int status)
{
  e->dp->n_upstream_fail++;
  if (!e->finishing) {
    char msg[256];
    snprintf(msg, sizeof(msg), "cannot reach the sandbox: %s", osr_strerror(status));
    send_failure(e, 502, "ServiceUnavailable", msg);
  }
  exec_maybe_free(e);
}

static void sc_connected(osr_http_client_t *c, int status, void *data)
{
  dp_exec_t *e = data;
  e->sc_connecting = 0;
  if (status != 0) {
    sc_connect_failed(e, status);
    return;
  }
  sc_start(e, c);
}

/* The shared connection is up (exec_mux.h; a failed connect gave the
 * lease back already). */
static void sc_attached(dp_mux_lease_t *l, int status)
{
  dp_exec_t *e = osr_container_of(l, dp_exec_t, lease);
  e->sc_connecting = 0;
  if (status != 0) {
    sc_connect_failed(e, status);
    return;
  }
  sc_start(e, l->client);
}

/* Send the Start/Connect request on `c` (own or shared). */
static void sc_start(dp_exec_t *e, osr_http_client_t *c)
{
  e->sc = c;
  if (e->finishing) {
    exec_finish(e);
    return;
  }
  osr_http_header_t h[4];
  size_t nh;
  fill_headers(e, h, &nh, 1);
  char target[64];
  snprintf(target, sizeof(target), "/process.Process/%s", e->start_method);
  osr_http_client_req_t rq = {"POST", target, "localhost", h, nh, (int64_t)e->start_len};
  int rv = osr_http_client_request(c, &rq, &sc_events, e, &e->screq);
  if (rv != 0) {
    e->screq = NULL;
    send_failure(e, 502, "ServiceUnavailable", "cannot start the exec stream in the sandbox");
    close_sc(e);
    exec_maybe_free(e);
    return;
  }
  osr_iovec_t b = osr_iov(e->start_body, e->start_len);
  if (osr_http_creq_write(e->screq, &b, 1, 1, sc_written, e) == 0)
    e->sc_writing = 1;
  else
    osr_http_creq_cancel(e->screq); /* sc_on_body reports the failure */
}

/* ========================================================================== */
/* Control calls: SendInput, CloseStdin, Update                                */

static void cc_issue(dp_exec_t *e);

static void op_done(dp_exec_t *e)
{
  e->op_ready = 0;
  e->op_retried = 0;
  e->op_body.len = 0;
  input_resume(e);
  ops_kick(e);
}

static void cc_on_response(osr_http_creq_t *r, int status, const osr_http_header_t *h, size_t n,
                           void *data)
{
  (void)r;
  (void)h;
  (void)n;
  ((dp_exec_t *)data)->op_status = status;
}

static void cc_on_body(osr_http_creq_t *r, const osr_iovec_t *chunk, int status, void *data)
{
  dp_exec_t *e = data;
  (void)chunk;
  if (status == 0 || e->ccreq != r)
    return;
  e->busy++;
  e->ccreq = NULL;
  if (status == OSR_EOF) {
    /* Answered. A refusal (stdin closed, process gone) is the process's
     * business: the stream's end event tells the client what happened. */
    if (e->op_status != 200)
      OSR_LOG_DEBUG(MOD, "exec %s: %s answered %d", e->sid, e->op_method, e->op_status);
    op_done(e);
  } else if (!e->finishing) {
    int answered = e->op_status != 0;
    close_cc(e);
    if (!answered && e->cc_reused && !e->op_retried) {
      /* The agent closed an idle keep-alive connection under us: retry
       * once on a fresh one (nothing was answered, so nothing ran). */
      e->op_retried = 1;
      ops_kick(e);
    } else {
      send_failure(e, 502, "ServiceUnavailable", "lost the control connection to the sandbox");
    }
  }
  e->busy--;
  exec_maybe_free(e);
}

static const osr_http_client_events_t cc_events = {cc_on_response, cc_on_body};

static void cc_written(osr_http_creq_t *r, int status, void *arg)
{
  dp_exec_t *e = arg;
  (void)r;
  (void)status;
  e->cc_writing = 0;
  if (e->ccreq == NULL && !e->finishing)
    ops_kick(e);
  exec_maybe_free(e);
}

static void cc_connected(osr_http_client_t *c, int status, void *data)
{
  dp_exec_t *e = data;
  e->cc_connecting = 0;
  if (status != 0) {
    if (!e->finishing)
      send_failure(e, 502, "ServiceUnavailable", "cannot reach the sandbox for input");
    exec_maybe_free(e);
    return;
  }
  e->cc = c;
  e->cc_reused = 0;
  if (e->finishing) {
    exec_finish(e);
    return;
  }
  cc_issue(e);
}

static void cc_issue(dp_exec_t *e)
{
  osr_http_header_t h[4];
  size_t nh;
  fill_headers(e, h, &nh, 0);
  char target[64];
  snprintf(target, sizeof(target), "/process.Process/%s", e->op_method);
  osr_http_client_req_t rq = {"POST", target, "localhost", h, nh, (int64_t)e->op_body.len};
  e->op_status = 0;
  int rv = osr_http_client_request(e->cc, &rq, &cc_events, e, &e->ccreq);
  if (rv == 0) {
    osr_iovec_t b = osr_iov(osr_buf_data(&e->op_body), e->op_body.len);
    rv = osr_http_creq_write(e->ccreq, &b, 1, 1, cc_written, e);
    if (rv == 0) {
      e->cc_writing = 1;
      return;
    }
    osr_http_creq_cancel(e->ccreq); /* cc_on_body fires: ccreq cleared there */
    return;
  }
  e->ccreq = NULL;
  /* A dead keep-alive connection: nothing was sent, take a fresh one. */
  close_cc(e);
  if (!e->op_retried && !e->shared) {
    e->op_retried = 1;
    ops_kick(e);
  } else {
    send_failure(e, 502, "ServiceUnavailable", "lost the control connection to the sandbox");
  }
}

/* Prepare the next call (if none is prepared) and send it when the control
 * connection is free. */
static void ops_kick(dp_exec_t *e)
{
  if (e->finishing || e->pid <= 0 || e->ccreq != NULL || e->cc_writing || e->cc_connecting)
    return;
  if (!e->op_ready) {
    e->op_body.len = 0;
    int rv = 0;
    if (e->resize_pending && e->tty) {
      e->resize_pending = 0;
      e->op_method = "Update";
      rv = osr_buf_appendf(
          &e->op_body, "{\"process\":{\"pid\":%lld},\"pty\":{\"size\":{\"cols\":%u,\"rows\":%u}}}",
          (long long)e->pid, e->cols, e->rows);
    } else if (e->stdin_buf.len > 0 && !e->stdin_closed) {
      size_t n = e->stdin_buf.len < DP_EXEC_INPUT_CHUNK ? e->stdin_buf.len : DP_EXEC_INPUT_CHUNK;
      osr_iovec_t tail;
      e->op_method = "SendInput";
      rv = osr_buf_appendf(&e->op_body, "{\"process\":{\"pid\":%lld},\"input\":{\"%s\":\"",
                           (long long)e->pid, e->tty ? "pty" : "stdin");
      if (rv == 0 && (rv = osr_buf_reserve(&e->op_body, osr_b64_enc_len(n) + 4, &tail)) == 0) {
        size_t w = osr_b64_encode(osr_buf_data(&e->stdin_buf), n, tail.base, 1);
        memcpy(tail.base + w, "\"}}", 3);
        osr_buf_commit(&e->op_body, w + 3);
        osr_buf_consume(&e->stdin_buf, n);
      }
    } else if (e->stdin_close_req && !e->stdin_closed && e->stdin_buf.len == 0) {
      e->stdin_closed = 1;
      e->op_method = "CloseStdin";
      rv = osr_buf_appendf(&e->op_body, "{\"process\":{\"pid\":%lld}}", (long long)e->pid);
    } else {
      return;
    }
    if (rv != 0) {
      send_failure(e, 500, "InternalError", "out of memory");
      return;
    }
    e->op_ready = 1;
  }
  if (e->shared) {
    /* Control calls are further streams on the session's shared
     * connection; nothing to connect, nothing to retry elsewhere. */
    if (e->sc_connecting)
      return; /* re-attaching: the Connect's start event kicks again */
    e->cc = e->lease.client;
    e->cc_reused = 0;
    if (e->cc == NULL) {
      send_failure(e, 502, "ServiceUnavailable", "lost the connection to the sandbox");
      return;
    }
    cc_issue(e);
    return;
  }
  if (e->cc != NULL) {
    e->cc_reused = 1;
    cc_issue(e);
    return;
  }
  osr_http_client_opts_t o;
  memset(&o, 0, sizeof(o));
  o.tls = e->tls ? e->dp->client_tls : NULL;
  o.connect_timeout_ms = DP_EXEC_CONNECT_MS;
  o.idle_timeout_ms = e->dp->cfg.upstream_idle_ms;
  e->cc_connecting = 1;
  if (osr_http_client_connect(e->dp->loop, e->addr, &o, cc_connected, e) != 0) {
    e->cc_connecting = 0;
    send_failure(e, 502, "ServiceUnavailable", "cannot reach the sandbox for input");
  }
}

/* ========================================================================== */
/* The client's WebSocket                                                      */

static void on_resize(dp_exec_t *e, const char *p, size_t n)
{
  json_t *j = json_loadb(p, n, 0, NULL);
  const char *k;
  json_t *v;
  json_int_t w = -1, h = -1;
  /* Go's encoding/json (Kubernetes) matches keys case-insensitively:
   * kubectl sends Width/Height, @kubernetes/client-node width/height. */
  json_object_foreach(j, k, v)
  {
    if (strcasecmp(k, "width") == 0 && json_is_integer(v))
      w = json_integer_value(v);
    else if (strcasecmp(k, "height") == 0 && json_is_integer(v))
      h = json_integer_value(v);
  }
  json_decref(j);
  if (w <= 0 || h <= 0 || w > 65535 || h > 65535)
    return; /* Kubernetes ignores malformed resizes too */
  e->cols = (unsigned)w;
  e->rows = (unsigned)h;
  e->resize_pending = 1;
  ops_kick(e);
}

static void on_stdin(dp_exec_t *e, const char *p, size_t n)
{
  if (!e->want_stdin || e->stdin_close_req || n == 0)
    return;
  if (osr_buf_append(&e->stdin_buf, p, n) != 0) {
    send_failure(e, 500, "InternalError", "too much unread stdin");
    return;
  }
  if (e->stdin_buf.len >= DP_EXEC_STDIN_HIGH)
    input_pause(e);
  ops_kick(e);
}

static void on_close_channel(dp_exec_t *e, const char *p, size_t n)
{
  /* The client closed one of its streams; only stdin is meaningful. */
  if (n >= 1 && p[0] == 0 && e->want_stdin && !e->stdin_close_req) {
    e->stdin_close_req = 1;
    ops_kick(e);
  }
}

static void ws_on_message(osr_ws_t *ws, int op, const osr_iovec_t *msg, void *data)
{
  dp_exec_t *e = data;
  (void)ws;
  if (op != OSR_WS_BINARY || msg->len == 0 || e->finishing)
    return; /* Kubernetes servers ignore text frames on exec */
  unsigned ch = (unsigned char)msg->base[0];
  const char *p = msg->base + 1;
  size_t n = msg->len - 1;
  if (ch == 0)
    on_stdin(e, p, n);
  else if (ch == 4)
    on_resize(e, p, n);
  else if (ch == 255 && e->v5)
    on_close_channel(e, p, n);
}

/* The client can take more output: the pending frame, then the status and
 * the close, or more frames from the held upstream chunk. */
static void on_client_writable(dp_exec_t *e)
{
  e->busy++;
  if (out_flush(e) == 0) {
    if (e->status_queued)
      close_ws(e, 1000, NULL);
    else if (e->status_msg != NULL)
      status_kick(e);
    else
      pump(e);
  }
  e->busy--;
  exec_maybe_free(e);
}

/* The WebSocket frame in hout was handed to the socket (or the session
 * ended: then on_close follows). */
static void ws_written(osr_ws_t *ws, int status, void *arg)
{
  dp_exec_t *e = arg;
  (void)ws;
  e->hwriting = 0;
  e->hout.len = 0;
  if (e->out_pending == 3)
    e->out_pending = 0; /* the parser's buffer is free again */
  if (status == 0)
    on_client_writable(e);
}

static void ws_on_writable(osr_ws_t *ws, void *data)
{
  (void)ws;
  on_client_writable(data);
}

static void ws_on_close(osr_ws_t *ws, int code, const osr_iovec_t *reason, void *data)
{
  dp_exec_t *e = data;
  (void)ws;
  (void)reason;
  OSR_LOG_DEBUG(MOD, "exec %s pid %lld: client closed (%d), %llu output bytes", e->sid,
                (long long)e->pid, code, (unsigned long long)e->offset);
  e->ws = NULL;
  e->out_pending = 0;
  exec_finish(e);
}

static const osr_ws_events_t ws_events = {NULL, ws_on_message, ws_on_writable, ws_on_close};

/* ========================================================================== */
/* The HTTP stream transport: POST .../exec, frames both ways                  */

static void h_written(osr_http_req_t *req, int status, void *arg)
{
  dp_exec_t *e = arg;
  (void)req;
  e->hwriting = 0;
  e->hout.len = 0;
  if (status != 0 || e->hreq == NULL) {
    exec_maybe_free(e);
    return;
  }
  if (e->hend_pending && !e->hend_sent) {
    e->hend_sent = 1;
    e->hend_pending = 0;
    if (osr_http_write(e->hreq, NULL, 0, 1, h_written, e) == 0)
      e->hwriting = 1;
    else
      osr_http_abort(e->hreq);
    return;
  }
  on_client_writable(e);
}

static void h_frame_done(dp_exec_t *e)
{
  const char *p = osr_buf_data(&e->fsmall);
  if (e->fch == 4)
    on_resize(e, p, e->fsmall.len);
  else if (e->fch == 255)
    on_close_channel(e, p, e->fsmall.len);
  e->fsmall.len = 0;
  e->fhdr_len = 0;
  e->fch = -1;
}

/* Request body: frames (4-byte big-endian length of channel + payload, the
 * channel byte, the payload). Stdin payload streams into stdin_buf without
 * waiting for its frame to complete; resize/close payloads are small. */
static void h_on_body(osr_http_req_t *req, const osr_iovec_t *chunk, int status)
{
  dp_exec_t *e = req->data;
  if (status != 0) {
    /* The body ended: that closes stdin, as the close channel would. A cut
     * frame is dropped. */
    if (status == OSR_EOF && e->want_stdin && !e->stdin_close_req) {
      e->stdin_close_req = 1;
      ops_kick(e);
    }
    return;
  }
  const char *p = chunk->base;
  size_t n = chunk->len;
  while (n > 0 && !e->finishing && !e->ended) {
    if (e->fch < 0) {
      size_t k = 5 - e->fhdr_len;
      if (k > n)
        k = n;
      for (size_t i = 0; i < k; i++) {
        if (e->fhdr_len < 4)
          e->fhdr[e->fhdr_len] = (uint8_t)p[i];
        else
          e->fch = (unsigned char)p[i];
        e->fhdr_len++;
      }
      p += k;
      n -= k;
      if (e->fch < 0)
        continue;
      uint32_t len = (uint32_t)e->fhdr[0] << 24 | (uint32_t)e->fhdr[1] << 16 |
                     (uint32_t)e->fhdr[2] << 8 | e->fhdr[3];
      if (len == 0 || (e->fch != 0 && len > 4096)) {
        send_failure(e, 400, "BadRequest", "malformed input frame");
        break;
      }
      e->frem = len - 1;
      if (e->frem == 0)
        h_frame_done(e);
      continue;
    }
    size_t k = e->frem < n ? e->frem : n;
    if (e->fch == 0)
      on_stdin(e, p, k);
    else if ((e->fch == 4 || e->fch == 255) && osr_buf_append(&e->fsmall, p, k) != 0)
      e->fsmall.len = 0;
    p += k;
    n -= k;
    e->frem -= (uint32_t)k;
    if (e->frem == 0)
      h_frame_done(e);
  }
  /* Above the stdin watermark (or before the pid is known) the chunk is
   * held, which stops the connection (HTTP/1.1) or the stream's window
   * (HTTP/2) until SendInput drained it. */
  if (e->stdin_buf.len >= DP_EXEC_STDIN_HIGH || (e->pid <= 0 && e->stdin_buf.len > 0)) {
    e->reading_paused = 1;
    e->hheld = 1;
    osr_http_req_hold(req);
  }
}

static void h_on_done(osr_http_req_t *req, int status)
{
  dp_exec_t *e = req->data;
  OSR_LOG_DEBUG(MOD, "exec %s pid %lld: HTTP stream over (%s), %llu output bytes", e->sid,
                (long long)e->pid, status == 0 ? "ok" : osr_strerror(status),
                (unsigned long long)e->offset);
  e->hreq = NULL;
  e->out_pending = 0;
  exec_finish(e);
}

/* ========================================================================== */
/* Entry points                                                                */

static const char *const subprotocols[] = {"v5.channel.k8s.io", "v4.channel.k8s.io"};

static void exec_link(osr_dataplane_t *dp, dp_exec_t *e);

/* POST: answer 200 at once (the response body is the output frames), read
 * the request body as input frames. HTTP/2 carries both directions at once;
 * HTTP/1.1 does too with a chunked request body, for clients that send the
 * body while reading the response. */
static void exec_http_start(osr_dataplane_t *dp, osr_http_req_t *req, dp_exec_t *e)
{
  osr_http_header_t h[2] = {
      {OSR_IOV_LIT("content-type"), OSR_IOV_LIT(DP_EXEC_CONTENT_TYPE)},
      {OSR_IOV_LIT("cache-control"), OSR_IOV_LIT("no-store")},
  };
  if (osr_http_respond(req, 200, h, 2, -1) != 0) {
    osr_http_abort(req);
    exec_discard(e);
    return;
  }
  e->hreq = req;
  e->v5 = 1;
  req->data = e;
  req->on_body = h_on_body;
  req->on_done = h_on_done;
  /* HTTP/1.1 sends a response head with the first body write; a process
   * that prints nothing until it has input (cat) would then leave a client
   * that waits for the head before it sends input waiting for ever. An
   * empty write sends the head now (HTTP/2 sends its HEADERS at once). */
  if (req->version != 20 && osr_http_write(req, NULL, 0, 0, h_written, e) == 0)
    e->hwriting = 1;
  exec_link(dp, e);
  OSR_LOG_DEBUG(MOD, "%s: exec %s on %s (HTTP/%s stream)", req->peer, e->start_method, e->sid,
                req->version == 20 ? "2" : "1.1");
  exec_connect(e);
}

void osr__dp_exec(osr_dataplane_t *dp, osr_http_req_t *req, const char *addr, int tls,
                  const char *sid)
{
  const osr_iovec_t *up = osr_http_req_header(req, "upgrade");
  int is_ws = up != NULL && up->len == 9 && strncasecmp(up->base, "websocket", 9) == 0;
  int is_post = req->method.len == 4 && memcmp(req->method.base, "POST", 4) == 0;
  if (!is_ws && !is_post) {
    osr__dp_error(req, 400, sid,
                  "exec is a WebSocket (subprotocol v5.channel.k8s.io or v4.channel.k8s.io) "
                  "or a POST stream (" DP_EXEC_CONTENT_TYPE ")");
    return;
  }
  exec_query_t q;
  const char *why = parse_query(req->query, &q);
  if (why != NULL) {
    query_dispose(&q);
    osr__dp_error(req, 400, sid, why);
    return;
  }
  dp_exec_t *e = osr_xcalloc(1, sizeof(*e));
  e->dp = dp;
  e->pid = -1;
  e->want_stdin = q.in;
  e->want_stdout = q.out;
  e->want_stderr = q.err && !q.tty; /* a terminal has one output */
  e->tty = q.tty;
  e->want_info = q.info;
  snprintf(e->addr, sizeof(e->addr), "%s", addr);
  snprintf(e->sid, sizeof(e->sid), "%s", sid);
  e->tls = tls;
  if (dp->cfg.agent_secret != NULL)
    (void)osr_agent_token(dp->cfg.agent_secret, sid, e->agent_tok);
  e->start_body = build_start(&q, &e->start_len, &e->start_method);
  query_dispose(&q);
  osr_cx_parser_init(&e->cx, DP_EXEC_FRAME_MAX);
  osr_buf_init(&e->out, DP_EXEC_FRAME_MAX);
  osr_buf_init(&e->hout, DP_EXEC_FRAME_MAX);
  osr_buf_init(&e->fsmall, 4096);
  e->fch = -1;
  osr_buf_init(&e->errbody, DP_EXEC_ERRBODY_MAX);
  osr_buf_init(&e->op_body, osr_b64_enc_len(DP_EXEC_INPUT_CHUNK) + 256);
  osr_buf_init(&e->stdin_buf, DP_EXEC_STDIN_MAX);
  if (e->start_body == NULL) {
    osr__dp_error(req, 500, sid, "out of memory");
    exec_discard(e);
    return;
  }
  if (!is_ws) {
    exec_http_start(dp, req, e);
    return;
  }
  osr_ws_opts_t wo;
  memset(&wo, 0, sizeof(wo));
  wo.subprotocols = subprotocols;
  wo.nsubprotocols = OSR_ARRAY_SIZE(subprotocols);
  wo.max_message = DP_EXEC_MAX_MESSAGE;
  wo.max_queued = DP_EXEC_WS_QUEUE;
  if (osr_ws_accept(req, &wo, &ws_events, e, &e->ws) != 0) {
    exec_discard(e); /* answered (400/426/500); no callbacks will fire */
    return;
  }
  const char *proto = osr_ws_subprotocol(e->ws);
  e->v5 = proto != NULL && strcmp(proto, "v5.channel.k8s.io") == 0;
  exec_link(dp, e);
  /* Input needs the pid: hold the client until the start event. */
  e->reading_paused = 1;
  osr_ws_read_stop(e->ws);
  if (proto == NULL) {
    /* ws.h: no common subprotocol still answers 101; clients then fail the
     * connection themselves. Nothing is started for them. */
    close_ws(e, 1002, "subprotocol v5.channel.k8s.io or v4.channel.k8s.io required");
    return;
  }
  OSR_LOG_DEBUG(MOD, "%s: exec %s on %s (%s)", req->peer, e->start_method, sid, proto);
  exec_connect(e);
}

static void exec_link(osr_dataplane_t *dp, dp_exec_t *e)
{
  dp->nstreams++;
  e->act = osr__dp_act_open(dp, e->sid);
  e->next = dp->execs;
  if (dp->execs != NULL)
    dp->execs->prev = e;
  dp->execs = e;
}

static void exec_connect(dp_exec_t *e)
{
  osr_dataplane_t *dp = e->dp;
  if (osr__dp_mux_usable(dp, e->addr, e->tls)) {
    e->shared = 1;
    e->sc_connecting = 1;
    int rv = osr__dp_mux_acquire(dp, e->addr, &e->lease, sc_attached);
    dp->n_forwarded++;
    if (rv == 1) {
      e->sc_connecting = 0;
      sc_start(e, e->lease.client);
    } else if (rv < 0) {
      e->sc_connecting = 0;
      e->shared = 0;
      if (rv == OSR_EBUSY)
        send_failure(e, 503, "ServiceUnavailable",
                     "too many exec sessions to this sandbox's agent (exec_mux_conns)");
      else
        sc_connect_failed(e, rv);
    }
    return;
  }
  osr_http_client_opts_t o;
  memset(&o, 0, sizeof(o));
  o.tls = e->tls ? dp->client_tls : NULL;
  o.connect_timeout_ms = DP_EXEC_CONNECT_MS;
  o.idle_timeout_ms = dp->cfg.upstream_idle_ms;
  o.limits.max_body = UINT64_MAX / 2; /* streamed */
  e->sc_connecting = 1;
  int rv = osr_http_client_connect(dp->loop, e->addr, &o, sc_connected, e);
  if (rv != 0) {
    e->sc_connecting = 0;
    send_failure(e, 502, "ServiceUnavailable", "cannot reach the sandbox");
  }
  dp->n_forwarded++;
}

void osr__dp_execs_close(osr_dataplane_t *dp)
{
  for (dp_exec_t *e = dp->execs; e != NULL;) {
    dp_exec_t *next = e->next;
    e->busy++;
    /* The status goes out if the client can take it now; a slow client
     * may never take it, so the close follows regardless (ws.c bounds the
     * close handshake by its close timeout; an HTTP stream ends and the
     * server's grace period bounds it). The process keeps running: the
     * client can re-attach (pid + offset) through another data plane. */
    send_failure(e, 503, "ServiceUnavailable", "the data plane is shutting down");
    close_ws(e, 1001, "the data plane is shutting down");
    exec_finish(e);
    e->busy--;
    exec_maybe_free(e);
    e = next;
  }
}
