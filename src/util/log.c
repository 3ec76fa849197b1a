#include "util/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

osr_log_level_t osr__log_level = OSR_LOG_INFO;
static int log_json;

static const char *const level_names[] = {"trace", "debug", "info", "warn", "error", "off"};

void osr_log_set_level(osr_log_level_t level)
{
  osr__log_level = level;
}

int osr_log_parse_level(const char *s, osr_log_level_t *out)
{
  for (size_t i = 0; i < OSR_ARRAY_SIZE(level_names); i++) {
    if (strcasecmp(s, level_names[i]) == 0) {
      *out = (osr_log_level_t)i;
      return 0;
    }
  }
  return OSR_EINVAL;
}

void osr_log_set_json(int enabled)
{
  log_json = enabled;
}

/* Append `s` to `out` as JSON string contents (without quotes). */
static size_t json_escape(char *out, size_t cap, const char *s)
{
  size_t n = 0;
  for (; *s != '\0' && n + 7 < cap; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      out[n++] = '\\';
      out[n++] = (char)c;
    } else if (c == '\n') {
      out[n++] = '\\';
      out[n++] = 'n';
    } else if (c < 0x20) {
      n += (size_t)snprintf(out + n, cap - n, "\\u%04x", c);
    } else {
      out[n++] = (char)c;
    }
  }
  out[n] = '\0';
  return n;
}

void osr_log_write(osr_log_level_t level, const char *module, const char *fmt, ...)
{
  char msg[2048];
  char ts[40];
  struct timeval tv;
  struct tm tm;
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);

  gettimeofday(&tv, NULL);
  gmtime_r(&tv.tv_sec, &tm);
  size_t tn = strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(ts + tn, sizeof(ts) - tn, ".%03dZ", (int)(tv.tv_usec / 1000));

  if (level > OSR_LOG_OFF)
    level = OSR_LOG_ERROR;
  if (log_json) {
    char esc[sizeof(msg) * 2];
    json_escape(esc, sizeof(esc), msg);
    fprintf(stderr, "{\"ts\":\"%s\",\"level\":\"%s\",\"module\":\"%s\",\"msg\":\"%s\"}\n", ts,
            level_names[level], module, esc);
  } else {
    fprintf(stderr, "%s %-5s [%s] %s\n", ts, level_names[level], module, msg);
  }
}
