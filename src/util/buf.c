#include "util/buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "util/mem.h"

#define BUF_MIN_ALLOC 4096

void osr_buf_init(osr_buf_t *b, size_t max)
{
  b->base = NULL;
  b->cap = 0;
  b->off = 0;
  b->len = 0;
  b->max = max;
}

void osr_buf_dispose(osr_buf_t *b)
{
  osr_freep(&b->base);
  b->cap = 0;
  b->off = 0;
  b->len = 0;
}

int osr_buf_reserve(osr_buf_t *b, size_t min, osr_iovec_t *tail)
{
  if (b->len > b->max || min > b->max - b->len)
    return OSR_ETOOLARGE;

  if (b->cap - b->off - b->len < min) {
    /* Compact before growing: consumed bytes at the front are free space. */
    if (b->off != 0) {
      memmove(b->base, b->base + b->off, b->len);
      b->off = 0;
    }
    if (b->cap - b->len < min) {
      size_t want = b->cap ? b->cap : BUF_MIN_ALLOC;
      while (want < b->len + min)
        want = want > SIZE_MAX / 2 ? SIZE_MAX : want * 2;
      if (want > b->max)
        want = b->max;
      char *p = osr_try_realloc(b->base, want);
      if (p == NULL)
        return OSR_ENOMEM;
      b->base = p;
      b->cap = want;
    }
  }
  if (tail != NULL) {
    tail->base = b->base + b->off + b->len;
    tail->len = b->cap - b->off - b->len;
  }
  return 0;
}

void osr_buf_commit(osr_buf_t *b, size_t n)
{
  b->len += n;
}

void osr_buf_consume(osr_buf_t *b, size_t n)
{
  b->off += n;
  b->len -= n;
  if (b->len == 0)
    b->off = 0;
}

int osr_buf_append(osr_buf_t *b, const void *p, size_t len)
{
  osr_iovec_t tail;
  int rv = osr_buf_reserve(b, len, &tail);
  if (rv != 0)
    return rv;
  if (len != 0)
    memcpy(tail.base, p, len);
  osr_buf_commit(b, len);
  return 0;
}

int osr_buf_appendf(osr_buf_t *b, const char *fmt, ...)
{
  va_list ap;
  char small[256];

  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof(small), fmt, ap);
  va_end(ap);
  if (n < 0)
    return OSR_EINVAL;
  if ((size_t)n < sizeof(small))
    return osr_buf_append(b, small, (size_t)n);

  osr_iovec_t tail;
  int rv = osr_buf_reserve(b, (size_t)n + 1, &tail);
  if (rv != 0)
    return rv;
  va_start(ap, fmt);
  vsnprintf(tail.base, (size_t)n + 1, fmt, ap);
  va_end(ap);
  osr_buf_commit(b, (size_t)n);
  return 0;
}

char *osr_buf_release(osr_buf_t *b, size_t *len)
{
  char *p;
  if (b->off != 0 && b->len != 0)
    memmove(b->base, b->base + b->off, b->len);
  p = b->base;
  if (len != NULL)
    *len = b->len;
  b->base = NULL;
  b->cap = 0;
  b->off = 0;
  b->len = 0;
  return p;
}

void osr_buf_swap(osr_buf_t *a, osr_buf_t *b)
{
  osr_buf_t t = *a;
  *a = *b;
  *b = t;
}
