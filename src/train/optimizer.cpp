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
      runs_.back().numel = hi - runs_.back().offset;  // (with the zero gap before lo: it stays zero)
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
  const Tensor working = store_.flat_working();
  for (const Run& r : runs_) {
    AdamWParams hp = hp_;
    hp.lr = lr;
    if (!r.decay) hp.weight_decay = 0;
    const int64_t end = r.offset + r.numel;  // the moments start at the shard's first element
    store_.backend().adamw_step(store_.flat_params().range(r.offset, end), store_.flat_grads().range(r.offset, end),
                                m_->range(r.offset - begin_, end - begin_), v_->range(r.offset - begin_, end - begin_),
                                hp, grad_scale, steps_taken_, working.data ? working.range(r.offset, end) : Tensor());
  }
}

}  // namespace llmt
