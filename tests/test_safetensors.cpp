// Safetensors reading and writing, sharded checkpoints and checkpoint discovery.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/weights/checkpoint.h"
#include "models/weights/safetensors.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using xfuser::models::open_checkpoint;
using xfuser::models::SafetensorsFile;
using xfuser::models::save_safetensors;
using xfuser::models::ShardedCheckpoint;
using xfuser::testing::TempDir;
using TensorMap = std::map<std::string, at::Tensor>;

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return out;
}

// A safetensors file with exactly this header text (no padding) and data section.
std::string make_file(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

// The message of the xfuser::Error `f` throws (a test failure if it throws nothing).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const xfuser::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an xfuser::Error";
  return "";
}

// Whether `p` lies in a mapping of `file` (read from /proc/self/maps).
int count_mappings(const fs::path& file, const void* p = nullptr) {
  const std::string target = fs::canonical(file).string();
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int count = 0;
  while (std::getline(maps, line)) {
    std::istringstream ls(line);
    std::string range, perms, offset, dev, inode, name;
    ls >> range >> perms >> offset >> dev >> inode;
    std::getline(ls >> std::ws, name);
    if (name != target) continue;
    const auto dash = range.find('-');
    const uintptr_t lo = std::stoull(range.substr(0, dash), nullptr, 16);
    const uintptr_t hi = std::stoull(range.substr(dash + 1), nullptr, 16);
    const auto addr = reinterpret_cast<uintptr_t>(p);
    if (p == nullptr || (addr >= lo && addr < hi)) ++count;
  }
  return count;
}

TensorMap every_dtype() {
  at::manual_seed(7);
  return {
      {"f64", at::randn({3, 5}, at::kDouble)},
      {"f32", at::randn({2, 3, 4})},
      {"f16", at::randn({7}).to(at::kHalf)},
      {"bf16", at::randn({4, 4}).to(at::kBFloat16)},
      {"i64", at::randint(-(int64_t{1} << 40), int64_t{1} << 40, {5}, at::kLong)},
      {"i32", at::randint(-100000, 100000, {2, 2}, at::kInt)},
      {"i16", at::randint(-30000, 30000, {3}, at::kShort)},
      {"i8", at::randint(-128, 127, {9}, at::kChar)},
      {"u8", at::randint(0, 255, {2, 5}, at::kByte)},
      {"bool", at::randint(0, 2, {11}, at::kLong).to(at::kBool)},
      {"scalar", at::scalar_tensor(3.5, at::kFloat)},
      {"empty", at::empty({0, 3}, at::kFloat)},
  };
}

// ---- round trip and byte layout ------------------------------------------------------------

TEST(Safetensors, RoundTripsEveryDtype) {
  TempDir dir;
  const auto tensors = every_dtype();
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "x\"y\n"}};
  save_safetensors((dir / "a.safetensors").string(), tensors, metadata);
  SafetensorsFile f((dir / "a.safetensors").string());
  EXPECT_EQ(f.metadata(), metadata);
  ASSERT_EQ(f.names().size(), tensors.size());
  const std::map<std::string, std::string> stored = {
      {"f64", "F64"}, {"f32", "F32"},   {"f16", "F16"},    {"bf16", "BF16"},
      {"i64", "I64"}, {"i32", "I32"},   {"i16", "I16"},    {"i8", "I8"},
      {"u8", "U8"},   {"bool", "BOOL"}, {"scalar", "F32"}, {"empty", "F32"}};
  for (const auto& [name, expected] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(f.contains(name));
    const auto info = f.info(name);
    EXPECT_EQ(info.dtype_name, stored.at(name));
    EXPECT_EQ(info.dtype, expected.scalar_type());
    EXPECT_EQ(info.shape, expected.sizes().vec());
    EXPECT_EQ(info.file, (dir / "a.safetensors").string());
    const at::Tensor got = f.get(name);
    EXPECT_EQ(got.scalar_type(), expected.scalar_type());
    EXPECT_EQ(got.sizes(), expected.sizes());
    EXPECT_TRUE(at::equal(got, expected));
  }
}

TEST(Safetensors, WritingTheSameTensorsTwiceGivesIdenticalBytes) {
  TempDir dir;
  save_safetensors((dir / "a.safetensors").string(), every_dtype(), {{"format", "pt"}});
  save_safetensors((dir / "b.safetensors").string(), every_dtype(), {{"format", "pt"}});
  const std::string a = read_bytes(dir / "a.safetensors");
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, read_bytes(dir / "b.safetensors"));
}

// The Python library's layout: header length a multiple of 8 (space padded), "__metadata__"
// first, data ordered by descending dtype alignment then name, header in data order.
TEST(Safetensors, LayoutFollowsThePythonWriter) {
  TempDir dir;
  const auto path = dir / "a.safetensors";
  save_safetensors(path.string(),
                   {{"b", at::ones({3}, at::kHalf)},
                    {"a", at::ones({1}, at::kByte)},
                    {"c", at::ones({2}, at::kDouble)},
                    {"d", at::ones({2}, at::kFloat)},
                    {"e", at::ones({1}, at::kHalf)}},
                   {{"format", "pt"}});
  const std::string bytes = read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  const std::string header = bytes.substr(8, n);
  const std::string expected =
      R"({"__metadata__":{"format":"pt"},"c":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},)"
      R"("d":{"dtype":"F32","shape":[2],"data_offsets":[16,24]},)"
      R"("b":{"dtype":"F16","shape":[3],"data_offsets":[24,30]},)"
      R"("e":{"dtype":"F16","shape":[1],"data_offsets":[30,32]},)"
      R"("a":{"dtype":"U8","shape":[1],"data_offsets":[32,33]}})";
  EXPECT_EQ(header.substr(0, expected.size()), expected);
  EXPECT_EQ(header.find_first_not_of(' ', expected.size()), std::string::npos);
  EXPECT_LT(header.size() - expected.size(), 8u);
  EXPECT_EQ(bytes.size(), 8 + n + 33);
}

TEST(Safetensors, WritesNonContiguousTensorsAsTheirValues) {
  TempDir dir;
  const auto path = dir / "t.safetensors";
  at::Tensor base = at::arange(12, at::kFloat).reshape({3, 4});
  save_safetensors(path.string(), {{"t", base.t()}, {"n", base.narrow(1, 1, 2)}});
  SafetensorsFile f(path.string());
  EXPECT_TRUE(at::equal(f.get("t"), base.t()));
  EXPECT_TRUE(at::equal(f.get("n"), base.narrow(1, 1, 2)));
}

TEST(Safetensors, WriterLeavesNoTemporaryFiles) {
  TempDir dir;
  save_safetensors((dir / "a.safetensors").string(), every_dtype());
  save_safetensors((dir / "a.safetensors").string(), {{"x", at::ones({2})}});  // replaces
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    ++files;
    EXPECT_EQ(e.path().filename(), "a.safetensors");
  }
  EXPECT_EQ(files, 1);
  EXPECT_EQ(SafetensorsFile((dir / "a.safetensors").string()).names(),
            std::vector<std::string>{"x"});
}

TEST(Safetensors, WriterErrors) {
  TempDir dir;
  const auto path = (dir / "a.safetensors").string();
  EXPECT_THAT(error_of([&] {
                save_safetensors(path, {{"c", at::ones({2}, at::kComplexFloat)}});
              }),
              HasSubstr("tensor 'c' has dtype ComplexFloat"));
  EXPECT_THAT(error_of([&] {
                save_safetensors(path, {{"u", at::Tensor()}});
              }),
              HasSubstr("tensor 'u' is undefined"));
  EXPECT_THAT(error_of([&] {
                save_safetensors(path, {{"__metadata__", at::ones({1})}});
              }),
              HasSubstr("__metadata__"));
  const auto missing = (dir / "no-such-folder" / "a.safetensors").string();
  EXPECT_THAT(error_of([&] {
                save_safetensors(missing, {{"x", at::ones({1})}});
              }),
              HasSubstr("cannot create " + missing));
  EXPECT_FALSE(fs::exists(path));
}

// ---- zero copy ---------------------------------------------------------------------------------

TEST(Safetensors, ViewsPointIntoTheMappingAndKeepItAlive) {
  TempDir dir;
  const auto path = dir / "a.safetensors";
  const at::Tensor expected = at::randn({64, 33});
  save_safetensors(path.string(), {{"w", expected}, {"v", at::arange(10, at::kLong)}});
  at::Tensor w;
  {
    SafetensorsFile f(path.string());
    w = f.get("w");
    EXPECT_EQ(count_mappings(path, w.data_ptr()), 1) << "w is not a view of the file mapping";
    EXPECT_EQ(count_mappings(path, f.get("v").data_ptr()), 1);
  }
  // The SafetensorsFile is gone; the view still owns the mapping.
  EXPECT_EQ(count_mappings(path), 1);
  EXPECT_TRUE(at::equal(w, expected));
  w = at::Tensor();
  EXPECT_EQ(count_mappings(path), 0) << "the mapping outlived its last view";
}

TEST(Safetensors, WritesToAViewAreCopyOnWrite) {
  TempDir dir;
  const auto path = dir / "a.safetensors";
  save_safetensors(path.string(), {{"w", at::ones({16})}});
  const std::string before = read_bytes(path);
  {
    SafetensorsFile f(path.string());
    at::Tensor w = f.get("w");
    w.fill_(5.0f);
    EXPECT_EQ(w[3].item<float>(), 5.0f);
  }
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_TRUE(at::equal(SafetensorsFile(path.string()).get("w"), at::ones({16})));
}

TEST(Safetensors, UnalignedDataIsCopied) {
  TempDir dir;
  const auto path = dir / "u.safetensors";
  // An F32 tensor 2 bytes past a 4-byte boundary: a header of any length is legal.
  const std::vector<float> values = {1.5f, -2.0f, 3.25f};
  std::string data(1, '\x7f');
  data.append(reinterpret_cast<const char*>(values.data()), 12);
  std::string header = R"({"pad":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("x":{"dtype":"F32","shape":[3],"data_offsets":[1,13]}})";
  while ((8 + header.size() + 1) % 4 != 2) header += ' ';
  write_bytes(path, make_file(header, data));
  SafetensorsFile f(path.string());
  const at::Tensor x = f.get("x");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x.data_ptr()) % 4, 0u);
  EXPECT_TRUE(at::equal(x, at::tensor(values)));
  EXPECT_TRUE(at::equal(f.get_slice("x", 0, 1, 2), at::tensor({-2.0f, 3.25f})));
  EXPECT_EQ(f.get("pad").item<uint8_t>(), 0x7f);
}

TEST(Safetensors, EmptyTensorsAreLegal) {
  TempDir dir;
  const auto path = dir / "e.safetensors";
  write_bytes(path, make_file(R"({"e":{"dtype":"F16","shape":[4,0,2],"data_offsets":[0,0]},)"
                              R"("s":{"dtype":"I32","shape":[],"data_offsets":[0,4]}})",
                              std::string("\x2a\0\0\0", 4)));
  SafetensorsFile f(path.string());
  EXPECT_EQ(f.get("e").sizes(), (std::vector<int64_t>{4, 0, 2}));
  EXPECT_EQ(f.get("e").scalar_type(), at::kHalf);
  EXPECT_EQ(f.get("s").dim(), 0);
  EXPECT_EQ(f.get("s").item<int32_t>(), 42);
}

TEST(Safetensors, SliceAlongDim0IsAZeroCopyViewOfThoseRows) {
  TempDir dir;
  const auto path = dir / "s.safetensors";
  const at::Tensor w = at::randn({8, 5, 3});
  save_safetensors(path.string(), {{"w", w}});
  SafetensorsFile f(path.string());
  const at::Tensor rows = f.get_slice("w", 0, 2, 3);
  EXPECT_EQ(rows.sizes(), (std::vector<int64_t>{3, 5, 3}));
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_TRUE(at::equal(rows, w.narrow(0, 2, 3)));
  EXPECT_EQ(static_cast<const char*>(rows.data_ptr()),
            static_cast<const char*>(f.get("w").data_ptr()) + 2 * 5 * 3 * 4);
  EXPECT_EQ(count_mappings(path, rows.data_ptr()), 1);

  const at::Tensor cols = f.get_slice("w", 1, 1, 3);
  EXPECT_TRUE(at::equal(cols, w.narrow(1, 1, 3)));
  EXPECT_TRUE(at::equal(f.get_slice("w", -1, 2, 1), w.narrow(2, 2, 1)));
  EXPECT_EQ(f.get_slice("w", 0, 8, 0).size(0), 0);
}

TEST(Safetensors, SliceOutOfRangeNamesTheTensor) {
  TempDir dir;
  const auto path = (dir / "s.safetensors").string();
  save_safetensors(path, {{"w", at::zeros({4, 2})}});
  SafetensorsFile f(path);
  EXPECT_THAT(error_of([&] { f.get_slice("w", 0, 3, 2); }),
              HasSubstr("slice [3, 5) of dim 0 is out of range for tensor 'w' of shape [4, 2]"));
  EXPECT_THAT(error_of([&] { f.get_slice("w", 2, 0, 1); }), HasSubstr("has no dim 2"));
  EXPECT_THAT(error_of([&] { f.get("nope"); }), HasSubstr("tensor 'nope' not found in " + path));
}

// ---- fp8 ---------------------------------------------------------------------------------------

class Fp8 : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string data;
    for (int i = 0; i < 512; ++i) data.push_back(static_cast<char>(i & 0xFF));
    write_bytes(dir_ / "f8.safetensors",
                make_file(R"({"e4m3":{"dtype":"F8_E4M3","shape":[256],"data_offsets":[0,256]},)"
                          R"("e5m2":{"dtype":"F8_E5M2","shape":[16,16],"data_offsets":[256,512]}})",
                          data));
    file_ = std::make_unique<SafetensorsFile>((dir_ / "f8.safetensors").string());
  }
  // Decoded values as float32 (on libtorch >= 2.1 the stored type converts exactly).
  std::vector<float> values(const std::string& name) {
    at::Tensor t = file_->get(name).to(at::kFloat).contiguous().reshape({-1});
    return {t.data_ptr<float>(), t.data_ptr<float>() + t.numel()};
  }
  TempDir dir_;
  std::unique_ptr<SafetensorsFile> file_;
};

TEST_F(Fp8, E4M3DecodesBitExact) {
  EXPECT_EQ(file_->info("e4m3").dtype_name, "F8_E4M3");
  const auto v = values("e4m3");
  ASSERT_EQ(v.size(), 256u);
  EXPECT_EQ(v[0x00], 0.0f);
  EXPECT_TRUE(std::signbit(v[0x80]) && v[0x80] == 0.0f);
  EXPECT_EQ(v[0x38], 1.0f);  // 0.0111.000: 2^(7-7)
  EXPECT_EQ(v[0x40], 2.0f);  // 0.1000.000
  EXPECT_EQ(v[0x3C], 1.5f);  // 0.0111.100
  EXPECT_EQ(v[0xB8], -1.0f);
  EXPECT_EQ(v[0x7E], 448.0f);  // 0.1111.110: 1.75 * 2^8, the largest finite value
  EXPECT_EQ(v[0xFE], -448.0f);
  EXPECT_EQ(v[0x01], std::ldexp(1.0f, -9));  // smallest subnormal: 1/8 * 2^-6
  EXPECT_EQ(v[0x07], std::ldexp(7.0f, -9));  // largest subnormal
  EXPECT_EQ(v[0x08], std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(v[0x78], 256.0f);                // 0.1111.000: e4m3fn has no infinity
  EXPECT_TRUE(std::isnan(v[0x7F]));
  EXPECT_TRUE(std::isnan(v[0xFF]));
  int nans = 0;
  for (float x : v) nans += std::isnan(x) ? 1 : 0;
  EXPECT_EQ(nans, 2);
  // Positive codes increase strictly; negative codes mirror them.
  for (int b = 1; b < 0x7F; ++b) EXPECT_LT(v[b - 1], v[b]) << b;
  for (int b = 0; b < 0x7F; ++b) EXPECT_EQ(v[b | 0x80], -v[b]) << b;
}

TEST_F(Fp8, E5M2DecodesBitExact) {
  EXPECT_EQ(file_->info("e5m2").dtype_name, "F8_E5M2");
  EXPECT_EQ(file_->info("e5m2").shape, (std::vector<int64_t>{16, 16}));
  const auto v = values("e5m2");
  ASSERT_EQ(v.size(), 256u);
  EXPECT_EQ(v[0x3C], 1.0f);  // 0.01111.00: 2^(15-15)
  EXPECT_EQ(v[0x3E], 1.5f);
  EXPECT_EQ(v[0xBC], -1.0f);
  EXPECT_EQ(v[0x7B], 57344.0f);               // 0.11110.11: 1.75 * 2^15
  EXPECT_EQ(v[0x01], std::ldexp(1.0f, -16));  // smallest subnormal: 1/4 * 2^-14
  EXPECT_EQ(v[0x04], std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(v[0x7C], std::numeric_limits<float>::infinity());
  EXPECT_EQ(v[0xFC], -std::numeric_limits<float>::infinity());
  for (int b : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}) EXPECT_TRUE(std::isnan(v[b])) << b;
  for (int b = 1; b < 0x7D; ++b) EXPECT_LT(v[b - 1], v[b]) << b;
  for (int b = 0; b < 0x7C; ++b) EXPECT_EQ(v[b | 0x80], -v[b]) << b;
}

TEST_F(Fp8, SlicesDecodeOnlyTheirRows) {
  at::Tensor rows = file_->get_slice("e5m2", 0, 3, 2).to(at::kFloat);
  EXPECT_EQ(rows.sizes(), (std::vector<int64_t>{2, 16}));
  EXPECT_EQ(rows[0][12].item<float>(), 1.0f);  // byte 0x3C = 3 * 16 + 12
  EXPECT_TRUE(at::equal(rows, file_->get("e5m2").to(at::kFloat).narrow(0, 3, 2)));
}

// ---- files written by the Python library -------------------------------------------------------

// Re-saving every tensor of a file the Python library wrote reproduces it byte for byte (all
// fixtures carry at most one metadata key, so the Python writer's HashMap order is fixed).
void expect_identical_resave(const fs::path& original) {
  SCOPED_TRACE(original.string());
  SafetensorsFile f(original.string());
  TensorMap tensors;
  for (const auto& name : f.names()) tensors[name] = f.get(name);
  TempDir dir;
  save_safetensors((dir / "resaved.safetensors").string(), tensors, f.metadata());
  const std::string a = read_bytes(original);
  const std::string b = read_bytes(dir / "resaved.safetensors");
  EXPECT_EQ(a.size(), b.size());
  EXPECT_TRUE(a == b) << "re-saved file differs from the Python library's";
}

TEST(SafetensorsPython, OpensTheFluxFixture) {
  const auto path = xfuser::testing::fixtures_dir() /
                    "diffusers-v0.33.1/flux-tiny-s1/diffusion_pytorch_model.safetensors";
  XF_REQUIRE_FIXTURE(path);
  SafetensorsFile f(path.string());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_TRUE(f.contains("context_embedder.weight"));
  EXPECT_EQ(f.info("context_embedder.weight").shape, (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(f.info("context_embedder.weight").dtype_name, "F32");
  int64_t numel = 0;
  for (const auto& name : f.names()) numel += f.get(name).numel();
  EXPECT_EQ(8 + 6400 + numel * 4, static_cast<int64_t>(fs::file_size(path)));
  EXPECT_TRUE(at::isfinite(f.get("context_embedder.weight")).all().item<bool>());
  expect_identical_resave(path);
}

TEST(SafetensorsPython, ResavesMixedDtypeAndMetadataFreeFilesIdentically) {
  const auto root = xfuser::testing::fixtures_dir();
  const auto output = root / "diffusers-v0.33.1/flux-tiny-s1/output.safetensors";
  XF_REQUIRE_FIXTURE(output);
  // F64 "sample_f64" is stored before F32 "sample": dtype order first, then name.
  SafetensorsFile f(output.string());
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_EQ(f.info("sample_f64").dtype, at::kDouble);
  expect_identical_resave(output);
  expect_identical_resave(root / "diffusers-v0.33.1/flux-tiny-s1/inputs.safetensors");
  const auto clip = root / "transformers-v4.44.2/clip_text-tiny-s1/model.safetensors";
  XF_REQUIRE_FIXTURE(clip);
  expect_identical_resave(clip);
}

// ---- malformed files: one test per check -------------------------------------------------------

class Malformed : public ::testing::Test {
 protected:
  // Writes `bytes` and returns the error opening it raises.
  std::string open_error(const std::string& bytes) {
    write_bytes(path_, bytes);
    return error_of([&] { SafetensorsFile f(path_.string()); });
  }
  std::string header_error(const std::string& header, size_t data_bytes = 64) {
    return open_error(make_file(header, std::string(data_bytes, '\0')));
  }
  TempDir dir_;
  fs::path path_ = dir_ / "bad.safetensors";
};

TEST_F(Malformed, MissingFile) {
  const auto missing = (dir_ / "missing.safetensors").string();
  EXPECT_THAT(error_of([&] { SafetensorsFile f(missing); }),
              HasSubstr("cannot open safetensors file " + missing));
}

TEST_F(Malformed, ShorterThanEightBytes) {
  EXPECT_THAT(open_error(std::string("\x02\0\0\0", 4)),
              HasSubstr(path_.string() + ": not a safetensors file: 4 "
                                         "bytes, shorter than the 8-byte header length"));
  EXPECT_THAT(open_error(""), HasSubstr("0 bytes, shorter"));
}

TEST_F(Malformed, HeaderLengthBeyondTheFile) {
  EXPECT_THAT(open_error(le64(100) + "{}"),
              HasSubstr(path_.string() +
                        ": safetensors header length 100 goes beyond the end of the file (10 "
                        "bytes)"));
  EXPECT_THAT(open_error(le64(~uint64_t{0}) + "{}"), HasSubstr("goes beyond the end"));
}

TEST_F(Malformed, HeaderNotJson) {
  EXPECT_THAT(header_error(R"({"a": {"dtype": "F32",)"),
              HasSubstr(path_.string() + ": safetensors header is not valid JSON"));
  EXPECT_THAT(header_error("\xff\xfe{}"), HasSubstr("not valid JSON"));
}

TEST_F(Malformed, HeaderNotAnObject) {
  EXPECT_THAT(header_error("[1, 2]"),
              HasSubstr(path_.string() + ": safetensors header must be a JSON object, got array"));
}

TEST_F(Malformed, EntryNotAnObject) {
  EXPECT_THAT(header_error(R"({"w": 3})"),
              HasSubstr(path_.string() + ": tensor 'w': header entry must be an object"));
}

TEST_F(Malformed, UnknownDtypeListsTheKnownOnes) {
  const auto msg = header_error(R"({"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})");
  EXPECT_THAT(msg, HasSubstr(path_.string() + ": tensor 'w': unknown dtype 'F128' (known: BOOL, "
                                              "U8, I8, F8_E5M2, F8_E4M3, I16, F16, BF16, I32, "
                                              "F32, F64, I64)"));
}

TEST_F(Malformed, DataOffsetsNotAPair) {
  EXPECT_THAT(header_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})"),
              HasSubstr("tensor 'w': data_offsets must be [begin, end] with 0 <= begin <= end, "
                        "got [0]"));
  EXPECT_THAT(header_error(R"({"w":{"dtype":"F32","shape":[1]}})"),
              HasSubstr("tensor 'w': data_offsets must be [begin, end]"));
  EXPECT_THAT(header_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})"),
              HasSubstr("got [-4,0]"));
}

TEST_F(Malformed, DataOffsetsBeginAfterEnd) {
  EXPECT_THAT(header_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})"),
              HasSubstr(path_.string() + ": tensor 'w': data_offsets must be [begin, end] with "
                                         "0 <= begin <= end, got [8,4]"));
}

TEST_F(Malformed, DataOffsetsOutsideTheDataSection) {
  EXPECT_THAT(header_error(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[56,72]}})", 64),
              HasSubstr(path_.string() + ": tensor 'w': data_offsets [56, 72] lie outside the "
                                         "data section (64 bytes)"));
}

TEST_F(Malformed, OverlappingTensors) {
  const auto msg = header_error(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                R"("b":{"dtype":"F32","shape":[4],"data_offsets":[12,28]}})");
  EXPECT_THAT(msg, HasSubstr(path_.string() + ": tensors 'a' (data_offsets [0, 16]) and 'b' "
                                              "(data_offsets [12, 28]) overlap"));
}

TEST_F(Malformed, ShapeDoesNotMatchTheByteRange) {
  EXPECT_THAT(
      header_error(R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,16]}})"),
      HasSubstr(path_.string() + ": tensor 'w': shape [2, 3] x BF16 (2 bytes) needs 12 bytes but "
                                 "data_offsets [0, 16] span 16 bytes"));
  EXPECT_THAT(header_error(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],)"
                           R"("data_offsets":[0,16]}})"),
              HasSubstr("needs more than 2^64 bytes"));
}

TEST_F(Malformed, DuplicateTensorNames) {
  const auto msg = header_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                R"("v":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                                R"("w":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})");
  EXPECT_THAT(msg, HasSubstr(path_.string() +
                             ": tensor 'w' appears more than once in the safetensors header"));
}

TEST_F(Malformed, NegativeDimension) {
  EXPECT_THAT(header_error(R"({"w":{"dtype":"F32","shape":[2,-2],"data_offsets":[0,16]}})"),
              HasSubstr(path_.string() + ": tensor 'w': negative dimension -2 in shape [2,-2]"));
}

TEST_F(Malformed, NonIntegerShape) {
  EXPECT_THAT(header_error(R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})"),
              HasSubstr("tensor 'w': shape [2.5] must hold integers"));
}

TEST_F(Malformed, MetadataMustHoldStrings) {
  EXPECT_THAT(header_error(R"({"__metadata__":{"total":3}})"),
              HasSubstr(path_.string() + ": __metadata__ entry 'total' must be a string"));
}

// ---- sharded checkpoints and discovery ---------------------------------------------------------

class Sharded : public ::testing::Test {
 protected:
  void SetUp() override {
    at::manual_seed(3);
    a_ = at::randn({4, 3});
    b_ = at::randn({5}).to(at::kBFloat16);
    c_ = at::randint(0, 9, {2, 2}, at::kLong);
    save_safetensors((dir_ / "model-00001-of-00002.safetensors").string(), {{"a", a_}, {"b", b_}});
    save_safetensors((dir_ / "model-00002-of-00002.safetensors").string(), {{"c", c_}});
    write_index({{"a", "model-00001-of-00002.safetensors"},
                 {"b", "model-00001-of-00002.safetensors"},
                 {"c", "model-00002-of-00002.safetensors"}});
  }
  void write_index(const nlohmann::json& weight_map, const std::string& name = kIndex) {
    nlohmann::json index = {{"metadata", {{"total_size", 78}}}, {"weight_map", weight_map}};
    write_bytes(dir_ / name, index.dump(2));
  }
  std::string index_path() const { return (dir_ / kIndex).string(); }
  static constexpr const char* kIndex = "diffusion_pytorch_model.safetensors.index.json";
  TempDir dir_;
  at::Tensor a_, b_, c_;
};

TEST_F(Sharded, LoadsEveryTensorFromItsShard) {
  ShardedCheckpoint ckpt(index_path());
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(ckpt.shards().size(), 2u);
  EXPECT_TRUE(at::equal(ckpt.get("a"), a_));
  EXPECT_TRUE(at::equal(ckpt.get("b"), b_));
  EXPECT_TRUE(at::equal(ckpt.get("c"), c_));
  EXPECT_TRUE(at::equal(ckpt.get_slice("a", 0, 1, 2), a_.narrow(0, 1, 2)));
  EXPECT_EQ(ckpt.info("c").file, (dir_ / "model-00002-of-00002.safetensors").string());
  EXPECT_EQ(ckpt.info("b").dtype_name, "BF16");
  EXPECT_FALSE(ckpt.contains("d"));
  EXPECT_THAT(error_of([&] { ckpt.get("d"); }),
              HasSubstr("tensor 'd' not found in " + index_path()));
  // Each shard is mapped once, however many tensors it serves.
  EXPECT_EQ(count_mappings(dir_ / "model-00001-of-00002.safetensors"), 1);
  EXPECT_EQ(count_mappings(dir_ / "model-00002-of-00002.safetensors"), 1);
}

TEST_F(Sharded, MissingShardFile) {
  write_index({{"a", "model-00001-of-00002.safetensors"}, {"z", "gone.safetensors"}});
  EXPECT_THAT(error_of([&] { ShardedCheckpoint c(index_path()); }),
              HasSubstr(index_path() +
                        ": shard 'gone.safetensors' (listed for 1 tensors, e.g. "
                        "'z') not found at " +
                        (dir_ / "gone.safetensors").string()));
}

TEST_F(Sharded, TensorAbsentFromItsShard) {
  write_index(
      {{"a", "model-00001-of-00002.safetensors"}, {"c", "model-00001-of-00002.safetensors"}});
  EXPECT_THAT(error_of([&] { ShardedCheckpoint c(index_path()); }),
              HasSubstr(index_path() + ": 1 tensors listed in weight_map are absent from their "
                                       "shard: 'c' (in model-00001-of-00002.safetensors)"));
}

TEST_F(Sharded, BadIndexJson) {
  write_bytes(dir_ / kIndex, "{\"weight_map\": {\"a\": ");
  EXPECT_THAT(error_of([&] { ShardedCheckpoint c(index_path()); }),
              HasSubstr(index_path() + ": not valid JSON"));
  write_bytes(dir_ / kIndex, R"({"metadata": {}})");
  EXPECT_THAT(error_of([&] { ShardedCheckpoint c(index_path()); }),
              HasSubstr(index_path() + ": \"weight_map\" is missing or not an object"));
  write_bytes(dir_ / kIndex, R"({"weight_map": {"a": 1}})");
  EXPECT_THAT(error_of([&] { ShardedCheckpoint c(index_path()); }),
              HasSubstr("weight_map entry for tensor 'a' must be a file name, got 1"));
}

TEST_F(Sharded, OpenCheckpointAcceptsIndexFileAndFolder) {
  auto from_index = open_checkpoint(index_path());
  EXPECT_NE(dynamic_cast<ShardedCheckpoint*>(from_index.get()), nullptr);
  auto from_folder = open_checkpoint(dir_.path().string());
  EXPECT_EQ(from_folder->describe(), index_path());
  EXPECT_TRUE(at::equal(from_folder->get("c"), c_));
  auto from_file = open_checkpoint((dir_ / "model-00002-of-00002.safetensors").string());
  EXPECT_NE(dynamic_cast<SafetensorsFile*>(from_file.get()), nullptr);
}

TEST(OpenCheckpoint, FolderPrefersDiffusersNamesAndHonoursVariants) {
  TempDir dir;
  save_safetensors((dir / "model.safetensors").string(), {{"t", at::ones({1})}});
  EXPECT_EQ(open_checkpoint(dir.path().string())->describe(), (dir / "model.safetensors").string());
  save_safetensors((dir / "diffusion_pytorch_model.safetensors").string(), {{"d", at::ones({1})}});
  EXPECT_EQ(open_checkpoint(dir.path().string())->names(), std::vector<std::string>{"d"});
  save_safetensors((dir / "diffusion_pytorch_model.fp16.safetensors").string(),
                   {{"h", at::ones({1}, at::kHalf)}});
  EXPECT_EQ(open_checkpoint(dir.path().string(), "fp16")->names(), std::vector<std::string>{"h"});
  EXPECT_EQ(
      xfuser::models::checkpoint_file_names("fp16"),
      (std::vector<std::string>{"diffusion_pytorch_model.fp16.safetensors",
                                "diffusion_pytorch_model.safetensors.index.fp16.json",
                                "model.fp16.safetensors", "model.safetensors.index.fp16.json"}));
}

TEST(OpenCheckpoint, ErrorsListWhatWasLookedFor) {
  TempDir dir;
  EXPECT_THAT(error_of([&] { open_checkpoint(dir.path().string()); }),
              HasSubstr("no safetensors checkpoint in " + dir.path().string() +
                        ": looked for diffusion_pytorch_model.safetensors, "
                        "diffusion_pytorch_model.safetensors.index.json, model.safetensors, "
                        "model.safetensors.index.json"));
  EXPECT_THAT(error_of([&] { open_checkpoint(dir.path().string(), "bf16"); }),
              HasSubstr("looked for diffusion_pytorch_model.bf16.safetensors"));
  EXPECT_THAT(error_of([&] { open_checkpoint((dir / "nothing.safetensors").string()); }),
              HasSubstr("checkpoint not found: " + (dir / "nothing.safetensors").string()));
}

}  // namespace
