/*
 * A direct JSON writer: appends compact JSON text to a growing buffer
 * without building a jansson tree first. The caller writes structure
 * (braces, keys, commas) as literals and values with the typed calls; the
 * output is byte for byte what jansson's json_dumps(JSON_COMPACT) gives for
 * the equivalent tree (keys in insertion order), so a peer or client sees
 * no change when a json_pack + json_dumps pair is replaced by it. It exists
 * because building and dumping a tree costs ~60,000 instructions for a
 * create request or answer, the writer a few thousand.
 *
 * States: EMPTY (after init, dispose or release: nothing allocated), WRITING (text
 * in `b`), FAILED (an append failed: the cap was reached or memory ran
 * out). Errors are sticky: in FAILED every later call does nothing, and
 * osr_jw_release returns NULL. The writer does not check that what it is
 * given is well-formed JSON or valid UTF-8: strings are written as they are
 * (escaped), so callers pass text that is valid UTF-8 (all of OSR's is: it
 * was parsed by jansson or checked on the way in).
 *
 * Ownership: the writer owns its buffer until osr_jw_release hands it to
 * the caller (free it with osr_free); osr_jw_dispose frees it otherwise.
 * No call blocks or logs.
 */
#ifndef OSR_UTIL_JSONW_H
#define OSR_UTIL_JSONW_H

#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"

typedef struct osr_jw_s {
  osr_buf_t b; /* the text so far (no NUL until release) */
  int err;     /* nonzero: FAILED */
} osr_jw_t;

/** Initialise an EMPTY writer whose text may grow to `max` bytes (the NUL
 *  added by osr_jw_release included). Allocates nothing yet. */
void osr_jw_init(osr_jw_t *w, size_t max);

/** Free the text, if any; the writer is EMPTY (FAILED no longer) and may
 *  be used again. */
void osr_jw_dispose(osr_jw_t *w);

/** Append `n` bytes as they are; the caller vouches that they are JSON in
 *  this position (a literal, a fragment dumped by jansson). */
void osr_jw_raw(osr_jw_t *w, const char *s, size_t n);

/** Append a string literal as it is (structure: "{\"key\":", ","). */
#define osr_jw_lit(w, lit) osr_jw_raw((w), "" lit, sizeof(lit) - 1)

/** Append the NUL-terminated `s` as a JSON string with jansson's escaping
 *  (\" \\ \b \f \n \r \t, other bytes below 0x20 as \u00XX in upper-case
 *  hex; '/', 0x7f and UTF-8 as they are), or null when `s` is NULL. */
void osr_jw_str(osr_jw_t *w, const char *s);

/** Append the `n` bytes at `s` as a JSON string, escaped as osr_jw_str
 *  does; a NUL byte among them is written \u0000, as jansson writes a
 *  string holding one (json_stringn). */
void osr_jw_strn(osr_jw_t *w, const char *s, size_t n);

/** Append `v` in decimal, as jansson prints a json_integer. */
void osr_jw_int(osr_jw_t *w, int64_t v);

/** Append true when `v` is nonzero, else false (as json_pack's "b"). */
void osr_jw_bool(osr_jw_t *w, int v);

/** Append `ms` (Unix time in milliseconds) as a quoted osr_jw_rfc3339
 *  string, or null when ms <= 0. */
void osr_jw_time(osr_jw_t *w, int64_t ms);

/** Put the writer in FAILED: for a caller whose own part of the text could
 *  not be produced (out of memory); osr_jw_release will return NULL. */
static inline void osr_jw_fail(osr_jw_t *w)
{
  w->err = 1;
}

/** Hand over the text: NUL-terminated, its length (without the NUL) in
 *  `*len`; free it with osr_free. Returns NULL if the writer FAILED (or
 *  the NUL does not fit). The writer is EMPTY afterwards either way. */
char *osr_jw_release(osr_jw_t *w, size_t *len);

/** Write `ms` (Unix time in milliseconds; negative counts as 0) as
 *  "YYYY-MM-DDTHH:MM:SS.mmmZ" in UTC: 24 bytes and a NUL into `out`. The
 *  year is clamped to 9999. Pure arithmetic, no gmtime/strftime. */
void osr_jw_rfc3339(int64_t ms, char out[32]);

#endif
