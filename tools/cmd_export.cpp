// llmtrain export / llmtrain import: a checkpoint as a Hugging Face directory in flash-linear-attention's
// layout and back (train/hf_export.h, docs/INTEROP.md).
#include <fmt/format.h>

#include "core/error.h"
#include "tools/commands.h"
#include "train/hf_export.h"

namespace llmt::cli {

int export_model(const ExportArgs& args) {
  check(args.format == "hf", "export: --format {} is not supported; supported: hf", args.format);
  export_hf(args.checkpoint, args.out, args.dtype == "bf16" ? DType::bf16 : DType::f32);
  fmt::print("wrote {}/model.safetensors ({}), config.json, llmtrain_config.json\n", args.out, args.dtype);
  return 0;
}

int import_model(const ImportArgs& args) {
  const std::string dir = import_hf(args.in, args.config, args.out);
  fmt::print("wrote {} (model weights only: step 0, AdamW moments zero)\n", dir);
  return 0;
}

}  // namespace llmt::cli
