#include "cli/model_commands.h"

#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/hf_gpt2.h"
#include "checkpoint/run_model.h"
#include "model/generate.h"

namespace longhaul {
namespace {

struct Args {
  CLI::App *export_cmd = nullptr, *sample = nullptr;
  std::string run_dir, out_dir, prompt;
  int64_t step = -1;
  SampleOptions sample_opt;
  bool greedy = false;
} g;

int Error(const absl::Status& s) {
  std::cerr << "longhaul: error: " << s.message() << "\n";
  return s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kNotFound ? 2 : 1;
}

std::optional<int64_t> Step() { return g.step >= 0 ? std::optional<int64_t>(g.step) : std::nullopt; }

int RunExport() {
  absl::StatusOr<RunModel> m = LoadRunModel(g.run_dir, Step());
  if (!m.ok()) return Error(m.status());
  if (absl::Status s = ExportHfGpt2(m->model, m->params.data(), g.out_dir); !s.ok()) return Error(s);
  std::cout << "exported " << g.run_dir << " at " << m->checkpoint << " (" << m->model.n_layer << " layers, d_model "
            << m->model.d_model << ", vocabulary " << m->model.vocab_size << ", "
            << (m->model.tied_head ? "tied" : "untied") << " head) to " << g.out_dir
            << "/model.safetensors and config.json: transformers.GPT2LMHeadModel.from_pretrained(\"" << g.out_dir
            << "\") loads it\n";
  if (m->model.attention == AttentionMask::kPrefixLm) {
    std::cout << "note: the model was trained with prefix-LM attention; GPT-2 attends causally everywhere, so its "
                 "prefixes read differently there\n";
  }
  return 0;
}

// The prompt's bytes are its tokens: the byte-level vocabulary longhaul trains on without a
// tokenizer.
int RunSample() {
  absl::StatusOr<RunModel> m = LoadRunModel(g.run_dir, Step());
  if (!m.ok()) return Error(m.status());
  if (m->model.vocab_size > 256) {
    return Error(absl::InvalidArgumentError(absl::StrCat(
        "the model's vocabulary has ", m->model.vocab_size,
        " tokens, not bytes: give --tokenizer DIR with the vocab.json and merges.txt its data was tokenised with")));
  }
  std::vector<int> prompt;
  for (unsigned char c : g.prompt) prompt.push_back(c);
  if (g.greedy) g.sample_opt.temperature = 0;
  std::cout << g.prompt << std::flush;
  const absl::StatusOr<std::vector<int>> out = Generate(m->model, m->params.data(), prompt, g.sample_opt, [](int t) {
    std::cout << static_cast<char>(t) << std::flush;
  });
  std::cout << "\n";
  return out.ok() ? 0 : Error(out.status());
}

}  // namespace

void AddModelCommands(CLI::App& app) {
  g.export_cmd = app.add_subcommand(
      "export", "write a run's checkpoint (any layout) as a Hugging Face GPT-2 directory: model.safetensors, config.json");
  g.export_cmd->add_option("run_dir", g.run_dir, "the run's directory (train.out_dir)")->required();
  g.export_cmd->add_option("--out", g.out_dir, "the directory to write")->required();
  g.export_cmd->add_option("--step", g.step, "the checkpoint of this step (default: the newest complete one)");

  g.sample = app.add_subcommand("sample", "generate text from a run's checkpoint, on the CPU");
  g.sample->add_option("run_dir", g.run_dir, "the run's directory (train.out_dir)")->required();
  g.sample->add_option("--prompt", g.prompt, "the text to continue")->required();
  g.sample->add_option("--tokens", g.sample_opt.max_new_tokens, "tokens to generate")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  g.sample->add_option("--temperature", g.sample_opt.temperature, "below 1 sharpens the distribution, above 1 flattens it")
      ->check(CLI::Range(0.0f, 100.0f))
      ->capture_default_str();
  g.sample->add_option("--top-k", g.sample_opt.top_k, "draw among the k most likely tokens only (0: all)")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  g.sample->add_flag("--greedy", g.greedy, "always the most likely token (temperature 0)");
  g.sample->add_option("--seed", g.sample_opt.seed, "the draws' seed")->capture_default_str();
  g.sample->add_option("--step", g.step, "the checkpoint of this step (default: the newest complete one)");
}

int RunModelCommand() {
  if (g.export_cmd->parsed()) return RunExport();
  if (g.sample->parsed()) return RunSample();
  return -1;
}

}  // namespace longhaul
