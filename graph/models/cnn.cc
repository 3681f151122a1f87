// Plain convolutional networks: conv3d (a small volumetric stack), mnist-cnn
// and torchvision's vgg16. Parameter ids are the state_dict() keys of the
// PyTorch module each builder mirrors (docs/models.md).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/models/zoo_internal.h"
#include "graph/status.h"

namespace pebble::zoo {
namespace {

// The largest batch any model takes: keeps every byte count far from
// int64 overflow at the largest spatial sizes allowed.
constexpr int64_t kMaxBatch = 4096;

Value NamedRelu(NetBuilder& nb, Value x, std::string id) {
  return nb.Apply("relu", {x}, nlohmann::json::object(), std::move(id));
}

}  // namespace

// conv3d: the equivalent of
//   nn.Sequential(OrderedDict(conv1=nn.Conv3d(1, 4, 3, padding=1), relu1=ReLU,
//                 conv2=nn.Conv3d(4, 8, 3, padding=1), relu2=ReLU,
//                 conv3=nn.Conv3d(8, 1, 3, padding=1), relu3=ReLU))
// trained with nn.MSELoss() (mean) against `target` of the output's shape.
// input: (batch, 1, n, n, n).
absl::StatusOr<Graph> BuildConv3d(const ModelArgs& args,
                                  const CostModel& cost) {
  ASSIGN_OR_RETURN(const int64_t n, args.Int("n", 1, 2048));
  ASSIGN_OR_RETURN(const int64_t batch, args.Int("batch", 1, kMaxBatch));
  NetBuilder nb(args.graph_name(), cost);
  const Shape volume = {batch, 1, n, n, n};
  Value x = nb.Input("input", volume);
  const Value target = nb.Input("target", volume);
  const int64_t channels[] = {4, 8, 1};
  for (int i = 0; i < 3; ++i) {
    x = nb.Conv(absl::StrCat("conv", i + 1), x, channels[i], /*kernel=*/3,
                /*stride=*/1, /*padding=*/1, /*bias=*/true);
    x = NamedRelu(nb, x, absl::StrCat("relu", i + 1));
  }
  nb.Apply("mse_loss", {x, target}, nlohmann::json::object(), "loss");
  return FinishTrainingGraph(nb, cost);
}

// mnist-cnn: the classic two-conv MNIST network with valid padding, as
//   conv1 = nn.Conv2d(1, 32, 5), conv2 = nn.Conv2d(32, 64, 5),
//   fc1 = nn.Linear(1024, 1024), fc2 = nn.Linear(1024, 10),
//   forward: pool(relu(conv1)), pool(relu(conv2)), flatten, relu(fc1), fc2
// with F.max_pool2d(2) and nn.CrossEntropyLoss against `target` (batch) i64.
// Parameters: 832 + 51,264 + 1,049,600 + 10,250 = 1,111,946.
// Activations per image, counting each layer's output once and ReLUs as in
// place (they overwrite their input): input 784 + conv1 18,432 + pool1 4,608
// + conv2 4,096 + pool2 1,024 + fc1 1,024 + fc2 10 = 29,978.
absl::StatusOr<Graph> BuildMnistCnn(const ModelArgs& args,
                                    const CostModel& cost) {
  ASSIGN_OR_RETURN(const int64_t batch, args.Int("batch", 1, kMaxBatch));
  NetBuilder nb(args.graph_name(), cost);
  Value x = nb.Input("input", {batch, 1, 28, 28});
  const Value target = nb.Input("target", {batch}, DType::kInt64);
  const nlohmann::json pool2 = {{"kernel", 2}, {"stride", 2}};
  x = nb.Conv("conv1", x, 32, /*kernel=*/5);
  x = NamedRelu(nb, x, "relu1");
  x = nb.Apply("maxpool", {x}, pool2, "pool1");
  x = nb.Conv("conv2", x, 64, /*kernel=*/5);
  x = NamedRelu(nb, x, "relu2");
  x = nb.Apply("maxpool", {x}, pool2, "pool2");
  x = nb.Apply("flatten", {x}, {{"start_dim", 1}}, "flatten");
  x = nb.Linear("fc1", x, 1024);
  x = NamedRelu(nb, x, "relu3");
  x = nb.Linear("fc2", x, 10);
  nb.Apply("softmax_cross_entropy", {x, target}, nlohmann::json::object(),
           "loss");
  return FinishTrainingGraph(nb, cost);
}

// vgg16: torchvision.models.vgg16() (configuration "D" of Simonyan and
// Zisserman 2015, no batch norm). features.<i> numbers the modules of the
// features Sequential as torchvision does: convolutions, ReLUs and max-pools
// all take an index, so the convolutions are features.0, 2, 5, 7, 10, 12,
// 14, 17, 19, 21, 24, 26, 28. Then avgpool = AdaptiveAvgPool2d(7),
// classifier = Linear(25088, 4096) [0], ReLU [1], Dropout(0.5) [2],
// Linear(4096, 4096) [3], ReLU [4], Dropout(0.5) [5], Linear(4096, 1000) [6],
// and nn.CrossEntropyLoss against `target` (batch) i64.
// Parameters: 138,357,544.
absl::StatusOr<Graph> BuildVgg16(const ModelArgs& args,
                                 const CostModel& cost) {
  ASSIGN_OR_RETURN(const int64_t batch, args.Int("batch", 1, kMaxBatch));
  ASSIGN_OR_RETURN(const int64_t image, args.Int("image", 1, 4096));
  NetBuilder nb(args.graph_name(), cost);
  Value x = nb.Input("input", {batch, 3, image, image});
  const Value target = nb.Input("target", {batch}, DType::kInt64);

  constexpr int64_t kPool = 0;  // "M" in torchvision's cfgs
  const std::vector<int64_t> cfg = {64,  64,  kPool, 128, 128, kPool,
                                    256, 256, 256,   kPool, 512, 512,
                                    512, kPool, 512, 512, 512, kPool};
  int index = 0;
  for (int64_t channels : cfg) {
    if (channels == kPool) {
      x = nb.Apply("maxpool", {x}, {{"kernel", 2}, {"stride", 2}},
                   absl::StrCat("features.", index++));
    } else {
      x = nb.Conv(absl::StrCat("features.", index++), x, channels,
                  /*kernel=*/3, /*stride=*/1, /*padding=*/1);
      x = NamedRelu(nb, x, absl::StrCat("features.", index++));
    }
  }
  x = nb.Apply("adaptive_avgpool", {x}, {{"output_size", 7}}, "avgpool");
  x = nb.Apply("flatten", {x}, {{"start_dim", 1}}, "flatten");
  x = nb.Linear("classifier.0", x, 4096);
  x = NamedRelu(nb, x, "classifier.1");
  x = nb.Dropout(x, 0.5);
  x = nb.Linear("classifier.3", x, 4096);
  x = NamedRelu(nb, x, "classifier.4");
  x = nb.Dropout(x, 0.5);
  x = nb.Linear("classifier.6", x, 1000);
  nb.Apply("softmax_cross_entropy", {x, target}, nlohmann::json::object(),
           "loss");
  return FinishTrainingGraph(nb, cost);
}

}  // namespace pebble::zoo
