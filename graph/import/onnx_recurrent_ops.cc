// ONNX's recurrent layers (RNN, GRU, LSTM: nn.RNN, nn.GRU and nn.LSTM as
// torch.onnx.export writes them) unrolled over the sequence into pebble's
// operators: every shape is fixed at import, so each time step is a few
// nodes, and the planner sees (and may recompute or offload) every step's
// tensors. The arithmetic follows ATen's CPU cells in order (docs/import.md).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/import/onnx_context.h"
#include "graph/import/onnx_ops.h"
#include "graph/import/onnx_util.h"
#include "graph/status.h"

namespace pebble::onnx_import {
namespace {

enum class Cell { kRnn, kGru, kLstm };

// Gates per cell, in ONNX's order: RNN one; GRU z, r, h; LSTM i, o, f, c.
int Gates(Cell cell) { return cell == Cell::kRnn ? 1 : cell == Cell::kGru ? 3 : 4; }

// One direction's weights and states, each with a leading dim of 1.
struct Direction {
  Value w, r;                      // (G H, I), (G H, H)
  std::optional<Value> wb, rb;     // (G H) each
  Value h, c;                      // (1, batch, H); c for an LSTM only
};

// The layer's attributes, refused where they change the arithmetic beyond
// what PyTorch writes.
struct Layer {
  Cell cell = Cell::kLstm;
  int64_t hidden = 0;
  int directions = 1;
  bool reverse = false;              // direction "reverse"
  bool linear_before_reset = false;  // GRU
  bool relu = false;                 // RNN's nonlinearity="relu"
};

absl::StatusOr<Layer> ReadLayer(const onnx::NodeProto& node, Cell cell) {
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"hidden_size", "direction", "activations", "layout",
                                   "linear_before_reset", "input_forget", "clip",
                                   "activation_alpha", "activation_beta"}));
  Layer layer;
  layer.cell = cell;
  ASSIGN_OR_RETURN(layer.hidden, attrs.Int("hidden_size", 0));
  if (layer.hidden < 1) return NodeError(node, "attribute hidden_size must be positive");
  ASSIGN_OR_RETURN(const std::string direction, attrs.String("direction", "forward"));
  if (direction == "bidirectional") {
    layer.directions = 2;
  } else if (direction == "reverse") {
    layer.reverse = true;
  } else if (direction != "forward") {
    return attrs.Unsupported("direction", direction);
  }
  ASSIGN_OR_RETURN(const int64_t layout, attrs.Int("layout", 0));
  if (layout != 0) return attrs.Unsupported("layout", absl::StrCat(layout), "batch first");
  ASSIGN_OR_RETURN(const int64_t input_forget, attrs.Int("input_forget", 0));
  if (input_forget != 0) return attrs.Unsupported("input_forget", absl::StrCat(input_forget));
  for (const char* name : {"clip", "activation_alpha", "activation_beta"}) {
    if (attrs.has(name)) return attrs.Unsupported(name, "(any)");
  }
  ASSIGN_OR_RETURN(const int64_t lbr, attrs.Int("linear_before_reset", 0));
  layer.linear_before_reset = lbr != 0;
  if (cell != Cell::kGru && attrs.has("linear_before_reset")) {
    return attrs.Unsupported("linear_before_reset", absl::StrCat(lbr), "a GRU's only");
  }
  // The activations, per direction: ONNX's defaults, or Relu for an RNN.
  std::vector<std::string> defaults = cell == Cell::kRnn   ? std::vector<std::string>{"Tanh"}
                                      : cell == Cell::kGru ? std::vector<std::string>{"Sigmoid",
                                                                                      "Tanh"}
                                                           : std::vector<std::string>{
                                                                 "Sigmoid", "Tanh", "Tanh"};
  for (const onnx::AttributeProto& a : node.attribute()) {
    if (a.name() != "activations") continue;
    if (a.strings_size() != static_cast<int>(defaults.size()) * layer.directions) {
      return attrs.Unsupported("activations", absl::StrCat(a.strings_size(), " names"));
    }
    for (int i = 0; i < a.strings_size(); ++i) {
      const std::string& want = defaults[i % defaults.size()];
      if (cell == Cell::kRnn && a.strings(i) == "Relu") {
        layer.relu = true;
      } else if (a.strings(i) != want) {
        return attrs.Unsupported("activations", a.strings(i),
                                 absl::StrCat("where ONNX's default is ", want));
      }
    }
    if (layer.relu && a.strings_size() == 2 && a.strings(0) != a.strings(1)) {
      return attrs.Unsupported("activations", "Tanh and Relu", "one per direction");
    }
  }
  return layer;
}

// Part `d` of input `name` of shape (directions, ...), without its leading
// dim where `squeeze` (as `shape`).
absl::StatusOr<Value> DirectionPart(ImportContext& cx, const onnx::NodeProto& node, Value v,
                                    int d, int directions, const std::vector<int64_t>& shape,
                                    const std::string& what) {
  if (directions > 1) {
    ASSIGN_OR_RETURN(v, cx.Aux(node, "slice", {v}, {{"axis", 0}, {"begin", d}, {"end", d + 1}},
                               absl::StrCat(what, d)));
  }
  return cx.Aux(node, "reshape", {v}, {{"shape", shape}}, absl::StrCat(what, d, "_view"));
}

// An initial state (1, batch, H) of direction `d`: input `i` of the node,
// or zeros where it is absent or a constant of zeros (PyTorch writes
// torch.zeros expanded to the batch).
absl::StatusOr<Value> InitialState(ImportContext& cx, const onnx::NodeProto& node, int i, int d,
                                   int directions, Value like, const std::vector<int64_t>& shape,
                                   const std::string& what) {
  const std::string name = node.input_size() > i ? node.input(i) : "";
  if (name.empty()) return cx.Zeros(node, shape, like, absl::StrCat(what, d));
  if (cx.Find(name) == nullptr) {
    std::optional<Numbers> numbers = cx.KnownNumbers(name);
    const bool zeros = numbers && !numbers->values.empty() &&
                       std::all_of(numbers->values.begin(), numbers->values.end(),
                                   [](double v) { return v == 0.0; });
    if (!zeros) {
      return NodeError(node, absl::StrCat("the initial state ", Quote(name),
                                          " is a constant other than zeros (not supported)"));
    }
    return cx.Zeros(node, shape, like, absl::StrCat(what, d));
  }
  ASSIGN_OR_RETURN(Value v, cx.Get(node, name));
  if (directions == 1) return v;
  return cx.Aux(node, "slice", {v}, {{"axis", 0}, {"begin", d}, {"end", d + 1}},
                absl::StrCat(what, d));
}

// The steps of one direction over the projected inputs xw (seq, batch, G H):
// its h per step (1, batch, H) in time order, and its last h and c.
class Unroller {
 public:
  Unroller(ImportContext& cx, const onnx::NodeProto& node, const Layer& layer, int d)
      : cx_(cx), node_(node), layer_(layer), d_(d) {}

  absl::StatusOr<std::vector<Value>> Run(Value xw, int64_t seq, Direction& dir) {
    std::vector<Value> outputs(seq);
    for (int64_t k = 0; k < seq; ++k) {
      const int64_t t = (layer_.reverse || d_ == 1) ? seq - 1 - k : k;
      ASSIGN_OR_RETURN(const Value x_t, Op("slice", {xw}, {{"axis", 0}, {"begin", t},
                                                            {"end", t + 1}}, t, "x"));
      std::vector<Value> hr_in = {dir.h, dir.r};
      if (dir.rb) hr_in.push_back(*dir.rb);
      ASSIGN_OR_RETURN(const Value h_r, Op("linear", hr_in, Json::object(), t, "hr"));
      switch (layer_.cell) {
        case Cell::kRnn: {
          ASSIGN_OR_RETURN(const Value sum, Op("add", {h_r, x_t}, Json::object(), t, "sum"));
          ASSIGN_OR_RETURN(dir.h, Op(layer_.relu ? "relu" : "tanh", {sum}, Json::object(), t,
                                     "h"));
          break;
        }
        case Cell::kGru:
          RETURN_IF_ERROR(GruStep(x_t, h_r, t, dir));
          break;
        case Cell::kLstm:
          RETURN_IF_ERROR(LstmStep(x_t, h_r, t, dir));
          break;
      }
      outputs[t] = dir.h;
    }
    return outputs;
  }

 private:
  // A node of step t: id "<node>.d<d>_t<t>_<what>".
  absl::StatusOr<Value> Op(absl::string_view op, std::vector<Value> in, Json attrs, int64_t t,
                           absl::string_view what) {
    return cx_.Aux(node_, op, std::move(in), std::move(attrs),
                   absl::StrCat("d", d_, "_t", t, "_", what));
  }
  absl::StatusOr<Value> Gate(Value v, int g, int64_t t, absl::string_view what) {
    const int64_t h = layer_.hidden;
    return Op("slice", {v}, {{"axis", 2}, {"begin", g * h}, {"end", (g + 1) * h}}, t, what);
  }

  // ATen's GRU cell: r = sigmoid(x_r + h_r), z = sigmoid(x_z + h_z),
  // n = tanh(x_n + r (h R_n + b_n)), h' = (h - n) z + n; before the reset
  // (ONNX's linear_before_reset 0), n = tanh(x_n + (r h) R_n + b_n).
  absl::Status GruStep(Value x_t, Value h_r, int64_t t, Direction& dir) {
    ASSIGN_OR_RETURN(const Value xz, Gate(x_t, 0, t, "xz"));
    ASSIGN_OR_RETURN(const Value xr, Gate(x_t, 1, t, "xr"));
    ASSIGN_OR_RETURN(const Value xn, Gate(x_t, 2, t, "xn"));
    ASSIGN_OR_RETURN(const Value hz, Gate(h_r, 0, t, "hz"));
    ASSIGN_OR_RETURN(const Value hr, Gate(h_r, 1, t, "hr_r"));
    ASSIGN_OR_RETURN(Value zs, Op("add", {xz, hz}, Json::object(), t, "z_in"));
    ASSIGN_OR_RETURN(const Value z, Op("sigmoid", {zs}, Json::object(), t, "z"));
    ASSIGN_OR_RETURN(Value rs, Op("add", {xr, hr}, Json::object(), t, "r_in"));
    ASSIGN_OR_RETURN(const Value r, Op("sigmoid", {rs}, Json::object(), t, "r"));
    Value reset;
    if (layer_.linear_before_reset) {
      ASSIGN_OR_RETURN(const Value hn, Gate(h_r, 2, t, "hn"));
      ASSIGN_OR_RETURN(reset, Op("mul", {hn, r}, Json::object(), t, "reset"));
    } else {
      // h_r holds h R_n + b_n of the unreset h, which this form does not
      // use: R_n and b_n again, on r h.
      const int64_t hidden = layer_.hidden;
      ASSIGN_OR_RETURN(const Value rh, Op("mul", {r, dir.h}, Json::object(), t, "rh"));
      ASSIGN_OR_RETURN(const Value rn, Op("slice", {dir.r}, {{"axis", 0}, {"begin", 2 * hidden},
                                                             {"end", 3 * hidden}}, t, "R_n"));
      std::vector<Value> in = {rh, rn};
      if (dir.rb) {
        ASSIGN_OR_RETURN(const Value bn, Op("slice", {*dir.rb}, {{"axis", 0},
                                                                {"begin", 2 * hidden},
                                                                {"end", 3 * hidden}},
                                            t, "b_n"));
        in.push_back(bn);
      }
      ASSIGN_OR_RETURN(reset, Op("linear", in, Json::object(), t, "reset"));
    }
    ASSIGN_OR_RETURN(Value ns, Op("add", {xn, reset}, Json::object(), t, "n_in"));
    ASSIGN_OR_RETURN(const Value n, Op("tanh", {ns}, Json::object(), t, "n"));
    ASSIGN_OR_RETURN(const Value diff, Op("sub", {dir.h, n}, Json::object(), t, "h_minus_n"));
    ASSIGN_OR_RETURN(const Value scaled, Op("mul", {diff, z}, Json::object(), t, "scaled"));
    ASSIGN_OR_RETURN(dir.h, Op("add", {scaled, n}, Json::object(), t, "h"));
    return absl::OkStatus();
  }

  // ATen's LSTM cell over ONNX's gates i, o, f, c: c' = f c + i g,
  // h' = o tanh(c').
  absl::Status LstmStep(Value x_t, Value h_r, int64_t t, Direction& dir) {
    ASSIGN_OR_RETURN(const Value gates, Op("add", {x_t, h_r}, Json::object(), t, "gates"));
    ASSIGN_OR_RETURN(Value i, Gate(gates, 0, t, "i_in"));
    ASSIGN_OR_RETURN(Value o, Gate(gates, 1, t, "o_in"));
    ASSIGN_OR_RETURN(Value f, Gate(gates, 2, t, "f_in"));
    ASSIGN_OR_RETURN(Value g, Gate(gates, 3, t, "g_in"));
    ASSIGN_OR_RETURN(i, Op("sigmoid", {i}, Json::object(), t, "i"));
    ASSIGN_OR_RETURN(f, Op("sigmoid", {f}, Json::object(), t, "f"));
    ASSIGN_OR_RETURN(g, Op("tanh", {g}, Json::object(), t, "g"));
    ASSIGN_OR_RETURN(o, Op("sigmoid", {o}, Json::object(), t, "o"));
    ASSIGN_OR_RETURN(const Value kept, Op("mul", {f, dir.c}, Json::object(), t, "kept"));
    ASSIGN_OR_RETURN(const Value added, Op("mul", {i, g}, Json::object(), t, "added"));
    ASSIGN_OR_RETURN(dir.c, Op("add", {kept, added}, Json::object(), t, "c"));
    ASSIGN_OR_RETURN(const Value tc, Op("tanh", {dir.c}, Json::object(), t, "tanh_c"));
    ASSIGN_OR_RETURN(dir.h, Op("mul", {o, tc}, Json::object(), t, "h"));
    return absl::OkStatus();
  }

  ImportContext& cx_;
  const onnx::NodeProto& node_;
  const Layer& layer_;
  int d_;
};

// Output `i` of the node from `parts` (one per direction, each (1, ...) or
// (seq, ...)), concatenated on `axis` after a reshape to `shape` each; not
// made where nothing reads it.
absl::Status DefineOutput(ImportContext& cx, const onnx::NodeProto& node, int i,
                          const std::vector<Value>& parts, const std::vector<int64_t>& shape,
                          int axis, const std::string& what) {
  if (node.output_size() <= i || node.output(i).empty()) return absl::OkStatus();
  if (cx.Readers(node.output(i)).empty() && !cx.Reserved(node.output(i))) {
    return absl::OkStatus();
  }
  std::vector<Value> viewed;
  for (size_t d = 0; d < parts.size(); ++d) {
    if (cx.nb().type(parts[d]).shape == Shape(shape.begin(), shape.end())) {
      viewed.push_back(parts[d]);
      continue;
    }
    if (parts.size() == 1 && i == 0) {  // Y of one direction: the node's own id
      ASSIGN_OR_RETURN(Value v, cx.Lowered(node, "reshape", {parts[d]}, {{"shape", shape}}, ""));
      return cx.Define(node, v, i);
    }
    ASSIGN_OR_RETURN(Value v, cx.Aux(node, "reshape", {parts[d]}, {{"shape", shape}},
                                     absl::StrCat(what, d, "_view")));
    viewed.push_back(v);
  }
  if (viewed.size() == 1) return cx.Define(node, viewed[0], i);
  ASSIGN_OR_RETURN(Value v, i == 0 ? cx.Lowered(node, "concat", viewed, {{"axis", axis}}, "")
                                   : cx.Aux(node, "concat", viewed, {{"axis", axis}}, what));
  return cx.Define(node, v, i);
}

absl::Status Recurrent(ImportContext& cx, const onnx::NodeProto& node, Cell cell) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 3, cell == Cell::kLstm ? 8 : 6));
  ASSIGN_OR_RETURN(const Layer layer, ReadLayer(node, cell));
  std::optional<Ints> lens;  // sequence_lens, where given
  if (node.input_size() > 4 && !node.input(4).empty()) {
    lens = cx.KnownInts(node.input(4));
    if (!lens) {
      return NodeError(node, "sequence_lens computed at run time is not supported (sequences "
                             "of one length only)");
    }
  }
  if (cell == Cell::kLstm && node.input_size() > 7 && !node.input(7).empty()) {
    return NodeError(node, "peephole weights (input P) are not supported");
  }
  ASSIGN_OR_RETURN(const Value x, cx.Get(node, node.input(0)));
  const Shape& xs = cx.nb().type(x).shape;
  if (xs.size() != 3) {
    return NodeError(node, absl::StrCat("input X must be (sequence, batch, features), got ",
                                        ShapeToString(xs)));
  }
  const int64_t seq = xs[0], batch = xs[1], features = xs[2], hidden = layer.hidden;
  if (lens) {
    for (int64_t len : lens->values) {
      if (len != seq) {
        return NodeError(node, absl::StrCat("sequence_lens holds ", len, ", not the sequence's ",
                                            seq, " (padded sequences are not supported)"));
      }
    }
  }
  const int64_t gh = Gates(cell) * hidden;
  ASSIGN_OR_RETURN(const Value w, cx.Get(node, node.input(1)));
  ASSIGN_OR_RETURN(const Value r, cx.Get(node, node.input(2)));
  const int dirs = layer.directions;
  if (cx.nb().type(w).shape != Shape{dirs, gh, features} ||
      cx.nb().type(r).shape != Shape{dirs, gh, hidden}) {
    return NodeError(node, absl::StrCat("W ", ShapeToString(cx.nb().type(w).shape), " and R ",
                                        ShapeToString(cx.nb().type(r).shape), " are not (",
                                        dirs, ",", gh, ",", features, ") and (", dirs, ",", gh,
                                        ",", hidden, ")"));
  }
  std::optional<Value> b;
  if (node.input_size() > 3 && !node.input(3).empty()) {
    ASSIGN_OR_RETURN(b, cx.Get(node, node.input(3)));
    if (cx.nb().type(*b).shape != Shape{dirs, 2 * gh}) {
      return NodeError(node, absl::StrCat("B ", ShapeToString(cx.nb().type(*b).shape),
                                          " is not (", dirs, ",", 2 * gh, ")"));
    }
  }
  std::vector<Value> ys, hs, cs;
  for (int d = 0; d < dirs; ++d) {
    Direction dir;
    ASSIGN_OR_RETURN(dir.w, DirectionPart(cx, node, w, d, dirs, {gh, features}, "W"));
    ASSIGN_OR_RETURN(dir.r, DirectionPart(cx, node, r, d, dirs, {gh, hidden}, "R"));
    if (b) {
      ASSIGN_OR_RETURN(const Value bd, DirectionPart(cx, node, *b, d, dirs, {2 * gh}, "B"));
      ASSIGN_OR_RETURN(dir.wb, cx.Aux(node, "slice", {bd}, {{"axis", 0}, {"begin", 0},
                                                            {"end", gh}},
                                      absl::StrCat("Wb", d)));
      ASSIGN_OR_RETURN(dir.rb, cx.Aux(node, "slice", {bd}, {{"axis", 0}, {"begin", gh},
                                                            {"end", 2 * gh}},
                                      absl::StrCat("Rb", d)));
    }
    const std::vector<int64_t> state = {1, batch, hidden};
    ASSIGN_OR_RETURN(dir.h, InitialState(cx, node, 5, d, dirs, x, state, "h0_"));
    if (cell == Cell::kLstm) {
      ASSIGN_OR_RETURN(dir.c, InitialState(cx, node, 6, d, dirs, x, state, "c0_"));
    }
    for (const Value* s : {&dir.h, cell == Cell::kLstm ? &dir.c : nullptr}) {
      if (s != nullptr && cx.nb().type(*s).shape != Shape(state.begin(), state.end())) {
        return NodeError(node, absl::StrCat("an initial state is ",
                                            ShapeToString(cx.nb().type(*s).shape), ", not (",
                                            dirs, ",", batch, ",", hidden, ")"));
      }
    }
    // Every step's input projection at once, as ATen's CPU layers do.
    std::vector<Value> xw_in = {x, dir.w};
    if (dir.wb) xw_in.push_back(*dir.wb);
    ASSIGN_OR_RETURN(const Value xw, cx.Aux(node, "linear", xw_in, Json::object(),
                                            absl::StrCat("d", d, "_xw")));
    Unroller unroller(cx, node, layer, d);
    ASSIGN_OR_RETURN(std::vector<Value> steps, unroller.Run(xw, seq, dir));
    ASSIGN_OR_RETURN(const Value y, cx.Aux(node, "concat", steps, {{"axis", 0}},
                                           absl::StrCat("d", d, "_y")));
    ys.push_back(y);
    hs.push_back(dir.h);
    if (cell == Cell::kLstm) cs.push_back(dir.c);
  }
  // Y (seq, directions, batch, H); Y_h and Y_c (directions, batch, H).
  RETURN_IF_ERROR(DefineOutput(cx, node, 0, ys, {seq, 1, batch, hidden}, 1, "Y"));
  RETURN_IF_ERROR(DefineOutput(cx, node, 1, hs, {1, batch, hidden}, 0, "Y_h"));
  if (cell == Cell::kLstm) {
    RETURN_IF_ERROR(DefineOutput(cx, node, 2, cs, {1, batch, hidden}, 0, "Y_c"));
  }
  return absl::OkStatus();
}

}  // namespace

void AddRecurrentOps(OnnxHandlers& handlers) {
  for (const auto& [name, cell] :
       {std::pair{"RNN", Cell::kRnn}, {"GRU", Cell::kGru}, {"LSTM", Cell::kLstm}}) {
    handlers[name] = [cell = cell](ImportContext& cx, const onnx::NodeProto& node) {
      return Recurrent(cx, node, cell);
    };
  }
}

}  // namespace pebble::onnx_import
