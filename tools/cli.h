/* The CLI's subcommands; each lives in tools/cmd_<name>.c and returns the
 * process exit code (0 ok, 1 runtime failure, 2 usage error). */
#ifndef TM_TOOLS_CLI_H
#define TM_TOOLS_CLI_H

int cmd_inspect(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_report(int argc, char **argv);

/* Shared flag parsing: strict numbers with a clear message naming the flag. */
int cli_parse_i64(const char *flag, const char *s, long long lo, long long hi, long long *out);
int cli_parse_f64(const char *flag, const char *s, double lo, double hi, double *out);
/* -ngl: a layer count, "all", or "auto" (TM_NGL_AUTO). */
int cli_parse_ngl(const char *flag, const char *s, int *out);

#endif
