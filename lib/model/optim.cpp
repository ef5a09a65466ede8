#include "model/optim.h"

#include "model/backend.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace iha {

double learning_rate(const OptimConfig& c, int64_t step, int64_t total) {
  if (step < c.warmup_steps)
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  const double span = static_cast<double>(std::max<int64_t>(1, total - c.warmup_steps));
  const double p = std::min(1.0, static_cast<double>(step - c.warmup_steps) / span);
  return c.min_lr + (c.lr - c.min_lr) * 0.5 * (1.0 + std::cos(M_PI * p));
}

template <class T>
double sum_of_squares(const T* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}

template <class T>
AdamW<T>::AdamW(std::shared_ptr<const ParamLayout> layout) : AdamW(layout, 0, layout->total(), nullptr) {}

template <class T>
AdamWStep<T> adamw_step(const OptimConfig& c, int64_t t, double lr) {
  IHA_CHECK(t >= 1, "AdamW step must be >= 1, got ", t);
  const double bc1 = 1.0 - std::pow(c.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(c.beta2, static_cast<double>(t));
  AdamWStep<T> s;
  s.b1 = static_cast<T>(c.beta1);
  s.b2 = static_cast<T>(c.beta2);
  s.step_size = static_cast<T>(lr / bc1);
  s.inv_sqrt_bc2 = static_cast<T>(1.0 / std::sqrt(bc2));
  s.eps = static_cast<T>(c.eps);
  s.decay = static_cast<T>(1.0 - lr * c.weight_decay);
  return s;
}

template <class T>
AdamW<T>::AdamW(std::shared_ptr<const ParamLayout> layout, int64_t begin, int64_t end,
                std::shared_ptr<const ModelBackend> backend)
    : AdamW(layout,
            begin < end ? std::vector<ShardRange>{{begin, end, 0}} : std::vector<ShardRange>{},
            std::max<int64_t>(0, end - begin), std::move(backend)) {
  IHA_CHECK(0 <= begin && begin <= end && end <= layout_->total(), "AdamW range [", begin, ", ", end,
            ") outside the parameter buffer of ", layout_->total(), " elements");
}

template <class T>
AdamW<T>::AdamW(std::shared_ptr<const ParamLayout> layout, std::vector<ShardRange> ranges, int64_t local_size,
                std::shared_ptr<const ModelBackend> backend)
    : layout_(std::move(layout)), be_(backend ? std::move(backend) : cpu_model_backend<T>()), ranges_(std::move(ranges)) {
  IHA_CHECK(be_->acc_dtype() == dtype_of<T>(), "AdamW<", dtype_name(dtype_of<T>()), "> on backend ", be_->name());
  for (const ShardRange& r : ranges_)
    IHA_CHECK(0 <= r.begin && r.begin <= r.end && r.end <= layout_->total() && r.local >= 0 &&
                  r.local + r.size() <= local_size,
              "AdamW range [", r.begin, ", ", r.end, ") at local ", r.local, " outside the parameter buffer of ",
              layout_->total(), " elements or the ", local_size, " local ones");
  m_ = be_->alloc_acc({local_size});
  v_ = be_->alloc_acc({local_size});
}

template <class T>
void AdamW<T>::update(const OptimConfig& c, int64_t t, double lr, Buf p, CBuf g) {
  // Each parameter's piece of a range is one run of local elements.
  for (const ShardRange& r : ranges_)
    for (const ParamSpec& s : layout_->specs()) {
      const int64_t a = std::max(s.offset, r.begin), b = std::min(s.offset + s.numel(), r.end);
      if (b <= a) continue;
      const int64_t first = r.local + (a - r.begin);
      const bool wd = s.decay && c.weight_decay > 0;
      be_->adamw(c, t, lr, wd, p.at(first), g.at(first), Buf(m_).at(first), Buf(v_).at(first), b - a);
    }
}

template <class T>
void AdamW<T>::update(const OptimConfig& c, int64_t t, double lr, ParamSet<T>& params,
                      const ParamSet<T>& grads) {
  const int64_t L = layout_->total();
  IHA_CHECK(ranges_.size() == 1 && begin() == 0 && end() == L && ranges_[0].local == 0 && params.flat().numel() == L &&
                grads.flat().numel() == L,
            "AdamW::update(ParamSet): the optimizer holds the range [", begin(), ", ", end(),
            "), not the whole buffer");
  update(c, t, lr, Buf(params.flat()), CBuf(grads.flat()));
}

template AdamWStep<float> adamw_step<float>(const OptimConfig&, int64_t, double);
template AdamWStep<double> adamw_step<double>(const OptimConfig&, int64_t, double);
template double sum_of_squares<float>(const float*, int64_t);
template double sum_of_squares<double>(const double*, int64_t);
template class AdamW<float>;
template class AdamW<double>;

}  // namespace iha
