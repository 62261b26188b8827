#pragma once
// Models in and out of longhaul: `longhaul export` (a run's checkpoint, any layout, as a Hugging
// Face GPT-2 directory), `longhaul sample` (text from a run's checkpoint) and `longhaul tokenize`
// (text files into llm.c token shards with the GPT-2 tokenizer).
#include <CLI/CLI.hpp>

namespace longhaul {

// Adds the subcommands to `app`; RunModelCommand runs whichever was parsed.
void AddModelCommands(CLI::App& app);
// Returns the exit status (2 for bad input), or -1 when none of them was parsed.
int RunModelCommand();

}  // namespace longhaul
