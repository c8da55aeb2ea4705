/* arena.c: counted host allocations (the CPU backend's memory). */
#include "arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

const char *const kd_mem_names[KD_MEM_NCAT] = {
    "weights", "grads", "optim", "acts", "loss", "comm", "host", "scratch"};

/* Each block carries a 64-byte header holding its size and category. */
struct block_header {
  size_t bytes;
  int cat;
  char pad[64 - sizeof(size_t) - sizeof(int)];
};

void *arena_alloc(struct kd_arena *a, enum kd_mem cat, size_t bytes) {
  void *raw = NULL;
  if (posix_memalign(&raw, 64, sizeof(struct block_header) + bytes) != 0)
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
  free(h);
}

void arena_reset_peaks(struct kd_arena *a) {
  for (int c = 0; c < KD_MEM_NCAT; c++) a->peak[c] = a->live[c];
  a->peak_total = a->live_total;
}
