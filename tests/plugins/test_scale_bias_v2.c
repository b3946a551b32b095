/* ScaleBias version "2": an engine built with it does not find the example's
 * version "1" (a near miss in the error). */
#define SCALE_BIAS_VERSION "2"
#include "../../examples/scale_bias/scale_bias.c"
