/*
 * Connect RPC glue for osr-agent: request bodies in, JSON replies and
 * server-stream frames out (contract §3).
 *
 * Unary: POST /<svc>/<Method>, Content-Type application/json, the body is
 * the request message; the answer is 200 + the response message, or the
 * error's HTTP status + {"code","message"} (always application/json: the
 * client maps a non-JSON error to "unimplemented", contract §10).
 *
 * Server streams: the body is one envelope with the request message; the
 * answer is 200 application/connect+json and a series of envelopes, the
 * last one flagged end-of-stream carrying {} or {"error":{...}}. A stream
 * writes one HTTP write at a time: frames produced meanwhile collect in a
 * capped queue that is swapped into the in-flight buffer when the previous
 * write completes (STYLE 15/16), and owners produce more only below
 * AGENT_STREAM_LOW (STYLE 14), so a slow client costs bounded memory.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "agent/agent.h"
#include "agent/procpb.h"
#include "util/log.h"
#include "util/mem.h"

#define STREAM_QUEUE_MAX (4 * 1024 * 1024)

struct agent_stream_s {
  agent_call_t *call;
  const agent_stream_events_t *ev;
  void *data;
  osr_buf_t queue;    /* frames not yet handed to the HTTP layer */
  osr_buf_t inflight; /* the frames of the write in flight */
  uv_timer_t ka;      /* keepalive timer */
  uint64_t ka_ms;
  char *keepalive; /* the keepalive message (JSON text or protobuf) or NULL */
  size_t ka_len;
  int writing;
  int ended;       /* end-of-stream frame queued */
  int end_written; /* ... and handed to the HTTP layer with end=1 */
  int detached;    /* the owner is gone: no more callbacks */
  int freeing;
  int in_flush;
};

typedef struct rpc_method_s {
  const char *path;
  agent_rpc_fn fn;
  int is_stream;
} rpc_method_t;

static const rpc_method_t methods[] = {
    {"/process.Process/Start", osr__agent_process_start, 1},
    {"/process.Process/Connect", osr__agent_process_connect, 1},
    {"/process.Process/List", osr__agent_process_list, 0},
    {"/process.Process/SendInput", osr__agent_process_send_input, 0},
    {"/process.Process/CloseStdin", osr__agent_process_close_stdin, 0},
    {"/process.Process/SendSignal", osr__agent_process_send_signal, 0},
    {"/process.Process/Update", osr__agent_process_update, 0},
    {"/filesystem.Filesystem/Stat", osr__agent_fs_stat, 0},
    {"/filesystem.Filesystem/ListDir", osr__agent_fs_list_dir, 0},
    {"/filesystem.Filesystem/MakeDir", osr__agent_fs_make_dir, 0},
    {"/filesystem.Filesystem/Move", osr__agent_fs_move, 0},
    {"/filesystem.Filesystem/Remove", osr__agent_fs_remove, 0},
    {"/filesystem.Filesystem/WatchDir", osr__agent_fs_watch_dir, 1},
};

static void call_free(agent_call_t *call)
{
  if (call->msg != NULL)
    json_decref(call->msg);
  osr_free(call);
}

static int64_t header_int(const osr_http_req_t *req, const char *name, int64_t dflt)
{
  const osr_iovec_t *v = osr_http_req_header(req, name);
  if (v == NULL || v->len == 0 || v->len > 18)
    return dflt;
  int64_t n = 0;
  for (size_t i = 0; i < v->len; i++) {
    if (v->base[i] < '0' || v->base[i] > '9')
      return dflt;
    n = n * 10 + (v->base[i] - '0');
  }
  return n;
}

/* ---- replies ------------------------------------------------------------------ */

static void send_error_body(osr_http_req_t *req, int is_stream, int binary, osr_cx_code_t code,
                            const char *msg)
{
  json_t *err = json_pack("{s:s,s:s}", "code", osr_cx_code_name(code), "message", msg);
  if (is_stream) {
    json_t *eos = json_pack("{s:o}", "error", err);
    char *s = json_dumps(eos, JSON_COMPACT);
    json_decref(eos);
    size_t n = s != NULL ? strlen(s) : 0;
    char *frame = osr_xmalloc(OSR_CX_HEADER_LEN + n);
    osr_cx_frame_header((uint8_t *)frame, OSR_CX_FLAG_END_STREAM, (uint32_t)n);
    memcpy(frame + OSR_CX_HEADER_LEN, s, n);
    /* The end-of-stream message is JSON in both codecs (Connect protocol);
     * only the content type names the codec the client asked for. */
    osr_http_send(req, 200, binary ? OSR_PB_CONTENT_TYPE : "application/connect+json", frame,
                  OSR_CX_HEADER_LEN + n);
    osr_free(frame);
    osr_json_free(s);
    return;
  }
  char *s = json_dumps(err, JSON_COMPACT);
  json_decref(err);
  osr_http_send(req, osr_cx_code_http_status(code), "application/json", s,
                s != NULL ? strlen(s) : 0);
  osr_json_free(s);
}

/* Mark the call answered and send through `req` if it still exists. The
 * send may finish the exchange synchronously (on_done frees the call), so
 * the call is not touched after it. */
static osr_http_req_t *call_take_req(agent_call_t *call)
{
  call->_replied = 1;
  osr_http_req_t *req = call->req;
  if (req == NULL && call->_done)
    call_free(call);
  return req;
}

void agent_call_reply(agent_call_t *call, json_t *resp)
{
  if (call->_replied || call->is_stream) {
    json_decref(resp);
    return;
  }
  char *s = json_dumps(resp, JSON_COMPACT);
  json_decref(resp);
  osr_http_req_t *req = call_take_req(call);
  if (req != NULL)
    osr_http_send(req, 200, "application/json", s, s != NULL ? strlen(s) : 0);
  osr_json_free(s);
}

void agent_call_error(agent_call_t *call, osr_cx_code_t code, const char *fmt, ...)
{
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (call->_replied)
    return;
  if (call->_stream != NULL) {
    agent_stream_end(call->_stream, code, msg);
    return;
  }
  int is_stream = call->is_stream, binary = call->binary;
  osr_http_req_t *req = call_take_req(call);
  if (req != NULL)
    send_error_body(req, is_stream, binary, code, msg);
}

/* ---- streams ------------------------------------------------------------------ */

static void stream_flush(agent_stream_t *st);

static void stream_free(agent_stream_t *st);

static void on_ka_closed(uv_handle_t *h)
{
  agent_stream_t *st = h->data;
  osr_buf_dispose(&st->queue);
  osr_buf_dispose(&st->inflight);
  osr_free(st->keepalive);
  call_free(st->call);
  osr_free(st);
}

static void on_ka_closed_bare(uv_handle_t *h)
{
  agent_stream_t *st = h->data;
  osr_buf_dispose(&st->queue);
  osr_buf_dispose(&st->inflight);
  osr_free(st->keepalive);
  osr_free(st);
}

static void stream_free(agent_stream_t *st)
{
  if (st->freeing)
    return;
  st->freeing = 1;
  uv_close((uv_handle_t *)&st->ka, on_ka_closed);
}

static int queue_frame(agent_stream_t *st, uint8_t flags, const char *s, size_t n)
{
  osr_iovec_t tail;
  int rv = osr_buf_reserve(&st->queue, OSR_CX_HEADER_LEN + n, &tail);
  if (rv != 0)
    return rv;
  osr_cx_frame_header((uint8_t *)tail.base, flags, (uint32_t)n);
  memcpy(tail.base + OSR_CX_HEADER_LEN, s, n);
  osr_buf_commit(&st->queue, OSR_CX_HEADER_LEN + n);
  return 0;
}

static void on_ka(uv_timer_t *t)
{
  agent_stream_t *st = t->data;
  if (st->ended || st->call->req == NULL)
    return;
  if (st->queue.len == 0 && !st->writing && st->keepalive != NULL) {
    if (queue_frame(st, 0, st->keepalive, st->ka_len) == 0)
      stream_flush(st);
  }
  uv_timer_start(&st->ka, on_ka, st->ka_ms, 0);
}

static void on_abort_timer(uv_timer_t *t)
{
  agent_stream_t *st = t->data;
  if (st->call->req != NULL)
    osr_http_abort(st->call->req);
}

/* Aborting can finish the exchange synchronously (on_done -> the owner's
 * on_close frees its state), which must not happen under an owner's call
 * into the stream; so it runs from the next loop turn (STYLE 19). */
static void stream_abort_later(agent_stream_t *st)
{
  st->ended = 1;
  st->end_written = 1;
  uv_timer_start(&st->ka, on_abort_timer, 0, 0);
}

static void stream_written(osr_http_req_t *req, int status, void *arg)
{
  agent_stream_t *st = arg;
  (void)req;
  st->writing = 0;
  osr_buf_consume(&st->inflight, st->inflight.len);
  if (status != 0 || st->call->req == NULL) {
    if (st->call->_done)
      stream_free(st); /* on_done already ran and left the free to us */
    return;
  }
  stream_flush(st);
}

static void stream_flush(agent_stream_t *st)
{
  if (st->in_flush)
    return;
  st->in_flush = 1;
  for (;;) {
    osr_http_req_t *req = st->call->req;
    if (st->writing || req == NULL || st->end_written)
      break;
    if (st->queue.len == 0) {
      /* Drained: ask the owner for more, once; it may queue and we loop. */
      if (st->ended || st->detached || st->ev == NULL || st->ev->on_writable == NULL)
        break;
      size_t before = st->queue.len;
      st->ev->on_writable(st, st->data);
      if (st->queue.len == before || st->call->req == NULL)
        break;
      continue;
    }
    osr_buf_swap(&st->queue, &st->inflight);
    int end = st->ended;
    osr_iovec_t iov = osr_iov(osr_buf_data(&st->inflight), st->inflight.len);
    st->writing = 1;
    if (end)
      st->end_written = 1;
    if (osr_http_write(req, &iov, 1, end, stream_written, st) != 0) {
      st->writing = 0;
      stream_abort_later(st);
      break;
    }
    /* Low watermark reached with the write in flight: let the owner fill
     * the queue now so the next write is ready when this one completes. */
    if (!st->ended && !st->detached && st->ev != NULL && st->ev->on_writable != NULL &&
        st->call->req != NULL && st->queue.len < AGENT_STREAM_LOW)
      st->ev->on_writable(st, st->data);
    break;
  }
  st->in_flush = 0;
}

static void stream_on_done(agent_stream_t *st)
{
  uv_timer_stop(&st->ka);
  if (!st->detached && st->ev != NULL && st->ev->on_close != NULL) {
    st->detached = 1;
    st->ev->on_close(st, st->data);
  }
  st->detached = 1;
  if (!st->writing)
    stream_free(st);
}

agent_stream_t *agent_stream_begin(agent_call_t *call, const agent_stream_events_t *ev, void *data,
                                   const char *keepalive)
{
  if (call->req == NULL || call->_replied)
    return NULL;
  agent_stream_t *st = osr_xcalloc(1, sizeof(*st));
  st->call = call;
  st->ev = ev;
  st->data = data;
  osr_buf_init(&st->queue, STREAM_QUEUE_MAX);
  osr_buf_init(&st->inflight, STREAM_QUEUE_MAX);
  uv_timer_init(call->agent->loop, &st->ka);
  st->ka.data = st;
  if (keepalive != NULL && call->binary) {
    st->ka_len = sizeof(osr_pb_keepalive);
    st->keepalive = osr_xmalloc(st->ka_len);
    memcpy(st->keepalive, osr_pb_keepalive, st->ka_len);
  } else if (keepalive != NULL) {
    st->keepalive = osr_xstrdup(keepalive);
    st->ka_len = strlen(keepalive);
  }
  int64_t ka = call->keepalive_s > 0 ? call->keepalive_s : 90;
  st->ka_ms = (uint64_t)ka * 1000;
  call->_stream = st;
  call->_replied = 1;
  osr_http_header_t h = {OSR_IOV_LIT("content-type"), call->binary
                                                          ? OSR_IOV_LIT(OSR_PB_CONTENT_TYPE)
                                                          : OSR_IOV_LIT("application/connect+json")};
  if (osr_http_respond(call->req, 200, &h, 1, -1) != 0) {
    /* No stream after all: the owner gets NULL and no callbacks; the
     * abort's on_done frees the call (already marked replied). */
    call->_stream = NULL;
    osr_http_req_t *req = call->req;
    st->call = NULL;
    st->freeing = 1;
    uv_close((uv_handle_t *)&st->ka, on_ka_closed_bare);
    osr_http_abort(req);
    return NULL;
  }
  if (st->keepalive != NULL)
    uv_timer_start(&st->ka, on_ka, st->ka_ms, 0);
  return st;
}

int agent_stream_send(agent_stream_t *st, json_t *msg)
{
  char *s = json_dumps(msg, JSON_COMPACT);
  json_decref(msg);
  if (s == NULL)
    return OSR_ENOMEM;
  int rv = OSR_ECLOSED;
  if (!st->ended && st->call->req != NULL)
    rv = queue_frame(st, 0, s, strlen(s));
  osr_json_free(s);
  if (rv == 0) {
    if (st->keepalive != NULL)
      uv_timer_start(&st->ka, on_ka, st->ka_ms, 0); /* idle time restarts */
    stream_flush(st);
  }
  return rv;
}

int agent_stream_send_raw(agent_stream_t *st, const char *json, size_t len)
{
  osr_iovec_t iov = osr_iov(json, len);
  return agent_stream_send_iov(st, &iov, 1);
}

int agent_stream_send_iov(agent_stream_t *st, const osr_iovec_t *iov, size_t n)
{
  if (st->ended || st->call->req == NULL)
    return OSR_ECLOSED;
  size_t len = 0;
  for (size_t i = 0; i < n; i++)
    len += iov[i].len;
  osr_iovec_t tail;
  int rv = osr_buf_reserve(&st->queue, OSR_CX_HEADER_LEN + len, &tail);
  if (rv == 0) {
    /* The pieces are gathered into the queue here, the one copy between
     * the output ring and the socket (the queue is what is written). */
    osr_cx_frame_header((uint8_t *)tail.base, 0, (uint32_t)len);
    size_t off = OSR_CX_HEADER_LEN;
    for (size_t i = 0; i < n; i++) {
      if (iov[i].len > 0)
        memcpy(tail.base + off, iov[i].base, iov[i].len);
      off += iov[i].len;
    }
    osr_buf_commit(&st->queue, off);
  }
  if (rv == 0) {
    if (st->keepalive != NULL)
      uv_timer_start(&st->ka, on_ka, st->ka_ms, 0);
    stream_flush(st);
  }
  return rv;
}

size_t agent_stream_queued(const agent_stream_t *st)
{
  return st->queue.len + st->inflight.len;
}

void agent_stream_end(agent_stream_t *st, osr_cx_code_t code, const char *msg)
{
  if (st->ended)
    return;
  st->ended = 1;
  uv_timer_stop(&st->ka);
  if (st->call->req == NULL)
    return;
  char *s;
  if (code == 0) {
    s = osr_xstrdup("{}");
  } else {
    json_t *e = json_pack("{s:{s:s,s:s}}", "error", "code", osr_cx_code_name(code), "message",
                          msg != NULL ? msg : "");
    char *d = json_dumps(e, JSON_COMPACT);
    json_decref(e);
    s = osr_xstrdup(d != NULL ? d : "{}");
    osr_json_free(d);
  }
  /* The end frame must go out even past the soft cap: it is tiny, and the
   * queue cap exists for data, not for the one frame that ends it. */
  if (queue_frame(st, OSR_CX_FLAG_END_STREAM, s, strlen(s)) != 0) {
    osr_free(s);
    stream_abort_later(st);
    return;
  }
  osr_free(s);
  stream_flush(st);
}

void agent_stream_detach(agent_stream_t *st)
{
  st->detached = 1;
  st->ev = NULL;
  if (!st->ended)
    agent_stream_end(st, 0, NULL);
}

/* ---- request intake ---------------------------------------------------------- */

static void call_on_done(osr_http_req_t *req, int status)
{
  agent_call_t *call = req->data;
  (void)status;
  call->req = NULL;
  call->_done = 1;
  if (call->_stream != NULL) {
    stream_on_done(call->_stream); /* frees the call with the stream */
    return;
  }
  if (call->_replied)
    call_free(call);
  /* else: a handler still works on it and will reply into the void. */
}

static void on_full_body(osr_http_req_t *req, osr_iovec_t body, int status)
{
  agent_call_t *call = req->data;
  const rpc_method_t *m = NULL;
  for (size_t i = 0; i < OSR_ARRAY_SIZE(methods); i++)
    if (req->path.len == strlen(methods[i].path) &&
        memcmp(req->path.base, methods[i].path, req->path.len) == 0)
      m = &methods[i];
  if (status != 0) {
    if (status == OSR_ETOOLARGE)
      agent_call_error(call, OSR_CX_RESOURCE_EXHAUSTED, "request message too large");
    else
      osr_http_abort(req);
    return;
  }
  const char *json = body.base;
  size_t jlen = body.len;
  osr_cx_parser_t p;
  osr_cx_parser_init(&p, OSR_AGENT_MAX_RPC_BODY);
  if (m->is_stream) {
    /* One envelope carrying the request message, nothing after it. */
    osr_cx_msg_t msg;
    size_t used = 0;
    int rv = osr_cx_parse(&p, body.base, body.len, &used, &msg);
    if (rv != 1 || used != body.len || msg.flags != 0) {
      osr_cx_parser_dispose(&p);
      agent_call_error(call, OSR_CX_INVALID_ARGUMENT, "bad request envelope");
      return;
    }
    json = msg.data;
    jlen = msg.len;
  }
  if (call->binary) {
    /* application/connect+proto: process.Start and Connect only, the two
     * streams whose output is worth sending raw (procpb.h). The message
     * becomes the JSON object the JSON codec would have carried, so the
     * handler does not care which codec the client chose. */
    int is_connect = m->fn == osr__agent_process_connect;
    if (m->fn != osr__agent_process_start && !is_connect) {
      osr_cx_parser_dispose(&p);
      agent_call_error(call, OSR_CX_UNIMPLEMENTED, "the binary codec is only served for %s",
                       "process.Process/Start and Connect");
      return;
    }
    call->msg = osr_pb_request_to_json(json != NULL ? json : "", jlen, is_connect);
    osr_cx_parser_dispose(&p);
    if (call->msg == NULL) {
      agent_call_error(call, OSR_CX_INVALID_ARGUMENT, "malformed protobuf request message");
      return;
    }
    m->fn(call);
    return;
  }
  json_error_t jerr;
  call->msg = json_loadb(json != NULL ? json : "", jlen, JSON_REJECT_DUPLICATES, &jerr);
  osr_cx_parser_dispose(&p);
  if (call->msg == NULL || !json_is_object(call->msg)) {
    agent_call_error(call, OSR_CX_INVALID_ARGUMENT, "request is not a JSON object");
    return;
  }
  m->fn(call);
}

int osr__agent_rpc_dispatch(agent_t *a, osr_http_req_t *req)
{
  const rpc_method_t *m = NULL;
  for (size_t i = 0; i < OSR_ARRAY_SIZE(methods); i++)
    if (req->path.len == strlen(methods[i].path) &&
        memcmp(req->path.base, methods[i].path, req->path.len) == 0)
      m = &methods[i];
  if (m == NULL)
    return 0;
  agent_call_t *call = osr_xcalloc(1, sizeof(*call));
  call->agent = a;
  call->req = req;
  call->is_stream = m->is_stream;
  const osr_iovec_t *ct = osr_http_req_header(req, "content-type");
  size_t ctl = sizeof(OSR_PB_CONTENT_TYPE) - 1;
  /* Parameters (";...") are allowed after the media type; case does not
   * matter (RFC 9110 8.3.1). */
  call->binary = m->is_stream && ct != NULL && ct->len >= ctl &&
                 strncasecmp(ct->base, OSR_PB_CONTENT_TYPE, ctl) == 0 &&
                 (ct->len == ctl || ct->base[ctl] == ';' || ct->base[ctl] == ' ');
  call->timeout_ms = header_int(req, "connect-timeout-ms", -1);
  call->keepalive_s = header_int(req, "keepalive-ping-interval", 90);
  osr__agent_req_username(req, call->username, sizeof(call->username));
  req->data = call;
  req->on_done = call_on_done;
  if (req->method.len != 4 || memcmp(req->method.base, "POST", 4) != 0) {
    call->_replied = 1;
    osr_http_header_t h = {OSR_IOV_LIT("allow"), OSR_IOV_LIT("POST")};
    if (osr_http_respond(req, 405, &h, 1, 0) == 0)
      osr_http_write(req, NULL, 0, 1, NULL, NULL);
    return 1;
  }
  if (osr_http_req_read_body(req, OSR_AGENT_MAX_RPC_BODY, on_full_body) != 0)
    agent_call_error(call, OSR_CX_INTERNAL, "cannot read the request body");
  return 1;
}
