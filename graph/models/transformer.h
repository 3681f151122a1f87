// transformer: a GPT-2-style decoder-only language model (Radford et al.,
// "Language models are unsupervised multitask learners", 2019), trained one
// step with the next-token cross-entropy.
//
// Parameter ids mirror the state_dict() keys of Hugging Face's
// transformers.GPT2Model (wte.weight, wpe.weight, h.<i>.ln_1.weight,
// h.<i>.attn.c_attn.weight, h.<i>.attn.c_proj.*, h.<i>.ln_2.*,
// h.<i>.mlp.c_fc.*, h.<i>.mlp.c_proj.*, ln_f.*). One difference in layout:
// c_attn, c_proj and c_fc are stored (out, in) as nn.Linear (nanoGPT's
// layout), the transpose of HF's Conv1D (in, out); transpose them to
// exchange tensors with HF. The LM head is tied to wte.weight as in GPT-2
// (GPT2LMHeadModel), so there is no lm_head.weight; `tied=0` makes an
// untied `lm_head.weight` (vocab, dim) without bias.
//
// Block (pre-LN, as GPT-2):
//   x = x + c_proj(attention(ln_1(x)))   c_attn: one linear to 3 dim (q, k, v)
//   x = x + mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(x))))   c_fc: 4 dim
// Attention is causal, `heads` heads of dim / heads, composed as Note
// [Attention] in graph/ops/linalg.cc describes. Embeddings: wte(input) +
// wpe(position_ids), position_ids = arange(seq) (wpe has `seq` rows: GPT-2's
// n_positions is taken equal to seq). No dropout (nanoGPT's default 0.0).
// Loss: mean cross-entropy of the logits (batch, seq, vocab) against
// `target` (batch, seq) i64, the next tokens (already shifted).
// Data: `input` (batch, seq) i64 token ids, `target`; everything else fp32.
//
// Parameters: vocab dim + seq dim + layers (12 dim^2 + 13 dim) + 2 dim
// (tied). Defaults (layers=2, seq=128, dim=256, heads=4, batch=2,
// vocab=1000): 1,868,800 parameters, small enough to plan in a moment;
// GPT-2 small (layers=12, seq=1024, dim=768, heads=12, vocab=50257):
// 124,439,808.
#ifndef PEBBLE_GRAPH_MODELS_TRANSFORMER_H_
#define PEBBLE_GRAPH_MODELS_TRANSFORMER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/models/models.h"
#include "graph/net_builder.h"

namespace pebble {

// The parameters, their defaults and meanings: layers, seq, dim, heads,
// batch, vocab, tied.
const std::vector<ModelParam>& TransformerParams();

// The training graph (forward + autodiff, loss "loss"). `params` holds any
// subset of TransformerParams(); the others take their defaults. An unknown
// name, a value out of range or dim not divisible by heads is
// InvalidArgument naming it.
absl::StatusOr<Graph> BuildTransformer(
    const std::map<std::string, int64_t>& params, CostModel cost = {},
    std::string graph_name = "transformer");

// The forward graph alone (outputs: the loss).
absl::StatusOr<Graph> BuildTransformerForward(
    const std::map<std::string, int64_t>& params, CostModel cost = {},
    std::string graph_name = "transformer");

}  // namespace pebble

#endif  // PEBBLE_GRAPH_MODELS_TRANSFORMER_H_
