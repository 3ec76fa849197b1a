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
 *
 * Opening costs two HMAC-SHA256 and an AES-GCM decryption, ~31k
 * instructions (callgrind), more than the rest of a proxied request, so
 * opened credentials are memoised per (sandbox id, sealed text): an exact
 * match of both is what was opened before, so a hit needs no crypto. At
 * most UP_MAX entries (when full the table is emptied: a burst of opens,
 * never unbounded growth); a revocation drops the sandbox's entries, and
 * freed entries are wiped (they hold the provider's token).
 */
#include <stdio.h>
#include <string.h>

#include "dataplane/dp_int.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/text.h"

#define MOD        OSR_DP_MOD
#define UP_BUCKETS 256
#define UP_MAX     1024

typedef struct up_ent_s {
  struct up_ent_s *next;
  char sid[OSR_DP_SID_MAX];
  size_t slen;
  char *sealed; /* the sealed text (key), slen bytes */
  dp_upstream_t up;
} up_ent_t;

struct dp_upcache_s {
  up_ent_t *buckets[UP_BUCKETS];
  size_t count;
};

static unsigned up_hash(const char *sid, const char *sealed, size_t slen)
{
  /* The tail of the seal is the GCM tag: random-looking, so a few bytes
   * spread entries as well as all of them would. */
  size_t from = slen > 16 ? slen - 16 : 0;
  return osr_fnv1a(osr_fnv1a_str(sid), sealed + from, slen - from) % UP_BUCKETS;
}

static void ent_free(up_ent_t *e)
{
  memset(&e->up, 0, sizeof(e->up));
  osr_free(e->sealed);
  osr_free(e);
}

static void up_drop(struct dp_upcache_s *c, const char *sid)
{
  for (size_t b = 0; b < UP_BUCKETS; b++) {
    up_ent_t **pp = &c->buckets[b];
    while (*pp != NULL) {
      up_ent_t *e = *pp;
      if (sid == NULL || strcmp(e->sid, sid) == 0) {
        *pp = e->next;
        c->count--;
        ent_free(e);
      } else {
        pp = &e->next;
      }
    }
  }
}

void osr__dp_upstream_forget(osr_dataplane_t *dp, const char *sid)
{
  if (dp->upcache != NULL)
    up_drop(dp->upcache, sid);
}

void osr__dp_upstream_free(osr_dataplane_t *dp)
{
  if (dp->upcache == NULL)
    return;
  up_drop(dp->upcache, NULL);
  osr_free(dp->upcache);
  dp->upcache = NULL;
}

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

/* "https://49983-<host>": the provider's own Host form, where every port
 * has its own name; anything else is an override (E2B_SANDBOX_URL) that
 * routes by the Host header we send. From the endpoint, not the cache: the
 * seal is the key there. */
static int by_host(const char *ep, const dp_upstream_t *up)
{
  char form[320];
  snprintf(form, sizeof(form), "https://%u-%s", OSR_DP_ENVD_PORT, up->host);
  size_t fl = strlen(form);
  return strncmp(ep, form, fl) == 0 && (ep[fl] == '#' || ep[fl] == '/' || ep[fl] == ':');
}

int osr__dp_upstream_open(osr_dataplane_t *dp, const char *ep, const char *sid, dp_upstream_t *up)
{
  const char *frag = strstr(ep, OSR_UPSTREAM_FRAG);
  if (frag == NULL)
    return 0;
  memset(up, 0, sizeof(*up));
  const char *sealed = frag + strlen(OSR_UPSTREAM_FRAG);
  size_t slen = strlen(sealed);
  struct dp_upcache_s *c = dp->upcache;
  unsigned b = up_hash(sid, sealed, slen);
  if (c != NULL) {
    for (up_ent_t *e = c->buckets[b]; e != NULL; e = e->next) {
      if (e->slen == slen && strcmp(e->sid, sid) == 0 && memcmp(e->sealed, sealed, slen) == 0) {
        *up = e->up;
        up->by_host = by_host(ep, up);
        return 1;
      }
    }
  }
  char agent_tok[65];
  if (dp->cfg.agent_secret == NULL || osr_agent_token(dp->cfg.agent_secret, sid, agent_tok) != 0)
    return OSR_EINVAL;
  char plain[OSR_UPSTREAM_PLAIN_MAX + 1];
  int n = osr_upstream_open(agent_tok, sid, sealed, slen, plain, sizeof(plain));
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
  up->by_host = by_host(ep, up);
  if (strlen(sid) < OSR_DP_SID_MAX) {
    if (c == NULL)
      c = dp->upcache = osr_xcalloc(1, sizeof(*c));
    if (c->count >= UP_MAX)
      up_drop(c, NULL);
    up_ent_t *e = osr_xcalloc(1, sizeof(*e));
    osr_str_copy(e->sid, sizeof(e->sid), sid);
    e->slen = slen;
    e->sealed = osr_xmalloc(slen + 1);
    memcpy(e->sealed, sealed, slen + 1);
    e->up = *up;
    e->next = c->buckets[b];
    c->buckets[b] = e;
    c->count++;
  }
  return 1;
}

int osr__dp_upstream_addr(const dp_upstream_t *up, uint16_t port, char *addr, size_t addrlen)
{
  if (!up->by_host)
    return 0;
  int n = snprintf(addr, addrlen, "%u-%s:443", port, up->host);
  return n > 0 && (size_t)n < addrlen ? 0 : OSR_E2BIG;
}
