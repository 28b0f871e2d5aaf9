#pragma once
long demo_scale(long value);
