// The one seam where the validated configuration becomes each part's own options, as
// src/sources.cpp does for the input: the parts never read Config.
#pragma once

#include "src/config/config.h"
#include "src/report/interval_log.h"
#include "src/run/benchmark.h"
#include "src/run/fit.h"
#include "src/run/start.h"
#include "src/train/lr_schedule.h"
#include "src/train/trainer.h"

namespace trainer {

TrainerOptions trainer_options(const Config& config);
LrScheduleOptions lr_schedule_options(const Config& config);
IntervalLogOptions interval_log_options(const Config& config);
BenchmarkOptions benchmark_options(const Config& config);
StartOptions start_options(const Config& config);
FitOptions fit_options(const Config& config);

}  // namespace trainer
