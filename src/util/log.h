/*
 * Structured logging with levels (STYLE 23).
 *
 * OSR_LOG_*(module, fmt, ...) checks the level before evaluating its
 * arguments, so disabled debug lines cost one comparison. Output goes to
 * stderr as text ("2026-11-30T09:00:00.123Z WARN  [http1] message") or, with
 * osr_log_set_json(1), as one JSON object per line:
 *   {"ts":"...","level":"warn","module":"http1","msg":"..."}
 * Parsers never log; they return codes and their owner logs.
 */
#ifndef OSR_UTIL_LOG_H
#define OSR_UTIL_LOG_H

#include "osr/common.h"

typedef enum osr_log_level_e {
  OSR_LOG_TRACE = 0,
  OSR_LOG_DEBUG = 1,
  OSR_LOG_INFO = 2,
  OSR_LOG_WARN = 3,
  OSR_LOG_ERROR = 4,
  OSR_LOG_OFF = 5,
} osr_log_level_t;

extern osr_log_level_t osr__log_level;

void osr_log_set_level(osr_log_level_t level);
/** Parse "trace|debug|info|warn|error|off"; returns 0 or OSR_EINVAL. */
int osr_log_parse_level(const char *s, osr_log_level_t *out);
void osr_log_set_json(int enabled);

void osr_log_write(osr_log_level_t level, const char *module, const char *fmt, ...) OSR_PRINTF(3, 4);

#define OSR_LOG(level, module, ...)            \
  do {                                         \
    if ((level) >= osr__log_level)             \
      osr_log_write((level), (module), __VA_ARGS__); \
  } while (0)

#define OSR_LOG_TRACE(m, ...) OSR_LOG(OSR_LOG_TRACE, m, __VA_ARGS__)
#define OSR_LOG_DEBUG(m, ...) OSR_LOG(OSR_LOG_DEBUG, m, __VA_ARGS__)
#define OSR_LOG_INFO(m, ...) OSR_LOG(OSR_LOG_INFO, m, __VA_ARGS__)
#define OSR_LOG_WARN(m, ...) OSR_LOG(OSR_LOG_WARN, m, __VA_ARGS__)
#define OSR_LOG_ERROR(m, ...) OSR_LOG(OSR_LOG_ERROR, m, __VA_ARGS__)

#endif
