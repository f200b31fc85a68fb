// A minimal NVTX tool for tests: loaded by the NVTX loader through NVTX_INJECTION64_PATH, it
// takes the domain calls and appends one line per call to $XFUSER_TEST_NVTX_LOG:
//   domain <name> | category <id> <name> | push <thread> <category id> <message> | pop <thread>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include <nvtx3/nvToolsExt.h>

namespace {

std::mutex g_mutex;
FILE* g_log = nullptr;
int g_domain_tag = 0;  // the one domain handle this tool hands out

void write_line(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_log == nullptr) return;
  std::fputs((line + "\n").c_str(), g_log);
  std::fflush(g_log);
}

std::string thread_tag() {
  return std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id()));
}

nvtxDomainHandle_t NVTX_API domain_create(const char* name) {
  write_line(std::string("domain ") + name);
  return reinterpret_cast<nvtxDomainHandle_t>(&g_domain_tag);
}

void NVTX_API name_category(nvtxDomainHandle_t, uint32_t id, const char* name) {
  write_line("category " + std::to_string(id) + " " + name);
}

int NVTX_API range_push(nvtxDomainHandle_t, const nvtxEventAttributes_t* attr) {
  const char* message =
      attr->messageType == NVTX_MESSAGE_TYPE_ASCII ? attr->message.ascii : "<not ascii>";
  write_line("push " + thread_tag() + " " + std::to_string(attr->category) + " " + message);
  return 0;
}

int NVTX_API range_pop(nvtxDomainHandle_t) {
  write_line("pop " + thread_tag());
  return 0;
}

template <typename F>
void install(NvtxFunctionTable table, unsigned int size, unsigned int id, F fn) {
  if (id < size && table[id] != nullptr) *table[id] = reinterpret_cast<NvtxFunctionPointer>(fn);
}

}  // namespace

extern "C" NVTX_DYNAMIC_EXPORT int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_table) {
  const char* path = std::getenv("XFUSER_TEST_NVTX_LOG");
  if (path == nullptr || (g_log = std::fopen(path, "a")) == nullptr) return 0;
  const auto* callbacks =
      static_cast<const NvtxExportTableCallbacks*>(get_table(NVTX_ETID_CALLBACKS));
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (callbacks == nullptr ||
      !callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) || table == nullptr) {
    return 0;
  }
  install(table, size, NVTX_CBID_CORE2_DomainCreateA, &domain_create);
  install(table, size, NVTX_CBID_CORE2_DomainNameCategoryA, &name_category);
  install(table, size, NVTX_CBID_CORE2_DomainRangePushEx, &range_push);
  install(table, size, NVTX_CBID_CORE2_DomainRangePop, &range_pop);
  return 1;
}
