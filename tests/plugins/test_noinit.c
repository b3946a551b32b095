/* A shared library that is not a kiln plugin: it exports a function, but not
 * kiln_plugin_library_init. */
#include <kiln/plugin.h>

KILN_PLUGIN_EXPORT int test_noinit_answer(void) { return 42; }
