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
// Usage: nzc_host SCRIPT  (one command per line, one result line per command)
//   enc IN OUT HINT CHECKSUM BLOCK_LOG2   -> "ok FRAME_LEN" | "err STATUS"
//   dec IN OUT DST_CAP                    -> "ok RAW_LEN"   | "err STATUS"
//   smem BLOCK_LOG2                       -> "ok BYTES"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
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

struct Cta {
    std::vector<u8> raw;
    Smem s;
    explicit Cta(u32 log2) {
        u64 bytes = smem_bytes(log2);
        raw.assign(bytes, 0xA5);
    }
    void fresh(u32 log2) {
        memset(raw.data(), 0xA5, raw.size());
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

static int cmd_dec(const char* in, const char* out, u64 cap) {
    std::vector<u8> frame;
    if (!read_file(in, frame)) return printf("err io\n"), 0;
    u8* s = exact_copy(frame);
    u8* d = (u8*)malloc(cap ? cap : 1);
    memset(d, 0xEE, cap ? cap : 1);
    const u64 ws_blocks = (cap + 4095) / 4096;
    std::vector<u8> ws(ws_bytes(ws_blocks), 0);
    JobResult res;
    memset(&res, 0, sizeof res);
    DecJob job;
    job.src = (u64)(uintptr_t)s;
    job.src_len = frame.size();
    job.dst = (u64)(uintptr_t)d;
    job.dst_cap = cap;
    job.ws = (u64)(uintptr_t)ws.data();
    job.result = (u64)(uintptr_t)&res;
    job.ws_blocks = ws_blocks;
    job.reserved = 0;
    HostExec x;
    const u32 log2 = MAX_BLOCK_LOG2;  // a launch sized for any frame
    Cta cta(log2);
    JobState* st = (JobState*)ws.data();
    u32 items = 1;
    for (u32 b = 0; b < items; b++) {
        cta.fresh(log2);
        DecFrame f = parse_frame(x, s, frame.size(), cap);
        if (f.status == ST_OK && f.nb > ws_blocks) f.status = ST_BAD_ARGS;
        items = f.status != ST_OK ? 1 : (f.nb ? (u32)f.nb : 1);
        if (f.status == ST_OK && (f.flags & FLAG_CHECKSUM)) crc_init(x, cta.s);
        u32 r = decode_item(x, cta.s, job, f, b);
        if (r && !st->err) st->err = r;
        if (x.finish(st, items)) decode_finish(x, cta.s, job, f, st->err);
    }
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
        unsigned long long c = 0, d = 0, e = 0;
        if (sscanf(line, "enc %4095s %4095s %llu %llu %llu", a, b, &c, &d, &e) == 5) {
            cmd_enc(a, b, (u32)c, (u32)d, (u32)e);
        } else if (sscanf(line, "dec %4095s %4095s %llu", a, b, &c) == 3) {
            cmd_dec(a, b, c);
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
