/* Pieces of calibration shared by calib.c (costs, paths, the printed
 * table) and calib_measure.c (which prints the table's rows as it measures
 * them). Private to src/tier. */
#ifndef TM_TIER_CALIB_INTERNAL_H
#define TM_TIER_CALIB_INTERNAL_H

#include <stdio.h>

#include "tier/calib.h"

/* Make a measured curve non-decreasing, as close to it as can be (least
 * squares: adjacent points out of order are replaced by their mean, the pool
 * adjacent violators algorithm). Noise can make a point cost less than the
 * one before; a few more tokens never really do. */
void calib_curve_fit(tm_calib_curve *cv);

/* TM_ERR_ARG naming path and the first field of key k that differs from
 * expect e (TM_OK: none). */
tm_status calib_key_check(const char *path, const tm_calib_key *k, const tm_calib_key *e);

/* Forget the quick profile calib_load_or_measure keeps for the process (tests). */
void calib_kept_clear(void);

/* The table, piece by piece (calib_print prints them all in this order). */
void calib_print_head(FILE *f, const tm_calib *c);
void calib_print_membw(FILE *f, const tm_calib *c);
void calib_print_cpu_head(FILE *f);
void calib_print_cpu_row(FILE *f, const tm_calib *c, int i);
void calib_print_copy(FILE *f, const tm_calib *c);
void calib_print_pcie(FILE *f, const tm_calib *c);
void calib_print_gpu_head(FILE *f);
void calib_print_gpu_row(FILE *f, const tm_calib *c, int i);
void calib_print_handoff(FILE *f, const tm_calib *c);
void calib_print_time(FILE *f, const tm_calib *c);

#endif
