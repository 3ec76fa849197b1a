/*
 * OSR common definitions shared by the embedder/adapter API and the internals:
 * visibility, error codes and the slice type.
 *
 * Error convention (STYLE rule 6): functions return int, 0 on success and a
 * negative OSR_E* code on failure. Where an errno exists the code is libuv's
 * (-errno on Unix), so uv_strerror()/osr_strerror() both describe it. OSR adds
 * a few codes of its own below -30000, outside libuv's range.
 */
#ifndef OSR_COMMON_H
#define OSR_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#if defined(__GNUC__)
#define OSR_API __attribute__((visibility("default")))
#define OSR_WUR __attribute__((warn_unused_result))
#define OSR_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define OSR_LIKELY(x) __builtin_expect(!!(x), 1)
#define OSR_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define OSR_API
#define OSR_WUR
#define OSR_PRINTF(f, a)
#define OSR_LIKELY(x) (x)
#define OSR_UNLIKELY(x) (x)
#endif

#define OSR_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/** Pointer to the struct that embeds `ptr` as its member `member`. */
/* Through void * so clang -Wcast-align accepts it: the result is as aligned
 * as the enclosing struct, which char * arithmetic hides from the compiler. */
#define osr_container_of(ptr, type, member) \
  ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

/* Codes shared with libuv (negative errno values). */
#define OSR_ENOMEM UV_ENOMEM
#define OSR_EINVAL UV_EINVAL
#define OSR_EOF UV_EOF
#define OSR_ETIMEDOUT UV_ETIMEDOUT
#define OSR_ECANCELED UV_ECANCELED
#define OSR_ECONNRESET UV_ECONNRESET
#define OSR_EPROTO UV_EPROTO
#define OSR_ENOBUFS UV_ENOBUFS
#define OSR_EAGAIN UV_EAGAIN
#define OSR_EBUSY UV_EBUSY
#define OSR_EPIPE UV_EPIPE
#define OSR_E2BIG UV_E2BIG
#define OSR_ENOENT UV_ENOENT
#define OSR_EACCES UV_EACCES

/* OSR's own codes. */
#define OSR_ETLS (-30001)          /**< TLS handshake or record failure */
#define OSR_ECERT (-30002)         /**< peer certificate failed verification */
#define OSR_EHTTP (-30003)         /**< malformed HTTP from the peer */
#define OSR_ETOOLARGE (-30004)     /**< a configured cap was exceeded */
#define OSR_EWS (-30005)           /**< WebSocket protocol violation */
#define OSR_EH2 (-30006)           /**< HTTP/2 protocol or flow-control error */
#define OSR_ECLOSED (-30007)       /**< the object was closed before the operation ran */
#define OSR_EDNS (-30008)          /**< name resolution failed */
#define OSR_ESHUTDOWN (-30009)     /**< refused because the server is draining */

/** Human text for an OSR_E* or libuv code. Never NULL, static storage. */
OSR_API const char *osr_strerror(int err);

/**
 * A borrowed byte slice. Layout-compatible with uv_buf_t and struct iovec on
 * Unix (checked statically in util/mem.c), so arrays of it can be handed to
 * uv_write() without copying.
 */
typedef struct osr_iovec_s {
  char *base;
  size_t len;
} osr_iovec_t;

static inline osr_iovec_t osr_iov(const void *base, size_t len)
{
  osr_iovec_t v;
  v.base = (char *)base;
  v.len = len;
  return v;
}
#define OSR_IOV_LIT(s) osr_iov((s), sizeof(s) - 1)

#endif
