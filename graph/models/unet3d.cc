// unet3d: a 3-D U-Net (Çiçek et al., MICCAI 2016) written as the widely used
// PyTorch U-Net of github.com/milesial/Pytorch-UNet (unet/unet_parts.py) with
// every 2-D module swapped for its 3-D counterpart and biased convolutions:
//
//   DoubleConv(in, out) = double_conv: Sequential(Conv3d(in, out, 3,
//       padding=1) [0], BatchNorm3d(out) [1], ReLU [2], Conv3d(out, out, 3,
//       padding=1) [3], BatchNorm3d(out) [4], ReLU [5])
//   Down(in, out) = maxpool_conv: Sequential(MaxPool3d(2) [0],
//       DoubleConv(in, out) [1])
//   Up(in, out)   = up: Upsample(scale_factor=2, mode="trilinear",
//       align_corners=True); conv: DoubleConv(in, out); forward(x1, x2):
//       x1 = up(x1); F.pad x1 to x2's size ([dW//2, dW - dW//2, dH//2,
//       dH - dH//2, dD//2, dD - dD//2]); conv(cat([x2, x1], dim=1))
//   OutConv(in, classes) = conv: Conv3d(in, classes, 1)
//
// large: inc 1->64, down1 64->128, down2 128->256, down3 256->512,
//        down4 512->512, up1 1024->256, up2 512->128, up3 256->64,
//        up4 128->64, outc 64->classes: 40,158,853 parameters (5 classes).
// small: inc 1->64, down1 64->128, down2 128->256, down3 256->256,
//        up1 512->256, up2 384->128, up3 192->64, outc: 14,496,517.
// `features` (64 above) is inc's width; every other width scales with it
// (as torch hub's U-Net's init_features): a narrower U-Net, the same graph.
//
// Loss: nn.CrossEntropyLoss over the class axis, per voxel, against `target`
// (batch, depth, height, width) i64. dtype (fp32, fp16, bf16) applies to the
// input, the convolution parameters and every feature map; batch-norm
// weights, biases and statistics stay fp32 and the loss is an fp32 scalar
// (the operator table's rule, as under torch.autocast); the target stays
// i64. A zero F.pad (the sizes already match) is left out: it would be a
// plain copy.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/models/zoo_internal.h"
#include "graph/status.h"

namespace pebble::zoo {
namespace {

constexpr int64_t kMaxBatch = 4096;

Value NamedRelu(NetBuilder& nb, Value x, std::string id) {
  return nb.Apply("relu", {x}, nlohmann::json::object(), std::move(id));
}

Value DoubleConv(NetBuilder& nb, const std::string& prefix, Value x,
                 int64_t out) {
  const std::string p = prefix + ".double_conv.";
  x = nb.Conv(p + "0", x, out, /*kernel=*/3, /*stride=*/1, /*padding=*/1);
  x = nb.BatchNorm(p + "1", x);
  x = NamedRelu(nb, x, p + "2");
  x = nb.Conv(p + "3", x, out, /*kernel=*/3, /*stride=*/1, /*padding=*/1);
  x = nb.BatchNorm(p + "4", x);
  return NamedRelu(nb, x, p + "5");
}

Value Down(NetBuilder& nb, const std::string& prefix, Value x, int64_t out) {
  x = nb.Apply("maxpool", {x}, {{"kernel", 2}, {"stride", 2}},
               prefix + ".maxpool_conv.0");
  return DoubleConv(nb, prefix + ".maxpool_conv.1", x, out);
}

// x1: the coarser tensor coming up, skip: the encoder tensor of this level.
Value Up(NetBuilder& nb, const std::string& prefix, Value x1, Value skip,
         int64_t out) {
  x1 = nb.Apply("upsample", {x1},
                {{"scale", 2}, {"mode", "trilinear"}, {"align_corners", true}},
                prefix + ".up");
  if (!x1.valid() || !skip.valid()) return Value{};  // an error is recorded
  const Shape& small = nb.type(x1).shape;
  const Shape& big = nb.type(skip).shape;
  // F.pad order: the last dim first, (before, after) for each.
  std::vector<int64_t> pads;
  bool any = false;
  for (int axis = 4; axis >= 2; --axis) {
    const int64_t diff = big[axis] - small[axis];
    pads.push_back(diff / 2);
    pads.push_back(diff - diff / 2);
    any = any || diff != 0;
  }
  if (any) {
    x1 = nb.Apply("pad", {x1}, {{"pads", pads}}, prefix + ".pad");
  }
  const Value cat = nb.Apply("concat", {skip, x1}, {{"axis", 1}},
                             prefix + ".cat");
  return DoubleConv(nb, prefix + ".conv", cat, out);
}

}  // namespace

absl::StatusOr<Graph> BuildUNet3d(const ModelArgs& args,
                                  const CostModel& cost) {
  ASSIGN_OR_RETURN(const int64_t batch, args.Int("batch", 1, kMaxBatch));
  ASSIGN_OR_RETURN(const std::string variant,
                   args.Choice("variant", {"large", "small"}));
  ASSIGN_OR_RETURN(const DType dtype, args.FloatDType("dtype"));
  ASSIGN_OR_RETURN(const int64_t depth, args.Int("depth", 1, 2048));
  ASSIGN_OR_RETURN(const int64_t height, args.Int("height", 1, 2048));
  ASSIGN_OR_RETURN(const int64_t width, args.Int("width", 1, 2048));
  ASSIGN_OR_RETURN(const int64_t classes, args.Int("classes", 1, 1024));
  ASSIGN_OR_RETURN(const int64_t f, args.Int("features", 1, 4096));
  const bool large = variant == "large";
  // Every level halves each spatial size (floor, as MaxPool3d(2)); the
  // coarsest level must keep at least one voxel.
  const int levels = large ? 4 : 3;
  const int64_t min_size = int64_t{1} << levels;
  if (depth < min_size || height < min_size || width < min_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model 'unet3d': variant ", variant, " pools ", levels,
        " times, so depth, height and width must be at least ", min_size,
        "; got ", depth, "x", height, "x", width));
  }

  NetBuilder nb(args.graph_name(), cost);
  Value x = nb.Input("input", {batch, 1, depth, height, width}, dtype);
  const Value target =
      nb.Input("target", {batch, depth, height, width}, DType::kInt64);
  const Value x1 = DoubleConv(nb, "inc", x, f);
  const Value x2 = Down(nb, "down1", x1, 2 * f);
  const Value x3 = Down(nb, "down2", x2, 4 * f);
  Value u;
  if (large) {
    const Value x4 = Down(nb, "down3", x3, 8 * f);
    const Value x5 = Down(nb, "down4", x4, 8 * f);
    u = Up(nb, "up1", x5, x4, 4 * f);
    u = Up(nb, "up2", u, x3, 2 * f);
    u = Up(nb, "up3", u, x2, f);
    u = Up(nb, "up4", u, x1, f);
  } else {
    const Value x4 = Down(nb, "down3", x3, 4 * f);
    u = Up(nb, "up1", x4, x3, 4 * f);
    u = Up(nb, "up2", u, x2, 2 * f);
    u = Up(nb, "up3", u, x1, f);
  }
  const Value logits =
      nb.Conv("outc.conv", u, classes, /*kernel=*/1, /*stride=*/1,
              /*padding=*/0, /*bias=*/true);
  nb.Apply("softmax_cross_entropy", {logits, target}, nlohmann::json::object(),
           "loss");
  return FinishTrainingGraph(nb, cost);
}

}  // namespace pebble::zoo
