/*
 * Fuzz the configuration reader: the bounded YAML -> JSON stage
 * (osr_gw_config_parse_yaml) on every input, and, for inputs that parse,
 * the whole loader (schema checks, secret references, precedence) through
 * a memfd handed over as --config /proc/self/fd/N.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gateway/gw.h"
#include "util/log.h"
#include "util/mem.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Limits the reader promises (gw.h). */
static void check_shape(const json_t *j, int depth, size_t *nodes)
{
  if (depth > 32 || ++*nodes > 10000 * 2)
    __builtin_trap();
  if (json_is_object(j)) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)j, k, v) check_shape(v, depth + 1, nodes);
  } else if (json_is_array(j)) {
    size_t i;
    json_t *v;
    json_array_foreach(j, i, v) check_shape(v, depth + 1, nodes);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  char err[512];
  json_t *j = NULL;
  osr_log_set_level(OSR_LOG_OFF);
  memset(err, 'x', sizeof(err));
  int rv = osr_gw_config_parse_yaml((const char *)data, size, &j, err, sizeof(err));
  if (rv != 0) {
    /* Failures leave nothing behind and always say why. */
    if (j != NULL || memchr(err, '\0', sizeof(err)) == NULL || err[0] == '\0')
      __builtin_trap();
    return 0;
  }
  if (j == NULL)
    __builtin_trap();
  size_t nodes = 0;
  check_shape(j, 1, &nodes);
  char *s = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
  if (s == NULL)
    __builtin_trap();
  osr_json_free(s);
  json_decref(j);

  int fd = memfd_create("osr-fuzz-config", MFD_CLOEXEC);
  if (fd < 0)
    return 0;
  if (write(fd, data, size) == (ssize_t)size) {
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    char *argv[] = {(char *)"--config", path, (char *)"--data-dir", (char *)"/nonexistent/osr"};
    osr_gw_config_t cfg;
    rv = osr_gw_config_load(&cfg, 4, argv, err, sizeof(err));
    if (rv == 0) {
      json_t *red = osr_gw_config_to_json_redacted(&cfg);
      if (red == NULL || cfg.nlisten == 0 || cfg.providers == NULL)
        __builtin_trap();
      json_decref(red);
      osr_gw_config_dispose(&cfg);
    } else if (rv != OSR_EINVAL || err[0] == '\0') {
      __builtin_trap();
    }
  }
  close(fd);
  return 0;
}
