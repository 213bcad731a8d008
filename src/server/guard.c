/* Who may change the server's state: a page on another site, open in the
 * user's browser, must not reset the counters, apply a plan or run a
 * completion. A browser sends a cross-site POST without asking first (a CORS
 * preflight) only when its Content-Type is a form's or text/plain, and it
 * names the page in Origin; a page that points its own name at 127.0.0.1
 * (DNS rebinding) is same-origin but sends that name as Host. So a request
 * that is not GET or HEAD needs a JSON Content-Type, an Origin (when sent)
 * that is this server's or one --cors-origin allows, and, when the server
 * listens on a loopback address, a loopback Host. --cors-origin also answers
 * preflights (http.c) and adds Access-Control-Allow-Origin, so pages of the
 * origins it names can call the API. */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "server_internal.h"

static const char *header(srv_req *r, const char *name) {
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

/* application/json, parameters (charset) allowed, any case. */
static bool is_json(const char *ct) {
    static const char json[] = "application/json";
    if (!ct) return false;
    while (*ct == ' ' || *ct == '\t') ct++;
    if (strncasecmp(ct, json, sizeof(json) - 1)) return false;
    ct += sizeof(json) - 1;
    while (*ct == ' ' || *ct == '\t') ct++;
    return !*ct || *ct == ';';
}

/* The name in HOST[:PORT] or [IPV6][:PORT]. */
static void host_name(const char *h, char *out, size_t cap) {
    const char *end;
    if (*h == '[') {
        end = strchr(++h, ']');
    } else {
        end = strchr(h, ':');
    }
    const size_t n = end ? (size_t)(end - h) : strlen(h);
    snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), h);
}

static bool loopback(const char *name) {
    struct in_addr a4;
    if (!strcasecmp(name, "localhost") || !strcmp(name, "::1")) return true;
    return inet_pton(AF_INET, name, &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127;
}

/* origin equals one of the comma-separated list (or the list has "*"). */
static bool listed(const char *list, const char *origin) {
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        while (n && *p == ' ') p++, n--;
        while (n && p[n - 1] == ' ') n--;
        if ((n == 1 && *p == '*') || (n == strlen(origin) && !strncasecmp(p, origin, n)))
            return true;
        p = end ? end + 1 : p + n;
    }
    return false;
}

const char *srv_guard_cors_origin(srv_req *r) {
    const char *origin = header(r, "Origin");
    return origin && r->s->cors_origin && listed(r->s->cors_origin, origin) ? origin : NULL;
}

void srv_guard_cors_headers(srv_req *r, struct MHD_Response *resp) {
    const char *origin = srv_guard_cors_origin(r);
    if (!origin || !resp) return;
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", origin);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_VARY, "Origin");
}

/* Origin is this server's: http(s)://HOST with the Host the request was sent to. */
static bool same_origin(const char *origin, const char *host) {
    if (!host) return false;
    const char *rest = !strncasecmp(origin, "http://", 7)    ? origin + 7
                       : !strncasecmp(origin, "https://", 8) ? origin + 8
                                                             : NULL;
    return rest && !strcasecmp(rest, host);
}

bool srv_guard_post(srv_req *r, enum MHD_Result *res) {
    const tm_server *s = r->s;
    const char *origin = header(r, "Origin"), *host = header(r, MHD_HTTP_HEADER_HOST);
    if (host && loopback(s->host)) {
        char name[256];
        host_name(host, name, sizeof(name));
        if (!loopback(name) && strcasecmp(name, s->host)) {
            *res = srv_reply_error(r, 403,
                                   "Host: %.200s is not this server's: it listens on %s, a "
                                   "loopback address (a page whose name points here?)",
                                   host, s->host);
            return false;
        }
    }
    if (origin && !same_origin(origin, host) && !srv_guard_cors_origin(r)) {
        *res = srv_reply_error(r, 403,
                               "Origin: %.200s is not this server's; a page there may not change "
                               "its state unless the server is started with --cors-origin %.200s",
                               origin, origin);
        return false;
    }
    const char *ct = header(r, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (!is_json(ct)) {
        *res = srv_reply_error(r, 415, "Content-Type: %.200s%s; send application/json",
                               ct ? ct : "missing", ct ? " is not JSON" : "");
        return false;
    }
    return true;
}
