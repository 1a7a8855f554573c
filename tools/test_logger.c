/*
 * nccl-zip-perf's stand-in for NCCL's debug logger.
 *
 * The plugin's `init` takes a C variadic logger; stable Rust cannot define a
 * C-variadic function, so this one lives in C and is linked only into the
 * binaries (build.rs, "test tools" section). It mimics NCCL's output closely
 * enough that tests can grep for "NCCL WARN": one line per call,
 * "host:pid:tid NCCL WARN|INFO|TRACE [NET] message" on stderr.
 *
 * WARN is always printed. INFO and TRACE are printed when NCCL_DEBUG says so,
 * as NCCL does. Lines are formatted into a buffer first so that concurrent
 * I/O threads never interleave within a line.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Values from NCCL's plugin ABI (see nccl-headers/net_v8.h). */
enum { LOG_WARN = 2, LOG_INFO = 3, LOG_TRACE = 5 };
#define SUBSYS_NET 0x10UL

static unsigned long nccl_zip_test_warns;

/* Number of WARN lines printed so far (read by the driver for its summary). */
unsigned long nccl_zip_test_logger_warns(void) {
  return __atomic_load_n(&nccl_zip_test_warns, __ATOMIC_RELAXED);
}

static int max_level(void) {
  const char *d = getenv("NCCL_DEBUG");
  if (d == NULL) return LOG_WARN;
  if (strcasecmp(d, "TRACE") == 0) return LOG_TRACE;
  if (strcasecmp(d, "INFO") == 0) return LOG_INFO;
  return LOG_WARN;
}

void nccl_zip_test_logger(int level, unsigned long flags, const char *file, int line,
                          const char *fmt, ...) {
  if (level > max_level()) return;
  const char *lvl = level == LOG_WARN ? "WARN" : level == LOG_INFO ? "INFO" : "TRACE";
  char host[64] = "?";
  gethostname(host, sizeof host - 1);
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (level == LOG_WARN) __atomic_fetch_add(&nccl_zip_test_warns, 1, __ATOMIC_RELAXED);
  char out[2300];
  int n = snprintf(out, sizeof out, "%s:%d:%ld NCCL %s %s%s:%d %s\n", host, (int)getpid(),
                   (long)syscall(SYS_gettid), lvl, (flags & SUBSYS_NET) ? "[NET] " : "",
                   file ? file : "?", line, msg);
  if (n > 0) {
    size_t len = (size_t)n < sizeof out ? (size_t)n : sizeof out - 1;
    if (out[len - 1] != '\n') out[len - 1] = '\n';
    fwrite(out, 1, len, stderr);
    fflush(stderr);
  }
}
