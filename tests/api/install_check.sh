#!/usr/bin/env bash
# The installed library as a user gets it: cmake --install (component library) to a
# temporary prefix, examples/generate.c built with pkg-config's flags only, run on
# the api_model fixture's model. Also: the library's SONAME, and that it exports
# exactly the functions the header declares.
#   install_check.sh BUILD_DIR SOURCE_DIR MODEL [extra cc flags (sanitizers)]
set -euo pipefail
build=$1 src=$2 model=$3
shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" --component library > /dev/null
pc=$(find "$tmp/prefix" -name tiermoe.pc)
export PKG_CONFIG_PATH=$(dirname "$pc")
libdir=$(pkg-config --variable=libdir tiermoe)
cc -std=c11 -Wall -Wextra -Werror "$@" "$src/examples/generate.c" $(pkg-config --cflags --libs tiermoe) \
    -Wl,-rpath,"$libdir" -o "$tmp/generate"
so=$(readlink -f "$libdir/libtiermoe.so")
soname=$(readelf -d "$so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
want=$(pkg-config --modversion tiermoe | cut -d. -f1,2)
[ "$soname" = "libtiermoe.so.$want" ] || { echo "SONAME $soname, want libtiermoe.so.$want"; exit 1; }
exported=$(nm -D --defined-only "$so" | awk '$2 == "T" {sub(/@.*/, "", $3); print $3}' | sort)
declared=$(grep -oE '\btm_[a-z_]+\(' "$src/include/tiermoe.h" | tr -d '(' | sort -u)
if [ "$exported" != "$declared" ]; then
    echo "exported and declared functions differ:"; diff <(echo "$exported") <(echo "$declared"); exit 1
fi
out=$("$tmp/generate" "$model" "Hello world" 8)
case "$out" in "Hello world"?*) ;; *) echo "generate printed: '$out'"; exit 1 ;; esac
echo "installed: $soname, $(echo "$exported" | wc -l) functions; generate: $out"
