#include "train/optimizer.h"

#include <algorithm>

#include "core/error.h"

namespace llmt {

AdamW::AdamW(ParamStore& store, const TrainConfig& train, int64_t shard_begin, int64_t shard_end)
    : store_(store), begin_(shard_begin), end_(shard_end < 0 ? store.total() : shard_end) {
  check(0 <= begin_ && begin_ <= end_ && end_ <= store.padded_total(),
        "AdamW: shard [{}, {}) is outside the {} (padded) parameter elements", begin_, end_, store.padded_total());
  hp_.beta1 = train.beta1;
  hp_.beta2 = train.beta2;
  hp_.eps = train.eps;
  const auto& excl = train.weight_decay_exclude;
  for (const ParamInfo& p : store.infos()) {
    const bool decay =
        train.weight_decay > 0 && std::find(excl.begin(), excl.end(), param_kind_name(p.kind)) == excl.end();
    decays_.push_back(decay);
    const int64_t lo = std::max(p.offset, begin_), hi = std::min(p.offset + p.numel, end_);
    if (lo >= hi) continue;  // outside the shard
    if (!runs_.empty() && runs_.back().decay == decay)
      runs_.back().numel += hi - lo;
    else
      runs_.push_back(Run{lo, hi - lo, decay});
  }
  hp_.weight_decay = train.weight_decay;
  m_ = OwnedTensor(store.backend(), store.dtype(), {end_ - begin_});
  v_ = OwnedTensor(store.backend(), store.dtype(), {end_ - begin_});
  store.backend().fill_zero(*m_);
  store.backend().fill_zero(*v_);
}

void AdamW::step(double lr, double grad_scale) {
  ++steps_taken_;
  // A run of `t` at flat offset r.offset; the moments start at the shard's first element.
  const auto slice = [](const Tensor& t, int64_t offset, int64_t numel) {
    return Tensor(static_cast<char*>(t.data) + offset * static_cast<int64_t>(dtype_size(t.dtype)), t.dtype, {numel});
  };
  const Tensor working = store_.flat_working();
  for (const Run& r : runs_) {
    AdamWParams hp = hp_;
    hp.lr = lr;
    if (!r.decay) hp.weight_decay = 0;
    store_.backend().adamw_step(slice(store_.flat_params(), r.offset, r.numel),
                                slice(store_.flat_grads(), r.offset, r.numel), slice(*m_, r.offset - begin_, r.numel),
                                slice(*v_, r.offset - begin_, r.numel), hp, grad_scale, steps_taken_,
                                working.data ? slice(working, r.offset, r.numel) : Tensor());
  }
}

}  // namespace llmt
