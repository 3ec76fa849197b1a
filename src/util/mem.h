/*
 * Allocation. Every allocation in OSR goes through these functions so tests
 * can inject failures and embedders can plug their own allocator (STYLE 9).
 *
 * Two policies:
 *  - osr_x*: for fixed-size control structures. Abort the process on OOM;
 *    callers never check for NULL.
 *  - osr_try_*: for sizes a peer controls (bodies, frames, headers). Return
 *    NULL on failure; the caller fails only that connection or stream.
 */
#ifndef OSR_UTIL_MEM_H
#define OSR_UTIL_MEM_H

#include <stddef.h>
#include "osr/common.h"

typedef struct osr_mem_s {
  void *(*malloc_fn)(size_t size, void *ud);
  void *(*realloc_fn)(void *ptr, size_t size, void *ud);
  void (*free_fn)(void *ptr, void *ud);
  void *ud;
} osr_mem_t;

/**
 * Replace the allocator. Call before any other OSR function and before
 * osr_mem_install_deps(). `mem` is copied. NULL restores the libc allocator.
 */
void osr_mem_set(const osr_mem_t *mem);

/**
 * Route libuv and jansson allocations through the OSR allocator too. Call
 * once at start-up, before the first uv_loop_init. Returns 0 or OSR_EBUSY if
 * libuv already allocated.
 */
int osr_mem_install_deps(void);

/** Fault injection for tests: the n-th (1-based) try_ allocation from now
 *  fails; 0 disables. Counts only osr_try_* calls. */
void osr_mem_fail_after(unsigned long n);

void *osr_xmalloc(size_t size);
void *osr_xcalloc(size_t n, size_t size);
void *osr_xrealloc(void *ptr, size_t size);
char *osr_xstrdup(const char *s);
char *osr_xstrndup(const char *s, size_t n);

OSR_WUR void *osr_try_malloc(size_t size);
OSR_WUR void *osr_try_realloc(void *ptr, size_t size);

/** Free memory from any of the above. NULL is fine. */
void osr_free(void *ptr);

/** Free and NULL the pointer (STYLE 8). */
#define osr_freep(pp)   \
  do {                  \
    osr_free(*(pp));    \
    *(pp) = NULL;       \
  } while (0)

/** Free memory that jansson allocated for us (json_dumps results), with
 *  whichever allocator jansson was given. */
void osr_json_free(void *ptr);

/** The active allocator, e.g. to build an nghttp2_mem. */
const osr_mem_t *osr_mem_get(void);

#endif
