#include "src/report/input_preview.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <vector>

#include "base/user_error.h"

namespace trainer {
namespace {

// (n, H, W, 3) uint8 RGB on the CPU: normalisation undone.
at::Tensor to_rgb_bytes(const at::Tensor& input, int64_t n, const Normalization& norm) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor mean = at::tensor(std::vector<float>(norm.mean.begin(), norm.mean.end()), f32);
  const at::Tensor std = at::tensor(std::vector<float>(norm.std.begin(), norm.std.end()), f32);
  at::Tensor x = input.narrow(0, 0, n).to(at::kCPU, at::kFloat);  // (n, 3, H, W)
  x = (x * std.view({1, 3, 1, 1}) + mean.view({1, 3, 1, 1})) * 255.0;
  return x.round().clamp(0, 255).to(at::kByte).permute({0, 2, 3, 1}).contiguous();
}

}  // namespace

Picture preview_grid(const at::Tensor& input, const at::Tensor& labels, int64_t count,
                     int64_t columns, const Normalization& norm) {
  TORCH_INTERNAL_ASSERT(input.dim() == 4 && input.size(1) == 3 && columns > 0);
  const int64_t n = std::min(count, input.size(0));
  const int h = static_cast<int>(input.size(2)), w = static_cast<int>(input.size(3));
  const int cols = static_cast<int>(std::min(columns, std::max<int64_t>(n, 1)));
  const int rows = static_cast<int>((n + cols - 1) / cols);
  const at::Tensor rgb = to_rgb_bytes(input, n, norm);
  const at::Tensor label = labels.narrow(0, 0, n).to(at::kCPU);
  cv::Mat grid(std::max(rows, 1) * h, cols * w, CV_8UC3, cv::Scalar(0, 0, 0));
  const double scale = std::max(0.3, h / 160.0);  // label text readable at 32 and 224 pixels
  for (int64_t i = 0; i < n; ++i) {
    cv::Mat tile =
        grid(cv::Rect(static_cast<int>(i % cols) * w, static_cast<int>(i / cols) * h, w, h));
    cv::Mat(h, w, CV_8UC3, rgb[i].data_ptr()).copyTo(tile);
    const std::string text = std::to_string(label[i].item<int64_t>());
    int baseline = 0;
    const cv::Size size = cv::getTextSize(text, cv::FONT_HERSHEY_SIMPLEX, scale, 1, &baseline);
    cv::rectangle(tile, cv::Rect(0, 0, size.width + 2, size.height + baseline + 2),
                  cv::Scalar(0, 0, 0), cv::FILLED);
    cv::putText(tile, text, cv::Point(1, size.height + 1), cv::FONT_HERSHEY_SIMPLEX, scale,
                cv::Scalar(255, 255, 255), 1);
  }
  cv::Mat bgr;
  cv::cvtColor(grid, bgr, cv::COLOR_RGB2BGR);  // OpenCV encodes BGR
  std::vector<uchar> png;
  TORCH_CHECK(cv::imencode(".png", bgr, png), "PNG encoding of the input preview failed");
  return {std::string(png.begin(), png.end()), grid.rows, grid.cols};
}

}  // namespace trainer
