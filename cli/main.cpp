// olmoref — one binary, one subcommand per job.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "cli/data_commands.h"
#include "dist/comm.h"
#include "cli/golden_commands.h"
#include "cli/commands.h"

int main(int argc, char** argv) {
#ifdef __GLIBC__
  // A fixed mmap threshold: every buffer of 1 MiB or more is its own mapping and goes back to the system when freed.
  // glibc's default raises the threshold (to 32 MiB) after the first such buffer is freed, so the unit-sized
  // gradient blocks and the checkpoint's read buffers would stay resident in the heap after use, and the per-rank
  // peak would no longer be what the memory model (train/memory_model.h) predicts and the refusal relies on.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
  CLI::App app{"olmoref: a deterministic, reproducibility-first reference trainer for Olmo 3"};
  app.require_subcommand(1);
  olmoref::register_commands(app);
  olmoref::data::register_data_commands(app);
  olmoref::register_golden_commands(app);
  olmoref::data::register_leak_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const olmoref::dist::AgreedFailure& e) {
    // Every rank stops here alike (dist/comm.h): each says why, then the job ends without an abort.
    if (olmoref::dist::launched_by_mpirun())
      std::fprintf(stderr, "olmoref: rank %d: fatal: %s\n", olmoref::dist::world().rank(), e.what());
    else
      std::fprintf(stderr, "olmoref: error: %s\n", e.what());
    olmoref::dist::finalize();
    return 3;
  } catch (const std::exception& e) {
    // In a multi-rank job one rank's error must end the whole job, not leave the others waiting.
    if (olmoref::dist::launched_by_mpirun()) olmoref::dist::world().abort(e.what());
    std::fprintf(stderr, "olmoref: error: %s\n", e.what());
    return 2;
  }
  olmoref::dist::finalize();
  return olmoref::command_exit_code();
}
