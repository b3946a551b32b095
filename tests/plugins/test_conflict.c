/* A second library that registers ScaleBias/1/"" like the example does:
 * loading both is an error that names both files. */
#include "../../examples/scale_bias/scale_bias.c"
