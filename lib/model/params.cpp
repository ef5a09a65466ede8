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
