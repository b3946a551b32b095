/* libFuzzer target: the network JSON parser on arbitrary bytes. With no
 * registry and no base folder, plugin layers and side files must fail
 * cleanly; everything else goes through the network API. */
#include <kiln/kiln.h>

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kiln_network *net = NULL;
    kiln_status s = kiln_network_parse_json(NULL, (const char *)data, size, NULL, &net);
    if (s == KILN_OK) {
        kiln_network_num_layers(net);
        kiln_network_destroy(net);
    } else if (!kiln_last_error()[0] || strchr(kiln_last_error(), '\n')) {
        /* every failure must leave a one-line message */
        __builtin_trap();
    }
    return 0;
}
