// The key tables (schema.cpp), one per section.
#pragma once
#include "schema_impl.h"

namespace lt::config::detail {

const Table<NetworkKwargs>& network_kwargs_table();
const Table<NetworkConfig>& network_table();
const Table<SaveConfig>& save_table();
const Table<DatasetConfig>& dataset_table();
const Table<EmaConfig>& ema_table();
const Table<TrainConfig>& train_table();
const Table<ModelConfig>& model_table();
const Table<SampleItem>& sample_item_table();
const Table<SampleConfig>& sample_table();
const Table<LoggingConfig>& logging_table();
const Table<OomGuardConfig>& oom_guard_table();
const Table<MemoryConfig>& memory_table();
const Table<ProcessConfig>& process_table();

}  // namespace lt::config::detail
