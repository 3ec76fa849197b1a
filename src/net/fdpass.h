/*
 * Passing a connected socket between processes over a unix socket
 * (SCM_RIGHTS), for the agent's `osr-fd` extension of GET /_osr/ports/{port}
 * (docs/agent.md, "Descriptor passing"): the agent, inside the sandbox,
 * connects to the port and hands the connected TCP socket to the data
 * plane, which then talks to the sandbox's application directly instead of
 * through a byte tunnel in the agent (one hop, half the system calls).
 *
 * The sender is trusted by no one: the agent runs inside the sandbox and may
 * be compromised. So the receiving side (osr_fdpass_recv_*) reads the
 * handshake with its own recvmsg() and enforces, for every read:
 *   - MSG_CMSG_CLOEXEC, so no received descriptor leaks into a child;
 *   - MSG_CTRUNC (more descriptors or control data than the buffer holds):
 *     the read fails and every descriptor that did arrive is closed;
 *   - at most one descriptor over the whole exchange: a second one fails
 *     the read and closes both; any control message that is not
 *     SCM_RIGHTS fails it too;
 * and osr_fdpass_check_stream() then accepts only a connected, not
 * listening, SOCK_STREAM socket of AF_INET or AF_INET6.
 *
 * Why not libuv's IPC pipes (uv_pipe_init(.., ipc = 1) + uv_accept)? They
 * accept any number of descriptors of any type per read, queue extras
 * silently and do not report MSG_CTRUNC, so none of the rules above could
 * be enforced exactly. Instead the receiver polls a dup() of the unix
 * socket's descriptor (as net/splice.c does: libuv allows one watcher per
 * descriptor, and the socket's own uv_pipe_t stays registered for writes),
 * and recvmsg() runs only when the poll says readable, on a non-blocking
 * descriptor, so the loop thread never blocks.
 */
#ifndef OSR_NET_FDPASS_H
#define OSR_NET_FDPASS_H

#include <stddef.h>
#include <stdint.h>

#include "net/sock.h"

/** Is `s` a unix-domain socket (the only kind that can carry descriptors)? */
int osr_fdpass_is_unix(const osr_sock_t *s);

/** The descriptor of `s` (borrowed: still owned and closed by `s`). */
int osr_fdpass_fileno(const osr_sock_t *s);

/**
 * Send one byte `tag` carrying `fd` (SCM_RIGHTS) on the unix socket `s`,
 * without blocking. `s` must have no write in flight (the byte must follow
 * everything written before it). Returns 0 (sent; the receiver holds its
 * own reference, so the caller may close `fd`) or an error and nothing was
 * sent: OSR_EAGAIN when the socket buffer is full, -EINVAL/-EOPNOTSUPP
 * where the kernel cannot pass descriptors on this socket (gVisor's host
 * unix sockets), OSR_EBUSY with writes in flight.
 */
int osr_fdpass_send(osr_sock_t *s, int fd, uint8_t tag);

typedef struct osr_fdpass_recv_s osr_fdpass_recv_t;

/** Bytes arrived (appended to s->input) or the read ended: status 0, or
 *  OSR_EOF, OSR_EPROTO (a descriptor rule was broken: all received
 *  descriptors are already closed), another error. After a non-zero status
 *  the reader is finished: the callee must call osr_fdpass_recv_stop(). */
typedef void (*osr_fdpass_recv_cb)(osr_fdpass_recv_t *r, int status, void *data);

/**
 * Read from the unix socket `s` with recvmsg() until the owner stops: bytes
 * are appended to s->input (capped by its cap: OSR_ETOOLARGE beyond), a
 * descriptor received is kept by the reader (osr_fdpass_recv_fd). `s` must
 * not be reading (osr_sock_read_stop) and keeps its events and owner; it
 * can still be written. Returns 0 and cb fires for each read until
 * osr_fdpass_recv_stop, or an error and cb never fires.
 */
int osr_fdpass_recv_start(osr_sock_t *s, osr_fdpass_recv_cb cb, void *data,
                          osr_fdpass_recv_t **out);

/** The descriptor received so far (-1 = none); still owned by the reader. */
int osr_fdpass_recv_fd(const osr_fdpass_recv_t *r);

/**
 * Stop reading and free the reader (safe inside its callback). Returns the
 * received descriptor, now owned by the caller, when `take` is set;
 * otherwise (or with none) closes it and returns -1. `s` is untouched and
 * may be read again with osr_sock_read_start().
 */
int osr_fdpass_recv_stop(osr_fdpass_recv_t *r, int take);

/**
 * Check that `fd` is a connected stream socket of AF_INET/AF_INET6 that is
 * not listening. Returns 0 or OSR_EPROTO (with a short reason in *why).
 */
int osr_fdpass_check_stream(int fd, const char **why);

/**
 * Wrap a connected TCP socket `fd` (taken, closed on error) in a new
 * osr_sock_t on `loop` (non-blocking, no events set, not reading). Returns 0
 * or an error.
 */
int osr_fdpass_sock_open(uv_loop_t *loop, int fd, osr_sock_t **out);

#endif
