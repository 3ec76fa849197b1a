#include "net/addr.h"

#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

static int parse_port(const char *p, uint16_t *out)
{
  unsigned long v = 0;
  if (*p == '\0')
    return OSR_EINVAL;
  for (; *p != '\0'; p++) {
    if (*p < '0' || *p > '9')
      return OSR_EINVAL;
    v = v * 10 + (unsigned long)(*p - '0');
    if (v > 65535)
      return OSR_EINVAL;
  }
  *out = (uint16_t)v;
  return 0;
}

int osr_addr_parse(const char *s, osr_addr_t *out)
{
  memset(out, 0, sizeof(*out));
  if (strncmp(s, "unix:", 5) == 0) {
    size_t n = strlen(s + 5);
    if (n == 0 || n > OSR_ADDR_PATH_MAX)
      return OSR_EINVAL;
    memcpy(out->path, s + 5, n + 1);
    out->is_unix = 1;
    return 0;
  }
  const char *host = s, *colon;
  size_t hlen;
  if (*s == '[') {
    const char *end = strchr(s, ']');
    if (end == NULL || end[1] != ':')
      return OSR_EINVAL;
    host = s + 1;
    hlen = (size_t)(end - host);
    colon = end + 1;
  } else {
    colon = strrchr(s, ':');
    if (colon == NULL)
      return OSR_EINVAL;
    hlen = (size_t)(colon - s);
    if (memchr(s, ':', hlen) != NULL)
      return OSR_EINVAL; /* bare IPv6 needs brackets */
  }
  if (hlen == 0 || hlen > OSR_ADDR_HOST_MAX)
    return OSR_EINVAL;
  memcpy(out->host, host, hlen);
  out->host[hlen] = '\0';
  return parse_port(colon + 1, &out->port);
}

int osr_addr_to_sockaddr(const osr_addr_t *a, struct sockaddr_storage *ss)
{
  memset(ss, 0, sizeof(*ss));
  if (a->is_unix)
    return OSR_EINVAL;
  if (uv_ip4_addr(a->host, a->port, (struct sockaddr_in *)ss) == 0)
    return 0;
  if (uv_ip6_addr(a->host, a->port, (struct sockaddr_in6 *)ss) == 0)
    return 0;
  return OSR_EINVAL;
}
