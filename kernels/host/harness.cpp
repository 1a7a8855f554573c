// Host test harness for the GPU codec: runs the kernels' per-CTA logic
// (kernels/nzc_codec.cuh, the same source nvcc compiles) on the CPU, one work item
// after another, with a sequential executor. Built with g++ by tests/kernels_host.rs
// (optionally with -fsanitize=address,undefined); no CUDA needed.
//
// Every buffer is heap-allocated with its exact size, so a read or write past a
// frame, an output or the shared-memory carve is caught by AddressSanitizer.
// Shared memory is poisoned (0xA5) before every work item, as if each item ran on a
// fresh CTA: logic that relies on state left by an earlier item fails.
//
// A second, concurrent executor (ConcExec) runs whole launches the way the device
// does: the kernels' own launch bodies (encode_jobs / decode_jobs in
// nzc_codec.cuh), one OS thread per CTA, CTAs claiming blocks from the jobs'
// counters with real atomics, the encoder's look-back spinning on other CTAs'
// published prefixes, the finisher reading what the others wrote, and every
// parallel loop walked in a seeded random order. Built under ThreadSanitizer (and
// AddressSanitizer) by tests/kernels_host.rs.
//
// Usage: nzc_host SCRIPT  (one command per line, one result line per command)
//   enc IN OUT HINT CHECKSUM BLOCK_LOG2   -> "ok FRAME_LEN" | "err STATUS"
//   dec IN OUT DST_CAP                    -> "ok RAW_LEN"   | "err STATUS"  (version 1
//                                            frames, as nzc_decode)
//   dec2 IN OUT DST_CAP                   -> as dec, version 2 frames (nzc_decode_v2)
//   penc IN OUT HINT CHECKSUM BLOCK_LOG2 CTAS JOBS SEED
//                                         -> as enc; CTAS threads run one launch of
//                                            JOBS copies of the job, which must agree
//   pdec IN OUT DST_CAP CTAS JOBS SEED    -> as dec, concurrently
//   pdec2 IN OUT DST_CAP CTAS JOBS SEED   -> as dec2, concurrently
//   race                                  -> a deliberate data race (checks that
//                                            the sanitizer reports one)
//   smem BLOCK_LOG2                       -> "ok BYTES"
//   smem2 BLOCK_LOG2                      -> "ok BYTES" (nzc_decode_v2's carve)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sched.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "../nzc_codec.cuh"

using namespace nzc;

struct HostExec {
    template <class F>
    void par(u64 n, F f) {
        for (u64 i = 0; i < n; i++) f(i);
    }
    template <class F>
    void one(F f) {
        f();
    }
    template <class F>
    bool any(u64 n, F f) {
        for (u64 i = 0; i < n; i++)
            if (f(i)) return true;
        return false;
    }
    template <class F>
    u64 sum64(u64 n, u32, F f) {
        u64 v = 0;
        for (u64 i = 0; i < n; i++) v += f(i);
        return v;
    }
    template <class F>
    void rounds(u64 n, F f) {
        for (u64 i = 0; i < n; i++) f(i);
    }
    static void add32(u32* p, u32 v) { *p += v; }
    static void add64(u64* p, u64 v) { *p += v; }
    static void or32(u32* p, u32 v) { *p |= v; }
    // Items run in order, so block b-1 has published its inclusive prefix.
    u64 lookback(u64* scan, u32 b, u64 size) {
        const u64 mask = (1ull << 62) - 1;
        u64 excl = b == 0 ? 0 : (scan[b - 1] & mask);
        if (b > 0 && (scan[b - 1] >> 62) != 2) {
            fprintf(stderr, "harness: look-back found no inclusive prefix\n");
            abort();
        }
        scan[b] = (2ull << 62) | (excl + size);
        return excl;
    }
    bool finish(JobState* st, u32 items) { return ++st->done == items; }
    void publish(JobResult* r, u64 len, u32 status) {
        r->len = len;
        r->status = status;
        r->done = 1;
    }
};

// One CTA of a concurrent launch, on its own OS thread. Within the CTA the
// "threads" of a parallel loop run one after another, in a random order drawn
// per loop from the seed: logic that depends on the order of the units of one
// loop (a race between the device's threads) gives different bytes.
struct ConcExec {
    u64 rng;
    explicit ConcExec(u64 seed) : rng(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) { next(); }
    u64 next() {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
    }
    static u64 gcd(u64 a, u64 b) {
        while (b) {
            u64 t = a % b;
            a = b;
            b = t;
        }
        return a;
    }
    // A random bijection of [0, n): i -> (a*i + c) mod n with gcd(a, n) = 1.
    struct Perm {
        u64 n, a, c;
        u64 operator()(u64 i) const { return (u64)(((unsigned __int128)a * i + c) % n); }
    };
    Perm perm(u64 n) {
        if (n <= 1) return Perm{n ? n : 1, 1, 0};
        u64 a = next() % n;
        while (a == 0 || gcd(a, n) != 1) a = (a + 1) % n;
        return Perm{n, a, next() % n};
    }
    template <class F>
    void par(u64 n, F f) {
        Perm p = perm(n);
        for (u64 i = 0; i < n; i++) f(p(i));
    }
    template <class F>
    void one(F f) {
        f();
    }
    template <class F>
    bool any(u64 n, F f) {
        Perm p = perm(n);
        for (u64 i = 0; i < n; i++)
            if (f(p(i))) return true;
        return false;
    }
    template <class F>
    u64 sum64(u64 n, u32, F f) {
        Perm p = perm(n);
        u64 v = 0;
        for (u64 i = 0; i < n; i++) v += f(p(i));
        return v;
    }
    // Rounds of 256 units (the device's blockDim) in ascending order, each
    // round's units in a random order.
    template <class F>
    void rounds(u64 n, F f) {
        for (u64 base = 0; base < n; base += 256) {
            const u64 m = n - base < 256 ? n - base : 256;
            Perm p = perm(m);
            for (u64 i = 0; i < m; i++) f(base + p(i));
        }
    }
    template <class F>
    u32 bcast(F f) {
        return f();
    }
    static void add32(u32* p, u32 v) { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
    static void add64(u64* p, u64 v) { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
    static void or32(u32* p, u32 v) { __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }
    static u32 ld32(const u32* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static u32 xchg32(u32* p, u32 v) { return __atomic_exchange_n(p, v, __ATOMIC_ACQ_REL); }
    static u32 cas32(u32* p, u32 old, u32 v) {
        __atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
        return old;
    }
    u32 claim(u32* counter) { return __atomic_fetch_add(counter, 1u, __ATOMIC_ACQ_REL); }
    // The device's decoupled look-back (nzc_kernels.cu), with acquire loads and
    // release stores: an aggregate first, then the walk back over earlier
    // blocks (spinning until each has published), then the inclusive prefix.
    u64 lookback(u64* scan, u32 b, u64 size) {
        const u64 AGG = 1ull << 62, INC = 2ull << 62, VAL = (1ull << 62) - 1;
        if (b == 0) {
            __atomic_store_n(&scan[0], INC | size, __ATOMIC_RELEASE);
            return 0;
        }
        __atomic_store_n(&scan[b], AGG | size, __ATOMIC_RELEASE);
        u64 excl = 0;
        for (long p = (long)b - 1; p >= 0; p--) {
            u64 v;
            while (((v = __atomic_load_n(&scan[p], __ATOMIC_ACQUIRE)) & ~VAL) == 0) sched_yield();
            excl += v & VAL;
            if ((v & ~VAL) == INC) break;
        }
        __atomic_store_n(&scan[b], INC | (excl + size), __ATOMIC_RELEASE);
        return excl;
    }
    bool finish(JobState* st, u32 items) {
        return __atomic_fetch_add(&st->done, 1u, __ATOMIC_ACQ_REL) == items - 1;
    }
    void publish(JobResult* r, u64 len, u32 status) {
        r->len = len;
        r->status = status;
        __atomic_store_n(&r->done, 1u, __ATOMIC_RELEASE);
    }
};

// One CTA's shared memory, carved as nzc_decode_v2 does (v2) or as the other
// kernels do.
struct Cta {
    std::vector<u8> raw;
    Smem s;
    bool v2;
    explicit Cta(u32 log2, bool v2_carve = false) : v2(v2_carve) {
        u64 bytes = v2 ? smem_bytes_v2(log2) : smem_bytes(log2);
        raw.assign(bytes, 0xA5);
    }
    void fresh(u32 log2) {
        memset(raw.data(), 0xA5, raw.size());
        if (v2)
            smem_carve_v2(raw.data(), log2, &s);
        else
            smem_carve(raw.data(), log2, &s);
    }
};

static bool read_file(const char* path, std::vector<u8>& v) {
    FILE* f = fopen(path, "rb");
    if (!f) return false;
    v.clear();
    u8 buf[1 << 16];
    size_t r;
    while ((r = fread(buf, 1, sizeof buf, f)) > 0) v.insert(v.end(), buf, buf + r);
    fclose(f);
    return true;
}

static bool write_file(const char* path, const u8* p, u64 n) {
    FILE* f = fopen(path, "wb");
    if (!f) return false;
    bool ok = n == 0 || fwrite(p, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

// Exact-size heap copy (so ASan sees the true bounds).
static u8* exact_copy(const std::vector<u8>& v) {
    u8* p = (u8*)malloc(v.size() ? v.size() : 1);
    if (v.size()) memcpy(p, v.data(), v.size());
    return p;
}

static int cmd_enc(const char* in, const char* out, u32 hint, u32 cks, u32 log2) {
    std::vector<u8> src;
    if (!read_file(in, src)) return printf("err io\n"), 0;
    const u64 n = src.size();
    u8* s = exact_copy(src);
    const u64 cap = n + HEADER_LEN;
    u8* d = (u8*)malloc(cap);
    memset(d, 0xEE, cap);
    const u64 nb = (n + (1ull << log2) - 1) >> log2;
    std::vector<u8> ws(ws_bytes(nb), 0);
    JobResult res;
    memset(&res, 0, sizeof res);
    EncJob job;
    job.src = (u64)(uintptr_t)s;
    job.dst = (u64)(uintptr_t)d;
    job.n = n;
    job.dst_cap = cap;
    job.ws = (u64)(uintptr_t)ws.data();
    job.result = (u64)(uintptr_t)&res;
    job.hint = hint;
    job.checksum = cks;
    job.block_log2 = log2;
    job.nb = (u32)nb;
    HostExec x;
    Cta cta(log2);
    const u32 items = nb ? (u32)nb : 1;
    for (u32 b = 0; b < items; b++) {
        cta.fresh(log2);
        FramePlan fp = frame_plan(x, cta.s, s, n, hint, log2);
        if (cks) crc_init(x, cta.s);
        encode_item(x, cta.s, job, fp, b);
        if (x.finish((JobState*)ws.data(), items)) encode_finish(x, cta.s, job, fp);
    }
    if (!res.done) return printf("err unfinished\n"), 0;
    if (res.status) return printf("err %u\n", res.status), 0;
    if (!write_file(out, d, res.len)) return printf("err io\n"), 0;
    printf("ok %llu\n", (unsigned long long)res.len);
    free(s);
    free(d);
    return 0;
}

// Decodes `frame` into `d` (cap bytes) with the sequential executor, shared
// memory poisoned before every work item; fills `res`. VERS: the frame versions
// accepted (decode_jobs' template argument).
template <u32 VERS = VERS_ALL>
static void dec_core(const u8* s, u64 frame_len, u8* d, u64 cap, JobResult* res) {
    const u64 ws_blocks = (cap + 4095) / 4096;
    std::vector<u8> ws(ws_bytes(ws_blocks), 0);
    memset(res, 0, sizeof *res);
    DecJob job;
    job.src = (u64)(uintptr_t)s;
    job.src_len = frame_len;
    job.dst = (u64)(uintptr_t)d;
    job.dst_cap = cap;
    job.ws = (u64)(uintptr_t)ws.data();
    job.result = (u64)(uintptr_t)res;
    job.ws_blocks = ws_blocks;
    job.reserved = 0;
    HostExec x;
    const u32 log2 = MAX_BLOCK_LOG2;  // a launch sized for any frame
    Cta cta(log2, VERS == VERS_2);
    JobState* st = (JobState*)ws.data();
    u32 items = 1;
    for (u32 b = 0; b < items; b++) {
        cta.fresh(log2);
        DecFrame f = parse_frame(x, s, frame_len, cap, VERS);
        if (f.status == ST_OK && f.nb > ws_blocks) f.status = ST_BAD_ARGS;
        items = f.status != ST_OK ? 1 : (f.nb ? (u32)f.nb : 1);
        if (f.status == ST_OK && (f.flags & FLAG_CHECKSUM)) crc_init(x, cta.s);
        u32 r = decode_item<VERS>(x, cta.s, job, f, b);
        if (r && !st->err) st->err = r;
        if (x.finish(st, items)) decode_finish(x, cta.s, job, f, st->err);
    }
}

// For a fuzzer linked with this file (NZC_HOST_NO_MAIN): the kernels' decoders
// (the frame's version byte picks nzc_decode's or nzc_decode_v2's) on arbitrary
// bytes. Returns the status (0: ok, `*out_len` bytes written), or
// 0xFFFFFFFF if the job never finished.
extern "C" u32 nzc_host_decode(const u8* frame, u64 frame_len, u8* dst, u64 cap, u64* out_len) {
    JobResult res;
    dec_core(frame, frame_len, dst, cap, &res);
    *out_len = res.len;
    return res.done ? res.status : 0xFFFFFFFFu;
}

template <u32 VERS>
static int cmd_dec(const char* in, const char* out, u64 cap) {
    std::vector<u8> frame;
    if (!read_file(in, frame)) return printf("err io\n"), 0;
    u8* s = exact_copy(frame);
    u8* d = (u8*)malloc(cap ? cap : 1);
    memset(d, 0xEE, cap ? cap : 1);
    JobResult res;
    dec_core<VERS>(s, frame.size(), d, cap, &res);
    if (!res.done) return printf("err unfinished\n"), 0;
    if (res.status) {
        printf("err %u\n", res.status);
    } else {
        if (!write_file(out, d, res.len)) return printf("err io\n"), 0;
        printf("ok %llu\n", (unsigned long long)res.len);
    }
    free(s);
    free(d);
    return 0;
}

// Runs `ctas` CTA threads over one launch; each gets fresh poisoned shared memory.
template <class Body>
static void launch(u32 ctas, u32 log2, u64 seed, Body body, bool v2_carve = false) {
    std::vector<std::thread> ts;
    for (u32 c = 0; c < ctas; c++)
        ts.emplace_back([=]() {
            Cta cta(log2, v2_carve);
            cta.fresh(log2);
            ConcExec x(seed * 1000003ull + c + 1);
            body(x, cta.s);
        });
    for (auto& t : ts) t.join();
}

static int cmd_penc(const char* in, const char* out, u32 hint, u32 cks, u32 log2, u32 ctas, u32 njobs,
                    u64 seed) {
    std::vector<u8> src;
    if (!read_file(in, src)) return printf("err io\n"), 0;
    if (ctas == 0 || njobs == 0) return printf("err bad-command\n"), 0;
    const u64 n = src.size();
    const u64 cap = n + HEADER_LEN;
    const u64 nb = (n + (1ull << log2) - 1) >> log2;
    std::vector<u8*> srcs, dsts;
    std::vector<std::vector<u8>> wss;
    std::vector<JobResult> res(njobs);
    std::vector<EncJob> jobs(njobs);
    for (u32 j = 0; j < njobs; j++) {
        srcs.push_back(exact_copy(src));
        dsts.push_back((u8*)malloc(cap));
        memset(dsts[j], 0xEE, cap);
        wss.emplace_back(ws_bytes(nb), 0);
        memset(&res[j], 0, sizeof res[j]);
        EncJob& job = jobs[j];
        memset(&job, 0, sizeof job);
        job.src = (u64)(uintptr_t)srcs[j];
        job.dst = (u64)(uintptr_t)dsts[j];
        job.n = n;
        job.dst_cap = cap;
        job.ws = (u64)(uintptr_t)wss[j].data();
        job.result = (u64)(uintptr_t)&res[j];
        job.hint = hint;
        job.checksum = cks;
        job.block_log2 = log2;
        job.nb = (u32)nb;
    }
    const EncJob* jp = jobs.data();
    launch(ctas, log2, seed, [&](ConcExec& x, Smem& s) { encode_jobs(x, s, jp, njobs, log2); });
    int rc = 0;
    for (u32 j = 0; j < njobs && !rc; j++) {
        if (!res[j].done) rc = printf("err unfinished\n");
        else if (res[j].status) rc = printf("err %u\n", res[j].status);
        else if (res[j].len != res[0].len || memcmp(dsts[j], dsts[0], res[0].len) != 0)
            rc = printf("err jobs-disagree\n");
    }
    if (!rc) {
        if (!write_file(out, dsts[0], res[0].len)) printf("err io\n");
        else printf("ok %llu\n", (unsigned long long)res[0].len);
    }
    for (u32 j = 0; j < njobs; j++) {
        free(srcs[j]);
        free(dsts[j]);
    }
    return 0;
}

template <u32 VERS>
static int cmd_pdec(const char* in, const char* out, u64 cap, u32 ctas, u32 njobs, u64 seed) {
    std::vector<u8> frame;
    if (!read_file(in, frame)) return printf("err io\n"), 0;
    if (ctas == 0 || njobs == 0) return printf("err bad-command\n"), 0;
    const u64 ws_blocks = (cap + 4095) / 4096;
    std::vector<u8*> srcs, dsts;
    std::vector<std::vector<u8>> wss;
    std::vector<JobResult> res(njobs);
    std::vector<DecJob> jobs(njobs);
    for (u32 j = 0; j < njobs; j++) {
        srcs.push_back(exact_copy(frame));
        dsts.push_back((u8*)malloc(cap ? cap : 1));
        memset(dsts[j], 0xEE, cap ? cap : 1);
        wss.emplace_back(ws_bytes(ws_blocks), 0);
        memset(&res[j], 0, sizeof res[j]);
        DecJob& job = jobs[j];
        memset(&job, 0, sizeof job);
        job.src = (u64)(uintptr_t)srcs[j];
        job.src_len = frame.size();
        job.dst = (u64)(uintptr_t)dsts[j];
        job.dst_cap = cap;
        job.ws = (u64)(uintptr_t)wss[j].data();
        job.result = (u64)(uintptr_t)&res[j];
        job.ws_blocks = ws_blocks;
    }
    const DecJob* jp = jobs.data();
    const u32 log2 = MAX_BLOCK_LOG2;  // a launch sized for any frame
    launch(ctas, log2, seed, [&](ConcExec& x, Smem& s) { decode_jobs<VERS>(x, s, jp, njobs, log2); }, VERS == VERS_2);
    int rc = 0;
    for (u32 j = 0; j < njobs && !rc; j++) {
        if (!res[j].done) rc = printf("err unfinished\n");
        else if (res[j].status != res[0].status || res[j].len != res[0].len ||
                 (!res[0].status && memcmp(dsts[j], dsts[0], res[0].len) != 0))
            rc = printf("err jobs-disagree\n");
    }
    if (!rc) {
        if (res[0].status) printf("err %u\n", res[0].status);
        else if (!write_file(out, dsts[0], res[0].len)) printf("err io\n");
        else printf("ok %llu\n", (unsigned long long)res[0].len);
    }
    for (u32 j = 0; j < njobs; j++) {
        free(srcs[j]);
        free(dsts[j]);
    }
    return 0;
}

// Two threads write one plain word: ThreadSanitizer must report it (the test
// that the sanitizer is really watching).
static int cmd_race() {
    static volatile u64 word = 0;
    std::atomic<u32> go{0};
    std::thread a([&]() {
        while (!go.load(std::memory_order_relaxed)) {
        }
        word = word + 1;
    });
    std::thread b([&]() {
        while (!go.load(std::memory_order_relaxed)) {
        }
        word = word + 2;
    });
    go.store(1, std::memory_order_relaxed);
    a.join();
    b.join();
    printf("ok %llu\n", (unsigned long long)word);
    return 0;
}

#ifndef NZC_HOST_NO_MAIN
int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s SCRIPT\n", argv[0]);
        return 2;
    }
    FILE* f = fopen(argv[1], "r");
    if (!f) {
        perror(argv[1]);
        return 2;
    }
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        char cmd[16], a[4096], b[4096];
        unsigned long long c = 0, d = 0, e = 0, g = 0, h = 0, k = 0;
        if (sscanf(line, "penc %4095s %4095s %llu %llu %llu %llu %llu %llu", a, b, &c, &d, &e, &g, &h, &k) == 8) {
            cmd_penc(a, b, (u32)c, (u32)d, (u32)e, (u32)g, (u32)h, (u64)k);
        } else if (sscanf(line, "pdec2 %4095s %4095s %llu %llu %llu %llu", a, b, &c, &d, &e, &g) == 6) {
            cmd_pdec<VERS_2>(a, b, c, (u32)d, (u32)e, (u64)g);  // "X2" before "X" (sscanf)
        } else if (sscanf(line, "pdec %4095s %4095s %llu %llu %llu %llu", a, b, &c, &d, &e, &g) == 6) {
            cmd_pdec<VERS_1>(a, b, c, (u32)d, (u32)e, (u64)g);
        } else if (strncmp(line, "race", 4) == 0) {
            cmd_race();
        } else if (sscanf(line, "enc %4095s %4095s %llu %llu %llu", a, b, &c, &d, &e) == 5) {
            cmd_enc(a, b, (u32)c, (u32)d, (u32)e);
        } else if (sscanf(line, "dec2 %4095s %4095s %llu", a, b, &c) == 3) {
            cmd_dec<VERS_2>(a, b, c);
        } else if (sscanf(line, "dec %4095s %4095s %llu", a, b, &c) == 3) {
            cmd_dec<VERS_1>(a, b, c);
        } else if (sscanf(line, "smem2 %llu", &c) == 1) {  // before "smem": it matches "smem2 N" too
            printf("ok %llu\n", (unsigned long long)smem_bytes_v2((u32)c));
        } else if (sscanf(line, "smem %llu", &c) == 1) {
            printf("ok %llu\n", (unsigned long long)smem_bytes((u32)c));
        } else if (sscanf(line, "%15s", cmd) == 1) {
            printf("err bad-command\n");
        }
        fflush(stdout);
    }
    fclose(f);
    return 0;
}
#endif  // NZC_HOST_NO_MAIN
