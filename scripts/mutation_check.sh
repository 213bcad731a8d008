#!/usr/bin/env bash
# Mutation checks (docs/mutations.md): each mutation is applied to a copy of
# the tree, the test that must catch it is built and run, and the script fails
# when a mutated tree passes its test (a test that cannot fail). Not run in CI
# (a build of the library, then a rebuild and a test run per mutation: about
# 5 minutes on 2 cores); run it after changing the tests or the reference they use.
#
#   scripts/mutation_check.sh            every mutation
#   scripts/mutation_check.sh router window   the named ones
#
# TM_MUTATION_DIR: where the copy and its build go (default: a new temp folder,
# removed at the end unless KEEP=1). The copy is the working tree as it is
# (tracked and untracked files, not the ignored ones), so uncommitted edits count.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
work=${TM_MUTATION_DIR:-$(mktemp -d /tmp/tm_mutation.XXXXXX)}
mkdir -p "$work/src"
[ "${KEEP:-0}" = 1 ] || [ -n "${TM_MUTATION_DIR:-}" ] || trap 'rm -rf "$work"' EXIT

# name | file | exact text | replacement | test | TM_TEST_GROUP (or -)
mutations=(
  "router|src/moe/router.c|prob[e] = l[e];|prob[e] = -l[e];|test_mock_placement|matrix_tiny"
  "window|src/cpu/cpu_attention.c|s->pos0 + i + 1 - s->window|s->pos0 + i - s->window|test_mock_kv_ring|-"
  "renorm|src/model/qwen3moe.c|c->n_expert, c->n_expert_used, true, 1.0f|c->n_expert, c->n_expert_used, false, 1.0f|test_mock_placement|matrix_tiny"
  "down_bias|src/model/gptoss.c|.down_bias = (const float *)L->down_b.data,|.down_bias = NULL,|test_mock_placement|matrix_gptoss"
  "mscale|src/model/gptoss.c|w->rope_mscale = factor > 1.0f ? (float)(0.1 * log(factor) + 1.0) : 1.0f;|w->rope_mscale = 1.0f;|test_mock_placement|matrix_gptoss"
)

# --touch: files newer than any object a reused folder holds, so all is rebuilt
(cd "$root" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) |
    tar -C "$work/src" --touch -xf -
cmake -S "$work/src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTM_CUDA=OFF -DTM_SANITIZE=OFF >"$work/configure.log" 2>&1 ||
    { cat "$work/configure.log"; exit 1; }

survived=0
for m in "${mutations[@]}"; do
    IFS='|' read -r name file from to test group <<<"$m"
    if [ $# -gt 0 ] && [[ " $* " != *" $name "* ]]; then continue; fi
    f="$work/src/$file"
    cp "$f" "$f.orig"
    n=$(FROM="$from" perl -ne '$n += () = /\Q$ENV{FROM}\E/g; END { print $n + 0 }' "$f")
    if [ "$n" = 0 ]; then
        echo "$name: '$from' not found in $file (the code changed: update the mutation)"
        exit 1
    fi
    FROM="$from" TO="$to" perl -pi -e 's/\Q$ENV{FROM}\E/$ENV{TO}/g' "$f"
    echo "== $name: $file ($n place(s)): '$from' -> '$to'; $test $group"
    cmake --build "$work/build" -j2 --target "$test" >"$work/build_$name.log" 2>&1 ||
        { tail -20 "$work/build_$name.log"; exit 1; }
    log="$work/run_$name.log"
    set +e
    envs=(TM_TEST_DATA="$work/src/tests/data" TM_TEST_TMP="$work/build/tests" TIERMOE_CALIB=none)
    [ "$group" = - ] || envs+=("TM_TEST_GROUP=$group")
    (cd "$work/build" && env "${envs[@]}" timeout 1200 "./tests/$test") >"$log" 2>&1
    rc=$?
    set -e
    mv "$f.orig" "$f"
    touch "$f" # newer than the mutated object: the next build compiles it again
    if [ $rc = 0 ]; then
        echo "   SURVIVED: $test passed with the mutation"
        survived=$((survived + 1))
    else
        # the failure's message: the line before cmocka's "[  ERROR   ]"
        echo "   caught (rc $rc): $(awk '/^\[  ERROR   \]/ { print prev; exit } { prev = $0 }' "$log" |
            cut -c1-400)"
    fi
done
# the library object of the last mutation is rebuilt from the restored file next time
[ $survived = 0 ] || { echo "$survived mutation(s) survived"; exit 1; }
echo "every mutation was caught"
