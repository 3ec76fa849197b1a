/*
 * Fixed-size objects in pages of their own (a minimal slab allocator), for
 * small per-connection structs that come and go while their neighbours in
 * the malloc heap stay: an HTTP/1.1 connection's state is freed when the
 * connection parks (net/http1.c), but a 128-byte hole between two sockets
 * in the heap stays resident, so freeing it would not lower the process's
 * memory. Objects here share 4 KiB pages mapped for them alone; a page
 * whose last object is freed is unmapped, except for `max_spare` empty
 * pages kept mapped, so that a count of live objects that swings by less
 * than that many pages' worth (short-lived objects: one per request) does
 * not map and unmap in turn.
 *
 * Not thread-safe: one osr_slab_t per thread (e.g. `static __thread`), and
 * every object freed on the thread that allocated it. Pages still holding
 * objects when the thread exits are leaked with them. Under AddressSanitizer
 * free objects are poisoned, so a use after free is still reported.
 */
#ifndef OSR_UTIL_SLAB_H
#define OSR_UTIL_SLAB_H

#include <stddef.h>
#include <stdint.h>

#include "osr/common.h"

typedef struct osr_slab_page_s osr_slab_page_t;

typedef struct osr_slab_s {
  size_t size;              /**< object size (set before the first alloc, <= 1 KiB) */
  uint32_t max_spare;       /**< empty pages kept mapped (0 means 1) */
  uint32_t nspare;
  osr_slab_page_t *partial; /* pages with a free object */
  osr_slab_page_t *spare;   /* empty pages kept mapped */
  size_t npages;            /* pages mapped (statistics, tests) */
} osr_slab_t;

/** A zeroed object of s->size bytes, or NULL when out of memory. */
OSR_WUR void *osr_slab_alloc(osr_slab_t *s);

/** As osr_slab_alloc, but out of memory aborts the process (as
 *  osr_xmalloc does). */
void *osr_slab_xalloc(osr_slab_t *s);

/** Free an object of `s` (NULL is fine). */
void osr_slab_free(osr_slab_t *s, void *p);

#endif
