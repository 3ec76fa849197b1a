/*
 * osr_buf_t: the one byte buffer of OSR (STYLE 12, 13).
 *
 *   base                      base+off       base+off+len          base+cap
 *   |   consumed (free again)  |   data        |   free tail         |
 *
 * Invariants, true between any two calls:
 *   - off + len <= cap <= max
 *   - base == NULL iff cap == 0
 *   - len == 0 implies off == 0 (an empty buffer rewinds, so the whole
 *     capacity is free tail again)
 * States: EMPTY (len == 0), DATA (len > 0). The buffer never holds more than
 * `max` bytes of capacity; growth past it fails with OSR_ETOOLARGE, which the
 * owner turns into a 413/431/1009 or a closed connection.
 *
 * The buffer is owned by whoever called osr_buf_init(); it is not thread-safe.
 */
#ifndef OSR_UTIL_BUF_H
#define OSR_UTIL_BUF_H

#include <stddef.h>
#include "osr/common.h"

typedef struct osr_buf_s {
  char *base;
  size_t cap;
  size_t off;
  size_t len;
  size_t max;
} osr_buf_t;

/** Initialise an empty buffer that may grow to `max` bytes. Allocates nothing. */
void osr_buf_init(osr_buf_t *b, size_t max);

/** Release the memory. The buffer is EMPTY with cap 0 afterwards and may be reused. */
void osr_buf_dispose(osr_buf_t *b);

/** Pointer to the first data byte (NULL while nothing was ever allocated). */
static inline char *osr_buf_data(const osr_buf_t *b)
{
  return b->base != NULL ? b->base + b->off : NULL;
}

/**
 * Make at least `min` bytes of free tail available, compacting first and
 * growing (doubling, at least 4 KiB, at most `max`) if needed. On success
 * returns 0 and `*tail` (optional) describes the whole free tail. Returns
 * OSR_ETOOLARGE if off+len+min would exceed `max`, OSR_ENOMEM if allocation
 * failed; the buffer is unchanged on error.
 */
OSR_WUR int osr_buf_reserve(osr_buf_t *b, size_t min, osr_iovec_t *tail);

/** Mark `n` bytes of the free tail as data (after writing into it). n <= tail.len. */
void osr_buf_commit(osr_buf_t *b, size_t n);

/** Drop `n` bytes from the front of the data. n <= len. */
void osr_buf_consume(osr_buf_t *b, size_t n);

/** Append a copy of `len` bytes. Same errors as osr_buf_reserve. */
OSR_WUR int osr_buf_append(osr_buf_t *b, const void *p, size_t len);

/** Append formatted text (no NUL stored). Same errors as osr_buf_reserve. */
OSR_WUR int osr_buf_appendf(osr_buf_t *b, const char *fmt, ...) OSR_PRINTF(2, 3);

/** Give the memory to the caller (free with osr_free) and leave `b` empty. */
char *osr_buf_release(osr_buf_t *b, size_t *len);

/** Exchange the contents of two buffers (zero-copy hand-off, STYLE 16). */
void osr_buf_swap(osr_buf_t *a, osr_buf_t *b);

#endif
