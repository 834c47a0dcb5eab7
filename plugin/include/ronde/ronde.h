// The whole public API of ronde in one include.
#pragma once

#include <ronde/collectives.h>
#include <ronde/errors.h>
#include <ronde/optimizer.h>
#include <ronde/runtime.h>
#include <ronde/version.h>
