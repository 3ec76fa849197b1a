/*
 * The byte-stream socket. See sock.h for the contract; this file explains the
 * mechanics.
 *
 * One libuv handle lives in the struct, the stream; the struct is freed in
 * its close callback (STYLE 20). The idle timer and the "kick" used to
 * deliver bytes that are already buffered (after osr_sock_read_start() or
 * when TLS holds decrypted records) on the next loop iteration, instead of
 * re-entering the owner from its own call, are nodes on the loop's shared
 * timer heap and pending list (net/loopctx.h); both are disarmed when the
 * close starts, so neither can fire for a socket being freed.
 *
 * Owner callbacks run under `_in_cb`; osr_sock_close() called from inside one
 * only marks the socket, and the real close happens when the outermost
 * callback returns (STYLE 19).
 */
#include "net/sock.h"

#include <string.h>

#include "net/listener.h"
#include "net/tls.h"
#include "util/blockpool.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/text.h"

typedef osr__sock_wreq_t write_req_t;

typedef struct shutdown_req_s {
  uv_shutdown_t req;
  osr_sock_t *sock;
  osr_sock_write_cb cb;
  void *arg;
} shutdown_req_t;

static void sock_update_reading(osr_sock_t *s);
static void on_kick(osr_sock_t *s);
static void kick_schedule(osr_sock_t *s);
static void wdone_run(osr_sock_t *s);
static void do_close(osr_sock_t *s);

int osr__sock_new(uv_loop_t *loop, int is_pipe, osr_sock_t **out)
{
  /* A TCP socket leaves out the tail only a uv_pipe_t uses (sock.h). */
  osr_sock_t *s = osr_xcalloc(1, is_pipe ? sizeof(*s) : OSR__SOCK_TCP_SIZE);
  int rv;

  osr_buf_init(&s->input, OSR_SOCK_INPUT_MAX_DEFAULT);
  if (is_pipe) {
    rv = uv_pipe_init(loop, &s->_h.pipe, 0);
    s->_flags |= OSR_SOCK_F_IS_PIPE;
  } else {
    rv = uv_tcp_init(loop, &s->_h.tcp);
  }
  if (rv != 0) {
    osr_free(s);
    return rv;
  }
  s->_h.handle.data = s;
  osr_timer_init(&s->_timer, osr_loopctx_acquire(loop));
  *out = s;
  return 0;
}

void osr_sock_set_events(osr_sock_t *s, const osr_sock_events_t *ev, void *data)
{
  s->ev = ev;
  s->data = data;
}

/* ---- callback guard ------------------------------------------------------ */

static void cb_enter(osr_sock_t *s)
{
  s->_in_cb++;
}

static void cb_leave(osr_sock_t *s)
{
  if (--s->_in_cb == 0 && (s->_flags & OSR_SOCK_F_CLOSE_PENDING))
    do_close(s);
}

void osr__sock_deliver(osr_sock_t *s, int status)
{
  if (s->_flags & OSR_SOCK_F_CLOSING)
    return;
  if (status == 0 && !(s->_flags & OSR_SOCK_F_READING))
    return; /* kept in s->input until the owner reads again */
  if (s->ev == NULL || s->ev->on_read == NULL)
    return;
  cb_enter(s);
  s->ev->on_read(s, status);
  cb_leave(s);
}

/* ---- idle timer -------------------------------------------------------- */

static void on_idle_timer(osr_timer_t *t)
{
  osr_sock_t *s = osr_container_of(t, osr_sock_t, _timer);
  if (s->_flags & OSR_SOCK_F_CLOSING)
    return;
  OSR_LOG_DEBUG("sock", "%p idle timeout", (void *)s);
  if (s->_flags & OSR_SOCK_F_HANDSHAKING) {
    osr__sock_handshake_done(s, OSR_ETIMEDOUT);
    return;
  }
  if (s->_idle_timeout_ms == 0)
    return;
  /* touch() only records the time (see there): the timer may be early. */
  uint32_t idle = (uint32_t)uv_now(s->loop) - s->_last_active; /* mod 2^32: < 49 days */
  if (idle < s->_idle_timeout_ms) {
    osr_timer_start(&s->_timer, on_idle_timer, s->_idle_timeout_ms - idle);
    return;
  }
  if (s->ev != NULL && s->ev->on_timeout != NULL) {
    cb_enter(s);
    s->ev->on_timeout(s);
    cb_leave(s);
  } else {
    osr_sock_close(s);
  }
}

/* Arm the idle timer to fire no later than one idle timeout from now.
 * Activity (every read and write completion) only records the loop time:
 * a timer that is already running is due no later than that, and when it
 * fires early on_idle_timer re-arms it for the rest (restarting a timer
 * is a heap removal and insertion). A changed timeout restarts it
 * only if it would otherwise fire too late. While a TLS handshake runs,
 * the timer carries the handshake deadline instead. */
static void idle_arm(osr_sock_t *s, int timeout_changed)
{
  if (s->_idle_timeout_ms == 0 || (s->_flags & OSR_SOCK_F_CLOSING))
    return;
  s->_last_active = (uint32_t)uv_now(s->loop);
  if (!osr_timer_is_active(&s->_timer) ||
      (timeout_changed && osr_timer_due_in(&s->_timer) > s->_idle_timeout_ms))
    osr_timer_start(&s->_timer, on_idle_timer, s->_idle_timeout_ms);
}

static void touch(osr_sock_t *s)
{
  idle_arm(s, 0);
}

void osr_sock_set_idle_timeout(osr_sock_t *s, uint64_t ms)
{
  s->_idle_timeout_ms = ms < UINT32_MAX ? (uint32_t)ms : UINT32_MAX;
  if ((s->_flags & OSR_SOCK_F_HANDSHAKING) && osr_timer_is_active(&s->_timer))
    return; /* the handshake deadline runs; idle time starts after it */
  if (ms == 0) {
    osr_timer_stop(&s->_timer);
    return;
  }
  /* Servers switch between request and keep-alive timeouts on every
   * exchange: usually the running timer is early enough already. */
  idle_arm(s, 1);
}

/* ---- reading ------------------------------------------------------------- */

/* Read buffers come from the thread's block pool and go back to it as soon
 * as they hold no bytes (sock_trim), so an idle connection holds none and a
 * busy one reuses a resident block without a malloc/free pair. */
#define SOCK_BLOCK OSR_BLOCK_64K

void osr__sock_buf_adopt(osr_buf_t *b)
{
  if (b->base != NULL || b->max < osr_block_size(SOCK_BLOCK))
    return;
  b->base = osr_block_get(SOCK_BLOCK);
  if (b->base != NULL)
    b->cap = osr_block_size(SOCK_BLOCK);
}

/* Give an empty buffer's block back to the pool. Nothing points into a
 * buffer with no bytes: owners that hold chunks (zero-copy writes) have not
 * consumed them yet. A buffer that grew beyond a block (a stream whose owner
 * held data while more arrived) stays with its socket until it closes:
 * freeing it whenever it drains would cost a realloc chain (and, above
 * glibc's mmap threshold, mmap/munmap calls) per drain on exactly the
 * connections that move the most bytes. */
static void buf_trim(osr_buf_t *b, int closing)
{
  if (b->base == NULL || (b->len != 0 && !closing))
    return;
  if (b->cap == osr_block_size(SOCK_BLOCK))
    osr_block_put(SOCK_BLOCK, b->base);
  else if (closing)
    osr_free(b->base);
  else
    return;
  b->base = NULL;
  b->cap = 0;
  b->off = 0;
  b->len = 0;
}

static void sock_trim(osr_sock_t *s)
{
  if (s->_flags & OSR_SOCK_F_CLOSING)
    return;
  buf_trim(&s->input, 0);
  if (s->_tls != NULL)
    buf_trim(osr__tls_raw(s->_tls), 0);
}

void osr__sock_trim_input(osr_sock_t *s)
{
  /* Unlike sock_trim, a grown buffer goes too: the caller's stream is
   * between writes and may idle for long. */
  if (s->input.len == 0 && !(s->_flags & OSR_SOCK_F_CLOSING))
    buf_trim(&s->input, 1);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
  osr_sock_t *s = h->data;
  osr_buf_t *b = s->_tls != NULL ? osr__tls_raw(s->_tls) : &s->input;
  osr_iovec_t tail;

  (void)suggested;
  osr__sock_buf_adopt(b); /* an empty buffer holds no memory between reads */
  if (!(s->_flags & (OSR_SOCK_F_READING | OSR_SOCK_F_HANDSHAKING))) {
    /* Paused, with libuv still reading (see sock_update_reading). The input
     * buffer must not move now (an owner that holds a chunk points into
     * it), so only the free tail it already has is offered; with no room
     * left (or TLS, which would decrypt into it) libuv stops. A request
     * pipelined behind the current one thus waits here, not in a
     * uv_read_stop/start pair. */
    size_t room = b->base != NULL ? b->cap - b->off - b->len : 0;
    if (s->_tls != NULL || room < 4096) {
      buf->base = NULL;
      buf->len = 0;
      return;
    }
    buf->base = b->base + b->off + b->len;
    buf->len = room;
    return;
  }
  /* Ask for 64 KiB of room so one read takes a whole request with a
   * typical body, or several TLS records: a read that fills the buffer makes
   * libuv read again at once, and if the owner paused meanwhile (it holds
   * the first chunk) that costs a uv_read_stop/start pair. Pages never
   * written stay unresident. osr_buf_reserve compacts before it grows. */
  size_t want = 64 * 1024;
  if (b->max - b->len < want)
    want = b->max - b->len;
  if (want == 0 || osr_buf_reserve(b, want, &tail) != 0) {
    buf->base = NULL;
    buf->len = 0; /* libuv reports UV_ENOBUFS */
    return;
  }
  buf->base = tail.base;
  buf->len = tail.len;
}

/* The read side ended (EOF, error, or a TLS failure): stop reading for good
 * and tell the owner once, even if it paused reading, since it must learn
 * the peer is gone. Bytes still buffered stay in s->input. */
static void read_failed(osr_sock_t *s, int err)
{
  if (s->_flags & OSR_SOCK_F_EOF)
    return;
  if (s->_flags & OSR_SOCK_F_UV_READING) {
    uv_read_stop(&s->_h.stream);
    s->_flags &= ~OSR_SOCK_F_UV_READING;
  }
  s->_flags |= OSR_SOCK_F_EOF;
  if (s->ev != NULL && s->ev->on_read != NULL) {
    cb_enter(s);
    s->ev->on_read(s, err);
    cb_leave(s);
  }
}

/* Pausing is lazy (see sock_update_reading): on_alloc limits what a paused
 * socket takes, and a TLS read that found the owner paused stops libuv.
 * Only a read that found the owner paused counts: owners pause from inside
 * their read callback. */
static void lazy_stop(osr_sock_t *s)
{
  if ((s->_flags & (OSR_SOCK_F_READING | OSR_SOCK_F_HANDSHAKING | OSR_SOCK_F_CLOSING)) == 0 &&
      (s->_flags & OSR_SOCK_F_UV_READING)) {
    uv_read_stop(&s->_h.stream);
    s->_flags &= ~OSR_SOCK_F_UV_READING;
  }
}

static void on_uv_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
  osr_sock_t *s = stream->data;
  int paused = !(s->_flags & OSR_SOCK_F_READING);
  (void)buf;

  if (nread == 0)
    return; /* EAGAIN, not EOF */
  if (nread == UV_ENOBUFS) {
    /* The buffer is at its cap: stop reading until the owner consumes. */
    uv_read_stop(stream);
    s->_flags &= ~OSR_SOCK_F_UV_READING;
    if (paused)
      return; /* backpressure while the owner pauses, not an error */
    if (s->_tls == NULL || (s->_flags & OSR_SOCK_F_HANDSHAKING) == 0) {
      if (s->input.len >= s->input.max)
        osr__sock_deliver(s, OSR_ETOOLARGE);
    }
    return;
  }
  if (nread < 0) {
    if (s->_flags & OSR_SOCK_F_HANDSHAKING) {
      osr__sock_handshake_done(s, nread == UV_EOF ? OSR_ECONNRESET : (int)nread);
      return;
    }
    if (!(s->_flags & OSR_SOCK_F_READING) || (s->_flags & OSR_SOCK_F_KICK)) {
      /* Paused, or buffered bytes are still to be delivered (the kick a
       * read_start scheduled): the owner learns of the end when it reads
       * again, after the bytes still buffered, as if libuv had not been
       * reading. */
      s->_pending_err = (int16_t)nread; /* UV_EOF and errnos fit */
      lazy_stop(s);
      return;
    }
    read_failed(s, (int)nread);
    return;
  }
  touch(s);
  if (s->_tls != NULL) {
    osr__tls_raw(s->_tls)->len += (size_t)nread;
    int rv = osr__tls_on_raw(s);
    if (rv != 0 && !(s->_flags & OSR_SOCK_F_CLOSING)) {
      if (s->_flags & OSR_SOCK_F_HANDSHAKING)
        osr__sock_handshake_done(s, rv);
      else
        read_failed(s, rv);
      return;
    }
    if (paused)
      lazy_stop(s);
    sock_trim(s);
    return;
  }
  osr_buf_commit(&s->input, (size_t)nread);
  osr__sock_deliver(s, 0); /* kept in s->input while paused */
  sock_trim(s);
}

/* Make uv reading match what the owner wants and what the buffers allow. */
static void sock_update_reading(osr_sock_t *s)
{
  int want = 0;

  if (s->_flags & (OSR_SOCK_F_CLOSING | OSR_SOCK_F_EOF))
    want = 0;
  else if (s->_flags & OSR_SOCK_F_HANDSHAKING)
    want = 1;
  else
    want = (s->_flags & OSR_SOCK_F_READING) != 0;

  if (want && s->_pending_err != 0) {
    /* An end read while paused: delivered by on_kick, after the input. */
    kick_schedule(s);
  } else if (want && !(s->_flags & OSR_SOCK_F_UV_READING)) {
    if (uv_read_start(&s->_h.stream, on_alloc, on_uv_read) == 0)
      s->_flags |= OSR_SOCK_F_UV_READING;
  } else if (!want && (s->_flags & OSR_SOCK_F_UV_READING) &&
             (s->_flags & (OSR_SOCK_F_CLOSING | OSR_SOCK_F_EOF))) {
    uv_read_stop(&s->_h.stream);
    s->_flags &= ~OSR_SOCK_F_UV_READING;
  }
  /* A mere pause leaves libuv reading: owners pause and resume around every
   * request, and each uv_read_stop/start pair costs two epoll_ctl calls.
   * Bytes that arrive while paused fill at most the input buffer's free
   * tail (on_alloc); then libuv is stopped (UV_ENOBUFS). */
}

int osr__sock_raw_read_start(osr_sock_t *s)
{
  if (s->_flags & OSR_SOCK_F_CLOSING)
    return OSR_ECLOSED;
  if (!(s->_flags & OSR_SOCK_F_UV_READING)) {
    int rv = uv_read_start(&s->_h.stream, on_alloc, on_uv_read);
    if (rv != 0)
      return rv;
    s->_flags |= OSR_SOCK_F_UV_READING;
  }
  return 0;
}

/* The kick is a deferred call (osr_call_defer) with a flag, not a list node
 * of its own in every socket. Cancelling only clears OSR_SOCK_F_KICK: a call
 * still queued finds it clear and does nothing (the close flushes it, see
 * on_handle_closed, so none outlives the socket). */
static void kick_run(void *obj, osr_fn_t fn, void *arg)
{
  osr_sock_t *s = obj;
  (void)fn;
  (void)arg;
  s->_flags &= ~OSR_SOCK_F_KICK_QUEUED;
  if (!(s->_flags & OSR_SOCK_F_KICK))
    return;
  if (s->_flags & OSR_SOCK_F_WFLUSH) {
    /* Flushed ahead of a write completion (wdone_run): still next turn. */
    s->_flags |= OSR_SOCK_F_KICK_QUEUED;
    osr_call_defer(osr_timer_ctx(&s->_timer), kick_run, s, NULL, NULL);
    return;
  }
  s->_flags &= ~OSR_SOCK_F_KICK;
  on_kick(s);
}

static void kick_schedule(osr_sock_t *s)
{
  if (s->_flags & OSR_SOCK_F_KICK)
    return;
  s->_flags |= OSR_SOCK_F_KICK;
  if (s->_flags & OSR_SOCK_F_KICK_QUEUED)
    return; /* a cancelled call is still queued: it serves */
  s->_flags |= OSR_SOCK_F_KICK_QUEUED;
  osr_call_defer(osr_timer_ctx(&s->_timer), kick_run, s, NULL, NULL);
}

static void on_kick(osr_sock_t *s)
{
  if ((s->_flags & (OSR_SOCK_F_CLOSING | OSR_SOCK_F_READING)) != OSR_SOCK_F_READING)
    return;
  if (s->_tls != NULL) {
    /* Decrypt what TLS held back while the input buffer was full. */
    int rv = osr__tls_on_raw(s);
    if (rv != 0) {
      read_failed(s, rv);
      return;
    }
  }
  int forced = (s->_flags & OSR_SOCK_F_KICK_FORCED) != 0;
  s->_flags &= ~OSR_SOCK_F_KICK_FORCED;
  if (s->input.len != 0 || forced)
    osr__sock_deliver(s, 0);
  sock_trim(s);
  if (s->_pending_err != 0 &&
      (s->_flags & (OSR_SOCK_F_CLOSING | OSR_SOCK_F_READING)) == OSR_SOCK_F_READING) {
    int err = s->_pending_err;
    s->_pending_err = 0;
    read_failed(s, err);
  }
}

void osr_sock_kick(osr_sock_t *s)
{
  if (s->_flags & OSR_SOCK_F_CLOSING)
    return;
  s->_flags |= OSR_SOCK_F_KICK_FORCED;
  kick_schedule(s);
}

int osr_sock_read_start(osr_sock_t *s)
{
  if (s->_flags & OSR_SOCK_F_CLOSING)
    return OSR_ECLOSED;
  s->_flags |= OSR_SOCK_F_READING;
  /* Buffered bytes (or bytes TLS holds) are delivered on the next
   * iteration, never re-entrantly from inside the caller. */
  if (s->input.len != 0 || (s->_tls != NULL && osr__tls_raw(s->_tls)->len != 0))
    kick_schedule(s);
  /* After EOF (already delivered) there is nothing more to read. */
  sock_update_reading(s);
  return 0;
}

void osr_sock_read_stop(osr_sock_t *s)
{
  s->_flags &= ~OSR_SOCK_F_READING;
  if (!(s->_flags & OSR_SOCK_F_HANDSHAKING))
    sock_update_reading(s);
}

int osr_sock_is_reading(const osr_sock_t *s)
{
  return (s->_flags & OSR_SOCK_F_READING) != 0;
}

/* ---- writing ------------------------------------------------------------- */

/* One write that completed at once (see _wdone_n), from the loop context's
 * deferred calls or osr_call_flush. */
static void wdone_one(void *obj, osr_fn_t fn, void *arg)
{
  osr_sock_t *s = obj;
  osr_sock_write_cb cb = (osr_sock_write_cb)fn;

  s->_wdone_n--;
  touch(s);
  if (cb != NULL) {
    cb_enter(s);
    cb(s, 0, arg);
    cb_leave(s);
  }
  /* The callback usually resumes reading (an HTTP/1.1 exchange is over):
   * deliver what is buffered (a pipelined request) now, in this turn, as
   * the socket's own kick would, instead of one poll later. Not when
   * flushed ahead of another event (wdone_run). */
  if (s->_wdone_n == 0 && (s->_flags & (OSR_SOCK_F_WFLUSH | OSR_SOCK_F_KICK)) == OSR_SOCK_F_KICK) {
    s->_flags &= ~OSR_SOCK_F_KICK; /* its queued call finds nothing to do */
    on_kick(s);
  }
}

/* Run the callbacks of writes that completed at once now, oldest first,
 * before a later event of the same socket (a queued write's completion, the
 * close) is reported. Called from top-level libuv callbacks only. */
static void wdone_run(osr_sock_t *s)
{
  if (s->_wdone_n == 0 && !(s->_flags & OSR_SOCK_F_KICK_QUEUED))
    return;
  s->_flags |= OSR_SOCK_F_WFLUSH;
  osr_call_flush(osr_timer_ctx(&s->_timer), s);
  s->_flags &= ~OSR_SOCK_F_WFLUSH;
}

static void on_uv_write(uv_write_t *req, int status)
{
  write_req_t *wr = osr_container_of(req, write_req_t, req);
  osr_sock_t *s = wr->sock;
  osr_sock_write_cb cb = wr->cb;
  void *arg = wr->arg;

  /* Writes that completed at once were issued before this one. */
  wdone_run(s);
  s->_write_queue -= wr->bytes;
  osr_free(wr); /* first: the callback usually writes again */
  if (status == 0)
    touch(s);
  if (cb != NULL) {
    cb_enter(s);
    cb(s, status == UV_ECANCELED ? OSR_ECANCELED : status, arg);
    cb_leave(s);
  }
}

int osr__sock_raw_write(osr_sock_t *s, const osr_iovec_t *bufs, size_t nbufs,
                        osr_sock_write_cb cb, void *arg)
{
  if (s->_flags & (OSR_SOCK_F_CLOSING | OSR_SOCK_F_SHUT))
    return OSR_ECLOSED;
  if (nbufs > UINT32_MAX)
    return OSR_EINVAL;

  size_t total = 0;
  for (size_t i = 0; i < nbufs; i++)
    total += bufs[i].len;

  /* Nothing queued: try the kernel first (most writes fit the socket
   * buffer). A partial write queues the rest below. */
  osr_iovec_t rest_inline[16];
  osr_iovec_t *rest = NULL;
  if (s->_write_queue == 0 && s->_wdone_n < UINT16_MAX &&
      uv_stream_get_write_queue_size(&s->_h.stream) == 0) {
    int n = uv_try_write(&s->_h.stream, (const uv_buf_t *)bufs, (unsigned)nbufs);
    if (n >= 0 && (size_t)n == total) {
      s->_wdone_n++;
      osr_call_defer(osr_timer_ctx(&s->_timer), wdone_one, s, (osr_fn_t)cb, arg);
      return 0;
    }
    if (n > 0) {
      size_t skip = (size_t)n, i = 0;
      while (skip >= bufs[i].len) {
        skip -= bufs[i].len;
        i++;
      }
      size_t left = nbufs - i;
      rest = left <= OSR_ARRAY_SIZE(rest_inline) ? rest_inline : osr_xmalloc(left * sizeof(*rest));
      memcpy(rest, bufs + i, left * sizeof(*rest));
      rest[0].base = (char *)rest[0].base + skip;
      rest[0].len -= skip;
      bufs = rest;
      nbufs = left;
      total -= (size_t)n;
    }
    /* Errors (EPIPE, ...) are reported the usual way, by uv_write. */
  }

  /* Only writes the kernel did not take whole get here (bulk transfers, a
   * full socket buffer), so a socket does not carry a request of its own. */
  write_req_t *wr = osr_xmalloc(sizeof(*wr));
  wr->sock = s;
  wr->cb = cb;
  wr->arg = arg;
  wr->bytes = total;
  /* uv_write copies the iovec array itself and splits at IOV_MAX. */
  int rv = uv_write(&wr->req, &s->_h.stream, (const uv_buf_t *)bufs, (unsigned)nbufs, on_uv_write);
  if (rest != NULL && rest != rest_inline)
    osr_free(rest);
  if (rv != 0) {
    osr_free(wr);
    return rv;
  }
  s->_write_queue += wr->bytes;
  return 0;
}

size_t osr_sock_try_write(osr_sock_t *s, const osr_iovec_t *bufs, size_t nbufs)
{
  if ((s->_flags & (OSR_SOCK_F_CLOSING | OSR_SOCK_F_SHUT)) || s->_tls != NULL ||
      s->_write_queue != 0 || nbufs > UINT32_MAX ||
      uv_stream_get_write_queue_size(&s->_h.stream) != 0)
    return 0;
  int n = uv_try_write(&s->_h.stream, (const uv_buf_t *)bufs, (unsigned)nbufs);
  if (n <= 0)
    return 0;
  touch(s);
  return (size_t)n;
}

int osr_sock_write(osr_sock_t *s, const osr_iovec_t *bufs, size_t nbufs, osr_sock_write_cb cb,
                   void *arg)
{
  if (s->_flags & OSR_SOCK_F_CLOSING)
    return OSR_ECLOSED;
  if (s->_tls != NULL)
    return osr__tls_write(s, bufs, nbufs, cb, arg);
  return osr__sock_raw_write(s, bufs, nbufs, cb, arg);
}

static void on_uv_shutdown(uv_shutdown_t *req, int status)
{
  shutdown_req_t *sr = osr_container_of(req, shutdown_req_t, req);
  osr_sock_t *s = sr->sock;
  if (sr->cb != NULL) {
    cb_enter(s);
    sr->cb(s, status == UV_ECANCELED ? OSR_ECANCELED : status, sr->arg);
    cb_leave(s);
  }
  osr_free(sr);
}

static int raw_shutdown(osr_sock_t *s, osr_sock_write_cb cb, void *arg)
{
  shutdown_req_t *sr = osr_xmalloc(sizeof(*sr));
  sr->sock = s;
  sr->cb = cb;
  sr->arg = arg;
  int rv = uv_shutdown(&sr->req, &s->_h.stream, on_uv_shutdown);
  if (rv != 0) {
    osr_free(sr);
    return rv;
  }
  s->_flags |= OSR_SOCK_F_SHUT;
  return 0;
}

typedef struct tls_shut_s {
  osr_sock_write_cb cb;
  void *arg;
} tls_shut_t;

static void on_close_notify_written(osr_sock_t *s, int status, void *arg)
{
  tls_shut_t *ts = arg;
  osr_sock_write_cb cb = ts->cb;
  void *cbarg = ts->arg;
  osr_free(ts);
  if (status == 0 && !(s->_flags & OSR_SOCK_F_CLOSING)) {
    status = raw_shutdown(s, cb, cbarg);
    if (status == 0)
      return;
  }
  if (cb != NULL)
    cb(s, status, cbarg);
}

int osr_sock_shutdown(osr_sock_t *s, osr_sock_write_cb cb, void *arg)
{
  if (s->_flags & (OSR_SOCK_F_CLOSING | OSR_SOCK_F_SHUT))
    return OSR_ECLOSED;
  if (s->_tls != NULL) {
    tls_shut_t *ts = osr_xmalloc(sizeof(*ts));
    ts->cb = cb;
    ts->arg = arg;
    int rv = osr__tls_shutdown(s, on_close_notify_written, ts);
    if (rv != 0)
      osr_free(ts);
    return rv;
  }
  return raw_shutdown(s, cb, arg);
}

/* ---- closing ------------------------------------------------------------- */

static void on_handle_closed(uv_handle_t *h)
{
  osr_sock_t *s = h->data;
  /* Written before the close and not yet reported (a queued uv_write
   * would have run them first, in on_uv_write): they succeeded. */
  wdone_run(s);
  if (s->_listener != NULL)
    osr__listener_forget(s->_listener, s);
  if (s->ev != NULL && s->ev->on_close != NULL)
    s->ev->on_close(s);
  if (s->_tls != NULL) {
    buf_trim(osr__tls_raw(s->_tls), 1);
    osr__tls_free(s->_tls);
  }
  s->_tls = NULL;
  buf_trim(&s->input, 1);
  /* Disarmed in do_close already; nothing re-arms a closing socket (and
   * wdone_run above ran the queued kick call, which found nothing to do). */
  osr_timer_stop(&s->_timer);
  osr_loopctx_release(osr_timer_ctx(&s->_timer));
  osr_free(s);
}

static void do_close(osr_sock_t *s)
{
  s->_flags &= ~OSR_SOCK_F_CLOSE_PENDING;
  osr_timer_stop(&s->_timer);
  s->_flags &= ~OSR_SOCK_F_KICK;
  uv_close(&s->_h.handle, on_handle_closed);
}

void osr_sock_close(osr_sock_t *s)
{
  if (s->_flags & OSR_SOCK_F_CLOSING)
    return;
  s->_flags |= OSR_SOCK_F_CLOSING;
  s->_flags &= ~OSR_SOCK_F_READING;
  /* Closing inside one of our own callbacks is deferred until it returns;
   * uv_close itself is safe, but the owner's frames above us may still touch
   * the socket. */
  if (s->_in_cb > 0) {
    s->_flags |= OSR_SOCK_F_CLOSE_PENDING;
    return;
  }
  do_close(s);
}

int osr_sock_is_closing(const osr_sock_t *s)
{
  return (s->_flags & OSR_SOCK_F_CLOSING) != 0;
}

/* ---- handshake and misc -------------------------------------------------- */

int osr__sock_start_tls(osr_sock_t *s, osr_tls_ctx_t *ctx, int is_server, const char *sni,
                        uint64_t timeout_ms, void (*cb)(osr_sock_t *s, int status))
{
  s->_flags |= OSR_SOCK_F_HANDSHAKING;
  s->_handshake_cb = cb;
  int rv = osr__tls_start(s, ctx, is_server, sni);
  if (rv == 0)
    rv = osr__sock_raw_read_start(s);
  if (rv != 0) {
    s->_flags &= ~OSR_SOCK_F_HANDSHAKING;
    s->_handshake_cb = NULL;
    return rv;
  }
  if (timeout_ms != 0 && (s->_flags & OSR_SOCK_F_HANDSHAKING))
    osr_timer_start(&s->_timer, on_idle_timer, timeout_ms);
  return 0;
}

void osr__sock_handshake_done(osr_sock_t *s, int status)
{
  void (*cb)(osr_sock_t *, int) = s->_handshake_cb;

  if (!(s->_flags & OSR_SOCK_F_HANDSHAKING))
    return;
  s->_flags &= ~OSR_SOCK_F_HANDSHAKING;
  s->_handshake_cb = NULL;
  osr_timer_stop(&s->_timer);
  touch(s); /* idle time counts from the end of the handshake */
  /* Reading continues only if the next owner asks for it. */
  sock_update_reading(s);
  if (cb != NULL) {
    cb_enter(s);
    cb(s, status);
    cb_leave(s);
  }
}

int osr_sock_set_nodelay(osr_sock_t *s, int enable)
{
  if (s->_flags & OSR_SOCK_F_IS_PIPE)
    return 0;
  return uv_tcp_nodelay(&s->_h.tcp, enable);
}

const char *osr_sock_alpn(const osr_sock_t *s)
{
  return s->_tls != NULL ? osr__tls_alpn(s->_tls) : NULL;
}

const char *osr_sock_sni(const osr_sock_t *s)
{
  return s->_tls != NULL ? osr__tls_sni(s->_tls) : NULL;
}

int osr_sock_peer(const osr_sock_t *s, osr_sock_peer_t *out)
{
  struct sockaddr_storage ss;
  int len = sizeof(ss);

  memset(out, 0, sizeof(*out));
  if (s->_flags & OSR_SOCK_F_IS_PIPE) {
    out->family = AF_UNIX;
    return 0;
  }
  int rv = uv_tcp_getpeername(&s->_h.tcp, (struct sockaddr *)&ss, &len);
  if (rv != 0)
    return rv;
  if (ss.ss_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
    out->family = AF_INET6;
    out->port = ntohs(a->sin6_port);
    memcpy(out->addr, &a->sin6_addr, 16);
  } else if (ss.ss_family == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
    out->family = AF_INET;
    out->port = ntohs(a->sin_port);
    memcpy(out->addr, &a->sin_addr, 4);
  }
  return 0;
}

/* Decimal digits of v at p (no NUL); returns the end. */
static char *put_u(char *p, unsigned v)
{
  char d[20];
  char *f = osr_fmt_u64(d, v);
  while (f < d + sizeof(d))
    *p++ = *f++;
  return p;
}

/* One IPv4 octet's digits at p; returns the end. */
static char *put_octet(char *p, unsigned v)
{
  if (v >= 100)
    *p++ = (char)('0' + v / 100);
  if (v >= 10)
    *p++ = (char)('0' + v / 10 % 10);
  *p++ = (char)('0' + v % 10);
  return p;
}

void osr_sock_peer_format(const osr_sock_peer_t *p, char *out, size_t outlen)
{
  /* Longest: "[" 45-byte IPv6 text "]:" 5 digits, NUL. Written straight
   * into `out` when it has room (the per-request case), else truncated
   * from a local copy. */
  char tmp[64];
  char *buf = outlen >= sizeof(tmp) ? out : tmp;
  char *e = buf;

  if (p->family == AF_INET) {
    for (int i = 0; i < 4; i++) {
      e = put_octet(e, p->addr[i]);
      *e++ = i < 3 ? '.' : ':';
    }
    e = put_u(e, p->port);
  } else if (p->family == AF_INET6) {
    struct sockaddr_in6 a;
    memset(&a, 0, sizeof(a));
    a.sin6_family = AF_INET6;
    memcpy(&a.sin6_addr, p->addr, 16);
    *e++ = '[';
    if (uv_ip6_name(&a, e, sizeof(tmp) - 10) != 0)
      *e = '\0';
    e += strlen(e);
    *e++ = ']';
    *e++ = ':';
    e = put_u(e, p->port);
  } else {
    const char *w = p->family == AF_UNIX ? "unix" : "unknown";
    size_t n = strlen(w);
    memcpy(e, w, n);
    e += n;
  }
  size_t n = (size_t)(e - buf);
  if (buf == out) {
    out[n] = '\0';
    return;
  }
  if (n >= outlen)
    n = outlen - 1;
  memcpy(out, buf, n);
  out[n] = '\0';
}

int osr_sock_peername(const osr_sock_t *s, char *out, size_t outlen)
{
  osr_sock_peer_t p;
  int rv = osr_sock_peer(s, &p);
  if (rv != 0)
    return rv;
  osr_sock_peer_format(&p, out, outlen);
  return 0;
}
