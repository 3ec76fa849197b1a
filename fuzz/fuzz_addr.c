/* Fuzz the address parser used by every --listen flag and connect call. */
#include <stdint.h>
#include <string.h>

#include "net/addr.h"
#include "util/mem.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  char s[512];
  osr_addr_t a;
  struct sockaddr_storage ss;
  if (size >= sizeof(s))
    size = sizeof(s) - 1;
  memcpy(s, data, size);
  s[size] = '\0';
  if (osr_addr_parse(s, &a) == 0) {
    /* A parsed address is always NUL-terminated and within bounds. */
    if (strlen(a.host) > OSR_ADDR_HOST_MAX || strlen(a.path) > OSR_ADDR_PATH_MAX)
      __builtin_trap();
    if (a.is_unix && a.path[0] == '\0')
      __builtin_trap();
    osr_addr_to_sockaddr(&a, &ss);
  }
  return 0;
}
