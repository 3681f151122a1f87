#include "graph/autodiff.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/ops.h"
#include "graph/status.h"
#include "graph/text_input.h"

namespace pebble {
namespace {

constexpr int kUnclaimed = -1;

const nlohmann::json& EmptyObject() {
  static const nlohmann::json* const j =
      new nlohmann::json(nlohmann::json::object());
  return *j;
}

bool IsFloatDType(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16;
}

// Per-forward-tensor gradient bookkeeping (Note [Gradient names]).
struct GradAccumulator {
  struct Part {
    int part;
    int num_parts;
    Value grad;
    std::string merge_op;
    std::string scatter_op;
  };
  std::vector<Value> contributions;  // in arrival order
  std::vector<bool> owned;           // made for this tensor alone
  std::vector<Value> sums;           // sums[j]: contributions 0..j+1 summed
  Value total;                       // the running sum
  std::vector<Part> parts;           // waiting for Finalize
  bool finalized = false;
};

}  // namespace

struct BackwardContext::State {
  const Graph* forward = nullptr;
  NetBuilder* nb = nullptr;
  NodeId node = kNoNode;  // the forward node being differentiated
  NodeId loss = kNoNode;
  std::vector<bool> leads_to_param;     // per forward node
  std::vector<GradAccumulator> grads;   // per forward node
  // Per builder value: the forward tensor whose gradient it was made for.
  std::vector<int> claimed;
  int first_backward = 0;  // builder index of the first emitted node

  int& Claimed(Value v) {
    if (static_cast<int>(claimed.size()) < nb->num_values()) {
      claimed.resize(nb->num_values(), kUnclaimed);
    }
    return claimed[v.index];
  }

  void Rename(Value v, std::string id) {
    absl::Status s = nb->Rename(v, id);
    if (!s.ok()) {
      nb->Fail(absl::InvalidArgumentError(absl::StrCat(
          "gradient name '", id, "' is taken by another node: ", s.message())));
    }
  }

  Value Emit(absl::string_view op, std::vector<Value> inputs,
             nlohmann::json attrs, std::string id_hint) {
    if (!id_hint.empty() && nb->Find(id_hint).valid()) id_hint.clear();
    return nb->Apply(op, std::move(inputs), std::move(attrs),
                     std::move(id_hint), Role::kBackward);
  }

  // Adds `grad` to the gradient of forward tensor t, summing as it arrives.
  void Contribute(NodeId t, Value grad) {
    if (!grad.valid()) return;  // an error is recorded
    GradAccumulator& acc = grads[t];
    PEBBLE_CHECK(!acc.finalized, "gradient contribution after finalization");
    const TensorType& want = nb->type(Value{t});
    const TensorType& got = nb->type(grad);
    if (want.shape != got.shape || want.dtype != got.dtype) {
      nb->Fail(absl::InternalError(absl::StrCat(
          "node '", forward->id(node), "' (op ", forward->op(node),
          "): the backward rule gives '", forward->id(t), "' ",
          ShapeToString(want.shape), " ", DTypeName(want.dtype),
          " a gradient ", ShapeToString(got.shape), " ", DTypeName(got.dtype))));
      return;
    }
    int& claim = Claimed(grad);
    const bool owned = grad.index >= first_backward && claim == kUnclaimed;
    if (owned) claim = t;
    acc.contributions.push_back(grad);
    acc.owned.push_back(owned);
    if (!acc.total.valid()) {
      acc.total = grad;
      return;
    }
    const Value sum = Emit("add", {acc.total, grad}, nlohmann::json::object(),
                           "");
    if (!sum.valid()) return;
    Claimed(sum) = t;
    acc.sums.push_back(sum);
    acc.total = sum;
  }

  // Completes the gradient of forward tensor t (every reader of t has been
  // differentiated): merges parts, names the nodes, makes "grad:p" of a
  // parameter exist. Returns the gradient, or invalid when there is none.
  Value Finalize(NodeId t) {
    GradAccumulator& acc = grads[t];
    // Parts: each full set of one kind becomes a merge, the rest scatter.
    std::vector<GradAccumulator::Part> parts = std::move(acc.parts);
    acc.parts.clear();
    std::vector<bool> used(parts.size(), false);
    for (size_t first = 0; first < parts.size(); ++first) {
      if (used[first]) continue;
      const GradAccumulator::Part& kind = parts[first];
      while (true) {
        std::vector<int> pick(kind.num_parts, -1);
        int found = 0;
        for (size_t j = first; j < parts.size(); ++j) {
          const GradAccumulator::Part& p = parts[j];
          if (used[j] || p.num_parts != kind.num_parts ||
              p.merge_op != kind.merge_op || p.scatter_op != kind.scatter_op ||
              pick[p.part] >= 0) {
            continue;
          }
          pick[p.part] = static_cast<int>(j);
          ++found;
        }
        if (found != kind.num_parts) break;
        std::vector<Value> reads;
        for (int j : pick) {
          used[j] = true;
          reads.push_back(parts[j].grad);
        }
        Contribute(t, Emit(kind.merge_op, std::move(reads),
                           nlohmann::json::object(), ""));
      }
    }
    for (size_t j = 0; j < parts.size(); ++j) {
      if (used[j]) continue;
      const GradAccumulator::Part& p = parts[j];
      Contribute(t, Emit(p.scatter_op, {p.grad},
                         {{"chunks", p.num_parts}, {"index", p.part}}, ""));
    }
    acc.finalized = true;
    if (!nb->status().ok() || !acc.total.valid()) return Value{};

    const std::string name = absl::StrCat("grad:", forward->id(t));
    const size_t k = acc.contributions.size();
    if (k == 1) {
      if (acc.owned[0]) Rename(acc.total, name);
    } else {
      for (size_t j = 0; j < k; ++j) {
        if (acc.owned[j]) {
          Rename(acc.contributions[j], absl::StrCat(name, "#", j + 1));
        }
      }
      for (size_t j = 0; j < acc.sums.size(); ++j) {
        Rename(acc.sums[j], j + 1 == acc.sums.size()
                                ? name
                                : absl::StrCat(name, "#sum", j + 2));
      }
    }
    const bool has_own_node = k > 1 || acc.owned[0];
    if (forward->role(t) == Role::kParameter && !has_own_node) {
      // An alias: the output "grad:p" must be a node of its own.
      const Value copy = Emit("copy", {acc.total}, nlohmann::json::object(),
                              "");
      if (!copy.valid()) return Value{};
      Claimed(copy) = t;
      Rename(copy, name);
      acc.total = copy;
    }
    int& claim = Claimed(acc.total);
    if (claim == kUnclaimed) claim = t;
    return acc.total;
  }
};

NodeId BackwardContext::node() const { return state_->node; }
const Graph& BackwardContext::forward() const { return *state_->forward; }

const nlohmann::json& BackwardContext::attrs() const {
  const nlohmann::json& a = state_->forward->attrs(state_->node);
  return a.is_object() ? a : EmptyObject();
}

Value BackwardContext::input(int i) const {
  absl::Span<const NodeId> in = state_->forward->inputs(state_->node);
  PEBBLE_CHECK(i >= 0 && i < static_cast<int>(in.size()),
               "BackwardContext::input out of range");
  return Value{in[i]};
}

Value BackwardContext::output() const { return Value{state_->node}; }

bool BackwardContext::has_grad_output() const {
  return state_->node != state_->loss;
}

Value BackwardContext::grad_output() const {
  State& s = *state_;
  GradAccumulator& acc = s.grads[s.node];
  if (s.node == s.loss && !acc.total.valid()) {
    // An operator that is not a loss used as the loss: make the seed.
    const TensorType& t = s.nb->type(output());
    const Value seed =
        s.Emit("fill", {},
               {{"shape", t.shape}, {"dtype", DTypeName(t.dtype)}, {"value", 1}},
               absl::StrCat("grad:", s.forward->id(s.node)));
    if (seed.valid()) {
      s.Claimed(seed) = s.node;
      acc.total = seed;
    }
  }
  return acc.total;
}

bool BackwardContext::needs_grad(int i) const {
  const Value in = input(i);
  return state_->leads_to_param[in.index] &&
         IsFloatDType(state_->nb->type(in).dtype);
}

const TensorType& BackwardContext::input_type(int i) const {
  return state_->nb->type(input(i));
}

const TensorType& BackwardContext::output_type() const {
  return state_->nb->type(output());
}

int BackwardContext::num_inputs() const {
  return static_cast<int>(state_->forward->inputs(state_->node).size());
}

Value BackwardContext::Emit(absl::string_view op, std::vector<Value> inputs,
                            nlohmann::json attrs, std::string id_hint) {
  return state_->Emit(op, std::move(inputs), std::move(attrs),
                      std::move(id_hint));
}

// Note [Gradients of views]. A forward alias (a view: reshape, flatten)
// is differentiated like the op it views with, but its gradient is itself
// an alias of the incoming gradient when the rule says so (ReshapeBackward:
// the gradient of a reshape is the incoming gradient reshaped back, the
// same bytes in the same order). So a view costs no memory in the backward
// pass either, and the gradient of a viewed parameter may be an alias of
// the gradient of its view: "grad:p" is then a view, still an output.
// Other backward rules of a view emit ordinary nodes.
Value BackwardContext::EmitView(absl::string_view op, Value base, nlohmann::json attrs) {
  const Value v = state_->Emit(op, {base}, std::move(attrs), "");
  if (v.valid()) state_->nb->SetAliasOf(v, base);
  return v;
}

bool BackwardContext::is_view() const {
  return state_->forward->is_alias(state_->node);
}

void BackwardContext::AccumulateGrad(int i, Value grad) {
  state_->Contribute(input(i).index, grad);
}

void BackwardContext::AccumulateGradPart(int i, int part, int num_parts,
                                         Value grad,
                                         absl::string_view merge_op,
                                         absl::string_view scatter_op) {
  if (!grad.valid()) return;
  PEBBLE_CHECK(num_parts >= 1 && part >= 0 && part < num_parts,
               "AccumulateGradPart: part out of range");
  state_->grads[input(i).index].parts.push_back(
      {part, num_parts, grad, std::string(merge_op), std::string(scatter_op)});
}

absl::StatusOr<Graph> BuildTrainingGraph(const Graph& forward,
                                         absl::string_view loss_id,
                                         CostModel cost_model) {
  const NodeId loss = forward.Find(loss_id);
  if (loss == kNoNode) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss node '", loss_id, "' is not in the graph"));
  }
  if (!forward.shape(loss).has_value() || !forward.shape(loss)->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss node '", loss_id, "' must be a scalar (shape ()), has ",
        forward.shape(loss).has_value() ? ShapeToString(*forward.shape(loss))
                                        : std::string("no shape")));
  }

  NetBuilder nb = NetBuilder::FromGraph(forward, cost_model);
  nb.ClearOutputs();
  BackwardContext::State state;
  state.forward = &forward;
  state.nb = &nb;
  state.loss = loss;
  state.first_backward = nb.num_values();
  state.grads.resize(forward.num_nodes());
  state.leads_to_param.assign(forward.num_nodes(), false);
  for (NodeId v : forward.topological_order()) {
    bool leads = forward.role(v) == Role::kParameter;
    for (NodeId u : forward.unique_inputs(v)) {
      leads = leads || state.leads_to_param[u];
    }
    state.leads_to_param[v] = leads;
  }

  BackwardContext ctx(&state);
  // Differentiates node v (its gradient is complete).
  auto differentiate = [&](NodeId v) -> absl::Status {
    state.node = v;
    const Value grad = state.Finalize(v);
    if (!nb.status().ok()) return nb.status();
    if (forward.persistent(v)) return absl::OkStatus();
    if (v != loss && !grad.valid()) return absl::OkStatus();
    bool any = false;
    for (int i = 0; i < ctx.num_inputs(); ++i) any = any || ctx.needs_grad(i);
    if (!any) return absl::OkStatus();

    const std::string where =
        absl::StrCat("node '", forward.id(v), "' (op ", forward.op(v), ")");
    const OpDef* def = FindOp(forward.op(v));
    if (def == nullptr || def->backward == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " lies between the loss and a parameter but its operator "
                 "has no backward rule"));
    }
    if (!nb.has_type(Value{v})) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": no shape, cannot differentiate"));
    }
    for (NodeId u : forward.unique_inputs(v)) {
      if (!nb.has_type(Value{u})) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": input '", forward.id(u), "' has no shape"));
      }
    }
    const absl::Status status = def->backward(ctx);
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat(where, ": backward: ",
                                                      status.message()));
    }
    return nb.status();
  };

  // A parameter's gradient is completed as soon as its last reader has been
  // differentiated, as a framework accumulates .grad when it is ready (so an
  // aliased gradient's copy comes right after it), not at the parameter's
  // own late place in the reverse order.
  std::vector<int> unvisited_readers(forward.num_nodes());
  for (NodeId v = 0; v < forward.num_nodes(); ++v) {
    unvisited_readers[v] = static_cast<int>(forward.readers(v).size());
  }
  std::vector<bool> done(forward.num_nodes(), false);
  absl::Span<const NodeId> order = forward.topological_order();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const NodeId v = *it;
    if (!done[v]) {
      RETURN_IF_ERROR(differentiate(v));
      done[v] = true;
    }
    for (NodeId u : forward.unique_inputs(v)) {
      if (--unvisited_readers[u] == 0 &&
          forward.role(u) == Role::kParameter && !done[u]) {
        RETURN_IF_ERROR(differentiate(u));
        done[u] = true;
      }
    }
  }

  nb.MarkOutput(Value{loss});
  for (NodeId v = 0; v < forward.num_nodes(); ++v) {
    if (forward.role(v) == Role::kParameter && state.grads[v].total.valid()) {
      nb.MarkOutput(state.grads[v].total);
    }
  }
  return nb.Build();
}

absl::StatusOr<LossKind> ParseLossKind(absl::string_view name) {
  if (name == "none") return LossKind::kNone;
  if (name == "cross-entropy") return LossKind::kCrossEntropy;
  if (name == "mse") return LossKind::kMse;
  if (name == "bce") return LossKind::kBce;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown loss '", name, "' (cross-entropy, mse, bce or none)"));
}

absl::string_view LossKindName(LossKind kind) {
  switch (kind) {
    case LossKind::kNone: return "none";
    case LossKind::kCrossEntropy: return "cross-entropy";
    case LossKind::kMse: return "mse";
    case LossKind::kBce: return "bce";
  }
  return "?";
}

absl::StatusOr<Graph> AddLossAndDifferentiate(const Graph& forward, LossKind loss,
                                              CostModel cost_model) {
  if (loss == LossKind::kNone) return forward;
  const absl::string_view what = LossKindName(loss);
  for (const char* taken : {"target", "loss"}) {
    if (forward.Find(taken) != kNoNode) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the ", what, " loss adds the nodes 'target' and 'loss', but the graph already has "
          "a node '", taken, "': a training graph already (plan it as it is, without a loss), "
          "or a forward graph that uses the name (rename that node; from PyTorch, "
          "torch.onnx.export's input_names and output_names)"));
    }
  }
  if (forward.outputs().size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", what, " loss needs a forward graph with one output (the prediction); ",
        forward.name().empty() ? std::string("the graph") : Quote(forward.name()), " has ",
        forward.outputs().size(),
        ": export the prediction alone (torchvision's inception_v3 and googlenet with "
        "aux_logits=False), import with --loss none for the forward graph alone, or train the "
        "module with pebble.torch, whose loss takes several outputs (docs/torch.md)"));
  }
  const NodeId out = forward.outputs()[0];
  if (!forward.shape(out).has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", what, " loss: the output '", forward.id(out), "' has no shape"));
  }
  NetBuilder nb = NetBuilder::FromGraph(forward, cost_model);
  const Value prediction = nb.Find(forward.id(out));
  const TensorType& type = nb.type(prediction);
  Value target;
  if (loss == LossKind::kCrossEntropy) {
    if (type.shape.size() < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the cross-entropy loss: the output '", forward.id(out), "' is ",
          ShapeToString(type.shape), ", not (N, C, ...) logits"));
    }
    Shape target_shape = type.shape;
    target_shape.erase(target_shape.begin() + 1);
    target = nb.Input("target", target_shape, DType::kInt64);
    nb.Apply("softmax_cross_entropy", {prediction, target}, nlohmann::json::object(), "loss");
  } else {
    // A target of the output's shape and type: values for mse, the
    // probabilities of the positive class for bce.
    target = nb.Input("target", type.shape, type.dtype);
    nb.Apply(loss == LossKind::kMse ? "mse_loss" : "bce_with_logits", {prediction, target},
             nlohmann::json::object(), "loss");
  }
  nb.ClearOutputs();
  nb.MarkOutput(nb.Find("loss"));
  ASSIGN_OR_RETURN(Graph with_loss, nb.Build());
  return BuildTrainingGraph(with_loss, "loss", cost_model);
}

}  // namespace pebble
