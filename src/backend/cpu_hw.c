/* cpu_hw.c: CPU features, the BLAS kernel choice, the CPU's peak FP32 rate.
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
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

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
  char blas[768];
  blas_name(blas, sizeof blas, &c);
  snprintf(buf, n, "CPU %s (%s family %d model %d, %s%s, %d CPUs usable) | BLAS %s",
           c.model_name[0] ? c.model_name : "?", c.vendor, c.family, c.model, kd_isa_name(c.isa),
           c.amx ? ", AMX" : "", kd_cpu_count(), blas);
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
