/* Quant types per tensor of a synthetic model (synth_mix.c): what
 * synth.c's writer asks for each tensor. Internal to src/model. */
#ifndef TM_MODEL_SYNTH_MIX_H
#define TM_MODEL_SYNTH_MIX_H

#include "model/synth.h"

/* The config's --tensor-type rules compiled, its recipe looked up. */
typedef struct synth_types synth_types;
tm_status synth_types_open(const tm_synth_config *c, synth_types **out);
void synth_types_close(synth_types *s);

/* The type of tensor `name` (of kind, in layer), and in *why what chose it
 * (a flag or "--mix NAME"; lives as long as s); TM_TYPE_COUNT: nothing did. */
tm_type synth_types_pick(const synth_types *s, tm_synth_kind kind, uint32_t layer, const char *name,
                         const char **why);

/* general.file_type: the recipe's llama_ftype, else that of the expert type. */
uint32_t synth_mix_ftype(const tm_synth_config *c);

#endif
