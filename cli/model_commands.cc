#include "cli/model_commands.h"

#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/hf_gpt2.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/run_model.h"
#include "data/gpt2_tokenizer.h"
#include "data/token_dataset.h"
#include "model/generate.h"
#include "util/files.h"
#include "worker/stage_factory.h"
#include "util/status_macros.h"

namespace longhaul {
namespace {

namespace fs = std::filesystem;

struct Args {
  CLI::App *export_cmd = nullptr, *sample = nullptr, *tokenize = nullptr;
  std::string run_dir, out_dir, prompt, tokenizer;
  std::vector<std::string> files, val_files;
  int64_t shard_tokens = 100'000'000;
  int64_t step = -1;
  SampleOptions sample_opt;
  bool greedy = false;
  std::string backend = "cpu";
} g;

std::optional<int64_t> Step() { return g.step >= 0 ? std::optional<int64_t>(g.step) : std::nullopt; }

absl::Status RunExport() {
  LH_ASSIGN_OR_RETURN(const RunModel m, LoadRunModel(g.run_dir, Step()));
  LH_RETURN_IF_ERROR(ExportHfGpt2(m.model, m.params.data(), g.out_dir));
  std::cout << "exported " << g.run_dir << " at " << m.checkpoint << " (" << m.model.n_layer << " layers, d_model "
            << m.model.d_model << ", vocabulary " << m.model.vocab_size << ", "
            << (m.model.tied_head ? "tied" : "untied") << " head) to " << g.out_dir
            << "/model.safetensors and config.json: transformers.GPT2LMHeadModel.from_pretrained(\"" << g.out_dir
            << "\") loads it\n";
  if (m.model.attention == AttentionMask::kPrefixLm) {
    std::cout << "note: the model was trained with prefix-LM attention; GPT-2 attends causally everywhere, so its "
                 "prefixes read differently there\n";
  }
  return absl::OkStatus();
}

// Without a tokenizer the prompt's bytes are its tokens: the byte-level vocabulary longhaul trains
// on without one.
absl::Status RunSample() {
  LH_ASSIGN_OR_RETURN(const RunModel m, LoadRunModel(g.run_dir, Step()));
  std::optional<Gpt2Tokenizer> tokenizer;
  if (!g.tokenizer.empty()) {
    LH_ASSIGN_OR_RETURN(tokenizer, Gpt2Tokenizer::Load(g.tokenizer));
    if (tokenizer->vocab_size() > m.model.vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the tokenizer in %s has %d tokens, the model's vocabulary %d: not the tokenizer its data was made with",
          g.tokenizer, tokenizer->vocab_size(), m.model.vocab_size));
    }
  } else if (m.model.vocab_size > 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model's vocabulary has ", m.model.vocab_size,
        " tokens, not bytes: give --tokenizer DIR with the vocab.json and merges.txt its data was tokenised with"));
  }
  std::vector<int> prompt;
  if (tokenizer) {
    prompt = tokenizer->Encode(g.prompt);
  } else {
    for (unsigned char c : g.prompt) prompt.push_back(c);
  }
  if (prompt.empty()) return absl::InvalidArgumentError("an empty prompt: give at least one token");
  if (g.greedy) g.sample_opt.temperature = 0;
  StageRequest request;
  LH_ASSIGN_OR_RETURN(request.device, ParseBackend(g.backend, "--backend"));
  request.model = m.model;
  request.spec = StageSpec::Whole(m.model);
  request.T = SampleWindow(m.model, prompt.size(), g.sample_opt);
  LH_ASSIGN_OR_RETURN(const std::unique_ptr<Stage> stage, MakeStage(request));
  LH_RETURN_IF_ERROR(stage->SetParams(0, m.params.data(), m.params.size()));
  std::cout << g.prompt << std::flush;
  const absl::StatusOr<std::vector<int>> out = Generate(*stage, m.model, prompt, g.sample_opt, [&](int t) {
    if (!tokenizer) {
      std::cout << static_cast<char>(t) << std::flush;
      return;
    }
    // A token outside the tokenizer's ids (the model's vocabulary may be padded) shows as such.
    const absl::StatusOr<std::string> text = tokenizer->Decode({t});
    std::cout << (text.ok() ? *text : absl::StrCat("<", t, ">")) << std::flush;
  });
  std::cout << "\n";
  return out.status();
}

// Each file is one document, its tokens after <|endoftext|> where the vocabulary has it (as
// llm.c's data scripts do), written into shards of at most --shard-tokens tokens.
absl::Status RunTokenize() {
  LH_ASSIGN_OR_RETURN(const Gpt2Tokenizer t, Gpt2Tokenizer::Load(g.tokenizer));
  if (t.vocab_size() > 65536) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the tokenizer has %d tokens; llm.c shards hold 16-bit tokens (at most 65536)", t.vocab_size()));
  }
  std::error_code ec;
  // Shards of an earlier run would join this one's under the printed glob.
  for (const fs::directory_entry& e : fs::directory_iterator(g.out_dir, ec)) {
    const std::string name = e.path().filename().string();
    if ((absl::StartsWith(name, "train_") || absl::StartsWith(name, "val_")) && absl::EndsWith(name, ".bin")) {
      return absl::InvalidArgumentError(absl::StrCat(
          g.out_dir, " already holds token shards (", name, "): name an empty directory, or remove them first"));
    }
  }
  fs::create_directories(g.out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", g.out_dir, ": ", ec.message()));
  auto write_split = [&](const std::string& split, const std::vector<std::string>& files) -> absl::StatusOr<int64_t> {
    std::vector<uint16_t> shard;
    int index = 0;
    int64_t total = 0;
    auto flush = [&]() -> absl::Status {
      const std::string path = (fs::path(g.out_dir) / absl::StrFormat("%s_%06d.bin", split, index++)).string();
      LH_RETURN_IF_ERROR(WriteLlmcShard(path, shard));
      std::cout << "tokenize: wrote " << path << " (" << shard.size() << " tokens)\n";
      shard.clear();
      return absl::OkStatus();
    };
    for (const std::string& file : files) {
      LH_ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(file));
      std::vector<int> ids = t.Encode(text);
      if (t.end_of_text()) ids.insert(ids.begin(), *t.end_of_text());
      std::cout << "tokenize: " << file << ": " << text.size() << " bytes, " << ids.size() << " tokens\n" << std::flush;
      total += static_cast<int64_t>(ids.size());
      for (int id : ids) {
        shard.push_back(static_cast<uint16_t>(id));
        if (static_cast<int64_t>(shard.size()) == g.shard_tokens) LH_RETURN_IF_ERROR(flush());
      }
    }
    if (!shard.empty()) LH_RETURN_IF_ERROR(flush());
    return total;
  };
  LH_ASSIGN_OR_RETURN(const int64_t train, write_split("train", g.files));
  std::string val_path;
  if (!g.val_files.empty()) {
    LH_RETURN_IF_ERROR(write_split("val", g.val_files).status());
    val_path = absl::StrCat("--set data.val_path=", (fs::path(g.out_dir) / "val_*.bin").string(), " ");
  }
  std::cout << "tokenize: " << train << " training tokens. Train on them with --set data.source=llmc --set data.path="
            << (fs::path(g.out_dir) / "train_*.bin").string() << " " << val_path
            << "--set model.vocab_size=" << t.vocab_size() << "\n";
  return absl::OkStatus();
}

}  // namespace

void AddModelCommands(CLI::App& app) {
  // Which checkpoint of which run: export's and sample's.
  auto add_checkpoint = [](CLI::App* cmd) {
    cmd->add_option("run_dir", g.run_dir, "the run's directory (train.out_dir)")->required();
    cmd->add_option("--step", g.step, "the checkpoint of this step (default: the newest complete one)")
        ->check(CLI::NonNegativeNumber);
  };
  g.export_cmd = app.add_subcommand(
      "export", "write a run's checkpoint (any layout) as a Hugging Face GPT-2 directory: model.safetensors, config.json");
  add_checkpoint(g.export_cmd);
  g.export_cmd->add_option("--out", g.out_dir, "the directory to write")->required();

  g.sample = app.add_subcommand("sample", "generate text from a run's checkpoint, on the CPU or a GPU");
  add_checkpoint(g.sample);
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
  g.sample->add_option("--backend", g.backend, "\"cpu\" or \"cuda:N\"")->capture_default_str();
  g.sample->add_option("--tokenizer", g.tokenizer,
                       "the directory with the vocab.json and merges.txt the model's data was tokenised with (default: "
                       "the prompt's bytes are its tokens)");

  g.tokenize = app.add_subcommand(
      "tokenize", "text files into llm.c token shards with GPT-2's tokenizer (data.source = \"llmc\")");
  g.tokenize->add_option("files", g.files, "text files, each one document")->required()->check(CLI::ExistingFile);
  g.tokenize->add_option("--tokenizer", g.tokenizer, "the directory with vocab.json and merges.txt (e.g. gpt2's)")
      ->required();
  g.tokenize->add_option("--out", g.out_dir, "the directory for train_NNNNNN.bin (and val_NNNNNN.bin)")->required();
  g.tokenize->add_option("--val", g.val_files, "text files for the validation shards")->check(CLI::ExistingFile);
  g.tokenize->add_option("--shard-tokens", g.shard_tokens, "tokens per shard at most")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
}

bool ModelCommandParsed() { return g.export_cmd->parsed() || g.sample->parsed() || g.tokenize->parsed(); }

absl::Status RunModelCommand() {
  if (g.export_cmd->parsed()) return RunExport();
  if (g.sample->parsed()) return RunSample();
  return RunTokenize();
}

}  // namespace longhaul
