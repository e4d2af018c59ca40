// llmtrain: the one binary of the project. Subcommands: train, sweep, info, probe, bench, prepare-data,
// tokenize, eval, export, import, generate.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "tools/cli_checks.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"llmtrain: pretraining of Transformer / linear-attention / SSM language models from JSON configs"};
  app.require_subcommand(1);

  llmt::cli::TrainArgs train;
  CLI::App* t = app.add_subcommand("train", "train a model from a JSON config");
  t->add_option("--config,-c", train.config, "run config (JSON)")->required()->check(CLI::ExistingFile);
  t->add_option("--out,-o", train.out, "run directory (default runs/<run_name>)");
  t->add_flag("--resume", train.resume, "continue from the newest checkpoint in the run directory");
  t->add_option("--set", train.set, "override a config key: --set train.lr=1e-3 (repeatable)");

  llmt::cli::SweepArgs sw;
  CLI::App* sweep = app.add_subcommand("sweep", "run a base config at every point of a grid (or a sweep file), "
                                                "collecting losses and speed into DIR/results.csv");
  sweep->add_option("--base,-c", sw.base, "base run config (JSON)")->required()->check(CLI::ExistingFile);
  CLI::Option* sgrid = sweep->add_option("--grid", sw.grids, "key.path=v1,v2,... (repeatable: the cartesian product)");
  CLI::Option* sfile = sweep->add_option("--points", sw.file, "sweep JSON {\"points\": [{\"key.path\": value, ...}, ...]}")
                           ->check(CLI::ExistingFile);
  sgrid->excludes(sfile);
  sweep->add_option("--set", sw.set, "key.path=value for every point, applied before the point's own (repeatable)");
  sweep->add_option("--out,-o", sw.out, "sweep directory (default sweeps/<base name>)");
  CLI::Option* sslurm = sweep->add_flag("--emit-slurm", sw.emit_slurm, "write one launch script per point and a Slurm array script; run nothing");
  sweep->add_flag("--collect", sw.collect, "run nothing; gather the points' results into results.csv / results.md")
      ->excludes(sslurm);

  llmt::cli::InfoArgs info;
  CLI::App* i = app.add_subcommand("info", "print parameter counts and FLOPs per token of a config");
  i->add_option("--config,-c", info.config, "run config (JSON)")->required()->check(CLI::ExistingFile);
  i->add_option("--set", info.set, "override a config key (repeatable)");

  llmt::cli::ProbeArgs probe;
  CLI::App* p = app.add_subcommand("probe", "run one mixer layer forward and backward on the CPU");
  p->add_option("--mixer", probe.mixer, "mixer type")->required()->check(CLI::IsMember({"transformer", "gdn", "comba", "kda", "mdn", "mamba2", "mamba3"}));
  p->add_option("--config,-c", probe.config, "take the layer's dimensions from this config")->check(CLI::ExistingFile);
  p->add_option("--inputs", probe.inputs, "safetensors with x [B,T,D], optional dy and parameters (an earlier --out file works)")
      ->check(CLI::ExistingFile);
  p->add_option("--out", probe.out, "write y, dx, grad.<param> and the inputs used to this safetensors file");
  p->add_option("--dtype", probe.dtype, "f32 or f64")->check(CLI::IsMember({"f32", "f64"}));
  p->add_flag("--selftest", probe.selftest, "float64 finite-difference check of every gradient; non-zero exit on failure");
  p->add_option("--batch", probe.batch, "B when x is random")->check(llmt::positive_number());
  p->add_option("--seq-len", probe.seq_len, "T when x is random")->check(llmt::positive_number());

  llmt::cli::BenchArgs bench;
  CLI::App* b = app.add_subcommand("bench", "time training steps of a config on random tokens");
  b->add_option("--config,-c", bench.config, "run config (JSON)")->required()->check(CLI::ExistingFile);
  b->add_option("--set", bench.set, "override a config key (repeatable)");
  b->add_option("--steps", bench.steps, "timed steps")->check(llmt::positive_number());
  b->add_option("--warmup", bench.warmup, "untimed steps first")->check(llmt::non_negative_number());
  b->add_option("--peak-tflops", bench.peak_tflops,
                "device peak for MFU, e.g. 989.4 (H100/H200 SXM dense bf16)")->check(llmt::non_negative_number());

  llmt::cli::PrepareDataArgs prep;
  CLI::App* d = app.add_subcommand("prepare-data", "tokenize corpus files into token shards + dataset.json");
  d->add_option("--input,-i", prep.inputs, "files, directories or globs: .jsonl, .jsonl.zst, .parquet, .txt (repeatable)")
      ->required();
  d->add_option("--tokenizer,-t", prep.tokenizer, "gpt2, llama3 (alias llama3.1), or a path: tokenizer.json, a directory with encoder.json + vocab.bpe, a SentencePiece .model");
  d->add_option("--out,-o", prep.out, "output directory")->required();
  d->add_option("--val-fraction", prep.val_fraction, "share of documents held out for validation, in [0, 1); default 0.0005 (training needs some; a .txt file is one document)")
      ->check(CLI::Range(0.0, 1.0));
  d->add_option("--shard-tokens", prep.shard_tokens, "tokens per shard")->check(llmt::positive_number());
  d->add_option("--doc-separator", prep.doc_separator, "token before each document")
      ->check(CLI::IsMember({"none", "eos", "bos"}));
  d->add_option("--threads", prep.threads, "tokenizer threads (0 = all cores); the output does not depend on it")
      ->check(llmt::non_negative_number());
  d->add_option("--include-set", prep.include_sets, "keep only documents of this meta.redpajama_set_name (repeatable)");
  d->add_option("--exclude-set", prep.exclude_sets, "drop documents of this meta.redpajama_set_name (repeatable)");
  CLI::Option* score = d->add_option("--min-int-score", prep.min_int_score, "drop documents whose int_score is lower");
  d->add_flag("--quiet,-q", prep.quiet, "no progress line");
  d->add_option("--node", prep.node, "Node.js binary used for .parquet inputs");

  llmt::cli::TokenizeArgs tokz;
  CLI::App* k = app.add_subcommand("tokenize", "print the token ids of a text, or with --decode the text of ids");
  k->add_option("--tokenizer,-t", tokz.tokenizer, "gpt2, llama3 (alias llama3.1), or a path: tokenizer.json, a directory with encoder.json + vocab.bpe, a SentencePiece .model");
  CLI::Option* ktext = k->add_option("--text", tokz.text, "the input (text, or ids with --decode)");
  CLI::Option* kfile = k->add_option("--file,-f", tokz.file, "a file holding the input")->check(CLI::ExistingFile);
  ktext->excludes(kfile);
  k->add_flag("--json", tokz.json, "print the ids as a JSON list");
  k->add_flag("--decode", tokz.decode, "the input is token ids (whitespace or comma separated, [ ] allowed); print their text");

  llmt::cli::EvalArgs ev;
  CLI::App* e = app.add_subcommand("eval", "loss, perplexity and bits per byte of a checkpoint over held-out text, "
                                   "or its accuracy on a synthetic task's evaluation points");
  e->add_option("--checkpoint", ev.checkpoint, "checkpoint directory, or a run directory (its newest checkpoint)")
      ->required()->check(CLI::ExistingDirectory);
  CLI::Option* edata = e->add_option("--data", ev.data, "prepare-data directory (dataset.json)")->check(CLI::ExistingDirectory);
  CLI::Option* etext = e->add_option("--text", ev.text, "UTF-8 text file")->check(CLI::ExistingFile);
  edata->excludes(etext);
  e->add_option("--split", ev.split, "stream of --data")->check(CLI::IsMember({"val", "train"}))->needs(edata);
  e->add_option("--tokenizer,-t", ev.tokenizer, "tokenizer of --text (default: the checkpoint's data.tokenizer)");
  e->add_option("--seq-len", ev.seq_len, "window length (default: the checkpoint's train.seq_len)")->check(llmt::positive_number());
  e->add_option("--stride", ev.stride, "window stride, <= seq-len (default: seq-len, non-overlapping); later windows score only tokens not scored before")
      ->check(llmt::positive_number());
  e->add_option("--batch", ev.batch, "windows per forward (default: the checkpoint's train.micro_batch)")->check(llmt::positive_number());
  e->add_option("--max-tokens", ev.max_tokens, "score only the first N tokens (the trainer's eval.tokens)")->check(llmt::positive_number());
  e->add_option("--backend", ev.backend, "auto, cpu or cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  e->add_option("--precision", ev.precision, "compute precision auto, fp32 or bf16 (default: the checkpoint's train.precision)")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}));
  e->add_flag("--json", ev.json, "print one JSON object");
  e->add_option("--dump-logits", ev.dump_logits,
                "also write the first window's input_ids and logits (f32 [seq_len, vocab]) to this safetensors file");

  llmt::cli::ExportArgs ex;
  CLI::App* x = app.add_subcommand("export", "write a checkpoint as a Hugging Face directory (flash-linear-attention layout)");
  x->add_option("--checkpoint", ex.checkpoint, "checkpoint directory, or a run directory (its newest checkpoint)")
      ->required()->check(CLI::ExistingDirectory);
  x->add_option("--format", ex.format, "output layout (hf: flash-linear-attention's model classes)")
      ->check(CLI::IsMember({"hf"}));
  x->add_option("--out", ex.out, "output directory (model.safetensors, config.json, llmtrain_config.json)")->required();
  x->add_option("--dtype", ex.dtype, "f32 (the master weights, default) or bf16")->check(CLI::IsMember({"f32", "bf16"}));

  llmt::cli::ImportArgs im;
  CLI::App* m = app.add_subcommand("import", "read a Hugging Face directory (flash-linear-attention layout) into a checkpoint of model weights only");
  m->add_option("--in", im.in, "HF directory with model.safetensors and config.json")->required()->check(CLI::ExistingDirectory);
  m->add_option("--config", im.config, "llmtrain config of the model (default: <in>/llmtrain_config.json, written by export)")
      ->check(CLI::ExistingFile);
  m->add_option("--out", im.out, "run directory; receives config.json and checkpoints/step_00000000")->required();

  llmt::cli::GenerateArgs gen;
  CLI::App* g = app.add_subcommand("generate", "continue a prompt with a checkpoint's model and print the text (GPU when one is visible, else CPU; --backend)");
  g->add_option("--checkpoint", gen.checkpoint, "checkpoint directory, or a run directory (its newest checkpoint)")
      ->required()->check(CLI::ExistingDirectory);
  g->add_option("--prompt", gen.prompt, "the text to continue (tokenized with the checkpoint's data.tokenizer)")
      ->required();
  g->add_option("--max-new-tokens", gen.max_new_tokens, "stop after N new tokens (default 64) or at end-of-text");
  g->add_option("--temperature", gen.temperature, "softmax temperature; 0 = greedy (default 1)");
  g->add_option("--top-k", gen.top_k, "sample among the K most likely tokens (default 0 = all)");
  g->add_option("--top-p", gen.top_p,
                "sample among the most likely tokens whose probability reaches P, in (0, 1] (default 1 = all)");
  g->add_option("--seed", gen.seed, "sampling seed: the same seed gives the same text (default 0)")
      ->check(CLI::Validator(
          [](const std::string& v) { return v.find('-') == std::string::npos ? "" : "must be a non-negative integer"; },
          "UINT"));
  g->add_option("--backend", gen.backend,
                "auto (default: cuda where a GPU is visible, else cpu), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& err) {
    // --help prints and exits 0; a usage error (unknown flag, missing file, bad value) is printed by
    // CLI11 and exits 2, the code of every other bad-input error (docs/PREEMPTION.md).
    return app.exit(err) == 0 ? 0 : 2;
  }
  if (k->parsed() && ktext->count() + kfile->count() == 0) {
    spdlog::error("tokenize: give the input with --text or --file");
    return 2;
  }
  prep.min_int_score_set = score->count() > 0;
  try {
    if (t->parsed()) return llmt::cli::train(train);
    if (i->parsed()) return llmt::cli::info(info);
    if (sweep->parsed()) {
      if (sw.grids.empty() && sw.file.empty()) {
        spdlog::error("sweep: give the points with --grid key=v1,v2,... or --points FILE.json");
        return 2;
      }
      return llmt::cli::sweep(sw);
    }
    if (p->parsed()) return llmt::cli::probe(probe);
    if (b->parsed()) return llmt::cli::bench(bench);
    if (d->parsed()) return llmt::cli::prepare_data(prep);
    if (k->parsed()) return llmt::cli::tokenize(tokz);
    if (e->parsed()) return llmt::cli::eval(ev);
    if (x->parsed()) return llmt::cli::export_model(ex);
    if (m->parsed()) return llmt::cli::import_model(im);
    if (g->parsed()) return llmt::cli::generate(gen);
  } catch (const llmt::Error& e) {
    spdlog::error("{}", e.what());
    return 2;
  } catch (const std::exception& e) {
    spdlog::error("unexpected error: {}", e.what());
    return 3;
  }
  return 1;
}
