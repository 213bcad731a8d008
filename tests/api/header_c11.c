/* include/tiermoe.h compiles as C11 (-std=c11 -pedantic-errors, no other header
 * first) and links against libtiermoe; header_cxx.cpp the same as C++17. */
#include "tiermoe.h"

#include <string.h>

int header_cxx_check(void);

int main(void) {
    tm_context_opts o;
    tm_context_opts_init(&o);
    tm_chat_message m = {"user", "hi"};
    const int ok = o.moe_pcie == TM_AUTO && m.role && !strcmp(tm_status_name(TM_OK), "ok");
    return ok && header_cxx_check() == 0 ? 0 : 1;
}
