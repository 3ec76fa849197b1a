/*
 * Address strings used in OSR configuration and APIs:
 *   "127.0.0.1:8080", "[::1]:8080", "0.0.0.0:80", "[::]:443"   numeric IP
 *   "localhost:8080", "api.example.com:443"                    host name (connect only)
 *   "unix:/run/osr/agent.sock"                                 unix socket
 * Parsing is pure (no DNS, no logging) and bounded.
 */
#ifndef OSR_NET_ADDR_H
#define OSR_NET_ADDR_H

#include <stdint.h>
#include "osr/common.h"

#define OSR_ADDR_HOST_MAX 255
#define OSR_ADDR_PATH_MAX 107 /* sun_path */

typedef struct osr_addr_s {
  int is_unix;
  char host[OSR_ADDR_HOST_MAX + 1]; /* without brackets for IPv6 */
  char path[OSR_ADDR_PATH_MAX + 1]; /* unix only */
  uint16_t port;
} osr_addr_t;

/** Parse `s`. Returns 0 or OSR_EINVAL (empty host, bad port, too long). */
int osr_addr_parse(const char *s, osr_addr_t *out);

/** If `a` is a numeric IPv4/IPv6 address fill `ss` and return 0, else OSR_EINVAL. */
int osr_addr_to_sockaddr(const osr_addr_t *a, struct sockaddr_storage *ss);

#endif
