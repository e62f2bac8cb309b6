// tests/dist/test_gpu_map.cpp — one rank per GPU (dist/gpu_map.h): which device a local rank picks, and which nodes'
// ranks are refused for sharing one, by hand-made slots (fake device counts and identities); the whole path through
// mpirun is tests/dist/gpu_map.sh.
#include <doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/gpu_map.h"

using olmoref::dist::GpuSlot;

namespace {
GpuSlot slot(int rank, int node, int device, const std::string& id) {
  GpuSlot s;
  s.world_rank = rank, s.node = node, s.device = device, s.id = id, s.host = "node" + std::to_string(node);
  s.name = "test GPU";
  return s;
}
std::string refusal(const std::vector<GpuSlot>& slots) {
  try {
    olmoref::dist::check_gpu_sharing(slots, false);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("a local rank drives the device of its number, wrapping over fewer devices; none visible is refused") {
  using olmoref::dist::device_for_local_rank;
  for (int r = 0; r < 8; ++r) CHECK(device_for_local_rank(r, 8) == r);
  CHECK(device_for_local_rank(3, 2) == 1);
  CHECK(device_for_local_rank(0, 1) == 0);
  CHECK_THROWS_WITH_AS(device_for_local_rank(0, 0), doctest::Contains("no CUDA device is visible"), std::runtime_error);
}

TEST_CASE("two ranks of a node on one GPU are refused, naming the ranks, the GPU and the fix") {
  // 8 ranks on one node, 8 GPUs: fine.
  std::vector<GpuSlot> eight;
  for (int r = 0; r < 8; ++r) eight.push_back(slot(r, 0, r, "GPU-" + std::to_string(r)));
  CHECK(refusal(eight).empty());
  // A launcher that gives each process its own CUDA_VISIBLE_DEVICES: every rank sees "device 0", distinct GPUs.
  std::vector<GpuSlot> visible;
  for (int r = 0; r < 4; ++r) visible.push_back(slot(r, 0, 0, "GPU-" + std::to_string(r)));
  CHECK(refusal(visible).empty());
  // Two nodes with the same GPU identities (fake ones): only ranks of one node can share.
  CHECK(refusal({slot(0, 0, 0, "fake-gpu-0"), slot(1, 1, 0, "fake-gpu-0")}).empty());
  // 3 ranks on a 2-GPU node: ranks 0 and 2 on device 0.
  const std::string why = refusal({slot(0, 0, 0, "GPU-a"), slot(1, 0, 1, "GPU-b"), slot(2, 0, 0, "GPU-a")});
  CHECK(why.find("2 ranks (0, 2) would drive one GPU on node0 (device 0") != std::string::npos);
  CHECK(why.find("3 ranks on that node, 2 GPU(s) among them") != std::string::npos);
  CHECK(why.find("--allow-shared-gpu") != std::string::npos);
  // ... on the second node of two (its ranks 4..7 on one card).
  std::vector<GpuSlot> two_nodes;
  for (int r = 0; r < 4; ++r) two_nodes.push_back(slot(r, 0, r, "GPU-n0-" + std::to_string(r)));
  for (int r = 4; r < 8; ++r) two_nodes.push_back(slot(r, 4, 0, "GPU-n1-0"));
  CHECK(refusal(two_nodes).find("4 ranks (4, 5, 6, 7) would drive one GPU on node4") == 0);
  CHECK_NOTHROW(olmoref::dist::check_gpu_sharing(two_nodes, true));
  // --transport nccl: NCCL cannot put two ranks of a communicator on one GPU, so sharing is refused even when allowed,
  // naming the way out; one rank per GPU is fine.
  CHECK_THROWS_WITH_AS(olmoref::dist::check_gpu_sharing(two_nodes, true, true),
                       doctest::Contains("4 ranks (4, 5, 6, 7) would drive one GPU on node4 (device 0, GPU-n1-0) under "
                                         "--transport nccl"),
                       std::runtime_error);
  CHECK_THROWS_WITH_AS(olmoref::dist::check_gpu_sharing(two_nodes, false, true),
                       doctest::Contains("or use --transport mpi (with --allow-shared-gpu)"), std::runtime_error);
  CHECK_NOTHROW(olmoref::dist::check_gpu_sharing(eight, true, true));
}

TEST_CASE("the slots gathered over a communicator come back whole") {
  GpuSlot mine = slot(0, 0, 3, "GPU-0123abcd-0000-1111-2222-333344445555");
  mine.host = std::string(300, 'h');  // longer than a block leaves for it: cut, never past the block
  const std::vector<GpuSlot> got = olmoref::dist::gather_gpu_slots(olmoref::dist::world(), mine);
  REQUIRE(got.size() == 1);
  CHECK(got[0].device == 3);
  CHECK(got[0].id == mine.id);
  CHECK(got[0].name == "test GPU");
  CHECK(got[0].host.size() <= 300);
}
