/*
 * Bounded output history (see ring.h).
 */
#include "agent/ring.h"

#include <string.h>

#include "util/mem.h"

void osr_ring_init(osr_ring_t *r, size_t cap, size_t max_segs)
{
  memset(r, 0, sizeof(*r));
  r->cap = cap > 0 ? cap : 1;
  r->buf = osr_xmalloc(r->cap);
  r->_max_segs = max_segs >= 2 ? max_segs : 2;
  r->_segs = osr_xmalloc(r->_max_segs * sizeof(*r->_segs));
}

void osr_ring_dispose(osr_ring_t *r)
{
  osr_freep(&r->buf);
  osr_freep(&r->_segs);
  r->_nsegs = 0;
}

static osr_ring_seg_t *seg_at(const osr_ring_t *r, size_t i)
{
  return &r->_segs[(r->_seg_head + i) % r->_max_segs];
}

/* Drop bytes before `off` and the segments that lie wholly before it. */
static void evict_to(osr_ring_t *r, uint64_t off)
{
  if (off <= r->start)
    return;
  r->start = off;
  /* The first segment covering `start` must stay; drop those whose
   * successor also starts at or before `start`. */
  while (r->_nsegs >= 2 && seg_at(r, 1)->off <= r->start) {
    r->_seg_head = (r->_seg_head + 1) % r->_max_segs;
    r->_nsegs--;
  }
}

/* Account n (<= cap) new bytes of `kind` at r->end: a segment if the
 * stream changed, and eviction of what they overwrite. The bytes themselves
 * are the caller's to place. */
static void account(osr_ring_t *r, int kind, size_t n)
{
  if (r->_nsegs == 0 || seg_at(r, r->_nsegs - 1)->kind != kind) {
    if (r->_nsegs == r->_max_segs) {
      /* Full segment table: evict the oldest segment's bytes entirely. */
      uint64_t next = seg_at(r, 1)->off;
      r->_seg_head = (r->_seg_head + 1) % r->_max_segs;
      r->_nsegs--;
      if (next > r->start)
        r->start = next;
    }
    osr_ring_seg_t *s = seg_at(r, r->_nsegs);
    s->off = r->end;
    s->kind = kind;
    r->_nsegs++;
  }
  if (r->end + n - r->start > r->cap)
    evict_to(r, r->end + n - r->cap);
}

void osr_ring_append(osr_ring_t *r, int kind, const void *data, size_t n)
{
  const char *p = data;
  if (n == 0)
    return;
  if (n > r->cap) {
    /* Only the newest cap bytes can be kept; the rest still count. */
    size_t skip = n - r->cap;
    r->end += skip;
    evict_to(r, r->end);
    p += skip;
    n = r->cap;
  }
  account(r, kind, n);
  /* Copy, possibly in two pieces around the wrap. */
  size_t pos = (size_t)(r->end % r->cap);
  size_t first = r->cap - pos < n ? r->cap - pos : n;
  memcpy(r->buf + pos, p, first);
  if (n > first)
    memcpy(r->buf, p + first, n - first);
  r->end += n;
}

char *osr_ring_tail(const osr_ring_t *r, size_t *len)
{
  size_t pos = (size_t)(r->end % r->cap);
  *len = r->cap - pos;
  return r->buf + pos;
}

void osr_ring_commit(osr_ring_t *r, int kind, size_t n)
{
  size_t len;
  (void)osr_ring_tail(r, &len);
  if (n == 0 || n > len)
    return;
  account(r, kind, n);
  r->end += n;
}

size_t osr_ring_room(const osr_ring_t *r, uint64_t keep_from)
{
  if (keep_from < r->start)
    keep_from = r->start;
  if (keep_from > r->end)
    keep_from = r->end;
  return r->cap - (size_t)(r->end - keep_from);
}

long osr_ring_peek(const osr_ring_t *r, uint64_t off, size_t max, int *kind, osr_iovec_t iov[2])
{
  iov[0] = osr_iov(NULL, 0);
  iov[1] = osr_iov(NULL, 0);
  if (off < r->start || off > r->end)
    return -1;
  if (off == r->end || max == 0)
    return 0;
  /* Find the segment holding `off` and where it ends. Segments are few
   * (one per stream switch), scanned from the newest. */
  size_t i = r->_nsegs;
  while (i > 1 && seg_at(r, i - 1)->off > off)
    i--;
  const osr_ring_seg_t *s = seg_at(r, i - 1);
  uint64_t seg_end = i < r->_nsegs ? seg_at(r, i)->off : r->end;
  *kind = s->kind;
  uint64_t n = seg_end - off;
  if (n > max)
    n = max;
  size_t pos = (size_t)(off % r->cap);
  size_t first = r->cap - pos < n ? r->cap - pos : (size_t)n;
  iov[0] = osr_iov(r->buf + pos, first);
  if (n > first)
    iov[1] = osr_iov(r->buf, (size_t)n - first);
  return (long)n;
}
