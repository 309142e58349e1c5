#include "src/sources.h"

#include "data/memory_source.h"
#include "data/synthetic_source.h"

namespace trainer {

Sources make_sources(const Config& config, c10::Device device) {
  Sources sources;
  if (config.data_source == "synthetic") {
    SyntheticOptions options{config.batch_size, config.image_size, config.num_classes,
                             config.synthetic_batches_per_epoch, config.seed};
    sources.train = std::make_unique<SyntheticSource>(options, device);
    return sources;
  }
  // generated: a training split and a held-out split of the same classes, drawn with other seeds.
  GeneratedDatasetOptions data{config.generated_classes, config.generated_train_images,
                               config.image_size, config.seed};
  MemorySourceOptions train{config.batch_size, /*training=*/true, config.seed, device.is_cuda()};
  sources.train = std::make_unique<MemorySource>(generate_labelled_images(data), train);
  data.images = config.generated_val_images;
  data.seed = config.seed + 1;
  MemorySourceOptions val{config.batch_size, /*training=*/false, config.seed, device.is_cuda()};
  sources.val = std::make_unique<MemorySource>(generate_labelled_images(data), val);
  return sources;
}

}  // namespace trainer
