/*
 * osr_ring_t: the bounded output history of one process (osr-agent).
 *
 * Every byte a process writes (stdout, stderr or its pty) gets an absolute
 * offset: the first byte is 0 and offsets never repeat. The ring keeps the
 * newest `cap` bytes; [start, end) is what is still held. A client that
 * re-attaches asks for an offset and gets the bytes from there on, each
 * tagged with the stream it came from.
 *
 * Stream tags are kept as a list of segments (start offset + kind), one per
 * change of stream, so interleaved stdout/stderr costs one entry per switch,
 * not per byte. That list is bounded too (`max_segs`): when it is full the
 * oldest bytes are dropped as if the byte cap had been reached.
 *
 * Appending always succeeds and evicts the oldest bytes as needed; the
 * owner keeps unsent bytes from being evicted by not reading more than
 * osr_ring_room() allows for its slowest reader (that is how backpressure
 * reaches the process's pipes).
 *
 * Memory: one allocation of `cap` bytes and one of `max_segs` segments, made
 * by osr_ring_init (fixed-size control structures, aborting allocator).
 */
#ifndef OSR_AGENT_RING_H
#define OSR_AGENT_RING_H

#include <stddef.h>
#include <stdint.h>

#include "osr/common.h"

typedef struct osr_ring_seg_s {
  uint64_t off; /* absolute offset of the first byte of this segment */
  int kind;     /* owner-defined stream tag (1 stdout, 2 stderr, 3 pty) */
} osr_ring_seg_t;

typedef struct osr_ring_s {
  char *buf;
  size_t cap;
  uint64_t start; /**< oldest offset still held */
  uint64_t end;   /**< offset of the next byte to be appended */
  /* private */
  osr_ring_seg_t *_segs;
  size_t _max_segs, _seg_head, _nsegs;
} osr_ring_t;

/** Allocate a ring of `cap` bytes (> 0) and `max_segs` (>= 2) segments. */
void osr_ring_init(osr_ring_t *r, size_t cap, size_t max_segs);
void osr_ring_dispose(osr_ring_t *r);

/** Append n bytes of stream `kind`; n may exceed cap (only the tail is
 *  kept). Evicts the oldest bytes as needed. */
void osr_ring_append(osr_ring_t *r, int kind, const void *data, size_t n);

/**
 * Append in place (a read straight into the ring, no copy): the contiguous
 * space at the end, *len bytes up to the wrap (>= 1). Writing there
 * overwrites the oldest bytes, so write at most osr_ring_room() for the
 * slowest reader, then commit what was written; nothing else may touch the
 * ring in between.
 */
char *osr_ring_tail(const osr_ring_t *r, size_t *len);
/** The first n (<= the tail's length) bytes of osr_ring_tail() are stream
 *  `kind`'s newest output: as osr_ring_append() of them, without the copy. */
void osr_ring_commit(osr_ring_t *r, int kind, size_t n);

/** Bytes that can be appended without evicting anything at or after
 *  offset `keep_from` (the slowest reader's position). */
size_t osr_ring_room(const osr_ring_t *r, uint64_t keep_from);

/**
 * Look at the bytes from offset `off`: fills iov[0..1] (the run may wrap)
 * with at most `max` bytes that all belong to one stream, sets *kind and
 * returns the byte count (0 when off == end), or -1 when off < start (those
 * bytes were evicted) or off > end.
 * The slices stay valid until the next append.
 */
long osr_ring_peek(const osr_ring_t *r, uint64_t off, size_t max, int *kind, osr_iovec_t iov[2]);

#endif
