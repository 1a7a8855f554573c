/*
 * The logger tests/nccl_profiles.rs hands to the plugin's `init`, standing in
 * for NCCL's ncclDebugLog. Stable Rust cannot define a C-variadic function, so
 * it is C (build.rs links it into the test binaries only).
 *
 * Every call is printed on stderr as one line,
 *   "NZLOG <level> <flags in hex> <message>"
 * and counted: WARN lines, WARN lines whose flags include NCCL_INIT (what
 * NCCL's default NCCL_DEBUG_SUBSYS shows), INFO lines with NCCL_INIT.
 */
#include <stdarg.h>
#include <stdio.h>

enum { LOG_WARN = 2, LOG_INFO = 3 };
#define SUBSYS_INIT 0x1UL

static unsigned long warns, warns_init, infos_init;

unsigned long nz_profile_warns(void) { return __atomic_load_n(&warns, __ATOMIC_SEQ_CST); }
unsigned long nz_profile_warns_init(void) { return __atomic_load_n(&warns_init, __ATOMIC_SEQ_CST); }
unsigned long nz_profile_infos_init(void) { return __atomic_load_n(&infos_init, __ATOMIC_SEQ_CST); }

void nz_profile_logger(int level, unsigned long flags, const char *file, int line,
                       const char *fmt, ...) {
  (void)file;
  (void)line;
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (level == LOG_WARN) {
    __atomic_fetch_add(&warns, 1, __ATOMIC_SEQ_CST);
    if (flags & SUBSYS_INIT) __atomic_fetch_add(&warns_init, 1, __ATOMIC_SEQ_CST);
  }
  if (level == LOG_INFO && (flags & SUBSYS_INIT))
    __atomic_fetch_add(&infos_init, 1, __ATOMIC_SEQ_CST);
  fprintf(stderr, "NZLOG %d %#lx %s\n", level, flags, msg);
  fflush(stderr);
}
