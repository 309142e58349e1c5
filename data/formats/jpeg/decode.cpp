#include "data/formats/jpeg/decode.h"

#include <jerror.h>
#include <jpeglib.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <vector>

#include "base/user_error.h"

namespace trainer {
namespace {

bool is_jpeg(std::string_view data) {
  return data.size() >= 3 && uint8_t(data[0]) == 0xFF && uint8_t(data[1]) == 0xD8 &&
         uint8_t(data[2]) == 0xFF;
}

bool is_png(std::string_view data) {
  return data.size() >= 8 && data.substr(0, 8) == std::string_view("\x89PNG\r\n\x1a\n", 8);
}

// The format decode_full hands to OpenCV, by its first bytes: PNG for records, and for an
// ImageFolder the others torchvision's ImageFolder reads (BMP, TIFF, WebP, PPM/PGM/PBM); nullptr
// for any other. OpenCV's other decoders (OpenEXR, Radiance HDR, JPEG 2000, Sun raster, PFM;
// some through a temporary file) read no image of a dataset this trainer takes, and each is more
// code a damaged or crafted record could reach.
const char* opencv_format(std::string_view data, ImageFormats formats) {
  auto starts = [&](std::string_view magic) { return data.substr(0, magic.size()) == magic; };
  if (is_png(data)) return "PNG";
  if (formats != ImageFormats::kImageFolder) return nullptr;
  if (starts("BM")) return "BMP";
  if (starts(std::string_view("II*\0", 4)) || starts(std::string_view("MM\0*", 4))) return "TIFF";
  if (data.size() >= 12 && starts("RIFF") && data.substr(8, 4) == "WEBP") return "WebP";
  if (data.size() >= 2 && data[0] == 'P' && data[1] >= '1' && data[1] <= '6') return "PNM";
  return nullptr;
}

// The first bytes of `data` in hex, for the error naming what an image is not.
std::string first_bytes(std::string_view data) {
  std::string hex;
  for (size_t i = 0; i < std::min<size_t>(data.size(), 8); ++i) {
    static constexpr char kDigits[] = "0123456789abcdef";
    hex += kDigits[uint8_t(data[i]) >> 4];
    hex += kDigits[uint8_t(data[i]) & 15];
    hex += ' ';
  }
  return data.empty() ? "(no bytes)" : hex.substr(0, hex.size() - 1);
}

uint32_t load_big_endian_u32(std::string_view data, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v = (v << 8) | uint8_t(data[at + i]);
  return v;
}

// The error for an image whose header claims more than kMaxImagePixels; empty when within it.
// A PNG's sides are 32-bit: each is bounded before the product, which could overflow otherwise.
std::string too_many_pixels(const char* format, int64_t width, int64_t height) {
  if (width <= kMaxImagePixels && height <= kMaxImagePixels && width * height <= kMaxImagePixels)
    return "";
  return detail::concat(format, " header claims ", width, " x ", height,
                        " pixels, over the limit of ", kMaxImagePixels,
                        " (16384 x 16384: 7x ImageNet's largest image); the image is damaged or "
                        "crafted. Fix: re-create or drop the image");
}

// libjpeg reports fatal errors through error_exit, which must not return: jump back to the
// caller's setjmp. A premature end of data is only a warning to libjpeg; here it is damage.
struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool truncated;
};

void on_error(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

void on_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF)
    reinterpret_cast<ErrorManager*>(cinfo->err)->truncated = true;
}

// Routes libjpeg's errors and warnings to `err` (the caller then sets its setjmp point).
void attach_error_manager(jpeg_decompress_struct& cinfo, ErrorManager& err) {
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = on_error;
  err.pub.emit_message = on_message;
  err.truncated = false;
}

// Creates the decompressor over `data` and reads the header; may longjmp to the caller's setjmp.
void read_jpeg_header(jpeg_decompress_struct& cinfo, std::string_view data) {
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(data.data()),
               static_cast<unsigned long>(data.size()));
  jpeg_read_header(&cinfo, TRUE);
}

// A decoded region of a JPEG at some DCT scale, and where the requested crop lies in it.
struct Region {
  std::vector<uint8_t> pixels;  // (height, width, 3) RGB
  int width = 0, height = 0;
  double crop_x = 0, crop_y = 0, crop_w = 0, crop_h = 0;  // in region pixels, fractional
  int scale = 8;
};

// Smallest s in {1, 2, 4, 8} with crop * s / 8 >= out in both directions (8 when the crop is
// smaller). Only these scales have libjpeg-turbo's SIMD IDCTs (8x8, 4x4, 2x2, 1x1); the others
// (3/8, 5/8, 6/8, 7/8) run generic C kernels that cost more than the pixels they save.
int choose_scale(const CropRect& crop, int out_w, int out_h) {
  for (int s = 1; s < 8; s *= 2)
    if (int64_t(crop.width) * s >= int64_t(out_w) * 8 &&
        int64_t(crop.height) * s >= int64_t(out_h) * 8)
      return s;
  return 8;
}

void cmyk_to_rgb(const uint8_t* cmyk, uint8_t* rgb, int pixels, bool inverted) {
  for (int i = 0; i < pixels; ++i, cmyk += 4, rgb += 3) {
    // Adobe writes inverted CMYK (what libjpeg calls saw_Adobe_marker): 255 means no ink.
    const int k = inverted ? cmyk[3] : 255 - cmyk[3];
    for (int c = 0; c < 3; ++c) {
      const int v = inverted ? cmyk[c] : 255 - cmyk[c];
      rgb[c] = static_cast<uint8_t>((v * k + 127) / 255);
    }
  }
}

// `crop` moved and shrunk to lie inside a W x H image, at least one pixel.
CropRect clip_to_image(CropRect crop, int W, int H) {
  crop.x = std::clamp(crop.x, 0, W - 1);
  crop.y = std::clamp(crop.y, 0, H - 1);
  crop.width = std::clamp(crop.width, 1, W - crop.x);
  crop.height = std::clamp(crop.height, 1, H - crop.y);
  return crop;
}

// Reads the started decompression's scanlines into the region (sized already), through `row`
// (one CMYK scanline) when the JPEG is CMYK. libjpeg may longjmp out of here to the caller's
// setjmp: nothing in this frame has a destructor.
void read_region_rows(jpeg_decompress_struct& cinfo, bool cmyk, uint8_t* row, Region* region) {
  const int rw = region->width;
  // RGB rows go straight into the region, as many per call as the upsampler makes at once
  // (two for 4:2:0): asked for one, it would copy the second out of a spare row.
  const int per_call = cmyk ? 1 : std::clamp(cinfo.rec_outbuf_height, 1, 4);
  for (int y = 0; y < region->height;) {
    JSAMPROW rows[4];
    const int want = std::min(per_call, region->height - y);
    for (int k = 0; k < want; ++k)
      rows[k] = cmyk ? row : region->pixels.data() + size_t(y + k) * rw * 3;
    const int got = static_cast<int>(jpeg_read_scanlines(&cinfo, rows, want));
    if (got <= 0) break;
    if (cmyk)
      cmyk_to_rgb(row, region->pixels.data() + size_t(y) * rw * 3, rw, cinfo.saw_Adobe_marker);
    y += got;
  }
}

// The columns [x0, x1) and rows [y0, y1) of the DCT-scaled image (its size set by
// jpeg_start_decompress) that cover `crop` of the W x H image, and the scale factors.
struct ScaledWindow {
  double fx, fy;
  int x0, x1, y0, y1;
};
ScaledWindow scaled_window(const jpeg_decompress_struct& cinfo, const CropRect& crop, int W,
                           int H) {
  ScaledWindow w;
  w.fx = double(cinfo.output_width) / W;
  w.fy = double(cinfo.output_height) / H;
  w.x0 = static_cast<int>(std::floor(crop.x * w.fx));
  w.x1 =
      std::min<int>(cinfo.output_width, static_cast<int>(std::ceil((crop.x + crop.width) * w.fx)));
  w.y0 = static_cast<int>(std::floor(crop.y * w.fy));
  w.y1 = std::min<int>(cinfo.output_height,
                       static_cast<int>(std::ceil((crop.y + crop.height) * w.fy)));
  return w;
}

// Decodes the part of the JPEG covering `crop` (clipped to the image). Only POD locals live
// across setjmp; the vectors are sized before any libjpeg call can jump.
bool decode_jpeg_region(std::string_view data, const CropChooser& choose_crop, int out_w, int out_h,
                        Region* region, std::string* error) {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  attach_error_manager(cinfo, err);
  std::vector<uint8_t> row;  // one scanline (CMYK input only)
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    *error = std::string("JPEG decode failed: ") + err.message;
    return false;
  }
  read_jpeg_header(cinfo, data);
  const int W = static_cast<int>(cinfo.image_width), H = static_cast<int>(cinfo.image_height);
  // Before anything of the image's size is allocated (the region, libjpeg's buffers).
  if (int64_t(W) * H > kMaxImagePixels || W <= 0 || H <= 0) {
    jpeg_destroy_decompress(&cinfo);
    *error = W <= 0 || H <= 0
                 ? "JPEG of " + std::to_string(W) + "x" + std::to_string(H) + " pixels is empty"
                 : too_many_pixels("JPEG", W, H);
    return false;
  }
  const CropRect crop = clip_to_image(choose_crop({W, H}), W, H);
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  region->scale = choose_scale(crop, out_w, out_h);
  cinfo.scale_num = static_cast<unsigned>(region->scale);
  cinfo.scale_denom = 8;
  // Speed over the last bit of fidelity, as DALI and tf.data's fast path do: the integer IDCT
  // and merged (non-"fancy") chroma upsampling, which then shares the colour conversion pass.
  // The output feeds a resize and a random crop; the difference is below JPEG's own noise.
  cinfo.dct_method = JDCT_IFAST;
  cinfo.do_fancy_upsampling = FALSE;
  jpeg_start_decompress(&cinfo);
  const ScaledWindow window = scaled_window(cinfo, crop, W, H);
  const double fx = window.fx, fy = window.fy;
  const int y0 = window.y0, y1 = window.y1;
  JDIMENSION xoffset = static_cast<JDIMENSION>(window.x0),
             width = static_cast<JDIMENSION>(window.x1 - window.x0);
  if (width < cinfo.output_width) jpeg_crop_scanline(&cinfo, &xoffset, &width);  // to iMCU edges
  const int rw = static_cast<int>(cinfo.output_width);  // the cropped width after the call
  if (y0 > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(y0));
  region->width = rw;
  region->height = y1 - y0;
  region->pixels.resize(size_t(rw) * region->height * 3);
  row.resize(size_t(rw) * 4);
  read_region_rows(cinfo, cmyk, row.data(), region);
  const bool truncated = err.truncated;
  jpeg_destroy_decompress(&cinfo);  // abandons the remaining scanlines: no need to read them
  if (truncated) {
    *error = "JPEG data is truncated (premature end of file)";
    return false;
  }
  region->crop_x = crop.x * fx - double(xoffset);
  region->crop_y = crop.y * fy - double(y0);
  region->crop_w = crop.width * fx;
  region->crop_h = crop.height * fy;
  return true;
}

bool decode_other_region(std::string_view data, const CropChooser& choose_crop, Region* region,
                         std::string* error) {
  cv::Mat rgb;
  if (!decode_full(data, &rgb, error)) return false;
  CropRect crop = choose_crop({rgb.cols, rgb.rows});
  crop.x = std::clamp(crop.x, 0, rgb.cols - 1);
  crop.y = std::clamp(crop.y, 0, rgb.rows - 1);
  region->width = rgb.cols;
  region->height = rgb.rows;
  region->pixels.assign(rgb.data, rgb.data + rgb.total() * 3);
  region->crop_x = crop.x;
  region->crop_y = crop.y;
  region->crop_w = std::clamp(crop.width, 1, rgb.cols - crop.x);
  region->crop_h = std::clamp(crop.height, 1, rgb.rows - crop.y);
  return true;
}

// Bilinear resize that averages instead of skipping pixels when shrinking by more than 2x (what
// DCT scaling leaves for one side of an elongated crop): halvings first, each a bilinear resize
// by exactly 2 (the mean of pixel pairs), then bilinear to the size. About 3x faster than
// OpenCV's INTER_AREA at fractional ratios, and close to it: 41.6 dB PSNR against INTER_AREA's
// output on a generated test image shrunk 2.05x (plain bilinear: 38.3 dB).
void resize_antialiased(cv::Mat src, cv::Mat& dst) {
  thread_local cv::Mat halved[2];
  for (int k = 0; src.cols > 2 * dst.cols || src.rows > 2 * dst.rows; k ^= 1) {
    const int w = src.cols > 2 * dst.cols ? src.cols / 2 : src.cols;
    const int h = src.rows > 2 * dst.rows ? src.rows / 2 : src.rows;
    cv::resize(src(cv::Rect(0, 0, w * (src.cols / w), h * (src.rows / h))), halved[k],
               cv::Size(w, h), 0, 0, cv::INTER_LINEAR);
    src = halved[k];
  }
  cv::resize(src, dst, dst.size(), 0, 0, cv::INTER_LINEAR);
}

}  // namespace

bool encoded_image_size(std::string_view data, ImageSize* size, std::string* error,
                        ImageFormats formats) {
  if (is_jpeg(data)) {
    jpeg_decompress_struct cinfo;
    ErrorManager err;
    attach_error_manager(cinfo, err);
    if (setjmp(err.jump)) {
      jpeg_destroy_decompress(&cinfo);
      *error = std::string("JPEG header unreadable: ") + err.message;
      return false;
    }
    read_jpeg_header(cinfo, data);
    size->width = static_cast<int>(cinfo.image_width);
    size->height = static_cast<int>(cinfo.image_height);
    jpeg_destroy_decompress(&cinfo);
    // The decoders refuse such an image: its size is refused alike (libjpeg's sides stop at 65500).
    *error = too_many_pixels("JPEG", size->width, size->height);
    return error->empty();
  }
  cv::Mat rgb;
  if (!decode_full(data, &rgb, error, formats)) return false;
  *size = {rgb.cols, rgb.rows};
  return true;
}

bool decode_crop_resize(std::string_view data, const CropRect& crop, int out_width, int out_height,
                        uint8_t* out, std::string* error, int* scale_eighths) {
  return decode_crop_resize(
      data, [&](ImageSize) { return crop; }, out_width, out_height, out, error, scale_eighths);
}

bool decode_crop_resize(std::string_view data, const CropChooser& choose_crop, int out_width,
                        int out_height, uint8_t* out, std::string* error, int* scale_eighths) {
  // One region buffer per decode thread, reused: a fresh ~0.5 MB buffer per image costs an mmap,
  // page faults on every page and an munmap, about a tenth of the decode time.
  thread_local Region region;
  region.scale = 8;
  const bool ok = is_jpeg(data)
                      ? decode_jpeg_region(data, choose_crop, out_width, out_height, &region, error)
                      : decode_other_region(data, choose_crop, &region, error);
  if (!ok) return false;
  if (region.width <= 0 || region.height <= 0) {
    *error = "image decoded to an empty region";
    return false;
  }
  if (scale_eighths) *scale_eighths = region.scale;
  // The crop's rectangle in region pixels, rounded to whole pixels (the region starts on iMCU
  // boundaries, so the crop's corner is fractional; rounding moves it by at most half a scaled
  // pixel). cv::resize on that view is several times faster than a sub-pixel warpAffine.
  const int x0 = std::clamp(static_cast<int>(std::lround(region.crop_x)), 0, region.width - 1);
  const int y0 = std::clamp(static_cast<int>(std::lround(region.crop_y)), 0, region.height - 1);
  const int w = std::clamp(static_cast<int>(std::lround(region.crop_w)), 1, region.width - x0);
  const int h = std::clamp(static_cast<int>(std::lround(region.crop_h)), 1, region.height - y0);
  cv::Mat src(region.height, region.width, CV_8UC3, region.pixels.data());
  cv::Mat dst(out_height, out_width, CV_8UC3, out);
  resize_antialiased(src(cv::Rect(x0, y0, w, h)), dst);
  return true;
}

bool decode_full(std::string_view data, cv::Mat* rgb, std::string* error, ImageFormats formats) {
  if (is_jpeg(data)) {
    ImageSize size;
    if (!encoded_image_size(data, &size, error)) return false;  // within kMaxImagePixels too
    rgb->create(size.height, size.width, CV_8UC3);
    return decode_crop_resize(data, {0, 0, size.width, size.height}, size.width, size.height,
                              rgb->data, error);
  }
  const char* format = opencv_format(data, formats);
  if (format == nullptr) {
    *error = formats == ImageFormats::kImageFolder
                 ? "image is not JPEG, PNG, BMP, TIFF, WebP or PPM/PGM (it begins " +
                       first_bytes(data) + "): damaged, or a format ImageFolder does not read. " +
                       "Fix: convert it to JPEG, or drop it"
                 : "image is neither JPEG nor PNG (it begins " + first_bytes(data) +
                       "): damaged, or another format, which records do not hold (make-tfrecords "
                       "writes JPEG). Fix: convert the images with make-tfrecords, or drop it";
    return false;
  }
  // OpenCV allocates the decoded image from the header (its own limit is 2^30 pixels): a PNG's
  // size is checked against ours first, from its IHDR chunk (bytes 16..23, big-endian).
  if (is_png(data) && data.size() >= 24) {
    *error = too_many_pixels("PNG", load_big_endian_u32(data, 16), load_big_endian_u32(data, 20));
    if (!error->empty()) return false;
  }
  cv::Mat encoded(1, static_cast<int>(data.size()), CV_8UC1, const_cast<char*>(data.data()));
  cv::Mat bgr;
  try {
    bgr = cv::imdecode(encoded, cv::IMREAD_COLOR);
  } catch (const cv::Exception& e) {
    *error = std::string("image decode failed: ") + e.what();
    return false;
  }
  if (bgr.empty()) {
    *error = std::string(format) + " image undecodable (damaged or truncated)";
    return false;
  }
  *error = too_many_pixels(format, bgr.cols, bgr.rows);  // other formats: after OpenCV's limit
  if (!error->empty()) return false;
  cv::cvtColor(bgr, *rgb, cv::COLOR_BGR2RGB);
  return true;
}

}  // namespace trainer
