/* The CLI's expert-trace switches (tools/cli_trace.c): the environment, then
 * flags, and what turns the tracer on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "cli.h"

static void test_env(void **state) {
    (void)state;
    cli_trace c = {0};
    unsetenv("TIERMOE_EXPERT_TRACE_OUTPUT");
    setenv("TIERMOE_EXPERT_TRACE_STATS", "1", 1);
    setenv("TIERMOE_EXPERT_TRACE_NAMES", "off", 1);
    setenv("TIERMOE_EXPERT_TRACE_PER_LAYER", "true", 1);
    assert_int_equal(cli_trace_from_env(&c, "test"), 0);
    assert_true(c.stats && !c.names && c.per_layer && !c.output);
    assert_true(cli_trace_enabled(&c));
    setenv("TIERMOE_EXPERT_TRACE_OUTPUT", "x.json", 1);
    assert_int_equal(cli_trace_from_env(&c, "test"), 0);
    assert_string_equal(c.output, "x.json");
    setenv("TIERMOE_EXPERT_TRACE_NAMES", "maybe", 1); /* a usage error, named on stderr */
    assert_int_equal(cli_trace_from_env(&c, "test"), 2);
    unsetenv("TIERMOE_EXPERT_TRACE_STATS"), unsetenv("TIERMOE_EXPERT_TRACE_NAMES");
    unsetenv("TIERMOE_EXPERT_TRACE_PER_LAYER"), unsetenv("TIERMOE_EXPERT_TRACE_OUTPUT");
}

static void test_flags(void **state) {
    (void)state;
    cli_trace d = {0};
    assert_false(cli_trace_enabled(&d));
    char *argv[] = {"run",    "--expert-trace-names", "-n", "--expert-trace-output",
                    "o.json", "--expert-trace-output"};
    assert_int_equal(cli_trace_parse(&d, 6, argv, 1), 1);
    assert_int_equal(cli_trace_parse(&d, 6, argv, 2), 0);
    assert_int_equal(cli_trace_parse(&d, 6, argv, 3), 2);
    assert_int_equal(cli_trace_parse(&d, 6, argv, 5), -1);
    assert_true(d.names && !d.stats);
    assert_string_equal(d.output, "o.json");
    assert_true(cli_trace_enabled(&d));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_env),
        cmocka_unit_test(test_flags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
