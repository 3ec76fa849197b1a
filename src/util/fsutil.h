/*
 * File-system helpers for start-up code (they block: never call them on a
 * running loop; use the thread pool there).
 */
#ifndef OSR_UTIL_FSUTIL_H
#define OSR_UTIL_FSUTIL_H

#include <sys/types.h>

/** mkdir -p: create `dir` and missing parents with `mode`; directories that
 *  exist keep their mode (the operator chose it). Returns 0, -errno,
 *  OSR_E2BIG for an overlong path, or OSR_EINVAL if `dir` exists but is not
 *  a directory. */
int osr_mkdir_p(const char *dir, mode_t mode);

#endif
