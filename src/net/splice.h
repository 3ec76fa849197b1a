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

#endif
