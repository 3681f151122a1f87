// Kernels: how a backend computes one node of a graph. The executor resolves
// every operand to backend memory at its planned offset and hands the kernel
// a KernelContext; the kernel reads the inputs and writes the whole output
// (and may use the planned workspace), nothing else.
//
// Contract for every kernel, on every backend:
//  - deterministic: the same inputs give the same output bits, whatever the
//    addresses of the operands (recomputation must reproduce a tensor bit
//    for bit: the tests compare the gradients of every policy bitwise);
//  - the output never aliases an input (each node is its own tensor,
//    docs/operators.md), and the output's previous contents are garbage;
//    except for an in-place update (graph.in_place(node): an optimizer's
//    step), whose output is its input 0's memory, read and then written
//    element by element;
//  - bad attributes or an operand of an unexpected dtype/shape are an
//    InvalidArgument naming the problem (the executor adds node and step);
//    an unsupported configuration is Unimplemented. Nothing throws.
#ifndef PEBBLE_RUNTIME_KERNEL_H_
#define PEBBLE_RUNTIME_KERNEL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "graph/graph.h"
#include "nlohmann/json.hpp"
#include "runtime/tensor.h"

namespace pebble {

struct KernelContext {
  const Graph* graph = nullptr;
  NodeId node = kNoNode;
  // graph.inputs(node), in order, repeats included (an operand read twice
  // appears twice, at the same address).
  std::vector<TensorView> inputs;
  TensorView output;
  std::byte* workspace = nullptr;  // graph.workspace(node) bytes, or null
  int64_t workspace_bytes = 0;

  const std::string& op() const { return graph->op(node); }
  const nlohmann::json& attrs() const { return graph->attrs(node); }
};

using KernelFn = absl::Status (*)(const KernelContext& ctx);

// op name -> kernel. One table per backend; each kernel family registers
// itself with an explicit Register...Kernels(KernelTable&) call (no static
// initialisers, as the planner registry).
class KernelTable {
 public:
  // Aborts on a duplicate op (a programming error).
  void Register(std::string op, KernelFn kernel);
  // nullptr when the op has no kernel.
  KernelFn Find(absl::string_view op) const;
  // Sorted.
  std::vector<std::string> Ops() const;

 private:
  std::vector<std::pair<std::string, KernelFn>> kernels_;  // sorted by op
};

}  // namespace pebble

#endif  // PEBBLE_RUNTIME_KERNEL_H_
