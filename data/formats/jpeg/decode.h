// Image decoding for the input pipeline. JPEG: only the scanlines and columns of a crop are
// decoded, at the largest DCT downscale (libjpeg-turbo's scale_num / 8) that keeps the crop at
// least as large as the output, then resized; grayscale and CMYK become RGB. PNG goes through
// OpenCV; so do the other formats torchvision's ImageFolder reads (BMP, TIFF, WebP, PPM) where the
// caller reads an ImageFolder (the converter, which writes them to records as JPEG). Any other is
// refused by its first bytes. Errors are returned, never thrown past libjpeg's C frames.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace cv {
class Mat;
}

namespace trainer {

// The most pixels (width x height, from the header) decoded: 16384 x 16384, over 7x ImageNet's
// largest image (~7,000 x 5,000) and under OpenCV's own 2^30; larger is damage or a bomb.
constexpr int64_t kMaxImagePixels = int64_t(1) << 28;

// The formats a caller reads. Records hold JPEG or PNG (the converters write JPEG), and only
// their sizes are checked before OpenCV allocates; the ImageFolder formats are the converter's
// input, whose sizes OpenCV checks against its own limit (2^30 pixels) only.
enum class ImageFormats { kRecords, kImageFolder };

struct ImageSize {
  int width = 0;
  int height = 0;
};

struct CropRect {  // in the source image's pixels
  int x = 0, y = 0, width = 0, height = 0;
};

// Dimensions of an encoded image (JPEG: from its header only). False + `error` when undecodable
// or over kMaxImagePixels.
bool encoded_image_size(std::string_view data, ImageSize* size, std::string* error,
                        ImageFormats formats = ImageFormats::kRecords);

// Decodes `crop` of the image and resizes it to out_width x out_height RGB into `out`
// ((out_height, out_width, 3) uint8, contiguous). `scale_eighths`, when given, receives the DCT
// scale used (8 = full size). False + `error` for undecodable, truncated or oversized images.
bool decode_crop_resize(std::string_view data, const CropRect& crop, int out_width, int out_height,
                        uint8_t* out, std::string* error, int* scale_eighths = nullptr);

// The same, with the crop chosen from the image's size once its header is read (the header is
// parsed once: RandomResizedCrop needs the size before it can pick the crop).
using CropChooser = std::function<CropRect(ImageSize)>;
bool decode_crop_resize(std::string_view data, const CropChooser& choose_crop, int out_width,
                        int out_height, uint8_t* out, std::string* error,
                        int* scale_eighths = nullptr);

// The whole image as RGB (H, W, 3) uint8 (full-resolution reference; the verifier).
bool decode_full(std::string_view data, cv::Mat* rgb, std::string* error,
                 ImageFormats formats = ImageFormats::kRecords);

}  // namespace trainer
