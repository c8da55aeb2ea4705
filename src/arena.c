/* arena.c: counted host allocations (the CPU backend's memory).
 *
 * Large blocks are recycled: glibc serves blocks above 32 MiB with mmap and returns them
 * with munmap, so a buffer allocated and freed every step (the loss chunk's logits: 256
 * MiB on the bench pair) is faulted in again, page by page, every step (65,540 minor
 * faults per step, measured). arena_free keeps such blocks, and an arena_alloc of the
 * same size takes one back; a large request that none fits releases them all first, so
 * no more memory is held than the program had live at its peak. The counts (live,
 * peak) see kept blocks as freed. The keep list is process-wide (static: reachable).
 *
 * Blocks of at least HUGE_MIN start on a 2 MiB boundary and are offered to the kernel's
 * transparent huge pages (madvise MADV_HUGEPAGE, before the first touch): a pass over a
 * large block (the weights in every GEMM, a decode step's stream of every weight) then
 * needs 512 times fewer TLB entries. KDTRAIN_HUGEPAGES=0 leaves them to 4 KiB pages (A/B
 * measurements). */
#include "arena.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "util.h"

const char *const kd_mem_names[KD_MEM_NCAT] = {"weights", "grads", "optim", "acts",
                                               "loss",    "comm",  "host",  "scratch"};

/* Each block carries a 64-byte header holding its size and category. */
struct block_header {
  size_t bytes;
  int cat;
  char pad[64 - sizeof(size_t) - sizeof(int)];
};

#define KEEP_MIN ((size_t)16 << 20) /* blocks at least this large are kept */
#define KEEP_SLOTS 16
static struct block_header *kept[KEEP_SLOTS];
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;

/* A kept block of exactly `bytes`, or NULL after releasing every kept block. */
static struct block_header *take_kept(size_t bytes) {
  struct block_header *h = NULL;
  pthread_mutex_lock(&kept_lock);
  for (int i = 0; i < KEEP_SLOTS && !h; i++)
    if (kept[i] && kept[i]->bytes == bytes) {
      h = kept[i];
      kept[i] = NULL;
    }
  if (!h)
    for (int i = 0; i < KEEP_SLOTS; i++) {
      free(kept[i]);
      kept[i] = NULL;
    }
  pthread_mutex_unlock(&kept_lock);
  return h;
}

/* Keep h for reuse (1), or 0 when every slot is taken. */
static int keep(struct block_header *h) {
  int done = 0;
  pthread_mutex_lock(&kept_lock);
  for (int i = 0; i < KEEP_SLOTS && !done; i++)
    if (!kept[i]) {
      kept[i] = h;
      done = 1;
    }
  pthread_mutex_unlock(&kept_lock);
  return done;
}

void arena_release_kept(void) {
  pthread_mutex_lock(&kept_lock);
  for (int i = 0; i < KEEP_SLOTS; i++) {
    free(kept[i]);
    kept[i] = NULL;
  }
  pthread_mutex_unlock(&kept_lock);
}

#define HUGE_MIN ((size_t)8 << 20)
#define HUGE_ALIGN ((size_t)2 << 20)

/* A new block of `total` bytes: 64-byte aligned, or for a large one 2 MiB aligned and
 * advised to huge pages. NULL when out of memory. */
static void *block_new(size_t total) {
  static int huge = -1; /* KDTRAIN_HUGEPAGES, read once */
  if (huge < 0) {
    const char *e = getenv("KDTRAIN_HUGEPAGES");
    huge = !(e && !strcmp(e, "0"));
  }
  void *raw = NULL;
  if (total >= HUGE_MIN && huge) {
    if (posix_memalign(&raw, HUGE_ALIGN, total) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(raw, total, MADV_HUGEPAGE); /* advice: refused (no THP) changes nothing */
#endif
    return raw;
  }
  return posix_memalign(&raw, 64, total) == 0 ? raw : NULL;
}

void *arena_alloc(struct kd_arena *a, enum kd_mem cat, size_t bytes) {
  void *raw = bytes >= KEEP_MIN ? take_kept(bytes) : NULL;
  if (!raw) raw = block_new(sizeof(struct block_header) + bytes);
  if (!raw)
    kd_fail(KD_EXIT_IO, "out of memory allocating %zu bytes of %s", bytes, kd_mem_names[cat]);
  struct block_header *h = raw;
  h->bytes = bytes;
  h->cat = (int)cat;
  memset(h + 1, 0, bytes);
  a->live[cat] += bytes;
  if (a->live[cat] > a->peak[cat]) a->peak[cat] = a->live[cat];
  if (cat != KD_MEM_HOST) {
    a->live_total += bytes;
    if (a->live_total > a->peak_total) a->peak_total = a->live_total;
  }
  return h + 1;
}

void arena_free(struct kd_arena *a, void *p) {
  if (!p) return;
  struct block_header *h = (struct block_header *)p - 1;
  a->live[h->cat] -= h->bytes;
  if (h->cat != KD_MEM_HOST) a->live_total -= h->bytes;
  if (h->bytes < KEEP_MIN || !keep(h)) free(h);
}

void arena_reset_peaks(struct kd_arena *a) {
  for (int c = 0; c < KD_MEM_NCAT; c++)
    a->peak[c] = a->live[c];
  a->peak_total = a->live_total;
}
