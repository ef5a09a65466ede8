#include <gtest/gtest.h>

#include "attention/layer_config.h"
#include "core/config.h"
#include "model/model_config.h"  // parse_layer_config: the configuration module

namespace iha {
namespace {

// Expects a ConfigError whose message contains `needle`.
template <class F>
void expect_config_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected a ConfigError mentioning '" << needle << "'";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

LayerConfig good() {
  LayerConfig c;
  c.D = 16; c.H = 2; c.d = 8; c.P = 2;
  return c;
}

TEST(LayerConfig, BadValuesNameTheField) {
  auto c = good();
  c.validate();
  c.P = 0;
  expect_config_error([&] { c.validate(); }, "'P'");
  c = good(); c.d = 7;
  expect_config_error([&] { c.validate(); }, "'d'");
  c.rope = false;
  c.validate();  // odd d is fine without RoPE
  c = good(); c.H = 0;
  expect_config_error([&] { c.validate(config_keys("model.")); }, "'model.H'");
  c = good(); c.mixing = false;
  expect_config_error([&] { c.validate(); }, "mha layer has P = 1");
  c = good(); c.rope_scale = 0;
  expect_config_error([&] { c.validate(); }, "rope_scale");
}

// The layer library says what is wrong; its caller says where the field came from: the
// configuration module names config keys, other callers their own nouns, the default the C++
// struct's fields. Nested values (rope_scaling) and size overflows keep the caller's names.
TEST(LayerConfig, MessagesNameFieldsTheWayTheCallerNamesThem) {
  LayerConfig c;
  c.D = 8, c.H = 0, c.d = 4, c.P = 2;
  expect_config_error([&] { c.validate(); }, "field 'H': head count must be >= 1");
  expect_config_error([&] { c.validate(config_keys("model.")); }, "config key 'model.H': head count");
  expect_config_error([&] { c.validate(FieldNames{"argument", "", {}}); }, "argument 'H': head count");
  c.H = 4, c.Hkv = 3;  // a caller that spells kv_heads its own way
  expect_config_error([&] { c.validate(FieldNames{"argument", "", {{"kv_heads", "Hkv"}}}); },
                      "argument 'Hkv': the key/value head count must divide H = 4");
  expect_config_error([&] { c.validate(config_keys("model.")); }, "config key 'model.kv_heads'");
  c.Hkv = 0;
  c.H = 2;
  c.rope_scaling.type = RopeScalingType::yarn, c.rope_scaling.factor = 4;  // no original_length
  expect_config_error([&] { c.validate(config_keys("model.")); }, "config key 'model.rope_scaling.original_length'");
  expect_config_error([&] { c.validate(); }, "field 'rope_scaling.original_length'");
  c.rope_scaling = {};
  c.rope_scale = 0.5;
  c.rope_scaling.type = RopeScalingType::linear, c.rope_scaling.factor = 2;
  expect_config_error([&] { c.validate(FieldNames{"argument", "", {}}); },
                      "arguments 'rope_scale' and 'rope_scaling': give at most one");
  c.rope_scaling = {}, c.rope_scale = 1.0;
  c.D = int64_t(1) << 40, c.d = int64_t(1) << 30;
  expect_config_error([&] { c.validate(FieldNames{"config attribute", "", {}}); }, "config attribute 'D' = ");
  expect_config_error([&] { c.validate(config_keys("model.")); }, "config key 'model.D' = ");
  expect_config_error([&] { parse_mask("causal", "field 'mask'"); }, "field 'mask': unknown mask 'causal'");
  WindowSpec s;
  s.window = 2, s.window_virtual = 4;
  expect_config_error([&] { resolve_window_virtual(s, 2, 100, std::nullopt, FieldNames{"argument", "", {}}); },
                      "arguments 'window' and 'window_virtual': give at most one");
}

TEST(Window, RulesOfDesignSection1) {
  WindowSpec s;
  // Default: W = ceil(N / (2 P^2)), Wv = W * P.
  EXPECT_EQ(resolve_window_virtual(s, 2, 1000, std::nullopt), 125 * 2);
  EXPECT_EQ(resolve_window_virtual(s, 2, 1001, std::nullopt), 126 * 2);
  EXPECT_EQ(resolve_window_virtual(s, 3, 10, std::nullopt), 1 * 3);
  s.window = 5;
  EXPECT_EQ(resolve_window_virtual(s, 3, 100, std::nullopt), 15);
  s = {};
  s.window_virtual = 7;
  EXPECT_EQ(resolve_window_virtual(s, 3, 100, std::nullopt), 7);
  s.window = 2;
  expect_config_error([&] { resolve_window_virtual(s, 3, 100, std::nullopt, config_keys("model.")); },
                      "give at most one");
  s = {};
  s.window = 0;
  expect_config_error([&] { resolve_window_virtual(s, 3, 100, std::nullopt); }, "'window'");
  s = {};
  s.window_virtual = 0;
  expect_config_error([&] { resolve_window_virtual(s, 3, 100, std::nullopt); }, "'window_virtual'");
  // A checkpoint's Wv wins over the default; an explicit different value is an error naming both.
  s = {};
  EXPECT_EQ(resolve_window_virtual(s, 2, 64000, int64_t(250)), 250);
  s.window_virtual = 300;
  expect_config_error([&] { resolve_window_virtual(s, 2, 64000, int64_t(250)); }, "Wv = 300");
  expect_config_error([&] { resolve_window_virtual(s, 2, 64000, int64_t(250)); }, "Wv = 250");
  s.allow_window_change = true;
  EXPECT_EQ(resolve_window_virtual(s, 2, 64000, int64_t(250)), 300);
}

TEST(ConfigNode, UnknownKeysAndWrongTypesNameTheKey) {
  auto root = ConfigNode::from_string("model:\n  D: 64\n  H: two\n  Pp: 3\n");
  auto m = root.child("model");
  EXPECT_EQ(m.require<int64_t>("D"), 64);
  expect_config_error([&] { m.require<int64_t>("H"); }, "config key 'model.H': expected an integer, got 'two'");
  expect_config_error([&] { m.require<int64_t>("d"); }, "'model.d' is required");
  expect_config_error([&] { root.finish(); }, "unknown config key 'model.Pp'");
}

TEST(ConfigNode, StrictIntegersAndOverrides) {
  auto root = ConfigNode::from_string("a: 1.5\nb: {c: 2}\n");
  expect_config_error([&] { root.require<int64_t>("a"); }, "expected an integer, got '1.5'");
  EXPECT_DOUBLE_EQ(root.require<double>("a"), 1.5);
  root.apply_override("b.c=7");
  root.apply_override("e.f.g=true");
  EXPECT_EQ(root.child("b").require<int64_t>("c"), 7);
  EXPECT_TRUE(root.child("e").child("f").require<bool>("g"));
  expect_config_error([&] { root.apply_override("novalue"); }, "expected key=value");
  expect_config_error([] { ConfigNode::from_string("a: [1, 2"); }, "YAML syntax error");
}

TEST(ConfigNode, LayerConfigFromYaml) {
  auto root = ConfigNode::from_string("D: 64\nH: 4\nP: 3\nmask: token_causal\ncollapse: per_head\nrope: off\n");
  LayerConfig c = parse_layer_config(root);
  EXPECT_EQ(c.d, 16);
  EXPECT_EQ(c.P, 3);
  EXPECT_EQ(c.mask, MaskKind::token_causal);
  EXPECT_EQ(c.collapse, Collapse::per_head);
  EXPECT_FALSE(c.rope);
  root.finish();
  auto bad = ConfigNode::from_string("D: 64\nH: 4\nmask: causal\n");
  expect_config_error([&] { parse_layer_config(bad); }, "config key 'mask': unknown mask 'causal'");
}

}  // namespace
}  // namespace iha
