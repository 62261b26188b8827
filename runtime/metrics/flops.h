#pragma once
// Performance accounting, as ../shared/DESIGN.md defines it.
#include <cstdint>
#include <string>

#include "model/model_config.h"

namespace longhaul {

// Model FLOPs of one iteration over `sequences` sequences of length s (Megatron, no recompute):
//   72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h));  with full activation recompute: 96 and V/(16·l·h).
double ModelFlopsPerIteration(const ModelConfig& cfg, int64_t sequences, int seq_len, bool recompute);

// The formula's parts, for a cost model that prices stages block by block. One block:
// 72·B·s·h²·(1 + s/6h), 96·... with recompute; forward is 1/3 of it (1/4 with recompute, where the
// backward reruns the forward).
double BlockFlops(const ModelConfig& cfg, int64_t sequences, int seq_len, bool recompute);
// The LM head: 72·B·s·l·h²·V/(12·l·h) = 6·B·s·h·V, the same with recompute (96·V/16 = 72·V/12: the
// head is never recomputed); forward is 1/3 of it.
double HeadFlops(const ModelConfig& cfg, int64_t sequences, int seq_len);

// The formula's text, to print beside any figure computed from it.
const char* FlopsFormulaName(bool recompute);

// Days to train on 100B tokens at this rate.
double DaysFor100BTokens(double tokens_per_second);

// "1h02m03s" style.
std::string FormatDuration(double seconds);

}  // namespace longhaul
