#include "ops.h"

long demo_scale(long value) { return value * 2; }
