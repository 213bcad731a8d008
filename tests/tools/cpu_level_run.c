/* Runs a test at one CPU kernel level, for the per-level copies of the
 * numeric tests (tests/CMakeLists.txt):
 *   cpu_level_run LEVEL COMMAND [ARGS...]
 * sets TIERMOE_CPU_LEVEL=LEVEL and runs COMMAND in its place. Exits 77
 * (skipped) when this machine lacks LEVEL (TIERMOE_CPU_LEVEL would quietly
 * fall back to a lower one), or when LEVEL is the machine's best: the test
 * without a suffix runs there already. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/status.h"
#include "cpu/cpu.h"

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--print")) {
        printf("%s\n", cpu_level_name(cpu_level_get()));
        return 0;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: cpu_level_run LEVEL COMMAND [ARGS...] | --print\n");
        return 2;
    }
    tm_cpu_level level;
    if (cpu_level_parse(argv[1], &level) != TM_OK) {
        fprintf(stderr, "cpu_level_run: %s\n", tm_error_message());
        return 2;
    }
    if (cpu_level_set(level) != TM_OK) {
        printf("skipped: %s\n", tm_error_message());
        return 77;
    }
    tm_cpu_level best = level;
    while (best < TM_CPU_AMX && cpu_level_set((tm_cpu_level)(best + 1)) == TM_OK) best++;
    if (level == best) {
        printf("skipped: %s is this machine's best cpu level (has: %s), which the test without "
               "the suffix runs at\n",
               cpu_level_name(level), cpu_features_string());
        return 77;
    }
    setenv("TIERMOE_CPU_LEVEL", cpu_level_name(level), 1);
    fflush(stdout);
    execvp(argv[2], argv + 2);
    perror(argv[2]);
    return 2;
}
