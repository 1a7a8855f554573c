// nccl-zip GPU codec kernels: one launch encodes (or decodes) a batch of messages.
//
// Launch: grid = min(work items, NCCL_ZIP_GPU_SMS x CTAs per SM), 256 threads per CTA,
// dynamic shared memory = smem_bytes(smem_log2). A CTA walks the jobs in order and
// claims blocks of each job from the job's claim counter (JobState::claim), so block
// b of a job is always claimed after block b-1: the encoder's decoupled look-back only
// waits on blocks already held by running CTAs, which makes the kernel deadlock-free
// with any grid size. The CTA that finishes a job's last block writes the frame
// header (encode) or checks the CRC (decode) and publishes the JobResult with a
// system-scope fence, so the host can poll results in mapped memory without a stream
// sync. See docs/GPU.md.
#include "nzc_codec.cuh"

namespace nzc {

// Above the decoder's code words (SC_WORDS + NSYM = 58), below NSCAL.
enum : u32 { SC_BCAST = 58, SC_LAST = 59, S64_LOOKBACK = 8 };
enum : u64 { SCAN_AGG = 1ull << 62, SCAN_INC = 2ull << 62, SCAN_VAL = (1ull << 62) - 1 };

struct DevExec {
    Smem* s;
    __device__ explicit DevExec(Smem* sm) : s(sm) {}

    template <class F>
    __device__ void par(u64 n, F f) {
        for (u64 i = threadIdx.x; i < n; i += blockDim.x) f(i);
        __syncthreads();
    }
    template <class F>
    __device__ void one(F f) {
        if (threadIdx.x == 0) f();
        __syncthreads();
    }
    // Early exit one round (blockDim items) at a time: every thread takes the same
    // branch after each __syncthreads_or, and no shared flag is written and read
    // without a barrier between them (which racecheck reports as a hazard).
    template <class F>
    __device__ bool any(u64 n, F f) {
        for (u64 base = 0; base < n; base += blockDim.x) {
            u64 i = base + threadIdx.x;
            int hit = (i < n) && f(i);
            if (__syncthreads_or(hit)) return true;
        }
        return false;
    }
    // Sum of f(i) over i < n, the same in every thread: per-thread sums, a warp
    // reduction, one shared atomic per warp (not one per i on one address).
    template <class F>
    __device__ u64 sum64(u64 n, u32 slot, F f) {
        if (threadIdx.x == 0) s->sc64[slot] = 0;
        __syncthreads();
        u64 v = 0;
        for (u64 i = threadIdx.x; i < n; i += blockDim.x) v += f(i);
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
        if ((threadIdx.x & 31) == 0 && v) atomicAdd((unsigned long long*)&s->sc64[slot], (unsigned long long)v);
        __syncthreads();
        const u64 r = s->sc64[slot];
        __syncthreads();  // the slot may be written again right after
        return r;
    }
    // Ascending store rounds: round r covers units [r*blockDim, (r+1)*blockDim); its
    // stores are fenced before any thread starts round r+1.
    template <class F>
    __device__ void rounds(u64 n, F f) {
        for (u64 base = 0; base < n; base += blockDim.x) {
            u64 i = base + threadIdx.x;
            if (i < n) f(i);
#ifndef NZC_UNORDERED_ROUNDS
            __threadfence();
#endif
            __syncthreads();
        }
    }
    __device__ static void add32(u32* p, u32 v) { atomicAdd(p, v); }
    __device__ static void add64(u64* p, u64 v) { atomicAdd((unsigned long long*)p, (unsigned long long)v); }
    __device__ static void or32(u32* p, u32 v) { atomicOr(p, v); }

    // f() on thread 0; its result in every thread.
    template <class F>
    __device__ u32 bcast(F f) {
        if (threadIdx.x == 0) s->sc[SC_BCAST] = f();
        __syncthreads();
        u32 v = s->sc[SC_BCAST];
        __syncthreads();
        return v;
    }
    // Claims the next work item of a job (uniform result).
    __device__ u32 claim(u32* counter) {
        return bcast([&]() -> u32 { return atomicAdd(counter, 1u); });
    }
    // Acquire loads of words other CTAs publish (the host executor's
    // __ATOMIC_ACQUIRE): what the publisher wrote before its release is visible.
    __device__ static u32 ld32(const u32* p) {
        u32 v;
        asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
        return v;
    }
    __device__ static u64 ld64_acquire(const u64* p) {
        u64 v;
        asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
        return v;
    }
    __device__ static u32 xchg32(u32* p, u32 v) { return atomicExch(p, v); }
    __device__ static u32 cas32(u32* p, u32 old, u32 v) { return atomicCAS(p, old, v); }
    // Decoupled look-back: publishes block b's size, returns the exclusive prefix.
    __device__ u64 lookback(u64* scan, u32 b, u64 size) {
        if (threadIdx.x == 0) {
            u64 excl = 0;
            if (b == 0) {
                atomicExch((unsigned long long*)&scan[0], (unsigned long long)(SCAN_INC | size));
            } else {
                atomicExch((unsigned long long*)&scan[b], (unsigned long long)(SCAN_AGG | size));
                for (int p = (int)b - 1; p >= 0; p--) {
                    u64 v;
                    do {
                        v = ld64_acquire(&scan[p]);
                    } while ((v & ~SCAN_VAL) == 0);
                    excl += v & SCAN_VAL;
                    if ((v & ~SCAN_VAL) == SCAN_INC) break;
                }
                atomicExch((unsigned long long*)&scan[b], (unsigned long long)(SCAN_INC | (excl + size)));
            }
            s->sc64[S64_LOOKBACK] = excl;
        }
        __syncthreads();
        u64 v = s->sc64[S64_LOOKBACK];
        __syncthreads();
        return v;
    }
    // True (uniformly) in the CTA that finished the job's last item.
    __device__ bool finish(JobState* st, u32 items) {
        __syncthreads();
        if (threadIdx.x == 0) {
            // System scope: this CTA's output may be in host-mapped memory (the
            // data path's pinned staging), which the host reads once the
            // finisher publishes `done`.
            __threadfence_system();
            u32 d = atomicAdd(&st->done, 1u);
            s->sc[SC_LAST] = (d == items - 1);
            if (d == items - 1) __threadfence();
        }
        __syncthreads();
        bool last = s->sc[SC_LAST] != 0;
        __syncthreads();
        return last;
    }
    __device__ void publish(JobResult* r, u64 len, u32 status) {
        __syncthreads();
        if (threadIdx.x == 0) {
            r->len = len;
            r->status = status;
            __threadfence_system();
            *(volatile u32*)&r->done = 1;
        }
        __syncthreads();
    }
};

}  // namespace nzc

using namespace nzc;

extern "C" __global__ void __launch_bounds__(256) nzc_encode(const EncJob* jobs, u32 njobs, u32 smem_log2) {
    extern __shared__ __align__(16) u8 smem_raw[];
    Smem s;
    smem_carve(smem_raw, smem_log2, &s);
    DevExec x(&s);
    encode_jobs(x, s, jobs, njobs, smem_log2);
}

extern "C" __global__ void __launch_bounds__(256) nzc_decode(const DecJob* jobs, u32 njobs, u32 smem_log2) {
    extern __shared__ __align__(16) u8 smem_raw[];
    Smem s;
    smem_carve(smem_raw, smem_log2, &s);
    DevExec x(&s);
    decode_jobs<VERS_1>(x, s, jobs, njobs, smem_log2);
}

// Shared-memory bytes a launch needs for blocks up to 2^block_log2 (host wrappers call
// the same formula through src/gpu; exported for tests on the device).
// Frames of format 2 only; nzc_decode takes format 1 only (each rejects the other's
// frames with ST_HEADER): the caller knows the format its peer writes, and each
// kernel's machine code holds one decoder (registers, scripts/sass_check.sh).
extern "C" __global__ void __launch_bounds__(256) nzc_decode_v2(const DecJob* jobs, u32 njobs, u32 smem_log2) {
    extern __shared__ __align__(16) u8 smem_raw[];
    Smem s;
    smem_carve_v2(smem_raw, smem_log2, &s);  // dynamic shared memory: smem_bytes_v2
    DevExec x(&s);
    decode_jobs<VERS_2>(x, s, jobs, njobs, smem_log2);
}

extern "C" __global__ void nzc_smem_bytes(u32 block_log2, u64* out) { *out = smem_bytes(block_log2); }
