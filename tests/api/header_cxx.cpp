// include/tiermoe.h compiles as C++17 and its functions link from C++ (extern "C").
#include "tiermoe.h"

#include <cstring>

extern "C" int header_cxx_check(void);

int header_cxx_check(void) {
    tm_sampler_params p;
    tm_sampler_params_init(&p);
    tm_model *m = nullptr;
    const tm_status st = tm_model_load(nullptr, &m);
    return st == TM_ERR_ARG && p.top_k == 40 && std::strlen(tm_version()) > 0 ? 0 : 1;
}
