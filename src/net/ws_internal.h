/*
 * WebSocket internals shared by ws.c, its unit test (tests/unit/net/
 * test_ws_frame.c) and its fuzz target (fuzz/fuzz_ws.c). Not part of the
 * module's API: the gateway and the data plane use net/ws.h only.
 *
 * The pieces exposed here are the ones worth testing without a network:
 * the handshake computations and parsers, and a session that runs over a
 * memory transport instead of a socket (bytes in by osr__ws_mem_feed(),
 * frames out into a capped buffer), so the fuzzer can drive wslay and our
 * callbacks deterministically.
 */
#ifndef OSR_NET_WS_INTERNAL_H
#define OSR_NET_WS_INTERNAL_H

#include <stddef.h>

#include "net/ws.h"
#include "util/buf.h"

/** Length of a Sec-WebSocket-Accept value (base64 of a SHA-1) plus NUL. */
#define OSR_WS_ACCEPT_LEN 29
/** Length of a Sec-WebSocket-Key value (base64 of 16 bytes) plus NUL. */
#define OSR_WS_KEY_LEN 25
/** Cap on the bytes of a handshake response head the client accepts. */
#define OSR_WS_MAX_RESPONSE_HEAD (16 * 1024)

/** Sec-WebSocket-Accept for `key` (RFC 6455 4.2.2: base64(SHA-1(key + GUID))).
 *  Writes a NUL-terminated string into out. Returns 0 or OSR_EINVAL for an
 *  over-long key. */
int osr__ws_accept_key(const char *key, size_t keylen, char out[OSR_WS_ACCEPT_LEN]);

/** 1 if `v` is a syntactically valid client key (22 base64 chars + "=="). */
int osr__ws_key_is_valid(const osr_iovec_t *v);

/** 1 if the comma-separated header value `v` contains `token` (case-insensitive). */
int osr__ws_has_token(const osr_iovec_t *v, const char *token);

/**
 * Validate a server-side upgrade request. Returns 0 and fills `accept` and
 * `*proto` (index into protos of the chosen subprotocol, or -1 for none), or
 * the HTTP status to answer (400, or 426 for a wrong version) with a short
 * reason in `*why`.
 */
int osr__ws_check_request(const osr_http_req_t *req, const char *const *protos, size_t nprotos,
                          char accept[OSR_WS_ACCEPT_LEN], int *proto, const char **why);

/**
 * Parse the server's handshake response head in p[0..len) (client side,
 * bounded by OSR_WS_MAX_RESPONSE_HEAD). Returns 0 with *head_len (bytes of
 * the head, frames follow) and *proto (index into offered, or -1); OSR_EAGAIN
 * if the head is incomplete; OSR_ETOOLARGE past the cap; OSR_EHTTP for a
 * malformed head or a status other than 101 (*status set when one was
 * parsed); OSR_EWS if the head does not accept the WebSocket (Upgrade,
 * Connection, Sec-WebSocket-Accept, a subprotocol we did not offer, an
 * extension we did not offer).
 */
int osr__ws_parse_response(const char *p, size_t len, const char *expect_accept,
                           const char *const *offered, size_t noffered, size_t *head_len,
                           int *proto, int *status);

/** 1 if p[0..len) is valid UTF-8 (no overlongs, surrogates or > U+10FFFF). */
int osr__ws_utf8_valid(const void *p, size_t len);

/* ---- memory transport (fuzzing and unit tests) ---------------------------- */

/**
 * A session with no socket and no timers: osr__ws_mem_feed() hands it bytes
 * as if read from the peer, frames it writes go to a buffer capped at
 * `out_max` (excess is dropped and counted). Events fire as usual; on_close
 * fires once when the session ends (close handshake done or failure), and
 * the caller frees with osr__ws_mem_free() (which fires on_close with 1006
 * if it has not fired yet).
 */
int osr__ws_mem_new(int is_server, const osr_ws_opts_t *opts, const osr_ws_events_t *ev,
                    void *data, size_t out_max, osr_ws_t **out);
/** Feed bytes. Returns 0, or OSR_ECLOSED once the session has ended. */
int osr__ws_mem_feed(osr_ws_t *ws, const void *p, size_t len);
/** Frames written so far (the caller may consume from it). */
osr_buf_t *osr__ws_mem_output(osr_ws_t *ws);
void osr__ws_mem_free(osr_ws_t *ws);

/**
 * Run a WebSocket session directly on a connected socket, skipping the HTTP
 * handshake (unit tests over a socketpair; also what osr_ws_accept does once
 * the 101 has been written). Takes ownership of `s`. on_close fires once.
 */
int osr__ws_new_on_sock(osr_sock_t *s, int is_server, const osr_ws_opts_t *opts,
                        const osr_ws_events_t *ev, void *data, osr_ws_t **out);

#endif
