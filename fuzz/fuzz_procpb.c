/*
 * Fuzz target for the protobuf codec of process.Process (src/agent/procpb.c):
 * the event decoder is what reads a sandbox's output stream in the data
 * plane, and the agent may be hostile; the request decoder is what the
 * agent reads from a client.
 *
 * Input: byte 0 picks the decoder (bit 0: events / requests, bit 1: Start or
 * Connect request); the rest is one message. Oracles (trap on violation):
 *   - events: every span lies inside the input; a data event re-encoded
 *     with osr_pb_data_header() + its bytes decodes to the same stream and
 *     bytes; start/end events survive osr_pb_put_start/_end unchanged;
 *   - requests: a decoded request encodes again (osr_pb_request_from_json)
 *     and decodes to an equal JSON object (a round trip through the codec
 *     loses nothing the agent acts on).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "agent/procpb.c"

#define CHECK(x)                                                                                   \
  do {                                                                                             \
    if (!(x))                                                                                      \
      __builtin_trap();                                                                            \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int inside(osr_iovec_t v, const uint8_t *p, size_t n)
{
  if (v.len == 0)
    return 1;
  return (const uint8_t *)v.base >= p && (const uint8_t *)v.base + v.len <= p + n;
}

static void fuzz_events(const uint8_t *in, size_t n)
{
  osr_pe_t ev;
  if (osr_pe_decode(in, n, &ev) != 0)
    return;
  CHECK(ev.kind >= OSR_PE_NONE && ev.kind <= OSR_PE_KEEPALIVE);
  CHECK(inside(ev.data, in, n) && inside(ev.status, in, n) && inside(ev.error, in, n));
  osr_buf_t b;
  osr_buf_init(&b, 2 * n + 256);
  osr_pe_t back;
  if (ev.kind == OSR_PE_DATA && ev.stream != 0) {
    uint8_t hdr[OSR_PB_DATA_HDR_MAX];
    size_t hl = osr_pb_data_header(hdr, ev.stream, ev.data.len);
    CHECK(hl <= OSR_PB_DATA_HDR_MAX);
    CHECK(osr_buf_append(&b, hdr, hl) == 0);
    if (ev.data.len > 0)
      CHECK(osr_buf_append(&b, ev.data.base, ev.data.len) == 0);
    CHECK(osr_pe_decode(osr_buf_data(&b), b.len, &back) == 0);
    CHECK(back.kind == OSR_PE_DATA && back.stream == ev.stream && back.data.len == ev.data.len);
    CHECK(ev.data.len == 0 || memcmp(back.data.base, ev.data.base, ev.data.len) == 0);
  } else if (ev.kind == OSR_PE_START) {
    CHECK(osr_pb_put_start(&b, ev.pid, ev.has_offset, ev.output_offset) == 0);
    CHECK(osr_pe_decode(osr_buf_data(&b), b.len, &back) == 0);
    CHECK(back.kind == OSR_PE_START && back.pid == ev.pid && back.has_offset == ev.has_offset);
    CHECK(!ev.has_offset || back.output_offset == ev.output_offset);
  } else if (ev.kind == OSR_PE_END && memchr(ev.status.base ? ev.status.base : "", 0,
                                                ev.status.len) == NULL &&
             memchr(ev.error.base ? ev.error.base : "", 0, ev.error.len) == NULL) {
    char st[256], er[256];
    size_t sl = ev.status.len < 255 ? ev.status.len : 255;
    size_t el = ev.error.len < 255 ? ev.error.len : 255;
    memcpy(st, ev.status.base ? ev.status.base : "", sl);
    memcpy(er, ev.error.base ? ev.error.base : "", el);
    st[sl] = er[el] = '\0';
    CHECK(osr_pb_put_end(&b, ev.exit_code, ev.exited, st, ev.has_error ? er : NULL) == 0);
    CHECK(osr_pe_decode(osr_buf_data(&b), b.len, &back) == 0);
    CHECK(back.kind == OSR_PE_END && back.exit_code == ev.exit_code &&
          back.exited == ev.exited && back.has_error == ev.has_error && back.status.len == sl);
  }
  osr_buf_dispose(&b);
}

static void fuzz_requests(const uint8_t *in, size_t n, int is_connect)
{
  json_t *j = osr_pb_request_to_json(in, n, is_connect);
  if (j == NULL)
    return;
  osr_buf_t b;
  osr_buf_init(&b, 4 * n + 256);
  int rv = osr_pb_request_from_json(&b, j, is_connect);
  CHECK(rv == 0);
  json_t *k = osr_pb_request_to_json(osr_buf_data(&b) ? osr_buf_data(&b) : "", b.len, is_connect);
  CHECK(k != NULL);
  /* pid 0 and empty strings are proto3 defaults the encoder omits: compare
   * after one more round trip, which is then a fixed point. */
  osr_buf_t c;
  osr_buf_init(&c, 4 * n + 256);
  CHECK(osr_pb_request_from_json(&c, k, is_connect) == 0);
  json_t *l = osr_pb_request_to_json(osr_buf_data(&c) ? osr_buf_data(&c) : "", c.len, is_connect);
  CHECK(l != NULL && json_equal(k, l));
  json_decref(j);
  json_decref(k);
  json_decref(l);
  osr_buf_dispose(&b);
  osr_buf_dispose(&c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size < 1)
    return 0;
  if (data[0] & 1)
    fuzz_requests(data + 1, size - 1, (data[0] & 2) != 0);
  else
    fuzz_events(data + 1, size - 1);
  return 0;
}
