/* cpu_hw.c: CPU features, the BLAS kernel choice, the CPU's peak FP32 rate, the
 * compute threads of a rank.
 *
 * Why kdtrain chooses the threads: MPICH's mpiexec gives every rank the whole machine,
 * and OpenMP starts one thread per CPU in each: 2 ranks x 2 threads on 2 cores ran the
 * quick-start teacher at tp 2 ten times slower than 1 thread per rank (libgomp's
 * threads spin while the other rank's hold the cores). Each rank takes its share of the
 * CPUs its node's ranks may use; a user's OMP_NUM_THREADS or OPENBLAS_NUM_THREADS wins.
 *
 * Why kdtrain chooses the OpenBLAS kernel: a DYNAMIC_ARCH OpenBLAS picks its kernels
 * from the CPU model number when it loads, and a model it does not know (any CPU newer
 * than the library: Debian 12's 0.3.21 on Sapphire/Emerald Rapids, family 6 model
 * 143/207) gets its oldest x86-64 kernels, Prescott (SSE3): a 2048^3 sgemm at 40-64
 * GFLOP/s instead of 224-314 on 2 cores of an Emerald Rapids Xeon. The library reads
 * OPENBLAS_CORETYPE only when it loads, so kdtrain sets it and re-executes itself
 * before MPI_Init, once, unless the user set the variable. */
#define _GNU_SOURCE
#include "cpu_hw.h"

#include <cpuid.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Provided by the BLAS that is linked, if it is that one (weak: any CBLAS links). */
extern char *openblas_get_corename(void) __attribute__((weak));
extern char *openblas_get_config(void) __attribute__((weak));
extern const char *bli_info_get_version_str(void) __attribute__((weak));
extern int bli_arch_query_id(void) __attribute__((weak));
extern const char *bli_arch_string(int id) __attribute__((weak));

/* Set by kd_blas_select before re-executing: the kernel OpenBLAS chose by itself. */
#define CHOSE_ENV "KDTRAIN_BLAS_LIBRARY_CHOSE"

static unsigned long long xgetbv0(void) {
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((unsigned long long)hi << 32) | lo;
}

void kd_cpu_detect(struct kd_cpu *c) {
  memset(c, 0, sizeof *c);
  unsigned a, b, cx, d;
  const unsigned max = __get_cpuid_max(0, NULL);
  if (max == 0) return;
  __cpuid(0, a, b, cx, d);
  memcpy(c->vendor, &b, 4);
  memcpy(c->vendor + 4, &d, 4);
  memcpy(c->vendor + 8, &cx, 4);
  __cpuid(1, a, b, cx, d);
  const unsigned fam = (a >> 8) & 0xf, mod = (a >> 4) & 0xf;
  c->family = (int)(fam == 0xf ? fam + ((a >> 20) & 0xff) : fam);
  c->model = (int)(fam == 6 || fam == 0xf ? mod + (((a >> 16) & 0xf) << 4) : mod);
  const int osxsave = (cx >> 27) & 1, avx = (cx >> 28) & 1, fma = (cx >> 12) & 1;
  const unsigned long long xcr0 = osxsave ? xgetbv0() : 0;
  const int os_avx = (xcr0 & 0x6) == 0x6, os_avx512 = (xcr0 & 0xe6) == 0xe6;
  const int os_amx = (xcr0 & 0x60000) == 0x60000;
  unsigned b7 = 0, d7 = 0, a71 = 0;
  if (max >= 7) {
    __cpuid_count(7, 0, a, b7, cx, d7);
    __cpuid_count(7, 1, a71, b, cx, d);
  }
  const int avx2 = (b7 >> 5) & 1;
  const int avx512 = ((b7 >> 16) & 1) && ((b7 >> 17) & 1) && ((b7 >> 28) & 1) && ((b7 >> 30) & 1) &&
                     ((b7 >> 31) & 1); /* F DQ CD BW VL */
  const int bf16 = (a71 >> 5) & 1;
  c->isa = KD_ISA_SSE;
  if (avx && os_avx) c->isa = KD_ISA_AVX;
  if (c->isa == KD_ISA_AVX && avx2 && fma) c->isa = KD_ISA_AVX2;
  if (c->isa == KD_ISA_AVX2 && avx512 && os_avx512)
    c->isa = bf16 ? KD_ISA_AVX512BF16 : KD_ISA_AVX512;
  c->amx = os_amx && ((d7 >> 24) & 1);
  if (__get_cpuid_max(0x80000000, NULL) >= 0x80000004) {
    unsigned r[12];
    for (unsigned i = 0; i < 3; i++)
      __cpuid(0x80000002 + i, r[4 * i], r[4 * i + 1], r[4 * i + 2], r[4 * i + 3]);
    char s[49];
    memcpy(s, r, 48);
    s[48] = 0;
    const char *p = s;
    while (*p == ' ')
      p++;
    snprintf(c->model_name, sizeof c->model_name, "%s", p);
  }
}

const char *kd_isa_name(enum kd_isa isa) {
  static const char *const names[] = {"SSE3", "AVX", "AVX2+FMA", "AVX-512", "AVX-512+BF16"};
  return (unsigned)isa < 5 ? names[isa] : "?";
}

/* OpenBLAS x86-64 core names (as openblas_get_corename spells them) by the ISA their
 * kernels use. */
static const struct {
  const char *name;
  enum kd_isa isa;
} cores[] = {
    {"Katmai", KD_ISA_SSE},
    {"Coppermine", KD_ISA_SSE},
    {"Northwood", KD_ISA_SSE},
    {"Prescott", KD_ISA_SSE},
    {"Banias", KD_ISA_SSE},
    {"Atom", KD_ISA_SSE},
    {"Core2", KD_ISA_SSE},
    {"Penryn", KD_ISA_SSE},
    {"Dunnington", KD_ISA_SSE},
    {"Nehalem", KD_ISA_SSE},
    {"Opteron", KD_ISA_SSE},
    {"Opteron_SSE3", KD_ISA_SSE},
    {"Barcelona", KD_ISA_SSE},
    {"Bobcat", KD_ISA_SSE},
    {"Nano", KD_ISA_SSE},
    {"Sandybridge", KD_ISA_AVX},
    {"Bulldozer", KD_ISA_AVX},
    {"Piledriver", KD_ISA_AVX},
    {"Steamroller", KD_ISA_AVX},
    {"Haswell", KD_ISA_AVX2},
    {"Zen", KD_ISA_AVX2},
    {"Excavator", KD_ISA_AVX2},
    {"SkylakeX", KD_ISA_AVX512},
    {"Cooperlake", KD_ISA_AVX512BF16},
    {"SapphireRapids", KD_ISA_AVX512BF16},
};

int kd_blas_core_isa(const char *core) {
  if (!core) return -1;
  for (size_t i = 0; i < sizeof cores / sizeof cores[0]; i++)
    if (strcasecmp(core, cores[i].name) == 0) return (int)cores[i].isa;
  return -1;
}

static int is_amd(const struct kd_cpu *c) {
  return strcmp(c->vendor, "AuthenticAMD") == 0 || strcmp(c->vendor, "HygonGenuine") == 0;
}

/* The best kernel for an ISA level, as OpenBLAS 0.3.21 (the oldest we support) names
 * them; AVX-512 kernels are used on AMD Zen 4 as well (as OpenBLAS itself does later). */
static const char *core_for(enum kd_isa isa, int amd) {
  switch (isa) {
  case KD_ISA_AVX512BF16:
    return "Cooperlake";
  case KD_ISA_AVX512:
    return "SkylakeX";
  case KD_ISA_AVX2:
    return amd ? "Zen" : "Haswell";
  case KD_ISA_AVX:
    return "Sandybridge";
  default:
    return NULL;
  }
}

const char *kd_blas_core_choice(const char *core, const struct kd_cpu *c) {
  const int have = kd_blas_core_isa(core);
  /* sgemm is as fast on AVX-512 kernels with or without BF16: only a lower vector width
   * is worth a change (and a warning) */
  const int need = c->isa < KD_ISA_AVX512 ? (int)c->isa : (int)KD_ISA_AVX512;
  if (have < 0 || have >= need) return NULL; /* unknown name, or as good for FP32 */
  return core_for(c->isa, is_amd(c));
}

static int openblas_dynamic(void) {
  return openblas_get_corename && openblas_get_config &&
         strstr(openblas_get_config(), "DYNAMIC_ARCH");
}

void kd_blas_select(char **argv) {
  if (getenv("OPENBLAS_CORETYPE") || !openblas_dynamic()) return;
  struct kd_cpu c;
  kd_cpu_detect(&c);
  const char *own = openblas_get_corename();
  const char *pick = kd_blas_core_choice(own, &c);
  if (!pick) return;
  setenv(CHOSE_ENV, own, 1);
  setenv("OPENBLAS_CORETYPE", pick, 1);
  fflush(NULL);
  execv("/proc/self/exe", argv);
  /* not re-executed (no /proc?): run on with the library's kernel, the start line says so */
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv(CHOSE_ENV);
}

static void blas_name(char *buf, size_t n, const struct kd_cpu *c) {
  if (openblas_get_corename && openblas_get_config) {
    const char *cfg = openblas_get_config(), *core = openblas_get_corename();
    char ver[32] = "";
    sscanf(cfg, "OpenBLAS %31s", ver);
    const char *dyn = strstr(cfg, "DYNAMIC_ARCH") ? " DYNAMIC_ARCH" : "";
    const int kisa = kd_blas_core_isa(core);
    const char *better = kd_blas_core_choice(core, c);
    const char *user = getenv("OPENBLAS_CORETYPE"), *lib = getenv(CHOSE_ENV);
    char who[256];
    if (lib && user && strcasecmp(user, core) == 0)
      snprintf(who, sizeof who,
               "chosen by kdtrain: the library picked %s (%s) on this CPU; "
               "set OPENBLAS_CORETYPE to choose",
               lib, kd_isa_name((enum kd_isa)kd_blas_core_isa(lib)));
    else if (lib && user)
      snprintf(who, sizeof who, "kdtrain asked for %s, the library runs %s", user, core);
    else if (user)
      snprintf(who, sizeof who, "set by OPENBLAS_CORETYPE=%s", user);
    else if (better)
      snprintf(who, sizeof who, "the library's choice; kdtrain could not re-execute to choose %s",
               better);
    else
      snprintf(who, sizeof who, "the library's choice");
    snprintf(buf, n, "OpenBLAS %s%s, kernel %s (%s; %s)", ver, dyn, core,
             kisa >= 0 ? kd_isa_name((enum kd_isa)kisa) : "ISA not known to kdtrain", who);
    if (better)
      snprintf(buf + strlen(buf), n - strlen(buf),
               " | WARNING: %s kernels on a CPU with %s: GEMMs run several times slower than "
               "with %s (unset OPENBLAS_CORETYPE, or set it to %s)",
               kd_isa_name((enum kd_isa)kisa), kd_isa_name(c->isa), better, better);
  } else if (bli_info_get_version_str && bli_arch_query_id && bli_arch_string) {
    snprintf(buf, n, "BLIS %s, configuration %s", bli_info_get_version_str(),
             bli_arch_string(bli_arch_query_id()));
  } else {
    snprintf(buf, n, "a CBLAS that does not report its kernel");
  }
}

void kd_blas_describe(char *buf, size_t n) {
  struct kd_cpu c;
  kd_cpu_detect(&c);
  char blas[768], threads[192];
  blas_name(blas, sizeof blas, &c);
  kd_threads_describe(threads, sizeof threads);
  snprintf(buf, n, "CPU %s (%s family %d model %d, %s%s, %d CPUs usable) | %s | BLAS %s",
           c.model_name[0] ? c.model_name : "?", c.vendor, c.family, c.model, kd_isa_name(c.isa),
           c.amx ? ", AMX" : "", kd_cpu_count(), threads, blas);
}

double kd_cpu_flops_per_cycle(const struct kd_cpu *c, char *how, size_t n) {
  int units = 2, lanes = 4, fma = 1;
  const int amd = is_amd(c);
  switch (c->isa) {
  case KD_ISA_AVX512BF16:
  case KD_ISA_AVX512:
    lanes = 16;
    if (amd && c->family == 0x19) {
      lanes = 8;
    } /* Zen 4: AVX-512 on 256-bit FMA pipes */
    break;
  case KD_ISA_AVX2:
    lanes = 8;
    if (amd && c->family == 0x17 && c->model < 0x30) lanes = 4; /* Zen 1: 128-bit units */
    break;
  case KD_ISA_AVX:
    lanes = 8;
    fma = 0;
    break;
  default:
    lanes = 4;
    fma = 0;
    break;
  }
  const double f = fma ? 2.0 * units * lanes : 2.0 * lanes; /* no FMA: one add + one mul */
  if (how)
    snprintf(how, n, fma ? "%d FMA units x %d FP32 lanes x 2" : "add + mul x %d FP32 lanes",
             fma ? units : lanes, lanes);
  return f;
}

static double cpuinfo_mhz(void) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return 0;
  char line[256];
  double mhz = 0;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "cpu MHz", 7) == 0) {
      const char *p = strchr(line, ':');
      if (p) mhz = atof(p + 1);
      break;
    }
  fclose(f);
  return mhz;
}

double kd_cpu_nominal_hz(const struct kd_cpu *c, char *source, size_t n) {
  const char *at = strstr(c->model_name, "@ ");
  if (at) {
    double ghz = atof(at + 2);
    if (ghz > 0.1 && strstr(at, "GHz")) {
      snprintf(source, n, "the CPU's brand string");
      return ghz * 1e9;
    }
  }
  FILE *f = fopen("/sys/devices/system/cpu/cpu0/cpufreq/base_frequency", "r");
  if (f) {
    double khz = 0;
    const int ok = fscanf(f, "%lf", &khz) == 1;
    fclose(f);
    if (ok && khz > 0) {
      snprintf(source, n, "cpufreq base_frequency");
      return khz * 1e3;
    }
  }
  if (__get_cpuid_max(0, NULL) >= 0x16) {
    unsigned a, b, cx, d;
    __cpuid(0x16, a, b, cx, d);
    if (a > 0) {
      snprintf(source, n, "cpuid leaf 0x16");
      return a * 1e6;
    }
  }
  const double mhz = cpuinfo_mhz();
  if (mhz > 0) {
    snprintf(source, n, "/proc/cpuinfo cpu MHz");
    return mhz * 1e6;
  }
  snprintf(source, n, "unknown");
  return 0;
}

int kd_cpu_count(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

/* --- the cgroup CPU limit ---------------------------------------------------------- */

/* Limit in CPUs set in directory dir ("quota period" of v2 cpu.max, or v1's two files);
 * 0 when none or unreadable. */
static double cgroup_dir_limit(const char *dir, int v2) {
  char path[4096 + 32];
  double quota = 0, period = 0;
  if (v2) {
    snprintf(path, sizeof path, "%s/cpu.max", dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char q[32] = "";
    const int got = fscanf(f, "%31s %lf", q, &period);
    fclose(f);
    if (got != 2 || strcmp(q, "max") == 0) return 0;
    quota = atof(q);
  } else {
    snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    const int got = fscanf(f, "%lf", &quota);
    fclose(f);
    snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
    if (got != 1 || !(f = fopen(path, "r"))) return 0;
    if (fscanf(f, "%lf", &period) != 1) period = 0;
    fclose(f);
  }
  return quota > 0 && period > 0 ? quota / period : 0;
}

/* The smallest limit from base + path up to base (a cgroup inherits its parents'
 * limits); where: the file that set it. */
static double cgroup_walk(const char *base, const char *path, int v2, double best, char *where,
                          size_t n) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s%s", base, strcmp(path, "/") == 0 ? "" : path);
  const size_t stop = strlen(base);
  for (;;) {
    const double lim = cgroup_dir_limit(dir, v2);
    if (lim > 0 && (best == 0 || lim < best)) {
      best = lim;
      snprintf(where, n, "%s/%s", dir, v2 ? "cpu.max" : "cpu.cfs_quota_us");
    }
    char *slash = strrchr(dir, '/');
    if (strlen(dir) <= stop || !slash || (size_t)(slash - dir) < stop) break;
    *slash = '\0';
  }
  return best;
}

double kd_cgroup_cpus(const char *root, char *where, size_t n) {
  char path[4096];
  if (n) where[0] = '\0';
  snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  double best = 0;
  char line[4096];
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    *c1 = *c2 = '\0'; /* line: the hierarchy's id */
    const char *ctrl = c1 + 1, *cg = c2 + 1;
    char base[4096];
    if (strcmp(line, "0") == 0 && !*ctrl) { /* v2: unified, or beside v1 (hybrid) */
      snprintf(base, sizeof base, "%s/sys/fs/cgroup/cgroup.controllers", root);
      const int unified = access(base, F_OK) == 0;
      snprintf(base, sizeof base, "%s/sys/fs/cgroup%s", root, unified ? "" : "/unified");
      best = cgroup_walk(base, cg, 1, best, where, n);
      continue;
    }
    char list[256]; /* v1: the hierarchy whose controllers include cpu */
    snprintf(list, sizeof list, ",%s,", ctrl);
    if (!strstr(list, ",cpu,")) continue;
    snprintf(base, sizeof base, "%s/sys/fs/cgroup/cpu", root);
    best = cgroup_walk(base, cg, 0, best, where, n);
  }
  fclose(f);
  return best;
}

/* --- compute threads per rank ------------------------------------------------------ */

/* This rank's compute threads: a documented exception to "backend state lives in be->priv".
 * OpenMP's thread count is the process's, not a backend's: every backend of the process
 * runs its ops on it, and this records how it was chosen. threads_now is written once, by
 * the first kd_threads_init (grid_node_setup, before any OpenMP region or backend; cpus is
 * 0 until then), and read-only after; until then kd_threads() answers with OpenMP's
 * default, threads_default, filled once (pthread_once) and read-only after. */
static struct kd_threads threads_now, threads_default;

/* A thread count set in variable `name` (a positive integer, or a list whose first entry
 * is one, as OpenMP reads OMP_NUM_THREADS); 0 when unset or not a count. */
static int env_threads(const char *name) {
  const char *v = getenv(name);
  if (!v) return 0;
  char *end;
  const long t = strtol(v, &end, 10);
  if (end == v || t < 1 || (*end && *end != ',')) return 0;
  return t > 1 << 16 ? 1 << 16 : (int)t;
}

void kd_threads_choose(struct kd_threads *t, int node_ranks, int node_cpus, int own,
                       double cgroup) {
  memset(t, 0, sizeof *t);
  t->own = own > 0 ? own : 1;
  t->node_ranks = node_ranks > 0 ? node_ranks : 1;
  t->node_cpus = node_cpus > 0 ? node_cpus : t->own;
  t->cgroup = cgroup > 0 ? cgroup : 0;
  t->cpus = t->node_cpus;
  if (t->cgroup > 0 && t->cgroup < t->cpus) t->cpus = t->cgroup >= 1 ? (int)t->cgroup : 1;
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  t->online = online > 0 ? (int)online : t->node_cpus;
  int share = t->cpus / t->node_ranks;
  if (share > t->own) share = t->own;
  t->n = share > 0 ? share : 1;
  static const char *const vars[] = {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0] && !t->env; i++)
    if ((t->env_value = env_threads(vars[i])) > 0) {
      t->env = vars[i];
      t->n = t->env_value;
    }
}

void kd_threads_init(int node_ranks, int node_cpus) {
  if (threads_now.cpus) return; /* chosen once per process: the first call's choice stands */
  char where[256];
  kd_threads_choose(&threads_now, node_ranks, node_cpus, kd_cpu_count(),
                    kd_cgroup_cpus("", where, sizeof where));
#ifdef _OPENMP
  omp_set_num_threads(threads_now.n);
#endif
}

/* kd_threads before kd_threads_init: OpenMP's own count on this process's CPUs. */
static void threads_default_fill(void) {
  struct kd_threads *t = &threads_default;
  t->n = 1;
  t->node_ranks = 1;
  t->own = t->node_cpus = t->cpus = t->online = kd_cpu_count();
#ifdef _OPENMP
  t->n = omp_get_max_threads();
#endif
  t->env = "OpenMP's default";
}

const struct kd_threads *kd_threads(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  if (threads_now.cpus) return &threads_now;
  pthread_once(&once, threads_default_fill);
  return &threads_default;
}

static const char *plural(int k) {
  return k == 1 ? "" : "s";
}

void kd_threads_describe(char *buf, size_t n) {
  kd_threads_text(kd_threads(), buf, n);
}

void kd_threads_text(const struct kd_threads *t, char *buf, size_t n) {
  if (t->env && t->env_value == 0) { /* not chosen (kd_threads) */
    snprintf(buf, n, "threads per rank %d (%s)", t->n, t->env);
    return;
  }
  if (t->env) {
    snprintf(buf, n, "threads per rank %d (%s=%d)", t->n, t->env, t->env_value);
    return;
  }
  char cpus[96];
  if (t->cpus < t->node_cpus)
    snprintf(cpus, sizeof cpus, "cgroup limit %.3g CPUs of %d", t->cgroup, t->node_cpus);
  else
    snprintf(cpus, sizeof cpus, "%d CPU%s", t->cpus, plural(t->cpus));
  snprintf(buf, n, "threads per rank %d (%s / %d rank%s on this node%s)", t->n, cpus, t->node_ranks,
           plural(t->node_ranks),
           t->n < t->cpus / t->node_ranks ? ", capped by this rank's affinity mask" : "");
}

int kd_threads_oversubscribed(const struct kd_threads *t, char *buf, size_t n) {
  const long long all = (long long)t->n * t->node_ranks;
  if (all <= t->cpus) return 0;
  /* more ranks than CPUs at one thread each, the CPUs all reachable: the launcher's rank
   * count, which no thread setting changes (test suites start 4 ranks on 2 cores) */
  if (t->n == 1 && t->node_cpus >= t->online) return 0;
  char fix[320];
  if (t->node_cpus < t->online) /* the masks, not the counts, are what to change */
    snprintf(fix, sizeof fix,
             "the affinity masks of the node's ranks cover only %d of its %d CPUs: a "
             "launcher's binding, or OMP_PROC_BIND / OMP_PLACES on ranks the launcher did not "
             "bind (each binds its first thread to the machine's first core); unset those or "
             "bind each rank to cores of its own",
             t->node_cpus, t->online);
  else if (t->env)
    snprintf(fix, sizeof fix, "unset %s to take %d per rank", t->env,
             t->cpus / t->node_ranks > 0 ? t->cpus / t->node_ranks : 1);
  else
    snprintf(fix, sizeof fix, "start at most %d rank%s per node", t->cpus, plural(t->cpus));
  if (t->env)
    snprintf(buf, n,
             "WARNING: %s=%d x %d rank%s on this node = %lld threads on %d CPU%s: "
             "oversubscribed, each rank's threads wait for CPUs the others hold (several "
             "times slower); %s",
             t->env, t->env_value, t->node_ranks, plural(t->node_ranks), all, t->cpus,
             plural(t->cpus), fix);
  else
    snprintf(buf, n,
             "WARNING: %d ranks on this node share %d CPU%s (1 thread each): oversubscribed, "
             "the ranks wait for each other's CPUs; %s",
             t->node_ranks, t->cpus, plural(t->cpus), fix);
  return 1;
}
