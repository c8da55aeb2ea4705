/* arena.h: the memory arena every backend allocates from; counts live and peak
 * bytes per category, exactly, so tests can assert memory behaviour. */
#ifndef KD_ARENA_H
#define KD_ARENA_H

#include <stddef.h>

enum kd_mem {
  KD_MEM_WEIGHTS = 0, /* parameters: working copies, masters, frozen teacher */
  KD_MEM_GRADS,       /* parameter gradients */
  KD_MEM_OPTIM,       /* AdamW moments */
  KD_MEM_ACTS,        /* activations kept for backward and their gradients */
  KD_MEM_LOSS,        /* loss chunk buffers (logits of one chunk) */
  KD_MEM_COMM,        /* communication buffers */
  KD_MEM_HOST,        /* offloaded activations (host memory on a device backend) */
  KD_MEM_SCRATCH,     /* short-lived workspace inside one op */
  KD_MEM_NCAT
};

struct kd_arena {
  size_t live[KD_MEM_NCAT];
  size_t peak[KD_MEM_NCAT];
  size_t live_total; /* all categories but KD_MEM_HOST */
  size_t peak_total; /* peak of live_total */
};

extern const char *const kd_mem_names[KD_MEM_NCAT];

/* Allocate `bytes` (64-byte aligned, zeroed) in category `cat`; fails loudly. */
void *arena_alloc(struct kd_arena *a, enum kd_mem cat, size_t bytes);
/* Free a block from arena_alloc (NULL is fine). */
void arena_free(struct kd_arena *a, void *p);
/* Free the large blocks kept for reuse (they are freed anyway when a large request
 * does not fit one; call at the end of a run to give the memory back). */
void arena_release_kept(void);
/* Forget the peaks: peak := live (start of a measured region). */
void arena_reset_peaks(struct kd_arena *a);

#endif
