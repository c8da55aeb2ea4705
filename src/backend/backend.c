/* backend.c: what every backend's table shares (backend.h): backend_check. The bottom of
 * src/backend/: it calls no backend, so that each backend's init (cpu.c, devsim.c,
 * cuda.cu) checks its table here and backend_select (select.c) sits above them all. */
#include "backend.h"

#include "../util.h"

void backend_check(const struct kd_backend *be) {
#define BACKEND_HAS(op) KD_CHECK(be->op, "backend %s: op `%s` is not set", be->name, #op);
  KD_BACKEND_OPS(BACKEND_HAS)
#undef BACKEND_HAS
}
