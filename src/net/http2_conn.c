/*
 * HTTP/2 connection engine: nghttp2 session I/O, zero-copy DATA output,
 * backpressure, body flow control and stream lifetime, shared by the server
 * (http2.c) and the client (http2_client.c). See http2_int.h for the model;
 * this file explains the mechanics.
 *
 * Re-entrancy. nghttp2 must not be driven from inside its own callbacks, and
 * owner code (handlers, write callbacks) runs inside them all the time:
 * on_request runs in on_frame_recv inside nghttp2_session_mem_recv(), on_done
 * runs in on_stream_close inside nghttp2_session_send(). So osr__h2_flush()
 * only marks `want_flush` while a recv or a flush is running, and the
 * outermost one loops. Nothing is freed inside nghttp2 callbacks except our
 * own stream structs, which nghttp2 never touches after on_stream_close; the
 * session itself is deleted only from the socket's close callback.
 *
 * Output. One flush = one batch = one osr_sock_write(). The batch owns a
 * byte buffer for control frames and DATA frame headers and a list of
 * segments; payload segments point straight at the stream's write buffers
 * and hold a reference (`inflight`) on the stream so neither the stream nor
 * the caller's memory can go away while the kernel may still read it.
 */
#include "net/http2_int.h"

#include <string.h>
#include <strings.h>

#include "util/log.h"
#include "util/mem.h"

/* Control bytes a batch may copy; frames past this wait for the next flush. */
#define BATCH_OWN_MAX (OSR_H2_OUT_HIGH + 64 * 1024)
/* Bounded rounds of nghttp2_session_send() per flush (fairness, STYLE 17). */
#define FLUSH_ROUNDS 16
/* Memory-mode input cap (the fuzzer feeds at most this much at once). */
#define MEM_INPUT_MAX (16u * 1024 * 1024)

typedef struct seg_s {
  const char *base; /* NULL: `off` into the batch's own bytes */
  size_t off;
  size_t len;
  osr__h2_stream_t *st; /* holds one `inflight` reference, or NULL */
  int completes;        /* st's pending write completes with this batch */
} seg_t;

struct osr__h2_batch_s {
  osr__h2_conn_t *conn;
  osr__h2_batch_t *next;
  osr_buf_t own;
  seg_t *segs;
  size_t nsegs, capsegs;
  size_t bytes;
  osr_iovec_t *iov;
};

/* A read buffer kept alive for held body chunks that point into it. */
struct osr__h2_pin_s {
  char *mem;
  int refs;
};

static void stream_finalize(osr__h2_stream_t *st);
static void rx_pump(osr__h2_stream_t *st);

/* ---- allocator ------------------------------------------------------------ */

static void *ngm_malloc(size_t size, void *ud)
{
  (void)ud;
  return osr_try_malloc(size);
}

static void ngm_free(void *p, void *ud)
{
  (void)ud;
  osr_free(p);
}

static void *ngm_calloc(size_t n, size_t size, void *ud)
{
  (void)ud;
  if (size != 0 && n > SIZE_MAX / size)
    return NULL;
  void *p = osr_try_malloc(n * size);
  if (p != NULL)
    memset(p, 0, n * size);
  return p;
}

static void *ngm_realloc(void *p, size_t size, void *ud)
{
  (void)ud;
  return osr_try_realloc(p, size);
}

nghttp2_mem *osr__h2_mem(void)
{
  /* nghttp2 copies the struct into each session; one static instance is
   * enough and costs nothing. */
  static nghttp2_mem mem = {NULL, ngm_malloc, ngm_free, ngm_calloc, ngm_realloc};
  return &mem;
}

/* ---- small helpers ------------------------------------------------------- */

void osr__h2_lower(uint8_t *dst, const char *src, size_t n)
{
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)src[i];
    dst[i] = (ch >= 'A' && ch <= 'Z') ? (uint8_t)(ch + 32) : ch;
  }
}

int osr__h2_forbidden_header(const char *name, size_t n)
{
  static const char *const bad[] = {
      "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade",
      "te",         "host",       "content-length",
  };
  if (n != 0 && name[0] == ':')
    return 1;
  for (size_t i = 0; i < OSR_ARRAY_SIZE(bad); i++) {
    if (strlen(bad[i]) == n && strncasecmp(bad[i], name, n) == 0)
      return 1;
  }
  return 0;
}

static void pin_unref(osr__h2_pin_t *p)
{
  if (--p->refs != 0)
    return;
  osr_free(p->mem);
  osr_free(p);
}

/* Credit `n` consumed body bytes to the peer (stream and connection; only
 * the connection once the stream is gone). The WINDOW_UPDATE goes out with
 * the next flush. */
static void consume(osr__h2_conn_t *c, int32_t id, size_t n)
{
  if (n == 0 || c->ng == NULL || c->closed)
    return;
  int rv = nghttp2_session_consume(c->ng, id, n);
  if (rv != 0)
    OSR_LOG_DEBUG("http2", "consume(%d, %zu): %s", id, n, nghttp2_strerror(rv));
  c->want_flush = 1;
}

/* ---- batches ------------------------------------------------------------- */

static osr__h2_batch_t *batch_get(osr__h2_conn_t *c)
{
  if (c->cur == NULL) {
    osr__h2_batch_t *b = osr_xcalloc(1, sizeof(*b));
    b->conn = c;
    osr_buf_init(&b->own, BATCH_OWN_MAX);
    c->cur = b;
  }
  return c->cur;
}

static void batch_add(osr__h2_batch_t *b, const char *base, size_t off, size_t len,
                      osr__h2_stream_t *st, int completes)
{
  if (base == NULL && st == NULL && b->nsegs != 0) {
    seg_t *last = &b->segs[b->nsegs - 1];
    /* Coalesce adjacent control bytes into one iovec. */
    if (last->base == NULL && last->st == NULL && last->off + last->len == off) {
      last->len += len;
      b->bytes += len;
      return;
    }
  }
  if (b->nsegs == b->capsegs) {
    b->capsegs = b->capsegs ? b->capsegs * 2 : 16;
    b->segs = osr_xrealloc(b->segs, b->capsegs * sizeof(*b->segs));
  }
  seg_t *s = &b->segs[b->nsegs++];
  s->base = base;
  s->off = off;
  s->len = len;
  s->st = st;
  s->completes = completes;
  b->bytes += len;
  if (st != NULL)
    st->inflight++;
}

/* Copy control bytes into the batch. Returns bytes taken (maybe fewer). */
static size_t batch_copy(osr__h2_batch_t *b, const void *p, size_t len)
{
  size_t room = b->own.max - b->own.len;
  if (len > room)
    len = room;
  if (len == 0)
    return 0;
  size_t off = b->own.len;
  if (osr_buf_append(&b->own, p, len) != 0)
    return 0;
  batch_add(b, NULL, off, len, NULL, 0);
  return len;
}

static void complete_write(osr__h2_stream_t *st, int status)
{
  if (!(st->flags & OSR_H2_ST_W_ACTIVE))
    return;
  unsigned end = st->flags & OSR_H2_ST_W_END;
  st->flags &= ~(OSR_H2_ST_W_ACTIVE | OSR_H2_ST_W_FRAMED | OSR_H2_ST_W_END);
  if (st->w_iov != st->w_small)
    osr_free(st->w_iov);
  st->w_iov = NULL;
  st->w_niov = 0;
  if (status == 0 && end)
    st->flags |= OSR_H2_ST_W_ENDED;
  st->conn->hooks->on_write_done(st, status);
}

static void batch_free(osr__h2_batch_t *b)
{
  osr_buf_dispose(&b->own);
  osr_free(b->segs);
  osr_free(b->iov);
  osr_free(b);
}

/* The batch left (status 0) or will never leave: fire the write callbacks
 * it completes, then drop its stream references. Two passes so that a
 * stream cannot be finalised while later segments still point at it. */
static void batch_done(osr__h2_conn_t *c, osr__h2_batch_t *b, int status)
{
  c->queued -= b->bytes;
  c->batches_inflight--;
  for (size_t i = 0; i < b->nsegs; i++) {
    if (b->segs[i].completes)
      complete_write(b->segs[i].st, status);
  }
  for (size_t i = 0; i < b->nsegs; i++) {
    osr__h2_stream_t *st = b->segs[i].st;
    if (st != NULL && --st->inflight == 0)
      osr__h2_stream_check(st);
  }
  batch_free(b);
}

static void pending_push(osr__h2_conn_t *c, osr__h2_batch_t *b)
{
  osr__h2_batch_t **pp = &c->pending;
  while (*pp != NULL)
    pp = &(*pp)->next;
  b->next = NULL;
  *pp = b;
}

static void update_reading(osr__h2_conn_t *c);

static void on_batch_written(osr_sock_t *s, int status, void *arg)
{
  osr__h2_batch_t *b = arg;
  osr__h2_conn_t *c = b->conn;
  (void)s;
  /* The write callbacks usually answer with more output (the next chunk,
   * a released window): collect it all into the one flush below instead of
   * one socket write per stream. */
  int was_flushing = c->flushing;
  c->flushing = 1;
  batch_done(c, b, status);
  c->flushing = was_flushing;
  if (status != 0 && c->close_status == 0)
    c->close_status = status;
  if (!c->closed) {
    osr__h2_flush(c);
    update_reading(c);
  }
}

static void batch_submit(osr__h2_conn_t *c)
{
  static char zero;
  osr__h2_batch_t *b = c->cur;
  size_t n = 0;

  if (b == NULL)
    return;
  c->cur = NULL;
  if (b->nsegs == 0) {
    batch_free(b);
    return;
  }
  b->iov = osr_xmalloc((b->nsegs ? b->nsegs : 1) * sizeof(*b->iov));
  for (size_t i = 0; i < b->nsegs; i++) {
    seg_t *s = &b->segs[i];
    if (s->len == 0)
      continue;
    b->iov[n++] = osr_iov(s->base != NULL ? s->base : b->own.base + s->off, s->len);
  }
  if (n == 0) {
    /* Only write completions: a zero-length write still completes in order
     * after everything queued before it. */
    b->iov[n++] = osr_iov(&zero, 0);
  }
  c->queued += b->bytes;
  c->batches_inflight++;
  if (c->sock != NULL) {
    int rv = osr_sock_write(c->sock, b->iov, n, on_batch_written, b);
    if (rv != 0) {
      /* The socket is going away: complete the batch from its close
       * callback, never from inside the caller's osr_http_write(). */
      pending_push(c, b);
      c->close_req = 1;
      if (c->close_status == 0)
        c->close_status = rv;
    }
    return;
  }
  if (c->mem_write != NULL)
    c->mem_write(c->mem_ud, b->iov, n);
  pending_push(c, b);
}

/* ---- nghttp2 output callbacks ---------------------------------------------- */

/* Above the watermark we stop pulling frames; the completion of an earlier
 * batch flushes again. With nothing queued at all one frame always goes, so
 * a frame larger than the watermark cannot wedge the connection. */
static int out_full(osr__h2_conn_t *c, const osr__h2_batch_t *b)
{
  if (b->bytes == 0 && c->batches_inflight == 0)
    return 0;
  return c->queued + b->bytes >= OSR_H2_OUT_HIGH;
}

static ssize_t on_send(nghttp2_session *ng, const uint8_t *data, size_t len, int flags, void *ud)
{
  osr__h2_conn_t *c = ud;
  osr__h2_batch_t *b = batch_get(c);
  (void)ng;
  (void)flags;
  if (out_full(c, b))
    return NGHTTP2_ERR_WOULDBLOCK;
  size_t n = batch_copy(b, data, len);
  if (n == 0)
    return b->bytes != 0 ? NGHTTP2_ERR_WOULDBLOCK : NGHTTP2_ERR_CALLBACK_FAILURE;
  return (ssize_t)n;
}

static int on_send_data(nghttp2_session *ng, nghttp2_frame *frame, const uint8_t *framehd,
                        size_t length, nghttp2_data_source *source, void *ud)
{
  osr__h2_conn_t *c = ud;
  osr__h2_stream_t *st = source->ptr;
  osr__h2_batch_t *b = batch_get(c);
  size_t padlen = frame->data.padlen;
  (void)ng;

  if (out_full(c, b) || b->own.max - b->own.len < 9 + padlen)
    return NGHTTP2_ERR_WOULDBLOCK;
  batch_copy(b, framehd, 9);
  if (padlen > 0) {
    uint8_t p = (uint8_t)(padlen - 1);
    batch_copy(b, &p, 1);
  }
  /* The payload: iovecs into the caller's buffers, no copy. */
  size_t left = length;
  while (left > 0 && st->w_idx < st->w_niov) {
    const osr_iovec_t *v = &st->w_iov[st->w_idx];
    size_t n = v->len - st->w_off;
    if (n > left)
      n = left;
    batch_add(b, v->base + st->w_off, 0, n, st, 0);
    st->w_off += n;
    left -= n;
    if (st->w_off == v->len) {
      st->w_idx++;
      st->w_off = 0;
    }
  }
  if (padlen > 1) {
    static const uint8_t zeros[256];
    batch_copy(b, zeros, padlen - 1);
  }
  st->w_sent += length;
  if (st->w_sent == st->w_total && (st->flags & OSR_H2_ST_W_FRAMED))
    batch_add(b, NULL, 0, 0, st, 1);
  return 0;
}

static ssize_t on_read_data(nghttp2_session *ng, int32_t id, uint8_t *buf, size_t length,
                            uint32_t *data_flags, nghttp2_data_source *source, void *ud)
{
  osr__h2_conn_t *c = ud;
  osr__h2_stream_t *st = source->ptr;
  (void)ng;
  (void)id;
  (void)buf;

  if (!(st->flags & OSR_H2_ST_W_ACTIVE) || (st->flags & OSR_H2_ST_W_FRAMED)) {
    st->flags |= OSR_H2_ST_DEFERRED;
    return NGHTTP2_ERR_DEFERRED;
  }
  uint64_t left = st->w_total - st->w_framed;
  if (left == 0 && !(st->flags & OSR_H2_ST_W_END)) {
    /* An empty write that does not end the body: nothing to frame, it
     * completes with the batch being built. */
    st->flags |= OSR_H2_ST_W_FRAMED | OSR_H2_ST_DEFERRED;
    batch_add(batch_get(c), NULL, 0, 0, st, 1);
    return NGHTTP2_ERR_DEFERRED;
  }
  size_t n = left < length ? (size_t)left : length;
  st->w_framed += n;
  *data_flags |= NGHTTP2_DATA_FLAG_NO_COPY;
  if (st->w_framed == st->w_total) {
    st->flags |= OSR_H2_ST_W_FRAMED;
    if (st->flags & OSR_H2_ST_W_END)
      *data_flags |= NGHTTP2_DATA_FLAG_EOF;
  }
  return (ssize_t)n;
}

/* Send DATA frames larger than nghttp2's 16 KiB default when the peer
 * allows it (SETTINGS_MAX_FRAME_SIZE, windows): fewer frame headers and
 * iovecs per byte. Capped at 32 KiB because nghttp2 grows a per-session
 * frame buffer to this size even though NO_COPY never fills it. */
static ssize_t on_read_length(nghttp2_session *ng, uint8_t frame_type, int32_t stream_id,
                              int32_t session_remote_window_size, int32_t stream_remote_window_size,
                              uint32_t remote_max_frame_size, void *ud)
{
  (void)ng;
  (void)frame_type;
  (void)stream_id;
  (void)ud;
  int32_t w = session_remote_window_size < stream_remote_window_size ? session_remote_window_size
                                                                     : stream_remote_window_size;
  if (w > (int32_t)remote_max_frame_size)
    w = (int32_t)remote_max_frame_size;
  if (w > 32 * 1024)
    w = 32 * 1024;
  return w > 0 ? w : 1;
}

/* ---- flush / close ------------------------------------------------------- */

static void on_shutdown_done(osr_sock_t *s, int status, void *arg)
{
  (void)status;
  (void)arg;
  osr_sock_close(s);
}

static void maybe_close(osr__h2_conn_t *c)
{
  if (c->closing || c->close_req || c->ng == NULL)
    return;
  if (c->batches_inflight != 0 || c->cur != NULL)
    return;
  if (nghttp2_session_want_read(c->ng) || nghttp2_session_want_write(c->ng))
    return;
  /* Both sides are done (GOAWAY exchanged, no streams): close gracefully
   * so the last frames are not lost to a reset. */
  c->closing = 1;
  if (c->sock != NULL) {
    if (osr_sock_shutdown(c->sock, on_shutdown_done, NULL) != 0)
      osr_sock_close(c->sock);
  }
}

void osr__h2_flush(osr__h2_conn_t *c)
{
  if (c->closed || c->ng == NULL)
    return;
  if (c->flushing || c->in_recv) {
    c->want_flush = 1;
    return;
  }
  c->flushing = 1;
  for (int round = 0; round < FLUSH_ROUNDS; round++) {
    c->want_flush = 0;
    if (c->sock != NULL && osr_sock_is_closing(c->sock))
      break;
    if (c->sock == NULL && c->mem_write == NULL)
      break;
    int rv = nghttp2_session_send(c->ng);
    batch_submit(c);
    if (rv != 0) {
      OSR_LOG_DEBUG("http2", "session_send: %s", nghttp2_strerror(rv));
      c->close_req = 1;
      if (c->close_status == 0)
        c->close_status = OSR_EH2;
      break;
    }
    if (!c->want_flush || c->queued >= OSR_H2_OUT_HIGH)
      break;
  }
  c->flushing = 0;
  if (c->closed)
    return;
  if (c->close_req) {
    c->closing = 1;
    if (c->sock != NULL)
      osr_sock_close(c->sock);
    return;
  }
  maybe_close(c);
}

void osr__h2_conn_fail(osr__h2_conn_t *c, int status, uint32_t h2err, int goaway)
{
  if (c->closed || c->close_req)
    return;
  if (c->close_status == 0)
    c->close_status = status;
  if (goaway && c->ng != NULL && !c->closing)
    nghttp2_session_terminate_session(c->ng, h2err);
  c->close_req = 1;
  /* The GOAWAY is pushed and the socket closed by the outermost flush
   * (right now unless we are inside nghttp2). */
  osr__h2_flush(c);
}

static void update_reading(osr__h2_conn_t *c)
{
  if (c->sock == NULL || c->closing || c->close_req)
    return;
  /* Backpressure and flood protection: while our output is backlogged we
   * read nothing, so a peer that sends PINGs/SETTINGS without reading the
   * answers stalls itself instead of growing our queues.
   *
   * Servers only. If both ends of a connection did this, heavy traffic in
   * both directions (the data plane's shared exec connections: stdin of
   * many sessions one way, their output the other) fills both queues and
   * neither reads again: a deadlock. A client keeps reading; what it then
   * receives is bounded without the stop: DATA by our stream windows (held
   * chunks and backlogs), control frames by nghttp2's outbound-ACK limit
   * (NGHTTP2_ERR_FLOODED), responses by our own requests. So the server's
   * queue drains and it reads again. */
  if (!c->is_server)
    return;
  if (c->queued >= OSR_H2_OUT_HIGH) {
    if (osr_sock_is_reading(c->sock))
      osr_sock_read_stop(c->sock);
  } else if (c->queued <= OSR_H2_OUT_LOW && !osr_sock_is_reading(c->sock)) {
    osr_sock_read_start(c->sock);
  }
}

/* ---- input --------------------------------------------------------------- */

static osr__h2_pin_t *rx_pin_get(osr__h2_conn_t *c)
{
  if (c->rx_pin == NULL) {
    c->rx_pin = osr_xcalloc(1, sizeof(*c->rx_pin));
    c->rx_pin->refs = 1; /* the running recv's own reference */
  }
  return c->rx_pin;
}

/* After a recv pass: if held chunks point into the input buffer, give the
 * buffer to the pin and the socket a fresh one (no copy of the body). */
static int rx_pin_finish(osr__h2_conn_t *c, osr_buf_t *in)
{
  osr__h2_pin_t *p = c->rx_pin;
  int rv = 0;
  if (p == NULL)
    return 0;
  c->rx_pin = NULL;
  if (p->refs > 1) {
    osr_buf_t old;
    osr_buf_init(&old, in->max);
    osr_buf_swap(in, &old);
    if (old.len != 0)
      rv = osr_buf_append(in, osr_buf_data(&old), old.len);
    p->mem = old.base;
  }
  pin_unref(p);
  return rv;
}

static void conn_recv(osr__h2_conn_t *c, osr_buf_t *in)
{
  if (c->ng == NULL || c->closing || c->close_req) {
    osr_buf_consume(in, in->len);
    return;
  }
  c->in_recv++;
  ssize_t n = nghttp2_session_mem_recv(c->ng, (const uint8_t *)osr_buf_data(in), in->len);
  c->in_recv--;
  if (n < 0) {
    OSR_LOG_DEBUG("http2", "mem_recv: %s", nghttp2_strerror((int)n));
    osr_buf_consume(in, in->len);
    rx_pin_finish(c, in);
    /* A flooding peer is not reading: do not bother queueing a GOAWAY.
     * A bad preface means it does not speak HTTP/2 at all. */
    int goaway = n != NGHTTP2_ERR_FLOODED && n != NGHTTP2_ERR_BAD_CLIENT_MAGIC;
    osr__h2_conn_fail(c, OSR_EH2,
                      n == NGHTTP2_ERR_FLOODED ? NGHTTP2_ENHANCE_YOUR_CALM : NGHTTP2_PROTOCOL_ERROR,
                      goaway);
    return;
  }
  osr_buf_consume(in, (size_t)n);
  if (rx_pin_finish(c, in) != 0) {
    osr__h2_conn_fail(c, OSR_ENOMEM, NGHTTP2_INTERNAL_ERROR, 1);
    return;
  }
  osr__h2_flush(c);
  update_reading(c);
}

/* Hand one chunk to the owner; keep it if it asks to hold. */
static void deliver(osr__h2_stream_t *st, const char *data, size_t len, int from_buf)
{
  osr__h2_conn_t *c = st->conn;
  osr_iovec_t chunk = osr_iov(data, len);

  st->flags |= OSR_H2_ST_DELIVERING;
  st->flags &= ~OSR_H2_ST_HOLD_REQ;
  c->hooks->on_body(st, &chunk, 0);
  st->flags &= ~OSR_H2_ST_DELIVERING;
  if ((st->flags & OSR_H2_ST_HOLD_REQ) && !(st->flags & OSR_H2_ST_FINALIZED)) {
    st->flags &= ~OSR_H2_ST_HOLD_REQ;
    st->flags |= OSR_H2_ST_HELD;
    st->held_len = len;
    if (!from_buf) {
      st->pin = rx_pin_get(c);
      st->pin->refs++;
    }
    return;
  }
  consume(c, st->id, len);
  if (from_buf)
    osr_buf_dispose(&st->held_buf);
}

static void rx_pump(osr__h2_stream_t *st)
{
  osr__h2_conn_t *c = st->conn;
  while (!(st->flags & (OSR_H2_ST_FINALIZED | OSR_H2_ST_HELD | OSR_H2_ST_DELIVERING))) {
    if (st->backlog.len != 0) {
      /* The backlog becomes the delivered chunk; new body goes to a fresh
       * backlog, so a hold keeps this memory stable. */
      osr_buf_swap(&st->held_buf, &st->backlog);
      deliver(st, osr_buf_data(&st->held_buf), st->held_buf.len, 1);
      continue;
    }
    if ((st->flags & OSR_H2_ST_RX_END) && !(st->flags & OSR_H2_ST_RX_DONE) &&
        !(st->flags & OSR_H2_ST_EOF_AT_END)) {
      osr_iovec_t none = osr_iov(NULL, 0);
      st->flags |= OSR_H2_ST_RX_DONE | OSR_H2_ST_DELIVERING;
      c->hooks->on_body(st, &none, OSR_EOF);
      st->flags &= ~OSR_H2_ST_DELIVERING;
    }
    break;
  }
  osr__h2_stream_check(st);
}

void osr__h2_hold(osr__h2_stream_t *st)
{
  if (st->flags & OSR_H2_ST_DELIVERING)
    st->flags |= OSR_H2_ST_HOLD_REQ;
}

void osr__h2_release(osr__h2_stream_t *st)
{
  osr__h2_conn_t *c = st->conn;
  if (st->flags & OSR_H2_ST_DELIVERING) {
    st->flags &= ~OSR_H2_ST_HOLD_REQ;
    return;
  }
  if (!(st->flags & OSR_H2_ST_HELD))
    return;
  st->flags &= ~OSR_H2_ST_HELD;
  consume(c, st->id, st->held_len);
  st->held_len = 0;
  if (st->pin != NULL) {
    pin_unref(st->pin);
    st->pin = NULL;
  } else {
    osr_buf_dispose(&st->held_buf);
  }
  rx_pump(st); /* may finalise st */
  osr__h2_flush(c);
}

/* ---- streams ------------------------------------------------------------- */

void osr__h2_stream_attach(osr__h2_conn_t *c, osr__h2_stream_t *st, int32_t id)
{
  st->conn = c;
  st->id = id;
  st->prev = NULL;
  st->next = c->streams;
  if (c->streams != NULL)
    c->streams->prev = st;
  c->streams = st;
  c->nstreams++;
  st->rx_expect = -1;
  /* The peer cannot send more than one window without our WINDOW_UPDATE,
   * which it does not get while a chunk is held: that bounds the backlog. */
  size_t cap = (size_t)c->limits.h2_window + 64 * 1024;
  osr_buf_init(&st->backlog, cap);
  osr_buf_init(&st->held_buf, cap);
  if (id > 0 && c->ng != NULL)
    nghttp2_session_set_stream_user_data(c->ng, id, st);
}

void osr__h2_data_provider(osr__h2_stream_t *st, nghttp2_data_provider *prd)
{
  prd->source.ptr = st;
  prd->read_callback = on_read_data;
  st->flags |= OSR_H2_ST_HAS_PRD;
}

void osr__h2_stream_check(osr__h2_stream_t *st)
{
  unsigned f = st->flags;
  if ((f & OSR_H2_ST_FINALIZED) || !(f & OSR_H2_ST_NG_CLOSED))
    return;
  if (st->inflight > 0 || (f & OSR_H2_ST_DELIVERING))
    return;
  if (!(f & (OSR_H2_ST_RX_DONE | OSR_H2_ST_LOST)) && (f & OSR_H2_ST_RX_END) && st->status == 0) {
    /* The body arrived complete: let the consumer finish it first. */
    if ((f & OSR_H2_ST_HELD) || st->backlog.len != 0)
      return;
    if (!(f & OSR_H2_ST_EOF_AT_END)) {
      rx_pump(st); /* delivers OSR_EOF, then checks again */
      return;
    }
  }
  stream_finalize(st);
}

static void stream_finalize(osr__h2_stream_t *st)
{
  osr__h2_conn_t *c = st->conn;
  st->flags |= OSR_H2_ST_FINALIZED;
  if (st->prev != NULL)
    st->prev->next = st->next;
  else
    c->streams = st->next;
  if (st->next != NULL)
    st->next->prev = st->prev;
  st->prev = st->next = NULL;
  c->nstreams--;
  if (st->id > 0 && c->ng != NULL && !c->closed)
    nghttp2_session_set_stream_user_data(c->ng, st->id, NULL);

  int err =
      st->status != 0 ? st->status : (c->close_status != 0 ? c->close_status : OSR_ECONNRESET);
  if (st->flags & OSR_H2_ST_W_ACTIVE)
    complete_write(st, err);
  if (!(st->flags & OSR_H2_ST_RX_DONE)) {
    int clean = (st->flags & OSR_H2_ST_RX_END) && !(st->flags & OSR_H2_ST_LOST) &&
                st->status == 0 && !(st->flags & OSR_H2_ST_HELD) && st->backlog.len == 0;
    osr_iovec_t none = osr_iov(NULL, 0);
    st->flags |= OSR_H2_ST_RX_DONE;
    c->hooks->on_body(st, &none, clean ? OSR_EOF : err);
  }
  if (st->flags & OSR_H2_ST_HELD) {
    st->flags &= ~OSR_H2_ST_HELD;
    consume(c, st->id, st->held_len);
    if (st->pin != NULL)
      pin_unref(st->pin);
    st->pin = NULL;
  }
  osr_buf_dispose(&st->held_buf);
  consume(c, st->id, st->backlog.len);
  osr_buf_dispose(&st->backlog);
  c->hooks->on_stream_done(st, st->status); /* frees st */
  osr__h2_flush(c);
}

int osr__h2_write(osr__h2_stream_t *st, const osr_iovec_t *bufs, size_t nbufs, int end)
{
  osr__h2_conn_t *c = st->conn;
  size_t n = 0;
  uint64_t total = 0;

  if (c->closed || c->closing || c->close_req ||
      (st->flags & (OSR_H2_ST_NG_CLOSED | OSR_H2_ST_FINALIZED)))
    return OSR_ECLOSED;
  if (!(st->flags & OSR_H2_ST_HAS_PRD) || (st->flags & OSR_H2_ST_W_ENDED))
    return OSR_EINVAL;
  if (st->flags & OSR_H2_ST_W_ACTIVE)
    return OSR_EBUSY;
  for (size_t i = 0; i < nbufs; i++) {
    if (bufs[i].len != 0)
      n++;
  }
  st->w_iov = n <= OSR_ARRAY_SIZE(st->w_small) ? st->w_small : osr_xmalloc(n * sizeof(*st->w_iov));
  n = 0;
  for (size_t i = 0; i < nbufs; i++) {
    if (bufs[i].len != 0) {
      st->w_iov[n++] = bufs[i];
      total += bufs[i].len;
    }
  }
  st->w_niov = n;
  st->w_idx = st->w_off = 0;
  st->w_total = total;
  st->w_framed = st->w_sent = 0;
  st->out_bytes += total;
  st->flags |= OSR_H2_ST_W_ACTIVE | (end ? OSR_H2_ST_W_END : 0);
  if (st->flags & OSR_H2_ST_DEFERRED) {
    st->flags &= ~OSR_H2_ST_DEFERRED;
    nghttp2_session_resume_data(c->ng, st->id);
  }
  osr__h2_flush(c);
  return 0;
}

void osr__h2_reset(osr__h2_stream_t *st, uint32_t code, int status)
{
  osr__h2_conn_t *c = st->conn;
  if (st->status == 0)
    st->status = status;
  if (c->closed || c->ng == NULL || (st->flags & (OSR_H2_ST_NG_CLOSED | OSR_H2_ST_FINALIZED)))
    return;
  nghttp2_submit_rst_stream(c->ng, NGHTTP2_FLAG_NONE, st->id, code);
  osr__h2_flush(c);
}

/* ---- nghttp2 input callbacks --------------------------------------------- */

static int on_begin_headers(nghttp2_session *ng, const nghttp2_frame *f, void *ud)
{
  osr__h2_conn_t *c = ud;
  (void)ng;
  return c->hooks->on_begin_headers != NULL ? c->hooks->on_begin_headers(c, f) : 0;
}

static int on_header(nghttp2_session *ng, const nghttp2_frame *f, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags, void *ud)
{
  osr__h2_conn_t *c = ud;
  (void)ng;
  (void)flags;
  return c->hooks->on_header != NULL ? c->hooks->on_header(c, f, name, namelen, value, valuelen)
                                     : 0;
}

static int on_data_chunk(nghttp2_session *ng, uint8_t flags, int32_t id, const uint8_t *data,
                         size_t len, void *ud)
{
  osr__h2_conn_t *c = ud;
  osr__h2_stream_t *st = nghttp2_session_get_stream_user_data(ng, id);
  (void)flags;

  if (st == NULL || (st->flags & (OSR_H2_ST_FINALIZED | OSR_H2_ST_RX_DONE)) || st->status != 0) {
    /* Nobody wants this body: credit it at once. */
    consume(c, id, len);
    return 0;
  }
  st->rx_bytes += len;
  if ((st->flags & (OSR_H2_ST_HELD | OSR_H2_ST_DELIVERING)) || st->backlog.len != 0) {
    if (osr_buf_append(&st->backlog, data, len) != 0) {
      consume(c, id, len);
      osr__h2_reset(st, NGHTTP2_FLOW_CONTROL_ERROR, OSR_EH2);
    }
    return 0;
  }
  deliver(st, (const char *)data, len, 0);
  osr__h2_stream_check(st);
  return 0;
}

static int on_frame_recv(nghttp2_session *ng, const nghttp2_frame *f, void *ud)
{
  osr__h2_conn_t *c = ud;
  osr__h2_stream_t *st =
      f->hd.stream_id != 0 ? nghttp2_session_get_stream_user_data(ng, f->hd.stream_id) : NULL;

  switch (f->hd.type) {
  case NGHTTP2_HEADERS:
    if (c->hooks->on_headers != NULL) {
      int rv = c->hooks->on_headers(c, f, st);
      if (rv != 0)
        return rv;
      /* The hook may have attached a stream. */
      st = nghttp2_session_get_stream_user_data(ng, f->hd.stream_id);
    }
    /* fall through */
  case NGHTTP2_DATA:
    if (st != NULL && (f->hd.flags & NGHTTP2_FLAG_END_STREAM) &&
        !(st->flags & OSR_H2_ST_FINALIZED)) {
      st->flags |= OSR_H2_ST_RX_END;
      /* An aborted/reset stream gets its error at finalisation, not EOF. */
      if (st->status == 0)
        rx_pump(st);
    }
    break;
  case NGHTTP2_SETTINGS:
    if (!(f->hd.flags & NGHTTP2_FLAG_ACK))
      c->peer_settings = 1;
    break;
  case NGHTTP2_RST_STREAM:
    OSR_LOG_DEBUG("http2", "stream %d reset by peer (%s)", f->hd.stream_id,
                  nghttp2_http2_strerror(f->rst_stream.error_code));
    if (st == NULL || (st->flags & OSR_H2_ST_FINALIZED))
      break;
    if (f->rst_stream.error_code == NGHTTP2_NO_ERROR && st->rx_expect >= 0 &&
        st->rx_bytes == (uint64_t)st->rx_expect) {
      /* Some peers (node's http2) end a stream whose body they sent in
       * full with RST_STREAM(NO_ERROR) instead of END_STREAM. With the
       * whole content-length received nothing is missing: take it as the
       * end of the body. */
      st->flags |= OSR_H2_ST_RX_END;
    } else if (st->status == 0) {
      st->status = OSR_ECONNRESET;
    }
    break;
  case NGHTTP2_PING:
    if ((f->hd.flags & NGHTTP2_FLAG_ACK) && memcmp(f->ping.opaque_data, "osrr", 4) == 0) {
      uint32_t gen;
      memcpy(&gen, f->ping.opaque_data + 4, 4);
      for (osr__h2_stream_t *s = c->streams; s != NULL; s = s->next) {
        if ((s->flags & OSR_H2_ST_RST_AFTER) && s->rst_gen != 0 && s->rst_gen <= gen &&
            !(s->flags & (OSR_H2_ST_RX_END | OSR_H2_ST_NG_CLOSED))) {
          s->flags &= ~OSR_H2_ST_RST_AFTER;
          nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_NO_ERROR);
        }
      }
      break;
    }
    if ((f->hd.flags & NGHTTP2_FLAG_ACK) && c->draining &&
        memcmp(f->ping.opaque_data, "osrdrain", 8) == 0 && !c->goaway_final) {
      /* One round trip after the shutdown notice: every request the peer
       * sent before it saw the notice has arrived. Now the real GOAWAY. */
      c->goaway_final = 1;
      nghttp2_submit_goaway(ng, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(ng),
                            NGHTTP2_NO_ERROR, NULL, 0);
    }
    break;
  default:
    break;
  }
  return 0;
}

static int on_frame_send(nghttp2_session *ng, const nghttp2_frame *f, void *ud)
{
  (void)ud;
  osr__h2_stream_t *st =
      f->hd.stream_id != 0 ? nghttp2_session_get_stream_user_data(ng, f->hd.stream_id) : NULL;
  if (st == NULL)
    return 0;
  if (f->hd.type == NGHTTP2_RST_STREAM) {
    if (st->status == 0 && f->rst_stream.error_code != NGHTTP2_NO_ERROR)
      st->status = OSR_EH2;
  } else if ((f->hd.type == NGHTTP2_HEADERS || f->hd.type == NGHTTP2_DATA) &&
             (f->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
    st->flags |= OSR_H2_ST_LOCAL_END;
    if ((st->flags & OSR_H2_ST_RST_AFTER) && !(st->flags & OSR_H2_ST_RX_END)) {
      /* RFC 9113 8.1: the response is complete and the rest of the request
       * body is not wanted, so RST_STREAM(NO_ERROR) tells the client to stop
       * sending. Not yet, though: a reset that arrives together with the
       * response makes some clients (curl 7.88) fail the request while still
       * uploading, and a reset queued behind the response would even make
       * nghttp2 drop the response. Send a PING and reset when its ACK shows
       * the client has processed the response (on_frame_recv). */
      uint8_t opaque[8] = {'o', 's', 'r', 'r'};
      uint32_t gen = ++((osr__h2_conn_t *)ud)->rst_ping_gen;
      memcpy(opaque + 4, &gen, 4);
      st->rst_gen = gen;
      nghttp2_submit_ping(ng, NGHTTP2_FLAG_NONE, opaque);
    }
  }
  return 0;
}

static int on_stream_close(nghttp2_session *ng, int32_t id, uint32_t code, void *ud)
{
  osr__h2_stream_t *st = nghttp2_session_get_stream_user_data(ng, id);
  (void)ud;
  if (st == NULL)
    return 0;
  OSR_LOG_DEBUG("http2", "stream %d closed (%s), status %d, flags %#x", id,
                nghttp2_http2_strerror(code), st->status, st->flags);
  st->flags |= OSR_H2_ST_NG_CLOSED;
  st->ng_error = code;
  if (code != NGHTTP2_NO_ERROR && st->status == 0)
    st->status = code == NGHTTP2_REFUSED_STREAM ? OSR_ECONNRESET : OSR_EH2;
  osr__h2_stream_check(st); /* may free st */
  return 0;
}

static int on_error(nghttp2_session *ng, int code, const char *msg, size_t len, void *ud)
{
  (void)ng;
  (void)ud;
  OSR_LOG_DEBUG("http2", "nghttp2: %.*s (%d)", (int)len, msg, code);
  return 0;
}

/* ---- socket events ------------------------------------------------------- */

static void teardown(osr__h2_conn_t *c);

static void on_sock_read(osr_sock_t *s, int status)
{
  osr__h2_conn_t *c = s->data;
  if (status < 0) {
    osr_buf_consume(&s->input, s->input.len);
    osr__h2_conn_fail(c, status == OSR_EOF ? OSR_ECONNRESET : status, NGHTTP2_NO_ERROR, 0);
    return;
  }
  conn_recv(c, &s->input);
}

static void on_sock_close(osr_sock_t *s)
{
  osr__h2_conn_t *c = s->data;
  c->sock = NULL;
  teardown(c);
}

static void on_sock_timeout(osr_sock_t *s)
{
  osr__h2_conn_t *c = s->data;
  if (c->hooks->on_timeout != NULL)
    c->hooks->on_timeout(c);
  else
    osr__h2_conn_fail(c, OSR_ETIMEDOUT, NGHTTP2_NO_ERROR, 1);
}

static void on_sock_drain(osr_sock_t *s)
{
  osr__h2_conn_drain(s->data);
}

static const osr_sock_events_t h2_sock_events = {
    .on_read = on_sock_read,
    .on_close = on_sock_close,
    .on_timeout = on_sock_timeout,
    .on_drain = on_sock_drain,
};

void osr__h2_conn_drain(osr__h2_conn_t *c)
{
  if (c->draining || c->closed || c->closing || c->ng == NULL)
    return;
  c->draining = 1;
  if (!c->is_server) {
    osr__h2_conn_fail(c, OSR_ESHUTDOWN, NGHTTP2_NO_ERROR, 1);
    return;
  }
  /* RFC 9113 6.8: a GOAWAY with the maximum stream id announces the
   * shutdown, a PING measures one round trip, then the final GOAWAY names
   * the last stream we will process (see on_frame_recv). */
  nghttp2_submit_shutdown_notice(c->ng);
  nghttp2_submit_ping(c->ng, NGHTTP2_FLAG_NONE, (const uint8_t *)"osrdrain");
  osr__h2_flush(c);
}

static void teardown(osr__h2_conn_t *c)
{
  if (c->closed)
    return;
  c->closed = 1;
  c->closing = 1;
  if (c->close_status == 0)
    c->close_status = OSR_ECONNRESET;
  /* Frames collected but never written, and writes the socket refused. */
  if (c->cur != NULL) {
    osr__h2_batch_t *b = c->cur;
    c->cur = NULL;
    c->queued += b->bytes;
    c->batches_inflight++;
    batch_done(c, b, OSR_ECANCELED);
  }
  while (c->pending != NULL) {
    osr__h2_batch_t *b = c->pending;
    c->pending = b->next;
    batch_done(c, b, OSR_ECANCELED);
  }
  while (c->streams != NULL) {
    osr__h2_stream_t *st = c->streams;
    st->flags |= OSR_H2_ST_NG_CLOSED | OSR_H2_ST_LOST;
    st->flags &= ~OSR_H2_ST_DELIVERING;
    if (st->status == 0 && !(st->flags & OSR_H2_ST_W_ENDED && st->flags & OSR_H2_ST_RX_DONE))
      st->status = c->close_status;
    st->inflight = 0; /* every batch is done by now */
    stream_finalize(st);
  }
  if (c->ng != NULL)
    nghttp2_session_del(c->ng);
  c->ng = NULL;
  osr_buf_dispose(&c->mem_input);
  c->hooks->on_closed(c); /* may free c */
}

/* ---- setup --------------------------------------------------------------- */

int osr__h2_conn_init(osr__h2_conn_t *c, osr_sock_t *sock, int is_server,
                      const osr_http_limits_t *limits, const osr__h2_hooks_t *hooks, void *owner)
{
  nghttp2_session_callbacks *cbs = NULL;
  nghttp2_option *opt = NULL;
  int rv;

  memset(c, 0, sizeof(*c));
  c->sock = sock;
  c->hooks = hooks;
  c->owner = owner;
  c->is_server = is_server;
  c->limits = *limits;
  osr_http_limits_defaults(&c->limits);
  if (c->limits.h2_window > INT32_MAX)
    c->limits.h2_window = INT32_MAX;
  osr_buf_init(&c->mem_input, MEM_INPUT_MAX);

  /* Both objects are only needed while the session is created. nghttp2
   * allocates them with plain malloc (no nghttp2_mem variant exists). */
  if (nghttp2_session_callbacks_new(&cbs) != 0 || nghttp2_option_new(&opt) != 0) {
    rv = OSR_ENOMEM;
    goto out;
  }
  nghttp2_session_callbacks_set_send_callback(cbs, on_send);
  nghttp2_session_callbacks_set_send_data_callback(cbs, on_send_data);
  nghttp2_session_callbacks_set_data_source_read_length_callback(cbs, on_read_length);
  nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, on_begin_headers);
  nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
  nghttp2_session_callbacks_set_on_frame_send_callback(cbs, on_frame_send);
  nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
  nghttp2_session_callbacks_set_error_callback2(cbs, on_error);

  /* Flow control follows what the consumer really took (STYLE 14). */
  nghttp2_option_set_no_auto_window_update(opt, 1);
  nghttp2_option_set_no_closed_streams(opt, 1);
  /* Flood limits (STYLE 22): queued SETTINGS/PING ACKs, SETTINGS entries
   * per frame, RST_STREAM rate (CVE-2023-44487 "rapid reset"), CONTINUATION
   * frames per header block (CVE-2024-27316 class), and the encoder's
   * dynamic table so a peer cannot make us keep a large one. */
  nghttp2_option_set_max_outbound_ack(opt, 1000);
  nghttp2_option_set_max_settings(opt, 32);
  nghttp2_option_set_stream_reset_rate_limit(opt, 1000, 33);
  nghttp2_option_set_max_continuations(opt, 8);
  nghttp2_option_set_max_deflate_dynamic_table_size(opt, 4096);
  nghttp2_option_set_max_send_header_block_length(opt, 64 * 1024);
  if (!is_server)
    nghttp2_option_set_max_reserved_remote_streams(opt, 0);

  rv = is_server ? nghttp2_session_server_new3(&c->ng, cbs, c, opt, osr__h2_mem())
                 : nghttp2_session_client_new3(&c->ng, cbs, c, opt, osr__h2_mem());
  if (rv != 0) {
    c->ng = NULL;
    rv = OSR_ENOMEM;
    goto out;
  }

  /* Header list size as RFC 9113 counts it: name + value + 32 per field. */
  size_t hls = c->limits.max_header_bytes + 32 * (c->limits.max_headers + 8);
  nghttp2_settings_entry iv[5];
  size_t niv = 0;
  iv[niv].settings_id = NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS;
  iv[niv++].value = is_server ? c->limits.h2_max_streams : 100;
  iv[niv].settings_id = NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE;
  iv[niv++].value = c->limits.h2_window;
  iv[niv].settings_id = NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE;
  iv[niv++].value = hls > UINT32_MAX ? UINT32_MAX : (uint32_t)hls;
  iv[niv].settings_id = NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES;
  iv[niv++].value = 1;
  if (!is_server) {
    iv[niv].settings_id = NGHTTP2_SETTINGS_ENABLE_PUSH;
    iv[niv++].value = 0;
  }
  rv = nghttp2_submit_settings(c->ng, NGHTTP2_FLAG_NONE, iv, niv);
  if (rv == 0) {
    /* The connection window covers several streams' windows so one slow
     * consumer does not starve the others; it also bounds what all held
     * chunks and backlogs of this connection can add up to. */
    uint64_t cw = (uint64_t)c->limits.h2_window * 4;
    if (cw < 1024 * 1024)
      cw = 1024 * 1024;
    if (c->limits.h2_conn_window != 0)
      cw = c->limits.h2_conn_window; /* http.h: the owner sized it */
    if (cw > INT32_MAX)
      cw = INT32_MAX;
    rv = nghttp2_session_set_local_window_size(c->ng, NGHTTP2_FLAG_NONE, 0, (int32_t)cw);
  }
  if (rv != 0) {
    nghttp2_session_del(c->ng);
    c->ng = NULL;
    rv = OSR_ENOMEM;
    goto out;
  }
  if (sock != NULL)
    osr_sock_set_events(sock, &h2_sock_events, c);
  rv = 0;
out:
  nghttp2_session_callbacks_del(cbs);
  nghttp2_option_del(opt);
  return rv;
}

void osr__h2_conn_start(osr__h2_conn_t *c)
{
  if (c->sock != NULL) {
    osr_sock_set_nodelay(c->sock, 1);
    if (osr_sock_read_start(c->sock) != 0) {
      osr__h2_conn_fail(c, OSR_ECLOSED, NGHTTP2_NO_ERROR, 0);
      return;
    }
  }
  osr__h2_flush(c);
}

/* ---- memory mode ----------------------------------------------------------- */

int osr__h2_mem_feed(osr__h2_conn_t *c, const uint8_t *data, size_t len)
{
  if (c->closed || c->closing || c->close_req || c->ng == NULL)
    return -1;
  if (osr_buf_append(&c->mem_input, data, len) != 0)
    return -1;
  conn_recv(c, &c->mem_input);
  return (c->closing || c->close_req) ? -1 : 0;
}

size_t osr__h2_mem_complete(osr__h2_conn_t *c)
{
  size_t n = 0;
  while (c->pending != NULL && !c->closed) {
    osr__h2_batch_t *b = c->pending;
    c->pending = b->next;
    batch_done(c, b, 0);
    n++;
    osr__h2_flush(c);
  }
  return n;
}

void osr__h2_mem_destroy(osr__h2_conn_t *c)
{
  teardown(c);
}
