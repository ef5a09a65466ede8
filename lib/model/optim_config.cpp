// The configuration module's reader of the `optim` section (docs/training.md, "Where
// configuration is checked"): the keys to OptimConfig, each value checked naming its key.
#include <cmath>
#include <string>

#include "model/optim.h"

namespace iha {

void OptimConfig::validate() const {
  auto finite = [](double x) { return std::isfinite(x); };
  IHA_CONFIG_CHECK(finite(lr) && lr > 0, "config key 'optim.lr': must be > 0, got ", lr);
  IHA_CONFIG_CHECK(finite(min_lr) && min_lr >= 0 && min_lr <= lr,
                   "config key 'optim.min_lr': must be in [0, optim.lr], got ", min_lr);
  IHA_CONFIG_CHECK(warmup_steps >= 0, "config key 'optim.warmup_steps': must be >= 0, got ",
                   warmup_steps);
  IHA_CONFIG_CHECK(finite(beta1) && beta1 >= 0 && beta1 < 1,
                   "config key 'optim.beta1': must be in [0, 1), got ", beta1);
  IHA_CONFIG_CHECK(finite(beta2) && beta2 >= 0 && beta2 < 1,
                   "config key 'optim.beta2': must be in [0, 1), got ", beta2);
  IHA_CONFIG_CHECK(finite(eps) && eps > 0, "config key 'optim.eps': must be > 0, got ", eps);
  IHA_CONFIG_CHECK(finite(weight_decay) && weight_decay >= 0,
                   "config key 'optim.weight_decay': must be >= 0, got ", weight_decay);
  IHA_CONFIG_CHECK(finite(clip) && clip >= 0, "config key 'optim.clip': must be >= 0 (0 disables), got ",
                   clip);
}

namespace {
// optim.zero: a level 0-3, or a YAML boolean (true = 1, false = 0: the ZeRO-1 switch of earlier
// configs).
int64_t parse_zero_level(const ConfigNode& n) {
  if (!n.has("zero")) return 0;
  const std::string text = n.require<std::string>("zero");
  int64_t level = -1;
  try {
    size_t used = 0;
    level = std::stoll(text, &used);
    if (used != text.size()) level = -1;
  } catch (const std::exception&) {
    try {
      level = n.require<bool>("zero") ? 1 : 0;
    } catch (const Error&) {
      level = -1;
    }
  }
  IHA_CONFIG_CHECK(level >= 0 && level <= 3, "config key 'optim.zero': must be 0, 1, 2 or 3 (true = 1, false = 0), "
                   "got '", text, "'");
  return level;
}
}  // namespace

OptimConfig parse_optim_config(const ConfigNode& n) {
  OptimConfig c;
  c.lr = n.get<double>("lr", c.lr);
  c.min_lr = n.get<double>("min_lr", c.min_lr);
  c.warmup_steps = n.get<int64_t>("warmup_steps", c.warmup_steps);
  c.beta1 = n.get<double>("beta1", c.beta1);
  c.beta2 = n.get<double>("beta2", c.beta2);
  c.eps = n.get<double>("eps", c.eps);
  c.weight_decay = n.get<double>("weight_decay", c.weight_decay);
  c.clip = n.get<double>("clip", c.clip);
  c.zero = parse_zero_level(n);
  c.prefetch = n.get<bool>("prefetch", c.prefetch);
  c.validate();
  return c;
}

}  // namespace iha
