/*
 * Page-backed fixed-size objects; see slab.h.
 *
 * A page is 4 KiB from mmap, aligned, so an object finds its page by
 * masking its address. The page starts with its header; objects follow,
 * each rounded to 16 bytes. Free objects form a list through their first
 * bytes; objects never handed out yet are carved from the tail in order.
 */
#include "util/slab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "util/asan.h"

#define PAGE 4096u
#define HDR  64u /* header size, a multiple of 16 */

struct osr_slab_page_s {
  osr_slab_page_t *prev, *next; /* on the partial list */
  void *free;                   /* freed objects */
  uint32_t used;                /* objects handed out */
  uint32_t carved;              /* objects ever handed out (tail bump) */
  uint32_t cap;
  int on_partial;
};

_Static_assert(sizeof(osr_slab_page_t) <= HDR, "page header fits");

static size_t obj_size(const osr_slab_t *s)
{
  return (s->size + 15) & ~(size_t)15;
}

static void partial_push(osr_slab_t *s, osr_slab_page_t *pg)
{
  pg->prev = NULL;
  pg->next = s->partial;
  if (s->partial != NULL)
    s->partial->prev = pg;
  s->partial = pg;
  pg->on_partial = 1;
}

static void partial_unlink(osr_slab_t *s, osr_slab_page_t *pg)
{
  if (pg->prev != NULL)
    pg->prev->next = pg->next;
  else
    s->partial = pg->next;
  if (pg->next != NULL)
    pg->next->prev = pg->prev;
  pg->prev = pg->next = NULL;
  pg->on_partial = 0;
}

static osr_slab_page_t *page_new(osr_slab_t *s)
{
  osr_slab_page_t *pg = s->spare;
  if (pg != NULL) {
    s->spare = pg->next;
    s->nspare--;
    pg->next = NULL;
    return pg; /* empty, header reset by page_release */
  }
  void *m = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    return NULL;
  pg = m;
  memset(pg, 0, sizeof(*pg));
  pg->cap = (uint32_t)((PAGE - HDR) / obj_size(s));
  OSR_POISON((char *)pg + HDR, PAGE - HDR);
  s->npages++;
  return pg;
}

/* The page's last object was freed. */
static void page_release(osr_slab_t *s, osr_slab_page_t *pg)
{
  if (pg->on_partial)
    partial_unlink(s, pg);
  if (s->nspare < (s->max_spare != 0 ? s->max_spare : 1)) {
    pg->free = NULL;
    pg->carved = 0;
    pg->next = s->spare;
    s->spare = pg;
    s->nspare++;
    return;
  }
  munmap(pg, PAGE);
  s->npages--;
}

void *osr_slab_alloc(osr_slab_t *s)
{
  size_t sz = obj_size(s);
  if (sz == 0 || sz > 1024)
    return NULL;
  osr_slab_page_t *pg = s->partial;
  if (pg == NULL) {
    pg = page_new(s);
    if (pg == NULL)
      return NULL;
    partial_push(s, pg);
  }
  char *o;
  if (pg->free != NULL) {
    o = pg->free;
    OSR_UNPOISON(o, sizeof(void *));
    pg->free = *(void **)(void *)o;
  } else {
    o = (char *)pg + HDR + (size_t)pg->carved * sz;
    pg->carved++;
  }
  if (++pg->used == pg->cap)
    partial_unlink(s, pg); /* full */
  OSR_UNPOISON(o, sz);
  memset(o, 0, sz);
  return o;
}

void *osr_slab_xalloc(osr_slab_t *s)
{
  void *p = osr_slab_alloc(s);
  if (p == NULL) {
    fprintf(stderr, "osr: out of memory allocating a %zu-byte slab object\n", s->size);
    abort();
  }
  return p;
}

void osr_slab_free(osr_slab_t *s, void *p)
{
  if (p == NULL)
    return;
  osr_slab_page_t *pg = (osr_slab_page_t *)((uintptr_t)p & ~(uintptr_t)(PAGE - 1));
  size_t sz = obj_size(s);
  *(void **)p = pg->free;
  pg->free = p;
  OSR_POISON(p, sz); /* the link too: osr_slab_alloc unpoisons it to read it */
  if (--pg->used == 0) {
    page_release(s, pg);
    return;
  }
  if (!pg->on_partial)
    partial_push(s, pg);
}
