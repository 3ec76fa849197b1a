/*
 * HTTP/1.1 client connection behind the client API of http.h.
 *
 * One request is on the wire at a time: requests queue in order and the
 * next one is sent only when the previous exchange is over (response
 * complete and request body fully written) and the server allowed
 * keep-alive. We do not pipeline: a server that closes or fails midway
 * would leave it unclear which queued requests were processed.
 *
 * The request line and headers are formatted when the request is made and
 * go out in one scatter-gather write together with the first body bytes
 * (or alone when there is no body). The response is parsed by the bounded
 * parser of http1_parse.c in response mode with the caps from base->limits.
 * Response body chunks point into sock->input; holding one stops reading
 * and leaves it there until release (as on the server side).
 *
 * Lifetime. The client owns its socket and a uv_timer (for completing empty
 * writes on the next loop turn). Every request gets exactly one final
 * on_body (OSR_EOF or an error), after which it is freed; the client itself
 * is freed only after osr_http_client_close() and after the socket closed,
 * in the timer's close callback (STYLE 20). Requests fail when the
 * connection dies; later osr_http_client_request() calls return OSR_ECLOSED.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "net/http.h"
#include "net/http1_parse.h"
#include "util/blockpool.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/slab.h"
#include "util/text.h"

#define MOD "http1c"
#define INLINE_IOVS 16

typedef struct h1client_s h1client_t;
typedef struct h1creq_s h1creq_t;

struct h1creq_s {
  osr_http_creq_t super; /* first: the API hands out &super */
  h1creq_t *next;
  osr_buf_t head;
  int head_sent;
  int64_t content_length; /* -1 chunked */
  uint64_t written;
  int body_ended;         /* the last body byte (or the head alone) is written */
  int end_queued;
  int write_inflight;
  int deferred_empty;
  osr_http_creq_write_cb wcb;
  void *warg;
  /* a write made before the request reached the wire */
  int has_pending;
  osr_iovec_t *pbufs;
  size_t pn;
  int pend;
  char chunk_line[24];
  osr_iovec_t iov_inline[INLINE_IOVS];
  osr_iovec_t *iov_heap;
  int is_head;
  int active;             /* on the wire */
  int got_response;
  int resp_complete;
  int held;
  int in_body_cb;
  int cancelled;
};

struct h1client_s {
  osr_http_client_t super; /* first: the API hands out &super */
  osr_sock_t *sock;        /* NULL once closed */
  osr_h1p_t p;
  uv_timer_t timer;
  h1creq_t *q_head, *q_tail; /* q_head is the one on the wire (if active) */
  int dead;                /* no further requests: closed or not reusable */
  int dead_status;
  int closing;             /* osr_http_client_close() was called */
  int reuse;               /* the last response allowed keep-alive */
  int processing;          /* in process_input (no recursion) */
  int resume_parser;       /* a held chunk was released: run the parser even without new bytes */
  int timer_closing;
};

static const osr_iovec_t EMPTY_CHUNK = {NULL, 0};

static void process_input(h1client_t *c);
static void activate_next(h1client_t *c);
static int send_now(h1creq_t *r, const osr_iovec_t *bufs, size_t nbufs, int end,
                    osr_http_creq_write_cb cb, void *arg);

/* ---- helpers --------------------------------------------------------------- */

static int sock_usable(const h1client_t *c)
{
  return c->sock != NULL && !osr_sock_is_closing(c->sock);
}

static void kill_conn(h1client_t *c, int status)
{
  c->dead = 1;
  if (c->dead_status == 0)
    c->dead_status = status;
  if (c->sock != NULL)
    osr_sock_close(c->sock);
}

static void dequeue(h1client_t *c, h1creq_t *r)
{
  h1creq_t **pp = &c->q_head;
  h1creq_t *prev = NULL;
  while (*pp != NULL && *pp != r) {
    prev = *pp;
    pp = &(*pp)->next;
  }
  if (*pp == NULL)
    return;
  *pp = r->next;
  if (c->q_tail == r)
    c->q_tail = prev;
  r->next = NULL;
}

/* A request lives for one exchange (the data plane makes one per proxied
 * request): requests come from a per-thread slab and their heads from the
 * block pool, so an exchange costs no malloc/free pair of its own. */
static __thread osr_slab_t creq_slab = {.size = sizeof(h1creq_t), .max_spare = 32};
/* (eight requests a page: 32 spare pages, 128 KiB at most, absorb a swing
 * of 256 requests in flight without an mmap/munmap per request, as the
 * proxy's stream slab and the block pool's 4 KiB cache) */

/* Give the written (or unsent) head back: a pooled block when it was one
 * (a heap buffer of exactly a block's size may go to the pool as well:
 * the pool's blocks come from the same allocator). */
static void head_release(h1creq_t *r)
{
  if (r->head.base != NULL && r->head.cap == osr_block_size(OSR_BLOCK_4K)) {
    osr_block_put(OSR_BLOCK_4K, r->head.base);
    r->head.base = NULL;
  }
  osr_buf_dispose(&r->head);
}

static void free_creq(h1creq_t *r)
{
  head_release(r);
  osr_freep(&r->iov_heap);
  osr_freep(&r->pbufs);
  osr_slab_free(&creq_slab, r);
}

/* Deliver the final on_body and free. The request is already dequeued. */
static void finish_creq(h1creq_t *r, int status)
{
  if (r->has_pending) {
    r->has_pending = 0;
    if (r->wcb != NULL)
      r->wcb(&r->super, OSR_ECANCELED, r->warg);
  }
  r->super.ev->on_body(&r->super, &EMPTY_CHUNK, status, r->super.data);
  free_creq(r);
}

/* ---- timer (deferred empty writes) and freeing ------------------------------ */

static void on_timer_closed(uv_handle_t *h)
{
  h1client_t *c = h->data;
  osr__h1p_dispose(&c->p);
  osr_free(c->super.authority);
  osr_free(c);
}

static void close_timer(h1client_t *c)
{
  if (c->timer_closing)
    return;
  c->timer_closing = 1;
  uv_close((uv_handle_t *)&c->timer, on_timer_closed);
}

static void on_req_written(osr_sock_t *s, int status, void *arg);

static void on_timer(uv_timer_t *t)
{
  h1client_t *c = t->data;
  h1creq_t *r = c->q_head;
  if (r != NULL && r->deferred_empty) {
    r->deferred_empty = 0;
    on_req_written(c->sock, 0, r);
  }
}

/* ---- socket events ----------------------------------------------------------- */

static void on_sock_read(osr_sock_t *s, int status);
static void on_sock_close(osr_sock_t *s);
static void on_sock_timeout(osr_sock_t *s);

static const osr_sock_events_t sock_events = {
  .on_read = on_sock_read,
  .on_close = on_sock_close,
  .on_timeout = on_sock_timeout,
  .on_drain = NULL,
};

static void on_sock_close(osr_sock_t *s)
{
  h1client_t *c = s->data;
  c->sock = NULL;
  c->dead = 1;
  uv_timer_stop(&c->timer);
  /* Every outstanding request ends here, in order. Requests that never
   * reached the wire get OSR_ECLOSED so the caller knows it may retry. */
  int base = c->closing ? OSR_ECANCELED : c->dead_status != 0 ? c->dead_status : OSR_ECONNRESET;
  h1creq_t *r;
  while ((r = c->q_head) != NULL) {
    dequeue(c, r);
    int st = r->cancelled ? OSR_ECANCELED : (r->active || c->closing) ? base : OSR_ECLOSED;
    finish_creq(r, st);
  }
  if (c->closing)
    close_timer(c);
}

static void on_sock_timeout(osr_sock_t *s)
{
  h1client_t *c = s->data;
  /* No byte moved for idle_timeout_ms: fail what is outstanding; an idle
   * keep-alive connection just ends. */
  kill_conn(c, OSR_ETIMEDOUT);
}

static void on_sock_read(osr_sock_t *s, int status)
{
  h1client_t *c = s->data;
  if (status < 0) {
    h1creq_t *r = c->q_head;
    if (r != NULL && r->active && status == OSR_EOF && s->input.len == 0 &&
        osr__h1p_in_body(&c->p)) {
      /* A body delimited by the end of the connection. */
      if (osr__h1p_finish(&c->p) == 0 && r->resp_complete) {
        c->reuse = 0;
        process_input(c);
        kill_conn(c, OSR_ECONNRESET);
        return;
      }
    }
    kill_conn(c, status == OSR_EOF ? OSR_ECONNRESET : status);
    return;
  }
  process_input(c);
}

/* ---- parser events ------------------------------------------------------------- */

static int on_msg_begin(osr_h1p_t *p)
{
  h1client_t *c = p->data;
  h1creq_t *r = c->q_head;
  if (r == NULL || !r->active || r->resp_complete) {
    p->status = 400;
    p->err = OSR_EHTTP; /* a response nobody asked for */
    return -1;
  }
  return 0;
}

static int on_msg_head(osr_h1p_t *p)
{
  h1client_t *c = p->data;
  h1creq_t *r = c->q_head;
  if (p->status_code < 200 && p->status_code != 101)
    return 1; /* 100 Continue, 103 Early Hints: skipped */
  r->got_response = 1;
  r->super.ev->on_response(&r->super, p->status_code, p->headers, p->num_headers, r->super.data);
  if (!sock_usable(c) || c->q_head != r)
    return -1;
  return r->is_head || p->status_code == 101 ? 1 : 0;
}

static int on_msg_body(osr_h1p_t *p, const char *at, size_t len)
{
  h1client_t *c = p->data;
  h1creq_t *r = c->q_head;
  osr_iovec_t chunk = osr_iov(at, len);
  r->in_body_cb = 1;
  r->super.ev->on_body(&r->super, &chunk, 0, r->super.data);
  r->in_body_cb = 0;
  if (!sock_usable(c) || c->q_head != r)
    return -1;
  return r->held ? 1 : 0;
}

static int on_msg_complete(osr_h1p_t *p)
{
  h1client_t *c = p->data;
  h1creq_t *r = c->q_head;
  if (p->status_code < 200 && p->status_code != 101)
    return 0;
  r->resp_complete = 1;
  c->reuse = p->keep_alive && p->status_code != 101;
  return 0;
}

static const osr_h1p_events_t parser_events = {
  .on_begin = on_msg_begin,
  .on_head = on_msg_head,
  .on_body = on_msg_body,
  .on_complete = on_msg_complete,
};

/* The exchange at the head of the queue may be over. */
static void maybe_finish(h1client_t *c)
{
  h1creq_t *r = c->q_head;
  if (r == NULL || !r->active || !r->resp_complete || r->write_inflight || r->deferred_empty)
    return;
  dequeue(c, r);
  if (!r->body_ended || !c->reuse)
    c->dead = 1; /* the request or response framing ended the connection */
  if (c->dead)
    osr_sock_read_stop(c->sock);
  finish_creq(r, OSR_EOF);
  if (!sock_usable(c))
    return;
  if (c->dead) {
    kill_conn(c, OSR_ECLOSED);
    return;
  }
  osr__h1p_trim(&c->p); /* between responses: an idle connection holds no head */
  activate_next(c);
}

static void process_input(h1client_t *c)
{
  if (c->processing)
    return;
  c->processing = 1;
  while (sock_usable(c)) {
    osr_sock_t *s = c->sock;
    h1creq_t *r = c->q_head;
    if (r != NULL && r->held) {
      osr_sock_read_stop(s);
      break;
    }
    if (r != NULL && r->resp_complete) {
      maybe_finish(c); /* waits for our own body write, if any */
      if (c->q_head == r)
        break;
      continue;
    }
    if (s->input.len == 0 && !c->resume_parser)
      break;
    c->resume_parser = 0;
    size_t consumed = 0;
    int rc = osr__h1p_execute(&c->p, osr_buf_data(&s->input), s->input.len, &consumed);
    if (!sock_usable(c))
      break;
    osr_buf_consume(&s->input, consumed);
    if (rc < 0) {
      OSR_LOG_DEBUG(MOD, "bad response: %s", osr_strerror(rc));
      kill_conn(c, rc);
      break;
    }
    if (rc == OSR_H1P_HELD) {
      osr_sock_read_stop(s);
      break;
    }
  }
  c->processing = 0;
}

/* ---- writing -------------------------------------------------------------------- */

static void on_req_written(osr_sock_t *s, int status, void *arg)
{
  h1creq_t *r = arg;
  h1client_t *c = (h1client_t *)r->super.client;
  (void)s;

  r->write_inflight = 0;
  osr_freep(&r->iov_heap);
  if (r->head.base != NULL && r->head_sent)
    head_release(r);
  if (status == 0 && r->end_queued)
    r->body_ended = 1;
  osr_http_creq_write_cb cb = r->wcb;
  r->wcb = NULL;
  if (cb != NULL)
    cb(&r->super, status, r->warg);
  if (status != 0) {
    kill_conn(c, status);
    return;
  }
  if (c->q_head == r && r->resp_complete && sock_usable(c))
    process_input(c);
}

static int send_now(h1creq_t *r, const osr_iovec_t *bufs, size_t nbufs, int end,
                    osr_http_creq_write_cb cb, void *arg)
{
  h1client_t *c = (h1client_t *)r->super.client;
  uint64_t total = 0;
  for (size_t i = 0; i < nbufs; i++)
    total += bufs[i].len;
  int chunked = r->content_length < 0;

  size_t need = nbufs + 4;
  osr_iovec_t *iov = r->iov_inline;
  if (need > INLINE_IOVS) {
    r->iov_heap = osr_try_malloc(need * sizeof(*iov));
    if (r->iov_heap == NULL)
      return OSR_ENOMEM;
    iov = r->iov_heap;
  }
  size_t k = 0;
  if (!r->head_sent)
    iov[k++] = osr_iov(osr_buf_data(&r->head), r->head.len);
  if (chunked && total > 0) {
    int n = snprintf(r->chunk_line, sizeof(r->chunk_line), "%llx\r\n", (unsigned long long)total);
    iov[k++] = osr_iov(r->chunk_line, (size_t)n);
  }
  for (size_t i = 0; i < nbufs; i++) {
    if (bufs[i].len != 0)
      iov[k++] = bufs[i];
  }
  if (chunked) {
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
  /* A Content-Length body is over with its last byte, end flag or not. */
  r->end_queued = end || (r->content_length >= 0 &&
                          r->written + total == (uint64_t)r->content_length);
  if (k == 0) {
    r->deferred_empty = 1;
    uv_timer_start(&c->timer, on_timer, 0, 0);
    return 0;
  }
  int rv = osr_sock_write(c->sock, iov, k, on_req_written, r);
  if (rv != 0) {
    r->write_inflight = 0;
    r->end_queued = 0;
    r->wcb = NULL;
    osr_freep(&r->iov_heap);
    return rv;
  }
  r->head_sent = 1;
  r->written += total;
  return 0;
}

/* The head of the queue goes on the wire. */
static void activate_next(h1client_t *c)
{
  h1creq_t *r = c->q_head;
  if (r == NULL || r->active || c->dead || !sock_usable(c))
    return;
  r->active = 1;
  c->reuse = 0;
  int rv = 0;
  if (r->has_pending) {
    r->has_pending = 0;
    rv = send_now(r, r->pbufs, r->pn, r->pend, r->wcb, r->warg);
    osr_freep(&r->pbufs);
  } else if (r->content_length == 0) {
    rv = send_now(r, NULL, 0, 1, NULL, NULL);
  }
  /* else: the head waits for the first body write */
  if (rv != 0)
    kill_conn(c, rv);
  osr_sock_read_start(c->sock);
}

/* ---- client ops -------------------------------------------------------------------- */

static char *put_str(char *w, const char *s, size_t n)
{
  memcpy(w, s, n);
  return w + n;
}

#define PUT_LIT(w, lit) put_str((w), (lit), sizeof(lit) - 1)

static int hname_is(osr_iovec_t n, const char *s)
{
  return osr_ascii_ieq_lower(n.base, n.len, s, strlen(s)); /* s: lower case */
}

static int c_request(osr_http_client_t *base, const osr_http_client_req_t *req,
                     const osr_http_client_events_t *ev, void *data, osr_http_creq_t **out)
{
  h1client_t *c = (h1client_t *)base;
  if (c->dead || c->closing || !sock_usable(c))
    return OSR_ECLOSED;
  if (req->method == NULL || req->target == NULL || ev == NULL || ev->on_body == NULL ||
      ev->on_response == NULL)
    return OSR_EINVAL;
  const char *auth = req->authority != NULL ? req->authority : base->authority;
  size_t mlen = strlen(req->method), tlen = strlen(req->target), alen = strlen(auth);
  size_t need = mlen + tlen + alen + 128;
  if (osr_has_crlf_nul(req->method, mlen) || osr_has_crlf_nul(req->target, tlen) ||
      osr_has_crlf_nul(auth, alen) ||
      memchr(req->method, ' ', mlen) != NULL || memchr(req->target, ' ', tlen) != NULL)
    return OSR_EINVAL;
  for (size_t i = 0; i < req->nheaders; i++) {
    const osr_http_header_t *h = &req->headers[i];
    if (h->name.len == 0 || osr_has_crlf_nul(h->name.base, h->name.len) ||
        osr_has_crlf_nul(h->value.base, h->value.len))
      return OSR_EINVAL;
    need += h->name.len + h->value.len + 4;
  }

  h1creq_t *r = osr_slab_xalloc(&creq_slab);
  r->super.client = base;
  r->super.ev = ev;
  r->super.data = data;
  r->content_length = req->content_length;
  r->is_head = strcasecmp(req->method, "HEAD") == 0;
  /* The head is written in place: `need` bounds it (the fixed text, the
   * framing line and the blank line fit in its 128 spare bytes). */
  size_t blk = osr_block_size(OSR_BLOCK_4K);
  osr_buf_init(&r->head, need <= blk ? blk : need); /* cap <= max, as osr_buf wants */
  if (need <= blk) {
    r->head.base = osr_block_get(OSR_BLOCK_4K); /* NULL: osr_buf_reserve mallocs */
    if (r->head.base != NULL)
      r->head.cap = blk;
  }
  osr_iovec_t t;
  int rv = osr_buf_reserve(&r->head, need, &t);
  if (rv != 0) {
    free_creq(r);
    return rv;
  }
  char *w = t.base;
  w = put_str(w, req->method, mlen);
  *w++ = ' ';
  w = put_str(w, req->target, tlen);
  w = PUT_LIT(w, " HTTP/1.1\r\nhost: ");
  w = put_str(w, auth, alen);
  w = PUT_LIT(w, "\r\n");
  for (size_t i = 0; i < req->nheaders; i++) {
    const osr_http_header_t *h = &req->headers[i];
    /* Host and the framing headers are ours. */
    if (hname_is(h->name, "host") || hname_is(h->name, "content-length") ||
        hname_is(h->name, "transfer-encoding") || hname_is(h->name, "connection"))
      continue;
    w = put_str(w, h->name.base, h->name.len);
    w = PUT_LIT(w, ": ");
    w = put_str(w, h->value.base, h->value.len);
    w = PUT_LIT(w, "\r\n");
  }
  int bodyful_method = !(strcasecmp(req->method, "GET") == 0 || r->is_head ||
                         strcasecmp(req->method, "DELETE") == 0 ||
                         strcasecmp(req->method, "OPTIONS") == 0);
  if (req->content_length < 0) {
    w = PUT_LIT(w, "transfer-encoding: chunked\r\n");
  } else if (req->content_length > 0 || bodyful_method) {
    char digits[20];
    char *d = osr_fmt_u64(digits, (uint64_t)req->content_length);
    w = PUT_LIT(w, "content-length: ");
    w = put_str(w, d, (size_t)(digits + sizeof(digits) - d));
    w = PUT_LIT(w, "\r\n");
  }
  w = PUT_LIT(w, "\r\n");
  osr_buf_commit(&r->head, (size_t)(w - t.base));

  if (c->q_tail != NULL)
    c->q_tail->next = r;
  else
    c->q_head = r;
  c->q_tail = r;
  if (out != NULL)
    *out = &r->super;
  if (c->q_head == r)
    activate_next(c);
  return 0;
}

static int c_write(osr_http_creq_t *cr, const osr_iovec_t *bufs, size_t nbufs, int end,
                   osr_http_creq_write_cb cb, void *arg)
{
  h1creq_t *r = (h1creq_t *)cr;
  h1client_t *c = (h1client_t *)cr->client;
  if (!sock_usable(c) || r->cancelled)
    return OSR_ECLOSED;
  if (r->write_inflight || r->has_pending)
    return OSR_EBUSY;
  if (r->end_queued || r->body_ended || r->content_length == 0)
    return OSR_EINVAL;
  uint64_t total = 0;
  for (size_t i = 0; i < nbufs; i++)
    total += bufs[i].len;
  if (r->content_length > 0) {
    uint64_t cl = (uint64_t)r->content_length;
    if (r->written + total > cl || (end && r->written + total != cl))
      return OSR_EINVAL;
  }
  if (!r->active) {
    /* Not on the wire yet: keep the (caller-owned) buffers' descriptors. */
    r->pbufs = osr_try_malloc((nbufs ? nbufs : 1) * sizeof(*bufs));
    if (r->pbufs == NULL)
      return OSR_ENOMEM;
    if (nbufs != 0)
      memcpy(r->pbufs, bufs, nbufs * sizeof(*bufs));
    r->pn = nbufs;
    r->pend = end;
    r->wcb = cb;
    r->warg = arg;
    r->has_pending = 1;
    return 0;
  }
  return send_now(r, bufs, nbufs, end, cb, arg);
}

static void c_hold(osr_http_creq_t *cr)
{
  h1creq_t *r = (h1creq_t *)cr;
  h1client_t *c = (h1client_t *)cr->client;
  if (r->held || r->resp_complete || !r->active)
    return;
  r->held = 1;
  if (sock_usable(c))
    osr_sock_read_stop(c->sock);
}

static void c_release(osr_http_creq_t *cr)
{
  h1creq_t *r = (h1creq_t *)cr;
  h1client_t *c = (h1client_t *)cr->client;
  if (!r->held)
    return;
  r->held = 0;
  if (r->in_body_cb || !sock_usable(c))
    return;
  osr_buf_consume(&c->sock->input, c->p.held_len);
  c->p.held_len = 0;
  /* The rest comes on the next loop turn. The parser is resumed even if no
   * byte is left: a body that ended with the held chunk still owes its end
   * (message complete), as on the server side (http1.c h1_release). */
  c->resume_parser = 1;
  osr_sock_read_start(c->sock);
  osr_sock_kick(c->sock);
}

/* ---- response body pass-through ------------------------------------------------ */

static uint64_t c_raw_avail(osr_http_creq_t *cr)
{
  h1creq_t *r = (h1creq_t *)cr;
  h1client_t *c = (h1client_t *)cr->client;
  if (!r->held || r->in_body_cb || !sock_usable(c) || osr_sock_is_tls(c->sock) ||
      c->sock->input.len != c->p.held_len)
    return 0; /* more than the held chunk is buffered: it goes through the parser */
  uint64_t left = osr__h1p_body_left(&c->p);
  return left > 1 ? left - 1 : 0;
}

static osr_sock_t *c_raw_take(osr_http_creq_t *cr, uint64_t n)
{
  h1client_t *c = (h1client_t *)cr->client;
  if (n == 0 || n > c_raw_avail(cr))
    return NULL;
  /* As c_release, without reading: the held chunk was written on. */
  osr_buf_consume(&c->sock->input, c->p.held_len);
  c->p.held_len = 0;
  osr__h1p_skip_body(&c->p, n);
  osr_sock_read_stop(c->sock);
  return c->sock;
}

static void c_raw_done(osr_http_creq_t *cr)
{
  /* The held chunk is already dropped (held_len 0): what is left is
   * exactly a release, which resumes the paused parser. */
  c_release(cr);
}

static void c_cancel(osr_http_creq_t *cr)
{
  h1creq_t *r = (h1creq_t *)cr;
  h1client_t *c = (h1client_t *)cr->client;
  if (r->cancelled)
    return;
  r->cancelled = 1;
  if (!r->active) {
    /* Never reached the wire: drop it now. */
    dequeue(c, r);
    finish_creq(r, OSR_ECANCELED);
    return;
  }
  /* On the wire: the connection cannot be resynchronised. on_sock_close
   * reports OSR_ECANCELED for this request. */
  kill_conn(c, OSR_ECANCELED);
}

static void c_close(osr_http_client_t *base)
{
  h1client_t *c = (h1client_t *)base;
  if (c->closing)
    return;
  c->closing = 1;
  c->dead = 1;
  if (c->sock != NULL) {
    osr_sock_close(c->sock); /* on_sock_close fails the rest and frees */
    return;
  }
  close_timer(c);
}

static const osr_http_client_ops_t h1_client_ops = {
  .version = 11,
  .request = c_request,
  .write = c_write,
  .hold = c_hold,
  .release = c_release,
  .cancel = c_cancel,
  .close = c_close,
  .raw_avail = c_raw_avail,
  .raw_take = c_raw_take,
  .raw_done = c_raw_done,
};

int osr__http1_client_new(osr_sock_t *s, const osr_http_client_t *base, osr_http_client_t **out)
{
  h1client_t *c = osr_xcalloc(1, sizeof(*c));
  c->super = *base;
  c->super._ops = &h1_client_ops;
  c->super.authority = osr_xstrdup(base->authority != NULL ? base->authority : "localhost");
  c->sock = s;
  osr__h1p_init(&c->p, 0, &c->super.limits, 0, &parser_events, c);
  uv_timer_init(s->loop, &c->timer);
  c->timer.data = c;
  osr_sock_set_events(s, &sock_events, c);
  osr_sock_set_nodelay(s, 1);
  osr_sock_set_idle_timeout(s, base->idle_timeout_ms);
  int rv = osr_sock_read_start(s);
  if (rv != 0) {
    /* The contract: the socket is closed on error. Free via the close. */
    c->closing = 1;
    c->dead = 1;
    osr_sock_close(s);
    return rv;
  }
  *out = &c->super;
  return 0;
}
