/*
 * Upstream credentials (docs/dataplane.md "Sandboxes on E2B").
 *
 * A sandbox that lives on a remote provider with its own envd (E2B) has no
 * osr-agent: the data plane talks to the provider's envd and port proxy
 * directly, with the provider's per-sandbox token. That token came back
 * from the provider's create and the adapter sealed it into the agent
 * endpoint (token.h, osr_upstream_seal): "<url>#osr-up=<sealed>". The
 * client's binding token carries that endpoint in its "ep" claim, readable
 * but not openable without the agent secret, so the client never learns
 * the provider's token and the provider never sees the client's (proxy.c
 * drops the client's credential headers before adding the provider's).
 *
 * The sealed plaintext is four lines: "v1", the Host suffix
 * "<providerSandboxId>.<domain>", envd's access token and the traffic
 * access token (either may be empty).
 */
#include <stdio.h>
#include <string.h>

#include "dataplane/dp_int.h"
#include "util/log.h"

#define MOD OSR_DP_MOD

/* Copy the next '\n'-terminated (or last) field of *p into out. */
static int take_line(const char **p, char *out, size_t outlen)
{
  const char *s = *p;
  if (s == NULL)
    return OSR_EINVAL;
  const char *nl = strchr(s, '\n');
  size_t n = nl != NULL ? (size_t)(nl - s) : strlen(s);
  if (n >= outlen)
    return OSR_E2BIG;
  memcpy(out, s, n);
  out[n] = '\0';
  *p = nl != NULL ? nl + 1 : NULL;
  return 0;
}

int osr__dp_upstream_open(osr_dataplane_t *dp, const char *ep, const char *sid, dp_upstream_t *up)
{
  const char *frag = strstr(ep, OSR_UPSTREAM_FRAG);
  if (frag == NULL)
    return 0;
  memset(up, 0, sizeof(*up));
  char agent_tok[65];
  if (dp->cfg.agent_secret == NULL || osr_agent_token(dp->cfg.agent_secret, sid, agent_tok) != 0)
    return OSR_EINVAL;
  const char *sealed = frag + strlen(OSR_UPSTREAM_FRAG);
  char plain[OSR_UPSTREAM_PLAIN_MAX + 1];
  int n = osr_upstream_open(agent_tok, sid, sealed, strlen(sealed), plain, sizeof(plain));
  memset(agent_tok, 0, sizeof(agent_tok));
  if (n < 0)
    return OSR_EINVAL;
  char ver[8];
  const char *p = plain;
  int rv = take_line(&p, ver, sizeof(ver));
  if (rv == 0 && strcmp(ver, "v1") != 0)
    rv = OSR_EINVAL;
  if (rv == 0)
    rv = take_line(&p, up->host, sizeof(up->host));
  if (rv == 0)
    rv = take_line(&p, up->token, sizeof(up->token));
  if (rv == 0 && p != NULL)
    rv = take_line(&p, up->traffic, sizeof(up->traffic));
  memset(plain, 0, sizeof(plain));
  if (rv != 0 || up->host[0] == '\0') {
    memset(up, 0, sizeof(*up));
    return OSR_EINVAL;
  }
  /* "https://49983-<host>": the provider's own Host form, where every port
   * has its own name; anything else is an override (E2B_SANDBOX_URL) that
   * routes by the Host header we send. */
  char form[320];
  snprintf(form, sizeof(form), "https://%u-%s", OSR_DP_ENVD_PORT, up->host);
  size_t fl = strlen(form);
  up->by_host = strncmp(ep, form, fl) == 0 && (ep[fl] == '#' || ep[fl] == '/' || ep[fl] == ':');
  return 1;
}

int osr__dp_upstream_addr(const dp_upstream_t *up, uint16_t port, char *addr, size_t addrlen)
{
  if (!up->by_host)
    return 0;
  int n = snprintf(addr, addrlen, "%u-%s:443", port, up->host);
  return n > 0 && (size_t)n < addrlen ? 0 : OSR_E2BIG;
}
