/* cpu_hw.h: what the CPU can do and what the BLAS makes of it: vector features
 * (cpuid + the OS's XCR0), the linked BLAS and the kernel it chose, the choice of a
 * better OpenBLAS kernel where the library fell back to an old one, the CPU's peak
 * FP32 rate (the MFU denominator), and the compute threads of a rank (its share of the
 * CPUs its node's ranks may use). */
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
/* One line for the console: the CPU, its features, the threads per rank
 * (kd_threads_describe), the BLAS, its version and kernel,
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

/* The CPU limit of this process's cgroup: the smallest quota / period of its cgroup and
 * of the cgroups above it (cgroup v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us),
 * the file that set it into `where`; 0 when there is no limit or nothing is readable.
 * root: "" for this system, else a directory holding a fake proc/self/cgroup and
 * sys/fs/cgroup (the unit test). */
double kd_cgroup_cpus(const char *root, char *where, size_t n);

/* A rank's compute threads (kd_threads_init): OpenMP's, over which cpu_gemm splits a
 * product; the BLAS itself runs single-threaded inside them (backend/cpu.c). */
struct kd_threads {
  int n;           /* threads per rank */
  int node_ranks;  /* ranks on this node */
  int node_cpus;   /* CPUs of the union of their affinity masks */
  int cpus;        /* node_cpus capped by the cgroup limit (at least 1) */
  int own;         /* CPUs of this rank's affinity mask */
  int online;      /* CPUs online on the node */
  double cgroup;   /* the cgroup limit in CPUs, 0: none */
  const char *env; /* the user's variable that set n (OMP_NUM_THREADS first), or NULL;
                    * before kd_threads_init "OpenMP's default" (env_value 0) */
  int env_value;   /* its value */
};

/* The choice into *t: the user's OMP_NUM_THREADS, else OPENBLAS_NUM_THREADS (a positive
 * count, or a list whose first entry is one), else the rank's share of its node's CPUs:
 * node_cpus (the union of the node's ranks' affinity masks) capped by the cgroup limit
 * (CPUs, 0: none; rounded down, at least 1), over node_ranks, at least 1 and at most
 * `own` (its own mask's CPUs). Reads the environment only. */
void kd_threads_choose(struct kd_threads *t, int node_ranks, int node_cpus, int own, double cgroup);
/* Set this rank's compute threads (OpenMP's count) by kd_threads_choose with this
 * process's mask and cgroup, before any OpenMP parallel region. Once per process: a later
 * call keeps the first choice. No MPI call (grid_node_setup gathers the node's figures and
 * calls it). */
void kd_threads_init(int node_ranks, int node_cpus);
/* The choice of kd_threads_init (before it: OpenMP's default count, 1 rank on
 * kd_cpu_count CPUs). */
const struct kd_threads *kd_threads(void);
/* "threads per rank N (why)" for a start line: the user's variable, or the CPUs, the
 * cgroup limit and the node's ranks the share came from; of kd_threads() or of t. */
void kd_threads_describe(char *buf, size_t n);
void kd_threads_text(const struct kd_threads *t, char *buf, size_t n);
/* 1 and a warning with the numbers in buf when t's node threads (n x node_ranks) exceed
 * its CPUs: the user's variable forced it, or more ranks than CPUs were started; with
 * what to change (the masks, where they cover fewer CPUs than the node has); else 0. */
int kd_threads_oversubscribed(const struct kd_threads *t, char *buf, size_t n);

#endif
