// model/profiled_executor.h — an executor that times every op of another (train --profile-ops): each op waits for
// the device before and after (so the time is the op's own), and the report gives per op calls, seconds, share of
// the timed total and, where the op's arithmetic is counted, GFLOP/s. The timing changes no value: the wrapped
// executor computes exactly what it computes unwrapped.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "core/executor.h"

namespace olmoref {

class ProfiledExecutor final : public Executor {
 public:
  explicit ProfiledExecutor(std::unique_ptr<Executor> inner) : inner_(std::move(inner)) {}
  Executor& inner() { return *inner_; }
  // One table, one line per op, heaviest first.
  std::string report() const;

  std::string name() const override { return inner_->name(); }
  bool host_memory() const override { return inner_->host_memory(); }
  OLMOREF_EXECUTOR_OPS(, override)
  void synchronize() override { inner_->synchronize(); }
  int64_t memory_available() const override { return inner_->memory_available(); }
  bool staging_pinned() const override { return inner_->staging_pinned(); }

 protected:
  // The wrapped executor's staging (page-locked on a device), not the base class's malloc.
  void* staging_allocate(size_t bytes, const char* what) override { return inner_->allocate_staging(bytes, what); }
  void staging_free(void* p, size_t bytes) override { inner_->free_staging(p, bytes); }

 private:
  struct Stat {
    int64_t calls = 0;
    double seconds = 0.0, flops = 0.0;
  };
  // Runs f on the inner executor, timed between two synchronizations.
  template <class F>
  void timed(const char* op, double flops, F&& f);

  std::unique_ptr<Executor> inner_;
  std::map<std::string, Stat> stats_;
};

// FLOPs of attention over B·H·T query rows of a causal band (window 0 = full): the score and P·V products,
// 4·hd per key in forward and 8·hd per key in backward (dP, dS·K, dS^T·Q, P^T·dO).
double attention_keys(const AttentionShape& s);
// The same pairs (query, key it sees), B·H times, counted by the part a call computes (AttentionShape's parts, context
// parallelism): those of queries [q0, q1) (the forward's 4·hd each, and the dq half of the backward's) and those of
// keys [k0, k1) (the dk, dv half, 4·hd each). Over a whole instance both are attention_keys. Documents not counted.
double attention_query_pairs(const AttentionShape& s, int64_t q0, int64_t q1);
double attention_key_pairs(const AttentionShape& s, int64_t k0, int64_t k1);

}  // namespace olmoref
