"""Hugging Face directories of IHA models (DESIGN.md section 14): a custom architecture that
transformers loads with AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True).
configuration_iha.py and modeling_iha.py beside this file are copied into every directory; they
are plain PyTorch and do not use the library. save_dir writes one, load_dir reads it back."""
import json
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = ("configuration_iha.py", "modeling_iha.py")
CONFIG_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "pseudo_heads", "attention_kinds", "window_virtual", "collapse",
               "mask", "rope", "rope_theta", "rope_scale", "iha_rope_scaling", "rms_norm_eps")


def save_dir(out_dir, config, tensors):
    """config: the IhaConfig fields (CONFIG_KEYS); tensors: name -> float tensor, transformers'
    names (model.layers.i.self_attn.wq, ...). Written into a fresh directory beside out_dir, then
    renamed into place, so a failure leaves nothing half-written."""
    import safetensors.torch
    missing = [k for k in CONFIG_KEYS if k not in config]
    if missing:
        raise ValueError(f"argument 'config': missing {missing}")
    if os.path.exists(out_dir):
        raise ValueError(f"argument 'out_dir': {out_dir} exists")
    tmp = out_dir.rstrip("/") + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    doc = {"model_type": "iha", "architectures": ["IhaForCausalLM"],
           "auto_map": {"AutoConfig": "configuration_iha.IhaConfig",
                        "AutoModelForCausalLM": "modeling_iha.IhaForCausalLM"},
           "tie_word_embeddings": False, "torch_dtype": "float32"}
    doc.update({k: config[k] for k in CONFIG_KEYS})
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
    for name in FILES:
        shutil.copyfile(os.path.join(HERE, name), os.path.join(tmp, name))
    safetensors.torch.save_file({k: v.detach().contiguous() for k, v in tensors.items()},
                                os.path.join(tmp, "model.safetensors"))
    os.rename(tmp, out_dir)


def load_dir(path):
    """(config fields, tensors) of a directory save_dir wrote; errors name the file and field."""
    import safetensors.torch
    cfg_path = os.path.join(path, "config.json")
    try:
        with open(cfg_path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{cfg_path}: {e}") from e
    if doc.get("model_type") != "iha":
        raise ValueError(f"{cfg_path}: model_type is {doc.get('model_type')!r}; expected 'iha'")
    missing = [k for k in CONFIG_KEYS if k not in doc]
    if missing:
        raise ValueError(f"{cfg_path}: missing {missing}")
    tensors = safetensors.torch.load_file(os.path.join(path, "model.safetensors"))
    return {k: doc[k] for k in CONFIG_KEYS}, tensors
