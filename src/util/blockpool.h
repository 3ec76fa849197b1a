/*
 * Per-thread caches of fixed-size blocks for the network core's hot,
 * short-lived buffers: a socket's 64 KiB read buffer and an HTTP/1.1
 * request's 4 KiB block.
 *
 * Why: an idle keep-alive connection should hold no buffer at all (memory
 * per idle connection is a benchmark row), yet a busy one must not pay a
 * malloc/free pair per request: freeing a 64 KiB chunk next to the heap top
 * lets glibc trim the heap (a brk system call), and the next read grows it
 * again. So a connection hands its buffer back here as soon as it holds no
 * bytes, and the next connection that reads takes the same, still resident
 * block. Each cache is bounded (OSR_BLOCK_CACHE_MAX 4 KiB blocks, a quarter
 * as many 64 KiB ones); what does not fit is freed.
 *
 * Thread-local: every OSR loop runs on its own thread, and a block may be
 * returned on any thread (it is then cached there). Blocks cached by a
 * thread are freed when the thread exits. Under AddressSanitizer cached
 * blocks are poisoned, so a use after "free" is still reported.
 */
#ifndef OSR_UTIL_BLOCKPOOL_H
#define OSR_UTIL_BLOCKPOOL_H

#include <stddef.h>

#include "osr/common.h"

typedef enum {
  OSR_BLOCK_4K,  /* 4096 bytes */
  OSR_BLOCK_64K, /* 65536 bytes */
  OSR_BLOCK_NCLASSES
} osr_block_class_t;

/* Blocks each thread keeps per class: enough for one loop turn's worth of
 * requests in flight (a response's request block is returned on the next
 * turn), at most 1 MiB + 4 MiB per thread (and only touched pages are resident). */
#define OSR_BLOCK_CACHE_MAX 256

/** Size in bytes of a block of class `cls`. */
static inline size_t osr_block_size(osr_block_class_t cls)
{
  return cls == OSR_BLOCK_4K ? 4096 : 65536;
}

/** A block of class `cls` (contents undefined), or NULL when out of memory.
 *  Release it with osr_block_put(), or with osr_free() like any allocation
 *  of the OSR allocator (it may also be resized with osr_try_realloc, after
 *  which it is no longer of its class). */
OSR_WUR void *osr_block_get(osr_block_class_t cls);

/** Return a block of class `cls` (exactly osr_block_size(cls) bytes, from
 *  osr_block_get or the OSR allocator). NULL is fine. */
void osr_block_put(osr_block_class_t cls, void *p);

#endif
