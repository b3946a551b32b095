/* ScaleBias version "1" in namespace "test": differs from the example only
 * by namespace (a near miss in the error). */
#define SCALE_BIAS_NAMESPACE "test"
#include "../../examples/scale_bias/scale_bias.c"
