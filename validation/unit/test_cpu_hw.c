/* test_cpu_hw.c: the BLAS kernel decision and the CPU peak (src/backend/cpu_hw.h).
 * The decision takes the kernel OpenBLAS chose and the CPU's features: it replaces a
 * kernel only when its FP32 vector width is below the CPU's (Debian's OpenBLAS
 * 0.3.21 picks Prescott, SSE3, on an Emerald Rapids Xeon), with the best kernel of the
 * CPU's level, and never touches a kernel name it does not know. The peak: FMA units x
 * lanes x 2 per cycle, from the ISA and the vendor/family. And the running CPU: its
 * detected level is consistent with the kernel the library runs after kd_blas_select.
 * The threads per rank: the cgroup limit read from fake v2 and v1 trees (the smallest
 * quota / period on the way up, "max" and -1 none), and the share kd_threads_choose gives
 * (CPUs capped by the cgroup over the node's ranks, the own mask, the user's variables
 * first) with its start-line text and oversubscription warning. */
#include <check.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* write `text` to root/rel, making its directories */
static void put(const char *root, const char *rel, const char *text) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
    *p = '\0';
    mkdir(path, 0755);
    *p = '/';
  }
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

START_TEST(cgroup_limit) {
  char v2[] = "/tmp/kd_cgroup_v2_XXXXXX", v1[] = "/tmp/kd_cgroup_v1_XXXXXX",
       none[] = "/tmp/kd_cgroup_no_XXXXXX", where[512];
  ck_assert_ptr_nonnull(mkdtemp(v2));
  ck_assert_ptr_nonnull(mkdtemp(v1));
  ck_assert_ptr_nonnull(mkdtemp(none));
  /* v2: job 2.5 CPUs under a slice of 4, the root unlimited; the smallest counts */
  put(v2, "proc/self/cgroup", "0::/slice/job\n");
  put(v2, "sys/fs/cgroup/cgroup.controllers", "cpu\n");
  put(v2, "sys/fs/cgroup/cpu.max", "max 100000\n");
  put(v2, "sys/fs/cgroup/slice/cpu.max", "400000 100000\n");
  put(v2, "sys/fs/cgroup/slice/job/cpu.max", "250000 100000\n");
  ck_assert_double_eq_tol(kd_cgroup_cpus(v2, where, sizeof where), 2.5, 1e-12);
  ck_assert_ptr_nonnull(strstr(where, "/slice/job/cpu.max"));
  put(v2, "sys/fs/cgroup/slice/job/cpu.max", "max 100000\n"); /* the parent's then */
  ck_assert_double_eq_tol(kd_cgroup_cpus(v2, where, sizeof where), 4.0, 1e-12);
  /* v1 (cpu,cpuacct hierarchy, a hybrid system's empty v2 line beside it) */
  put(v1, "proc/self/cgroup", "4:memory:/x\n3:cpu,cpuacct:/docker/c1\n0::/\n");
  put(v1, "sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n");
  put(v1, "sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n");
  put(v1, "sys/fs/cgroup/cpu/docker/c1/cpu.cfs_quota_us", "150000\n");
  put(v1, "sys/fs/cgroup/cpu/docker/c1/cpu.cfs_period_us", "100000\n");
  ck_assert_double_eq_tol(kd_cgroup_cpus(v1, where, sizeof where), 1.5, 1e-12);
  ck_assert_ptr_nonnull(strstr(where, "docker/c1/cpu.cfs_quota_us"));
  /* nothing readable: no limit */
  ck_assert_double_eq(kd_cgroup_cpus(none, where, sizeof where), 0.0);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf %s %s %s", v2, v1, none);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* kd_threads_choose's count, its start-line text and warning */
static void threads_case(int ranks, int node_cpus, int own, double cg, int want, const char *text,
                         const char *warn) {
  struct kd_threads t;
  char got[512], w[1024] = "";
  kd_threads_choose(&t, ranks, node_cpus, own, cg);
  kd_threads_text(&t, got, sizeof got);
  const int over = kd_threads_oversubscribed(&t, w, sizeof w);
  ck_assert_msg(t.n == want && strcmp(got, text) == 0,
                "%d ranks, %d CPUs, own %d, cgroup %g: "
                "'%s', expected %d '%s'",
                ranks, node_cpus, own, cg, got, want, text);
  ck_assert_msg(warn ? over && strstr(w, warn) != NULL : !over, "warning '%s', expected '%s'", w,
                warn ? warn : "(none)");
}

START_TEST(threads_share) {
  unsetenv("OMP_NUM_THREADS");
  unsetenv("OPENBLAS_NUM_THREADS");
  threads_case(2, 2, 2, 0, 1, "threads per rank 1 (2 CPUs / 2 ranks on this node)", NULL);
  threads_case(1, 2, 2, 0, 2, "threads per rank 2 (2 CPUs / 1 rank on this node)", NULL);
  threads_case(4, 64, 64, 0, 16, "threads per rank 16 (64 CPUs / 4 ranks on this node)", NULL);
  threads_case(3, 64, 64, 0, 21, "threads per rank 21 (64 CPUs / 3 ranks on this node)", NULL);
  /* ranks bound to 8 cores each: the union over the ranks, each its own 8 */
  threads_case(4, 32, 8, 0, 8, "threads per rank 8 (32 CPUs / 4 ranks on this node)", NULL);
  /* a mask smaller than the share */
  threads_case(2, 32, 4, 0, 4,
               "threads per rank 4 (32 CPUs / 2 ranks on this node, capped by this rank's "
               "affinity mask)",
               NULL);
  /* the cgroup: 8.5 CPUs of 64 for 2 ranks; below one CPU */
  threads_case(2, 64, 64, 8.5, 4,
               "threads per rank 4 (cgroup limit 8.5 CPUs of 64 / 2 ranks "
               "on this node)",
               NULL);
  threads_case(1, 4, 4, 0.5, 1,
               "threads per rank 1 (cgroup limit 0.5 CPUs of 4 / 1 rank on "
               "this node)",
               NULL);
  threads_case(2, 64, 64, 100, 32, "threads per rank 32 (64 CPUs / 2 ranks on this node)", NULL);
  /* more ranks than CPUs: 1 each, no warning (the launcher's rank count, which no thread
   * setting changes; also with OMP_NUM_THREADS=1) */
  threads_case(4, 2, 2, 0, 1, "threads per rank 1 (2 CPUs / 4 ranks on this node)", NULL);
  setenv("OMP_NUM_THREADS", "1", 1);
  threads_case(3, 2, 2, 0, 1, "threads per rank 1 (OMP_NUM_THREADS=1)", NULL);
  unsetenv("OMP_NUM_THREADS");
  /* the user's variables win, OMP_NUM_THREADS first; forced oversubscription warns */
  setenv("OPENBLAS_NUM_THREADS", "3", 1);
  threads_case(2, 8, 8, 0, 3, "threads per rank 3 (OPENBLAS_NUM_THREADS=3)", NULL);
  setenv("OMP_NUM_THREADS", "2,1", 1);
  threads_case(2, 8, 8, 0, 2, "threads per rank 2 (OMP_NUM_THREADS=2)", NULL);
  setenv("OMP_NUM_THREADS", "4", 1);
  threads_case(2, 4, 4, 0, 4, "threads per rank 4 (OMP_NUM_THREADS=4)",
               "WARNING: OMP_NUM_THREADS=4 x 2 ranks on this node = 8 threads on 4 CPUs: "
               "oversubscribed");
  /* every rank bound to the same core (OMP_PROC_BIND on unbound ranks): the masks named */
  struct kd_threads t;
  char w[1024];
  kd_threads_choose(&t, 2, 1, 1, 0);
  t.online = 8;
  ck_assert(kd_threads_oversubscribed(&t, w, sizeof w));
  ck_assert_msg(strstr(w, "= 8 threads on 1 CPU: oversubscribed") &&
                    strstr(w, "the affinity masks of the node's ranks cover only 1 of its 8 CPUs"),
                "%s", w);
  setenv("OMP_NUM_THREADS", "none", 1); /* not a count: ignored, as OpenMP does */
  unsetenv("OPENBLAS_NUM_THREADS");
  threads_case(2, 4, 4, 0, 2, "threads per rank 2 (4 CPUs / 2 ranks on this node)", NULL);
  unsetenv("OMP_NUM_THREADS");
}
END_TEST

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  Suite *s = suite_create("cpu_hw");
  TCase *tc = tcase_create("cpu_hw");
  tcase_add_test(tc, kernel_choice);
  tcase_add_test(tc, flops_per_cycle);
  tcase_add_test(tc, this_machine);
  tcase_add_test(tc, cgroup_limit);
  tcase_add_test(tc, threads_share);
  suite_add_tcase(s, tc);
  const int failed = check_run(s);
  MPI_Finalize();
  return failed ? 1 : 0;
}
