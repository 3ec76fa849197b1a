/*
 * Fuzz the cached-binding parser (osr_binding_from_json): its input comes
 * from Redis, i.e. from the network. Beyond "no crash, no leak" it checks
 * the parser's promises: on success every field is terminated within its
 * array and in range, and the binding survives a round trip unchanged; on
 * failure the binding owns nothing.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache/redis.h"
#include "util/mem.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(x)           \
  do {                     \
    if (!(x))              \
      __builtin_trap();    \
  } while (0)

static void free_docs(osr_binding_t *b)
{
  osr_freep(&b->request_json);
  osr_freep(&b->granted_json);
  osr_freep(&b->metadata_json);
  osr_freep(&b->error_json);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  osr_binding_t b, b2;
  char *js = NULL, *js2 = NULL;
  int rv = osr_binding_from_json((const char *)data, size, &b);

  if (rv != 0) {
    CHECK(rv == OSR_EINVAL || rv == OSR_ENOMEM);
    CHECK(b.request_json == NULL && b.granted_json == NULL && b.metadata_json == NULL &&
          b.error_json == NULL);
    return 0;
  }
  CHECK(strnlen(b.id, sizeof(b.id)) < sizeof(b.id));
  CHECK(strnlen(b.tenant, sizeof(b.tenant)) < sizeof(b.tenant));
  CHECK(strnlen(b.idem_key, sizeof(b.idem_key)) < sizeof(b.idem_key));
  CHECK(strnlen(b.request_hash, sizeof(b.request_hash)) < sizeof(b.request_hash));
  CHECK(strnlen(b.template_id, sizeof(b.template_id)) < sizeof(b.template_id));
  CHECK(strnlen(b.provider, sizeof(b.provider)) < sizeof(b.provider));
  CHECK(strnlen(b.provider_id, sizeof(b.provider_id)) < sizeof(b.provider_id));
  CHECK(strnlen(b.region, sizeof(b.region)) < sizeof(b.region));
  CHECK(strnlen(b.agent_endpoint, sizeof(b.agent_endpoint)) < sizeof(b.agent_endpoint));
  CHECK(strnlen(b.end_reason, sizeof(b.end_reason)) < sizeof(b.end_reason));
  CHECK(osr_redis_id_is_valid(b.id, strlen(b.id)));
  CHECK(b.state >= OSR_BINDING_CREATING && b.state <= OSR_BINDING_LOST);
  CHECK(b.isolation >= OSR_ISO_NONE && b.isolation <= OSR_ISO_FIRECRACKER);
  CHECK(b.created_ms >= 0 && b.updated_ms >= 0 && b.expires_ms >= 0 && b.ended_ms >= 0);
  CHECK(b.request_json == NULL || strlen(b.request_json) <= OSR_BINDING_DOC_MAX);

  /* What was accepted must serialise and read back to the same thing. */
  rv = osr_binding_to_json(&b, &js);
  CHECK(rv == 0 || rv == OSR_ENOMEM);
  if (rv == 0) {
    rv = osr_binding_from_json(js, strlen(js), &b2);
    CHECK(rv == 0 || rv == OSR_ENOMEM);
    if (rv == 0) {
      CHECK(osr_binding_to_json(&b2, &js2) == 0);
      CHECK(strcmp(js, js2) == 0);
      free_docs(&b2);
    }
  }
  osr_free(js);
  osr_free(js2);
  free_docs(&b);
  return 0;
}
