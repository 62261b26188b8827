#pragma once
// Models in and out of longhaul: `longhaul export` (a run's checkpoint, any layout, as a Hugging
// Face GPT-2 directory), `longhaul sample` (text from a run's checkpoint) and `longhaul tokenize`
// (text files into llm.c token shards with the GPT-2 tokenizer).
#include <CLI/CLI.hpp>

#include "absl/status/status.h"

namespace longhaul {

// Adds the subcommands to `app`; RunModelCommand runs whichever was parsed.
void AddModelCommands(CLI::App& app);
bool ModelCommandParsed();
absl::Status RunModelCommand();

}  // namespace longhaul
