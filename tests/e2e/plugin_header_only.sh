#!/usr/bin/env bash
# A plugin needs include/kiln/plugin.h and nothing else: the example and every
# test plugin compile with only -Iinclude, and link with --no-undefined
# without libkiln (so they use no host symbol except through kiln_host_api).
# Each exports exactly one symbol, kiln_plugin_library_init.
set -euo pipefail
src=${KILN_SOURCE_DIR:?KILN_SOURCE_DIR must be set (run through ctest)}
cc=${CC:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

build() { # source, output: the exact command line the plugin guide shows
  "$cc" -std=c11 -Wall -Werror -fPIC -shared -Iinclude -Wl,--no-undefined "$1" -o "$2" \
    || fail "$1 does not build against include/ alone"
}

cd "$src"

build examples/scale_bias/scale_bias.c "$tmp/libkiln_scale_bias.so"
syms=$(nm -D --defined-only "$tmp/libkiln_scale_bias.so" | awk '{print $3}')
[ "$syms" = "kiln_plugin_library_init" ] || fail "example exports [$syms], expected only kiln_plugin_library_init"
# Nothing it needs is a kiln symbol: its undefined symbols all come from libc.
if nm -D --undefined-only "$tmp/libkiln_scale_bias.so" | grep -q 'kiln_'; then
  fail "example needs a kiln symbol: $(nm -D --undefined-only "$tmp/libkiln_scale_bias.so" | grep kiln_)"
fi

for p in tests/plugins/*.c; do
  build "$p" "$tmp/lib$(basename "$p" .c).so"
done

# The header itself must stand alone in C11 and in C++ (plugins are often C++).
printf '#include <kiln/plugin.h>\nint main(void) { return (int)sizeof(kiln_host_api) - 112; }\n' > "$tmp/h.c"
"$cc" -std=c11 -Wall -Wextra -Werror -pedantic -Iinclude "$tmp/h.c" -o "$tmp/h" || fail "plugin.h is not standalone C11"
"$tmp/h" || fail "kiln_host_api is not 112 bytes when compiled by $cc"
if command -v c++ >/dev/null; then
  cp "$tmp/h.c" "$tmp/h.cpp"
  c++ -std=c++11 -Wall -Wextra -Werror -Iinclude -c "$tmp/h.cpp" -o "$tmp/h.o" || fail "plugin.h does not compile as C++"
else
  echo "note: no c++ compiler, C++ check skipped"
fi
echo "ok: plugins build against include/kiln/plugin.h alone"
