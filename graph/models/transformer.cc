// The GPT-2-style transformer of graph/models/transformer.h.
#include "graph/models/transformer.h"

#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "graph/autodiff.h"
#include "graph/status.h"

namespace pebble {
namespace {

struct Limits {
  const char* name;
  int64_t min;
  int64_t max;
};

// Ranges keep every byte count far from int64 overflow.
constexpr Limits kLimits[] = {
    {"layers", 1, 1000},      {"seq", 1, 1 << 20},   {"dim", 1, 1 << 16},
    {"heads", 1, 1 << 12},    {"batch", 1, 4096},    {"vocab", 1, 1 << 24},
    {"tied", 0, 1},
};

struct Config {
  int64_t layers, seq, dim, heads, batch, vocab;
  bool tied;
};

absl::StatusOr<Config> ParseConfig(
    const std::map<std::string, int64_t>& params) {
  std::map<std::string, int64_t> values;
  for (const ModelParam& p : TransformerParams()) {
    int64_t v = 0;
    PEBBLE_CHECK(absl::SimpleAtoi(p.default_value, &v), "bad default");
    values[p.name] = v;
  }
  for (const auto& [name, value] : params) {
    if (!values.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model 'transformer': unknown parameter '", name,
          "' (known: layers, seq, dim, heads, batch, vocab, tied)"));
    }
    values[name] = value;
  }
  for (const Limits& l : kLimits) {
    const int64_t v = values[l.name];
    if (v < l.min || v > l.max) {
      return absl::InvalidArgumentError(
          absl::StrCat("model 'transformer': parameter '", l.name, "' = ", v,
                       " is out of range [", l.min, ", ", l.max, "]"));
    }
  }
  Config c{values["layers"], values["seq"],   values["dim"],
           values["heads"],  values["batch"], values["vocab"],
           values["tied"] != 0};
  if (c.dim % c.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model 'transformer': dim ", c.dim, " is not divisible by heads ",
        c.heads));
  }
  return c;
}

// One pre-LN block "h.<i>" on the residual stream x.
Value Block(NetBuilder& nb, const Config& c, int i, Value x) {
  const std::string p = absl::StrCat("h.", i, ".");
  const nlohmann::json none = nlohmann::json::object();
  // Attention.
  Value a = nb.LayerNorm(p + "ln_1", x);
  const Value qkv = nb.Linear(p + "attn.c_attn", a, 3 * c.dim);
  Value qkv_parts[3];
  const char* names[3] = {"q", "k", "v"};
  for (int j = 0; j < 3; ++j) {
    qkv_parts[j] = nb.Apply("split_heads", {qkv},
                            {{"heads", c.heads}, {"chunks", 3}, {"index", j}},
                            p + "attn." + names[j]);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.dim / c.heads));
  const Value scores =
      nb.Apply("matmul", {qkv_parts[0], qkv_parts[1]},
               {{"transpose_b", true}, {"scale", scale}}, p + "attn.scores");
  const Value probs =
      nb.Apply("softmax", {scores}, {{"causal", true}}, p + "attn.probs");
  const Value context =
      nb.Apply("matmul", {probs, qkv_parts[2]}, none, p + "attn.context");
  const Value merged =
      nb.Apply("merge_heads", {context}, none, p + "attn.merge");
  a = nb.Linear(p + "attn.c_proj", merged, c.dim);
  x = nb.Apply("add", {x, a}, none, p + "residual_1");
  // MLP.
  Value m = nb.LayerNorm(p + "ln_2", x);
  m = nb.Linear(p + "mlp.c_fc", m, 4 * c.dim);
  m = nb.Apply("gelu", {m}, {{"approximate", "tanh"}}, p + "mlp.act");
  m = nb.Linear(p + "mlp.c_proj", m, c.dim);
  return nb.Apply("add", {x, m}, none, p + "residual_2");
}

absl::StatusOr<Graph> BuildForward(const Config& c, CostModel cost,
                                   std::string graph_name) {
  const nlohmann::json none = nlohmann::json::object();
  NetBuilder nb(std::move(graph_name), cost);
  const Value input = nb.Input("input", {c.batch, c.seq}, DType::kInt64);
  const Value target = nb.Input("target", {c.batch, c.seq}, DType::kInt64);
  const Value tokens = nb.Embedding("wte", input, c.vocab, c.dim);
  const Value positions =
      nb.Apply("arange", {}, {{"n", c.seq}}, "position_ids");
  const Value pos = nb.Embedding("wpe", positions, c.seq, c.dim);
  // (batch, seq, dim) + (seq, dim), broadcast over the batch.
  Value x = nb.Apply("add", {tokens, pos}, none, "embed");
  for (int i = 0; i < c.layers; ++i) x = Block(nb, c, i, x);
  x = nb.LayerNorm("ln_f", x);
  const Value logits =
      c.tied ? nb.Apply("linear", {x, nb.Find("wte.weight")}, none, "lm_head")
             : nb.Linear("lm_head", x, c.vocab, /*bias=*/false);
  const Value loss = nb.Apply("softmax_cross_entropy", {logits, target},
                              {{"axis", -1}}, "loss");
  nb.MarkOutput(loss);
  return nb.Build();
}

}  // namespace

const std::vector<ModelParam>& TransformerParams() {
  static const auto* const params = new std::vector<ModelParam>{
      {"layers", "2", "transformer blocks"},
      {"seq", "128", "sequence length (tokens; also the wpe rows)"},
      {"dim", "256", "model width (embedding dim)"},
      {"heads", "4", "attention heads (must divide dim)"},
      {"batch", "2", "sequences per batch"},
      {"vocab", "1000", "vocabulary size"},
      {"tied", "1", "1: LM head tied to wte.weight (GPT-2); 0: own "
                    "lm_head.weight"},
  };
  return *params;
}

absl::StatusOr<Graph> BuildTransformerForward(
    const std::map<std::string, int64_t>& params, CostModel cost,
    std::string graph_name) {
  ASSIGN_OR_RETURN(const Config c, ParseConfig(params));
  return BuildForward(c, cost, std::move(graph_name));
}

absl::StatusOr<Graph> BuildTransformer(
    const std::map<std::string, int64_t>& params, CostModel cost,
    std::string graph_name) {
  ASSIGN_OR_RETURN(const Config c, ParseConfig(params));
  ASSIGN_OR_RETURN(Graph forward, BuildForward(c, cost, std::move(graph_name)));
  return BuildTrainingGraph(forward, "loss", cost);
}

}  // namespace pebble
