#include "model/layout.h"

#include <stdlib.h>
#include <string.h>

int64_t model_tensor_layer(const char *name, uint64_t len) {
    if (len < 5 || memcmp(name, "blk.", 4)) return -1;
    int64_t v = 0;
    uint64_t i = 4;
    for (; i < len && name[i] >= '0' && name[i] <= '9'; i++) {
        v = v * 10 + (name[i] - '0');
        if (v > (1 << 20)) return -1;
    }
    return (i > 4 && i < len && name[i] == '.') ? v : -1;
}

int model_tensor_is_expert(const char *name, uint64_t len) {
    static const char tag[] = "_exps.";
    for (uint64_t i = 0; i + sizeof(tag) - 1 <= len; i++)
        if (!memcmp(name + i, tag, sizeof(tag) - 1)) return 1;
    return 0;
}

tm_status model_layout_scan(const tm_gguf_file *f, tm_model_layout *out) {
    memset(out, 0, sizeof(*out));
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        int64_t l = model_tensor_layer(f->tensors[i].name.data, f->tensors[i].name.len);
        if (l >= 0 && (uint32_t)l + 1 > out->n_layer) out->n_layer = (uint32_t)l + 1;
    }
    out->layer_expert_bytes = calloc(out->n_layer ? out->n_layer : 1, sizeof(uint64_t));
    uint64_t *slice = calloc(out->n_layer ? out->n_layer : 1, sizeof(uint64_t));
    if (!out->layer_expert_bytes || !slice) {
        free(slice);
        model_layout_free(out);
        return tm_error_set(TM_ERR_NOMEM, "model layout: out of memory");
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const tm_gguf_tensor *t = &f->tensors[i];
        int64_t l = model_tensor_layer(t->name.data, t->name.len);
        if (l < 0 || !model_tensor_is_expert(t->name.data, t->name.len)) {
            out->other_bytes += t->n_bytes;
            continue;
        }
        uint32_t n_expert = (uint32_t)t->ne[t->n_dims - 1];
        if (t->n_dims < 2 || (out->n_expert && n_expert != out->n_expert)) {
            free(slice);
            model_layout_free(out);
            return tm_error_set(TM_ERR_FORMAT,
                                "%s: tensor '%.*s' has %u experts in its last dimension, other "
                                "expert tensors have %u",
                                f->path, (int)t->name.len, t->name.data, n_expert, out->n_expert);
        }
        out->n_expert = n_expert;
        if (!out->layer_expert_bytes[l]) out->n_moe_layers++;
        out->layer_expert_bytes[l] += t->n_bytes;
        out->expert_bytes += t->n_bytes;
        slice[l] += t->n_bytes / n_expert;
    }
    for (uint32_t l = 0; l < out->n_layer; l++)
        if (slice[l] > out->max_expert_slice) out->max_expert_slice = slice[l];
    free(slice);
    return TM_OK;
}

void model_layout_free(tm_model_layout *l) {
    free(l->layer_expert_bytes);
    l->layer_expert_bytes = NULL;
}
