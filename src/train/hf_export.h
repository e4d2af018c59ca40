// `llmtrain export --format hf` and `llmtrain import`: a checkpoint's weights as a Hugging Face
// directory in flash-linear-attention's layout (model.safetensors + config.json, names and keys from
// train/hf_layout.h), and such a directory back into a checkpoint (docs/INTEROP.md).
#pragma once
#include <string>

#include "core/tensor.h"

namespace llmt {

/// Writes `out_dir`/model.safetensors (every parameter under its FLA name, in `dtype`: f32 = the fp32
/// master weights unchanged, bf16 = rounded to nearest even), `out_dir`/config.json (hf_config) and
/// `out_dir`/llmtrain_config.json (the checkpoint's resolved llmtrain config, what import reads back).
/// `checkpoint` is a checkpoint directory or a run directory (its newest). Throws llmt::Error naming the
/// mixer for a model without an FLA counterpart, and the file and tensor for a damaged checkpoint.
void export_hf(const std::string& checkpoint, const std::string& out_dir, DType dtype);

/// Reads the HF directory `in_dir` (model.safetensors with F32 or BF16 tensors, config.json) into a
/// checkpoint `out_run`/checkpoints/step_00000000 (model weights only: AdamW moments zero, step 0,
/// loader at the start) plus `out_run`/config.json, which `llmtrain eval` and `llmtrain train --resume`
/// accept. The llmtrain config (model, train, data) comes from `config_path`, or when that is empty from
/// `in_dir`/llmtrain_config.json (written by export). Checks, naming the first mismatch: every key of
/// hf_config(config's model) against `in_dir`/config.json, then every parameter's FLA name, dtype and
/// shape, then that the file holds no other tensor. Refuses an `out_run` that already holds checkpoints.
/// Returns the checkpoint directory.
std::string import_hf(const std::string& in_dir, const std::string& config_path, const std::string& out_run);

}  // namespace llmt
