/*
 * process.Process in protobuf binary: the messages of Connect's
 * application/connect+proto codec for the two server streams, Start and
 * Connect (the E2B contract, §4).
 *
 * Why: with the JSON codec every output byte is base64-encoded by the agent
 * and decoded again by the data plane (plus a JSON envelope per frame);
 * callgrind put that at most of an exec stream's instructions. In the
 * binary codec a DataEvent's `bytes` field is the raw output, so the data
 * plane copies it straight into the client's frame. The codec is part of
 * the same contract, so the data plane speaks it to E2B's own envd too.
 *
 * Field numbers (from the contract; our own transcription, not E2B's files):
 *   StartRequest   { ProcessConfig process=1; optional PTY pty=2;
 *                    optional string tag=3; optional bool stdin=4; }
 *   ProcessConfig  { string cmd=1; repeated string args=2;
 *                    map<string,string> envs=3; optional string cwd=4; }
 *   PTY            { Size size=1 { uint32 cols=1; uint32 rows=2; } }
 *   ConnectRequest { ProcessSelector process=1;
 *                    uint64 output_offset=1000; (OSR extension) }
 *   ProcessSelector{ oneof { uint32 pid=1; string tag=2; } }
 *   Start/ConnectResponse { ProcessEvent event=1; }
 *   ProcessEvent   { oneof { StartEvent start=1; DataEvent data=2;
 *                    EndEvent end=3; KeepAlive keepalive=4; } }
 *   StartEvent     { uint32 pid=1; uint64 output_offset=1000; (OSR ext.) }
 *   DataEvent      { oneof { bytes stdout=1; bytes stderr=2; bytes pty=3; } }
 *   EndEvent       { sint32 exit_code=1; bool exited=2; string status=3;
 *                    optional string error=4; }
 * The OSR extensions use a field number envd does not know, so envd and
 * its clients skip them as unknown fields.
 *
 * Requests are converted to and from the JSON object the JSON codec would
 * carry ({"process":{"cmd":..},"stdin":false,...}), so the agent's handlers
 * and the data plane's request builder stay codec-neutral. Events are
 * decoded into a flat struct whose spans point into the message.
 *
 * Everything here is pure (no I/O, no logging, STYLE 22) and bounded: the
 * caller caps the message size, the schema has no recursion, and every
 * length is checked against the bytes that remain. The event decoder is
 * what reads agent output in the data plane (the agent may be hostile), so
 * it is fuzzed directly (fuzz/fuzz_procpb.c).
 */
#ifndef OSR_AGENT_PROCPB_H
#define OSR_AGENT_PROCPB_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "osr/common.h"
#include "util/buf.h"

#define OSR_PB_CONTENT_TYPE "application/connect+proto"
/** Field number of the OSR output-offset extension (see above). */
#define OSR_PB_FIELD_OUTPUT_OFFSET 1000
/** Most repeated args / map entries a request may carry. */
#define OSR_PB_MAX_ITEMS 4096
/** Largest header osr_pb_data_header() writes. */
#define OSR_PB_DATA_HDR_MAX 24

/* ---- wire level ------------------------------------------------------------ */

enum { OSR_PB_VARINT = 0, OSR_PB_I64 = 1, OSR_PB_LEN = 2, OSR_PB_I32 = 5 };

/** One field read by osr_pb_next(). For OSR_PB_LEN `bytes` points into the
 *  input; for the other wire types the value is in `v`. */
typedef struct osr_pb_field_s {
  uint32_t num;
  int wt;
  uint64_t v;
  osr_iovec_t bytes;
} osr_pb_field_t;

/** Reader over one message: [p, end). */
typedef struct osr_pb_rd_s {
  const uint8_t *p, *end;
} osr_pb_rd_t;

/** Read the next field. Returns 1 with *f filled, 0 at the end of the
 *  message, OSR_EPROTO for a malformed one (truncated varint or length,
 *  field number 0, group wire types). */
int osr_pb_next(osr_pb_rd_t *r, osr_pb_field_t *f);

/** Write v as a varint into out (10 bytes room); returns the length. */
size_t osr_pb_put_varint(uint8_t *out, uint64_t v);

/* ---- events: agent -> client ------------------------------------------------- */

enum { OSR_PE_NONE = 0, OSR_PE_START, OSR_PE_DATA, OSR_PE_END, OSR_PE_KEEPALIVE };
enum { OSR_PE_STDOUT = 1, OSR_PE_STDERR = 2, OSR_PE_PTY = 3 };

/** A decoded Start/ConnectResponse. Spans point into the decoded message
 *  and are valid as long as it is. */
typedef struct osr_pe_s {
  int kind; /**< OSR_PE_*; NONE for an event of a kind we do not know */
  /* start */
  uint32_t pid;
  int has_offset;
  uint64_t output_offset;
  /* data */
  int stream; /**< OSR_PE_STDOUT/STDERR/PTY, 0 for an unknown output */
  osr_iovec_t data;
  /* end */
  int32_t exit_code;
  int exited;
  osr_iovec_t status;
  int has_error;
  osr_iovec_t error;
} osr_pe_t;

/** Decode a Start/ConnectResponse of `len` bytes. Returns 0 or OSR_EPROTO
 *  (malformed, or a known field with the wrong wire type). Unknown fields
 *  are skipped (proto3). */
int osr_pe_decode(const void *msg, size_t len, osr_pe_t *ev);

/** The bytes of a data event carrying `n` output bytes of `stream`, up to
 *  the output itself: message = header + the n raw bytes. Returns the
 *  header length (<= OSR_PB_DATA_HDR_MAX). */
size_t osr_pb_data_header(uint8_t out[OSR_PB_DATA_HDR_MAX], int stream, size_t n);

/** Append a start event (pid; the offset only when has_offset). Returns 0
 *  or the osr_buf error. */
int osr_pb_put_start(osr_buf_t *b, uint32_t pid, int has_offset, uint64_t offset);
/** Append an end event; `error` may be NULL (absent). */
int osr_pb_put_end(osr_buf_t *b, int32_t exit_code, int exited, const char *status,
                   const char *error);

/** The keepalive event, {event:{keepalive:{}}}. */
extern const uint8_t osr_pb_keepalive[4];

/* ---- requests: client -> agent --------------------------------------------------- */

/** Decode a StartRequest (is_connect 0) or ConnectRequest (1) into the JSON
 *  object the JSON codec carries (new reference), or NULL if malformed:
 *  bad wire format, strings that are not UTF-8, more than
 *  OSR_PB_MAX_ITEMS args or envs. The output offset extension becomes
 *  "outputOffset" (a decimal string, as proto3 JSON writes a uint64). */
json_t *osr_pb_request_to_json(const void *msg, size_t len, int is_connect);

/** The inverse: append the binary form of the JSON request `j` (fields the
 *  codec does not know are ignored). Returns 0, OSR_EINVAL for a value of
 *  the wrong JSON type, or the osr_buf error. */
int osr_pb_request_from_json(osr_buf_t *b, json_t *j, int is_connect);

#endif
