/*
 * Connect protocol framing (https://connectrpc.com/docs/protocol), the part
 * osr-agent needs to speak E2B's envd contract with the JSON codec:
 *
 *   - server-streaming and client-streaming bodies are a sequence of
 *     envelopes: 1 flag byte, a 4-byte big-endian length, then the message;
 *     flag 0x02 marks the end-of-stream frame ({} or {"error":{...}}),
 *     flag 0x01 a compressed message (we never negotiate compression, so a
 *     peer setting it is a protocol error);
 *   - errors are {"code":"not_found","message":"..."} with a code name from
 *     a fixed table that also gives the HTTP status of a unary error;
 *   - `bytes` fields travel as base64 (standard alphabet; the decoder also
 *     takes the URL-safe one and missing padding, as proto3 JSON requires).
 *
 * Everything here is pure: no I/O, no logging (STYLE 22), so the envelope
 * parser is fuzzed directly (fuzz/fuzz_connect.c).
 */
#ifndef OSR_AGENT_CONNECT_H
#define OSR_AGENT_CONNECT_H

#include <stddef.h>
#include <stdint.h>

#include "osr/common.h"
#include "util/buf.h"

#define OSR_CX_FLAG_COMPRESSED 0x01u
#define OSR_CX_FLAG_END_STREAM 0x02u
#define OSR_CX_HEADER_LEN      5

/** Incremental envelope parser. Holds at most `max` message bytes. */
typedef struct osr_cx_parser_s {
  size_t max; /**< largest accepted message (set by init) */
  /* private */
  uint8_t _hdr[OSR_CX_HEADER_LEN];
  size_t _hdr_len;   /* header bytes collected so far */
  uint32_t _msg_len; /* length announced by the header */
  osr_buf_t _msg;    /* message bytes collected so far (cap max) */
  int _have_msg;     /* a complete message is in _msg */
} osr_cx_parser_t;

/** One parsed envelope. `data` stays valid until the next osr_cx_parse()
 *  or osr_cx_parser_dispose() call. */
typedef struct osr_cx_msg_s {
  uint8_t flags;
  const char *data;
  size_t len;
} osr_cx_msg_t;

/** Initialise a parser accepting messages of at most `max` bytes.
 *  Allocates nothing until a message arrives. */
void osr_cx_parser_init(osr_cx_parser_t *p, size_t max);
void osr_cx_parser_dispose(osr_cx_parser_t *p);

/**
 * Feed bytes. Consumes input up to the end of the first complete envelope
 * and stores how many bytes it used in *consumed (always <= len).
 * Returns 1 with *out filled when an envelope is complete, 0 when all input
 * was consumed and more is needed, or an error: OSR_ETOOLARGE (announced
 * length above max), OSR_EPROTO (compressed flag or unknown flag bits),
 * OSR_ENOMEM. After an error the parser must only be disposed.
 */
OSR_WUR int osr_cx_parse(osr_cx_parser_t *p, const void *data, size_t len, size_t *consumed,
                         osr_cx_msg_t *out);

/** 1 if the parser is between envelopes (no partial header or message). */
int osr_cx_parser_is_idle(const osr_cx_parser_t *p);

/** Write the 5-byte envelope header for a message of `len` bytes. */
void osr_cx_frame_header(uint8_t out[OSR_CX_HEADER_LEN], uint8_t flags, uint32_t len);

/* ---- error codes ---------------------------------------------------------- */

typedef enum osr_cx_code_e {
  OSR_CX_CANCELED = 1,
  OSR_CX_UNKNOWN,
  OSR_CX_INVALID_ARGUMENT,
  OSR_CX_DEADLINE_EXCEEDED,
  OSR_CX_NOT_FOUND,
  OSR_CX_ALREADY_EXISTS,
  OSR_CX_PERMISSION_DENIED,
  OSR_CX_RESOURCE_EXHAUSTED,
  OSR_CX_FAILED_PRECONDITION,
  OSR_CX_ABORTED,
  OSR_CX_OUT_OF_RANGE,
  OSR_CX_UNIMPLEMENTED,
  OSR_CX_INTERNAL,
  OSR_CX_UNAVAILABLE,
  OSR_CX_DATA_LOSS,
  OSR_CX_UNAUTHENTICATED,
} osr_cx_code_t;

/** "not_found" etc.; "unknown" for values outside the enum. */
const char *osr_cx_code_name(osr_cx_code_t code);
/** HTTP status of a unary error with this code (Connect spec table). */
int osr_cx_code_http_status(osr_cx_code_t code);
/** Connect code for a libuv/OSR error from a file or process operation
 *  (ENOENT -> not_found, EEXIST -> already_exists, EACCES -> permission
 *  denied, ENOSPC -> resource_exhausted, EINVAL/ENOTDIR -> invalid
 *  argument, anything else -> internal). */
osr_cx_code_t osr_cx_code_from_errno(int err);

/* ---- base64 ---------------------------------------------------------------- */

/** Encoded length (standard alphabet, padded) of n bytes. */
static inline size_t osr_b64_enc_len(size_t n)
{
  return (n + 2) / 3 * 4;
}
/** Encode n bytes into out (osr_b64_enc_len(n) bytes, no NUL). Returns the
 *  length written. `pad` 0 omits '=' padding. */
size_t osr_b64_encode(const void *in, size_t n, char *out, int pad);
/** Decode standard or URL-safe base64, padded or not, into out (room for
 *  len*3/4 bytes). Returns the decoded length or OSR_EINVAL. */
long osr_b64_decode(const char *in, size_t len, void *out);

#endif
