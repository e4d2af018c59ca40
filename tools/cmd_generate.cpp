// llmtrain generate: continue a prompt with a checkpoint's model (incremental decoding, Model::decode;
// sampling, model/sampler.h) and print the text.
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/backend.h"
#include "model/config.h"
#include "model/model.h"
#include "model/sampler.h"
#include "tools/commands.h"
#include "train/checkpoint.h"
#ifdef LLMT_HAVE_PCRE2
#include "data/tokenizer.h"
#endif

namespace llmt::cli {

int generate(const GenerateArgs& args) {
  // stdout carries the generated text only; warnings and errors go to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("generate"));
  const SamplingOptions sampling{args.temperature, args.top_k, args.top_p};
  check_sampling(sampling);
  check(args.max_new_tokens >= 0, "--max-new-tokens must be >= 0, got {}", args.max_new_tokens);
  const std::string dir = resolve_checkpoint(args.checkpoint);
  const Config config = parse_config(checkpoint_config(dir));
  check(config.data.source == "tokens",
        "generate: {} was trained on the synthetic task data.source = {}, whose tokens are task symbols, not the "
        "text of a tokenizer (docs/SYNTHETIC.md); generate continues text, for models trained on text",
        dir, config.data.source);
  if (args.temperature == 0 && (args.top_k > 0 || args.top_p < 1))
    spdlog::warn("generate: --temperature 0 is greedy decoding; --top-k and --top-p have no effect");
#ifndef LLMT_HAVE_PCRE2
  throw Error(fmt::format("generate: the checkpoint's tokenizer {} needs PCRE2, but llmtrain was built without it; "
                          "install libpcre2-dev and rebuild", config.data.tokenizer));
#else
  const auto tokenizer = load_tokenizer(config.data.tokenizer);
  std::vector<int32_t> ids = tokenizer->encode(args.prompt);
  check(!ids.empty(), "generate: --prompt gives no tokens (an empty prompt); give some text to continue");

  // "auto" is the GPU where one is visible (tests/cuda_decode_test.cpp checks its decode ops against the
  // CPU), else the CPU; cuda computes in train.precision's dtype, the CPU in fp32 whatever the checkpoint
  // was trained in (its bf16 is GPU-only).
  const auto backend = make_backend(args.backend);
  const DType compute =
      backend->name() == "cpu" ? DType::f32 : compute_dtype_for(config.train.precision, *backend);
  Model model(config.model);
  model.allocate(*backend, DType::f32, compute);
  load_weights(dir, model.params());

  // Sample only ids the tokenizer can print (the model's vocabulary may be padded beyond it).
  const int64_t vocab = std::min<int64_t>(config.model.vocab_size, tokenizer->vocab_size());
  const int64_t n_prompt = static_cast<int64_t>(ids.size());
  if (n_prompt + args.max_new_tokens > config.train.seq_len)
    spdlog::warn("generate: the prompt's {} tokens plus up to {} new ones go past the {} tokens (train.seq_len) the "
                 "model was trained on; quality usually drops beyond them", n_prompt, args.max_new_tokens,
                 config.train.seq_len);
  DecodeState state = model.start_decode(1, n_prompt + std::max<int64_t>(args.max_new_tokens, 1));
  std::vector<double> logits(static_cast<size_t>(config.model.vocab_size));
  model.prefill(ids.data(), n_prompt, state, logits.data());
  Philox rng(args.seed, 0x67656e);  // stream "gen"
  // The text is printed as it grows: after each token, the part of decode(ids) not yet printed, up to the last
  // complete UTF-8 character (byte-level BPE tokens may split one) and without a trailing U+FFFD (a SentencePiece
  // byte-fallback character still incomplete). Decoding the ids as a whole each time keeps the output identical
  // to decoding them once at the end.
  std::string printed;
  const auto print_new = [&](bool final) {
    const std::string text = tokenizer->decode(ids);
    size_t upto = final ? text.size() : complete_utf8_prefix(text);
    static constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD in UTF-8
    while (!final && upto >= 3 && text.compare(upto - 3, 3, kReplacement) == 0) upto -= 3;
    size_t same = 0;  // decode(ids) extends what was printed (checked, not assumed)
    while (same < printed.size() && same < text.size() && printed[same] == text[same]) ++same;
    if (same < printed.size() && !final) return;  // wait: the end repairs what it can
    if (upto > same) std::fwrite(text.data() + same, 1, upto - same, stdout);
    std::fflush(stdout);
    printed.assign(text, 0, std::max(upto, same));
  };
  print_new(false);
  for (int64_t i = 0; i < args.max_new_tokens; ++i) {
    if (i > 0) model.decode(&ids.back(), state, logits.data());
    const int32_t next = sample_token(logits.data(), vocab, sampling, rng);
    if (next == tokenizer->eos_id()) break;
    ids.push_back(next);
    print_new(false);
  }
  print_new(true);
  std::fputs("\n", stdout);
  return 0;
#endif
}

}  // namespace llmt::cli
