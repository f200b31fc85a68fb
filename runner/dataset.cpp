#include "runner/dataset.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "backends/error.h"

namespace xfuser::runner {
namespace fs = std::filesystem;

namespace {

constexpr int kMaxJsonDepth = 64;  // deeper lines are rejected before parsing

std::string_view trim(std::string_view s) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// Shows a value in an error message: quoted, at most 40 bytes.
std::string show(std::string_view s) {
  constexpr size_t kMax = 40;
  std::string out = "'" + std::string(s.substr(0, kMax)) + "'";
  if (s.size() > kMax) out += "...";
  return out;
}

void check_prompt(std::string_view prompt, const std::string& where, const char* field) {
  XF_CHECK(!trim(prompt).empty(), where, ": empty ", field);
  XF_CHECK(prompt.find('\0') == std::string_view::npos, where, ": ", field,
           " contains a NUL character");
}

int64_t parse_seed(std::string_view text, const std::string& where) {
  const std::string_view t = trim(text);
  int64_t value = 0;
  const char* first = t.data();
  const char* last = t.data() + t.size();
  if (!t.empty() && t.front() == '+') ++first;
  auto [ptr, ec] = std::from_chars(first, last, value);
  XF_CHECK(!t.empty() && ec == std::errc() && ptr == last, where, ": seed ", show(text),
           " is not an integer in [-2^63, 2^63)");
  return value;
}

// ---- text -------------------------------------------------------------------------------------

// Calls fn(line number from 1, the line trimmed) for every line that is not blank.
template <typename F>
void for_each_line(std::string_view bytes, F&& fn) {
  int64_t line_no = 0;
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t end = bytes.find('\n', pos);
    if (end == std::string_view::npos) end = bytes.size();
    ++line_no;
    const std::string_view line = trim(bytes.substr(pos, end - pos));
    pos = end + 1;
    if (!line.empty()) fn(line_no, line);
  }
}

std::vector<DatasetRow> parse_text(std::string_view bytes) {
  std::vector<DatasetRow> rows;
  for_each_line(bytes, [&](int64_t line_no, std::string_view line) {
    DatasetRow row;
    row.prompt = std::string(line);
    row.line = line_no;
    rows.push_back(std::move(row));
  });
  return rows;
}

// ---- CSV (RFC 4180) -----------------------------------------------------------------------------

struct CsvRecord {
  std::vector<std::string> fields;
  int64_t line = 0;
  bool blank = false;  // an empty line (one empty, unquoted field)
};

class CsvReader {
 public:
  CsvReader(std::string_view bytes, const std::string& source) : s_(bytes), source_(source) {}

  // Reads the next record; false at the end of the input.
  bool next(CsvRecord& rec) {
    if (pos_ >= s_.size()) return false;
    rec.fields.clear();
    rec.line = line_;
    rec.blank = false;
    bool any_quoted = false;
    while (true) {
      std::string field;
      if (pos_ < s_.size() && s_[pos_] == '"') {
        any_quoted = true;
        const int64_t start_line = line_;
        ++pos_;
        while (true) {
          XF_CHECK(pos_ < s_.size(), source_, ":", start_line,
                   ": quoted field is never closed (a '\"' opened here has no matching '\"')");
          const char c = s_[pos_++];
          if (c == '"') {
            if (pos_ < s_.size() && s_[pos_] == '"') {
              field += '"';
              ++pos_;
              continue;
            }
            break;
          }
          if (c == '\n') ++line_;
          field += c;
        }
        XF_CHECK(pos_ >= s_.size() || s_[pos_] == ',' || s_[pos_] == '\n' ||
                     (s_[pos_] == '\r' && pos_ + 1 < s_.size() && s_[pos_ + 1] == '\n') ||
                     (s_[pos_] == '\r' && pos_ + 1 == s_.size()),
                 source_, ":", line_,
                 ": unexpected character after a closing quote (write \"\" "
                 "for a quote inside a quoted field)");
      } else {
        while (pos_ < s_.size() && s_[pos_] != ',' && s_[pos_] != '\n') {
          const char c = s_[pos_];
          if (c == '\r' && (pos_ + 1 == s_.size() || s_[pos_ + 1] == '\n')) {
            ++pos_;
            continue;  // CRLF line end
          }
          XF_CHECK(c != '"', source_, ":", line_,
                   ": quote inside an unquoted field (quote the whole field and write \"\" for "
                   "each quote in it)");
          field += c;
          ++pos_;
        }
      }
      rec.fields.push_back(std::move(field));
      if (pos_ >= s_.size()) break;
      const char sep = s_[pos_++];
      if (sep == '\r') ++pos_;  // '\r\n' after a quoted field
      if (sep == ',') continue;
      ++line_;  // '\n'
      break;
    }
    rec.blank = !any_quoted && rec.fields.size() == 1 && rec.fields[0].empty();
    return true;
  }

 private:
  std::string_view s_;
  const std::string& source_;
  size_t pos_ = 0;
  int64_t line_ = 1;
};

std::vector<DatasetRow> parse_csv(std::string_view bytes, const std::string& source) {
  CsvReader reader(bytes, source);
  CsvRecord header;
  do {
    XF_CHECK(reader.next(header), source,
             ": empty CSV (expected a header row with a `prompt` "
             "column)");
  } while (header.blank);
  int prompt_col = -1, negative_col = -1, seed_col = -1;
  std::string names;
  for (size_t i = 0; i < header.fields.size(); ++i) {
    const std::string name = lower(std::string(trim(header.fields[i])));
    names += (i ? ", " : "") + show(name);
    for (auto [key, col] :
         {std::pair{"prompt", &prompt_col}, std::pair{"negative_prompt", &negative_col},
          std::pair{"seed", &seed_col}}) {
      if (name != key) continue;
      XF_CHECK(*col < 0, source, ":", header.line, ": column `", key, "` appears twice");
      *col = static_cast<int>(i);
    }
  }
  XF_CHECK(prompt_col >= 0, source, ":", header.line,
           ": missing column `prompt` (the header row has ", names, ")");
  std::vector<DatasetRow> rows;
  CsvRecord rec;
  while (reader.next(rec)) {
    if (rec.blank) continue;
    const std::string where = source + ":" + std::to_string(rec.line);
    XF_CHECK(rec.fields.size() == header.fields.size(), where, ": ", rec.fields.size(),
             " field(s), the header has ", header.fields.size());
    DatasetRow row;
    row.line = rec.line;
    row.prompt = rec.fields[prompt_col];
    check_prompt(row.prompt, where, "prompt");
    if (negative_col >= 0 && !rec.fields[negative_col].empty()) {
      row.negative_prompt = rec.fields[negative_col];
      XF_CHECK(row.negative_prompt->find('\0') == std::string::npos, where,
               ": negative_prompt contains a NUL character");
    }
    if (seed_col >= 0 && !trim(rec.fields[seed_col]).empty()) {
      row.seed = parse_seed(rec.fields[seed_col], where);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

// ---- JSONL --------------------------------------------------------------------------------------

// Nesting depth of a JSON text (brackets outside strings), to refuse pathological lines before
// handing them to the parser.
int json_depth(std::string_view line) {
  int depth = 0, max_depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return max_depth;
}

std::vector<DatasetRow> parse_jsonl(std::string_view bytes, const std::string& source) {
  std::vector<DatasetRow> rows;
  for_each_line(bytes, [&](int64_t line_no, std::string_view line) {
    const std::string where = source + ":" + std::to_string(line_no);
    XF_CHECK(json_depth(line) <= kMaxJsonDepth, where, ": JSON nested deeper than ", kMaxJsonDepth,
             " levels");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      XF_THROW(where, ": not valid JSON (", e.what(), ")");
    }
    XF_CHECK(j.is_object(), where, ": expected a JSON object with a \"prompt\" field, got ",
             j.type_name());
    DatasetRow row;
    row.line = line_no;
    const auto prompt = j.find("prompt");
    XF_CHECK(prompt != j.end(), where, ": missing field \"prompt\"");
    XF_CHECK(prompt->is_string(), where, ": \"prompt\" must be a string, got ",
             prompt->type_name());
    row.prompt = prompt->get<std::string>();
    check_prompt(row.prompt, where, "prompt");
    const auto negative = j.find("negative_prompt");
    if (negative != j.end() && !negative->is_null()) {
      XF_CHECK(negative->is_string(), where, ": \"negative_prompt\" must be a string or null, got ",
               negative->type_name());
      row.negative_prompt = negative->get<std::string>();
      XF_CHECK(row.negative_prompt->find('\0') == std::string::npos, where,
               ": negative_prompt contains a NUL character");
    }
    const auto seed = j.find("seed");
    if (seed != j.end() && !seed->is_null()) {
      if (seed->is_number_unsigned()) {
        const auto v = seed->get<uint64_t>();
        XF_CHECK(v <= static_cast<uint64_t>(INT64_MAX), where, ": seed ", v,
                 " is out of range [-2^63, 2^63)");
        row.seed = static_cast<int64_t>(v);
      } else {
        XF_CHECK(seed->is_number_integer(), where, ": \"seed\" must be an integer or null, got ",
                 seed->dump());
        row.seed = seed->get<int64_t>();
      }
    }
    rows.push_back(std::move(row));
  });
  return rows;
}

}  // namespace

int64_t find_invalid_utf8(std::string_view s, size_t* offset) {
  int64_t line = 1;
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\n') ++line;
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // no overlong forms
      if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;  // <= U+10FFFF
    }
    bool ok = len > 0 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    }
    if (!ok) {
      if (offset) *offset = i;
      return line;
    }
    i += len;
  }
  return 0;
}

DatasetFormat dataset_format_for(const fs::path& path) {
  const std::string ext = lower(path.extension().string());
  if (ext == ".txt") return DatasetFormat::kText;
  if (ext == ".csv") return DatasetFormat::kCsv;
  if (ext == ".jsonl") return DatasetFormat::kJsonl;
  XF_THROW("--dataset_path ", path.string(), ": unknown dataset format '", ext,
           "' (expected .txt, .csv or .jsonl)");
}

std::vector<DatasetRow> parse_dataset(std::string_view bytes, DatasetFormat format,
                                      const std::string& source) {
  size_t bad = 0;
  if (const int64_t line = find_invalid_utf8(bytes, &bad)) {
    XF_THROW(source, ":", line, ": invalid UTF-8 (byte offset ", bad, ")");
  }
  if (bytes.substr(0, 3) == "\xEF\xBB\xBF") bytes.remove_prefix(3);  // byte-order mark
  std::vector<DatasetRow> rows;
  switch (format) {
    case DatasetFormat::kText:
      rows = parse_text(bytes);
      break;
    case DatasetFormat::kCsv:
      rows = parse_csv(bytes, source);
      break;
    case DatasetFormat::kJsonl:
      rows = parse_jsonl(bytes, source);
      break;
  }
  for (const auto& row : rows)
    check_prompt(row.prompt, source + ":" + std::to_string(row.line), "prompt");
  XF_CHECK(!rows.empty(), source, ": empty dataset (no prompt in it)");
  return rows;
}

std::vector<DatasetRow> read_dataset(const fs::path& path) {
  const DatasetFormat format = dataset_format_for(path);
  std::error_code ec;
  XF_CHECK(!fs::is_directory(path, ec), "--dataset_path ", path.string(),
           " is a folder, not a file");
  std::ifstream in(path, std::ios::binary);
  XF_CHECK(in.good(), "--dataset_path ", path.string(), " cannot be read: ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_dataset(ss.str(), format, path.string());
}

}  // namespace xfuser::runner
