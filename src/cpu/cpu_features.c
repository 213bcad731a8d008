/* CPU feature detection (cpuid + xgetbv, read once), the AMX tile-state
 * request, the physical core count, and the kernel level forced by tests or
 * TIERMOE_CPU_LEVEL. Levels: scalar < avx2 (AVX2+FMA+F16C) < avx512 (F, BW,
 * VL, DQ and VNNI: the kernels use all of them) < amx (AMX-INT8 on top). */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/log.h"
#include "cpu/cpu_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define TM_X86 1
#endif

static tm_cpu_features g_features;
static char g_features_string[128];
static pthread_once_t g_features_once = PTHREAD_ONCE_INIT;

#ifdef TM_X86
static uint64_t cpu_xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

bool cpu_amx_request(void) {
#if defined(__linux__) && defined(__x86_64__)
    /* Linux keeps AMX tile data off until a process asks for it:
     * ARCH_REQ_XCOMP_PERM (0x1023) with XFEATURE_XTILEDATA (18). */
    long rc = syscall(SYS_arch_prctl, 0x1023, 18);
    if (rc != 0) return false;
    uint64_t bitmask = 0; /* ARCH_GET_XCOMP_PERM (0x1022) confirms the grant */
    rc = syscall(SYS_arch_prctl, 0x1022, &bitmask);
    return rc == 0 && (bitmask & (1ull << 18));
#else
    return false;
#endif
}

static void cpu_features_detect(void) {
    tm_cpu_features *f = &g_features;
    memset(f, 0, sizeof *f);
#ifdef TM_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    f->fma = (c >> 12) & 1;
    f->f16c = (c >> 29) & 1;
    uint64_t xcr0 = osxsave ? cpu_xgetbv0() : 0;
    bool os_avx = (xcr0 & 6) == 6;             /* XMM and YMM state */
    bool os_avx512 = (xcr0 & 0xe6) == 0xe6;    /* plus opmask, ZMM_Hi256, Hi16_ZMM */
    bool os_amx = (xcr0 & 0x60000) == 0x60000; /* XTILECFG and XTILEDATA */
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        f->avx2 = avx && os_avx && ((b >> 5) & 1);
        if (os_avx512) {
            f->avx512f = (b >> 16) & 1;
            f->avx512dq = (b >> 17) & 1;
            f->avx512bw = (b >> 30) & 1;
            f->avx512vl = (b >> 31) & 1;
            f->avx512vnni = (c >> 11) & 1;
        }
        bool amx_tile = (d >> 24) & 1, amx_int8 = (d >> 25) & 1, amx_bf16 = (d >> 22) & 1;
        unsigned a1 = 0, b1, c1, d1;
        __cpuid_count(7, 1, a1, b1, c1, d1);
        f->avxvnni = os_avx && ((a1 >> 4) & 1);
        f->avx512bf16 = os_avx512 && ((a1 >> 5) & 1);
        if (os_amx && amx_tile && cpu_amx_request()) {
            f->amx_tile = true;
            f->amx_int8 = amx_int8;
            f->amx_bf16 = amx_bf16;
        }
    }
    if (!f->fma || !f->f16c) f->avx2 = false; /* the AVX2 kernels use all three */
#endif
    char *s = g_features_string;
    size_t n = sizeof g_features_string;
    s[0] = 0;
#define ADD(flag, name)                                                                            \
    if (flag) strncat(s, s[0] ? " " name : name, n - strlen(s) - 1)
    ADD(f->avx2, "AVX2");
    ADD(f->fma, "FMA");
    ADD(f->f16c, "F16C");
    ADD(f->avx512f, "AVX512F");
    ADD(f->avx512bw && f->avx512vl && f->avx512dq, "BW/VL/DQ");
    ADD(f->avx512vnni, "VNNI");
    ADD(f->avx512bf16, "BF16");
    ADD(f->avxvnni, "AVX-VNNI");
    ADD(f->amx_int8, "AMX-INT8");
    ADD(f->amx_bf16, "AMX-BF16");
#undef ADD
    if (!s[0]) strncpy(s, "scalar", n - 1);
}

const tm_cpu_features *cpu_features(void) {
    pthread_once(&g_features_once, cpu_features_detect);
    return &g_features;
}

const char *cpu_features_string(void) {
    cpu_features();
    return g_features_string;
}

/* ---- levels ---- */

static tm_cpu_level cpu_level_best(void) {
    const tm_cpu_features *f = cpu_features();
    bool avx512 =
        f->avx2 && f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->avx512vnni;
    if (avx512 && f->amx_int8) return TM_CPU_AMX;
    if (avx512) return TM_CPU_AVX512;
    if (f->avx2) return TM_CPU_AVX2;
    return TM_CPU_SCALAR;
}

/* A level's name, or an alias: the avx512 level needs VNNI, so its names are. */
static bool cpu_level_from_name(const char *name, tm_cpu_level *out) {
    static const char *const aliases[] = {"vnni", "avx512vnni", "avx512-vnni", "avx512_vnni"};
    for (int i = TM_CPU_SCALAR; i <= TM_CPU_AMX; i++)
        if (!strcasecmp(name, cpu_level_name((tm_cpu_level)i))) return *out = (tm_cpu_level)i, true;
    for (size_t i = 0; i < sizeof aliases / sizeof *aliases; i++)
        if (!strcasecmp(name, aliases[i])) return *out = TM_CPU_AVX512, true;
    return false;
}

static atomic_int g_level = -1;

tm_cpu_level cpu_level_get(void) {
    int l = atomic_load_explicit(&g_level, memory_order_relaxed);
    if (l >= 0) return (tm_cpu_level)l;
    tm_cpu_level best = cpu_level_best(), want = best;
    const char *env = getenv("TIERMOE_CPU_LEVEL");
    if (env && *env) {
        if (!cpu_level_from_name(env, &want)) {
            tm_log_warn("TIERMOE_CPU_LEVEL=%s is not one of scalar, avx2, avx512 (or vnni, "
                        "avx512vnni), amx; using %s",
                        env, cpu_level_name(best));
            want = best;
        }
        if (want > best) {
            tm_log_warn("TIERMOE_CPU_LEVEL=%s is above what this CPU has; using %s", env,
                        cpu_level_name(best));
            want = best;
        }
    }
    int expected = -1;
    atomic_compare_exchange_strong(&g_level, &expected, (int)want);
    return (tm_cpu_level)atomic_load(&g_level);
}

tm_status cpu_level_parse(const char *name, tm_cpu_level *out) {
    if (cpu_level_from_name(name, out)) return TM_OK;
    return tm_error_set(TM_ERR_ARG,
                        "cpu level '%s': expected scalar, avx2, avx512 (or vnni, avx512vnni), amx",
                        name);
}

tm_status cpu_level_set(tm_cpu_level level) {
    tm_cpu_level best = cpu_level_best();
    if ((int)level < TM_CPU_SCALAR || level > TM_CPU_AMX)
        return tm_error_set(TM_ERR_ARG, "cpu level %d is not a level (0..3)", (int)level);
    if (level > best)
        return tm_error_set(
            TM_ERR_UNSUPPORTED,
            "cpu level %s needs CPU features this machine lacks (best: %s; has: %s)",
            cpu_level_name(level), cpu_level_name(best), cpu_features_string());
    atomic_store(&g_level, (int)level);
    return TM_OK;
}

const char *cpu_level_name(tm_cpu_level level) {
    switch (level) {
    case TM_CPU_SCALAR:
        return "scalar";
    case TM_CPU_AVX2:
        return "avx2";
    case TM_CPU_AVX512:
        return "avx512";
    case TM_CPU_AMX:
        return "amx";
    }
    return "?";
}

/* ---- topology ---- */

static int cpu_read_int(const char *path, int *out) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int ok = fscanf(f, "%d", out) == 1;
    fclose(f);
    return ok ? 0 : -1;
}

int cpu_physical_cores(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    int n_allowed = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n_allowed = CPU_COUNT(&set);
    if (n_allowed <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        return n > 0 ? (int)n : 1;
    }
    /* Count distinct (package, core) pairs among the CPUs we may run on:
     * hyperthread siblings share both. */
    enum { MAX_PAIRS = 4096 };
    static int pairs[MAX_PAIRS][2];
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&lock);
    int n_pairs = 0;
    bool topo_ok = true;
    for (int cpu = 0; cpu < CPU_SETSIZE && topo_ok; cpu++) {
        if (!CPU_ISSET(cpu, &set)) continue;
        char path[128];
        int core = -1, pkg = -1;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
        if (cpu_read_int(path, &core)) topo_ok = false;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/physical_package_id",
                 cpu);
        if (cpu_read_int(path, &pkg)) topo_ok = false;
        if (!topo_ok) break;
        bool seen = false;
        for (int i = 0; i < n_pairs && !seen; i++) seen = pairs[i][0] == pkg && pairs[i][1] == core;
        if (!seen && n_pairs < MAX_PAIRS) {
            pairs[n_pairs][0] = pkg;
            pairs[n_pairs][1] = core;
            n_pairs++;
        }
    }
    pthread_mutex_unlock(&lock);
    return topo_ok && n_pairs > 0 ? n_pairs : n_allowed;
}
