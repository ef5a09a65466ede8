"""Configuration of an IHA decoder (DESIGN.md sections 1, 11, 13) for transformers. Written into
every exported model directory; it depends on transformers only."""
from transformers import PretrainedConfig


class IhaConfig(PretrainedConfig):
    model_type = "iha"
    # save_pretrained copies this file and names it in auto_map, however the config was made.
    _auto_class = "AutoConfig"

    def __init__(self, vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=None, head_dim=None, pseudo_heads=1,
                 attention_kinds=None, window_virtual=None, collapse="global", mask="flat_causal", rope=True,
                 rope_theta=500000.0, rope_scale=1.0, iha_rope_scaling=None, rms_norm_eps=1e-5,
                 tie_word_embeddings=False, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        # P: pseudo-heads per head. Per layer: "iha" (mixing and collapse) or "mha" (P = 1, none),
        # and the window Wv in virtual tokens (0: a global layer).
        self.pseudo_heads = pseudo_heads
        self.attention_kinds = list(attention_kinds or ["iha"] * num_hidden_layers)
        self.window_virtual = list(window_virtual or [0] * num_hidden_layers)
        self.collapse = collapse
        self.mask = mask
        self.rope = rope
        self.rope_theta = rope_theta
        self.rope_scale = rope_scale
        # DESIGN.md section 11 in the library's names: type (none, linear, ntk, yarn, llama3),
        # factor, original_length (tokens), beta_fast, beta_slow, ramp, low_freq_factor,
        # high_freq_factor.
        self.iha_rope_scaling = dict(iha_rope_scaling or {"type": "none"})
        self.rms_norm_eps = rms_norm_eps
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
