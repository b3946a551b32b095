#!/usr/bin/env bash
# The command line's contract: --help everywhere exits 0 and prints usage
# on stdout; usage errors exit 2 with one line "kiln: error: ...".
set -u
source "$(dirname "$0")/common.bash"

for cmd in "" build exec inspect plugins; do
  expect_ok "kiln $cmd --help" "$KILN" $cmd --help
  expect_stdout "kiln $cmd --help prints usage" "^usage: kiln"
  [ -s "$ERR" ] && fail "kiln $cmd --help wrote to stderr"
done
expect_ok "kiln --version" "$KILN" --version
expect_stdout "version" "^kiln [0-9]+\.[0-9]+\.[0-9]+"

expect_error 2 "no command" 'missing command' "$KILN"
expect_error 2 "unknown command" 'unknown command "frobnicate"' "$KILN" frobnicate
expect_error 2 "build without -o" 'build|missing -o' "$KILN" build "$NET"
expect_error 2 "build without a network" 'build|missing the network file' "$KILN" build -o "$TMP/x.engine"
expect_error 2 "build with two networks" 'build|one network file' "$KILN" build "$NET" "$NET" -o "$TMP/x.engine"
expect_error 2 "build with an unknown backend" 'unknown backend "tpu"' "$KILN" build "$NET" -o "$TMP/x.engine" --backend tpu
expect_error 2 "build with an unknown option" 'build|unknown option --fast' "$KILN" build "$NET" -o "$TMP/x.engine" --fast
expect_error 2 "an option missing its value" 'option --plugins needs a value' "$KILN" build "$NET" -o "$TMP/x.engine" --plugins
expect_error 2 "a flag given a value" 'option --verbose takes no value' "$KILN" build "$NET" -o "$TMP/x.engine" --verbose=yes
expect_error 2 "exec without an engine" 'exec|missing the engine file' "$KILN" exec
expect_error 2 "exec --shapes without a colon" '--shapes expects NAME:DIMS' "$KILN" exec x.engine --shapes input
expect_error 2 "exec --shapes with bad dims" '--shapes expects NAME:DIMS' "$KILN" exec x.engine --shapes input:4xx2
expect_error 2 "exec --shapes with a negative dim" '--shapes expects NAME:DIMS' "$KILN" exec x.engine --shapes input:-4x2
expect_error 2 "exec --input without a file" '--input expects NAME=FILE.npy' "$KILN" exec x.engine --input input
expect_error 2 "exec --iterations 0" '--iterations must be at least 1' "$KILN" exec x.engine --iterations 0
expect_error 2 "exec --iterations not a number" '--iterations expects an integer' "$KILN" exec x.engine --iterations ten
expect_error 2 "exec --atol negative" '--atol expects a non-negative number' "$KILN" exec x.engine --atol -1
expect_error 2 "inspect without an engine" 'inspect|missing the engine file' "$KILN" inspect
expect_error 2 "inspect with an unknown option" 'unknown option --yaml' "$KILN" inspect x.engine --yaml
expect_error 2 "plugins with an argument" 'unexpected argument "foo"' "$KILN" plugins foo

# Failures that are not usage errors exit 1.
expect_error 1 "a network file that does not exist" 'nothere.json' "$KILN" build "$TMP/nothere.json" -o "$TMP/x.engine"
expect_error 1 "a plugin library that does not exist" 'nothere.so' "$KILN" plugins --plugins "$TMP/nothere.so"
need_file "$TEST_PLUGINS/libtest_noinit.so"
expect_error 1 "a library that is not a kiln plugin" 'libtest_noinit.so' "$KILN" plugins --plugins "$TEST_PLUGINS/libtest_noinit.so"

finish
