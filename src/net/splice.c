#include "net/splice.h"

#include "util/mem.h"

typedef struct side_s {
  osr_splice_t *sp;
  osr_sock_t *s;
  size_t inflight; /* bytes of s->input being written to the other side */
  int eof;         /* s read EOF */
  int shut;        /* the other side's write half was shut down */
} side_t;

struct osr_splice_s {
  side_t a, b;
  int refs; /* open sockets + a pending attach */
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

void osr_splice_close(osr_splice_t *sp)
{
  sp->dead = 1;
  if (sp->a.s != NULL)
    osr_sock_close(sp->a.s);
  if (sp->b.s != NULL)
    osr_sock_close(sp->b.s);
}

static void unref(osr_splice_t *sp)
{
  if (--sp->refs > 0)
    return;
  sp->on_close(sp, sp->data);
  osr_free(sp);
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

static void on_forwarded(osr_sock_t *dst, int status, void *arg)
{
  side_t *sd = arg;
  (void)dst;
  if (status != 0 || sd->s == NULL) {
    osr_splice_close(sd->sp);
    return;
  }
  osr_buf_consume(&sd->s->input, sd->inflight);
  sd->inflight = 0;
  if (sd->eof && sd->s->input.len == 0)
    propagate_eof(sd);
  else
    osr_sock_read_start(sd->s); /* what is left, then new bytes */
}

static void side_on_read(osr_sock_t *s, int status)
{
  side_t *sd = s->data;
  side_t *pd = peer_of(sd);
  if (sd->sp->dead)
    return;
  if (status < 0 && status != OSR_EOF) {
    osr_splice_close(sd->sp);
    return;
  }
  if (status == OSR_EOF)
    sd->eof = 1;
  if (sd->inflight == 0 && s->input.len > 0 && pd->s != NULL) {
    /* Write from the input buffer itself; it does not move while reading
     * is stopped, and the bytes are consumed in on_forwarded. */
    osr_iovec_t iov = osr_iov(osr_buf_data(&s->input), s->input.len);
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

osr_splice_t *osr_splice_new(osr_sock_t *b, osr_splice_close_cb on_close, void *data)
{
  osr_splice_t *sp = osr_xcalloc(1, sizeof(*sp));
  sp->a.sp = sp->b.sp = sp;
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
  osr_sock_read_start(a); /* bytes the peer sent right after its request too */
  if (sp->b.s != NULL)
    osr_sock_read_start(sp->b.s);
}
