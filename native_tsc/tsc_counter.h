/*
 * The counter read and the virtual-domain transform, shared by native_tsc._tsc
 * and native_tsc._probe so both stamp the same counter the same way.
 *
 * x86-64: rdtscp (lfence;rdtsc where the CPU lacks rdtscp). arm64: isb; CNTVCT_EL0.
 * Transform: offset + t + floor(t * skew_e12 / 1e12), in 128-bit integers (exact).
 */
#ifndef CP_TSC_COUNTER_H
#define CP_TSC_COUNTER_H

#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <x86intrin.h>
#define CP_X86 1
#elif defined(__aarch64__)
#define CP_ARM64 1
#else
#error "native_tsc supports x86-64 and arm64; use native_tsc.tsc_python elsewhere"
#endif

static const __int128 CP_E12 = (__int128)1000000000000LL;

#ifdef CP_X86
/* Each extension module keeps its own copy, set by cp_detect_rdtscp() at import. */
static int cp_have_rdtscp = 0;
#endif

static inline void cp_detect_rdtscp(void) {
#ifdef CP_X86
    unsigned int eax, ebx, ecx, edx;
    if (__get_cpuid(0x80000001, &eax, &ebx, &ecx, &edx)) {
        cp_have_rdtscp = (edx >> 27) & 1;
    }
#endif
}

static inline uint64_t cp_raw_read(void) {
#ifdef CP_X86
    if (cp_have_rdtscp) {
        unsigned int aux;
        return __rdtscp(&aux);
    }
    _mm_lfence();
    return __rdtsc();
#else
    uint64_t v;
    __asm__ __volatile__("isb; mrs %0, cntvct_el0" : "=r"(v)::"memory");
    return v;
#endif
}

static inline int64_t cp_floor_div_e12(__int128 num) {
    __int128 q = num / CP_E12;
    if ((num % CP_E12) != 0 && num < 0) {
        q -= 1;
    }
    return (int64_t)q;
}

static inline int64_t cp_transform(uint64_t raw, int on, int64_t skew_e12, int64_t offset) {
    int64_t t = (int64_t)raw;
    if (!on) {
        return t;
    }
    return offset + t + cp_floor_div_e12((__int128)t * skew_e12);
}

#endif
