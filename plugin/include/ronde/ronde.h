// The whole public API of ronde in one include.
#pragma once

#include <ronde/amp.h>
#include <ronde/checkpoint.h>
#include <ronde/collectives.h>
#include <ronde/comm_hook.h>
#include <ronde/data.h>
#include <ronde/elastic.h>
#include <ronde/errors.h>
#include <ronde/gradient_reducer.h>
#include <ronde/metrics.h>
#include <ronde/optimizer.h>
#include <ronde/optimizer_options.h>
#include <ronde/process_set.h>
#include <ronde/runtime.h>
#include <ronde/schedule.h>
#include <ronde/sync_batch_norm.h>
#include <ronde/timeline.h>
#include <ronde/version.h>
