#include "train/optimizer.h"

#include <algorithm>

namespace llmt {

AdamW::AdamW(ParamStore& store, const TrainConfig& train) : store_(store) {
  hp_.beta1 = train.beta1;
  hp_.beta2 = train.beta2;
  hp_.eps = train.eps;
  const auto& excl = train.weight_decay_exclude;
  for (const ParamInfo& p : store.infos()) {
    const bool decay =
        train.weight_decay > 0 && std::find(excl.begin(), excl.end(), param_kind_name(p.kind)) == excl.end();
    decays_.push_back(decay);
    if (!runs_.empty() && runs_.back().decay == decay)
      runs_.back().numel += p.numel;
    else
      runs_.push_back(Run{p.offset, p.numel, decay});
  }
  hp_.weight_decay = train.weight_decay;
  m_ = OwnedTensor(store.backend(), store.dtype(), {store.total()});
  v_ = OwnedTensor(store.backend(), store.dtype(), {store.total()});
  store.backend().fill_zero(*m_);
  store.backend().fill_zero(*v_);
}

void AdamW::step(double lr, double grad_scale) {
  ++steps_taken_;
  const size_t es = dtype_size(store_.dtype());
  const auto slice = [&](const Tensor& t, const Run& r) {
    return Tensor(static_cast<char*>(t.data) + r.offset * es, t.dtype, {r.numel});
  };
  const Tensor working = store_.flat_working();
  for (const Run& r : runs_) {
    AdamWParams hp = hp_;
    hp.lr = lr;
    if (!r.decay) hp.weight_decay = 0;
    const Tensor working_r =
        working.data ? Tensor(static_cast<char*>(working.data) + r.offset * dtype_size(working.dtype), working.dtype,
                              {r.numel})
                     : Tensor();
    store_.backend().adamw_step(slice(store_.flat_params(), r), slice(store_.flat_grads(), r), slice(*m_, r),
                                slice(*v_, r), hp, grad_scale, steps_taken_, working_r);
  }
}

}  // namespace llmt
