/* cpu_hw.h: what the CPU can do and what the BLAS makes of it: vector features
 * (cpuid + the OS's XCR0), the linked BLAS and the kernel it chose, the choice of a
 * better OpenBLAS kernel where the library fell back to an old one, and the CPU's
 * peak FP32 rate (the MFU denominator). */
#ifndef KD_CPU_HW_H
#define KD_CPU_HW_H

#include <stddef.h>

/* Vector feature levels, each implying the ones below (usable: CPU and OS agree). */
enum kd_isa {
  KD_ISA_SSE = 0,       /* SSE2/SSE3 only */
  KD_ISA_AVX = 1,       /* AVX, no FMA/AVX2 */
  KD_ISA_AVX2 = 2,      /* AVX2 + FMA3 */
  KD_ISA_AVX512 = 3,    /* AVX-512 F, CD, BW, DQ, VL */
  KD_ISA_AVX512BF16 = 4 /* the above + AVX512_BF16 */
};

struct kd_cpu {
  char vendor[16];     /* "GenuineIntel", "AuthenticAMD", ... */
  char model_name[64]; /* the brand string */
  int family, model;   /* display family and model */
  enum kd_isa isa;
  int amx; /* AMX tiles usable */
};

void kd_cpu_detect(struct kd_cpu *c);
/* "AVX-512 + BF16" etc. */
const char *kd_isa_name(enum kd_isa isa);

/* The ISA level an OpenBLAS kernel ("core") name targets; -1 for a name not known here. */
int kd_blas_core_isa(const char *core);
/* The OpenBLAS core to select instead of `core` on CPU c, or NULL to keep it: only when
 * the library's choice has a narrower FP32 vector width than the CPU (a CPU newer than
 * the library falls back to Prescott, an SSE3 kernel); then the CPU's best kernel. */
const char *kd_blas_core_choice(const char *core, const struct kd_cpu *c);

/* Before MPI_Init (and before any thread exists): when the BLAS is a DYNAMIC_ARCH
 * OpenBLAS that chose a kernel below the CPU's level and OPENBLAS_CORETYPE is not set,
 * set it to the better kernel and re-execute this program (OpenBLAS reads the variable
 * only when it loads); the process, its PID and its launcher connection stay. Returns
 * only when nothing is to be done or the re-execution failed. */
void kd_blas_select(char **argv);
/* One line for the console: the CPU, its features, the BLAS, its version and kernel,
 * and who chose the kernel (with a warning when it is slower than the CPU allows). */
void kd_blas_describe(char *buf, size_t n);

/* Peak FP32 FLOP/cycle of one core: FMA units x lanes x 2 (from the ISA and vendor:
 * Intel AVX-512 server cores have two 512-bit FMA units, AMD Zen 4 executes AVX-512
 * on 256-bit units). */
double kd_cpu_flops_per_cycle(const struct kd_cpu *c, char *how, size_t n);
/* Nominal clock in Hz and where it came from (the brand string's "@ x.xxGHz", the
 * cpufreq base frequency, cpuid leaf 0x16, or /proc/cpuinfo's "cpu MHz"); 0 if none. */
double kd_cpu_nominal_hz(const struct kd_cpu *c, char *source, size_t n);
/* CPUs this process may run on (its affinity mask). */
int kd_cpu_count(void);

#endif
