/* ScaleBias/1/"" writing blob schema version 0: an engine built with it and
 * loaded with the example is refused as older than the example reads. */
#define SCALE_BIAS_BLOB_VERSION 0u
#include "../../examples/scale_bias/scale_bias.c"
