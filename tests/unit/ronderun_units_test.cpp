// Placeholder replaced below.
#include <gtest/gtest.h>
TEST(RonderunUnits, Builds) {}
