#include "model/params.h"

#include <algorithm>

#include "core/error.h"

namespace iha {

void ParamLayout::add(const std::string& name, Shape shape, bool decay) {
  IHA_CHECK(!contains(name), "parameter '", name, "' registered twice");
  ParamSpec s;
  s.name = name;
  s.shape = std::move(shape);
  s.decay = decay;
  s.offset = total_;
  total_ += s.numel();
  specs_.push_back(std::move(s));
}

void ParamLayout::add_split(const std::string& name, Shape shape, bool decay, Shape global, Shape offset) {
  IHA_CHECK(global.size() == shape.size() && offset.size() == shape.size(), "parameter '", name,
            "': shard, global shape and offset differ in rank");
  for (size_t k = 0; k < shape.size(); ++k)
    IHA_CHECK(offset[k] >= 0 && offset[k] + shape[k] <= global[k], "parameter '", name, "': shard outside the global tensor");
  add(name, std::move(shape), decay);
  specs_.back().global_shape = std::move(global);
  specs_.back().global_offset = std::move(offset);
}

int64_t ParamSpec::global_index(int64_t i) const {
  if (!split()) return i;
  // Row-major: peel local coordinates from the last dimension, shift them, re-linearise.
  int64_t g = 0, stride = 1;
  for (size_t k = shape.size(); k-- > 0;) {
    const int64_t coord = i % shape[k] + global_offset[k];
    i /= shape[k];
    g += coord * stride;
    stride *= global_shape[k];
  }
  return g;
}

size_t ParamLayout::index(const std::string& name) const {
  for (size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].name == name) return i;
  IHA_FAIL("the model has no parameter named '", name, "'");
}

bool ParamLayout::contains(const std::string& name) const {
  for (const auto& s : specs_)
    if (s.name == name) return true;
  return false;
}

template <class T>
ParamSet<T>::ParamSet(std::shared_ptr<const ParamLayout> layout, int64_t min_storage, Device device)
    : layout_(std::move(layout)) {
  const int64_t total = layout_->total();
  storage_ = Tensor({std::max(total, min_storage)}, dtype_of<T>(), device);
  flat_ = Tensor::view(storage_.template data<T>(), {total}, dtype_of<T>(), device);
}

template <class T>
Tensor ParamSet<T>::view(size_t i) const {
  const ParamSpec& s = layout_->specs().at(i);
  T* base = const_cast<T*>(flat_.template data<T>());
  return Tensor::view(base + s.offset, s.shape, dtype_of<T>(), flat_.device());
}

template class ParamSet<float>;
template class ParamSet<double>;

}  // namespace iha
