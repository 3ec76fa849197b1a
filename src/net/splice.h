/*
 * osr_splice_t: relay raw bytes both ways between two sockets, without
 * copying them (the agent's port forwarding, the data plane's upgraded
 * tunnels).
 *
 * Each direction forwards straight from the source socket's input buffer
 * (STYLE 16): the source stops reading while its bytes are being written and
 * resumes from the write callback, so each direction holds at most one input
 * buffer (STYLE 14). A half-close (EOF) is propagated with shutdown(); the
 * splice closes both sockets when both directions ended or either failed.
 *
 * Both users learn their two sockets at different times (the upstream is
 * connected first, the client arrives with an HTTP upgrade), so a splice is
 * made with one socket and the other is attached later, exactly once.
 *
 * Lifetime: the splice owns its sockets (it sets their events). on_close
 * fires once, after both sockets closed and the attach happened (or
 * failed); the splice is freed right after it returns.
 */
#ifndef OSR_NET_SPLICE_H
#define OSR_NET_SPLICE_H

#include "net/sock.h"

typedef struct osr_splice_s osr_splice_t;
typedef void (*osr_splice_close_cb)(osr_splice_t *sp, void *data);

/** Take `b` (not read until the other side is attached). */
osr_splice_t *osr_splice_new(osr_sock_t *b, osr_splice_close_cb on_close, void *data);

/** Attach the other socket and start relaying. status != 0 (or a == NULL)
 *  means the other side never came: the splice closes. Call exactly once;
 *  the signature fits osr_http_upgrade_cb with the splice as `arg`. */
void osr_splice_attach(osr_sock_t *a, int status, void *sp);

/** Close both sockets now (idempotent). */
void osr_splice_close(osr_splice_t *sp);

/* ---- one-way transfer ---------------------------------------------------- */

/*
 * osr_splice_xfer_t: move exactly `len` bytes from one cleartext socket to
 * another with splice(2) through a pipe, past libuv and user space (the
 * data plane's HTTP/1.1 response bodies). Backpressure: the source is read
 * only while the pipe is empty, so at most one pipe of bytes (256 KiB, held
 * by the kernel) is in flight however slow the destination.
 *
 * Neither socket is taken: the caller keeps owning both, guarantees that
 * nothing else writes to dst or reads from src meanwhile, and cancels the
 * transfer before either socket can go away. libuv reading on src is
 * stopped for good (resume it with osr_sock_read_start afterwards); dst's
 * reading is untouched (its bytes are polled through a dup).
 */
typedef struct osr_splice_xfer_s osr_splice_xfer_t;
/** status 0: all `len` bytes were written to dst; OSR_EPROTO: src ended
 *  first; else the error of either socket. */
typedef void (*osr_splice_xfer_cb)(osr_splice_xfer_t *x, int status, void *data);

/** Bodies below this stay on the copy path: a pipe, two dups and two poll
 *  registrations do not pay for less (bench/dataplane_bench.py). */
#define OSR_SPLICE_MIN_XFER (256 * 1024)

/** 0 when OSR_SPLICE=0 is in the environment (the copy path only). */
int osr_splice_is_enabled(void);

/** Start moving `len` bytes src -> dst. Both sockets cleartext, src->input
 *  empty, dst's write queue empty, len > 0. Returns 0 and *out, then cb
 *  fires exactly once (never from inside this call) unless cancelled; or an
 *  error (OSR_EINVAL when a condition fails or OSR_SPLICE=0) and cb never
 *  fires. The transfer frees itself after cb or cancel. */
int osr_splice_xfer_start(osr_sock_t *src, osr_sock_t *dst, uint64_t len, osr_splice_xfer_cb cb,
                          void *data, osr_splice_xfer_t **out);

/** Stop now; cb does not fire. Only before cb fired. Bytes already moved
 *  stay moved (the caller ends both streams). */
void osr_splice_xfer_cancel(osr_splice_xfer_t *x);

#endif
