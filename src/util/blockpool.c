/*
 * Per-thread block caches (see blockpool.h for why).
 */
#include "util/blockpool.h"

#include <pthread.h>

#include "util/asan.h"
#include "util/mem.h"


static const unsigned block_max[OSR_BLOCK_NCLASSES] = {OSR_BLOCK_CACHE_MAX, OSR_BLOCK_CACHE_MAX / 4};

typedef struct {
  void *blocks[OSR_BLOCK_NCLASSES][OSR_BLOCK_CACHE_MAX];
  unsigned n[OSR_BLOCK_NCLASSES];
  int registered; /* the exit destructor knows this thread's cache */
} block_cache_t;

static __thread block_cache_t cache __attribute__((tls_model("initial-exec")));
static pthread_key_t cache_key;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;

static void cache_free(void *arg)
{
  block_cache_t *c = arg;
  for (int k = 0; k < OSR_BLOCK_NCLASSES; k++) {
    while (c->n[k] != 0) {
      void *p = c->blocks[k][--c->n[k]];
      OSR_UNPOISON(p, osr_block_size((osr_block_class_t)k));
      osr_free(p);
    }
  }
}

static void cache_key_init(void)
{
  (void)pthread_key_create(&cache_key, cache_free);
}

void *osr_block_get(osr_block_class_t cls)
{
  block_cache_t *c = &cache;
  if (c->n[cls] != 0) {
    void *p = c->blocks[cls][--c->n[cls]];
    OSR_UNPOISON(p, osr_block_size(cls));
    return p;
  }
  return osr_try_malloc(osr_block_size(cls));
}

void osr_block_put(osr_block_class_t cls, void *p)
{
  block_cache_t *c = &cache;
  if (p == NULL)
    return;
  if (c->n[cls] >= block_max[cls]) {
    osr_free(p);
    return;
  }
  if (!c->registered) {
    /* Blocks cached by a thread are freed when it exits; the main thread's
     * stay reachable from its TLS until the process ends. */
    (void)pthread_once(&cache_once, cache_key_init);
    (void)pthread_setspecific(cache_key, c);
    c->registered = 1;
  }
  OSR_POISON(p, osr_block_size(cls));
  c->blocks[cls][c->n[cls]++] = p;
}
