/* cpu.h: the CPU backend as the simulated device wrapped around it (devsim.c) sees it,
 * beside backend_cpu_init (backend.h). Not for use outside src/backend/: everything else
 * reaches the CPU backend through its op table. */
#ifndef KD_CPU_H
#define KD_CPU_H

#include "backend.h"

/* Count every block of the CPU backend `be` (alloc'ed and scratch) in `arena` instead
 * of be->arena: devsim.c's wrapped CPU backend counts in the devsim backend's arena. */
void backend_cpu_count_in(struct kd_backend *be, struct kd_arena *arena);

#endif
