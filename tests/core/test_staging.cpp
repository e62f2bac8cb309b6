// Executor::allocate_staging and StagingVector (core/executor.h): the exchanges' host staging, page-locked on a device
// and slow to make there, so the exchanges recycle it. What they rely on: every block is the executor's and counted,
// a vector moved or swapped takes its blocks' allocator along (a moved-into default-made vector would otherwise copy
// through an allocator with no executor), and growing within the capacity makes nothing.
#include <doctest.h>

#include <utility>

#include "core/executor.h"
#include "kernels/executor.h"
#include "ref/cpu_executor.h"

using namespace olmoref;

TEST_CASE("StagingVector: the executor's blocks, counted; moves and swaps take the allocator along") {
  CpuExecutor ex;
  const Executor::StagingStats& st = ex.staging_stats();
  {
    StagingVector<float> a(StagingAllocator<float>(ex, "test staging"));
    a.reserve(100);
    CHECK(st.allocations == 1);
    CHECK(st.live_bytes == 400);
    StagingVector<float> b;  // default-made: an allocator with no executor
    b = std::move(a);        // takes a's block and allocator: no copy, no new block
    CHECK(st.allocations == 1);
    REQUIRE(b.get_allocator().ex == &ex);
    CHECK(b.capacity() >= 100);
    b.resize(50), b.clear(), b.resize(100);  // within the capacity: nothing made
    CHECK(st.allocations == 1);
    a = std::move(b);
    a.reserve(200);  // a new block of exactly 200, then the old one freed
    CHECK(st.allocations == 2);
    CHECK(st.live_bytes == 800);
    CHECK(st.peak_bytes == 1200);
    StagingVector<float>(a.get_allocator()).swap(a);  // the exchanges' release
    CHECK(st.live_bytes == 0);
    CHECK(a.get_allocator().ex == &ex);
    a.resize(10);
    CHECK(st.allocations == 3);
  }
  CHECK(st.live_bytes == 0);
  CHECK_FALSE(ex.staging_pinned());
  kernels::KernelExecutor host(false);  // cuda-host: ordinary memory, as the CPU's (the device's is page-locked)
  CHECK_FALSE(host.staging_pinned());
}
