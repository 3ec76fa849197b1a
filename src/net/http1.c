/*
 * HTTP/1.1 server connections on llhttp (through the bounded parser in
 * http1_parse.c), behind the request API of http.h.
 *
 * One connection, one request at a time. Requests are parsed in order; the
 * parser stops at each message boundary and the connection stops reading
 * until the current exchange is over (response written and request body
 * consumed), so pipelined bytes stay in sock->input and a client that
 * pipelines faster than we answer fills its own socket buffer, not our
 * memory (STYLE 14).
 *
 * Memory. The parser collects the head in a capped buffer owned by the
 * connection; the request's target and header array are that buffer's, and
 * stay valid until the request is freed right after on_done (STYLE 10)
 * because the next message is parsed only after that. The request struct
 * is one pooled block per request. Nothing points into the read buffer
 * after a callback returns, except a body chunk the handler holds.
 *
 * Body flow control. A body chunk is a span of sock->input. If the handler
 * holds it, the parser pauses right after it (llhttp HPE_PAUSED), the socket
 * stops reading and the chunk stays unconsumed in sock->input (which the
 * socket never moves while reading is stopped); release consumes it and
 * reading resumes, the buffered rest being delivered on the next loop turn.
 *
 * Output backpressure. Every response write is one osr_sock_write and only
 * one may be in flight per request; its callback fires once the bytes left
 * for the kernel. So the handler's write callback is what drives more
 * output: a producer that writes from the callback never queues more than
 * one write's worth on a slow client, whatever the socket's write queue
 * holds. Each write is flushed as it comes (no coalescing), which is what
 * streamed responses need.
 *
 * Lifetime. The connection owns a timer on the loop's shared timer heap
 * (net/loopctx.h: header timeout, lingering close, deferred empty writes)
 * besides the socket, and no libuv handle. Once the socket is gone (its
 * on_close) or handed to HTTP/2 or an Upgrade callback, the same timer is
 * armed one last time, for 0 ms, and the connection is freed from that
 * top-level callback, never from inside a frame that may still use it
 * (STYLE 19). Requests end in exactly one of two
 * places: exchange_done() when the exchange completed, or on_sock_close()
 * for every kind of failure, so on_done fires exactly once.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "net/http.h"
#include "net/http1_parse.h"
#include "util/blockpool.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/slab.h"
#include "util/text.h"

#define MOD "http1"

/* After an error response or a Connection: close response we shut down our
 * side and read (and drop) what the client still sends for a while, so the
 * kernel does not answer unread data with an RST that would destroy the
 * response before the client read it (lingering close, as nginx/h2o do). */
#define LINGER_MS 2000
#define LINGER_MIN_BYTES (1024 * 1024)
#define LINGER_MAX_BYTES (16 * 1024 * 1024)

#define INLINE_IOVS 16
/* Response heads up to this size are formatted inside the request (no
 * allocation per response); larger ones get a block of their own. */
#define HEAD_INLINE 320
#define ERRBUF_SIZE 192 /* an error response head: status, reason, date */
/* A request struct lives in one pooled block (see new_req). */
#define REQ_BLOCK 4096 /* = osr_block_size(OSR_BLOCK_4K) */

static const char H2_PREFACE[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
#define H2_PREFACE_LEN (sizeof(H2_PREFACE) - 1)

typedef struct h1conn_s h1conn_t;

/* A keep-alive connection idle this long is parked: its h1conn_t is freed
 * and the socket alone waits for the next request (see park()). */
#define PARK_MS 500

enum {
  TIMER_NONE,
  TIMER_HEADER,
  TIMER_HEADER_DONE,
  TIMER_LINGER,
  TIMER_DEFER,
  TIMER_FREE,
  TIMER_PARK
};

typedef struct h1req_s {
  osr_http_req_t pub; /* first: the API hands out &pub */
  h1conn_t *conn;

  /* request side */
  int req_keep_alive;   /* the client allows another request after this one */
  int body_complete;    /* the parser saw the end of the message */
  int body_final;       /* on_body got its final call */
  int in_body_cb;
  int held;
  int expect_100;       /* Expect: 100-continue and 100 not sent */
  int is_head;

  /* response side */
  int keep_alive;       /* decided when the response starts */
  int chunked;
  int no_body;
  int64_t resp_cl;      /* -1: chunked or until close */
  uint64_t resp_written;
  int head_pending;     /* formatted, goes out with the first write */
  int end_queued;
  int resp_done;        /* the last write completed */
  int write_inflight;
  int deferred_empty;   /* an empty write completes from the timer */
  osr_http_write_cb wcb;
  void *warg;
  char *head;           /* the formatted head: head_inline or a heap block */
  size_t head_len;
  osr_iovec_t *iov_heap;

  /* upgrade */
  int upgrading;
  osr_http_upgrade_cb ucb;
  void *uarg;

  /* Scratch space, last: new_req() zeroes only what comes before it. */
  char head_inline[HEAD_INLINE];
  char chunk_line[24];
  osr_iovec_t iov_inline[INLINE_IOVS];
} h1req_t;

struct h1conn_s {
  /* The server is osr__http_server_of(opts): one pointer less per idle
   * connection. Laid out without padding: 120 bytes, a 128-byte malloc
   * chunk (an idle keep-alive connection is mostly this and its socket). */
  const osr_http_server_opts_t *opts;
  osr_sock_t *sock;     /* NULL once closed or handed over */
  osr_h1p_t *p;         /* NULL between requests (see parser_get) */
  osr_timer_t timer;    /* holds a reference on its loop context */
  h1req_t *req;         /* the current exchange, or NULL */
  char *errbuf;         /* our error response (allocated when one is sent) */
  uint64_t hdr_deadline; /* loop time by which the current head must be complete;
                          * between requests (TIMER_PARK), when the last one ended */
  int close_status;     /* why, for on_done */
  uint32_t linger_bytes;
  osr_sock_peer_t peer; /* formatted per request and per log line */
  /* Flags, packed. */
  unsigned timer_mode : 3;
  unsigned sniff : 1;   /* cleartext and nothing parsed yet: look for h2c */
  unsigned draining : 1;
  unsigned resume_parser : 1; /* a held chunk was released: run the parser even without new bytes */
  unsigned lingering : 1;
  unsigned err_writing : 1; /* our own error response is being written */
  unsigned closing : 1;
  unsigned peer_eof : 1;
};

static void process_input(h1conn_t *c);
static void exchange_done(h1conn_t *c);

/* Connection structs of this thread, in pages of their own (util/slab.h):
 * parked connections free theirs, and that has to give memory back, which
 * a hole between two sockets in the malloc heap would not. */
static __thread osr_slab_t conn_slab = {.size = sizeof(h1conn_t), .max_spare = 8};

static const osr_iovec_t EMPTY_CHUNK = {NULL, 0};

/* ---- helpers --------------------------------------------------------------- */

/* The peer's printable form for a log line (formatted only if it is
 * written: OSR_LOG evaluates its arguments only at an enabled level). */
static const char *peer_text(const h1conn_t *c, char buf[64])
{
  osr_sock_peer_format(&c->peer, buf, 64);
  return buf;
}

static int sock_usable(const h1conn_t *c)
{
  return c->sock != NULL && !c->closing && !osr_sock_is_closing(c->sock);
}

static void timer_set(h1conn_t *c, int mode, uint64_t ms);

static void conn_close(h1conn_t *c, int status)
{
  if (c->sock == NULL || c->closing)
    return;
  c->closing = 1;
  if (c->close_status == 0)
    c->close_status = status;
  osr_timer_stop(&c->timer);
  c->timer_mode = TIMER_NONE;
  osr_sock_close(c->sock);
}

static void head_free(h1req_t *r)
{
  if (r->head != r->head_inline)
    osr_free(r->head);
  r->head = NULL;
  r->head_len = 0;
}

static void free_req(h1req_t *r)
{
  head_free(r);
  osr_freep(&r->iov_heap);
  /* Back to the thread's pool: the next request, on this connection or
   * another, takes the same resident block, and an idle connection holds
   * none. */
  osr_block_put(OSR_BLOCK_4K, r);
}

/* Final on_body call for a body that ended abnormally (at most once). */
static void body_final(h1req_t *r, int status)
{
  if (r->body_final || r->body_complete)
    return;
  r->body_final = 1;
  if (r->pub.on_body != NULL)
    r->pub.on_body(&r->pub, &EMPTY_CHUNK, status);
}

/* End the current request with a failure. Only from a top-level callback. */
static void fail_req(h1conn_t *c, int status)
{
  h1req_t *r = c->req;
  if (r == NULL)
    return;
  c->req = NULL;
  body_final(r, status);
  osr__http_req_done(&r->pub, status);
  if (r->upgrading && r->ucb != NULL)
    r->ucb(NULL, status, r->uarg);
  free_req(r);
}

/* RFC 7231 IMF-fixdate, formatted once per second. */
static const char *http_date(void)
{
  static char buf[40];
  static time_t last;
  time_t now = time(NULL);
  if (now != last || buf[0] == '\0') {
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(buf, sizeof(buf), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    last = now;
  }
  return buf;
}

/* ---- lingering close and error responses ----------------------------------- */

/* How much a lingering connection reads and drops before it closes: enough
 * for a client whose body is refused for its size (413, decided from the
 * head) to finish sending a body of a few times the cap and then read the
 * answer, within [LINGER_MIN_BYTES, LINGER_MAX_BYTES]. */
static uint32_t linger_budget(const h1conn_t *c)
{
  uint64_t cap = c->opts->limits.max_body;
  if (cap >= LINGER_MAX_BYTES / 4)
    return LINGER_MAX_BYTES;
  return cap * 4 > LINGER_MIN_BYTES ? (uint32_t)(cap * 4) : LINGER_MIN_BYTES;
}

static void linger_close(h1conn_t *c)
{
  if (!sock_usable(c))
    return;
  c->lingering = 1;
  c->linger_bytes = 0;
  osr_buf_consume(&c->sock->input, c->sock->input.len);
  if (osr_sock_shutdown(c->sock, NULL, NULL) != 0 || c->peer_eof) {
    conn_close(c, 0);
    return;
  }
  osr_sock_read_start(c->sock);
  timer_set(c, TIMER_LINGER, LINGER_MS);
}

static void on_err_written(osr_sock_t *s, int status, void *arg)
{
  h1conn_t *c = arg;
  (void)s;
  c->err_writing = 0;
  if (status != 0)
    conn_close(c, status);
  else
    linger_close(c);
}

/* The request is invalid or timed out: answer `status` ourselves if no
 * response was started, then close. */
static void conn_fail(h1conn_t *c, int status, int err)
{
  if (!sock_usable(c))
    return;
  h1req_t *r = c->req;
  if (r != NULL && (r->pub._responded || r->write_inflight)) {
    /* Mid-response: nothing valid can be said any more. */
    conn_close(c, err);
    return;
  }
  char pb[64];
  OSR_LOG_DEBUG(MOD, "%s: %d (%s)", peer_text(c, pb), status, osr_strerror(err));
  osr_timer_stop(&c->timer);
  c->timer_mode = TIMER_NONE;
  osr_sock_read_stop(c->sock);
  if (c->errbuf == NULL)
    c->errbuf = osr_xmalloc(ERRBUF_SIZE); /* rare: not carried by every connection */
  int n = snprintf(c->errbuf, ERRBUF_SIZE,
                   "HTTP/1.1 %d %s\r\ndate: %s\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                   status, osr_http_reason(status), http_date());
  osr_iovec_t iov = osr_iov(c->errbuf, (size_t)n);
  c->err_writing = 1;
  if (osr_sock_write(c->sock, &iov, 1, on_err_written, c) != 0) {
    c->err_writing = 0;
    conn_close(c, err);
  }
  /* Tell the handler only now: whatever it does in on_body/on_done (answer,
   * abort) no longer applies to this connection, so our answer goes out. */
  fail_req(c, err);
}

/* ---- timers ----------------------------------------------------------------- */

static void conn_free(h1conn_t *c);
static int parkable(const h1conn_t *c);
static void park(h1conn_t *c);

static void on_timer(osr_timer_t *t)
{
  h1conn_t *c = osr_container_of(t, h1conn_t, timer);
  int mode = c->timer_mode;
  c->timer_mode = TIMER_NONE;

  switch (mode) {
  case TIMER_HEADER: {
    /* The timer is left running between requests (see on_msg_begin), so it
     * may fire for an earlier head: re-arm for what is left of this one. */
    uint64_t now = osr_loopctx_now(osr_timer_ctx(&c->timer));
    if (now < c->hdr_deadline) {
      timer_set(c, TIMER_HEADER, c->hdr_deadline - now);
      break;
    }
    /* The header block did not complete in time (slowloris). */
    if (c->req == NULL && !c->err_writing)
      conn_fail(c, 408, OSR_ETIMEDOUT);
    break;
  }
  case TIMER_LINGER:
    conn_close(c, 0);
    break;
  case TIMER_DEFER: {
    /* An empty write: complete it as if the socket had written it. */
    h1req_t *r = c->req;
    if (r == NULL || !r->deferred_empty)
      break;
    r->deferred_empty = 0;
    r->write_inflight = 0;
    if (r->end_queued)
      r->resp_done = 1;
    osr_http_write_cb cb = r->wcb;
    r->wcb = NULL;
    if (cb != NULL)
      cb(&r->pub, 0, r->warg);
    if (c->req == r && r->resp_done && sock_usable(c))
      exchange_done(c);
    break;
  }
  case TIMER_FREE:
    conn_free(c);
    break;
  case TIMER_PARK: {
    uint64_t now = osr_loopctx_now(osr_timer_ctx(&c->timer));
    if (!parkable(c))
      break;
    if (now - c->hdr_deadline < PARK_MS) {
      /* Armed for an earlier idle spell (see idle_start): wait for the
       * rest of this one. */
      timer_set(c, TIMER_PARK, PARK_MS - (now - c->hdr_deadline));
      break;
    }
    park(c);
    break;
  }
  default:
    break;
  }
}

static void timer_set(h1conn_t *c, int mode, uint64_t ms)
{
  if (c->timer_mode == TIMER_FREE)
    return; /* released: the timer now only frees the connection */
  c->timer_mode = mode;
  osr_timer_start(&c->timer, on_timer, ms);
}

static void parser_drop(h1conn_t *c);

static void conn_free(h1conn_t *c)
{
  parser_drop(c);
  osr_free(c->errbuf);
  osr_loopctx_release(osr_timer_ctx(&c->timer));
  osr_slab_free(&conn_slab, c);
}

/* The socket is gone or handed over: free the connection from the next
 * timer pass, outside the callers' frames. */
static void conn_release(h1conn_t *c)
{
  c->sock = NULL;
  c->timer_mode = TIMER_FREE;
  osr_timer_start(&c->timer, on_timer, 0);
}

/* ---- socket events ------------------------------------------------------- */

static void on_sock_read(osr_sock_t *s, int status);
static void on_sock_close(osr_sock_t *s);
static void on_sock_timeout(osr_sock_t *s);
static void on_sock_drain(osr_sock_t *s);

static const osr_sock_events_t sock_events = {
  .on_read = on_sock_read,
  .on_close = on_sock_close,
  .on_timeout = on_sock_timeout,
  .on_drain = on_sock_drain,
};

static void on_sock_close(osr_sock_t *s)
{
  h1conn_t *c = s->data;
  c->closing = 1;
  if (c->req != NULL)
    fail_req(c, c->close_status != 0 ? c->close_status : OSR_ECONNRESET);
  conn_release(c);
}

static void on_sock_timeout(osr_sock_t *s)
{
  h1conn_t *c = s->data;
  h1req_t *r = c->req;

  if (r == NULL) {
    conn_close(c, 0); /* keep-alive idle, or a client that never spoke */
    return;
  }
  /* Nothing moved for idle_timeout_ms. If we wait for the client (a write
   * it does not read, or a body it does not send), give up; if we wait for
   * the handler (it holds the body or has not answered yet), that is the
   * handler's business: keep waiting. */
  if (r->write_inflight || (!r->body_complete && !r->held)) {
    char pb[64];
    OSR_LOG_DEBUG(MOD, "%s: idle timeout mid-request", peer_text(c, pb));
    conn_close(c, OSR_ETIMEDOUT);
    return;
  }
  osr_sock_set_idle_timeout(s, c->opts->limits.idle_timeout_ms);
}

static void on_sock_drain(osr_sock_t *s)
{
  h1conn_t *c = s->data;
  c->draining = 1;
  /* Idle connections close now; a busy one finishes its response (which
   * then says Connection: close) and closes in exchange_done(). */
  if (c->req == NULL && !c->err_writing && !c->lingering)
    conn_close(c, 0);
}

static void on_sock_read(osr_sock_t *s, int status)
{
  h1conn_t *c = s->data;

  if (c->closing)
    return;
  if (c->lingering) {
    c->linger_bytes += (uint32_t)s->input.len; /* < LINGER_MAX_BYTES + the input cap */
    osr_buf_consume(&s->input, s->input.len);
    if (status < 0 || c->linger_bytes > linger_budget(c))
      conn_close(c, 0);
    return;
  }
  if (status < 0) {
    h1req_t *r = c->req;
    if (status == OSR_ETOOLARGE && r == NULL) {
      /* The input cap was reached without a complete head. */
      conn_fail(c, 431, OSR_ETOOLARGE);
      return;
    }
    c->peer_eof = 1;
    if (c->err_writing)
      return; /* on_err_written closes */
    if (r != NULL && (r->body_complete || status == OSR_ETOOLARGE)) {
      /* The client half-closed after a complete request (or we stopped
       * reading a pipelined backlog): answer, then close. */
      if (status != OSR_EOF && status != OSR_ETOOLARGE)
        conn_close(c, status);
      return;
    }
    /* Truncated request or body: nothing to answer. */
    conn_close(c, r != NULL ? (status == OSR_EOF ? OSR_ECONNRESET : status) : 0);
    return;
  }
  process_input(c);
}

/* ---- parser events --------------------------------------------------------- */

static int on_msg_begin(osr_h1p_t *p)
{
  h1conn_t *c = p->data;
  /* The whole head has to arrive within header_timeout_ms of its first
   * byte; the socket's idle timer alone would be reset by every dribbled
   * byte. A header timer still running from an earlier request fires no
   * later than this deadline and re-arms for the rest, which saves a timer
   * heap removal and insertion per request on keep-alive connections. */
  uint64_t ms = c->opts->limits.header_timeout_ms;
  c->hdr_deadline = osr_loopctx_now(osr_timer_ctx(&c->timer)) + ms;
  if ((c->timer_mode == TIMER_HEADER || c->timer_mode == TIMER_HEADER_DONE ||
       c->timer_mode == TIMER_PARK) &&
      osr_timer_is_active(&c->timer)) {
    c->timer_mode = TIMER_HEADER;
    return 0;
  }
  timer_set(c, TIMER_HEADER, ms);
  return 0;
}

static void split_target(osr_http_req_t *q)
{
  const char *qm = memchr(q->target.base, '?', q->target.len);
  if (qm == NULL) {
    q->path = q->target;
    q->query = osr_iov(q->target.base + q->target.len, 0);
  } else {
    size_t n = (size_t)(qm - q->target.base);
    q->path = osr_iov(q->target.base, n);
    q->query = osr_iov(qm + 1, q->target.len - n - 1);
  }
}

/* The request struct in a pooled block. Its target and header array are
 * the parser's own (p->target, p->headers): the parser stops at each message
 * boundary and begins the next message, which is what clears its head, only
 * after exchange_done() freed this request, and it is trimmed or dropped
 * only after that too (exchange_done, conn_free). So nothing is copied per
 * request; trailers are never added to the head. */
static h1req_t *new_req(h1conn_t *c, const osr_h1p_t *p)
{
  _Static_assert(sizeof(h1req_t) <= REQ_BLOCK, "h1req_t fits a pooled block");
  h1req_t *r = osr_block_get(OSR_BLOCK_4K);
  if (r == NULL)
    return NULL;
  memset(r, 0, offsetof(h1req_t, head_inline));

  osr_http_req_t *q = &r->pub;
  const char *method = llhttp_method_name((llhttp_method_t)p->method);
  q->version = p->version;
  q->method = osr_iov(method, strlen(method));
  q->target = p->target;
  split_target(q);
  if (p->host != NULL)
    q->authority = *p->host; /* the parser let at most one through */
  q->headers = p->headers;
  q->num_headers = p->num_headers;
  q->content_length = p->content_length;
  q->expect_body = p->chunked || p->content_length > 0;
  q->is_tls = osr_sock_is_tls(c->sock);
  q->scheme = q->is_tls ? osr_iov("https", 5) : osr_iov("http", 4);
  osr_sock_peer_format(&c->peer, q->peer, sizeof(q->peer));
  q->sock = c->sock;
  q->server = osr__http_server_of(c->opts);
  r->conn = c;
  r->is_head = p->method == HTTP_HEAD;
  r->resp_cl = -1;
  /* CONNECT and Upgrade requests are followed by non-HTTP bytes: unless the
   * handler upgrades, the connection ends with this exchange. */
  r->req_keep_alive = p->keep_alive && !p->upgrade;
  return r;
}

extern const osr_http_req_ops_t osr__http1_req_ops;

static int on_msg_head(osr_h1p_t *p)
{
  h1conn_t *c = p->data;

  /* The head is complete. A header timer is left to fire unarmed (its mode
   * says nothing is due) rather than stopped: see on_msg_begin. */
  if (c->timer_mode == TIMER_HEADER)
    c->timer_mode = TIMER_HEADER_DONE;
  h1req_t *r = new_req(c, p);
  if (r == NULL) {
    p->status = 503;
    p->err = OSR_ENOMEM;
    return -1;
  }
  r->pub._ops = &osr__http1_req_ops;
  const osr_iovec_t *expect = p->expect;
  if (expect != NULL && p->version == 11 && r->pub.expect_body && expect->len == 12 &&
      strncasecmp(expect->base, "100-continue", 12) == 0)
    r->expect_100 = 1;
  c->req = r;

  c->opts->handler.on_request(&r->pub, c->opts->data);

  if (!sock_usable(c))
    return -1; /* aborted from on_request: stop parsing, on_close cleans up */
  /* Expect: 100-continue: a handler that has not answered yet wants the
   * body (or will decide later), so let the client send it. One that
   * answered already (401, 413, ...) never gets it; see respond(). */
  if (r->expect_100 && !r->pub._responded) {
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    osr_iovec_t iov = OSR_IOV_LIT(cont);
    r->expect_100 = 0;
    if (osr_sock_write(c->sock, &iov, 1, NULL, NULL) != 0) {
      conn_close(c, OSR_ECONNRESET);
      return -1;
    }
  }
  return 0;
}

static int on_msg_body(osr_h1p_t *p, const char *at, size_t len)
{
  h1conn_t *c = p->data;
  h1req_t *r = c->req;
  if (r == NULL || r->pub.on_body == NULL)
    return 0; /* read and discarded */
  osr_iovec_t chunk = osr_iov(at, len);
  r->in_body_cb = 1;
  r->pub.on_body(&r->pub, &chunk, 0);
  r->in_body_cb = 0;
  if (!sock_usable(c))
    return -1;
  return r->held ? 1 : 0;
}

static int on_msg_complete(osr_h1p_t *p)
{
  h1conn_t *c = p->data;
  h1req_t *r = c->req;
  if (r == NULL)
    return 0;
  r->body_complete = 1;
  r->body_final = 1;
  if (r->pub.on_body != NULL)
    r->pub.on_body(&r->pub, &EMPTY_CHUNK, OSR_EOF);
  return 0;
}

static const osr_h1p_events_t parser_events = {
  .on_begin = on_msg_begin,
  .on_head = on_msg_head,
  .on_body = on_msg_body,
  .on_complete = on_msg_complete,
};

/* The parser (440 bytes with llhttp's state) exists only while a request is
 * being received or bytes wait to be parsed: an idle keep-alive connection
 * holds none. Messages are parsed one at a time and the parser stops at each
 * message boundary, where a fresh one is equivalent to the old one. */
/* Parsers of this thread, from a page-backed slab: one comes and goes per
 * request on a keep-alive connection, cheaper than malloc/free. */
_Static_assert(sizeof(osr_h1p_t) <= 1024, "a parser fits the slab");
static __thread osr_slab_t parser_slab = {.size = sizeof(osr_h1p_t), .max_spare = 32};

static osr_h1p_t *parser_get(h1conn_t *c)
{
  if (c->p == NULL) {
    c->p = osr_slab_xalloc(&parser_slab);
    osr__h1p_init(c->p, 1, &c->opts->limits, c->opts->limits.max_body, &parser_events, c);
  }
  return c->p;
}

static void parser_drop(h1conn_t *c)
{
  if (c->p == NULL)
    return;
  osr__h1p_dispose(c->p);
  osr_slab_free(&parser_slab, c->p);
  c->p = NULL;
}

/* ---- parking ----------------------------------------------------------------
 * A keep-alive connection that stays idle for PARK_MS gives its h1conn_t
 * back: the socket alone (owner data: the server) waits for the next
 * request, which allocates a fresh connection (and reads the peer address
 * again, one getpeername). An idle connection then costs its socket and
 * nothing else. The timer that notices is the connection's own, armed once
 * per idle spell at most: a timer still due within PARK_MS (the one armed
 * for an earlier spell, relabelled by on_msg_begin) is reused, and fires
 * early at worst (it re-arms for the rest). */

static void parked_on_read(osr_sock_t *s, int status);
static void parked_on_close(osr_sock_t *s)
{
  (void)s; /* nothing of ours is left */
}
static void parked_on_idle(osr_sock_t *s)
{
  osr_sock_close(s); /* keep-alive timeout, or the server drains */
}

static const osr_sock_events_t parked_events = {
  .on_read = parked_on_read,
  .on_close = parked_on_close,
  .on_timeout = parked_on_idle,
  .on_drain = parked_on_idle,
};

static h1conn_t *conn_new(osr_http_server_t *srv, osr_sock_t *s)
{
  h1conn_t *c = osr_slab_xalloc(&conn_slab);
  c->opts = osr__http_server_opts(srv);
  c->sock = s;
  (void)osr_sock_peer(s, &c->peer); /* family 0 ("unknown") on error */
  osr_timer_init(&c->timer, osr_loopctx_acquire(s->loop));
  osr_sock_set_events(s, &sock_events, c);
  return c;
}

static void parked_on_read(osr_sock_t *s, int status)
{
  /* The next request (or the end): a connection again, as it was. */
  conn_new(s->data, s);
  on_sock_read(s, status);
}

static int parkable(const h1conn_t *c)
{
  return sock_usable(c) && c->req == NULL && c->p == NULL && !c->sniff && !c->draining &&
         !c->lingering && !c->err_writing && !c->peer_eof && !c->resume_parser &&
         c->sock->input.len == 0;
}

/* Only from the connection's timer (a top-level callback). */
static void park(h1conn_t *c)
{
  osr_sock_t *s = c->sock;
  osr_timer_stop(&c->timer);
  osr_sock_set_events(s, &parked_events, osr__http_server_of(c->opts));
  c->sock = NULL;
  conn_free(c);
}

/* The exchange is over and nothing waits to be parsed. */
static void idle_start(h1conn_t *c)
{
  c->hdr_deadline = osr_loopctx_now(osr_timer_ctx(&c->timer));
  if (c->sniff)
    return;
  int m = c->timer_mode;
  if ((m == TIMER_HEADER_DONE || m == TIMER_PARK) && osr_timer_is_active(&c->timer) &&
      osr_timer_due_in(&c->timer) <= PARK_MS) {
    c->timer_mode = TIMER_PARK;
    return;
  }
  timer_set(c, TIMER_PARK, PARK_MS);
}

/* ---- input processing ------------------------------------------------------ */

static void handoff_h2(h1conn_t *c)
{
  osr_sock_t *s = c->sock;
  osr_http_server_t *srv = osr__http_server_of(c->opts);
  char pb[64];
  OSR_LOG_DEBUG(MOD, "%s: h2c prior knowledge", peer_text(c, pb));
  osr_timer_stop(&c->timer);
  osr_sock_set_idle_timeout(s, 0);
  osr_sock_set_events(s, NULL, NULL);
  conn_release(c);
  /* The preface stays in s->input for the HTTP/2 session to parse. */
  osr__http2_server_start(srv, s);
}

static void process_input(h1conn_t *c)
{
  while (sock_usable(c) && !c->lingering && !c->err_writing) {
    osr_sock_t *s = c->sock;
    h1req_t *r = c->req;

    if (r != NULL && (r->held || r->body_complete)) {
      /* Wait for the handler (held body) or for the response to finish
       * before parsing further: backpressure on pipelined input. */
      osr_sock_read_stop(s);
      return;
    }
    if (s->input.len == 0 && !c->resume_parser)
      return;
    c->resume_parser = 0;
    if (c->sniff && s->input.len != 0) {
      size_t n = s->input.len < H2_PREFACE_LEN ? s->input.len : H2_PREFACE_LEN;
      if (memcmp(osr_buf_data(&s->input), H2_PREFACE, n) != 0) {
        c->sniff = 0;
      } else if (n < H2_PREFACE_LEN) {
        return; /* a prefix of the preface: wait for more */
      } else {
        handoff_h2(c);
        return;
      }
    }

    size_t consumed = 0;
    int rc = osr__h1p_execute(parser_get(c), osr_buf_data(&s->input), s->input.len, &consumed);
    if (!sock_usable(c))
      return; /* the handler aborted from a callback */
    osr_buf_consume(&s->input, consumed);
    if (rc < 0) {
      conn_fail(c, c->p->status != 0 ? c->p->status : 400, rc);
      return;
    }
    if (rc == OSR_H1P_HELD) {
      osr_sock_read_stop(s);
      return;
    }
    if (rc == OSR_H1P_MESSAGE) {
      if (c->req != NULL && c->req->resp_done)
        exchange_done(c);
      continue;
    }
    /* OSR_H1P_DONE: everything consumed, wait for more. */
    if (c->peer_eof) {
      /* ... which will never come: a truncated request. */
      conn_close(c, c->req != NULL ? OSR_ECONNRESET : 0);
      return;
    }
  }
}

/* Both halves of the exchange may be over: finish it and go on with the
 * next request, or close. Called only from top-level callbacks. */
static void exchange_done(h1conn_t *c)
{
  h1req_t *r = c->req;
  if (r == NULL || !r->resp_done || !sock_usable(c))
    return;

  if (r->upgrading) {
    osr_sock_t *s = c->sock;
    osr_http_upgrade_cb cb = r->ucb;
    void *arg = r->uarg;
    c->req = NULL;
    osr_sock_read_stop(s);
    osr_timer_stop(&c->timer);
    osr_sock_set_idle_timeout(s, 0);
    osr_sock_set_events(s, NULL, NULL);
    conn_release(c);
    osr__http_req_done(&r->pub, 0);
    free_req(r);
    /* Bytes the client sent after the request are still in s->input. */
    cb(s, 0, arg);
    return;
  }

  /* A client that half-closed after pipelining still gets answers to what
   * it sent; the connection ends when nothing is left to parse. */
  int keep = r->keep_alive && !c->draining;
  if (c->peer_eof && c->sock->input.len == 0)
    keep = 0;
  if (!r->body_complete) {
    /* The response is out but the request body is not all in. A handler
     * that still reads it gets it; otherwise (discarded body, or a client
     * still waiting for 100 Continue) do not wait for a body that may never
     * come: end the exchange and close. */
    if (r->pub.on_body != NULL && !r->expect_100)
      return;
    keep = 0;
  }
  c->req = NULL;
  body_final(r, OSR_ECANCELED);
  osr__http_req_done(&r->pub, 0);
  free_req(r);
  if (!sock_usable(c))
    return;
  if (!keep) {
    linger_close(c);
    return;
  }
  /* Next request: buffered pipelined bytes are delivered on the next loop
   * turn (never re-entrantly from here). */
  if (c->sock->input.len == 0) {
    parser_drop(c); /* idle until the next request */
    idle_start(c);
  } else {
    osr__h1p_trim(c->p);
  }
  osr_sock_set_idle_timeout(c->sock, c->opts->limits.idle_timeout_ms);
  osr_sock_read_start(c->sock);
}

/* ---- request ops ------------------------------------------------------------- */

static int name_is(osr_iovec_t n, const char *s)
{
  return osr_ascii_ieq_lower(n.base, n.len, s, strlen(s)); /* s: lower case */
}

static void head_put(h1req_t *r, const char *p, size_t n)
{
  memcpy(r->head + r->head_len, p, n);
  r->head_len += n;
}

#define HEAD_PUT_LIT(r, lit) head_put((r), (lit), sizeof(lit) - 1)

/* Bytes format_head() and h1_respond() may add beyond the caller's headers:
 * status line digits, date, and one framing line plus "connection" and the
 * blank line ("content-length: " + 20 digits + CRLF is the longest). */
#define HEAD_SLACK 160

/* Format the status line and headers into r->head, sized once, with plain
 * copies (no printf: this runs once per response). */
static int format_head(h1req_t *r, int status, const osr_http_header_t *h, size_t n,
                       int framing)
{
  h1conn_t *c = r->conn;
  const char *reason = osr_http_reason(status);
  const char *date = http_date();
  size_t server_len = c->opts->server_name != NULL ? strlen(c->opts->server_name) : 0;
  size_t reason_len = strlen(reason), date_len = strlen(date);
  size_t need = HEAD_SLACK + reason_len + date_len + server_len;
  for (size_t i = 0; i < n; i++) {
    if (h[i].name.len == 0 || osr_has_crlf_nul(h[i].name.base, h[i].name.len) ||
        osr_has_crlf_nul(h[i].value.base, h[i].value.len))
      return OSR_EINVAL; /* no response splitting */
    need += h[i].name.len + h[i].value.len + 4;
  }
  if (status < 100 || status > 999)
    return OSR_EINVAL;
  head_free(r);
  r->head = need <= sizeof(r->head_inline) ? r->head_inline : osr_try_malloc(need);
  if (r->head == NULL)
    return OSR_ENOMEM;

  char code[3] = {(char)('0' + status / 100), (char)('0' + status / 10 % 10),
                  (char)('0' + status % 10)};
  HEAD_PUT_LIT(r, "HTTP/1.1 ");
  head_put(r, code, 3);
  head_put(r, " ", 1);
  head_put(r, reason, reason_len);
  HEAD_PUT_LIT(r, "\r\n");
  for (size_t i = 0; i < n; i++) {
    /* Framing headers are ours to write (see http.h). */
    if (framing && (name_is(h[i].name, "content-length") ||
                    name_is(h[i].name, "transfer-encoding") || name_is(h[i].name, "connection")))
      continue;
    head_put(r, h[i].name.base, h[i].name.len);
    HEAD_PUT_LIT(r, ": ");
    head_put(r, h[i].value.base, h[i].value.len);
    HEAD_PUT_LIT(r, "\r\n");
  }
  HEAD_PUT_LIT(r, "date: ");
  head_put(r, date, date_len);
  HEAD_PUT_LIT(r, "\r\n");
  if (server_len != 0) {
    HEAD_PUT_LIT(r, "server: ");
    head_put(r, c->opts->server_name, server_len);
    HEAD_PUT_LIT(r, "\r\n");
  }
  return 0;
}

static int h1_respond(osr_http_req_t *req, int status, const osr_http_header_t *h, size_t n,
                      int64_t content_length)
{
  h1req_t *r = (h1req_t *)req;
  h1conn_t *c = r->conn;

  if (!sock_usable(c) || r->upgrading || c->req != r)
    return OSR_ECLOSED;
  if (status < 200)
    return OSR_EINVAL; /* 100 is ours, 101 goes through osr_http_upgrade */

  r->no_body = r->is_head || status == 204 || status == 304;
  r->keep_alive = r->req_keep_alive && !c->draining;
  if (r->expect_100 && !r->body_complete) {
    /* Answered before the client was told to send its body: it may never
     * send it, so the connection cannot carry another request. */
    r->keep_alive = 0;
  }
  if (status == 204)
    content_length = r->is_head ? -1 : 0;
  r->chunked = 0;
  if (content_length < 0 && !r->no_body) {
    if (req->version >= 11)
      r->chunked = 1;
    else
      r->keep_alive = 0; /* HTTP/1.0: the body ends with the connection */
  }

  int rv = format_head(r, status, h, n, 1);
  if (rv != 0)
    return rv;
  if (status != 204 && status != 304 && content_length >= 0) {
    char digits[20];
    char *d = osr_fmt_u64(digits, (uint64_t)content_length);
    HEAD_PUT_LIT(r, "content-length: ");
    head_put(r, d, (size_t)(digits + sizeof(digits) - d));
    HEAD_PUT_LIT(r, "\r\n");
  } else if (r->chunked) {
    HEAD_PUT_LIT(r, "transfer-encoding: chunked\r\n");
  }
  if (!r->keep_alive)
    HEAD_PUT_LIT(r, "connection: close\r\n");
  else if (req->version == 10)
    HEAD_PUT_LIT(r, "connection: keep-alive\r\n");
  HEAD_PUT_LIT(r, "\r\n");
  r->resp_cl = r->no_body ? 0 : content_length;
  r->head_pending = 1;
  return 0;
}

static void on_resp_written(osr_sock_t *s, int status, void *arg)
{
  h1req_t *r = arg;
  h1conn_t *c = r->conn;
  (void)s;

  r->write_inflight = 0;
  osr_freep(&r->iov_heap);
  head_free(r); /* only the first write carries it */
  if (status == 0 && r->end_queued)
    r->resp_done = 1;
  osr_http_write_cb cb = r->wcb;
  r->wcb = NULL;
  if (cb != NULL)
    cb(&r->pub, status, r->warg);
  if (status != 0) {
    conn_close(c, status);
    return;
  }
  if (c->req == r && r->resp_done)
    exchange_done(c);
}

static int h1_write(osr_http_req_t *req, const osr_iovec_t *bufs, size_t nbufs, int end,
                    osr_http_write_cb cb, void *arg)
{
  h1req_t *r = (h1req_t *)req;
  h1conn_t *c = r->conn;

  if (!sock_usable(c) || c->req != r)
    return OSR_ECLOSED;
  if (r->write_inflight)
    return OSR_EBUSY;
  if (r->end_queued || r->upgrading)
    return OSR_EINVAL;

  uint64_t total = 0;
  for (size_t i = 0; i < nbufs; i++)
    total += bufs[i].len;
  if (r->no_body) {
    total = 0;
    nbufs = 0;
  } else if (r->resp_cl >= 0) {
    if (r->resp_written + total > (uint64_t)r->resp_cl)
      return OSR_EINVAL;
    if (end && r->resp_written + total < (uint64_t)r->resp_cl) {
      /* Ended short of its Content-Length: the client would wait for the
       * rest, so the connection must end with the response. */
      r->keep_alive = 0;
    }
  }

  size_t need = nbufs + 4;
  osr_iovec_t *iov = r->iov_inline;
  if (need > INLINE_IOVS) {
    r->iov_heap = osr_try_malloc(need * sizeof(*iov));
    if (r->iov_heap == NULL)
      return OSR_ENOMEM;
    iov = r->iov_heap;
  }
  size_t k = 0;
  if (r->head_pending)
    iov[k++] = osr_iov(r->head, r->head_len);
  if (r->chunked && total > 0) {
    /* The chunk-size line, hex digits right-aligned in chunk_line. */
    char *lim = r->chunk_line + sizeof(r->chunk_line);
    char *d = lim - 2;
    memcpy(d, "\r\n", 2);
    uint64_t v = total;
    do {
      *--d = "0123456789abcdef"[v & 15];
      v >>= 4;
    } while (v != 0);
    iov[k++] = osr_iov(d, (size_t)(lim - d));
  }
  for (size_t i = 0; i < nbufs; i++) {
    if (bufs[i].len != 0)
      iov[k++] = bufs[i];
  }
  if (r->chunked) {
    if (total > 0 && end)
      iov[k++] = OSR_IOV_LIT("\r\n0\r\n\r\n");
    else if (total > 0)
      iov[k++] = OSR_IOV_LIT("\r\n");
    else if (end)
      iov[k++] = OSR_IOV_LIT("0\r\n\r\n");
  }

  r->wcb = cb;
  r->warg = arg;
  r->write_inflight = 1;
  if (k == 0) {
    /* Nothing to send (e.g. the end of a HEAD response whose head already
     * went out): complete on the next loop turn, never from inside the
     * caller. */
    r->deferred_empty = 1;
    r->end_queued = end;
    timer_set(c, TIMER_DEFER, 0);
    return 0;
  }
  int rv = osr_sock_write(c->sock, iov, k, on_resp_written, r);
  if (rv != 0) {
    r->write_inflight = 0;
    r->wcb = NULL;
    osr_freep(&r->iov_heap);
    return rv;
  }
  r->head_pending = 0;
  r->end_queued = end;
  r->resp_written += total;
  return 0;
}

/* Response body pass-through (http.h osr_http_raw_body): the caller writes
 * `len` body bytes to the socket itself (splice(2)); they count as written. */
static osr_sock_t *h1_raw_body(osr_http_req_t *req, uint64_t len)
{
  h1req_t *r = (h1req_t *)req;
  h1conn_t *c = r->conn;
  if (!sock_usable(c) || c->req != r || r->write_inflight || r->head_pending || r->end_queued ||
      r->upgrading || r->chunked || r->no_body || r->resp_cl < 0 ||
      r->resp_written + len > (uint64_t)r->resp_cl || osr_sock_is_tls(c->sock) ||
      osr_sock_write_queue_size(c->sock) != 0)
    return NULL;
  r->resp_written += len;
  return c->sock;
}

static void h1_hold(osr_http_req_t *req)
{
  h1req_t *r = (h1req_t *)req;
  if (r->body_complete || r->held)
    return;
  r->held = 1;
  if (sock_usable(r->conn))
    osr_sock_read_stop(r->conn->sock);
}

static void h1_release(osr_http_req_t *req)
{
  h1req_t *r = (h1req_t *)req;
  h1conn_t *c = r->conn;
  if (!r->held)
    return;
  r->held = 0;
  if (!sock_usable(c) || c->req != r)
    return; /* being finished */
  if (r->in_body_cb) {
    /* Released before the parser even paused: it carries on after the
     * callback, but h1_hold stopped the socket, so start it again. */
    osr_sock_read_start(c->sock);
    return;
  }
  /* The held chunk was left at the front of sock->input. */
  osr_buf_consume(&c->sock->input, c->p->held_len);
  c->p->held_len = 0;
  /* The rest is delivered from the next loop turn, not from inside the
   * caller (who may be in a write callback of its own). The parser is
   * resumed even if no byte is left: a body that ended with the held chunk
   * still owes its end (message complete). */
  c->resume_parser = 1;
  osr_sock_read_start(c->sock);
  osr_sock_kick(c->sock);
}

static void h1_abort(osr_http_req_t *req)
{
  h1req_t *r = (h1req_t *)req;
  /* A request that is no longer current is already being finished (its
   * on_body/on_done are running): nothing left to abort. */
  if (r->conn->req != r)
    return;
  conn_close(r->conn, OSR_ECANCELED);
}

static int h1_upgrade(osr_http_req_t *req, const osr_http_header_t *h, size_t n,
                      osr_http_upgrade_cb cb, void *arg)
{
  h1req_t *r = (h1req_t *)req;
  h1conn_t *c = r->conn;

  if (!sock_usable(c) || c->req != r)
    return OSR_ECLOSED;
  if (req->expect_body || cb == NULL)
    return OSR_EINVAL;
  int rv = format_head(r, 101, h, n, 0);
  if (rv != 0)
    return rv;
  HEAD_PUT_LIT(r, "\r\n");
  osr_iovec_t iov = osr_iov(r->head, r->head_len);
  r->wcb = NULL;
  r->write_inflight = 1;
  r->end_queued = 1;
  rv = osr_sock_write(c->sock, &iov, 1, on_resp_written, r);
  if (rv != 0) {
    r->write_inflight = 0;
    r->end_queued = 0;
    head_free(r);
    return rv;
  }
  r->upgrading = 1;
  r->ucb = cb;
  r->uarg = arg;
  return 0;
}

const osr_http_req_ops_t osr__http1_req_ops = {
  .respond = h1_respond,
  .write = h1_write,
  .hold = h1_hold,
  .release = h1_release,
  .abort = h1_abort,
  .upgrade = h1_upgrade,
  .raw_body = h1_raw_body,
};

/* ---- entry point ------------------------------------------------------------- */

size_t osr__http1_conn_size(void)
{
  return sizeof(h1conn_t);
}

void osr__http1_server_start(osr_http_server_t *srv, osr_sock_t *s)
{
  h1conn_t *c = conn_new(srv, s);
  c->sniff = !osr_sock_is_tls(s);
  osr_sock_set_nodelay(s, 1);
  osr_sock_set_idle_timeout(s, c->opts->limits.idle_timeout_ms);
  if (osr_sock_read_start(s) != 0)
    conn_close(c, 0);
}
