// torchvision's ResNets (He et al., "Deep residual learning for image
// recognition", CVPR 2016), with the layout and state_dict() keys of
// torchvision.models.resnet18() / resnet50(): conv1, bn1, layer<s>.<b>.conv1,
// layer<s>.<b>.bn1, ..., layer<s>.<b>.downsample.0 (1x1 conv) and .1 (batch
// norm), fc. ResNet-50 uses torchvision's "v1.5" bottleneck (the stride on
// the 3x3 convolution). Training mode: batch norm uses batch statistics and
// carries running_mean, running_var and num_batches_tracked buffers. Loss:
// nn.CrossEntropyLoss against `target` (batch) i64 over 1000 classes.
// Parameters (trainable, buffers excluded): resnet18 11,689,512,
// resnet50 25,557,032.
#include <string>

#include "absl/strings/str_cat.h"
#include "graph/models/zoo_internal.h"
#include "graph/status.h"

namespace pebble::zoo {
namespace {

constexpr int64_t kMaxBatch = 4096;
constexpr int64_t kClasses = 1000;

struct ResNetConfig {
  bool bottleneck;    // Bottleneck (expansion 4) or BasicBlock (expansion 1)
  int blocks[4];      // blocks per stage: layer1..layer4
};

Value NamedRelu(NetBuilder& nb, Value x, std::string id) {
  return nb.Apply("relu", {x}, nlohmann::json::object(), std::move(id));
}

// conv (no bias) then batch norm: the unit every block is made of.
Value ConvBn(NetBuilder& nb, const std::string& conv, const std::string& bn,
             Value x, int64_t out, int64_t kernel, int64_t stride,
             int64_t padding) {
  x = nb.Conv(conv, x, out, kernel, stride, padding, /*bias=*/false);
  return nb.BatchNorm(bn, x);
}

// One residual block named `p` ("layer2.0"). `in` channels enter, the block
// produces planes * expansion channels; the shortcut is a strided 1x1 conv
// and batch norm when the shape changes, as torchvision's _make_layer.
Value Block(NetBuilder& nb, const std::string& p, Value x, int64_t in,
            int64_t planes, int64_t stride, bool bottleneck) {
  const int64_t expansion = bottleneck ? 4 : 1;
  const int64_t out = planes * expansion;
  Value y;
  if (bottleneck) {
    y = ConvBn(nb, p + ".conv1", p + ".bn1", x, planes, 1, 1, 0);
    y = NamedRelu(nb, y, p + ".relu1");
    y = ConvBn(nb, p + ".conv2", p + ".bn2", y, planes, 3, stride, 1);
    y = NamedRelu(nb, y, p + ".relu2");
    y = ConvBn(nb, p + ".conv3", p + ".bn3", y, out, 1, 1, 0);
  } else {
    y = ConvBn(nb, p + ".conv1", p + ".bn1", x, planes, 3, stride, 1);
    y = NamedRelu(nb, y, p + ".relu1");
    y = ConvBn(nb, p + ".conv2", p + ".bn2", y, planes, 3, 1, 1);
  }
  Value shortcut = x;
  if (stride != 1 || in != out) {
    shortcut = ConvBn(nb, p + ".downsample.0", p + ".downsample.1", x, out, 1,
                      stride, 0);
  }
  y = nb.Apply("add", {y, shortcut}, nlohmann::json::object(), p + ".add");
  return NamedRelu(nb, y, p + ".relu");
}

absl::StatusOr<Graph> BuildResNet(const ModelArgs& args, const CostModel& cost,
                                  const ResNetConfig& config) {
  ASSIGN_OR_RETURN(const int64_t batch, args.Int("batch", 1, kMaxBatch));
  ASSIGN_OR_RETURN(const int64_t image, args.Int("image", 1, 4096));
  NetBuilder nb(args.graph_name(), cost);
  Value x = nb.Input("input", {batch, 3, image, image});
  const Value target = nb.Input("target", {batch}, DType::kInt64);

  x = ConvBn(nb, "conv1", "bn1", x, 64, /*kernel=*/7, /*stride=*/2,
             /*padding=*/3);
  x = NamedRelu(nb, x, "relu");
  x = nb.Apply("maxpool", {x}, {{"kernel", 3}, {"stride", 2}, {"padding", 1}},
               "maxpool");
  int64_t channels = 64;
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t planes = int64_t{64} << stage;
    for (int b = 0; b < config.blocks[stage]; ++b) {
      const int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
      x = Block(nb, absl::StrCat("layer", stage + 1, ".", b), x, channels,
                planes, stride, config.bottleneck);
      channels = planes * (config.bottleneck ? 4 : 1);
    }
  }
  // torchvision: AdaptiveAvgPool2d((1, 1)) then torch.flatten(x, 1); one
  // global average pool to (batch, channels) is the same tensor.
  x = nb.Apply("global_avgpool", {x}, nlohmann::json::object(), "avgpool");
  x = nb.Linear("fc", x, kClasses);
  nb.Apply("softmax_cross_entropy", {x, target}, nlohmann::json::object(),
           "loss");
  return FinishTrainingGraph(nb, cost);
}

}  // namespace

absl::StatusOr<Graph> BuildResNet18(const ModelArgs& args,
                                    const CostModel& cost) {
  return BuildResNet(args, cost, {/*bottleneck=*/false, {2, 2, 2, 2}});
}

absl::StatusOr<Graph> BuildResNet50(const ModelArgs& args,
                                    const CostModel& cost) {
  return BuildResNet(args, cost, {/*bottleneck=*/true, {3, 4, 6, 3}});
}

}  // namespace pebble::zoo
