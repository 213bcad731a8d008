/* tok_chat: render chat conversations with the built-in templates, for the
 * oracle test to compare with jinja2 rendering the models' own templates.
 * usage: tok_chat CASES.json  -> JSON array on stdout, one {"format", "text"} per case
 * A case: {"template": str|null, "format": name (overrides detection),
 *          "messages": [{"role", "content"}], "add_generation_prompt": bool,
 *          "bos": str|null, "date": str, "reasoning_effort": str, "enable_thinking": bool} */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "tokenizer/chat.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: tok_chat CASES.json\n");
        return 2;
    }
    json_error_t e;
    json_t *cases = json_load_file(argv[1], 0, &e);
    if (!json_is_array(cases)) {
        fprintf(stderr, "tok_chat: %s:%d: %s\n", argv[1], e.line, e.text);
        return 1;
    }
    json_t *results = json_array();
    int rc = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        const char *def_sys = NULL;
        tm_chat_format f =
            chat_format_detect(json_string_value(json_object_get(c, "template")), &def_sys);
        const char *name = json_string_value(json_object_get(c, "format"));
        if (name && chat_format_from_name(name, &f)) {
            fprintf(stderr, "tok_chat: %s\n", tm_error_message());
            return 1;
        }
        json_t *msgs = json_object_get(c, "messages");
        size_t n = json_array_size(msgs);
        tm_chat_message *m = calloc(n ? n : 1, sizeof(*m));
        for (size_t k = 0; k < n; k++) {
            m[k].role = json_string_value(json_object_get(json_array_get(msgs, k), "role"));
            m[k].content = json_string_value(json_object_get(json_array_get(msgs, k), "content"));
        }
        json_t *et = json_object_get(c, "enable_thinking");
        tm_chat_opts o = {
            .add_generation_prompt = json_is_true(json_object_get(c, "add_generation_prompt")),
            .disable_thinking = json_is_false(et),
            .bos_text = json_string_value(json_object_get(c, "bos")),
            .date = json_string_value(json_object_get(c, "date")),
            .reasoning_effort = json_string_value(json_object_get(c, "reasoning_effort")),
            .default_system = def_sys,
        };
        char *text = NULL;
        size_t len = 0;
        json_t *r = json_object();
        json_object_set_new(r, "format", json_string(chat_format_name(f)));
        if (chat_render(f, m, n, &o, &text, &len) == TM_OK) {
            json_object_set_new(r, "text", json_stringn(text, len));
        } else {
            json_object_set_new(r, "error", json_string(tm_error_message()));
        }
        json_array_append_new(results, r);
        free(text);
        free(m);
    }
    char *dump = json_dumps(results, JSON_INDENT(1));
    if (dump)
        puts(dump);
    else
        rc = 1;
    free(dump);
    json_decref(results);
    json_decref(cases);
    return rc;
}
