/* What the tracer (src/trace, below the model) needs to know of a loaded
 * model: its shape and the label of its synthetic routing. */
#include <stdio.h>
#include <string.h>

#include "model/model.h"
#include "model/synth.h"

void model_trace_shape(const tm_model *m, tm_trace_shape *shape) {
    memset(shape, 0, sizeof(*shape));
    snprintf(shape->arch, sizeof(shape->arch), "%s", m->arch ? m->arch->name : "?");
    shape->n_layer = m->cfg.n_layer;
    shape->n_expert = m->cfg.n_expert;
    shape->n_expert_used = m->cfg.n_expert_used;
}

tm_status model_trace_create(const tm_trace_config *cfg, const tm_model *m, tm_trace **out) {
    tm_trace_shape shape;
    model_trace_shape(m, &shape);
    char routing[sizeof(((tm_trace_stats *)0)->routing)];
    synth_routing_label(m->file, routing, sizeof(routing));
    return trace_create(cfg, &shape, routing, out);
}
