/* The GPU list and the layer spans (gpus.h). */
#include "tier/gpus.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The items of spec split at any of seps, each passed to fn with its index;
 * more than TM_MAX_GPUS items or an empty one fail naming the flag. */
typedef tm_status (*item_fn)(const char *flag, const char *spec, const char *item, size_t len,
                             int i, tm_gpu_opts *o);

static tm_status items_each(const char *flag, const char *spec, const char *seps, item_fn fn,
                            tm_gpu_opts *o, int *n_out) {
    *n_out = 0;
    if (!spec || !*spec) return tm_error_set(TM_ERR_ARG, "%s: empty value", flag);
    int n = 0;
    for (const char *s = spec;;) {
        const size_t len = strcspn(s, seps);
        if (len == 0)
            return tm_error_set(TM_ERR_ARG, "%s '%s': empty item at offset %zu", flag, spec,
                                (size_t)(s - spec));
        if (n == TM_MAX_GPUS)
            return tm_error_set(TM_ERR_ARG, "%s '%s': more than %d GPUs", flag, spec, TM_MAX_GPUS);
        tm_status st = fn(flag, spec, s, len, n, o);
        if (st != TM_OK) return st;
        n++;
        if (!s[len]) break;
        s += len + 1;
    }
    *n_out = n;
    return TM_OK;
}

static tm_status device_item(const char *flag, const char *spec, const char *item, size_t len,
                             int i, tm_gpu_opts *o) {
    char buf[32];
    long v = -1;
    if (len > 4 && len < sizeof(buf) && !strncasecmp(item, "CUDA", 4)) {
        memcpy(buf, item + 4, len - 4);
        buf[len - 4] = '\0';
        char *end = NULL;
        errno = 0;
        v = buf[0] >= '0' && buf[0] <= '9' ? strtol(buf, &end, 10) : -1;
        if (errno || !end || *end || v > 1000) v = -1;
    }
    if (v < 0)
        return tm_error_set(TM_ERR_ARG,
                            "%s '%s': unknown device '%.*s' (expected CUDA0, CUDA1, ... or none)",
                            flag, spec, (int)len, item);
    for (int k = 0; k < i; k++)
        if (o->dev[k] == (int)v)
            return tm_error_set(TM_ERR_ARG, "%s '%s': CUDA%ld given twice", flag, spec, v);
    o->dev[i] = (int)v;
    return TM_OK;
}

tm_status gpus_devices_parse(const char *flag, const char *spec, tm_gpu_opts *o) {
    o->dev_given = true;
    o->n_dev = 0;
    if (spec && !strcasecmp(spec, "none")) return TM_OK;
    return items_each(flag, spec, ",", device_item, o, &o->n_dev);
}

tm_status gpus_split_mode_parse(const char *flag, const char *spec, tm_gpu_opts *o) {
    if (spec && !strcmp(spec, "layer"))
        o->split_mode = TM_SPLIT_LAYER;
    else if (spec && !strcmp(spec, "none"))
        o->split_mode = TM_SPLIT_NONE;
    else if (spec && !strcmp(spec, "row"))
        return tm_error_set(TM_ERR_ARG, "%s row: not supported (layer or none)", flag);
    else
        return tm_error_set(TM_ERR_ARG, "%s '%s': expected layer or none", flag, spec ? spec : "");
    return TM_OK;
}

static tm_status split_item(const char *flag, const char *spec, const char *item, size_t len, int i,
                            tm_gpu_opts *o) {
    char buf[64];
    char *end = NULL;
    float v = NAN;
    if (len < sizeof(buf)) {
        memcpy(buf, item, len);
        buf[len] = '\0';
        v = strtof(buf, &end);
        if (!end || *end) v = NAN;
    }
    if (!isfinite(v) || v < 0)
        return tm_error_set(TM_ERR_ARG,
                            "%s '%s': item %d '%.*s' is not a proportion (a number >= 0)", flag,
                            spec, i, (int)len, item);
    o->split[i] = v;
    return TM_OK;
}

tm_status gpus_split_parse(const char *flag, const char *spec, tm_gpu_opts *o) {
    tm_status st = items_each(flag, spec, ",/", split_item, o, &o->n_split);
    if (st != TM_OK) return st;
    float sum = 0;
    for (int i = 0; i < o->n_split; i++) sum += o->split[i];
    if (!(sum > 0)) {
        o->n_split = 0;
        return tm_error_set(TM_ERR_ARG, "%s '%s': every proportion is 0", flag, spec);
    }
    return TM_OK;
}

tm_status gpus_main_parse(const char *flag, const char *spec, tm_gpu_opts *o) {
    char *end = NULL;
    errno = 0;
    const long v = spec && *spec >= '0' && *spec <= '9' ? strtol(spec, &end, 10) : -1;
    if (errno || !end || *end || v < 0 || v >= TM_MAX_GPUS)
        return tm_error_set(TM_ERR_ARG, "%s '%s': expected a GPU index 0 .. %d", flag,
                            spec ? spec : "", TM_MAX_GPUS - 1);
    o->main_gpu = (int)v;
    return TM_OK;
}

static tm_status cache_item(const char *flag, const char *spec, const char *item, size_t len, int i,
                            tm_gpu_opts *o) {
    char buf[32];
    char *end = NULL;
    long long v = -1;
    if (len < sizeof(buf) && item[0] >= '0' && item[0] <= '9') {
        memcpy(buf, item, len);
        buf[len] = '\0';
        errno = 0;
        v = strtoll(buf, &end, 10);
        if (errno || !end || *end || v > (1ll << 30)) v = -1;
    }
    if (v < 0)
        return tm_error_set(TM_ERR_ARG, "%s '%s': item %d '%.*s' is not a MiB count (0 .. 2^30)",
                            flag, spec, i, (int)len, item);
    o->cache_mib[i] = v;
    return TM_OK;
}

tm_status gpus_cache_parse(const char *flag, const char *spec, tm_gpu_opts *o) {
    return items_each(flag, spec, ",", cache_item, o, &o->n_cache);
}

tm_status gpus_resolve(const tm_gpu_opts *o, int n_avail, int *n_used, int used[TM_MAX_GPUS]) {
    *n_used = 0;
    int n = 0, list[TM_MAX_GPUS];
    if (o->dev_given) {
        for (int i = 0; i < o->n_dev; i++) {
            if (o->dev[i] >= n_avail && n_avail)
                return tm_error_set(TM_ERR_DEVICE,
                                    "-dev: CUDA%d: no such GPU (%d present: CUDA0 .. CUDA%d)",
                                    o->dev[i], n_avail, n_avail - 1);
            if (o->dev[i] >= n_avail)
                return tm_error_set(TM_ERR_DEVICE, "-dev: CUDA%d: no GPU present", o->dev[i]);
            list[n++] = o->dev[i];
        }
    } else {
        for (int i = 0; i < n_avail && i < TM_MAX_GPUS; i++) list[n++] = i;
    }
    if (o->split_mode == TM_SPLIT_NONE) {
        if (n && (o->main_gpu < 0 || o->main_gpu >= n))
            return tm_error_set(TM_ERR_DEVICE, "-mg %d: the list of GPUs has %d (0 .. %d)",
                                o->main_gpu, n, n - 1);
        if (n) list[0] = list[o->main_gpu], n = 1;
    } else if (o->n_split && o->n_split != n) {
        return tm_error_set(TM_ERR_ARG, "--tensor-split: %d proportions for %d GPUs (%s)",
                            o->n_split, n, o->dev_given ? "-dev's" : "every GPU present");
    }
    if (o->n_cache && o->n_cache != n)
        return tm_error_set(TM_ERR_ARG, "--moe-cache: %d sizes for %d GPUs", o->n_cache, n);
    for (int i = 0; i < n; i++) used[i] = list[i];
    *n_used = n;
    return TM_OK;
}

void gpus_spans_make(int n_gpu, const float *prop, uint32_t n_layers, uint32_t *first) {
    double start[TM_MAX_GPUS + 1], sum = 0;
    for (int g = 0; g < n_gpu; g++) sum += prop[g] > 0 ? prop[g] : 0;
    double acc = 0;
    for (int g = 0; g < n_gpu; g++) {
        start[g] = sum > 0 ? acc / sum : (double)g / n_gpu;
        acc += prop[g] > 0 ? prop[g] : 0;
    }
    /* layer l: the last GPU whose share starts at or before l / n_layers; a GPU
       of share 0 starts where the next does, so it gets none */
    for (int g = 0; g <= n_gpu; g++) first[g] = n_layers;
    for (uint32_t l = n_layers; l-- > 0;) {
        const double x = (double)l / n_layers;
        int g = 0;
        while (g + 1 < n_gpu && start[g + 1] <= x) g++;
        first[g] = l;
    }
    /* a GPU with no layer starts where the next one does */
    for (int g = n_gpu - 1; g >= 0; g--)
        if (first[g] > first[g + 1]) first[g] = first[g + 1];
    if (n_gpu > 0) first[0] = 0;
}
