/*
 * Streaming multipart/form-data parser (RFC 7578 / RFC 2046) for POST
 * /files uploads: file parts of any size pass through in bounded memory.
 *
 * Feed body bytes as they arrive; the parser calls
 *   on_part(headers of one part)          when a part's header block ends,
 *   on_data(bytes of the current part)     zero or more times,
 *   on_part_end()                          when its closing delimiter is seen.
 * Any callback may return 1 to pause: osr_mp_feed() then returns at once
 * with the bytes consumed so far, and the owner feeds the rest later (after
 * its file write completed). Data spans point into the fed bytes or into
 * the parser's own delimiter copy; they are valid only during the callback.
 *
 * Bounds: a part's header block is at most OSR_MP_MAX_HEADER bytes, a data
 * span at most OSR_MP_MAX_SPAN, the boundary at most 70 characters
 * (RFC 2046). Pure: no I/O, no logging; fuzzed with the envelope parser.
 */
#ifndef OSR_AGENT_MULTIPART_H
#define OSR_AGENT_MULTIPART_H

#include <stddef.h>

#include "osr/common.h"

#define OSR_MP_MAX_HEADER   8192
#define OSR_MP_MAX_SPAN     65536
#define OSR_MP_MAX_BOUNDARY 70

typedef struct osr_mp_s osr_mp_t;

typedef struct osr_mp_events_s {
  /** A part begins; `filename`/`name` are the Content-Disposition
   *  parameters (NUL-terminated, unescaped, "" if absent). */
  int (*on_part)(osr_mp_t *mp, const char *name, const char *filename);
  int (*on_data)(osr_mp_t *mp, const char *data, size_t len);
  int (*on_part_end)(osr_mp_t *mp);
} osr_mp_events_t;

struct osr_mp_s {
  void *data; /**< owner's pointer */
  int done;   /**< the closing delimiter was seen */
  /* private */
  const osr_mp_events_t *_ev;
  char _delim[4 + OSR_MP_MAX_BOUNDARY + 1]; /* "\r\n--" boundary */
  size_t _dlen;
  size_t _match; /* delimiter bytes matched so far */
  int _state;
  int _in_part;
  char _hdr[OSR_MP_MAX_HEADER + 1];
  size_t _hlen;
  char _name[256];
  char _filename[4096];
};

/** Parse the boundary out of a Content-Type value and reset `mp`.
 *  Returns 0 or OSR_EINVAL (not multipart/form-data, no or bad boundary). */
OSR_WUR int osr_mp_init(osr_mp_t *mp, const char *content_type, size_t ct_len,
                        const osr_mp_events_t *ev, void *data);

/**
 * Feed bytes. Returns the number consumed (== len unless a callback paused)
 * or a negative error: OSR_EHTTP (malformed), OSR_ETOOLARGE (a header block
 * over the cap). Bytes after the closing delimiter are ignored (epilogue).
 */
long osr_mp_feed(osr_mp_t *mp, const char *data, size_t len);

#endif
