/* What test_api.c and test_api_seq.c share: the model both load (TM_API_MODEL),
 * the checks, and the context options of each build (test_api.c says what the
 * two programs are). Only the public header: this program sees no internal one. */
#ifndef TM_TEST_API_H
#define TM_TEST_API_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tiermoe.h"

#define N_GEN 8

extern tm_model *model;
extern tm_model_info info;

/* A call that must succeed; one expected to fail with status want and a message
 * containing word. */
#define CHECK(call)              assert_int_equal_msg(call, #call)
#define EXPECT(want, word, call) expect_fail(want, word, call, #call)
void assert_int_equal_msg(tm_status st, const char *what);
void expect_fail(tm_status want, const char *word, tm_status got, const char *what);

/* The options of a context of n_seq sequences in this build (the mock GPU's: every layer
 * on the GPU, experts in RAM, 1 MiB of VRAM cache). */
void opts_for(tm_context_opts *o, int32_t n_seq);

/* test_api_seq.c: sequences, prompt reuse, batches, counters and plans, GPUs */
void test_batch_prompts(void **state);
void test_two_sequences(void **state);
void test_prompt_reuse(void **state);
void test_counters_and_plans(void **state);
void test_gpus(void **state);

#endif
