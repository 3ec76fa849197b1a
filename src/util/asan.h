/*
 * AddressSanitizer hooks for code that recycles memory itself (the block
 * pool, the slab): POISON marks bytes as freed so a use is still reported,
 * UNPOISON hands them out again. No-ops without ASan.
 */
#ifndef OSR_UTIL_ASAN_H
#define OSR_UTIL_ASAN_H

#if defined(__SANITIZE_ADDRESS__)
#define OSR_HAVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define OSR_HAVE_ASAN 1
#endif
#endif

#ifdef OSR_HAVE_ASAN
#include <sanitizer/asan_interface.h>
#define OSR_POISON(p, n)   ASAN_POISON_MEMORY_REGION((p), (n))
#define OSR_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define OSR_POISON(p, n)   ((void)(p), (void)(n))
#define OSR_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#endif
