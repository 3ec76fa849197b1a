/*
 * Two-way raw relay (splice.h). Each direction starts on the copy path:
 * libuv reads into the source socket's input buffer and the same bytes are
 * written to the other side (no copy in user space, one chunk in flight).
 *
 * A direction that turns out to carry bulk data (OSR_SPLICE_AFTER bytes
 * relayed) and joins two cleartext sockets switches to splice(2) through a
 * pipe: the bytes then never enter user space at all, each wake-up moves up
 * to a pipe's worth (pipe_sizes) with two system calls, and the
 * read-stop/read-start round per chunk of the copy path disappears. Small
 * exchanges (a request/response tunnel, an idle WebSocket) never switch, so
 * they pay no pipe, no extra descriptors and no extra kernel memory; the
 * benchmark (bench/dataplane_bench.py, OSR_SPLICE=0 for the copy path only)
 * shows where it pays.
 *
 * Spliced direction src -> dst:
 *   - libuv reading on src stops for good (the switch happens in the write
 *     callback of the copy path, with src->input empty, so no byte is left
 *     behind and ordering holds: only this direction writes to dst and its
 *     last write has completed);
 *   - readiness comes from a uv_poll_t on a dup() of each socket's
 *     descriptor: epoll keys registrations by descriptor, and libuv allows
 *     one watcher per descriptor, so polling the dup never disturbs the
 *     uv_stream that still writes the other direction;
 *   - pump: pipe -> dst first, then src -> pipe while the pipe is empty;
 *     EAGAIN on dst waits for dst writable with src unpolled (backpressure:
 *     at most one pipe of bytes per direction, held by the kernel);
 *   - EOF (splice returns 0) with an empty pipe is propagated as before
 *     (shutdown of dst's write side).
 * The dups keep the sockets' file descriptions open, so they are closed
 * (after their poll handles) whenever the splice closes.
 *
 * The one-way transfer (osr_splice_xfer_t, the data plane's response
 * bodies) is the same pump bounded to a byte count: pipe_pump() serves
 * both, with a poll on a dup of each socket. It starts on the splice path
 * at once (its caller decided the body is bulk) and owns neither socket.
 */
#include "net/splice.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/mem.h"

/* Bytes relayed on the copy path before a direction may switch to
 * splice(2): below this an exchange is not bulk and a pipe does not pay. */
#define OSR_SPLICE_AFTER (256 * 1024)
/* Pipe sizes asked for (F_SETPIPE_SZ), largest first: a bigger pipe moves
 * more per splice(2) pair and wake-up. 1 MiB is fs/pipe-max-size's default;
 * an unprivileged process over its pipe-user-pages-soft gets EPERM and falls
 * back to the next size, then keeps the size the pipe has. */
static const int pipe_sizes[] = {1024 * 1024, 256 * 1024};
/* Fairness (STYLE 17): bytes one direction moves per wake-up. */
#define OSR_SPLICE_BURST (1024 * 1024)

/* One direction's pipe, for the relay and the one-way transfer alike. */
typedef struct spipe_s {
  int pfd[2];    /* [0] read end, [1] write end; -1 when closed */
  size_t piped;  /* bytes in the pipe */
  int eof;       /* the source read EOF */
  uint64_t left; /* bytes still to take from the source (UINT64_MAX: no bound) */
  size_t cap;    /* the pipe's size */
} spipe_t;

typedef struct side_s {
  osr_splice_t *sp;
  osr_sock_t *s;
  size_t inflight; /* bytes of s->input being written to the other side */
  int eof;         /* s read EOF */
  int shut;        /* the other side's write half was shut down */
  uint64_t copied; /* bytes relayed on the copy path (s -> peer) */
  /* splice(2) path for s -> peer (spliced = 1) */
  int spliced;
  spipe_t pipe;
  int want_out; /* the peer answered EAGAIN: wait for it to be writable */
  /* readiness of s's descriptor (either direction may need it) */
  int dupfd;   /* dup of s's descriptor, polled by `poll`; -1 if none */
  int polling; /* `poll` initialised (it holds a reference) */
  int pev;     /* events `poll` is started with */
  uv_poll_t poll;
} side_t;

struct osr_splice_s {
  side_t a, b;
  int refs; /* open sockets + poll handles + a pending attach */
  int dead;
  osr_splice_close_cb on_close;
  void *data;
};

static void side_on_read(osr_sock_t *s, int status);
static void side_on_close(osr_sock_t *s);
static const osr_sock_events_t side_events = {side_on_read, side_on_close, NULL, NULL};

static side_t *peer_of(side_t *sd)
{
  return sd == &sd->sp->a ? &sd->sp->b : &sd->sp->a;
}

/* OSR_SPLICE=0 in the environment keeps every relay on the copy path (for
 * the with/without benchmark). Read once. */
static int splice_enabled(void)
{
  static int enabled = -1;
  if (enabled < 0) {
    const char *e = getenv("OSR_SPLICE");
    enabled = !(e != NULL && strcmp(e, "0") == 0);
  }
  return enabled;
}

static void unref(osr_splice_t *sp)
{
  if (--sp->refs > 0)
    return;
  sp->on_close(sp, sp->data);
  osr_free(sp);
}

static void on_poll_closed(uv_handle_t *h)
{
  side_t *sd = h->data;
  close(sd->dupfd);
  sd->dupfd = -1;
  unref(sd->sp);
}

static void pipe_close(spipe_t *pp);

static void side_release_splice(side_t *sd)
{
  pipe_close(&sd->pipe);
  if (sd->polling) {
    sd->polling = 0;
    uv_close((uv_handle_t *)&sd->poll, on_poll_closed);
  }
}

void osr_splice_close(osr_splice_t *sp)
{
  sp->dead = 1;
  side_release_splice(&sp->a);
  side_release_splice(&sp->b);
  if (sp->a.s != NULL)
    osr_sock_close(sp->a.s);
  if (sp->b.s != NULL)
    osr_sock_close(sp->b.s);
}

static void side_on_close(osr_sock_t *s)
{
  side_t *sd = s->data;
  osr_splice_t *sp = sd->sp;
  sd->s = NULL;
  osr_splice_close(sp);
  unref(sp);
}

static void on_shut(osr_sock_t *s, int status, void *arg)
{
  side_t *sd = arg; /* the side whose EOF was propagated */
  (void)s;
  if (status != 0 || (sd->shut && peer_of(sd)->shut))
    osr_splice_close(sd->sp); /* failed, or both directions are over */
}

static void propagate_eof(side_t *sd)
{
  side_t *pd = peer_of(sd);
  if (sd->shut || pd->s == NULL)
    return;
  sd->shut = 1;
  if (osr_sock_shutdown(pd->s, on_shut, sd) != 0)
    osr_splice_close(sd->sp);
}

/* ---- splice(2) path ---------------------------------------------------------- */

static void on_poll(uv_poll_t *h, int status, int events);

/* A poll handle on a dup of s's descriptor (*dupfd). 0 or an error, with
 * nothing left open. */
static int poll_open(osr_sock_t *s, uv_poll_t *poll, int *dupfd)
{
  int fd;
  /* The socket's own handle (a net/ sibling may look): uv_fileno is the
   * only way to its descriptor. */
  if (uv_fileno(&s->_h.handle, &fd) != 0)
    return OSR_EINVAL;
  *dupfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (*dupfd < 0)
    return -errno;
  if (uv_poll_init(s->loop, poll, *dupfd) != 0) {
    close(*dupfd);
    *dupfd = -1;
    return OSR_EINVAL;
  }
  return 0;
}

/* Stop libuv reading s for good (until osr_sock_read_start): the poll on
 * the dup reads now. osr_sock_read_stop() alone is a lazy pause (net/sock.c
 * leaves libuv reading into the input buffer's free tail, which a pooled
 * read block may provide), and a byte libuv read then would be taken out of
 * the middle of the spliced stream and never relayed. */
static void stop_reading(osr_sock_t *s)
{
  osr_sock_read_stop(s);
  if (s->_flags & OSR_SOCK_F_UV_READING) {
    uv_read_stop(&s->_h.stream);
    s->_flags &= ~OSR_SOCK_F_UV_READING;
  }
}

/* Start polling sd's descriptor (through a dup). Returns 0 or an error. */
static int ensure_poll(side_t *sd)
{
  if (sd->polling)
    return 0;
  int rv = poll_open(sd->s, &sd->poll, &sd->dupfd);
  if (rv != 0)
    return rv;
  sd->poll.data = sd;
  sd->polling = 1;
  sd->pev = 0;
  sd->sp->refs++; /* released in on_poll_closed */
  return 0;
}

/* Poll what the spliced directions through sd's descriptor wait for:
 * readable when sd -> peer may take more input, writable when the peer's
 * pipe waits for sd. */
static void update_poll(side_t *sd)
{
  if (!sd->polling)
    return;
  side_t *pd = peer_of(sd);
  int ev = 0;
  if (sd->spliced && !sd->pipe.eof && sd->pipe.piped == 0)
    ev |= UV_READABLE;
  if (pd->spliced && pd->want_out)
    ev |= UV_WRITABLE;
  if (ev == sd->pev)
    return;
  sd->pev = ev;
  if (ev == 0)
    uv_poll_stop(&sd->poll);
  else if (uv_poll_start(&sd->poll, ev, on_poll) != 0)
    osr_splice_close(sd->sp);
}

/* Outcome of one pump of a pipe (pipe_pump). */
enum { PUMP_IN, PUMP_OUT, PUMP_BURST, PUMP_EOF, PUMP_DONE, PUMP_ERR };

/* Move bytes src -> pipe -> dst until EAGAIN (PUMP_IN: wait for src
 * readable; PUMP_OUT: for dst writable, src is not read meanwhile), the
 * burst cap (PUMP_BURST, STYLE 17), src's EOF with the pipe drained
 * (PUMP_EOF), `left` bytes moved (PUMP_DONE) or an error (PUMP_ERR, errno
 * set). `left` bounds what is taken from src (UINT64_MAX: unbounded); at
 * most one pipe of bytes is ever in flight. Shared by the relay and the
 * one-way transfer. */
static int pipe_pump(spipe_t *pp, int srcfd, int dstfd)
{
  size_t moved = 0;
  while (moved < OSR_SPLICE_BURST) {
    if (pp->piped > 0) {
      ssize_t n =
          splice(pp->pfd[0], NULL, dstfd, NULL, pp->piped, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (n > 0) {
        pp->piped -= (size_t)n;
        moved += (size_t)n;
        continue;
      }
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0 && errno == EAGAIN)
        return PUMP_OUT;
      if (n == 0)
        errno = EPIPE;
      return PUMP_ERR;
    }
    if (pp->left == 0)
      return PUMP_DONE;
    if (pp->eof)
      return PUMP_EOF;
    size_t want = pp->left < pp->cap ? (size_t)pp->left : pp->cap;
    ssize_t n = splice(srcfd, NULL, pp->pfd[1], NULL, want, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (n > 0) {
      pp->piped = (size_t)n;
      if (pp->left != UINT64_MAX)
        pp->left -= (uint64_t)n;
      continue;
    }
    if (n == 0) {
      pp->eof = 1;
      continue;
    }
    if (errno == EINTR)
      continue;
    if (errno == EAGAIN)
      return PUMP_IN;
    return PUMP_ERR;
  }
  /* The cap can stop us with bytes still in the pipe (a partial splice to
   * dst took us over it): then the caller waits for dst writable, or
   * nothing would wake this direction again (src is polled only with an
   * empty pipe; the stall fixed in 4e571fe). Level-triggered epoll fires at
   * once if it is. With an empty pipe src stays polled and wakes us on the
   * next loop turn if more is waiting. */
  return pp->piped > 0 ? PUMP_OUT : PUMP_BURST;
}

/* A pipe for one direction: 0 or -errno. */
static int pipe_open(spipe_t *pp, uint64_t left)
{
  memset(pp, 0, sizeof(*pp));
  pp->left = left;
  if (pipe2(pp->pfd, O_NONBLOCK | O_CLOEXEC) != 0) {
    pp->pfd[0] = pp->pfd[1] = -1;
    return -errno;
  }
  int got = -1;
  for (size_t i = 0; got <= 0 && i < sizeof(pipe_sizes) / sizeof(pipe_sizes[0]); i++)
    got = fcntl(pp->pfd[1], F_SETPIPE_SZ, pipe_sizes[i]);
  if (got <= 0) /* refused: the size it has (a user over its soft limit gets 8 KiB) */
    got = fcntl(pp->pfd[1], F_GETPIPE_SZ);
  pp->cap = got > 0 ? (size_t)got : 64 * 1024;
  return 0;
}

static void pipe_close(spipe_t *pp)
{
  if (pp->pfd[0] >= 0) {
    close(pp->pfd[0]);
    close(pp->pfd[1]);
    pp->pfd[0] = pp->pfd[1] = -1;
  }
}

/* Move bytes sd -> peer until EAGAIN, EOF, an error or the burst cap. */
static void pump(side_t *sd)
{
  side_t *pd = peer_of(sd);
  int r = pipe_pump(&sd->pipe, sd->dupfd, pd->dupfd);
  sd->want_out = r == PUMP_OUT; /* sd stays unpolled for reading: backpressure */
  if (r == PUMP_ERR) {
    osr_splice_close(sd->sp);
    return;
  }
  if (r == PUMP_EOF)
    propagate_eof(sd);
  if (sd->sp->dead)
    return;
  update_poll(sd);
  update_poll(pd);
}

static void on_poll(uv_poll_t *h, int status, int events)
{
  side_t *sd = h->data;
  osr_splice_t *sp = sd->sp;
  if (sp->dead)
    return;
  if (status < 0) {
    osr_splice_close(sp);
    return;
  }
  side_t *pd = peer_of(sd);
  if ((events & UV_WRITABLE) && pd->spliced)
    pump(pd); /* the peer's pipe drains into sd */
  if (!sp->dead && (events & (UV_READABLE | UV_DISCONNECT)) && sd->spliced)
    pump(sd);
}

/* May sd -> peer leave the copy path now? Only between chunks (nothing in
 * flight, nothing buffered), for cleartext sockets, once it carried bulk. */
static int should_splice(const side_t *sd)
{
  const side_t *pd = peer_of((side_t *)sd);
  return sd->copied >= OSR_SPLICE_AFTER && !sd->eof && sd->inflight == 0 && sd->s->input.len == 0 &&
         pd->s != NULL && !osr_sock_is_tls(sd->s) && !osr_sock_is_tls(pd->s) &&
         osr_sock_write_queue_size(pd->s) == 0 && splice_enabled();
}

/* Switch sd -> peer to splice(2). Returns 0, or an error with the copy path
 * left as it was. */
static int start_splice(side_t *sd)
{
  side_t *pd = peer_of(sd);
  int rv = pipe_open(&sd->pipe, UINT64_MAX);
  if (rv != 0)
    return rv;
  if (ensure_poll(sd) != 0 || ensure_poll(pd) != 0) {
    pipe_close(&sd->pipe);
    return OSR_EINVAL; /* a poll already set up is released at close */
  }
  sd->spliced = 1;
  stop_reading(sd->s); /* for good */
  update_poll(sd);
  return 0;
}

/* ---- copy path ------------------------------------------------------------------ */

/* A relay spends most of its life idle (a WebSocket, a pooled tunnel) and a
 * direction consumes its input only when the forwarding write completes,
 * after the read that net/sock.c trims at; so give the empty buffer back
 * here too: an idle relay holds none (the idle WebSocket row of the
 * benchmark). */
static void trim_input(osr_sock_t *s)
{
  if (s != NULL)
    osr__sock_trim_input(s);
}

static void on_forwarded(osr_sock_t *dst, int status, void *arg)
{
  side_t *sd = arg;
  (void)dst;
  if (status != 0 || sd->s == NULL) {
    osr_splice_close(sd->sp);
    return;
  }
  osr_buf_consume(&sd->s->input, sd->inflight);
  sd->copied += sd->inflight;
  sd->inflight = 0;
  trim_input(sd->s);
  if (sd->eof && sd->s->input.len == 0)
    propagate_eof(sd);
  else if (!should_splice(sd) || start_splice(sd) != 0)
    osr_sock_read_start(sd->s); /* what is left, then new bytes */
}

static void side_on_read(osr_sock_t *s, int status)
{
  side_t *sd = s->data;
  side_t *pd = peer_of(sd);
  if (sd->sp->dead || sd->spliced)
    return;
  if (status < 0 && status != OSR_EOF) {
    osr_splice_close(sd->sp);
    return;
  }
  if (status == OSR_EOF)
    sd->eof = 1;
  if (sd->inflight == 0 && s->input.len > 0 && pd->s != NULL) {
    osr_iovec_t iov = osr_iov(osr_buf_data(&s->input), s->input.len);
    if (sd->copied + iov.len < OSR_SPLICE_AFTER) {
      /* A message (a WebSocket frame, a small response) usually fits the
       * peer's socket buffer: written now, consumed now, reading goes on,
       * no deferred completion and no read stop/start. Near the splice
       * switch the deferred path below decides as before. */
      size_t n = osr_sock_try_write(pd->s, &iov, 1);
      osr_buf_consume(&s->input, n);
      sd->copied += n;
      if (n == iov.len) {
        if (sd->eof)
          propagate_eof(sd);
        return;
      }
      iov = osr_iov(osr_buf_data(&s->input), s->input.len);
    }
    /* Write from the input buffer itself; it does not move while reading
     * is stopped, and the bytes are consumed in on_forwarded. */
    sd->inflight = iov.len;
    osr_sock_read_stop(s);
    if (osr_sock_write(pd->s, &iov, 1, on_forwarded, sd) != 0) {
      sd->inflight = 0;
      osr_splice_close(sd->sp);
    }
    return;
  }
  if (sd->eof && sd->inflight == 0)
    propagate_eof(sd);
}

static void side_init(osr_splice_t *sp, side_t *sd)
{
  sd->sp = sp;
  sd->pipe.pfd[0] = sd->pipe.pfd[1] = -1;
  sd->dupfd = -1;
}

osr_splice_t *osr_splice_new(osr_sock_t *b, osr_splice_close_cb on_close, void *data)
{
  osr_splice_t *sp = osr_xcalloc(1, sizeof(*sp));
  side_init(sp, &sp->a);
  side_init(sp, &sp->b);
  sp->b.s = b;
  sp->refs = 2; /* b + the pending attach */
  sp->on_close = on_close;
  sp->data = data;
  osr_sock_read_stop(b);
  osr_sock_set_events(b, &side_events, &sp->b);
  osr_sock_set_idle_timeout(b, 0);
  return sp;
}

void osr_splice_attach(osr_sock_t *a, int status, void *arg)
{
  osr_splice_t *sp = arg;
  if (status != 0 || a == NULL) {
    osr_splice_close(sp);
    unref(sp); /* the pending attach's reference */
    return;
  }
  /* The pending attach's reference becomes the socket's. */
  sp->a.s = a;
  osr_sock_set_events(a, &side_events, &sp->a);
  osr_sock_set_idle_timeout(a, 0);
  if (sp->dead) {
    osr_sock_close(a);
    return;
  }
  trim_input(a);
  trim_input(sp->b.s);
  osr_sock_read_start(a); /* bytes the peer sent right after its request too */
  if (sp->b.s != NULL)
    osr_sock_read_start(sp->b.s);
}

/* ---- one-way transfer --------------------------------------------------------- */

struct osr_splice_xfer_s {
  osr_sock_t *src, *dst;
  spipe_t pipe;
  uv_poll_t pin, pout; /* readiness of src (readable), dst (writable) */
  int infd, outfd;     /* the dups they poll */
  int inev, outev;     /* events they are started with */
  int handles;         /* poll handles open (the transfer is freed at 0) */
  int over;            /* finished or cancelled: no callback any more */
  osr_splice_xfer_cb cb;
  void *data;
};

static void xfer_on_closed(uv_handle_t *h)
{
  osr_splice_xfer_t *x = h->data;
  if (h == (uv_handle_t *)&x->pin) {
    close(x->infd);
    x->infd = -1;
  } else {
    close(x->outfd);
    x->outfd = -1;
  }
  if (--x->handles == 0)
    osr_free(x);
}

/* Stop for good and free once the handles closed (never inside their own
 * callback: STYLE 19, 20). */
static void xfer_release(osr_splice_xfer_t *x)
{
  x->over = 1;
  pipe_close(&x->pipe);
  uv_close((uv_handle_t *)&x->pin, xfer_on_closed);
  uv_close((uv_handle_t *)&x->pout, xfer_on_closed);
}

static void xfer_finish(osr_splice_xfer_t *x, int status)
{
  x->over = 1;
  x->cb(x, status, x->data);
  xfer_release(x);
}

static void xfer_on_poll(uv_poll_t *h, int status, int events);

static int xfer_set(uv_poll_t *h, int *cur, int ev)
{
  if (ev == *cur)
    return 0;
  *cur = ev;
  if (ev == 0)
    return uv_poll_stop(h);
  return uv_poll_start(h, ev, xfer_on_poll);
}

static void xfer_on_poll(uv_poll_t *h, int status, int events)
{
  osr_splice_xfer_t *x = h->data;
  (void)events;
  if (x->over)
    return;
  if (status < 0) {
    xfer_finish(x, status);
    return;
  }
  int r = pipe_pump(&x->pipe, x->infd, x->outfd);
  /* Bytes moved past libuv are activity: a slow but moving reader must not
   * look idle to either socket's idle timer (net/sock.c checks the time of
   * the last activity when its timer fires). */
  uint64_t now = uv_now(h->loop);
  x->src->_last_active = now;
  x->dst->_last_active = now;
  if (r == PUMP_DONE) {
    xfer_finish(x, 0);
    return;
  }
  if (r == PUMP_EOF || r == PUMP_ERR) {
    xfer_finish(x, r == PUMP_EOF ? OSR_EPROTO : -errno);
    return;
  }
  /* Backpressure: src is polled only while the pipe is empty. */
  int rv = xfer_set(&x->pin, &x->inev, r == PUMP_OUT ? 0 : UV_READABLE);
  if (rv == 0)
    rv = xfer_set(&x->pout, &x->outev, r == PUMP_OUT ? UV_WRITABLE : 0);
  if (rv != 0)
    xfer_finish(x, rv);
}

int osr_splice_is_enabled(void)
{
  return splice_enabled();
}

int osr_splice_xfer_start(osr_sock_t *src, osr_sock_t *dst, uint64_t len, osr_splice_xfer_cb cb,
                          void *data, osr_splice_xfer_t **out)
{
  if (len == 0 || osr_sock_is_tls(src) || osr_sock_is_tls(dst) || src->input.len != 0 ||
      osr_sock_write_queue_size(dst) != 0 || !splice_enabled())
    return OSR_EINVAL;
  osr_splice_xfer_t *x = osr_xcalloc(1, sizeof(*x));
  x->src = src;
  x->dst = dst;
  x->cb = cb;
  x->data = data;
  x->infd = x->outfd = -1;
  int rv = pipe_open(&x->pipe, len);
  if (rv != 0) {
    osr_free(x);
    return rv;
  }
  rv = poll_open(src, &x->pin, &x->infd);
  if (rv != 0) {
    pipe_close(&x->pipe);
    osr_free(x);
    return rv;
  }
  x->pin.data = x;
  x->handles = 1;
  rv = poll_open(dst, &x->pout, &x->outfd);
  if (rv == 0) {
    x->pout.data = x;
    x->handles = 2;
    rv = xfer_set(&x->pin, &x->inev, UV_READABLE);
  }
  if (rv != 0) {
    x->over = 1;
    pipe_close(&x->pipe);
    uv_close((uv_handle_t *)&x->pin, xfer_on_closed);
    if (x->handles == 2)
      uv_close((uv_handle_t *)&x->pout, xfer_on_closed);
    return rv;
  }
  stop_reading(src);
  *out = x;
  return 0;
}

void osr_splice_xfer_cancel(osr_splice_xfer_t *x)
{
  if (!x->over)
    xfer_release(x);
}
