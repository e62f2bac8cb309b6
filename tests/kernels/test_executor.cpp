// The CUDA executor (kernels/executor.h) running its kernels on the host ("cuda-host") drives the one model
// (model/olmo3.h) to the CPU executor's bits: whole micro-batches on awkward shapes, fp32 and bf16. The device
// run of the same cases is in tests/gpu; whole training traces through cuda-host are tests/cli/executors.sh.
#include <doctest.h>

#include "core/parallel.h"
#include "kernels/executor.h"
#include "model/executors.h"
#include "ref/cpu_executor.h"
#include "tests/kernels/model_cases.h"

using namespace olmoref;

TEST_CASE("executor cuda-host: every case's loss, logits and gradients equal the CPU executor's bit for bit") {
  ThreadPool pool(2);
  CpuExecutor cpu(&pool);
  kernels::KernelExecutor host(false);
  CHECK(host.name() == "cuda-host");
  int cases = 0;
  for (const testing::ModelCase& mc : testing::model_cases()) {
    CAPTURE(mc.cfg.d_model);
    CAPTURE(static_cast<int>(mc.precision));
    const testing::ModelRun want = testing::run_model_case(mc, cpu);
    const testing::ModelRun got = testing::run_model_case(mc, host);
    CHECK(testing::model_runs_differ(want, got, ParamLayout(mc.cfg)) == "");
    ++cases;
  }
  CHECK(cases == 4);
}

TEST_CASE("executor cuda-host negative control: split-K GEMMs change the gradients") {
  CpuExecutor cpu;
  kernels::KernelExecutor host(false);
  host.set_debug_split_k(true);
  const testing::ModelCase mc = testing::model_cases()[1];  // K = 130 > one 16-wide slab
  const std::string diff = testing::model_runs_differ(testing::run_model_case(mc, cpu),
                                                      testing::run_model_case(mc, host), ParamLayout(mc.cfg));
  CHECK(diff != "");
}

TEST_CASE("make_executor: names, refusals with one line") {
  CHECK(executor_unavailable("cpu") == "");
  CHECK(executor_unavailable("cuda-host") == "");
  CHECK(executor_unavailable("tpu").find("unknown executor") != std::string::npos);
  CHECK(make_executor("cuda-host", nullptr)->name() == "cuda-host");
  const std::string why = executor_unavailable("cuda");
  if (!why.empty()) {  // no GPU here (CI): the refusal is the reason, and make_executor throws it
    CHECK(why.find('\n') == std::string::npos);
    CHECK_THROWS_WITH_AS(make_executor("cuda", nullptr), doctest::Contains(why.c_str()), std::runtime_error);
  }
}

TEST_CASE("out of memory names the tensor, its size and the remedy") {
  kernels::KernelExecutor host(false);
  CpuExecutor cpu;
  const size_t huge = static_cast<size_t>(1) << 62;
  for (Executor* ex : {static_cast<Executor*>(&host), static_cast<Executor*>(&cpu)}) {
    CAPTURE(ex->name());
    CHECK_THROWS_WITH_AS(ex->allocate(huge, "activation g (gate) of block 7"),
                         doctest::Contains("activation g (gate) of block 7 (4398046511104 MiB)"), std::runtime_error);
    CHECK_THROWS_WITH_AS(ex->allocate(huge, "x"), doctest::Contains("smaller train.micro_batch_instances"),
                         std::runtime_error);
  }
}
