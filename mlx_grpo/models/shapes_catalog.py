"""The model shapes `shape:NAME` builds: each family's published config.json, its chat format
and special tokens, and the overrides of its shrunk copy for tests. Facts only, no code.

Each config holds the keys mlx-lm 0.32.2 reads for that model_type, copied from the source
model's published config.json (named in the comment above it); keys mlx-lm ignores (dropout,
initializer_range, architectures...) are left out. `specials` are token ids as the source's
tokenizer has them, where known; a chat format's other tokens go at the top of the vocabulary.
`shrunk` is the test copy: same model_type and layer kinds, a few layers of width 64, a
512-token vocabulary (models/shapes.py remaps the special ids that do not fit).
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Shape:
    source: str  # the published model whose config these are
    config: dict
    chat: str  # the chat format (models/shape_tokenizer.py CHAT_TEMPLATES)
    specials: dict[int, str]  # token id -> special token, as published
    eos: str  # the tokenizer's eos_token
    pad: str | None = None
    shrunk: dict = field(default_factory=dict)


SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 512}

QWEN25_SPECIALS = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>"}
QWEN25_COMMON = {"model_type": "qwen2", "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                 "max_position_embeddings": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
                 "bos_token_id": 151643, "eos_token_id": 151645}

SHAPES = {
    # Qwen/Qwen2.5-0.5B-Instruct
    "qwen2.5-0.5b": Shape(
        "Qwen/Qwen2.5-0.5B-Instruct",
        {**QWEN25_COMMON, "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
         "num_key_value_heads": 2, "intermediate_size": 4864},
        "chatml", QWEN25_SPECIALS, eos="<|im_end|>", pad="<|endoftext|>", shrunk=SMALL),
    # Qwen/Qwen2.5-1.5B-Instruct
    "qwen2.5-1.5b": Shape(
        "Qwen/Qwen2.5-1.5B-Instruct",
        {**QWEN25_COMMON, "hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12,
         "num_key_value_heads": 2, "intermediate_size": 8960},
        "chatml", QWEN25_SPECIALS, eos="<|im_end|>", pad="<|endoftext|>", shrunk=SMALL),
    # Qwen/Qwen3-0.6B
    "qwen3-0.6b": Shape(
        "Qwen/Qwen3-0.6B",
        {"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024, "num_hidden_layers": 28,
         "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
         "rms_norm_eps": 1e-6, "rope_theta": 1000000, "rope_scaling": None, "max_position_embeddings": 40960,
         "tie_word_embeddings": True, "attention_bias": False, "torch_dtype": "bfloat16",
         "bos_token_id": 151643, "eos_token_id": 151645},
        "qwen3", {**QWEN25_SPECIALS, 151667: "<think>", 151668: "</think>"}, eos="<|im_end|>",
        pad="<|endoftext|>", shrunk={**SMALL, "head_dim": 16}),
    # meta-llama/Llama-3.2-1B-Instruct
    "llama-3.2-1b": Shape(
        "meta-llama/Llama-3.2-1B-Instruct",
        {"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "num_hidden_layers": 16,
         "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192,
         "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
         "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                          "original_max_position_embeddings": 8192, "rope_type": "llama3"},
         "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
         "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]},
        "llama3", {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128006: "<|start_header_id|>",
                   128007: "<|end_header_id|>", 128008: "<|eom_id|>", 128009: "<|eot_id|>"},
        eos="<|eot_id|>", shrunk={**SMALL, "head_dim": 16}),
    # google/gemma-3-1b-it (Gemma3ForCausalLM, text only)
    "gemma-3-1b": Shape(
        "google/gemma-3-1b-it",
        {"model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 1152, "num_hidden_layers": 26,
         "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 6912,
         "rms_norm_eps": 1e-6, "rope_theta": 1000000, "rope_local_base_freq": 10000, "rope_scaling": None,
         "query_pre_attn_scalar": 256, "sliding_window": 512, "sliding_window_pattern": 6,
         "max_position_embeddings": 32768, "final_logit_softcapping": None, "attn_logit_softcapping": None,
         "tie_word_embeddings": True, "torch_dtype": "bfloat16",
         "bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0},
        "gemma", {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 105: "<start_of_turn>", 106: "<end_of_turn>"},
        eos="<eos>", pad="<pad>",
        # one sliding-window layer and one global one; a window shorter than the test prompts
        shrunk={**SMALL, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                "query_pre_attn_scalar": 32, "sliding_window": 8, "sliding_window_pattern": 2}),
    # HuggingFaceTB/SmolLM2-360M-Instruct
    "smollm2-360m": Shape(
        "HuggingFaceTB/SmolLM2-360M-Instruct",
        {"model_type": "llama", "vocab_size": 49152, "hidden_size": 960, "num_hidden_layers": 32,
         "num_attention_heads": 15, "num_key_value_heads": 5, "head_dim": 64, "intermediate_size": 2560,
         "rms_norm_eps": 1e-5, "rope_theta": 100000, "rope_scaling": None, "max_position_embeddings": 8192,
         "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
         "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2},
        "chatml", {0: "<|endoftext|>", 1: "<|im_start|>", 2: "<|im_end|>"}, eos="<|im_end|>",
        pad="<|im_end|>", shrunk={**SMALL, "head_dim": 16}),
    # LiquidAI/LFM2-350M: 10 gated short-convolution blocks and 6 attention blocks
    "lfm2-350m": Shape(
        "LiquidAI/LFM2-350M",
        {"model_type": "lfm2", "vocab_size": 65536, "hidden_size": 1024, "num_hidden_layers": 16,
         "num_attention_heads": 16, "num_key_value_heads": 8, "max_position_embeddings": 128000,
         "norm_eps": 1e-5, "conv_bias": False, "conv_L_cache": 3, "block_dim": 1024, "block_ff_dim": 6656,
         "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": True,
         "rope_theta": 1000000.0, "full_attn_idxs": [2, 5, 8, 10, 12, 14], "torch_dtype": "bfloat16",
         "bos_token_id": 1, "eos_token_id": 7, "pad_token_id": 0},
        "lfm2", {0: "<|pad|>", 1: "<|startoftext|>", 6: "<|im_start|>", 7: "<|im_end|>"}, eos="<|im_end|>",
        pad="<|pad|>",
        # conv, conv, attention: the published model's first three blocks
        shrunk={**SMALL, "num_hidden_layers": 3, "block_dim": 64, "block_ff_dim": 192, "block_multiple_of": 16,
                "full_attn_idxs": [2]}),
    # Qwen/Qwen3.5-0.8B (its text model): 3 gated delta-net blocks to each attention block
    "qwen3.5-0.8b": Shape(
        "Qwen/Qwen3.5-0.8B",
        {"model_type": "qwen3_5", "tie_word_embeddings": True, "torch_dtype": "bfloat16", "text_config": {
            "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 1024, "num_hidden_layers": 24,
            "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256, "intermediate_size": 3584,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "full_attention_interval": 4,
            "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
            "linear_num_key_heads": 16, "linear_num_value_heads": 16, "attention_bias": False,
            "tie_word_embeddings": True, "eos_token_id": 248044,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                                "mrope_section": [11, 11, 10], "mrope_interleaved": True}}},
        # <think> and </think> ids as a Qwen3.6 prompt trace shows them (the same tokenizer)
        "qwen3", {248044: "<|endoftext|>", 248045: "<|im_start|>", 248046: "<|im_end|>", 248068: "<think>",
                  248069: "</think>"}, eos="<|im_end|>", pad="<|endoftext|>",
        # one gated delta-net block and one attention block
        shrunk={"text_config": {**SMALL, "head_dim": 16, "full_attention_interval": 2, "linear_key_head_dim": 16,
                                "linear_value_head_dim": 16, "linear_num_key_heads": 2,
                                "linear_num_value_heads": 4}}),
}
