/* ScaleBias/1/"" writing blob schema version 2: an engine built with it and
 * loaded with the example is refused as newer than the example reads. */
#define SCALE_BIAS_BLOB_VERSION 2u
#include "../../examples/scale_bias/scale_bias.c"
