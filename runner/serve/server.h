// `xfuser serve`: the model loaded once over every rank of an mpirun job, behind an
// OpenAI-compatible HTTP API on world rank 0 (docs/serving.md).
//
// Rank 0 serves HTTP on threads of its own and queues each request as a job (scheduler.h). Its
// main thread takes a batch of same-shape jobs at a time and hands it to every rank (a broadcast
// of the batch's inputs); every rank resolves the same request from the plan (Runner::
// resolve_request) and runs the same generation as xfuser-run would; the rank holding the
// decoded pictures sends them to rank 0, which answers. While idle rank 0 broadcasts a heartbeat
// every few seconds, so the other ranks' waits are bounded by --comm_timeout: a rank that dies or
// hangs ends the job on every rank within it, never a silent hang.
#pragma once

#include <cstdint>
#include <string>

#include "runner/run_config.h"

namespace CLI {
class App;
}

namespace xfuser::runner::serve {

struct ServeConfig {
  std::string host = "127.0.0.1";  // loopback unless told otherwise
  int port = 8000;                 // 0: any free port (written to port_file)
  std::string port_file;           // where the bound port is written once listening
  std::string api_key;             // Bearer key every endpoint but /health requires ("" = none)
  int max_queue = 64;              // queued jobs beyond which requests get 429
  int max_batch_size = 4;          // outputs generated together
  int batch_wait_ms = 20;          // how long a batch waits for more same-shape jobs
  int max_n = 8;                   // outputs one image request may ask for
  double request_timeout = 600;    // seconds an image request waits for its pictures
  int64_t max_request_bytes = 32ll << 20;  // larger bodies get 413
};

// Declares the service's flags (the run flags are declared by add_run_flags beside them).
void add_serve_flags(CLI::App& app, ServeConfig& config);

// Runs the service on this rank until a drain (SIGTERM or SIGINT to rank 0: running and queued
// work finishes, new requests get 503) and returns 0; errors are thrown as xfuser::Error.
int serve(const RunConfig& run, const ServeConfig& config);

}  // namespace xfuser::runner::serve
