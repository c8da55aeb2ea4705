/* test_cpu_hw.c: the BLAS kernel decision and the CPU peak (src/backend/cpu_hw.h).
 * The decision takes the kernel OpenBLAS chose and the CPU's features: it replaces a
 * kernel only when its FP32 vector width is below the CPU's (Debian's OpenBLAS
 * 0.3.21 picks Prescott, SSE3, on an Emerald Rapids Xeon), with the best kernel of the
 * CPU's level, and never touches a kernel name it does not know. The peak: FMA units x
 * lanes x 2 per cycle, from the ISA and the vendor/family. And the running CPU: its
 * detected level is consistent with the kernel the library runs after kd_blas_select. */
#include <check.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu_hw.h"
#include "check_run.h"

static struct kd_cpu cpu(const char *vendor, int family, int model, enum kd_isa isa) {
  struct kd_cpu c;
  memset(&c, 0, sizeof c);
  strcpy(c.vendor, vendor);
  c.family = family;
  c.model = model;
  c.isa = isa;
  return c;
}

/* kd_blas_core_choice(core, c) is `want` (NULL: the library's kernel is kept). */
static void choice(const char *core, const struct kd_cpu *c, const char *want) {
  const char *got = kd_blas_core_choice(core, c);
  const char *g = got ? got : "(kept)", *w = want ? want : "(kept)";
  ck_assert_msg(strcmp(g, w) == 0, "%s on %s family %d model %d: %s expected, got %s",
                core ? core : "(null)", c->vendor, c->family, c->model, w, g);
}
#define CHOICE(core, c, want) choice(core, &(c), want)

START_TEST(kernel_choice) {
  const struct kd_cpu emr = cpu("GenuineIntel", 6, 207, KD_ISA_AVX512BF16); /* Emerald Rapids */
  const struct kd_cpu skx = cpu("GenuineIntel", 6, 85, KD_ISA_AVX512);      /* Skylake-SP */
  const struct kd_cpu hsw = cpu("GenuineIntel", 6, 63, KD_ISA_AVX2);        /* Haswell */
  const struct kd_cpu rome = cpu("AuthenticAMD", 0x17, 0x31, KD_ISA_AVX2);  /* Zen 2 */
  const struct kd_cpu genoa = cpu("AuthenticAMD", 0x19, 0x11, KD_ISA_AVX512BF16); /* Zen 4 */
  const struct kd_cpu snb = cpu("GenuineIntel", 6, 45, KD_ISA_AVX);
  const struct kd_cpu old = cpu("GenuineIntel", 6, 26, KD_ISA_SSE);
  /* the library fell back to an old kernel: the CPU's best */
  CHOICE("Prescott", emr, "Cooperlake");
  CHOICE("PRESCOTT", emr, "Cooperlake"); /* names compare without case */
  CHOICE("Haswell", emr, "Cooperlake");
  CHOICE("Prescott", skx, "SkylakeX");
  CHOICE("Nehalem", hsw, "Haswell");
  CHOICE("Sandybridge", hsw, "Haswell");
  CHOICE("Prescott", rome, "Zen");
  CHOICE("Zen", genoa, "Cooperlake");
  CHOICE("Prescott", snb, "Sandybridge");
  /* already at the CPU's level (or above it): kept */
  CHOICE("Cooperlake", emr, NULL);
  CHOICE("SkylakeX", emr, NULL); /* the same FP32 width: not worth a re-execution */
  CHOICE("SapphireRapids", emr, NULL);
  CHOICE("SkylakeX", skx, NULL);
  CHOICE("Cooperlake", skx, NULL);
  CHOICE("Haswell", hsw, NULL);
  CHOICE("Zen", rome, NULL);
  CHOICE("Haswell", rome, NULL);
  CHOICE("Prescott", old, NULL); /* nothing better exists for an SSE-only CPU */
  /* a kernel name kdtrain does not know (a newer library): never overridden */
  CHOICE("GraniteRapids", emr, NULL);
  CHOICE("", emr, NULL);
  CHOICE(NULL, emr, NULL);
  ck_assert_int_eq(kd_blas_core_isa("Prescott"), KD_ISA_SSE);
  ck_assert_int_eq(kd_blas_core_isa("zen"), KD_ISA_AVX2);
  ck_assert_int_eq(kd_blas_core_isa("Unknown"), -1);
}
END_TEST

START_TEST(flops_per_cycle) {
  char how[96];
  const struct kd_cpu emr = cpu("GenuineIntel", 6, 207, KD_ISA_AVX512BF16);
  ck_assert_double_eq(kd_cpu_flops_per_cycle(&emr, how, sizeof how), 64.0); /* 2 x 16 x 2 */
  ck_assert_ptr_nonnull(strstr(how, "2 FMA units x 16 FP32 lanes"));
  const struct kd_cpu genoa = cpu("AuthenticAMD", 0x19, 0x11, KD_ISA_AVX512BF16);
  ck_assert_double_eq(kd_cpu_flops_per_cycle(&genoa, how, sizeof how), 32.0); /* 256-bit pipes */
  const struct kd_cpu zen1 = cpu("AuthenticAMD", 0x17, 0x01, KD_ISA_AVX2);
  ck_assert_double_eq(kd_cpu_flops_per_cycle(&zen1, how, sizeof how), 16.0); /* 128-bit */
  const struct kd_cpu rome = cpu("AuthenticAMD", 0x17, 0x31, KD_ISA_AVX2);
  ck_assert_double_eq(kd_cpu_flops_per_cycle(&rome, how, sizeof how), 32.0);
  const struct kd_cpu hsw = cpu("GenuineIntel", 6, 63, KD_ISA_AVX2);
  ck_assert_double_eq(kd_cpu_flops_per_cycle(&hsw, how, sizeof how), 32.0);
  const struct kd_cpu snb = cpu("GenuineIntel", 6, 45, KD_ISA_AVX);
  ck_assert_double_eq(kd_cpu_flops_per_cycle(&snb, how, sizeof how), 16.0); /* add + mul */
  const struct kd_cpu old = cpu("GenuineIntel", 6, 26, KD_ISA_SSE);
  ck_assert_double_eq(kd_cpu_flops_per_cycle(&old, NULL, 0), 8.0);
}
END_TEST

/* This machine: a detected ISA level, a clock, at least one CPU, and a description. */
START_TEST(this_machine) {
  struct kd_cpu c;
  kd_cpu_detect(&c);
  ck_assert_int_ge((int)c.isa, KD_ISA_SSE);
  ck_assert_int_le((int)c.isa, KD_ISA_AVX512BF16);
  ck_assert(c.vendor[0] != 0);
  char src[64], line[1024];
  const double hz = kd_cpu_nominal_hz(&c, src, sizeof src);
  ck_assert_msg(hz > 1e8 && hz < 1e10, "clock %g Hz (%s)", hz, src);
  ck_assert_int_ge(kd_cpu_count(), 1);
  kd_blas_describe(line, sizeof line);
  ck_assert_ptr_nonnull(strstr(line, "BLAS "));
  printf("%s | clock %.2f GHz from %s\n", line, hz / 1e9, src);
}
END_TEST

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  Suite *s = suite_create("cpu_hw");
  TCase *tc = tcase_create("cpu_hw");
  tcase_add_test(tc, kernel_choice);
  tcase_add_test(tc, flops_per_cycle);
  tcase_add_test(tc, this_machine);
  suite_add_tcase(s, tc);
  const int failed = check_run(s);
  MPI_Finalize();
  return failed ? 1 : 0;
}
