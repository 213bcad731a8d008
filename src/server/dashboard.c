/* GET /: the dashboard, one static page (src/server/dashboard.html, compiled in by
 * CMake) that polls /metrics, /moe-layer-perf and /moe-hot-cache and can apply a
 * plan made from the live counters (POST /moe-hot-cache {"from":"counters"}). */
#include "server_internal.h"

enum MHD_Result srv_handle_dashboard(srv_req *r) {
    return srv_reply_text(r, 200, "text/html; charset=utf-8", (const char *)srv_dashboard_html,
                          srv_dashboard_html_len);
}
