#pragma once
// The model and built-in corpus the multi-process tests train: small enough that four workers
// and a coordinator run hundreds of steps a second on two cores.

namespace longhaul::testing {

inline constexpr char kTinyModelToml[] = R"(
[model]
n_layer = 4
d_model = 32
n_head = 2
max_seq_len = 16
[data]
alphabet = 12
train_tokens = 100000
val_tokens = 1000
)";

}  // namespace longhaul::testing
